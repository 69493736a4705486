"""The run's console line: what FastTrainer and the recipe tell the person running them, whatever the logging setup."""

from __future__ import annotations

import sys

__all__ = ["say"]


def say(line: str) -> None:
    """One line on the run's console: stderr, after ``[hf_fasttrain] `` (the recipe's own log lines look the same).

    Printed, not logged: a script that configured no logging (or set it to WARNING) still sees what the run did
    with its ``output_dir`` (resumed from a checkpoint, or found it complete)."""
    sys.stdout.flush()
    print(f"[hf_fasttrain] {line}", file=sys.stderr, flush=True)
