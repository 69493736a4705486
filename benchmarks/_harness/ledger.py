"""The resumable ledger of a long study: one JSON file of every finished run, keyed by its settings, that
several processes may share (each writes what it changed, under a lock)."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

__all__ = ["Ledger", "merge_changes"]


class Ledger:
    """The JSON file: every finished run, step-time measurements and the summary; written atomically.

    Two processes may share one file when they write different entries (two budgets of one search): ``save``
    rereads the file under a lock and writes back, at the top two levels, only what this process changed
    since it last loaded or saved, so neither undoes the other's runs."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict[str, Any] = {"runs": {}, "step_time": {}}
        if path.exists():
            self.data = json.loads(path.read_text())
            self.data.setdefault("runs", {})
            self.data.setdefault("step_time", {})
        self._saved = copy.deepcopy(self.data)

    def save(self) -> None:
        import fcntl

        folder = os.open(self.path.parent, os.O_RDONLY)  # the lock: the folder itself, so no file is left behind
        try:
            fcntl.flock(folder, fcntl.LOCK_EX)
            disk = json.loads(self.path.read_text()) if self.path.exists() else {}
            merge_changes(disk, self._saved, self.data)
            tmp = self.path.with_suffix(".json.tmp")
            tmp.write_text(json.dumps(self.data, indent=1, default=str))
            os.replace(tmp, self.path)
            self._saved = copy.deepcopy(self.data)
        finally:
            os.close(folder)  # closing releases the lock


_MISSING = object()


def merge_changes(disk: dict[str, Any], base: dict[str, Any], mine: dict[str, Any]) -> dict[str, Any]:
    """Bring another writer's entries from ``disk`` into ``mine`` (in place, so references into it stay
    valid) and return it: two levels deep (a top-level dict's entries one by one; anything else whole), an
    entry this writer left as it was in ``base`` takes ``disk``'s value, one it added or changed keeps its
    own. Nothing is deleted."""
    for key, theirs in disk.items():
        ours, old = mine.get(key, _MISSING), base.get(key, _MISSING)
        if isinstance(ours, dict) and isinstance(theirs, dict):
            old = old if isinstance(old, dict) else {}
            for k, v in theirs.items():
                if k not in ours or (k in old and ours[k] == old[k]):
                    ours[k] = copy.deepcopy(v)
        elif ours is _MISSING or (old is not _MISSING and ours == old):
            mine[key] = copy.deepcopy(theirs)
    return mine
