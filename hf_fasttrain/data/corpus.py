"""Text corpora: the embedded offline default and the Hub / local-file path, and their cutting into rows.

The embedded default needs no network: its documents are the running Python's own standard-library
``.py`` sources (test directories and site-packages excluded), split into train/validation by a hash
of each file's path relative to the stdlib root, so the split is identical on every build and a file
never lands in both splits. Corpora are cached under the user's cache directory (``$HF_FASTTRAIN_CACHE``,
else ``$XDG_CACHE_HOME/hf_fasttrain``, else ``~/.cache/hf_fasttrain``); the byte-level BPE tokenizer trained
on the train split is :mod:`hf_fasttrain.data.tokenizer`'s.

A second embedded corpus, ``dataset="embedded:prose"``, is English prose that ships with Python: the
reference topics of ``pydoc_data`` (the text ``help("FOR")`` shows) and the docstrings of the stdlib
modules, classes and functions with their doctest lines removed (one document per topic or module). It
checks that a gain holds on natural language, not only on code.

With a dataset name or local text/json(l) files, the same functions go through
``datasets.load_dataset``.

Example:
    >>> from hf_fasttrain.data import build_stdlib_corpus, get_tokenizer, tokenize_and_chunk
    >>> raw = build_stdlib_corpus(max_files=40)                 # DatasetDict(train, validation)
    >>> tok = get_tokenizer(vocab_size=512, corpus=raw)          # trained once, then cached
    >>> lm = tokenize_and_chunk(raw, tok, block_size=128)        # fixed-length rows of input_ids
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import Callable, Optional

import datasets
from datasets import Dataset, DatasetDict

from ..validation import ConfigError

__all__ = [
    "cache_root",
    "stdlib_root",
    "list_stdlib_sources",
    "is_validation_path",
    "build_stdlib_corpus",
    "PROSE_CORPUS",
    "module_prose",
    "build_prose_corpus",
    "load_text_datasets",
    "tokenize_and_chunk",
    "tokenize_documents",
    "cached_build",
    "atomic_dir",
    "publish_dir",
]

logger = logging.getLogger(__name__)

# Directory names whose files are left out of the embedded corpus: test suites (large, repetitive,
# and full of deliberately odd code) and third-party packages installed into the interpreter.
_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
_CORPUS_FORMAT = 1  # bump when the corpus layout changes, so old caches are not reused


def cache_root() -> Path:
    """Where hf_fasttrain keeps its caches (corpus arrow files, trained tokenizers)."""
    env = os.environ.get("HF_FASTTRAIN_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "hf_fasttrain"


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def _path_hash(relpath: str) -> int:
    return int(hashlib.sha1(relpath.encode("utf-8")).hexdigest()[:12], 16)


def is_validation_path(relpath: str, validation_fraction: float) -> bool:
    """Deterministic split: a file is in validation when the hash of its relative path says so."""
    return _path_hash(relpath) / float(16**12) < validation_fraction


def list_stdlib_sources(root: Optional[Path] = None, max_files: Optional[int] = None) -> list[str]:
    """Relative paths (POSIX style) of the stdlib ``.py`` files used as documents, sorted.

    ``max_files`` keeps a deterministic pseudo-random subset (the files with the smallest path hash),
    which keeps both splits populated; tests and quick runs use it.
    """
    root = Path(root) if root is not None else stdlib_root()
    rels = []
    for folder, dirs, files in os.walk(root, followlinks=True):  # excluded folders pruned, not walked
        dirs[:] = [d for d in dirs if d not in _EXCLUDED_DIRS]
        base = Path(folder).relative_to(root)
        rels.extend((base / f).as_posix() for f in files if f.endswith(".py"))
    if max_files is not None:
        if max_files < 1:
            raise ConfigError("max_files", max_files, "must be an integer >= 1 or None")
        rels = sorted(rels, key=_path_hash)[:max_files]
    return sorted(rels)


def atomic_dir(final: Path):
    """A temporary sibling directory that the caller fills and then moves into place."""
    final.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))


def publish_dir(tmp: Path, final: Path) -> None:
    try:
        os.replace(tmp, final)
    except OSError:  # another process published it first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)


def _stdlib_files(validation_fraction: float, max_files: Optional[int], root: Optional[Path]) -> tuple[Path, list[str]]:
    """The checked `validation_fraction`, then the stdlib root and its source files (as `list_stdlib_sources`)."""
    if not 0.0 < validation_fraction < 1.0:
        raise ConfigError("validation_fraction", validation_fraction, "must be in (0, 1)")
    root = Path(root) if root is not None else stdlib_root()
    return root, list_stdlib_sources(root, max_files)


def cached_build(name: str, key: list, build: Callable[[], DatasetDict]) -> DatasetDict:
    """``build()``, saved under the cache directory as ``<name>-py<X.Y>-<hash of key>`` (`key`: all that the data
    depends on) and loaded from there, so ``datasets.map`` caches what is computed from it; `build` runs only when
    the cache lacks it."""
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    target = cache_root() / "corpus" / f"{name}-py{sys.version_info.major}.{sys.version_info.minor}-{digest}"
    if (target / "dataset_dict.json").exists():
        return datasets.load_from_disk(str(target))
    dd = build()
    tmp = atomic_dir(target)
    dd.save_to_disk(str(tmp))
    publish_dir(tmp, target)
    return datasets.load_from_disk(str(target))


def _hash_split(docs: list[tuple[str, str]], validation_fraction: float,
                empty_split: Callable[[int], Exception]) -> DatasetDict:
    """``(path, text)`` documents as train and validation splits, by the hash of each path (`is_validation_path`);
    a split left empty raises ``empty_split(number of documents)``."""
    splits: dict[str, dict[str, list[str]]] = {split: {"path": [], "text": []} for split in ("train", "validation")}
    for path, text in docs:
        split = "validation" if is_validation_path(path, validation_fraction) else "train"
        splits[split]["path"].append(path)
        splits[split]["text"].append(text)
    if not splits["validation"]["path"] or not splits["train"]["path"]:
        raise empty_split(len(docs))
    return DatasetDict({k: Dataset.from_dict(v) for k, v in splits.items()})


def build_stdlib_corpus(
    validation_fraction: float = 0.05,
    max_files: Optional[int] = None,
    root: Optional[Path] = None,
) -> DatasetDict:
    """The embedded default corpus: one example per stdlib source file, columns ``path`` and ``text``.

    The result is saved under the cache directory and reloaded from there, so ``datasets.map``
    caches the tokenization of later calls.
    """
    root, rels = _stdlib_files(validation_fraction, max_files, root)
    if not rels:
        raise FileNotFoundError(f"no .py sources found under the stdlib root {root}")

    def build() -> DatasetDict:
        docs = [(rel, (root / rel).read_text(encoding="utf-8", errors="replace")) for rel in rels]
        return _hash_split(docs, validation_fraction, lambda n: ValueError(
            f"validation_fraction={validation_fraction} with {n} files leaves a split empty; "
            "use more files or a fraction further from 0 and 1"))

    return cached_build("stdlib", [_CORPUS_FORMAT, sys.version, str(root), validation_fraction, rels], build)


PROSE_CORPUS = "embedded:prose"  # DataArguments.dataset value of the English-prose corpus
_PROSE_FORMAT = 2
_MIN_DOCSTRING = 80  # characters: shorter docstrings ("Return x.") are more label than prose


def _without_doctest(text: str) -> str:
    """``text`` without its interactive-session lines (``>>>`` / ``...`` prompts)."""
    return "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith((">>>", "..."))).strip()


def module_prose(source: str) -> str:
    """The docstrings of a module's source (module, classes, functions), doctest lines removed, joined by
    blank lines; '' when it has none (or does not parse)."""
    import ast
    import inspect

    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return ""
    parts = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=True)
            if not doc:
                continue
            text = _without_doctest(inspect.cleandoc(doc))
            if len(text) >= _MIN_DOCSTRING:
                parts.append(text)
    return "\n\n".join(parts)


def build_prose_corpus(
    validation_fraction: float = 0.05,
    max_files: Optional[int] = None,
    root: Optional[Path] = None,
) -> DatasetDict:
    """English prose shipped with Python: ``pydoc_data`` topics and stdlib docstrings (columns ``path``, ``text``).

    Documents are named ``pydoc/<topic>`` and ``doc/<module path>`` and split by the hash of that name,
    as the stdlib corpus is; ``max_files`` keeps that many stdlib modules (and every topic). Cached like
    :func:`build_stdlib_corpus`.
    """
    from pydoc_data.topics import topics

    root, rels = _stdlib_files(validation_fraction, max_files, root)

    def build() -> DatasetDict:
        docs = [(f"pydoc/{name}", _without_doctest(text)) for name, text in sorted(topics.items())]
        for rel in rels:
            text = module_prose((root / rel).read_text(encoding="utf-8", errors="replace"))
            if text:
                docs.append((f"doc/{rel}", text))
        return _hash_split(docs, validation_fraction, lambda n: ConfigError(
            "validation_fraction", validation_fraction,
            "choose a fraction (or more documents) that leaves each split one document",
            problem=f"got {validation_fraction}, which leaves a split of the {n} documents empty"))

    return cached_build("prose", [_PROSE_FORMAT, sys.version, str(root), validation_fraction, rels], build)


def load_text_datasets(
    dataset: Optional[str] = None,
    dataset_config: Optional[str] = None,
    text_column: str = "text",
    validation_fraction: float = 0.05,
    max_files: Optional[int] = None,
    seed: int = 0,
    **source,
) -> DatasetDict:
    """Raw text as a ``DatasetDict`` with ``train`` and ``validation`` splits and a ``text`` column.

    ``dataset`` is None for the embedded stdlib corpus, ``"embedded:prose"`` for the English-prose one
    (:func:`build_prose_corpus`), else anything :func:`hf_fasttrain.data.sources.resolve_source` takes:
    local files of any format ``datasets`` reads (a file, comma list, glob or folder), a ``save_to_disk``
    folder, or a Hub dataset name (needs network or the datasets cache). ``source`` passes
    ``dataset_split``, ``dataset_revision``, ``data_files``, ``data_dir`` and ``trust_remote_code`` on.
    A missing validation split is cut from train with a fixed seed. Bad data raises a one-line
    :class:`~hf_fasttrain.data.sources.DataError`.
    """
    from .sources import check_text_column, load_source, with_validation

    if dataset is None:
        return build_stdlib_corpus(validation_fraction=validation_fraction, max_files=max_files)
    if dataset == PROSE_CORPUS:
        return build_prose_corpus(validation_fraction=validation_fraction, max_files=max_files)
    dd = with_validation(load_source(dataset, dataset_config, **source), validation_fraction, seed)
    if text_column not in dd["train"].column_names:  # raw text wanted: a pre-tokenized input_ids column is no answer
        check_text_column([c for c in dd["train"].column_names if c != "input_ids"], text_column, dataset)
    return DatasetDict({k: _only_text(v, text_column) for k, v in dd.items()})


def _only_text(ds: Dataset, text_column: str) -> Dataset:
    """``ds`` with its ``text_column`` alone, named ``text``."""
    ds = ds.select_columns([text_column])
    return ds.rename_column(text_column, "text") if text_column != "text" else ds


def _tokenize_fn(tokenizer, add_eos: bool, max_length: Optional[int] = None):
    eos = tokenizer.eos_token_id

    def fn(batch):
        enc = tokenizer(batch["text"], add_special_tokens=False, return_attention_mask=False)
        ids = enc["input_ids"]
        if add_eos and eos is not None:
            ids = [x + [eos] for x in ids]
        if max_length is not None:
            ids = [x[:max_length] for x in ids]
        return {"input_ids": ids}

    return fn


def _group_fn(block_size: int):
    def fn(batch):
        # Concatenate the batch's documents (each ends with EOS) and cut into block_size rows; the
        # remainder that does not fill a block is dropped, as in transformers' run_clm `group_texts`.
        flat = [t for ids in batch["input_ids"] for t in ids]
        n = (len(flat) // block_size) * block_size
        return {"input_ids": [flat[i : i + block_size] for i in range(0, n, block_size)]}

    return fn


def tokenize_and_chunk(
    raw: DatasetDict,
    tokenizer,
    block_size: int,
    num_proc: Optional[int] = None,
    group_batch_size: int = 1000,
) -> DatasetDict:
    """Fixed-length pretraining rows: tokenize every document, append EOS, concatenate, cut into
    ``block_size`` rows. Both steps are ``datasets.map(batched=True)`` and hit its cache on reruns."""
    if block_size < 2:
        raise ConfigError("block_size", block_size, "must be an integer >= 2")
    cols = raw["train"].column_names
    tokenized = raw.map(
        _tokenize_fn(tokenizer, add_eos=True),
        batched=True,
        remove_columns=cols,
        num_proc=num_proc,
        desc="Tokenizing",
    )
    return tokenized.map(
        _group_fn(block_size),
        batched=True,
        batch_size=group_batch_size,
        num_proc=num_proc,
        desc=f"Chunking into blocks of {block_size}",
    )


def tokenize_documents(
    raw: DatasetDict, tokenizer, max_length: int, num_proc: Optional[int] = None
) -> DatasetDict:
    """Whole documents as variable-length examples (truncated to ``max_length``), each ending in EOS."""
    cols = raw["train"].column_names
    return raw.map(
        _tokenize_fn(tokenizer, add_eos=True, max_length=max_length),
        batched=True,
        remove_columns=cols,
        num_proc=num_proc,
        desc="Tokenizing documents",
    )
