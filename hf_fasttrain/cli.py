"""``hf-fasttrain``: the console entry point.

    hf-fasttrain train --config gpt2_tiny [--<field> <value> ...]   # same as recipes/gpt2_small.py
    hf-fasttrain version
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

__all__ = ["main"]

USAGE = """usage: hf-fasttrain <command> [options]

commands:
  train      train a causal LM from a recipe (--config <path or bundled name>); --help lists every option
  version    print the package version
"""


def _train(argv: Sequence[str]) -> int:
    from .recipes import parse_config
    from .run import train

    model_args, data_args, training_args = parse_config(list(argv))
    train(model_args, data_args, training_args)
    return 0


def _version(argv: Sequence[str]) -> int:
    from . import __version__

    print(__version__)
    return 0


COMMANDS = {"train": _train, "version": _version}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"hf-fasttrain: unknown command {cmd!r}; known: {sorted(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":
    sys.exit(main())
