"""Per-step cost of the stability callbacks, side by side in one run.

    python -m benchmarks.stability_overhead --steps 60 --repeats 3
    python -m benchmarks.stability_overhead --quick --out /tmp/x   # a smoke run: 12 steps, one repeat (seconds)

Trains the same tiny GPT-2 (2 layers, 128 wide, vocab 1000, seq 128, batch 8) on random tokens with
the plain Trainer and with each callback, arms interleaved within each repeat, and reports the median
CPU milliseconds per optimizer step (process CPU time with one torch thread: on a machine shared with
other jobs, wall time mostly measures the other jobs) over the steps after the first 10 (the snapshot of the guard at step
50 is inside the measured range, so its cost is included amortized over ``snapshot_every=50``).
Writes benchmarks/results/stability_overhead.{json,png} (``--quick``: stability_overhead_quick.* in ``--out``).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.stability_overhead [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from hf_fasttrain.callbacks.stability import DivergenceGuardCallback, GradientClippingCallback, StabilityTrainerMixin

from benchmarks._harness import RESULTS, UsageError, run_cli  # noqa: E402


class GuardedTrainer(StabilityTrainerMixin, Trainer):
    pass


SKIP = 10  # the first steps (warm-up of kernels and allocator) are not measured


class StepTimer(TrainerCallback):
    def __init__(self, skip: int):
        self.skip, self.t0, self.t1, self.n = skip, None, None, 0

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == self.skip:
            self.t0 = time.process_time()

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step > self.skip:
            self.t1, self.n = time.process_time(), self.n + 1


ARMS = {
    "trainer (max_grad_norm=1)": dict(max_grad_norm=1.0, callbacks=lambda: []),
    "+ clip value": dict(max_grad_norm=0.0, callbacks=lambda: [GradientClippingCallback(mode="value", clip_value=1.0)]),
    "+ clip agc": dict(max_grad_norm=0.0, callbacks=lambda: [GradientClippingCallback(mode="agc", agc_lambda=0.01)]),
    "+ guard (mixin)": dict(max_grad_norm=1.0, callbacks=lambda: [DivergenceGuardCallback(snapshot_every=50)], mixin=True),
    "+ guard + clip agc": dict(
        max_grad_norm=0.0,
        callbacks=lambda: [DivergenceGuardCallback(snapshot_every=50), GradientClippingCallback(mode="agc")],
        mixin=True,
    ),
}


def run_arm(arm: dict, steps: int, out: str) -> float:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=1000, n_positions=128, n_embd=128, n_layer=2, n_head=2))
    data = [{"input_ids": r, "labels": r} for r in torch.randint(0, 1000, (steps * 8, 128))]
    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=8, learning_rate=1e-3, logging_steps=10,
        max_grad_norm=arm["max_grad_norm"], save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
    )
    timer = StepTimer(skip=SKIP)
    cls = GuardedTrainer if arm.get("mixin") else Trainer
    trainer = cls(model=model, args=args, train_dataset=data, callbacks=arm["callbacks"]() + [timer])
    trainer.train()
    return 1000.0 * (timer.t1 - timer.t0) / timer.n


def main(argv=None) -> dict:
    args = make_parser().parse_args(argv)
    if args.quick:
        args.steps, args.repeats = 12, 1
    if args.steps <= SKIP:
        raise UsageError(f"--steps: {args.steps} leaves no step to measure; more than {SKIP} "
                         f"(the first {SKIP} are warm-up)")
    stem = Path(args.out) / ("stability_overhead_quick" if args.quick else "stability_overhead")
    hf_logging.set_verbosity_error()
    torch.set_num_threads(args.threads)
    times: dict[str, list[float]] = {name: [] for name in ARMS}
    with tempfile.TemporaryDirectory(prefix="stability_overhead_") as work:
        for _ in range(args.repeats):
            for name, arm in ARMS.items():  # interleaved: drifts in machine load hit every arm alike
                times[name].append(run_arm(arm, args.steps, work))
    base = statistics.median(times[next(iter(ARMS))])
    rows = [
        {"arm": name, "ms_per_step_median": statistics.median(t), "ms_per_step_all": t, "relative": statistics.median(t) / base}
        for name, t in times.items()
    ]
    print(f"{'arm':28s} {'CPU ms/step':>17s} {'vs trainer':>11s}   all repeats")
    for r in rows:
        print(f"{r['arm']:28s} {r['ms_per_step_median']:17.1f} {r['relative']:10.2f}x   {[round(x, 1) for x in r['ms_per_step_all']]}")
    result = {
        "benchmark": "stability_overhead",
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPU cores (shared), torch threads={args.threads}",
        "metric": "process CPU time per optimizer step, ms",
        "torch": torch.__version__,
        "steps": args.steps,
        "repeats": args.repeats,
        "model": "GPT-2 2 layers, n_embd 128, vocab 1000, seq 128, batch 8, random tokens",
        "rows": rows,
    }
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(result, indent=2))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    ax.barh([r["arm"] for r in rows][::-1], [r["ms_per_step_median"] for r in rows][::-1], color="#4c72b0")
    ax.set_xlabel("CPU ms per optimizer step (median)")
    ax.set_title(f"Stability callbacks, tiny GPT-2, CPU ({args.repeats} repeats)")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    plt.close(fig)
    return result


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="a smoke run: 12 steps, one repeat")
    p.add_argument("--out", default=str(RESULTS), help="folder for stability_overhead.{json,png}")
    return p


if __name__ == "__main__":
    run_cli(main)
