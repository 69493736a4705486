"""File helpers shared by the run record, the restart search and resume: atomic writes, checkpoint discovery.

Standard library only: any layer may import this module.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
from pathlib import Path
from typing import Iterable, Optional, Union

__all__ = ["atomic_write_text", "checkpoint_step", "last_complete_checkpoint", "read_json_dict"]

logger = logging.getLogger(__name__)

_CHECKPOINT_RE = re.compile(r"checkpoint-(\d+)")


def atomic_write_text(path: Union[str, os.PathLike], text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file, ``fsync`` and ``os.replace``.

    A reader, or a restart after a kill, sees the old file or the new one, never half of one. The temporary
    name holds the process and thread ids, so threads writing the same path do not collide. Missing parent
    folders are made.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def checkpoint_step(path: Union[str, os.PathLike]) -> Optional[int]:
    """``N`` for a folder named ``checkpoint-N``, else ``None``.

    >>> checkpoint_step("out/checkpoint-40/"), checkpoint_step("out/final")
    (40, None)
    """
    m = _CHECKPOINT_RE.fullmatch(os.path.basename(os.path.normpath(os.fspath(path))))
    return int(m.group(1)) if m else None


def last_complete_checkpoint(
    output_dir: Union[str, os.PathLike],
    before_step: Optional[int] = None,
    extra: Iterable[Union[str, os.PathLike, None]] = (),
    required: Iterable[str] = (),
) -> Optional[str]:
    """The newest ``checkpoint-N`` folder in ``output_dir`` (or among ``extra`` paths) written to the end.

    The Trainer writes ``trainer_state.json`` last, so a checkpoint whose state file is missing or does not
    parse was cut short by a kill: it is skipped (with a warning) in favour of the one before. With
    ``before_step``, only checkpoints with ``N < before_step`` count (a restart trial's stage must end
    exactly at its stop step, so it never resumes from one at or after it). ``required`` names files that
    callbacks write into the checkpoint after ``trainer_state.json`` (in ``on_save``, e.g. the weight
    average): a checkpoint without one of them was cut short too.

    Returns the path as found (``os.path.join(output_dir, name)`` or the ``extra`` path), or ``None``.
    """
    found = {}
    output_dir = os.fspath(output_dir)
    names = os.listdir(output_dir) if os.path.isdir(output_dir) else []
    for path in [os.path.join(output_dir, n) for n in names] + [os.fspath(p) for p in extra if p]:
        step = checkpoint_step(path)
        if step is None or not os.path.isdir(path) or (before_step is not None and step >= before_step):
            continue
        found.setdefault(os.path.realpath(path), (step, path))
    required = list(required)
    for _, path in sorted(found.values(), reverse=True):
        try:
            with open(os.path.join(path, "trainer_state.json"), encoding="utf-8") as f:
                json.load(f)
        except (OSError, ValueError):
            logger.warning("Skipping %s: it was not written to the end (killed while saving?)", path)
            continue
        missing = [name for name in required if not os.path.isfile(os.path.join(path, name))]
        if missing:
            logger.warning("Skipping %s: it has no %s (killed while saving?)", path, ", ".join(missing))
            continue
        return path
    return None


def read_json_dict(path: Union[str, Path]) -> Optional[dict]:
    """The JSON object in ``path``; None when the file is missing, unreadable or not an object."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None
