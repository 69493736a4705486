"""What the benchmark scripts share: where results go, how a worker subprocess is started, the machine.

Every script runs as ``python -m benchmarks.<name>`` from the checkout root; Python then puts the root on
``sys.path``, so ``import hf_fasttrain`` finds this checkout, not an installed copy. A worker subprocess
gets the same root through ``PYTHONPATH`` (:func:`subprocess_env`), whatever its working directory.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["ROOT", "RESULTS", "HostReadCounter", "module_command", "subprocess_env", "machine_info", "write_json",
           "markdown_table", "fmt", "display_path", "display_command", "UsageError", "run_cli"]

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


class UsageError(SystemExit):
    """A bad option on a benchmark's command line: its message is the one line the user sees, its exit status 2
    (argparse's own for a bad option). :func:`run_cli` prints it; a test matches it as any SystemExit."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = 2


def run_cli(main, *args):
    """Run a benchmark's ``main(*args)`` as its command: a :class:`UsageError` becomes ``error: <message>`` on
    stderr and exit status 2, with no traceback."""
    try:
        return main(*args)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def module_command(module: str, *args: str) -> list[str]:
    """``[python, -m, benchmarks.<module>, *args]``: the command that runs a benchmark (or one of its workers).

    >>> module_command("padding", "--steps", "2")[1:]
    ['-m', 'benchmarks.padding', '--steps', '2']
    """
    return [sys.executable, "-m", f"benchmarks.{module}", *args]


def display_path(path: str | os.PathLike) -> str:
    """A path as a results page shows it: relative to the checkout root when inside it, else ``<name>``.

    A results file is read on other machines: an absolute path of the machine that measured says nothing
    there. A folder outside the checkout (a clone of transformers' tests, a scratch copy) becomes a
    placeholder named after its last part.

    >>> display_path(ROOT / "benchmarks" / "results")
    'benchmarks/results'
    >>> display_path("/somewhere/else/hf_trainer_tests")
    '<hf_trainer_tests>'
    >>> display_path("runs/x")
    'runs/x'
    """
    text = os.fspath(path)
    if not os.path.isabs(text):
        return text
    resolved = Path(text).resolve()
    if resolved == ROOT:
        return "."
    if resolved.is_relative_to(ROOT):
        return resolved.relative_to(ROOT).as_posix()
    return f"<{resolved.name or 'root'}>"


def display_command(prefix: str, argv: Sequence[str]) -> str:
    """``prefix`` and ``argv`` as one command line for a results page, absolute paths shown by :func:`display_path`.

    >>> display_command("python -m benchmarks.scaling", ["--out", str(ROOT / "benchmarks/results"), "--jobs", "2"])
    'python -m benchmarks.scaling --out benchmarks/results --jobs 2'
    >>> display_command("python -m benchmarks.hf_trainer_suite", ["--tests=/tmp/t/tests"])
    'python -m benchmarks.hf_trainer_suite --tests=<tests>'
    """
    shown = []
    for arg in argv:
        arg = str(arg)
        flag, eq, value = arg.partition("=")
        if eq and flag.startswith("-") and os.path.isabs(value):
            shown.append(f"{flag}={display_path(value)}")
        else:
            shown.append(display_path(arg) if os.path.isabs(arg) else arg)
    return " ".join([prefix, *shown]).strip()


def subprocess_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """``os.environ`` with the checkout root first on ``PYTHONPATH`` (plus ``extra``), for worker processes."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.update(extra or {})
    return env


def machine_info() -> dict[str, Any]:
    """The machine and versions a figure was measured on (the package's own record: config-free part)."""
    from hf_fasttrain.runinfo import environment_info

    info = environment_info()
    info["argv"] = [display_path(a) if os.path.isabs(a) else a for a in info.get("argv", [])]
    info["processor"] = platform.processor() or platform.machine()
    return info


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Writes ``obj`` as indented JSON, atomically (a killed benchmark never leaves half a file)."""
    from hf_fasttrain._files import atomic_write_text

    path = Path(path)
    atomic_write_text(path, json.dumps(obj, indent=2, default=str))
    return path


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A markdown table; floats with 4 significant digits.

    >>> print(markdown_table(["arm", "ms"], [["a", 1.23456], ["b", 2]]))
    | arm | ms |
    |---|---|
    | a | 1.235 |
    | b | 2 |
    """

    def cell(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def fmt(x: Any, digits: int = 3) -> str:
    """A number as a results table shows it: ``digits`` significant digits; "n/a" for None or NaN, "not reached"
    for infinity; anything else as ``str``.

    >>> fmt(4.50612), fmt(float("inf")), fmt(None), fmt(12)
    ('4.51', 'not reached', 'n/a', '12')
    """
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "not reached"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


class HostReadCounter:
    """Counts host reads while active (``with counter:``): calls of ``Tensor.item``, ``__float__``, ``__int__``,
    ``__bool__`` and ``tolist``, each of which waits for the device on a GPU (nested calls count once).

    >>> import torch
    >>> reads = HostReadCounter()
    >>> with reads:
    ...     _ = float(torch.ones(())) + torch.ones(2).sum().item()
    >>> reads.n
    2
    """

    METHODS = ("item", "__float__", "__int__", "__bool__", "tolist")

    def __init__(self) -> None:
        self.n = 0
        self._depth = 0
        self._originals: dict = {}

    def _wrap(self, fn):
        def counted(tensor, *args, **kwargs):
            if self._depth == 0:
                self.n += 1
            self._depth += 1
            try:
                return fn(tensor, *args, **kwargs)
            finally:
                self._depth -= 1

        return counted

    def __enter__(self) -> "HostReadCounter":
        import torch

        self._originals = {name: getattr(torch.Tensor, name) for name in self.METHODS}
        for name, fn in self._originals.items():
            setattr(torch.Tensor, name, self._wrap(fn))
        return self

    def __exit__(self, *exc) -> None:
        import torch

        for name, fn in self._originals.items():
            setattr(torch.Tensor, name, fn)
        self._originals = {}
