"""Character-level data as nanoGPT keeps it: a folder of token ids, or one text file cut into characters.

Two forms of the same data train with no conversion:

- a nanoGPT data folder (``data/shakespeare_char`` after its ``prepare.py``): ``train.bin`` and ``val.bin`` hold
  the token ids as uint16, and ``meta.pkl`` the vocabulary (``vocab_size``, ``itos``, ``stoi``). The pickle is
  read by :func:`read_meta` with an unpickler that builds dicts, lists, tuples, strings and numbers only and
  refuses anything else in one line: a ``meta.pkl`` cannot run code. Without ``meta.pkl`` the run names its
  tokenizer (the one that made the ids);
- a text file with ``tokenizer: char``: the characters of the file, sorted, are the vocabulary (nanoGPT's
  ``prepare.py`` rule), the first 90% of the characters train and the last 10% validate.

Either way the rows are nanoGPT's windows (:func:`window_rows`): ``input_ids`` of ``block_size`` ids starting
every ``block_size`` ids and ``labels``, the ``block_size`` ids that follow each one (already shifted), so every
position of a row predicts its next id (64 predictions per row of 64). :class:`WindowCollator` stacks them and hands
the labels to the model as ``shift_labels``, which transformers' causal-LM loss takes as they are. The validation rows
are the whole split cut the same way: ``(n - 1) // block_size`` windows predict the ids ``1 .. block_size x
windows`` of the split (the first id has no context; the last ``(n - 1) % block_size`` ids are left out).

The tokenizer (:func:`char_tokenizer`) is a real ``PreTrainedTokenizerFast`` whose ids are the folder's: it saves
with the run and ``generate`` decodes with it.

Example:
    >>> tok = char_tokenizer(sorted(set("to be or not")))
    >>> tok("be not")["input_ids"], tok.decode(tok("be not")["input_ids"])
    ([1, 2, 0, 3, 4, 6], 'be not')
"""

from __future__ import annotations

import io
import os
import pickle
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from .sources import NANOGPT_FILES, DataError, is_nanogpt_folder

__all__ = ["CHAR_TOKENIZER", "META_FILE", "TRAIN_FRACTION", "is_nanogpt_folder", "read_meta", "read_ids",
           "char_tokenizer", "split_ids", "window_rows", "WindowCollator", "load_char_data", "write_nanogpt_folder"]

CHAR_TOKENIZER = "char"  # tokenizer: char -> the characters of the text file
META_FILE = "meta.pkl"
TRAIN_FRACTION = 0.9  # nanoGPT's prepare.py: the first 90% of the characters train, the last 10% validate
_CONTAINERS = {("builtins", "set"), ("builtins", "frozenset"), ("builtins", "bytearray")}


class _DataOnlyUnpickler(pickle.Unpickler):
    """Builds dicts, lists, tuples, strings, bytes, numbers, booleans and None (pickle's own opcodes) and the
    builtin sets; any other global a pickle names (a class, a function: what lets a pickle run code) is refused."""

    def __init__(self, file, where: str):
        super().__init__(file)
        self.where = where

    def find_class(self, module: str, name: str):
        if (module, name) in _CONTAINERS:
            return super().find_class(module, name)
        raise DataError("dataset", self.where, problem=f"{self.where!r} asks for {module}.{name}; it is not read "
                        "(a pickle that names a class or function could run code)",
                        allowed="a meta.pkl of builtin dicts, lists, strings and numbers (nanoGPT's prepare.py "
                        "writes one), or give the tokenizer with --tokenizer")


def read_meta(path: str | os.PathLike) -> dict[str, Any]:
    """``meta.pkl`` of a nanoGPT data folder (or the file itself): ``{"vocab_size", "itos", "stoi"}``, read without
    running code, checked: ``itos`` maps each id ``0 .. vocab_size - 1`` to a string and ``stoi`` is its inverse.

    Raises :class:`DataError` (one line) for a pickle that names any class or function, or a vocabulary that is not
    that shape.
    """
    path = Path(path)
    if path.is_dir():
        path = path / META_FILE
    where = str(path)
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise DataError("dataset", where, problem=f"cannot read {where!r} ({e.strerror or e})",
                        allowed="a readable meta.pkl") from e
    try:
        meta = _DataOnlyUnpickler(io.BytesIO(raw), where).load()
    except DataError:
        raise
    except Exception as e:
        raise DataError("dataset", where, problem=f"{where!r} is not a readable pickle ({type(e).__name__}: {e})",
                        allowed="the meta.pkl nanoGPT's prepare.py writes") from e
    bad = None
    if not isinstance(meta, dict) or not {"itos", "stoi"} <= set(meta):
        bad = f"holds {type(meta).__name__} without itos and stoi" if not isinstance(meta, dict) else \
            f"has keys {sorted(map(str, meta))}, not itos and stoi"
    else:
        itos, stoi = meta["itos"], meta["stoi"]
        size = meta.get("vocab_size", len(itos) if isinstance(itos, dict) else None)
        if not (isinstance(itos, dict) and isinstance(stoi, dict) and isinstance(size, int)):
            bad = "itos and stoi must be dicts and vocab_size an integer"
        elif sorted(itos) != list(range(size)) or not all(isinstance(s, str) for s in itos.values()):
            bad = f"itos must map every id 0..{size - 1} (vocab_size {size}) to a string"
        elif stoi != {s: i for i, s in itos.items()}:
            bad = "stoi is not the inverse of itos"
    if bad:
        raise DataError("dataset", where, problem=f"{where!r} {bad}",
                        allowed="a meta.pkl with vocab_size, itos (id -> string) and stoi (its inverse)")
    return {"vocab_size": len(meta["itos"]), "itos": dict(meta["itos"]), "stoi": dict(meta["stoi"])}


def read_ids(path: str | os.PathLike) -> np.ndarray:
    """The token ids of a nanoGPT ``.bin`` file (uint16, native byte order, as ``np.array.tofile`` writes them)."""
    path = Path(path)
    size = path.stat().st_size
    if size % 2:
        raise DataError("dataset", str(path), problem=f"{str(path)!r} holds {size:,} bytes, not whole uint16 ids",
                        allowed="a .bin of uint16 token ids (nanoGPT's prepare.py format)")
    return np.fromfile(path, dtype=np.uint16)


def char_tokenizer(chars: Sequence[str] | Mapping[int, str]):
    """A ``PreTrainedTokenizerFast`` that maps each character to its id: ``chars[i]`` (or ``itos[i]``) is id ``i``.
    Text is cut into single characters (whitespace and newlines included) and decoded by joining them, so
    ``decode(encode(text)) == text``; a character outside the vocabulary is an error. No special tokens are added:
    the vocabulary is exactly the characters."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    itos = dict(chars) if isinstance(chars, Mapping) else dict(enumerate(chars))
    if any(not isinstance(c, str) or len(c) != 1 for c in itos.values()):
        long = next(c for c in itos.values() if not isinstance(c, str) or len(c) != 1)
        raise DataError("tokenizer", CHAR_TOKENIZER, problem=f"the vocabulary holds {long!r}, not one character",
                        allowed="a character vocabulary (one character per id), or give the tokenizer that made "
                        "the ids with --tokenizer")
    vocab = {c: i for i, c in itos.items()}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=None))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")  # every character alone
    backend.decoder = decoders.Fuse()  # joined back with nothing between them
    return PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False,
                                   model_max_length=1_000_000)


def split_ids(ids: np.ndarray, train_fraction: float = TRAIN_FRACTION) -> tuple[np.ndarray, np.ndarray]:
    """nanoGPT's split: the first ``int(n x train_fraction)`` ids train, the rest validate.

    >>> [len(s) for s in split_ids(np.arange(1_115_394))]
    [1003854, 111540]
    """
    cut = int(len(ids) * train_fraction)
    return ids[:cut], ids[cut:]


def window_rows(ids: np.ndarray, block_size: int):
    """``datasets.Dataset`` of nanoGPT windows: row ``k`` has ``input_ids = ids[k B : k B + B]`` and
    ``labels = ids[k B + 1 : k B + B + 1]`` (``B = block_size``; the next ids, already shifted),
    ``(len(ids) - 1) // B`` rows.

    >>> rows = window_rows(np.arange(10), 4)
    >>> rows[:]["input_ids"], rows[:]["labels"]
    ([[0, 1, 2, 3], [4, 5, 6, 7]], [[1, 2, 3, 4], [5, 6, 7, 8]])
    """
    from datasets import Dataset, Features, Sequence as Seq, Value

    n = max(0, (len(ids) - 1) // block_size)
    x = np.asarray(ids[: n * block_size], dtype=np.int32).reshape(n, block_size)
    y = np.asarray(ids[1: n * block_size + 1], dtype=np.int32).reshape(n, block_size)
    features = Features({"input_ids": Seq(Value("int32")), "labels": Seq(Value("int32"))})
    return Dataset.from_dict({"input_ids": x.tolist(), "labels": y.tolist()}, features=features)


class WindowCollator:
    """Stacks window rows: ``input_ids``, and their ``labels`` (the next ids) as ``shift_labels``, which the
    causal-LM loss takes unshifted (and the Trainer counts as the batch's items). ``labels`` is the same tensor: the
    Trainer computes an eval loss only for batches that carry labels.

    Example:
        ```python
        >>> b = WindowCollator()([{"input_ids": [1, 2], "labels": [2, 3]}])
        >>> b["input_ids"].tolist(), b["shift_labels"].tolist()
        ([[1, 2]], [[2, 3]])

        ```
    """

    def __call__(self, features):
        import torch

        x = torch.tensor([f["input_ids"] for f in features], dtype=torch.long)
        y = torch.tensor([f["labels"] for f in features], dtype=torch.long)
        return {"input_ids": x, "shift_labels": y, "labels": y}


def _check_ids(ids: np.ndarray, vocab_size: int, where: str) -> None:
    if len(ids) and int(ids.max()) >= vocab_size:
        raise DataError("dataset", where, problem=f"{where!r} holds token id {int(ids.max())}, outside the "
                        f"vocabulary's {vocab_size} ids", allowed="the tokenizer (or meta.pkl) that made the ids")


def _read_text(path: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError("dataset", path, problem=f"{path!r} is not UTF-8 text (byte offset {e.start:,})",
                        allowed="a UTF-8 text file with tokenizer: char") from e
    except OSError as e:
        raise DataError("dataset", path, problem=f"cannot read {path!r} ({e.strerror or e})",
                        allowed="a readable text file with tokenizer: char") from e


def load_char_data(dataset: str, tokenizer: Optional[str], block_size: int, trust_remote_code: bool = False):
    """``(tokenizer, DatasetDict(train, validation) of window rows, summary)`` for a nanoGPT folder or a text file
    with ``tokenizer: char`` (see the module docstring). ``tokenizer`` names another one for a folder whose ids
    it made (a folder without ``meta.pkl`` needs it)."""
    from datasets import DatasetDict

    path = os.path.expanduser(dataset)
    if is_nanogpt_folder(path):
        folder = Path(path)
        if tokenizer is not None and tokenizer != CHAR_TOKENIZER:
            from .tokenizer import load_tokenizer

            tok = load_tokenizer(tokenizer, trust_remote_code=trust_remote_code)
            vocab = len(tok)
        elif (folder / META_FILE).is_file():
            meta = read_meta(folder)
            tok, vocab = char_tokenizer(meta["itos"]), meta["vocab_size"]
        else:
            raise DataError("tokenizer", tokenizer, problem=f"{dataset!r} holds token ids and no {META_FILE} names "
                            "their vocabulary", allowed="give the tokenizer that made them with --tokenizer")
        splits = {}
        for split, name in zip(("train", "validation"), NANOGPT_FILES):
            ids = read_ids(folder / name)
            _check_ids(ids, vocab, str(folder / name))
            splits[split] = ids
        what = f"nanoGPT folder, {vocab} ids"
    else:
        if not os.path.isfile(path):
            raise DataError("dataset", dataset, problem=f"tokenizer: char reads one text file; {dataset!r} is not one",
                            allowed="a UTF-8 text file, or a nanoGPT data folder (train.bin, val.bin, meta.pkl)")
        text = _read_text(path)
        chars = sorted(set(text))
        tok = char_tokenizer(chars)
        stoi = {c: i for i, c in enumerate(chars)}
        ids = np.fromiter((stoi[c] for c in text), dtype=np.uint16 if len(chars) < 65536 else np.int64, count=len(text))
        splits = dict(zip(("train", "validation"), split_ids(ids)))
        what = f"{len(text):,} characters, {len(chars)} distinct"
    lm = DatasetDict({split: window_rows(ids, block_size) for split, ids in splits.items()})
    summary = (f"data {dataset}: {what}; {len(splits['train']):,} train and {len(splits['validation']):,} validation "
               f"ids -> {len(lm['train']):,} train rows, {len(lm['validation']):,} validation rows of {block_size}")
    return tok, lm, summary


def write_nanogpt_folder(text: str, out: str | os.PathLike) -> dict[str, Any]:
    """Write ``text`` as nanoGPT's ``prepare.py`` does (``train.bin``, ``val.bin``, ``meta.pkl`` in ``out``):
    the sorted characters are the vocabulary, the first 90% train. Returns the meta."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in text], dtype=np.uint16)
    train, val = split_ids(ids)
    train.tofile(out / NANOGPT_FILES[0])
    val.tofile(out / NANOGPT_FILES[1])
    meta = {"vocab_size": len(chars), "itos": dict(enumerate(chars)), "stoi": stoi}
    with open(out / META_FILE, "wb") as f:
        pickle.dump(meta, f)
    return meta
