"""Random restart on one machine: the local backend against the Ray backend, for the same search.

    python -m benchmarks.restarts_backends               # 1 run of each: ~5 minutes on 2 quiet cores
    python -m benchmarks.restarts_backends --repeats 3   # 3 of each, interleaved
    python -m benchmarks.restarts_backends --quick --out /tmp/x   # a smoke run: 2 seeds, 1 rung, a tiny model

The search is the tiny recipe's (``--config gpt2_tiny``) shortened to 60 steps: 4 seeds, 2 successive-halving
rungs, the winner continued to the end (``--max_steps 60 --restart_explore_fraction 0.5 --restart_rungs 2``;
the recipe's token-counted sequence-length warmup turns that into rungs at 17 and 35 of 69 optimizer steps),
evaluating on 64 held-out rows at the rungs and at the end only.
Each run is one ``hf-fasttrain restarts`` process in a fresh output directory, ``--backend local`` (trials
one after another in that process) or ``--backend ray`` (a local Ray cluster started by the driver; each
stage one task asking for one CPU, so two run at once on two cores). Runs alternate local, ray, local, ...

Measured per run, from outside, by sampling the driver's whole process tree (its children and theirs, so
Ray's services and workers too) every 0.2 s: wall-clock seconds, CPU seconds (user + system, summed over
every process seen; a process that lives less than one sampling period is missed), peak resident memory
(the largest sum of RSS over the tree at one sample), and from the summary: the winner, its final eval
loss and every seed's rung metrics. Ray keeps its files in a temporary folder of the run, removed after it; a
process of the tree still running a while after the driver exits is stopped (by pid) and fails the run.
Writes benchmarks/results/restarts_backends.{json,md,png} (``--quick``: restarts_backends_quick.* in ``--out``).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.restarts_backends [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ._harness import RESULTS, UsageError, machine_info, markdown_table, run_cli, subprocess_env, write_json

SEARCH = ["--config", "gpt2_tiny", "--max_steps", "60", "--num-seeds", "4", "--explore-fraction", "0.5",
          "--rungs", "2", "--disable_tqdm", "true", "--save_strategy", "no", "--eval_on_start", "false",
          "--eval_steps", "1000", "--max_eval_samples", "64"]
# the smoke run: the same search on a tiny model and corpus, 2 seeds, 1 rung, 4 steps
QUICK = {"--max_steps": "4", "--num-seeds": "2", "--rungs": "1", "--max_eval_samples": "16",
         "--max_corpus_files": "40", "--vocab_size": "300", "--block_size": "32", "--n_embd": "32", "--n_head": "2",
         "--per_device_train_batch_size": "8"}


def with_options(args: list[str], options: dict[str, str]) -> list[str]:
    """``args`` (flag, value pairs) with each of ``options``' flags set to its value: replaced where present,
    appended otherwise.

    >>> with_options(["--a", "1", "--b", "2"], {"--b": "3", "--c": "4"})
    ['--a', '1', '--b', '3', '--c', '4']
    """
    pairs = dict(zip(args[::2], args[1::2]))
    pairs.update(options)
    return [x for pair in pairs.items() for x in pair]


def measure(cmd: list[str], env: dict, period: float = 0.2) -> dict:
    """Runs ``cmd``; wall seconds, CPU seconds and peak RSS (bytes) of its process tree, sampled."""
    import psutil

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    root = psutil.Process(proc.pid)
    cpu: dict[int, float] = {}
    seen: dict[int, psutil.Process] = {}
    peak = 0
    output = []

    def sample():
        nonlocal peak
        try:
            procs = [root] + root.children(recursive=True)
        except psutil.NoSuchProcess:
            return
        rss = 0
        for p in procs:
            seen.setdefault(p.pid, p)
            try:
                with p.oneshot():
                    t = p.cpu_times()
                    cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system + t.children_user + t.children_system)
                    rss += p.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
        peak = max(peak, rss)

    import threading

    reader = threading.Thread(target=lambda: output.append(proc.stdout.read().decode(errors="replace")))
    reader.start()
    while proc.poll() is None:
        sample()
        time.sleep(period)
    wall = time.perf_counter() - t0
    reader.join()
    _, alive = psutil.wait_procs([p for pid, p in seen.items() if pid != proc.pid], timeout=30)
    for p in alive:  # only processes of this run's tree, by pid (is_running checks it is the same process)
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    if alive:
        raise RuntimeError(f"{' '.join(cmd)} left {len(alive)} processes running 30 s after it exited "
                           f"(stopped): {[p.pid for p in alive]}")
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{output[0][-3000:]}")
    return {"wall_s": wall, "cpu_s": sum(cpu.values()), "peak_rss_mb": peak / 2**20, "processes_seen": len(cpu)}


def run_one(backend: str, work: Path, i: int, search: list[str] = SEARCH) -> dict:
    out = work / f"{backend}-{i}"
    shutil.rmtree(out, ignore_errors=True)
    cmd = [sys.executable, "-m", "hf_fasttrain.cli", "restarts", *search, "--output_dir", str(out),
           "--backend", backend]
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    try:
        result = measure(cmd, subprocess_env({"HF_HUB_OFFLINE": "1", "RAY_TMPDIR": ray_tmp}))
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    summary = json.loads((out / "restarts_summary.json").read_text())
    result.update(
        backend=backend,
        repeat=i,
        winner=summary["winner"],
        winner_final_metric=summary["winner_final_metric"],
        rung_metrics={r["trial_id"]: r["rung_metrics"] for r in summary["trials"]},
        total_steps=summary["total_steps"],
    )
    print(f"{backend:5s} #{i}: {result['wall_s']:.1f} s wall, {result['cpu_s']:.1f} CPU-s, "
          f"{result['peak_rss_mb']:.0f} MB peak, winner {result['winner']} "
          f"({result['winner_final_metric']:.4f})", flush=True)
    return result


def report(runs: list[dict], stem: Path, quick: bool = False) -> str:
    by = {b: [r for r in runs if r["backend"] == b] for b in ("local", "ray")}
    rows = []
    for b, rs in by.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("wall_s", "cpu_s", "peak_rss_mb")}
        winners = sorted({r["winner"] for r in rs})
        finals = sorted({round(r["winner_final_metric"], 5) for r in rs})
        rows.append([b, len(rs), med["wall_s"], med["cpu_s"], med["peak_rss_mb"], ", ".join(winners),
                     ", ".join(f"{f:.5f}" for f in finals)])
    same = len({r["winner"] for r in runs}) == 1
    table = markdown_table(["backend", "runs", "wall s (median)", "CPU s (median)", "peak RSS MB (median)",
                            "winner", "winner's final eval_loss"], rows)
    dl = rows[1][2] - rows[0][2]
    dm = rows[1][4] - rows[0][4]
    text = (f"{table}\n\nSame winner in every run: {'yes' if same else 'NO'}. Ray backend minus local backend "
            f"(medians): {dl:+.1f} s of wall-clock, {dm:+.0f} MB of peak memory. The Ray backend runs two stages at "
            "once here (one CPU and one torch thread each), the local one a stage at a time (two threads).\n")
    setup = ("`python -m benchmarks.restarts_backends --quick` - a smoke run: the tiny recipe on a tiny model, "
             "4 steps, 2 seeds, 1 rung" if quick else
             "`python -m benchmarks.restarts_backends` - the tiny recipe shortened to 60 steps, 4 seeds, 2 rungs")
    stem.with_suffix(".md").write_text(
        "# Random restart: local backend vs Ray backend, one machine\n\n" + setup + ", the winner to the end; "
        "each run a `hf-fasttrain restarts` process measured with its whole process tree.\n\n" + text
        + f"\nMachine: {machine_note()}\n", encoding="utf-8")
    plot(by, stem.with_suffix(".png"), "quick setup" if quick else "tiny recipe (60 steps), 4 seeds")
    return text


def machine_note() -> str:
    import os

    return (f"a {os.cpu_count()}-core x86_64 CPU, shared with other jobs while this ran (loaded); figures are "
            "side by side in one run, interleaved, not absolute speeds.")


def plot(by: dict, path: Path, setup: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(10, 3.5))
    for ax, (key, label) in zip(axes, [("wall_s", "wall-clock s"), ("cpu_s", "CPU s"),
                                       ("peak_rss_mb", "peak RSS MB")]):
        for x, (b, rs) in enumerate(by.items()):
            vals = [r[key] for r in rs]
            ax.bar(x, statistics.median(vals), color=["tab:blue", "tab:orange"][x], alpha=0.7)
            ax.scatter([x] * len(vals), vals, color="k", s=12, zorder=3)
        ax.set_xticks(range(len(by)))
        ax.set_xticklabels(list(by))
        ax.set_title(label)
    fig.suptitle(f"random restart, {setup}: local vs Ray, one loaded 2-core CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=1, help="runs of each backend, interleaved")
    p.add_argument("--work", default=None, help="folder for the runs (default: a temporary one, removed)")
    p.add_argument("--stem", default=None, help="results file name, without extension "
                   "(default restarts_backends; with --quick restarts_backends_quick)")
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: " + " ".join(f"{k} {v}" for k, v in QUICK.items()))
    p.add_argument("--out", default=str(RESULTS), help="folder for <stem>.{json,md,png}")
    a = p.parse_args(argv)
    if a.repeats < 1:
        raise UsageError(f"--repeats: {a.repeats}; at least 1")
    search = with_options(SEARCH, QUICK) if a.quick else SEARCH
    stem = Path(a.out) / (a.stem or ("restarts_backends_quick" if a.quick else "restarts_backends"))
    work = Path(a.work) if a.work else Path(tempfile.mkdtemp(prefix="restarts_backends_"))
    runs = []
    try:
        for i in range(a.repeats):
            for backend in ("local", "ray"):
                runs.append(run_one(backend, work, i, search))
    finally:
        if not a.work:
            shutil.rmtree(work, ignore_errors=True)
    record = {
        "command": f"python -m benchmarks.restarts_backends --repeats {a.repeats}" + (" --quick" if a.quick else ""),
        "search": search,
        "machine": machine_info(),
        "machine_note": machine_note(),
        "runs": runs,
    }
    stem.parent.mkdir(parents=True, exist_ok=True)
    write_json(stem.with_suffix(".json"), record)
    print(report(runs, stem, a.quick))
    return record


if __name__ == "__main__":
    run_cli(main)
