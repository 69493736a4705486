#!/usr/bin/env python
"""The budget ladder's command: ``python -m benchmarks.budget_ladder [options]`` runs ``python -m benchmarks.ladder
budget [options]`` (benchmarks/ladder.py), with the same options and the same files (budget_ladder.json, .md, .png).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.budget_ladder [options]", file=sys.stderr)
    raise SystemExit(2)

import sys
from typing import Any

from benchmarks._harness import run_cli
from benchmarks import ladder


def main(argv=None) -> dict[str, Any]:
    return ladder.main(["budget", *(sys.argv[1:] if argv is None else argv)], command="python -m benchmarks.budget_ladder")


if __name__ == "__main__":
    run_cli(main)
