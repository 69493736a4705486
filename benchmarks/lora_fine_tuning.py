"""LoRA fine-tuning: which optimizer and which of the recipe's parts win when only adapters train.

    python -m benchmarks.lora_fine_tuning               # sweeps, every arm, 3 seeds (about 15 CPU-minutes)
    python -m benchmarks.lora_fine_tuning --seeds 1     # fewer seeds (the table is rewritten after each seed)
    python -m benchmarks.lora_fine_tuning --quick       # a smoke run (tiny everything)

Base, task and budget are the fine-tuning benchmark's (benchmarks._harness.finetune): the AdamW-pretrained tiny
GPT-2 (2 layers, 64 wide, vocabulary 4096), stdlib signature + docstring -> body with completion-only loss,
30,000 real input tokens per run, random padded batches of 8. The base is frozen; LoRA adapters (peft, rank 8,
alpha 16, on every Conv1D layer of attention and MLP, the tied head left alone) train.

Arms:
- ``lora-adamw``: plain ``transformers.Trainer`` with AdamW on the adapters, hf-tuned's other settings (2%
  warmup, cosine to 10%, clip 1) and weight decay 0 (the usual LoRA setting; decay pulls B, and so the whole
  update, toward 0), its peak lr swept. The baseline.
- ``lora-muon``: FastTrainer, Muon on lora_A and lora_B (each a hidden matrix), its lr swept;
- ``lora-muon-b``: Muon on lora_B only, AdamW on lora_A (``adamw_patterns: ["lora_A"]``), its lr swept: the
  LoRA-aware split (B holds the update's output directions; A starts random);
- each optimizer at its best lr with the recipe's parts on top: ``+ema`` (decay 0.98), ``+guard``,
  ``+wsd`` (1-sqrt cooldown over the last 20%), ``+token-budget`` (batches of a token budget);
- ``full-adamw``: hf-tuned full fine-tuning of the same base at its swept lr (what LoRA gives up).

Reported per arm (medians over seeds): final held-out completion loss, tokens to ``lora-adamw``'s final loss
as a ratio, CPU-seconds per step, and the exact bytes held by the trained parameters, the optimizer's state
and the weight average. Each run is saved as it ends (``--out/lora_fine_tuning_runs``) and a rerun skips it.
Writes lora_fine_tuning.json, .md and .png into ``--out`` (benchmarks/results).
"""

from __future__ import annotations

if not __package__:
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.lora_fine_tuning [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import json
import math
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch

from benchmarks._harness import machine_info, RESULTS, run_cli, UsageError, write_json
from benchmarks._harness.finetune import (PARTS, QUICK, Setup, _key, base_data_args, build_base, make_spec, plans,
                                          run_one, sft_data)
from benchmarks._harness.lm import HF_TUNED, crossing, summarise
from hf_fasttrain.data.corpus import cache_root
from hf_fasttrain.data.front import prepare_data

LORA = {"lora_r": 8, "lora_alpha": 16.0, "lora_dropout": 0.0, "lora_target_modules": "all-linear"}
LORA_ADAMW = {**HF_TUNED, "weight_decay": 0.0}
OPTIMIZERS = {  # name -> (FastTrainer?, settings at lr)
    "lora-adamw": lambda lr: (False, {**LORA_ADAMW, "learning_rate": lr}),
    "lora-muon": lambda lr: (True, {**LORA_ADAMW, "optimizer": "muon", "learning_rate": lr}),
    "lora-muon-b": lambda lr: (True, {**LORA_ADAMW, "optimizer": "muon", "learning_rate": lr,
                                      "optimizer_kwargs": {"adamw_patterns": ["lora_A"]}}),
}
GRIDS = {"lora-adamw": [3e-3, 1e-2, 3e-2, 1e-1], "lora-muon": [3e-3, 1e-2, 3e-2, 1e-1],
         "lora-muon-b": [3e-3, 1e-2, 3e-2, 1e-1]}
LORA_PARTS = ("+ema", "+guard", "+wsd", "+token-budget")


def with_parts(fast: bool, settings: dict[str, Any], parts: list[str], fills: dict[str, int]) -> tuple[bool, dict, str]:
    """An optimizer's settings with the recipe's ``parts`` on top (as the fine-tuning benchmark adds them)."""
    out, plan = dict(settings), "padded"
    for p in parts:
        extra = {k: fills[v[1]] if isinstance(v, tuple) else v for k, v in PARTS[p].items()}
        if "lr_decay" in extra:
            out = {k: v for k, v in out.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")}
        out.update(extra)
        plan = {"+token-budget": "token_budget"}.get(p, plan)
    return fast or bool(parts), out, plan


def table(summary: dict[str, Any], info: dict[str, Any]) -> str:
    lines = ["| arm | final loss | tokens to lora-adamw's loss | CPU-s / step | trained | optimizer state | average |",
             "|---|---|---|---|---|---|---|"]

    def mib(b):
        return f"{b / 2**10:.0f} KiB" if b < 2**20 else f"{b / 2**20:.1f} MiB"

    for arm, row in summary["arms"].items():
        ratio = row["tokens_ratio_vs_reference"]
        reach = ("not reached" if not math.isfinite(row["tokens_to_target"])
                 else f"{ratio:.2f}x" + (f" ({row['reached']}/{row['seeds']} seeds)" if row["reached"] < row["seeds"] else ""))
        sz = info[arm]
        lines.append(f"| {arm} | {row['final_eval_loss']:.3f} | {reach} | {row['cpu_seconds_per_step']:.3f} | "
                     f"{mib(sz['trainable_bytes'])} | {mib(sz['optimizer_state_bytes'])} | "
                     f"{mib(sz['average_bytes']) if sz['average_bytes'] else '-'} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], arms: list[str], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for i, arm in enumerate(arms):
        rs = [r for r in runs if r["arm"] == arm]
        if not rs:
            continue
        xs = [p["tokens"] for p in rs[0]["curve"]]
        ys = [statistics.median(r["curve"][k]["eval_loss"] for r in rs) for k in range(len(xs))]
        ax.plot(xs, ys, marker="o", ms=3, label=arm, color=f"C{i % 10}", ls="-" if "+" not in arm else "--")
    ax.axhline(target, color="grey", lw=0.8)
    ax.set_xlabel("real input tokens")
    ax.set_ylabel("held-out completion loss (median of seeds)")
    ax.set_title("LoRA fine-tuning of the AdamW-pretrained base")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny smoke setup (2 lrs, no parts)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="lora_fine_tuning")
    p.add_argument("--cache", default=None, help="where the pretrained bases are kept (default: the package cache)")
    ns = p.parse_args(argv)
    if ns.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {ns.seeds}")
    torch.set_num_threads(1)
    setup = QUICK if ns.quick else Setup()
    out = Path(ns.out)
    runs_dir = out / f"{ns.name}_runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(ns.cache) if ns.cache else cache_root() / "fine_tuning_bases"
    bases_info: dict[str, Any] = {}
    base = build_base("adamw-base", setup, cache, bases_info)
    tokenizer, _ = prepare_data(base_data_args(setup))
    train, ev, data_info = sft_data(setup, tokenizer)
    plans_, fills = plans(train, setup)
    work = Path(tempfile.mkdtemp(prefix="lora-ft-"))
    runs: list[dict[str, Any]] = []
    sizes: dict[str, dict[str, int]] = {}

    def run(arm: str, fast: bool, settings: dict[str, Any], plan: str, seed: int, lora: bool = True) -> dict[str, Any]:
        spec = make_spec(arm, "adamw-base", fast, settings, plan, plans_, setup)
        spec["lora"] = dict(LORA) if lora else None
        key = _key([{k: v for k, v in spec.items() if k != "arm"}, seed, setup.__dict__, data_info])
        path = runs_dir / f"{arm}-seed{seed}.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = None
        if saved and saved.get("key") == key:
            r = saved
        else:
            r = run_one(spec, seed, setup, base, tokenizer, train, ev, work)
            r["key"] = key
            write_json(path, r)
            print(f"[lora_fine_tuning] {arm:>24s} seed {seed}: final loss {r['final_eval_loss']:.4f}", flush=True)
        r = {**r, "arm": arm}
        runs.append(r)
        sizes.setdefault(arm, {k: r[k] for k in ("trainable_bytes", "optimizer_state_bytes", "average_bytes")})
        return r

    # 1. each optimizer's lr sweep (seed 0)
    grids = {o: g[1:3] for o, g in GRIDS.items()} if ns.quick else GRIDS
    best_lr = {}
    for opt, grid in grids.items():
        got = {lr: run(f"{opt}@{lr:g}", *OPTIMIZERS[opt](lr), "padded", 0)["final_eval_loss"] for lr in grid}
        best_lr[opt] = min(got, key=got.get)
    full = {lr: run(f"full-adamw@{lr:g}", False, {**HF_TUNED, "learning_rate": lr}, "padded", 0, lora=False)
            ["final_eval_loss"] for lr in ([1e-3, 3e-3] if ns.quick else [1e-3, 3e-3, 1e-2])}
    full_lr = min(full, key=full.get)
    print(f"[lora_fine_tuning] best lrs: {best_lr}; full fine-tuning {full_lr:g}", flush=True)
    # 2. the arms: each optimizer at its best lr, alone and with each part; full fine-tuning
    arms: dict[str, tuple] = {}
    for opt in OPTIMIZERS:
        fast, settings = OPTIMIZERS[opt](best_lr[opt])
        arms[opt] = (fast, settings, "padded", True)
        for part in ([] if ns.quick else LORA_PARTS):
            arms[f"{opt}{part}"] = (*with_parts(fast, settings, [part], fills), True)
    arms["full-adamw"] = (False, {**HF_TUNED, "learning_rate": full_lr}, "padded", False)
    record: dict[str, Any] = {}
    for seed in range(ns.seeds):
        for arm, (fast, settings, plan, lora) in arms.items():
            run(arm, fast, settings, plan, seed, lora)
        main_runs = [r for r in runs if r["arm"] in arms]
        target = statistics.median_high(r["final_eval_loss"] for r in main_runs if r["arm"] == "lora-adamw")
        summary = summarise(main_runs, list(arms), "lora-adamw", target=target)
        for arm, row in summary["arms"].items():
            rs = [r for r in main_runs if r["arm"] == arm]
            row["cpu_seconds_per_step"] = statistics.median(r["cpu_seconds"] / max(r["curve"][-1]["step"], 1) for r in rs)
            row["cpu_seconds_to_target"] = statistics.median(crossing(r["curve"], target, "cpu_seconds") for r in rs)
            row.update(sizes[arm])
        sweeps = {r["arm"]: r["final_eval_loss"] for r in runs if "@" in r["arm"]}
        record = {"summary": summary, "best_lr": best_lr, "full_fine_tuning_lr": full_lr, "sweeps_seed0": sweeps,
                  "lora": LORA, "setup": setup.__dict__, "data": data_info, "base": bases_info,
                  "machine": machine_info(), "command": "python -m benchmarks.lora_fine_tuning"
                  + (" " + " ".join(argv) if argv else ""), "runs": runs}
        write_json(out / f"{ns.name}.json", record)
        text = (f"Base: the AdamW-pretrained 2x64 GPT-2; LoRA r=8, alpha 16 on every attention and MLP layer; "
                f"{setup.tokens:,} real tokens per run; {seed + 1} seed(s); target = lora-adamw's final loss "
                f"{target:.3f}. Best lrs (seed 0): " + ", ".join(f"{o} {lr:g}" for o, lr in best_lr.items())
                + f"; full fine-tuning {full_lr:g}.\n\n" + table(summary, sizes)
                + "\nlr sweeps (seed 0, final loss): " + ", ".join(f"{a} {v:.3f}" for a, v in sorted(sweeps.items()))
                + "\n")
        (out / f"{ns.name}.md").write_text(text)
        try:
            plot(main_runs, list(arms), target, out / f"{ns.name}.png")
        except Exception as e:  # a plot must not lose the results
            print(f"[lora_fine_tuning] plot failed: {e}", flush=True)
        print(text, flush=True)
    shutil.rmtree(work, ignore_errors=True)
    return record


if __name__ == "__main__":
    run_cli(main)
