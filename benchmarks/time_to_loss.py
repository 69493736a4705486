#!/usr/bin/env python
"""Time-to-loss: wall-clock and tokens each arm needs to reach the strongest Trainer baseline's final eval loss.

    python -m benchmarks.time_to_loss                      # hf-default, hf-tuned, hf-best(+), fasttrain(-budget); 3 seeds
    python -m benchmarks.time_to_loss --arms hf-tuned,fasttrain --seeds 5
    python -m benchmarks.time_to_loss --quick               # a smoke run (the test suite uses it)
    python -m benchmarks.time_to_loss --report              # rebuild time_to_loss.md and .png from the JSON
    python -m benchmarks.time_to_loss --corpus prose --arms hf-tuned,fasttrain   # the English-prose corpus

Every arm trains the same model (GPT-2 from scratch), on the same data, for the same token budget,
on this machine, evaluating on the same held-out rows every ``--eval-steps``. Seeds run interleaved
(seed 0 of every arm, then seed 1 ...), so slow drifts of the machine hit all arms alike. Wall-clock
is training time only: evaluation and checkpointing are excluded (RunRecorderCallback).

The target is the median over seeds of the reference arm's final eval loss: hf-best when it runs, else hf-tuned. For each run, the time and tokens
to reach it are read off the eval curve by linear interpolation between the two evaluations that
bracket it; a run that never reaches it counts as infinitely slow. Reported per arm: medians over
all seeds of final eval loss, time and tokens to target (a seed that never got there counts in the median as
never), and time-to-target relative to the reference.
A second table does the same against a second arm's median final loss (``--also-against``; by default
hf-best+ when it runs).

Arms (DESIGN.md): ``hf-default`` (transformers.Trainer with its defaults), ``hf-tuned`` (the Trainer's
built-in options as most people tune them: the peak lr swept, cosine to 10%), ``hf-best`` (every built-in
option that matters searched at this budget: benchmarks/hf_best.py), ``hf-best+`` (hf-best with a learning rate per
parameter group: the user's few lines with the package's AdamW), ``fasttrain`` (FastTrainer with this package's techniques). Other
techniques register more arms or ablations in ``ARMS``.

Each run's result is saved as it ends (``--out/<name>_runs/<arm>-seed<k>.json``, keyed by a hash of the
arm's settings, the setup and the corpus) and a rerun of the same command skips the runs already there,
so a long run that was stopped continues where it was; ``--fresh`` runs everything again.

Writes time_to_loss.json, time_to_loss.md and time_to_loss.png into --out (benchmarks/results).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.time_to_loss [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import dataclasses
import json
import math
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from hf_fasttrain import FastTrainingArguments
from hf_fasttrain.data.front import prepare_data

from benchmarks._harness import RESULTS, UsageError, display_command, fmt as _fmt, run_cli
from benchmarks._harness import machine_info as environment_info
from benchmarks._harness.lm import (ARMS as SHARED_ARMS, FASTTRAIN_EXTRA, HF_TUNED, MUON_RECIPE, QUICK, CORPORA, Arm,
                                    Setup, common_args, data_arguments, load_saved_run, measured_length, run_arm, run_key,
                                    summarise)

# The shared arms (the baselines and the recipe) and this study's own: ablations of the recipe's techniques,
# every decay shape, another optimizer, random restart.
ARMS: dict[str, Arm] = dict(SHARED_ARMS)
ARMS.update({
    # The same recipe with the Trainer's AdamW (the tiny recipe before it switched to Muon): isolates the optimizer.
    "fasttrain-adamw": Arm("fasttrain-adamw", "FastTrainer as the tiny recipe but with AdamW at hf-tuned's lr 2e-3",
                           fast=True, args={**{k: v for k, v in HF_TUNED.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")},
                                            "lr_decay": "cosine", "min_lr_ratio": 0.1, "divergence_guard": True}),
    # The recipe with its embeddings (and tied head) trained at hf-best's lr: what the recipe gains without the
    # embeddings' high lr (Muon's AdamW part runs them at Muon's 1.6e-2, 8x hf-best's 2e-3), beside hf-best+.
    "fasttrain-emb-2e-3": Arm("fasttrain-emb-2e-3", "the fasttrain arm with the embeddings at hf-best's lr 2e-3 "
                              "(lr_multipliers {embedding: 0.125} in Muon's AdamW part)", fast=True,
                              args={**MUON_RECIPE, **FASTTRAIN_EXTRA,
                                    "optimizer_kwargs": {"lr_multipliers": {"embedding": 0.125}}}),
    # Sequence-length warmup (Li et al. 2022): rows cut to 16 tokens at first, growing by 8 to the full
    # block over the first 30% of the token budget; the run stops at the same token budget (more,
    # shorter steps at first) and the LR schedule advances with tokens.
    "seq-len-warmup": Arm("seq-len-warmup", "hf-tuned + sequence-length warmup 16 -> block over 30%, token-counted",
                          fast=True, args=dict(HF_TUNED, seq_len_warmup_min=16, seq_len_warmup_fraction=0.3,
                                               include_num_input_tokens_seen="all")),
})


# --- Ablation of the recipe's techniques: each alone on top of the Muon recipe as it stood before them
# (``base``: Muon+AdamW at 1.6e-2, 2% warmup, cosine to 10%, wd 0.1, clip 1, guard), then combined.
# The base is frozen here so that saved runs stay comparable when the headline ``fasttrain`` arm changes.
#   python -m benchmarks.time_to_loss --arms hf-tuned,base,base+ema,... --seeds 3 --name ablation
BASE = dict(MUON_RECIPE)


def token_budget(setup: "Setup") -> int:
    """An arm setting computed from the setup: the run's token budget (max_steps full steps)."""
    return setup.max_steps * setup.tokens_per_step


def quarter_batch(setup: "Setup") -> int:
    """A quarter of the full micro-batch's tokens (4 of 16 rows in the default setup)."""
    return setup.tokens_per_step // 4


def ablation_arm(name: str, description: str, **extra) -> Arm:
    """Arm ``name``: the frozen Muon recipe (BASE) with ``extra`` settings on top."""
    args = {**BASE, **extra}
    if "optimizer_kwargs" in extra and BASE.get("optimizer_kwargs"):
        args["optimizer_kwargs"] = {**BASE["optimizer_kwargs"], **extra["optimizer_kwargs"]}
    ARMS[name] = Arm(name, description, fast=True, args=args)
    return ARMS[name]


ablation_arm("base", "the Muon recipe before issue 18 (= fasttrain until then)")
ablation_arm("base+ema", "base + an EMA of the weights (decay 0.98, half-life 34 steps, with the (1+t)/(10+t) "
             "warmup) evaluated and kept as the model", weight_averaging="ema", ema_decay=0.98)
ablation_arm("base+lawa", "base + LAWA: the mean of the last 5 copies taken every 10 steps, evaluated and kept",
             weight_averaging="lawa", lawa_checkpoints=5, lawa_interval=10)
ablation_arm("base+bsw", "base + batch-size warmup: 4 -> 16 rows (512 -> 2048 tokens) per step over the first 60 "
             "steps' worth, the lr schedule and the stop counted in tokens (same token budget)",
             batch_warmup_min_tokens=quarter_batch, batch_warmup_fraction=0.2, schedule_unit="tokens",
             schedule_total_tokens=token_budget, include_num_input_tokens_seen="all")
ablation_arm("base+cautious", "base + cautious updates (Liang et al. 2024) in Muon's AdamW part",
             optimizer_kwargs={"cautious": True})
ablation_arm("base+polar", "base + Polar Express Newton-Schulz coefficients (Amsel et al. 2025) in Muon, 5 steps",
             optimizer_kwargs={"ns_coefficients": "polar_express"})
ablation_arm("base+ema+bsw", "the combination: base + EMA (as base+ema) + batch-size warmup (as base+bsw)",
             weight_averaging="ema", ema_decay=0.98, batch_warmup_min_tokens=quarter_batch, batch_warmup_fraction=0.2,
             schedule_unit="tokens", schedule_total_tokens=token_budget, include_num_input_tokens_seen="all")
ablation_arm("base+ema+slw", "the combination: base + EMA (as base+ema) + sequence-length warmup (as base+slw)",
             weight_averaging="ema", ema_decay=0.98, seq_len_warmup_min=16, seq_len_warmup_fraction=0.3,
             include_num_input_tokens_seen="all")
ablation_arm("base+slw", "base + sequence-length warmup 16 -> block over 30% of the tokens, token-counted",
             seq_len_warmup_min=16, seq_len_warmup_fraction=0.3, include_num_input_tokens_seen="all")


# --- LR schedule ablation (hf_fasttrain.schedules): every decay shape at hf-tuned's peak lr, 2% warmup
# from 0 and floor at 10% of the peak, only the shape differs (lr-cosine runs exactly hf-tuned's lrs):
#   python -m benchmarks.time_to_loss --quick --max-steps 300 --seeds 3 --arms lr-cosine,lr-sqrt,lr-linear,lr-1-sqrt,lr-constant --name lr_schedules
_SCHEDULE_BASE = {k: v for k, v in HF_TUNED.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")}
for _decay in ("cosine", "sqrt", "linear", "1-sqrt", "constant"):
    ARMS[f"lr-{_decay}"] = Arm(f"lr-{_decay}", f"FastTrainer, hf-tuned settings, lr_decay={_decay!r}, floor 10% of peak",
                               fast=True, args={**_SCHEDULE_BASE, "lr_decay": _decay, "min_lr_ratio": 0.1})
# --- The recipe with another decay shape (Muon at 1.6e-2, guard on; only lr_decay differs):
#   python -m benchmarks.time_to_loss --arms fasttrain,fasttrain-1-sqrt,fasttrain-sqrt --seeds 3 --name time_to_loss_recipe_decay
for _decay in ("1-sqrt", "sqrt"):
    ARMS[f"fasttrain-{_decay}"] = dataclasses.replace(
        ARMS["fasttrain"], name=f"fasttrain-{_decay}", description=f"the fasttrain arm with lr_decay={_decay!r}",
        args={**MUON_RECIPE, "lr_decay": _decay})


# --- Random restart (hf_fasttrain/restarts.py) ------------------------------------------------------------
def run_best_of_n(arm: Arm, seed: int, setup: Setup, workdir: Path, num_seeds: int = 4,
                  explore_fraction: float = 0.1) -> dict[str, Any]:
    """Best-of-N at equal total compute: N seeds train ``explore_fraction`` of a run of T steps (with that
    run's schedule), the best continues to T; T is chosen so the search trains as many optimizer steps
    as one single-seed run: N*f*T + (1-f)*T = max_steps (N=4, f=0.1, 300 steps: T=231, 4*23 + 208 = 300).
    Its clock counts every trial's training, losers included (``search_time_curve``)."""
    from hf_fasttrain.restarts import search_time_curve
    from hf_fasttrain.run.recipe_restarts import train_with_restarts

    total = round(setup.max_steps / (1 + (num_seeds - 1) * explore_fraction))
    out = workdir / f"{arm.name}-seed{seed}"
    args = FastTrainingArguments(**measured_length({**common_args(setup, seed * num_seeds, out), "auto_resume": False,
                                                    **arm.args, "max_steps": total, "_block_size": setup.block_size}))
    model_args = setup.model_args()
    data_args = data_arguments(setup)
    wall0 = time.perf_counter()
    summary = train_with_restarts(model_args, data_args, args, num_seeds=num_seeds, explore_fraction=explore_fraction)
    wall = time.perf_counter() - wall0
    from hf_fasttrain.callbacks.run_record import checkpoint_log_history

    # the winner's logs with their train_seconds (kept in the checkpoint's run record, not in trainer_state.json)
    curve = search_time_curve(summary, checkpoint_log_history(summary["winner_checkpoint"]), setup.tokens_per_step)
    shutil.rmtree(out, ignore_errors=True)
    rows = [{k: r[k] for k in ("trial_id", "model_seed", "data_seed", "rung_metrics", "final_metric", "status")}
            for r in summary["trials"]]
    return {"arm": arm.name, "seed": seed, "curve": curve, "final_eval_loss": curve[-1]["eval_loss"],
            "train_seconds": curve[-1]["seconds"], "process_seconds": wall,
            "restarts": {"max_steps": total, "rung_steps": summary["rung_steps"], "total_steps": summary["total_steps"],
                         "winner": summary["winner"], "trials": rows}}


ARMS["fasttrain-best-of-4"] = Arm(
    "fasttrain-best-of-4", "FastTrainer, random restart: 4 seeds explore 10% of a shorter run, the best continues; "
    "as many optimizer steps in all as one single-seed run", fast=True, args=dict(HF_TUNED), run=run_best_of_n,
)
# Random restart's control: the same FastTrainer settings (hf-tuned's, AdamW at 2e-3), one seed, no search.
ARMS["adamw-single-seed"] = Arm(
    "adamw-single-seed", "FastTrainer with hf-tuned's settings (AdamW at 2e-3), one seed: the control of "
    "fasttrain-best-of-4 at equal compute", fast=True, args=dict(HF_TUNED),
)


def markdown_table(summary: dict[str, Any]) -> str:
    lines = [
        f"Target: eval loss {summary['target_eval_loss']:.4f} "
        + ("(given with --target)." if summary.get("target_given") else
           f"(median final eval loss of {summary['reference']})."),
        "",
        "Seconds and tokens to target: medians over all seeds, a seed that never reaches the target counting as "
        "never (infinitely slow); ratios are those medians over the reference's.",
        "",
        f"| arm | final eval loss | train seconds to target | tokens to target | time vs {summary['reference']} "
        f"| tokens vs {summary['reference']} | seeds reaching target | ms per step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, r in summary["arms"].items():
        lines.append(
            f"| {a} | {r['final_eval_loss']:.4f} | {_fmt(r['seconds_to_target'])} | {_fmt(r['tokens_to_target'])} "
            f"| {_fmt(r['time_ratio_vs_reference'])} | {_fmt(r.get('tokens_ratio_vs_reference', math.nan))} "
            f"| {r['reached']}/{r['seeds']} | {_fmt(1000 * r.get('seconds_per_step', math.nan))} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path, also: Optional[dict[str, Any]] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(summary["arms"]):
        for j, r in enumerate(x for x in runs if x["arm"] == arm):
            pts = r["curve"][1:]  # skip the step-0 evaluation (loss ~ ln(vocab)) to keep the scale useful
            ax.plot([p["seconds"] for p in pts], [p["eval_loss"] for p in pts], color=colours[i % len(colours)],
                    alpha=0.8, lw=1.2, label=arm if j == 0 else None)
    ax.axhline(summary["target_eval_loss"], color="k", ls="--", lw=0.8, label=f"target ({summary['reference']} median final)")
    if also is not None:
        ax.axhline(also["target_eval_loss"], color="k", ls=":", lw=0.8, label=f"second target ({also['reference']} median final)")
    ax.set_xlabel("training wall-clock, seconds (evaluation excluded)")
    ax.set_ylabel("eval loss")
    ax.set_title("Time to loss, one line per seed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default="hf-default,hf-tuned,hf-best,hf-best+,fasttrain,fasttrain-budget",
                   help=f"comma-separated arms (default: the headline's six); known: {', '.join(ARMS)}")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (run interleaved)")
    p.add_argument("--seed-list", default=None,
                   help="comma-separated seeds to run instead of 0..seeds-1 (e.g. one seed per process)")
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps per run (default 300)")
    p.add_argument("--lr-sweep", default=None,
                   help="comma-separated peak lrs: run each chosen arm at each lr (arms named ARM@LR)")
    p.add_argument("--quick", action="store_true", help="tiny smoke setup (the test suite runs it)")
    p.add_argument("--corpus", default="python", choices=sorted(CORPORA),
                   help="python: the embedded stdlib sources (default); prose: English prose from the stdlib's docs")
    p.add_argument("--reference", default=None,
                   help="arm whose median final eval loss is the target (default: hf-best if run, else hf-tuned if run, else the first)")
    p.add_argument("--also-against", default=None,
                   help="a second arm whose median final eval loss is a second target, with its own table "
                        "(default: hf-best+ when it runs and is not the reference)")
    p.add_argument("--target", type=float, default=None,
                   help="eval loss to reach (default: the reference's median final eval loss), e.g. a committed "
                        "hf-tuned figure when hf-tuned is not rerun")
    p.add_argument("--fresh", action="store_true", help="run every (arm, seed) again, ignoring saved runs")
    p.add_argument("--runs-dir", default=None,
                   help="where each run's result is saved and looked up (default: --out/<name>_runs)")
    p.add_argument("--saved-only", action="store_true",
                   help="train nothing: summarise the saved runs (arms or seeds without one are left out)")
    p.add_argument("--report", action="store_true",
                   help="train nothing: rebuild the table and plot of --out/<name>.json from that file")
    p.add_argument("--out", default=str(RESULTS), help="directory for time_to_loss.{json,md,png}")
    p.add_argument("--name", default="time_to_loss", help="basename of the output files")
    return p


def write_report(record: dict[str, Any], out: Path, name: str) -> str:
    """The table (.md) and the plot (.png) of a results record; returns the tables."""
    table = markdown_table(record["summary"])
    if record.get("also") is not None:
        table += "\n" + markdown_table(record["also"])
    env = record["environment"]
    (out / f"{name}.md").write_text(f"Machine: {record['machine']}; torch {env['torch']}, transformers {env['transformers']}.\n"
                                    f"Command: `{record['command']}`\n\n" + table)
    plot(record["runs"], record["summary"], out / f"{name}.png", record.get("also"))
    return table


def main(argv=None) -> dict[str, Any]:
    ns = make_parser().parse_args(argv)
    if ns.report:  # from the saved record alone: no data, no model, no training
        out = Path(ns.out)
        path = out / f"{ns.name}.json"
        if not path.exists():
            raise UsageError(f"--report: {path} does not exist; run the benchmark first")
        record = json.loads(path.read_text())
        print(write_report(record, out, ns.name))
        return record
    arms = [a.strip() for a in ns.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise UsageError(f"--arms: unknown {unknown}; known: {list(ARMS)}")
    if ns.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {ns.seeds}")
    if ns.lr_sweep:
        lrs = [float(x) for x in ns.lr_sweep.split(",") if x.strip()]
        swept = []
        for a in arms:
            for lr in lrs:
                name = f"{a}@{lr:g}"
                ARMS[name] = dataclasses.replace(ARMS[a], name=name, args={**ARMS[a].args, "learning_rate": lr})
                swept.append(name)
        arms = swept
    setup = dataclasses.replace(QUICK if ns.quick else Setup(), corpus=ns.corpus)
    if ns.max_steps:
        setup.max_steps = ns.max_steps
    if ns.reference is not None and ns.reference not in arms:
        raise UsageError(f"--reference {ns.reference!r} is not one of the chosen arms {arms}")
    if ns.also_against is not None and ns.also_against not in arms:
        raise UsageError(f"--also-against {ns.also_against!r} is not one of the chosen arms {arms}")
    tokenizer, lm = prepare_data(data_arguments(setup))
    out = Path(ns.out)
    saved_dir = Path(ns.runs_dir) if ns.runs_dir else out / f"{ns.name}_runs"
    saved_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ttl-") as work:
        seeds = [int(x) for x in ns.seed_list.split(",")] if ns.seed_list else list(range(ns.seeds))
        for seed in seeds:
            for arm in arms:
                key = run_key(ARMS[arm], seed, setup)
                path = saved_dir / f"{arm.replace('/', '_')}-seed{seed}.json"
                r = None if ns.fresh else load_saved_run(path, key)
                if r is not None:
                    print(f"[time_to_loss] {arm:>12s} seed {seed}: saved run, skipped", flush=True)
                elif ns.saved_only:
                    print(f"[time_to_loss] {arm:>12s} seed {seed}: no saved run, left out", flush=True)
                    continue
                else:
                    r = run_arm(ARMS[arm], seed, setup, tokenizer, lm, Path(work))
                    r["key"] = key
                    path.write_text(json.dumps(r, indent=1, default=str))  # kept as it ends: reruns skip it
                    print(f"[time_to_loss] {arm:>12s} seed {seed}: final eval loss {r['final_eval_loss']:.4f}, "
                          f"{r['train_seconds']:.1f} s training", flush=True)
                runs.append(r)
    if ns.saved_only:
        arms = [a for a in arms if any(r["arm"] == a for r in runs)]
        if not arms:
            raise UsageError("--saved-only: no saved run for any chosen (arm, seed)")
    reference = ns.reference or next((a for a in ("hf-best", "hf-tuned") if a in arms), arms[0])
    summary = summarise(runs, arms, reference, target=ns.target)
    second = ns.also_against or ("hf-best+" if "hf-best+" in arms and reference != "hf-best+" else None)
    also = summarise(runs, arms, second) if second and second != reference else None
    env = environment_info()
    machine = env["cuda_devices"][0] if env["cuda_devices"] else f"{env['cpu_count']}-core CPU ({env['processor']})"
    record = {"summary": summary, "also": also, "setup": dataclasses.asdict(setup), "arms": {a: dataclasses.asdict(ARMS[a]) | {"callbacks": None} for a in arms},
              "machine": machine, "environment": env, "runs": runs,
              "command": display_command("python -m benchmarks.time_to_loss", argv if argv is not None else sys.argv[1:])}
    (out / f"{ns.name}.json").write_text(json.dumps(record, indent=2, default=str))
    print(write_report(record, out, ns.name))
    return record


if __name__ == "__main__":
    run_cli(main)
