"""From the ``data:`` options to training rows: load, check, drop empty documents, tokenize, pack.

:func:`prepare_lm_data` is what a recipe run uses (through :class:`hf_fasttrain.data.front.RunData`), and
:func:`pretokenize` is ``hf-fasttrain tokenize``: the same loading and checks, the rows written once as
parquet shards (:mod:`hf_fasttrain.data.pretokenized`). Both take any object with the fields of
``DataArguments``. Everything the user's data can get wrong is a one-line
:class:`~hf_fasttrain.data.sources.DataError`, raised before any training.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Optional

from datasets import DatasetDict

from .chars import CHAR_TOKENIZER, is_nanogpt_folder, load_char_data
from .corpus import PROSE_CORPUS, load_text_datasets, tokenize_and_chunk
from .pretokenized import TOKENIZER_DIR, check_manifest, check_out_folder, read_manifest, write_pretokenized
from .sources import DataError, load_source_options, check_text_column, load_source, with_validation
from .tokenizer import get_tokenizer, load_tokenizer

__all__ = ["PreparedData", "load_documents", "prepare_lm_data", "pretokenize", "drop_empty_documents"]

logger = logging.getLogger(__name__)


@dataclass
class PreparedData:
    """The tokenizer, the ``input_ids`` rows (DatasetDict train/validation) and what was done to get them."""

    tokenizer: Any
    lm: DatasetDict
    source: str  # the dataset as the user named it ("embedded stdlib corpus" by default)
    documents: Optional[int] = None  # non-empty documents tokenized (None for pre-tokenized rows)
    empty_dropped: int = 0
    pretokenized: bool = False
    manifest: Optional[dict] = field(default=None, repr=False)
    described: Optional[str] = None  # character data describes itself (hf_fasttrain.data.chars)

    def summary(self) -> str:
        """``data c.parquet: 1,998 documents (2 empty dropped) -> 3,220 train rows, 170 validation rows``"""
        if self.described:
            return self.described
        rows = f"{len(self.lm['train']):,} train rows, {len(self.lm['validation']):,} validation rows"
        if self.pretokenized:
            return f"data {self.source}: pre-tokenized, {rows}"
        return f"data {self.source}: {self.documents:,} documents ({self.empty_dropped:,} empty dropped) -> {rows}"


def drop_empty_documents(raw: DatasetDict, num_proc: Optional[int] = None) -> tuple[DatasetDict, int]:
    """``raw`` without the documents that are empty or only whitespace (or null), and how many went."""
    before = sum(len(d) for d in raw.values())
    kept = raw.filter(lambda batch: [bool(t and t.strip()) for t in batch["text"]], batched=True,
                      num_proc=num_proc, desc="Dropping empty documents")
    return kept, before - sum(len(d) for d in kept.values())


def load_documents(args, seed: int = 0, trust_remote_code: bool = False):
    """``(DatasetDict train/validation, kind, empty documents dropped)``: ``kind`` is ``"text"`` (a ``text``
    column of non-empty documents) or ``"input_ids"`` (rows already tokenized, taken as they are).

    Empty documents of a user's data go before the validation split is cut, so they never shift which
    documents are held out.
    """
    dataset = args.dataset
    if dataset is None or dataset == PROSE_CORPUS:
        # the embedded corpora stay as they are (an empty __init__.py is one EOS): their rows, and every figure
        # measured on them, do not move
        return load_text_datasets(dataset, validation_fraction=args.validation_fraction,
                                  max_files=args.max_corpus_files, seed=seed), "text", 0
    dd = load_source(dataset, args.dataset_config, **load_source_options(args, trust_remote_code))
    kind = check_text_column(dd["train"].column_names, args.text_column, dataset)
    if kind == "input_ids":
        dd = DatasetDict({k: v.select_columns(["input_ids"]) for k, v in dd.items()})
        return with_validation(dd, args.validation_fraction, seed), kind, 0
    feature = dd["train"].features[args.text_column]
    if getattr(feature, "dtype", None) not in ("string", "large_string"):
        raise DataError("text_column", args.text_column, problem=f"column {args.text_column!r} of {dataset!r} holds "
                        f"{getattr(feature, 'dtype', type(feature).__name__)}, not text; its columns are "
                        f"{dd['train'].column_names}", allowed="name the column of strings with --text_column")
    dd = DatasetDict({k: _text_only(v, args.text_column) for k, v in dd.items()})
    dd, dropped = drop_empty_documents(dd, num_proc=args.preprocessing_num_workers)
    if len(dd["train"]) == 0:
        raise DataError("dataset", dataset, problem=f"no documents left in {dataset!r} after dropping {dropped:,} "
                        "empty ones", allowed="give data whose text column holds text")
    return with_validation(dd, args.validation_fraction, seed), kind, dropped


def _text_only(ds, column: str):
    ds = ds.select_columns([column])
    return ds.rename_column(column, "text") if column != "text" else ds


def _check_rows(lm: DatasetDict, tokenizer, block_size: int, where: str) -> None:
    """Pre-tokenized rows with no manifest: each no longer than block_size, every id in the vocabulary."""
    import pyarrow.compute as pc

    for split, ds in lm.items():
        column = ds.data.column("input_ids")
        if len(ds) == 0:
            continue
        longest = pc.max(pc.list_value_length(column)).as_py()
        if longest is not None and longest > block_size:
            raise DataError("block_size", block_size, problem=f"{where!r} ({split}) has rows of up to {longest} tokens, "
                            f"longer than block_size={block_size}", allowed=f"use --block_size {longest} or more, or "
                            "cut the rows shorter")
        top = pc.max(pc.list_flatten(column)).as_py()
        if top is not None and top >= len(tokenizer):
            raise DataError("tokenizer", getattr(tokenizer, "name_or_path", None), problem=f"{where!r} ({split}) holds "
                            f"token id {top}, outside this tokenizer's {len(tokenizer)} ids",
                            allowed="give the tokenizer that made the input_ids with --tokenizer")


def _limit(lm: DatasetDict, args) -> DatasetDict:
    for split, limit in (("train", args.max_train_samples), ("validation", args.max_eval_samples)):
        if limit is not None and len(lm[split]) > limit:
            lm[split] = lm[split].select(range(limit))
    return lm


def prepare_lm_data(args, trust_remote_code: bool = False, seed: int = 0) -> PreparedData:
    """The tokenizer and the rows of ``block_size`` tokens for a run with the ``data:`` options ``args``.

    - a folder from ``hf-fasttrain tokenize``: its rows as they are, after checking its manifest against the
      run's tokenizer (default: the folder's own) and ``block_size``;
    - a dataset with an ``input_ids`` column (and no text column): its rows as they are; ``--tokenizer``
      is needed (the vocabulary), rows must fit ``block_size`` and ids the vocabulary;
    - text: empty documents dropped (counted), the tokenizer loaded or trained, documents tokenized with
      EOS appended, concatenated and cut into rows (``datasets.map``, cached);
    - a nanoGPT data folder (``train.bin``, ``val.bin``, ``meta.pkl``), or a text file with ``tokenizer: char``:
      its ids as they are (the characters of the file), cut into nanoGPT's windows (:mod:`hf_fasttrain.data.chars`;
      ``input_ids`` with their next ids as ``labels``, every position predicting one).
    """
    name = args.dataset or "embedded stdlib corpus"
    if args.tokenizer == CHAR_TOKENIZER or is_nanogpt_folder(args.dataset):
        if args.dataset is None:
            raise DataError("tokenizer", CHAR_TOKENIZER, problem="tokenizer: char reads a text file and no dataset is "
                            "given", allowed="give the text file with --dataset")
        tokenizer, lm, summary = load_char_data(args.dataset, args.tokenizer, args.block_size,
                                                trust_remote_code=trust_remote_code)
        lm = _limit(lm, args)
        _require_rows(lm, args)
        return PreparedData(tokenizer, lm, name, pretokenized=True, described=summary)
    manifest = read_manifest(args.dataset)
    if manifest is not None:
        dd = load_source(args.dataset, trust_remote_code=trust_remote_code)
        tok_path = args.tokenizer or os.path.join(os.path.expanduser(args.dataset), TOKENIZER_DIR)
        tokenizer = load_tokenizer(tok_path, trust_remote_code=trust_remote_code)
        check_manifest(manifest, tokenizer, args.block_size, args.dataset)
        lm = _limit(with_validation(DatasetDict({k: v.select_columns(["input_ids"]) for k, v in dd.items()}),
                                    args.validation_fraction, seed), args)
        _require_rows(lm, args)
        return PreparedData(tokenizer, lm, name, pretokenized=True, manifest=manifest)
    raw, kind, dropped = load_documents(args, seed=seed, trust_remote_code=trust_remote_code)
    if kind == "input_ids":
        if args.tokenizer is None:
            raise DataError("tokenizer", None, problem=f"{name!r} holds input_ids (pre-tokenized) and no "
                            "manifest.json names its tokenizer", allowed="give the tokenizer that made them with "
                            "--tokenizer (or write the data with hf-fasttrain tokenize)")
        tokenizer = load_tokenizer(args.tokenizer, trust_remote_code=trust_remote_code)
        _check_rows(raw, tokenizer, args.block_size, name)
        lm = _limit(raw, args)
        _require_rows(lm, args)
        return PreparedData(tokenizer, lm, name, pretokenized=True)
    tokenizer = get_tokenizer(args.tokenizer, args.vocab_size, corpus=raw, trust_remote_code=trust_remote_code)
    lm = _limit(tokenize_and_chunk(raw, tokenizer, args.block_size, num_proc=args.preprocessing_num_workers), args)
    _require_rows(lm, args)
    documents = len(raw["train"]) + len(raw["validation"])
    return PreparedData(tokenizer, lm, name, documents=documents, empty_dropped=dropped)


def _require_rows(lm: DatasetDict, args) -> None:
    if len(lm["train"]) == 0:
        raise DataError("block_size", args.block_size, problem=f"block_size={args.block_size} leaves no training rows: "
                        "the corpus is shorter than one block", allowed="use a smaller --block_size or more data")
    if len(lm["validation"]) == 0:
        raise DataError("block_size", args.block_size, problem=f"block_size={args.block_size} leaves no validation "
                        "rows: the held-out documents are shorter than one block",
                        allowed="use a smaller --block_size, a larger --validation_fraction or more data")


def pretokenize(args, out: str, trust_remote_code: bool = False, seed: int = 0,
                shard_tokens: Optional[int] = None) -> dict:
    """``hf-fasttrain tokenize``: tokenize ``args.dataset`` once (``datasets.map`` over
    ``args.preprocessing_num_workers`` processes, cached) and write the rows to ``out``; returns the manifest."""
    check_out_folder(out)  # before any work
    if args.tokenizer == CHAR_TOKENIZER and not is_nanogpt_folder(args.dataset):
        raise DataError("tokenizer", CHAR_TOKENIZER, problem="tokenizer: char cuts its rows from the text at each run "
                        "(no tokenizer work to save)", allowed="train on the text file with --tokenizer char as it is")
    if read_manifest(args.dataset) is not None or is_nanogpt_folder(args.dataset):
        raise DataError("dataset", args.dataset, problem=f"{args.dataset!r} is already pre-tokenized",
                        allowed="train on it with --dataset, or tokenize the text it came from")
    prepared = prepare_lm_data(args, trust_remote_code=trust_remote_code, seed=seed)
    if prepared.pretokenized:
        raise DataError("dataset", args.dataset, problem=f"{args.dataset!r} already holds input_ids",
                        allowed="train on it with --dataset as it is")
    source = {"dataset": args.dataset, "dataset_config": args.dataset_config,
              "dataset_split": getattr(args, "dataset_split", None), "text_column": args.text_column,
              "tokenizer": args.tokenizer, "documents": prepared.documents, "empty_dropped": prepared.empty_dropped,
              "validation_fraction": args.validation_fraction}
    kw = {"shard_tokens": shard_tokens} if shard_tokens else {}
    manifest = write_pretokenized(prepared.lm, out, prepared.tokenizer, args.block_size, source, **kw)
    logger.info("%s; wrote %s", prepared.summary(), out)
    return manifest
