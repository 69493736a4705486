"""The run's tokenizer: loaded from any form users have, or a byte-level BPE trained on the corpus and cached;
what it maps text to, as a fingerprint; and the check that a tokenizer named beside a LoRA base fits it.

Example:
    >>> from hf_fasttrain.data.corpus import build_stdlib_corpus
    >>> from hf_fasttrain.data.tokenizer import get_tokenizer, tokenizer_fingerprint
    >>> raw = build_stdlib_corpus(max_files=40)                 # DatasetDict(train, validation)
    >>> tok = get_tokenizer(vocab_size=512, corpus=raw)          # trained once, then cached
    >>> key = tokenizer_fingerprint(tok)                         # the same for its save_pretrained copy
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Iterable, Optional

from datasets import Dataset, DatasetDict

from ..validation import ConfigError
from .corpus import atomic_dir, publish_dir, build_stdlib_corpus, cache_root

__all__ = ["EOS_TOKEN", "PAD_TOKEN", "TOKENIZER_FORMS", "get_tokenizer", "load_tokenizer", "check_tokenizer_path", "tokenizer_fingerprint",
           "check_tokenizer_fits"]

logger = logging.getLogger(__name__)

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"


def _train_bpe(texts: Iterable[str], vocab_size: int):
    """Train a byte-level BPE (GPT-2 style) on ``texts``; returns a ``tokenizers.Tokenizer``."""
    from tokenizers import ByteLevelBPETokenizer

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=[EOS_TOKEN, PAD_TOKEN],
        show_progress=True,
    )
    return bpe._tokenizer


def _corpus_fingerprint(train: Dataset) -> str:
    h = hashlib.sha1()
    if "path" in train.column_names:  # the embedded corpus: its file list identifies it
        for p in train["path"]:
            h.update(p.encode())
    else:
        h.update(train._fingerprint.encode())
    return h.hexdigest()[:16]


TOKENIZER_FORMS = ("a save_pretrained folder, a tokenizer.json file (or a folder holding one), a folder with "
                   "vocab.json + merges.txt (byte-level BPE), or a Hub tokenizer name")


def _tokenizer_error(name_or_path: str, why: str):
    from .sources import DataError

    return DataError("tokenizer", name_or_path, problem=f"{name_or_path!r} could not be loaded ({why})",
                     allowed=f"give {TOKENIZER_FORMS}")


def check_tokenizer_path(name_or_path: Optional[str]) -> None:
    """A tokenizer named by a local path (``./tok``, ``../tok``, ``/abs/tok``, ``~/tok``, ``a/b/c``) must exist:
    refused in one line before any data is read, instead of the Hub's answer to a name it cannot parse. A Hub name
    (``gpt2``, ``owner/name``) is left to the loader."""
    if not name_or_path:
        return
    text = str(name_or_path)
    local = text.startswith((".", "/", "~")) or "\\" in text or text.count("/") > 1
    if local and not Path(os.path.expanduser(text)).exists():
        from .sources import DataError

        raise DataError("tokenizer", text, problem=f"the folder or file {text!r} does not exist",
                        allowed=f"give {TOKENIZER_FORMS}")


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """A tokenizer with ``eos`` and ``pad`` tokens, from any of the forms users have:

    - a ``save_pretrained`` folder or a Hub name (``AutoTokenizer``);
    - a ``tokenizer.json`` file of the ``tokenizers`` library, or a folder holding only one;
    - a folder (or its ``vocab.json``) with ``vocab.json`` + ``merges.txt``: a byte-level BPE.

    A tokenizer without an end-of-text token gets ``<|endoftext|>`` (its own when its vocabulary has one),
    and one without a padding token gets ``<|pad|>`` (pad = eos for a tokenizer that has an eos, as GPT-2's
    is used), and a one-line warning says which ids were added. Anything else: a one-line ``DataError``
    naming the forms that work.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    check_tokenizer_path(name_or_path)
    path = Path(os.path.expanduser(name_or_path))
    raw = None  # a bare `tokenizers` tokenizer: its specials are ours to add
    try:
        if path.is_file() and path.name.endswith(".json") and path.name != "vocab.json":
            raw = PreTrainedTokenizerFast(tokenizer_file=str(path))
        elif path.is_file() and path.name == "vocab.json" or path.is_dir() and (path / "vocab.json").is_file() \
                and (path / "merges.txt").is_file() and not (path / "tokenizer_config.json").is_file() \
                and not (path / "tokenizer.json").is_file():
            folder = path.parent if path.is_file() else path
            if not (folder / "merges.txt").is_file():
                raise _tokenizer_error(name_or_path, f"no merges.txt beside {path.name}")
            from tokenizers import ByteLevelBPETokenizer

            bpe = ByteLevelBPETokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
            raw = PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer)
        elif path.is_dir() and (path / "tokenizer.json").is_file() and not (path / "tokenizer_config.json").is_file():
            raw = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
        elif path.exists() and not path.is_dir():
            raise _tokenizer_error(name_or_path, f"{path.name} is not a tokenizer file")
        else:
            tok = AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except Exception as exc:
        from .sources import DataError

        if isinstance(exc, DataError):
            raise
        lines = str(exc).strip().splitlines()
        raise _tokenizer_error(name_or_path, f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")) from exc
    if raw is not None:
        tok = raw
        tok.model_max_length = 1_000_000  # chunking, not the tokenizer, decides lengths
    added = []
    if tok.eos_token is None:
        tok.add_special_tokens({"eos_token": EOS_TOKEN})
        added.append(f"eos {EOS_TOKEN!r} (id {tok.eos_token_id})")
    if tok.pad_token is None:
        if raw is None:  # GPT-2 style tokenizers ship without one: pad with eos, the vocabulary unchanged
            tok.pad_token = tok.eos_token
        else:
            tok.add_special_tokens({"pad_token": PAD_TOKEN})
            added.append(f"pad {PAD_TOKEN!r} (id {tok.pad_token_id})")
    if added:
        logger.warning("tokenizer %s has no %s token: added %s; the vocabulary is now %d", name_or_path,
                       " or ".join(a.split()[0] for a in added), " and ".join(added), len(tok))
    return tok


def tokenizer_fingerprint(tokenizer) -> str:
    """A short hash of what a tokenizer maps text to (its ``tokenizers`` serialisation, specials included),
    the same for a tokenizer and its ``save_pretrained`` copy; a different vocabulary, merges or normaliser
    gives another."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        text = backend.to_str()
    else:
        text = json.dumps(sorted(tokenizer.get_vocab().items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def get_tokenizer(
    name_or_path: Optional[str] = None,
    vocab_size: int = 8192,
    corpus: Optional[DatasetDict] = None,
    trust_remote_code: bool = False,
):
    """A ``PreTrainedTokenizerFast`` with ``eos`` and ``pad`` tokens set.

    With ``name_or_path`` it is loaded by :func:`load_tokenizer` (every form it takes). Otherwise a
    byte-level BPE of ``vocab_size`` is trained on ``corpus['train']`` (default: the embedded stdlib
    corpus) and cached; a second call with the same corpus and vocab size loads it from the cache.
    """
    from transformers import PreTrainedTokenizerFast

    if name_or_path is not None:
        return load_tokenizer(name_or_path, trust_remote_code=trust_remote_code)
    if not isinstance(vocab_size, int) or vocab_size < 260:
        raise ConfigError("vocab_size", vocab_size, "must be an integer >= 260 (256 bytes + specials)")
    corpus = corpus if corpus is not None else build_stdlib_corpus()
    train = corpus["train"]
    key = f"bpe-v{vocab_size}-{_corpus_fingerprint(train)}"
    target = cache_root() / "tokenizers" / key
    if (target / "tokenizer.json").exists():
        logger.info("Loading cached tokenizer from %s", target)
        return PreTrainedTokenizerFast.from_pretrained(str(target))

    logger.info("Training a byte-level BPE tokenizer (vocab %d) on %d documents", vocab_size, len(train))
    raw = _train_bpe((t for t in train["text"]), vocab_size)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        bos_token=EOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        model_max_length=1_000_000,  # chunking, not the tokenizer, decides lengths
    )
    tmp = atomic_dir(target)
    tok.save_pretrained(str(tmp))
    publish_dir(tmp, target)
    return PreTrainedTokenizerFast.from_pretrained(str(target))


def check_tokenizer_fits(model_args, tokenizer_source: str, trust_remote_code: bool = False) -> None:
    """A tokenizer named beside a pretrained base must fit the base's vocabulary (a LoRA base cannot learn
    new embedding rows): checked from the base's config before any data is read."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_args.model_name_or_path, trust_remote_code=trust_remote_code)
    vocab = getattr(config, "vocab_size", None) or getattr(getattr(config, "text_config", None), "vocab_size", None)
    tokenizer = get_tokenizer(tokenizer_source, trust_remote_code=trust_remote_code)
    if isinstance(vocab, int) and len(tokenizer) > vocab and model_args.lora_r is not None:
        raise ConfigError("tokenizer", tokenizer_source,
                          problem=f"tokenizer {tokenizer_source!r} has {len(tokenizer)} tokens, the base "
                          f"{model_args.model_name_or_path!r} {vocab}",
                          allowed="the base's own tokenizer (leave data.tokenizer unset) or one that fits its vocabulary")
