"""Where fine-tuning rows come from, and the recipe's fine-tuning data path.

- ``dataset="embedded:functions"``: an offline prompt/completion set built from the running Python's standard
  library: every function or method with a docstring, the prompt its signature and docstring, the completion its
  body (dedented). Split like the embedded corpus, by a hash of each file's path (``validation_fraction``), so a
  model pretrained on the embedded corpus with the same fraction has never seen the validation functions.
- local ``.json`` / ``.jsonl`` files or a Hub dataset name, with prompt/completion or ``messages`` columns.

:func:`prepare_sft_data` turns ``DataArguments`` with ``data_format`` ``prompt_completion`` or ``messages`` into
(tokenizer, DatasetDict of ``input_ids``/``labels``); :func:`sft_collator` is its padding collator.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path
from typing import Optional, Sequence

from datasets import Dataset, DatasetDict

from ..validation import ConfigError
from .corpus import cached_build, is_validation_path, list_stdlib_sources, stdlib_root
from .sft import CompletionCollator, tokenize_sft
from .tokenizer import get_tokenizer

__all__ = ["EMBEDDED_FUNCTIONS", "function_pairs", "build_function_corpus", "load_sft_datasets", "prepare_sft_data",
           "sft_collator"]

EMBEDDED_FUNCTIONS = "embedded:functions"
_FORMAT = 1


def function_pairs(files: Sequence[str], root: Optional[Path] = None) -> list[dict[str, str]]:
    """``{"prompt": signature + docstring, "completion": body, "module": path}`` for every function or method
    with a docstring and a body in ``files`` (paths relative to ``root``, the stdlib by default).

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "m.py").write_text('def f(x):\\n    "Twice."\\n    return 2 * x\\n')
        >>> function_pairs(["m.py"], d)
        [{'prompt': 'def f(x):\\n    "Twice."\\n', 'completion': '    return 2 * x\\n', 'module': 'm.py'}]
    """
    root = Path(root) if root is not None else stdlib_root()
    out = []
    for rel in files:
        try:
            source = (root / rel).read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or ast.get_docstring(node) is None:
                continue
            start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
            doc_end = node.body[0].end_lineno
            if doc_end >= node.end_lineno:  # a docstring and nothing else
                continue
            text = textwrap.dedent("".join(lines[start : node.end_lineno])).splitlines(keepends=True)
            k = doc_end - start
            out.append({"prompt": "".join(text[:k]), "completion": "".join(text[k:]), "module": rel})
    return out


def build_function_corpus(validation_fraction: float = 0.05, max_files: Optional[int] = None) -> DatasetDict:
    """The ``embedded:functions`` set: DatasetDict(train, validation) of prompt/completion/module rows, cached."""
    rels = list_stdlib_sources(stdlib_root(), max_files)

    def build() -> DatasetDict:
        val = [r for r in rels if is_validation_path(r, validation_fraction)]
        train = [r for r in rels if not is_validation_path(r, validation_fraction)]
        if not val or not train:
            raise ConfigError("validation_fraction", validation_fraction,
                              f"with {len(rels)} files one split of {EMBEDDED_FUNCTIONS} is empty; use more files "
                              "(max_corpus_files) or a fraction further from 0 and 1")
        return DatasetDict({"train": Dataset.from_list(function_pairs(train)),
                            "validation": Dataset.from_list(function_pairs(val))})

    return cached_build("functions", [_FORMAT, sys.version, validation_fraction, rels], build)


def load_sft_datasets(data_args, seed: int = 0) -> DatasetDict:
    """Raw fine-tuning rows (train, validation) as ``data_args`` names them; columns as they are."""
    spec = data_args.dataset
    if spec == EMBEDDED_FUNCTIONS:
        return build_function_corpus(data_args.validation_fraction, data_args.max_corpus_files)
    if not spec:
        raise ConfigError("dataset", None, f"data_format={data_args.data_format!r} needs fine-tuning rows: "
                          f"'{EMBEDDED_FUNCTIONS}' (offline), local files (.jsonl, .parquet, ...), a save_to_disk folder or a "
                          "Hub dataset name")
    from .sources import load_source_options, load_source, with_validation  # every format by path, save_to_disk, Hub

    dd = load_source(spec, data_args.dataset_config, **load_source_options(data_args))
    dd = with_validation(dd, data_args.validation_fraction, seed)
    return DatasetDict({"train": dd["train"], "validation": dd["validation"]})


def prepare_sft_data(data_args, model_args=None, seed: int = 0):
    """(tokenizer, DatasetDict of ``input_ids``/``labels`` examples, cut at ``block_size``) for fine-tuning.

    The tokenizer is ``data_args.tokenizer``, else the pretrained model's (``model_name_or_path``).
    """
    source = data_args.tokenizer or (model_args.model_name_or_path if model_args is not None else None)
    if not source:
        raise ConfigError("tokenizer", None, f"data_format={data_args.data_format!r} fine-tunes a pretrained model: "
                          "set model_name_or_path (its tokenizer is used) or tokenizer")
    raw = load_sft_datasets(data_args, seed=seed)
    fmt = "messages" if data_args.data_format == "messages" else "prompt_completion"
    columns = raw["train"].column_names
    if fmt == "messages" and data_args.messages_column not in columns:
        raise ConfigError("messages_column", data_args.messages_column,
                          f"data_format='messages' needs a column of chat turns; columns: {columns}")
    if fmt == "prompt_completion" and data_args.messages_column in columns:
        columns = [c for c in columns if c != data_args.messages_column]  # explicit format: ignore a chat column
        raw = raw.remove_columns(data_args.messages_column)
    trust = bool(model_args is not None and model_args.trust_remote_code)
    tokenizer = get_tokenizer(source, trust_remote_code=trust)
    lm = tokenize_sft(raw, tokenizer, max_length=data_args.block_size, prompt_column=data_args.prompt_column,
                      completion_column=data_args.completion_column, messages_column=data_args.messages_column,
                      completion_only=data_args.completion_only_loss, num_proc=data_args.preprocessing_num_workers)
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples)):
        if limit is not None and len(lm[split]) > limit:
            lm[split] = lm[split].select(range(limit))
    if len(lm["train"]) == 0:
        raise ConfigError("block_size", data_args.block_size, "leaves no completion token in any training example; "
                          "raise it")
    return tokenizer, lm


def sft_collator(tokenizer) -> CompletionCollator:
    """Right padding with the tokenizer's pad token (its EOS when it has none), labels -100 on padding."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return CompletionCollator(pad_token_id=pad if pad is not None else 0)
