#!/usr/bin/env python
"""Peak-lr sweep of each optimizer on the time-to-loss setup; picks the lr of its ``opt-*`` arm.

    python -m benchmarks.optimizer_lr_sweep                   # writes results/optimizer_lr_sweep.{json,md,png}
    python -m benchmarks.optimizer_lr_sweep --optimizers lion,muon --seeds 2

Three lrs per optimizer; when the best is at an edge of the grid, the grid is extended by a factor
of 2 that way (at most ``--max-extend`` times). Every run is the harness's arm (``benchmarks._harness.lm.optimizer_arm``) ``opt-<name>`` (hf-tuned's settings: 2% warmup,
cosine to 10%, weight decay 0.1 (Lion: scaled to keep lr * decay), clip 1.0) with the peak lr
replaced, on the same tiny GPT-2, data and token budget. Reported: final eval loss per lr (median
over seeds) and the best lr. AdamW's lr is hf-tuned's (swept with `python -m benchmarks.time_to_loss --lr-sweep`: 2e-3 best of 1e-3..1.6e-2).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.optimizer_lr_sweep [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
from pathlib import Path

from benchmarks._harness import RESULTS  # noqa: E402
from benchmarks._harness.lm import QUICK, Setup, optimizer_arm, run_arm  # noqa: E402
from benchmarks._harness.processes import in_order, worker_pool  # noqa: E402

from hf_fasttrain import DataArguments  # noqa: E402
from hf_fasttrain.data.front import prepare_data  # noqa: E402
from benchmarks._harness import machine_info as environment_info  # noqa: E402
from benchmarks._harness import UsageError, run_cli  # noqa: E402

# Three peak lrs a factor 2 apart around each paper's advice relative to AdamW's 2e-3 here
# (Lion 3-10x smaller; AdEMAMix as AdamW; SOAP a little higher; Muon with the AdamW-matched scale).
SWEEP = {
    "lion": [2.5e-4, 5e-4, 1e-3],
    "ademamix": [1e-3, 2e-3, 4e-3],
    "soap": [2e-3, 4e-3, 8e-3],
    "muon": [1e-3, 2e-3, 4e-3],
}


_SHARED: dict = {}  # set before the pool forks: the setup, its data and the work folder


def _run_one(job: tuple[str, float, int]) -> dict:
    name, lr, seed = job
    s = _SHARED
    r = run_arm(optimizer_arm(name, lr), seed, s["setup"], s["tokenizer"], s["lm"], Path(s["work"]))
    r.update(optimizer=name, lr=lr)
    return r


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--optimizers", default=",".join(SWEEP), help=f"comma-separated; known: {', '.join(SWEEP)}")
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--max-extend", type=int, default=2, help="grid extensions (x2 or /2) when the best lr is at an edge")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (1: on a shared 2-core machine two threads fight other tenants)")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (results do not depend on it)")
    p.add_argument("--quick", action="store_true", help="tiny smoke setup")
    p.add_argument("--grid", action="append", default=[], metavar="NAME=LR,LR,...",
                   help="replace an optimizer's starting grid, e.g. --grid muon=8e-3,1.6e-2,3.2e-2 (repeatable)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="optimizer_lr_sweep", help="basename of the output files")
    return p


def main(argv=None) -> dict:
    ns = make_parser().parse_args(argv)
    names = [n.strip() for n in ns.optimizers.split(",") if n.strip()]
    unknown = [n for n in names if n not in SWEEP]
    if unknown:
        raise UsageError(f"--optimizers: unknown {unknown}; known: {list(SWEEP)}")
    grid = dict(SWEEP)
    for item in ns.grid:
        name, _, lrs = item.partition("=")
        try:
            values = sorted(float(x) for x in lrs.split(",") if x.strip())
        except ValueError:
            values = []
        if name not in SWEEP or not values:
            raise UsageError(f"--grid {item!r}: expected NAME=LR,LR,... with NAME one of {list(SWEEP)} and numbers")
        grid[name] = values
    setup = dataclasses.replace(QUICK if ns.quick else Setup())
    data_args = DataArguments(vocab_size=setup.vocab_size, block_size=setup.block_size,
                              max_eval_samples=setup.eval_rows, max_corpus_files=setup.max_corpus_files)
    tokenizer, lm = prepare_data(data_args)
    runs = []
    summary = {}
    with tempfile.TemporaryDirectory(prefix="lr-sweep-") as work:
        _SHARED.update(setup=setup, tokenizer=tokenizer, lm=lm, work=work)  # before the pool forks: workers inherit it
        with worker_pool(ns.jobs, ns.threads) as pool:

            def run_all(points: list[tuple[str, float]]) -> dict[tuple[str, float], float]:
                jobs = [(name, lr, seed) for name, lr in points for seed in range(ns.seeds)]
                results = in_order(pool, _run_one, jobs)
                for r in results:
                    print(f"[lr_sweep] {r['optimizer']:>9s} lr {r['lr']:<8g} seed {r['seed']}: final eval loss "
                          f"{r['final_eval_loss']:.4f}, {r['train_seconds']:.1f} s", flush=True)
                runs.extend(results)
                return {(n, lr): statistics.median(r["final_eval_loss"] for r in results
                                                   if (r["optimizer"], r["lr"]) == (n, lr)) for n, lr in points}

            losses = {name: {} for name in names}
            for (name, lr), loss in run_all([(n, lr) for n in names for lr in grid[n]]).items():
                losses[name][lr] = loss
            # best at an edge of the grid: extend it by a factor of 2 that way, at most --max-extend times
            for _ in range(ns.max_extend):
                points = []
                for name, by_lr in losses.items():
                    best, lrs = min(by_lr, key=by_lr.get), sorted(by_lr)
                    if best == lrs[-1]:
                        points.append((name, best * 2))
                    elif best == lrs[0]:
                        points.append((name, best / 2))
                if not points:
                    break
                for (name, lr), loss in run_all(points).items():
                    losses[name][lr] = loss
    for name, by_lr in losses.items():
        by_lr = dict(sorted(by_lr.items()))
        best = min(by_lr, key=by_lr.get)
        summary[name] = {"final_eval_loss_by_lr": by_lr, "best_lr": best,
                         "best_at_edge": best in (min(by_lr), max(by_lr))}
    lines = ["| optimizer | final eval loss at each peak lr | best lr |", "|---|---|---|"]
    for name, s in summary.items():
        cells = [f"{lr:g}: {loss:.4f}" + (" **" if lr == s["best_lr"] else "") for lr, loss in s["final_eval_loss_by_lr"].items()]
        lines.append(f"| {name} | " + ", ".join(cells) + f" | {s['best_lr']:g}{' (edge of the grid)' if s['best_at_edge'] else ''} |")
    env = environment_info()
    machine = env["cuda_devices"][0] if env["cuda_devices"] else f"{env['cpu_count']}-core CPU ({env['processor']})"
    command = "python -m benchmarks.optimizer_lr_sweep " + " ".join(argv if argv is not None else sys.argv[1:])
    table = (f"Final eval loss after {setup.max_steps} steps x {setup.tokens_per_step} tokens (median of {ns.seeds} "
             f"seed(s)); ** marks the best lr.\n\n" + "\n".join(lines) + "\n")
    print(table)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"summary": summary, "sweep": {n: grid[n] for n in names}, "setup": dataclasses.asdict(setup), "machine": machine,
              "environment": env, "command": command, "runs": runs}
    (out / f"{ns.name}.json").write_text(json.dumps(record, indent=2, default=str))
    (out / f"{ns.name}.md").write_text(f"Machine: {machine}; torch {env['torch']}.\nCommand: `{command}`\n\n" + table)
    plot(summary, out / f"{ns.name}.png")
    return record


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name, s in summary.items():
        lrs = list(s["final_eval_loss_by_lr"])
        ax.plot(lrs, [s["final_eval_loss_by_lr"][lr] for lr in lrs], marker="o", label=name)
    ax.set_xscale("log")
    ax.set_xlabel("peak learning rate")
    ax.set_ylabel("final eval loss")
    ax.set_title("Peak-lr sweep, same token budget")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    run_cli(main)
