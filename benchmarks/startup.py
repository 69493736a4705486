#!/usr/bin/env python
"""Startup time of the command line: ``--help``, ``recipes list`` and refusals, before and after.

    python -m benchmarks.startup                      # this checkout against `main`; writes results/startup.{json,md,png}
    python -m benchmarks.startup --before dea2a7c --repeats 7

Each command runs as a fresh process (``python recipes/gpt2_small.py --help`` and so on) from two trees:
"before" is the git revision ``--before`` exported into a temporary folder (``git archive``), "after" is
this checkout. The two are interleaved (before, after, before, after, ...) so both see the same machine
load, and the figure is the median wall-clock over ``--repeats`` runs, with the ratio before/after. The
load average at the start and end is recorded: a loaded machine makes both arms slower, the ratio less so.
Nothing here needs a GPU or the network.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.startup [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"

COMMANDS = {  # name -> argv after the python executable, relative to the tree's root
    "recipe --help": ["recipes/gpt2_small.py", "--help"],
    "hf-fasttrain recipes list": ["-m", "hf_fasttrain.cli", "recipes", "list"],
    "refusal: --max_steps 0": ["recipes/gpt2_small.py", "--config", "gpt2_tiny", "--max_steps", "0"],
    "refusal: unknown flag": ["recipes/gpt2_small.py", "--config", "gpt2_tiny", "--learnig_rate", "1e-3"],
}


def _export(rev: str, into: Path) -> Path:
    """The tree of ``rev`` as files in ``into`` (``git archive``: nothing in this checkout changes)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def _cpu_children() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _time(tree: Path, argv: list[str]) -> tuple[float, float, int, str]:
    """(wall seconds, CPU seconds of the process, exit code, last stderr line)."""
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    c0, t0 = _cpu_children(), time.perf_counter()
    p = subprocess.run([sys.executable, *argv], cwd=tree, env=env, capture_output=True, text=True, timeout=600)
    wall, cpu = time.perf_counter() - t0, _cpu_children() - c0
    return wall, cpu, p.returncode, (p.stderr.strip().splitlines() or [""])[-1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    ap.add_argument("--before", default="main", help="git revision to compare against (default: main)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=str(RESULTS / "startup"), help="results path without suffix")
    ns = ap.parse_args(argv)

    rev = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ns.before], check=True,
                         capture_output=True, text=True).stdout.strip()
    load_start = os.getloadavg()
    rows = []
    with tempfile.TemporaryDirectory(prefix="startup_") as tmp:
        before = _export(ns.before, Path(tmp) / "before")
        trees = {"before": before, "after": ROOT}
        for name, cmd in COMMANDS.items():
            times: dict[str, list[float]] = {"before": [], "after": []}
            cpus: dict[str, list[float]] = {"before": [], "after": []}
            last: dict[str, tuple[int, str]] = {}
            _time(ROOT, cmd)  # warm the file cache once
            for _ in range(ns.repeats):
                for arm, tree in trees.items():
                    seconds, cpu, rc, tail = _time(tree, cmd)
                    times[arm].append(seconds)
                    cpus[arm].append(cpu)
                    last[arm] = (rc, tail)
            row = {
                "command": name,
                "before_s": statistics.median(times["before"]),
                "after_s": statistics.median(times["after"]),
                "before_cpu_s": statistics.median(cpus["before"]),
                "after_cpu_s": statistics.median(cpus["after"]),
                "before_all": times["before"],
                "after_all": times["after"],
                "before_exit": last["before"][0],
                "after_exit": last["after"][0],
                "after_last_stderr_line": last["after"][1],
            }
            row["speedup"] = row["before_s"] / row["after_s"]
            rows.append(row)
            print(f"{name:<30} before {row['before_s']:6.2f} s  after {row['after_s']:6.2f} s  "
                  f"x{row['speedup']:.1f}  CPU {row['before_cpu_s']:.2f} -> {row['after_cpu_s']:.2f} s  "
                  f"(exit {row['before_exit']} -> {row['after_exit']})", flush=True)
    load_end = os.getloadavg()

    out = Path(ns.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"before": f"{ns.before} ({rev})", "repeats": ns.repeats, "cpu_count": os.cpu_count(),
            "load_average_start": load_start, "load_average_end": load_end, "python": sys.version.split()[0]}
    out.with_suffix(".json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    lines = [
        f"Startup of the command line, median of {ns.repeats} fresh processes per command, interleaved "
        f"before/after. Before: `{ns.before}` ({rev}); after: this checkout. {os.cpu_count()} CPU cores; "
        f"load average {load_start[0]:.1f} at the start, {load_end[0]:.1f} at the end.",
        "",
        "Wall-clock depends on the load; CPU seconds (user + system of the process) much less.",
        "",
        "| command | before: wall (s) | after: wall (s) | speed-up | before: CPU (s) | after: CPU (s) | exit code |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    lines += [f"| {r['command']} | {r['before_s']:.2f} | {r['after_s']:.2f} | {r['speedup']:.1f}x | "
              f"{r['before_cpu_s']:.2f} | {r['after_cpu_s']:.2f} | {r['before_exit']} -> {r['after_exit']} |"
              for r in rows]
    lines += ["", "Command: `python -m benchmarks.startup --before " + ns.before + f" --repeats {ns.repeats}`"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["before_s"] for r in rows], height=0.4, label=f"before ({rev})")
    ax.barh([i - 0.2 for i in y], [r["after_s"] for r in rows], height=0.4, label="after")
    ax.set_yticks(list(y), [r["command"] for r in rows])
    ax.axvline(1.5, color="k", lw=0.8, ls="--", label="1.5 s target")
    ax.set_xlabel(f"seconds (median of {ns.repeats}; load {load_start[0]:.1f})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=110)
    return 0


if __name__ == "__main__":
    sys.exit(main())
