"""Streaming: documents read as they are needed, tokenized and packed on the fly, resumed in O(1).

`TokenStream` turns a `datasets.IterableDataset` of documents into rows of ``block_size`` tokens
(documents end with EOS and are concatenated, as on the map-style path; a row may span documents).
It never holds the corpus: memory is one window of documents and one partial row.

Order. Documents are read in *windows* of ``shuffle_buffer`` documents (64 when it is 0). With
``shuffle_buffer > 0`` each window is permuted by its own seeded generator, a pure function of
(seed, epoch, reader, window number); the shard order is kept. So the order is reproducible and a
window, not the whole history, is all a resume has to read again.

Readers. Each DDP rank and each DataLoader worker of it is one *reader* with its own part of the data:
``datasets.distributed.split_dataset_by_node(source, rank * workers + worker, world_size * workers)``:
whole shards (files) when their count divides the readers, else every reader reads all and keeps one
document in ``readers``. Either way every document of an epoch goes to exactly one reader.

Position. Every row carries, under ``"_stream"``, where the stream stands after it: the reader, the
epoch, the source's ``state_dict()`` at the start of the window holding the first document that the
rest of the stream starts in, that document's place in the window's order and the tokens of it already
used. `StreamCollator` moves the last row's position into the batch; FastTrainer takes it out when the
training loop takes the batch (so the DataLoader's read-ahead never counts) and saves the positions of
all readers of the rank with every checkpoint (`StreamPosition`). `TokenStream.load_state_dict`
restarts each reader there: it re-reads the documents from the start of that window (one window, plus
the few documents a row spans), whatever the step.

Held-out rows. `holdout_rows` cuts the first rows of a stream for evaluation, from an unshuffled,
unsplit pass, and returns the hashes of the documents they used; a `TokenStream` given those hashes
(``exclude``) skips the documents on every rank and epoch, so the held-out text is never trained on.

The source: `open_stream`, the map-style path's sources (`hf_fasttrain.data.sources`) read with
``streaming=True``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from itertools import islice
from typing import Any, Optional

import torch

from ..validation import ConfigError

__all__ = [
    "STREAM_KEY",
    "DEFAULT_WINDOW",
    "open_stream",
    "document_hash",
    "holdout_rows",
    "TokenStream",
    "StreamCollator",
    "StreamPosition",
    "check_stream_args",
    "stream_datasets",
]

STREAM_KEY = "_stream"
DEFAULT_WINDOW = 64  # documents read (and tokenized) at a time when nothing is shuffled

# ---- the source ---------------------------------------------------------------------------------


def open_stream(dataset: str, dataset_config: Optional[str] = None, split: str = "train", **source_options):
    """A `datasets.IterableDataset` of documents from anything :func:`hf_fasttrain.data.sources.resolve_source`
    takes (local files of any format by extension, ``save_to_disk`` folders, Hub names), read with
    ``streaming=True``; ``source_options`` are ``load_source``'s (``dataset_split``, ``dataset_revision``,
    ``data_files``, ``data_dir``, ``trust_remote_code``).

    Returns None when ``split`` does not exist (e.g. no ``validation`` split). Errors with the user's data are
    one-line errors (:class:`~hf_fasttrain.data.sources.DataError`).
    """
    from .sources import load_source

    loaded = load_source(dataset, dataset_config, streaming=True, **source_options)
    return loaded[split] if split in loaded else None


# ---- tokenizing and packing ---------------------------------------------------------------------


def document_hash(text: str) -> bytes:
    """8 bytes identifying a document's text (held-out documents are skipped by it)."""
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()


def _encoder(tokenizer) -> Callable[[list[str]], list[list[int]]]:
    eos = getattr(tokenizer, "eos_token_id", None)

    def encode(texts: list[str]) -> list[list[int]]:
        ids = tokenizer(texts, add_special_tokens=False, return_attention_mask=False)["input_ids"]
        return [list(x) + [eos] for x in ids] if eos is not None else [list(x) for x in ids]

    return encode


def _permutation(n: int, seed: int, epoch: int, reader: int, window: int) -> list[int]:
    g = torch.Generator()
    g.manual_seed(((((int(seed) * 1_000_003 + int(epoch)) * 10_007 + int(reader)) * 1_000_033 + int(window))
                   % (2**63 - 1)))
    return torch.randperm(n, generator=g).tolist()


def holdout_rows(source, tokenizer, block_size: int, num_rows: int, text_column: str = "text"):
    """The first ``num_rows`` rows of ``block_size`` tokens of ``source`` (in file order, unsplit), and the
    hashes of every document they used (to exclude them from training)."""
    encode = _encoder(tokenizer)
    rows: list[list[int]] = []
    used: set[bytes] = set()
    carry: list[int] = []
    for batch in source.iter(batch_size=DEFAULT_WINDOW):
        texts = [t for t in batch[text_column] if t]
        for text, ids in zip(texts, encode(texts)):
            used.add(document_hash(text))
            carry += ids
            while len(carry) >= block_size and len(rows) < num_rows:
                rows.append(carry[:block_size])
                carry = carry[block_size:]
            if len(rows) >= num_rows:
                return rows, used
    if carry and len(rows) < num_rows:
        rows.append(carry)
    return rows, used


class TokenStream(torch.utils.data.IterableDataset):
    """Rows of ``block_size`` tokens from a stream of documents, split across ranks and workers, resumable.

    Args:
        source: a `datasets.IterableDataset` of documents (all of them: the split happens here).
        tokenizer: a tokenizer (``tokenizer(texts)["input_ids"]``); each document ends with its EOS.
        block_size: tokens per row. The last row of an epoch (the tail) may be shorter.
        text_column: the column holding the text.
        shuffle_buffer: documents per window, each window permuted (seeded); 0: file order (windows of 64).
        seed: the permutations' seed.
        rank, world_size: this process's place among the DDP ranks.
        exclude: hashes (`document_hash`) of documents never to train on (the held-out ones).

    Example:
        >>> import datasets
        >>> from transformers import PreTrainedTokenizerFast
        >>> from tokenizers import Tokenizer, models, pre_tokenizers
        >>> tk = Tokenizer(models.WordLevel({"a": 0, "b": 1, "<eos>": 2}, unk_token="a"))
        >>> tk.pre_tokenizer = pre_tokenizers.Whitespace()
        >>> tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>")
        >>> docs = datasets.Dataset.from_dict({"text": ["a b", "b b a"]}).to_iterable_dataset()
        >>> [row["input_ids"] for row in TokenStream(docs, tok, block_size=3)]
        [[0, 1, 2], [1, 1, 0], [2]]
    """

    def __init__(self, source, tokenizer, block_size: int, *, text_column: str = "text", shuffle_buffer: int = 0,
                 seed: int = 0, rank: int = 0, world_size: int = 1, exclude: Iterable[bytes] = ()):
        if not isinstance(block_size, int) or block_size < 1:
            raise ConfigError("block_size", block_size, "must be an integer >= 1")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 0:
            raise ConfigError("shuffle_buffer", shuffle_buffer, "must be an integer >= 0")
        if not (isinstance(world_size, int) and world_size >= 1 and isinstance(rank, int) and 0 <= rank < world_size):
            raise ConfigError("rank", rank, f"must be in [0, world_size={world_size!r})")
        self.source = source
        self.tokenizer = tokenizer
        self.block_size = block_size
        self.text_column = text_column
        self.shuffle_buffer = shuffle_buffer
        self.window = shuffle_buffer or DEFAULT_WINDOW
        self.seed = int(seed)
        self.rank = rank
        self.world_size = world_size
        self.exclude = frozenset(exclude)
        self.epoch = 0
        self._epoch_base = 0  # the epoch a resume restarted in (the Trainer counts epochs from 0 again)
        self._resume: Optional[dict] = None

    @property
    def row_length(self) -> int:
        """Tokens per training row."""
        return self.block_size

    @property
    def n_shards(self) -> int:
        return int(getattr(self.source, "num_shards", 1) or 1)

    def set_epoch(self, epoch: int) -> None:
        """Called by the Trainer (through accelerate) before each pass; epochs differ in their permutations."""
        self.epoch = self._epoch_base + int(epoch)

    # -- position ------------------------------------------------------------------------------
    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at a position `StreamPosition.state_dict` saved: each reader restarts where it stood."""
        for key in ("world_size", "rank", "block_size", "shuffle_buffer", "seed"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"{key}: the checkpoint's stream was read with {key}={state[key]!r}, this run has "
                    f"{getattr(self, key)!r}; resume with the same value (or start a new output_dir)")
        self._resume = dict(state)
        self._epoch_base = self.epoch = int(state["epoch"])

    def _reader(self, worker: int, workers: int):
        from datasets.distributed import split_dataset_by_node

        return split_dataset_by_node(self.source, rank=self.rank * workers + worker, world_size=self.world_size * workers)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        workers, physical = (info.num_workers, info.id) if info is not None else (1, 0)
        resume = self._resume if self._resume is not None and self._resume["epoch"] == self.epoch else None
        if resume is not None and resume["workers"] != workers:
            raise ValueError(f"dataloader_num_workers: the checkpoint's stream was read by {resume['workers']} "
                             f"worker(s), this run has {workers}; resume with the same number")
        # the worker that yields first is the one whose turn was next when the checkpoint was taken
        worker = (physical + (resume["next_worker"] if resume else 0)) % workers
        position = resume["readers"].get(str(worker)) if resume else None
        yield from self._rows(worker, workers, position)

    def _rows(self, worker: int, workers: int, position: Optional[Mapping[str, Any]]):
        reader = self._reader(worker, workers)
        window_index, first, skip = 0, 0, 0
        if position is not None:
            if position.get("done"):
                return
            reader.load_state_dict(position["source"])
            window_index, first, skip = position["window"], position["doc"], position["offset"]
        encode = _encoder(self.tokenizer)
        block, reader_id = self.block_size, self.rank * workers + worker
        carry: list[int] = []
        # documents in `carry`, oldest first: [source state at their window, window, place in it, length, used]
        parts: list[list[Any]] = []
        docs_iter = reader.iter(batch_size=1)
        # where this window starts: the restored position, or the start (None); later, the state after the last
        # document read (taken after reading: before the first read the reader has no state of its own yet)
        window_state = position["source"] if position is not None else None
        while True:
            raw = [b[self.text_column][0] for b in islice(docs_iter, self.window)]
            if not raw:
                break
            texts = [t for t in raw if t and document_hash(t) not in self.exclude]
            if self.shuffle_buffer:
                texts = [texts[i] for i in _permutation(len(texts), self.seed, self.epoch, reader_id, window_index)]
            start, first = first, 0
            for j, ids in enumerate(encode(texts[start:]) if texts[start:] else [], start=start):
                if skip:
                    ids, used, skip = ids[skip:], skip, 0
                else:
                    used = 0
                parts.append([window_state, window_index, j, used + len(ids), used])
                carry += ids
                while len(carry) >= block:
                    row, carry = carry[:block], carry[block:]
                    at = self._advance(parts, block, window_state, window_index, j)
                    yield {"input_ids": row, STREAM_KEY: self._position(worker, workers, at)}
            window_index += 1
            window_state = reader.state_dict()
        if carry:  # the epoch's tail: a shorter last row, so no document is dropped
            yield {"input_ids": carry, STREAM_KEY: self._position(worker, workers, None)}

    @staticmethod
    def _advance(parts: list, n: int, window_state, window_index: int, j: int) -> tuple:
        """Use ``n`` tokens from the front of ``parts``; the position of the first unused token."""
        while n:
            head = parts[0]
            avail = head[3] - head[4]
            if avail <= n:
                n -= avail
                parts.pop(0)
            else:
                head[4] += n
                n = 0
        if parts:
            head = parts[0]
            return head[0], head[1], head[2], head[4]
        return window_state, window_index, j + 1, 0  # the next document (the next window if j was the last)

    def _position(self, worker: int, workers: int, at: Optional[tuple]) -> dict[str, Any]:
        base = {"worker": worker, "workers": workers, "epoch": self.epoch}
        if at is None:
            return {**base, "done": True}
        source, window, doc, offset = at
        return {**base, "source": source, "window": window, "doc": doc, "offset": offset}


class StreamCollator:
    """Wraps a collator for `TokenStream` rows: collates ``input_ids`` with ``collator`` and puts the last
    row's position in the batch under ``"_stream"`` (FastTrainer takes it out before the model sees it)."""

    def __init__(self, collator: Callable):
        self.collator = collator

    def __call__(self, features):
        position = features[-1].get(STREAM_KEY)
        batch = self.collator([{k: v for k, v in f.items() if k != STREAM_KEY} for f in features])
        if position is not None:
            batch[STREAM_KEY] = position
        return batch


class StreamPosition:
    """The trained position of one rank's stream: the last position the training loop took from each reader.

    ``take(batch)`` removes the position from a batch as the training loop takes it and records it;
    ``state_dict()`` is what a checkpoint saves and `TokenStream.load_state_dict` restores.
    """

    def __init__(self, stream: TokenStream):
        self.stream = stream
        self.readers: dict[str, dict] = {}
        self.last_worker: Optional[int] = None
        self.workers: Optional[int] = None
        self.epoch: Optional[int] = None
        self.batches = 0

    def take(self, batch: dict) -> dict:
        position = batch.pop(STREAM_KEY, None) if isinstance(batch, MutableMapping) else None  # a BatchEncoding too
        if position is None:
            return batch
        if self.epoch != position["epoch"]:  # a new epoch: the old readers' positions are spent
            self.readers = {}
        self.epoch, self.workers = position["epoch"], position["workers"]
        self.last_worker = position["worker"]
        self.readers[str(position["worker"])] = position
        self.batches += 1
        return batch

    def restore(self, state: Mapping[str, Any]) -> None:
        """Start from a saved position (readers not read again before the next save keep theirs)."""
        self.readers = {k: dict(v) for k, v in state["readers"].items()}
        self.epoch, self.workers = state["epoch"], state["workers"]
        self.last_worker = (state["next_worker"] - 1) % state["workers"]

    def state_dict(self) -> Optional[dict[str, Any]]:
        if self.epoch is None:
            return None
        s = self.stream
        return {"epoch": self.epoch, "workers": self.workers, "next_worker": (self.last_worker + 1) % self.workers,
                "readers": self.readers, "world_size": s.world_size, "rank": s.rank, "block_size": s.block_size,
                "shuffle_buffer": s.shuffle_buffer, "seed": s.seed}


# ---- from the run's arguments -------------------------------------------------------------------

DEFAULT_EVAL_ROWS = 64  # held-out rows when max_eval_samples is not set


def check_stream_args(data_args, training_args) -> None:
    """Refuse, before any data is read, what a stream cannot do: no ``max_steps``, length-based batching.

    Each refusal is one ``ValueError`` reading ``<field>: got <value> ...; <what is allowed>`` (the command
    line prints it as ``error: ...`` and exits 2).
    """
    from .from_args import batching_options

    def ConfigError(field, value, allowed, problem=None):  # noqa: N802 (the shape of hf_fasttrain's ConfigError)
        return ValueError(f"{field}: {problem or f'got {value!r}'}; {allowed}")

    if not getattr(data_args, "streaming", False):
        return
    if training_args.max_steps is None or training_args.max_steps <= 0:
        raise ConfigError("max_steps", training_args.max_steps, "streaming: true needs max_steps > 0 (a stream has "
                          "no length to count epochs by)")
    if getattr(data_args, "max_train_samples", None) is not None:
        raise ConfigError("max_train_samples", data_args.max_train_samples, "a stream is not cut to a number of rows: "
                          "max_steps says how much of it is trained on", problem=f"got {data_args.max_train_samples!r} "
                          "with streaming: true")
    options = batching_options(training_args)
    if options:
        name, value = options[0]
        raise ConfigError(name, value, "it plans batches from every example's length, known up front; a stream is "
                          "packed on the fly into rows of block_size: drop the option or set streaming: false",
                          problem=f"got {value!r} with streaming: true")


def _embedded_stream(data_args, seed: int):
    from .corpus import load_text_datasets

    raw = load_text_datasets(data_args.dataset, None, "text", data_args.validation_fraction,
                             data_args.max_corpus_files, seed=seed)
    return raw["train"].to_iterable_dataset(num_shards=min(8, len(raw["train"]))), raw["validation"]


def _tokenizer_sample(source, text_column: str, n: int = 2000):
    """A DatasetDict of the stream's first ``n`` documents to train the default tokenizer on (its cache key
    is the documents' hashes, so a rerun finds it)."""
    from datasets import Dataset, DatasetDict

    texts = [t for b in islice(source.iter(batch_size=DEFAULT_WINDOW), -(-n // DEFAULT_WINDOW))
             for t in b[text_column] if t][:n]
    return DatasetDict({"train": Dataset.from_dict({"text": texts, "path": [document_hash(t).hex() for t in texts]})})


def stream_datasets(data_args, training_args, model_args=None):
    """(tokenizer, train `TokenStream`, eval `datasets.Dataset` of rows) for ``streaming: true``."""
    from datasets import Dataset

    from .corpus import PROSE_CORPUS
    from .sources import load_source_options
    from .tokenizer import get_tokenizer

    check_stream_args(data_args, training_args)
    seed = training_args.data_seed if training_args.data_seed is not None else training_args.seed
    column = data_args.text_column
    if data_args.dataset is None or data_args.dataset == PROSE_CORPUS:
        source, validation = _embedded_stream(data_args, seed=0)
        column = "text"
    else:
        options = load_source_options(data_args, trust_remote_code=bool(model_args and model_args.trust_remote_code))
        source = open_stream(data_args.dataset, data_args.dataset_config, **options)
        validation = open_stream(data_args.dataset, data_args.dataset_config, split="validation", **options)
    names = source.column_names
    if names is not None and column not in names:
        raise ValueError(f"text_column: {column!r} is not a column of the stream; its columns are {names}")
    trust = bool(model_args and model_args.trust_remote_code)
    tokenizer = get_tokenizer(data_args.tokenizer, data_args.vocab_size, trust_remote_code=trust,
                              corpus=None if data_args.tokenizer else _tokenizer_sample(source, column))
    n_eval = data_args.max_eval_samples or DEFAULT_EVAL_ROWS
    exclude: set[bytes] = set()
    if validation is not None:
        if isinstance(validation, Dataset):  # the embedded corpus's own held-out files
            validation = validation.to_iterable_dataset()
        rows, _ = holdout_rows(validation, tokenizer, data_args.block_size, n_eval, column)
    else:  # the first rows of the stream, their documents kept out of training
        rows, exclude = holdout_rows(source, tokenizer, data_args.block_size, n_eval, column)
    if not rows:
        raise ValueError(f"dataset: {data_args.dataset!r} holds no text to hold out for evaluation")
    stream = TokenStream(source, tokenizer, data_args.block_size, text_column=column,
                         shuffle_buffer=data_args.shuffle_buffer, seed=seed, rank=training_args.process_index,
                         world_size=training_args.world_size, exclude=exclude)
    return tokenizer, stream, Dataset.from_dict({"input_ids": rows})
