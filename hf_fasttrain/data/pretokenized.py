"""Pre-tokenized data: packed ``input_ids`` rows in parquet shards with a ``manifest.json``.

``hf-fasttrain tokenize`` writes a folder::

    DIR/manifest.json              format, block size, tokens and rows per split, tokenizer hash, source
    DIR/tokenizer/                 the tokenizer that made the rows (save_pretrained)
    DIR/train/00000.parquet ...    rows of exactly block_size token ids (int32)
    DIR/validation/00000.parquet

``--dataset DIR`` then trains on it with no tokenizer work: :func:`check_manifest` refuses, in one line, a
run whose tokenizer or ``block_size`` is not the one the rows were made with.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

from .tokenizer import tokenizer_fingerprint
from .sources import MANIFEST, PRETOKENIZED_FORMAT, DataError, pretokenized_manifest

__all__ = ["MANIFEST", "TOKENIZER_DIR", "read_manifest", "check_manifest", "check_out_folder", "write_pretokenized", "shard_plan"]

TOKENIZER_DIR = "tokenizer"
MANIFEST_VERSION = 1
DEFAULT_SHARD_TOKENS = 1 << 25  # 32M tokens: 128 MiB of int32 before compression


def read_manifest(path: Optional[str]) -> Optional[dict]:
    """The manifest of a folder written by ``hf-fasttrain tokenize``; None for anything else."""
    if not path or not isinstance(path, str) or not os.path.isdir(os.path.expanduser(path)):
        return None
    return pretokenized_manifest(Path(os.path.expanduser(path)))


def check_manifest(manifest: Mapping[str, Any], tokenizer, block_size: int, where: str) -> None:
    """Refuse (one-line :class:`DataError`) rows made with another tokenizer or another block size."""
    made = manifest.get("block_size")
    if made != block_size:
        raise DataError("block_size", block_size, problem=f"block_size={block_size} but {where!r} holds rows of "
                        f"{made} tokens (its {MANIFEST})", allowed=f"use --block_size {made}, or run hf-fasttrain "
                        f"tokenize again with --block_size {block_size}")
    want = (manifest.get("tokenizer") or {}).get("sha256")
    have = tokenizer_fingerprint(tokenizer)
    if want != have:
        name = (manifest.get("tokenizer") or {}).get("name")
        raise DataError("tokenizer", getattr(tokenizer, "name_or_path", None) or "the run's tokenizer",
                        problem=f"not the tokenizer {where!r} was made with ({name!r}, hash {want}; this one's is "
                        f"{have})", allowed=f"leave --tokenizer unset to use {os.path.join(where, TOKENIZER_DIR)}, "
                        "or tokenize the data again with this tokenizer")


def shard_plan(rows: int, block_size: int, shard_tokens: int = DEFAULT_SHARD_TOKENS) -> list[tuple[int, int]]:
    """Row ranges ``[(start, stop), ...]`` of the shards: about ``shard_tokens`` tokens each, at least one.

    >>> shard_plan(10, 4, shard_tokens=16)
    [(0, 4), (4, 8), (8, 10)]
    >>> shard_plan(0, 4)
    [(0, 0)]
    """
    per = max(1, shard_tokens // block_size)
    n = max(1, math.ceil(rows / per))
    return [(i * per, min(rows, (i + 1) * per)) for i in range(n)]


def check_out_folder(out: str) -> Path:
    """``out`` as a Path, refused (one line) when it exists and is not an empty folder."""
    final = Path(os.path.expanduser(out))
    if final.exists() and (not final.is_dir() or any(final.iterdir())):
        raise DataError("out", out, problem=f"{out!r} already exists and is not empty",
                        allowed="give a new folder (the output is written whole, never over another)")
    return final


def write_pretokenized(lm, out: str, tokenizer, block_size: int, source: Mapping[str, Any],
                       shard_tokens: int = DEFAULT_SHARD_TOKENS) -> dict:
    """Write ``lm`` (DatasetDict of ``input_ids`` rows of ``block_size``) as parquet shards + manifest.

    The folder appears whole or not at all (written beside it, then renamed); an existing non-empty
    ``out`` is refused. Returns the manifest.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    from .._version import __version__

    final = check_out_folder(out)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    try:
        shards: dict[str, list[str]] = {}
        tokens: dict[str, int] = {}
        rows: dict[str, int] = {}
        for split, ds in lm.items():
            (tmp / split).mkdir()
            names = []
            for i, (lo, hi) in enumerate(shard_plan(len(ds), block_size, shard_tokens)):
                table = ds.select(range(lo, hi)).with_format("arrow")[:] if hi > lo else \
                    pa.table({"input_ids": pa.array([], type=pa.list_(pa.int32()))})
                table = table.select(["input_ids"]).cast(pa.schema([("input_ids", pa.list_(pa.int32()))]))
                name = f"{split}/{i:05d}.parquet"
                pq.write_table(table, str(tmp / name))
                names.append(name)
            shards[split], rows[split], tokens[split] = names, len(ds), len(ds) * block_size
        tokenizer.save_pretrained(str(tmp / TOKENIZER_DIR))
        manifest = {
            "format": PRETOKENIZED_FORMAT,
            "version": MANIFEST_VERSION,
            "block_size": block_size,
            "tokens": tokens,
            "rows": rows,
            "shards": shards,
            "tokenizer": {"name": str(source.get("tokenizer") or "trained BPE"), "sha256": tokenizer_fingerprint(tokenizer),
                          "vocab_size": len(tokenizer), "eos_token_id": tokenizer.eos_token_id,
                          "path": TOKENIZER_DIR},
            "source": dict(source),
            "hf_fasttrain": __version__,
        }
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
        if final.exists():
            final.rmdir()
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest
