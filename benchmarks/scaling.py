#!/usr/bin/env python
"""Scaling ladder: does Muon's gain over tuned AdamW survive bigger models? Peak-lr sweeps at each size.

    nice -n 10 python -m benchmarks.scaling --jobs 2            # the ladder (resumable: rerun to continue)
    python -m benchmarks.scaling --sizes gpt2-2x64 --seeds 1    # one rung
    python -m benchmarks.scaling --report                       # tables + plot from the JSON, no training
    python -m benchmarks.scaling --quick --out /tmp/x           # a smoke run (the test suite uses it)
    bash benchmarks/gpu_scaling_check.sh                        # on a GPU: GPT-2 small, recipe vs tuned AdamW

Each rung is one model (GPT-2 at three or four sizes, Llama at the middle one) trained on the
time-to-loss setup (benchmarks._harness.lm: the stdlib corpus, vocab 4096, 16 x 128-token rows
per step, eval every 1/12 of the run on the same 128 held-out rows). Every run is one of that
harness's arms with the peak lr replaced: ``hf-tuned`` (transformers.Trainer, AdamW, 2% warmup,
cosine to 10%, wd 0.1, beta2 0.95, clip 1) and ``opt-muon`` (the same settings through FastTrainer
with Muon on the hidden matrices, AdamW at the same lr on the rest).

Token budget: ``tokens = 300 steps x 2048 x sqrt(N / N_2x128)`` (N = non-embedding parameters),
rounded to whole multiples of 12 steps: the budget grows with size, though more slowly than
Chinchilla's 20 tokens per parameter, which a 2-core CPU cannot afford.

Per rung and optimizer: 3 peak lrs a factor 2 apart around the expected best, 2 seeds each; when
the best lr (lowest median final eval loss) is at an edge, that edge is extended by a factor 2 (at
most ``--max-extend`` times). Reported: best lr of each optimizer, final eval loss at the budget,
and Muon's tokens to AdamW's best final loss (median over seeds) divided by the budget (the tokens
AdamW takes to reach it).
Then the trend: a least-squares line of log(token ratio) against log(parameters), and of log(best lr)
against log(width) per optimizer. The Muon/AdamW step-time ratio is measured apart, side by side in
one process (alternating steps), so machine load hits both alike.

Resumable: each run's result is written to the JSON as it ends; a rerun skips every finished run.
Writes scaling.json, scaling.md and scaling.png into --out (benchmarks/results).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.scaling [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import concurrent.futures
import copy
import dataclasses
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

from hf_fasttrain import DataArguments
from hf_fasttrain.data.front import prepare_data

from benchmarks._harness import RESULTS, UsageError, display_command, fmt as _fmt, run_cli
from benchmarks._harness import machine_info as environment_info
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import ARMS, QUICK, Setup, crossing, non_embedding_params, optimizer_arm, run_arm
from benchmarks._harness.sweeps import edge_extension, fit_line, interpolated_best_lr, sweep_losses

BASE_STEPS = 300  # the time-to-loss budget of the 2x128 GPT-2 (0.61M tokens)
STEP_MULTIPLE = 12  # 12 evaluations per run


@dataclasses.dataclass
class Rung:
    """One model size: its shape (``Setup`` fields) and the starting lr grid of each optimizer."""

    name: str
    shape: dict[str, Any]
    grids: dict[str, list[float]]


# Head width 32 everywhere. AdamW's grid moves down with width (its best lr usually falls as models
# widen); Muon's stays (its update is scaled to AdamW's RMS per matrix, so its lr should move less).
RUNGS: dict[str, Rung] = {r.name: r for r in [
    Rung("gpt2-2x32", dict(n_layer=2, n_head=2, n_embd=32),
         {"adamw": [4e-3, 8e-3, 1.6e-2], "muon": [8e-3, 1.6e-2, 3.2e-2]}),
    Rung("gpt2-2x64", dict(n_layer=2, n_head=2, n_embd=64),
         {"adamw": [2e-3, 4e-3, 8e-3], "muon": [8e-3, 1.6e-2, 3.2e-2]}),
    Rung("llama-2x64", dict(model_type="llama", n_layer=2, n_head=2, n_embd=64, n_kv_head=1,
                            model_config={"tie_word_embeddings": True}),
         {"adamw": [2e-3, 4e-3, 8e-3], "muon": [8e-3, 1.6e-2, 3.2e-2]}),
    # the time-to-loss setup itself: its sweeps (results/lr_sweep_hf_tuned.json, optimizer_lr_sweep*.json)
    # are these runs and are imported with --import (then re-checked: see `checks` in the JSON)
    Rung("gpt2-2x128", dict(n_layer=2, n_head=4, n_embd=128),
         {"adamw": [1e-3, 2e-3, 4e-3], "muon": [8e-3, 1.6e-2, 3.2e-2]}),
    Rung("gpt2-3x192", dict(n_layer=3, n_head=6, n_embd=192),
         {"adamw": [1e-3, 2e-3, 4e-3], "muon": [8e-3, 1.6e-2, 3.2e-2]}),
    Rung("gpt2-4x256", dict(n_layer=4, n_head=8, n_embd=256),
         {"adamw": [5e-4, 1e-3, 2e-3], "muon": [4e-3, 8e-3, 1.6e-2]}),
]}
# GPU only (benchmarks/gpu_scaling_check.sh): GPT-2 small on the gpt2_small recipe's data shape (vocab 8192,
# 32 x 1024 tokens per step), one seed, one lr per optimizer: the recipes' (gpt2_small.yaml: Muon at the lr
# the ladder's trend gives at width 768; AdamW at GPT-3's 6e-4), a short time-to-loss check at equal tokens.
GPU_RUNGS: dict[str, Rung] = {r.name: r for r in [
    Rung("gpu-gpt2-12x768", dict(n_layer=12, n_head=12, n_embd=768, vocab_size=8192, block_size=1024, batch_size=32,
                                 max_steps=600, eval_steps=50, eval_rows=256),
         {"adamw": [6e-4], "muon": [3e-3]}),  # the recipes': GPT-3's AdamW lr; Muon's from the ladder's trend
]}
QUICK_RUNGS = {
    "quick-a": Rung("quick-a", dict(n_layer=1, n_head=2, n_embd=32), {"adamw": [2e-3, 4e-3], "muon": [1e-2, 2e-2]}),
    "quick-b": Rung("quick-b", dict(model_type="llama", n_layer=1, n_head=2, n_embd=32, n_kv_head=1),
                    {"adamw": [2e-3, 4e-3], "muon": [1e-2, 2e-2]}),
}


def budget_steps(n_params: int, ref_params: int, base_steps: int = BASE_STEPS, multiple: int = STEP_MULTIPLE) -> int:
    """Optimizer steps at a fixed batch: ``base_steps * sqrt(n_params / ref_params)``, rounded to ``multiple``."""
    return max(multiple, multiple * round(base_steps * math.sqrt(n_params / ref_params) / multiple))


def rung_setup(rung: Rung, quick: bool = False) -> Setup:
    base = QUICK if quick else Setup()
    shape = {k: v for k, v in rung.shape.items()}
    setup = dataclasses.replace(base, **shape)
    if not quick and rung.name not in GPU_RUNGS:
        n = non_embedding_params(setup.n_layer, setup.n_embd, setup.model_type, setup.n_head, setup.n_kv_head)
        ref = non_embedding_params(2, 128, "gpt2", 4)
        setup.max_steps = budget_steps(n, ref)
        setup.eval_steps = setup.max_steps // STEP_MULTIPLE
    return setup


def arm_for(optimizer: str, lr: float):
    if optimizer == "adamw":
        base = ARMS["hf-tuned"]
        return dataclasses.replace(base, name=f"hf-tuned@{lr:g}", args={**base.args, "learning_rate": lr})
    return optimizer_arm(optimizer, lr)


def run_key(rung: str, optimizer: str, lr: float, seed: int) -> str:
    return f"{rung}|{optimizer}|{lr:g}|{seed}"


# --- Step-time ratio: both optimizers side by side in one process ------------------------------------
def step_time_ratio(setup: Setup, steps: int = 20, warmup: int = 3, seed: int = 0) -> dict[str, float]:
    """Median seconds of a whole training step (forward, backward, optimizer) and of the optimizer step
    alone, for AdamW and Muon on two copies of the same model, alternating one step each so that the
    machine's load hits both alike; returns the medians and Muon/AdamW ratios."""
    from hf_fasttrain.optim import create_optimizer
    from hf_fasttrain.modeling import decoder_config

    from transformers import AutoModelForCausalLM

    cfg = decoder_config(setup.model_type, vocab_size=setup.vocab_size, num_hidden_layers=setup.n_layer,
                         num_attention_heads=setup.n_head, hidden_size=setup.n_embd,
                         max_position_embeddings=setup.block_size, num_key_value_heads=setup.n_kv_head,
                         extra=setup.model_config, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    base = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(device)
    models = {"adamw": base, "muon": copy.deepcopy(base)}
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    opts = {name: create_optimizer(name, m, lr=1e-3, weight_decay=0.1) for name, m in models.items()}
    gen = torch.Generator().manual_seed(seed)
    times: dict[str, dict[str, list[float]]] = {n: {"step": [], "optimizer": []} for n in models}
    for i in range(warmup + steps):
        x = torch.randint(0, setup.vocab_size, (setup.batch_size, setup.block_size), generator=gen).to(device)
        for name in (("adamw", "muon") if i % 2 == 0 else ("muon", "adamw")):
            sync()
            t0 = time.perf_counter()
            with autocast:
                loss = models[name](input_ids=x, labels=x).loss
            loss.backward()
            sync()
            t1 = time.perf_counter()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            sync()
            t2 = time.perf_counter()
            if i >= warmup:
                times[name]["step"].append(t2 - t0)
                times[name]["optimizer"].append(t2 - t1)
    med = {n: {k: statistics.median(v) for k, v in t.items()} for n, t in times.items()}
    return {"adamw_step_s": med["adamw"]["step"], "muon_step_s": med["muon"]["step"],
            "adamw_optimizer_s": med["adamw"]["optimizer"], "muon_optimizer_s": med["muon"]["optimizer"],
            "step_ratio": med["muon"]["step"] / med["adamw"]["step"],
            "optimizer_ratio": med["muon"]["optimizer"] / med["adamw"]["optimizer"], "steps": steps}


# --- Runs ---------------------------------------------------------------------------------------------
_SHARED: dict[str, Any] = {}


def _init_worker(threads: int) -> None:
    if not torch.cuda.is_available():
        torch.set_num_threads(threads)


def _run_one(job: tuple[str, str, float, int]) -> dict[str, Any]:
    rung_name, optimizer, lr, seed = job
    s = _SHARED
    setup = s["setups"][rung_name]
    cpu0 = time.process_time()
    tokenizer, lm = s["data"][rung_name]
    r = run_arm(arm_for(optimizer, lr), seed, setup, tokenizer, lm, Path(s["work"]))
    r.update(rung=rung_name, optimizer=optimizer, lr=lr, cpu_seconds=time.process_time() - cpu0,
             max_steps=setup.max_steps, tokens_per_step=setup.tokens_per_step)
    return r


def summarise_rung(runs: list[dict[str, Any]], rung: str) -> Optional[dict[str, Any]]:
    """Best lr per optimizer, loss at budget, and Muon's tokens to AdamW's best final loss as a ratio."""
    mine = [r for r in runs if r["rung"] == rung]
    if not mine:
        return None
    out: dict[str, Any] = {"optimizers": {}}
    for opt in sorted({r["optimizer"] for r in mine}):
        losses = sweep_losses(mine, rung, opt)
        best = min(losses, key=losses.get)
        out["optimizers"][opt] = {"final_eval_loss_by_lr": {f"{lr:g}": v for lr, v in losses.items()},
                                  "best_lr": best, "best_lr_interpolated": interpolated_best_lr(losses),
                                  "final_eval_loss": losses[best],
                                  "best_at_edge": best in (min(losses), max(losses)) and len(losses) > 1,
                                  "seeds_at_best": sum(1 for r in mine if r["optimizer"] == opt and r["lr"] == best)}
    first = mine[0]
    out["max_steps"], out["tokens"] = first["max_steps"], first["max_steps"] * first["tokens_per_step"]
    if "adamw" in out["optimizers"]:
        target = out["optimizers"]["adamw"]["final_eval_loss"]
        out["target_eval_loss"] = target
        for opt, row in out["optimizers"].items():
            at_best = [r for r in mine if r["optimizer"] == opt and r["lr"] == row["best_lr"]]
            toks = [crossing(r["curve"], target, "tokens") for r in at_best]
            row["tokens_to_target"] = statistics.median(toks)
            row["seeds_reaching_target"] = sum(math.isfinite(t) for t in toks)
        # AdamW gets to its own final loss at the budget (by definition, up to seed noise: with 2 seeds one of
        # them ends above the median), so the reference is the budget itself
        for row in out["optimizers"].values():
            row["token_ratio_vs_adamw"] = row["tokens_to_target"] / out["tokens"]
    return out


GPT2_SMALL_NON_EMBEDDING = 84_934_656 + 12 * 12_288 + 12 * 7_680  # 12 x 768 matrices + biases + norms (approx)


def trend(summary: dict[str, Any], rungs: dict[str, Rung], setups: dict[str, Setup]) -> dict[str, Any]:
    """Token ratio against log10(non-embedding params) and log2(best lr) against log2(width), GPT-2 rungs."""
    xs, ratios, widths, best = [], [], [], {"adamw": [], "muon": []}
    for name, s in summary.items():
        if not s or setups[name].model_type != "gpt2" or "muon" not in s["optimizers"] or "adamw" not in s["optimizers"]:
            continue
        xs.append(math.log10(s["non_embedding_params"]))
        ratios.append(math.log10(s["optimizers"]["muon"]["token_ratio_vs_adamw"]))
        widths.append(math.log2(setups[name].n_embd))
        for opt in best:  # the parabola's vertex where the grid brackets the best, else the grid's best
            row = s["optimizers"][opt]
            best[opt].append(math.log2(row.get("best_lr_interpolated") or row["best_lr"]))
    out: dict[str, Any] = {"rungs": len(xs)}
    line = fit_line(xs, ratios)
    if line:
        out["log10_ratio_vs_log10_params"] = line
        out["ratio_change_per_decade"] = 10 ** line["slope"]
        x124 = math.log10(GPT2_SMALL_NON_EMBEDDING)
        out["ratio_at_gpt2_small"] = 10 ** (line["intercept"] + line["slope"] * x124)
    for opt, ys in best.items():
        line = fit_line(widths, ys)
        if line:
            out[f"{opt}_log2_lr_vs_log2_width"] = line
            out[f"{opt}_lr_at_width_768"] = 2 ** (line["intercept"] + line["slope"] * math.log2(768))
    return out


# --- Earlier runs of the same setup ------------------------------------------------------------------
def import_runs(ledger: "Ledger", path: Path, setups: dict[str, Setup]) -> int:
    """Add the runs of an earlier time_to_loss.py / optimizer_lr_sweep.py JSON whose setup is a rung's,
    as that rung's runs (hf-tuned@LR -> adamw, opt-muon / muon -> muon); returns how many were added."""
    record = json.loads(Path(path).read_text())
    rung = next((n for n, st in setups.items() if dataclasses.asdict(st) | record["setup"] == dataclasses.asdict(st)), None)
    if rung is None:
        raise UsageError(f"--import {path}: its setup {record['setup']} is no rung's")
    added = 0
    for r in record["runs"]:
        arm = r.get("arm", "")
        if arm.startswith("hf-tuned@"):
            opt, lr = "adamw", float(arm.split("@", 1)[1])
        elif r.get("optimizer") == "muon" or arm == "opt-muon":
            opt, lr = "muon", float(r["lr"])
        else:
            continue
        key = run_key(rung, opt, lr, r["seed"])
        if key in ledger.data["runs"]:
            continue
        st = setups[rung]
        ledger.data["runs"][key] = {**r, "rung": rung, "optimizer": opt, "lr": lr, "max_steps": st.max_steps,
                                    "tokens_per_step": st.tokens_per_step,
                                    "imported_from": f"{Path(path).name}: {record.get('command', '')}"}
        added += 1
    ledger.save()
    return added


# --- Output -----------------------------------------------------------------------------------------------
def markdown(summary: dict[str, Any], step_times: dict[str, Any], tr: dict[str, Any]) -> str:
    lines = [
        "| rung | non-embedding params | tokens | AdamW best lr | AdamW loss | Muon best lr | Muon loss | "
        "Muon tokens to AdamW's loss (ratio) | speed-up in tokens | Muon/AdamW step time | lr sweeps (median final loss) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        if not s:
            continue
        a, m = s["optimizers"].get("adamw"), s["optimizers"].get("muon")
        st = step_times.get(name, {})
        sweeps = "; ".join(
            f"{opt}: " + ", ".join(f"{lr}: {v:.3f}{'*' if float(lr) == row['best_lr'] else ''}"
                                   for lr, v in row["final_eval_loss_by_lr"].items())
            for opt, row in s["optimizers"].items())
        ratio = m.get("token_ratio_vs_adamw", math.nan) if m and a else math.nan
        def lr_cell(row):
            if not row:
                return "n/a"
            interp = row.get("best_lr_interpolated")
            return _fmt(row["best_lr"]) + (" (edge)" if row["best_at_edge"] else f" (~{interp:.2g})" if interp else "")
        seeds = min(row["seeds_at_best"] for row in s["optimizers"].values())
        imported = " imported" if s.get("imported") else ""
        lines.append(
            f"| {name} ({seeds} seed{'s' if seeds != 1 else ''}{imported}) | {s['non_embedding_params'] / 1e6:.2f}M | {s['tokens'] / 1e6:.2f}M "
            f"| {lr_cell(a)} | {_fmt(a['final_eval_loss'], 4) if a else 'n/a'} "
            f"| {lr_cell(m)} | {_fmt(m['final_eval_loss'], 4) if m else 'n/a'} "
            f"| {_fmt(ratio)} | {_fmt(1 / ratio if ratio and math.isfinite(ratio) else math.nan)}x "
            f"| {_fmt(st.get('step_ratio', math.nan))} | {sweeps} |")
    text = "\n".join(lines) + "\n"
    untrained = {n: st for n, st in step_times.items() if not summary.get(n)}
    if untrained:
        text += ("\nMuon/AdamW step time of rungs not trained yet (whole step; optimizer step alone): " +
                 ", ".join(f"{n} {st['step_ratio']:.2f} ({st['optimizer_ratio']:.1f})" for n, st in untrained.items()) + ".\n")
    if "ratio_change_per_decade" in tr:
        text += (f"\nTrend over {tr['rungs']} GPT-2 rungs: Muon's token ratio changes by a factor "
                 f"{tr['ratio_change_per_decade']:.2f} per 10x parameters; extrapolated to GPT-2 small "
                 f"(85M non-embedding parameters): {tr['ratio_at_gpt2_small']:.2f}.\n")
    for opt in ("adamw", "muon"):
        if f"{opt}_lr_at_width_768" in tr:
            line = tr[f"{opt}_log2_lr_vs_log2_width"]
            text += (f"{opt} best lr ~ width^{line['slope']:.2f}; at width 768: {tr[f'{opt}_lr_at_width_768']:.2g}.\n")
    return text


def plot(summary: dict[str, Any], setups: dict[str, Setup], tr: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6.5, 8.4))  # stacked: legible at a page's width
    for family, marker in (("gpt2", "o"), ("llama", "s")):
        pts = [(s["non_embedding_params"], 1 / s["optimizers"]["muon"]["token_ratio_vs_adamw"])
               for n, s in summary.items() if s and setups[n].model_type == family
               and "muon" in s["optimizers"] and "adamw" in s["optimizers"]
               and 0 < s["optimizers"]["muon"]["token_ratio_vs_adamw"] < math.inf]
        if pts:
            ax.plot(*zip(*sorted(pts)), marker=marker, ls="-" if family == "gpt2" else "none", ms=8, label=f"{family}")
    line = tr.get("log10_ratio_vs_log10_params")
    if line:
        xs = [10 ** x for x in (4.8, 6.5)]
        ax.plot(xs, [1 / 10 ** (line["intercept"] + line["slope"] * math.log10(x)) for x in xs], "k--", lw=0.8,
                label="fit (GPT-2)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    ax.set_xlabel("non-embedding parameters")
    ax.set_ylabel("Muon speed-up in tokens to AdamW's best loss (x)")
    ax.set_title("Muon vs tuned AdamW, each at its best lr")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    for n, s in summary.items():
        if not s:
            continue
        for opt, colour in (("adamw", "C0"), ("muon", "C1")):
            row = s["optimizers"].get(opt)
            if row:
                lrs = [float(x) for x in row["final_eval_loss_by_lr"]]
                ax2.plot(lrs, list(row["final_eval_loss_by_lr"].values()), marker="o" if setups[n].model_type == "gpt2" else "s",
                         color=colour, alpha=0.35 + 0.65 * setups[n].n_embd / 256, lw=1)
                ax2.annotate(n, (row["best_lr"], row["final_eval_loss"]), fontsize=6)
    ax2.set_xscale("log")
    ax2.set_xlabel("peak lr (blue AdamW, orange Muon; darker = wider)")
    ax2.set_ylabel("final eval loss (median of seeds)")
    ax2.set_title("lr sweeps per rung")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(ledger: Ledger, rungs: dict[str, Rung], setups: dict[str, Setup], out: Path, name: str) -> dict[str, Any]:
    runs = list(ledger.data["runs"].values())
    summary = {}
    for n in rungs:
        s = summarise_rung(runs, n)
        if s:
            st = setups[n]
            s["non_embedding_params"] = non_embedding_params(st.n_layer, st.n_embd, st.model_type, st.n_head, st.n_kv_head)
            s["shape"] = dataclasses.asdict(st)
            s["imported"] = any("imported_from" in r for r in runs if r["rung"] == n)
        summary[n] = s
    tr = trend(summary, rungs, setups)
    ledger.data["summary"], ledger.data["trend"] = summary, tr
    side = out / f"{name}_step_time.json"  # written by --step-time-only (another process: its own file)
    step_times = {**(json.loads(side.read_text()) if side.exists() else {}), **ledger.data["step_time"]}
    table = markdown(summary, step_times, tr)
    env = ledger.data.get("environment") or environment_info()
    machine = env["cuda_devices"][0] if env.get("cuda_devices") else f"{env['cpu_count']}-core CPU ({env['processor']})"
    header = (f"Machine: {machine}, shared with other jobs (token counts do not depend on load; step-time ratios were "
              f"measured side by side in one process). torch {env['torch']}, transformers {env['transformers']}.\n"
              f"Command: `{ledger.data.get('command', 'python -m benchmarks.scaling')}`\n\n"
              f"Budget: tokens = {BASE_STEPS} steps x 2048 x sqrt(N / N(gpt2-2x128)), N = non-embedding parameters. "
              f"Loss = median over seeds of the final eval loss; ratio = Muon's tokens to AdamW's best final loss "
              f"(median over seeds, at Muon's best lr) / the budget (AdamW reaches that loss at the budget); "
              f"* marks the best lr; (~x): the vertex of a parabola through the best lr and its neighbours in "
              f"log(lr), used for the lr trend.\n\n")
    ledger.save()
    (out / f"{name}.md").write_text(header + table)
    try:
        plot(summary, setups, tr, out / f"{name}.png")
    except Exception as e:  # a plot must not lose the results
        print(f"[scaling] plot failed: {e}", flush=True)
    return {"summary": summary, "trend": tr, "table": table}


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=None, help=f"comma-separated rungs, in order (default: all); known: {', '.join(RUNGS)}")
    p.add_argument("--optimizers", default="adamw,muon", help="comma-separated: adamw (hf-tuned), muon")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--max-extend", type=int, default=2, help="grid extensions (x2 or /2) when the best lr is at an edge")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (results do not depend on it)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    p.add_argument("--step-time-steps", type=int, default=20, help="alternating steps per optimizer for the step-time ratio (0: skip)")
    p.add_argument("--report", action="store_true", help="only rebuild the table and plot from the JSON")
    p.add_argument("--step-time-only", action="store_true",
                   help="only measure the Muon/AdamW step-time ratio of each rung, into <name>_step_time.json "
                        "(safe beside a running ladder)")
    p.add_argument("--import", dest="imports", action="append", default=[], metavar="JSON",
                   help="add the hf-tuned@LR and Muon runs of an earlier time_to_loss / optimizer_lr_sweep JSON "
                        "whose setup is a rung's (repeatable); they are marked imported_from")
    p.add_argument("--quick", action="store_true", help="tiny smoke ladder (two 1-layer rungs, 1 seed)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="scaling", help="basename of the output files")
    return p


def main(argv=None) -> dict[str, Any]:
    ns = make_parser().parse_args(argv)
    known = QUICK_RUNGS if ns.quick else {**RUNGS, **GPU_RUNGS}
    names = [n.strip() for n in (ns.sizes or ",".join(QUICK_RUNGS if ns.quick else RUNGS)).split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UsageError(f"--sizes: unknown {unknown}; known: {list(known)}")
    optimizers = [o.strip() for o in ns.optimizers.split(",") if o.strip()]
    if any(o not in ("adamw", "muon") for o in optimizers):
        raise UsageError(f"--optimizers: {optimizers} is invalid: allowed: adamw, muon")
    if ns.seeds < 1 or ns.jobs < 1 or ns.threads < 1:
        raise UsageError("--seeds, --jobs and --threads must be >= 1")
    rungs = {n: known[n] for n in names}
    setups = {n: rung_setup(r, ns.quick) for n, r in rungs.items()}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / f"{ns.name}.json")
    for path in ns.imports:
        print(f"[scaling] imported {import_runs(ledger, Path(path), setups)} runs from {path}", flush=True)
    if ns.step_time_only:
        side = out / f"{ns.name}_step_time.json"
        _init_worker(ns.threads)
        for n, st in setups.items():
            done = json.loads(side.read_text()) if side.exists() else {}
            if n in done:
                continue
            done[n] = step_time_ratio(st, steps=ns.step_time_steps or 20)
            side.write_text(json.dumps(done, indent=1))
            print(f"[scaling] {n}: Muon/AdamW step time {done[n]['step_ratio']:.3f} "
                  f"(optimizer step alone {done[n]['optimizer_ratio']:.2f})", flush=True)
        return done
    if ns.report:
        result = report(ledger, rungs, setups, out, ns.name)
        print(result["table"])
        return result
    _init_worker(ns.threads)
    ledger.data["command"] = display_command("python -m benchmarks.scaling", argv if argv is not None else sys.argv[1:])
    ledger.data["environment"] = environment_info()
    ledger.data["setups"] = {n: dataclasses.asdict(s) for n, s in setups.items()}
    ledger.save()
    data: dict[tuple, tuple] = {}  # rungs with the same vocabulary, block and eval rows share their data
    for n, st in setups.items():
        key = (st.vocab_size, st.block_size, st.eval_rows, st.max_corpus_files)
        if key not in data:
            data[key] = prepare_data(DataArguments(vocab_size=st.vocab_size, block_size=st.block_size,
                                                   max_eval_samples=st.eval_rows, max_corpus_files=st.max_corpus_files))
        _SHARED.setdefault("data", {})[n] = data[key]
    with tempfile.TemporaryDirectory(prefix="scaling-") as work:  # before the pool forks: workers inherit it
        _SHARED.update(setups=setups, work=work)
        ctx = multiprocessing.get_context("fork")
        pool = (concurrent.futures.ProcessPoolExecutor(ns.jobs, mp_context=ctx, initializer=_init_worker,
                                                       initargs=(ns.threads,)) if ns.jobs > 1 else None)
        try:
            for name, rung in rungs.items():
                if ns.step_time_steps and name not in ledger.data["step_time"]:
                    ledger.data["step_time"][name] = step_time_ratio(setups[name], steps=ns.step_time_steps)
                    ledger.save()
                    print(f"[scaling] {name}: Muon/AdamW step time {ledger.data['step_time'][name]['step_ratio']:.3f} "
                          f"(optimizer step alone {ledger.data['step_time'][name]['optimizer_ratio']:.2f})", flush=True)
                base = {o: list(rung.grids[o]) for o in optimizers}
                extra: set[tuple[str, float]] = set()
                while True:
                    runs = [r for r in ledger.data["runs"].values() if r["rung"] == name]
                    points = {(o, float(lr)) for o in optimizers for lr in base[o]} | extra
                    points |= {(r["optimizer"], float(r["lr"])) for r in runs if r["optimizer"] in optimizers}
                    jobs = [(name, o, lr, seed) for seed in range(ns.seeds) for o, lr in sorted(points)
                            if run_key(name, o, lr, seed) not in ledger.data["runs"]]
                    futures = ([pool.submit(_run_one, j) for j in jobs] if pool else None)
                    done = concurrent.futures.as_completed(futures) if pool else (None for _ in jobs)
                    for i, f in enumerate(done):
                        r = f.result() if pool else _run_one(jobs[i])
                        ledger.data["runs"][run_key(name, r["optimizer"], r["lr"], r["seed"])] = r
                        ledger.save()  # each run is kept as soon as it ends
                        print(f"[scaling] {name} {r['optimizer']:>5s} lr {r['lr']:<8g} seed {r['seed']}: final eval "
                              f"loss {r['final_eval_loss']:.4f} ({r['cpu_seconds']:.0f} CPU-s, "
                              f"{r['train_seconds']:.0f} s training)", flush=True)
                    runs = list(ledger.data["runs"].values())
                    extra = set()
                    for o in optimizers:
                        losses = sweep_losses(runs, name, o)
                        new = edge_extension(losses)
                        if new is not None and len(losses) - len(base[o]) < ns.max_extend:
                            extra.add((o, new))
                    if not extra:
                        break
                # imported runs: rerun seed 0 at each optimizer's best lr and keep both losses (same code?)
                mine = [r for r in ledger.data["runs"].values() if r["rung"] == name]
                if any("imported_from" in r for r in mine):
                    checks = ledger.data.setdefault("checks", {})
                    for o in optimizers:
                        losses = sweep_losses(mine, name, o)
                        if not losses:
                            continue
                        best = min(losses, key=losses.get)
                        key = run_key(name, o, best, 0)
                        if key in checks or "imported_from" not in ledger.data["runs"].get(key, {}):
                            continue
                        r = pool.submit(_run_one, (name, o, best, 0)).result() if pool else _run_one((name, o, best, 0))
                        checks[key] = {"imported": ledger.data["runs"][key]["final_eval_loss"],
                                       "rerun": r["final_eval_loss"], "rerun_cpu_seconds": r["cpu_seconds"]}
                        ledger.save()
                        print(f"[scaling] check {key}: imported {checks[key]['imported']:.4f}, rerun "
                              f"{checks[key]['rerun']:.4f}", flush=True)
                report(ledger, rungs, setups, out, ns.name)
        finally:
            if pool:
                pool.shutdown(wait=True, cancel_futures=True)
    result = report(ledger, rungs, setups, out, ns.name)
    print(result["table"])
    return result


if __name__ == "__main__":
    run_cli(main)
