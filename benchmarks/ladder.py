#!/usr/bin/env python
"""The ladder: does the recipe's gain over tuned AdamW hold when the run is longer, or the model larger?

    nice -n 10 python -m benchmarks.ladder budget --jobs 2   # longer runs: 1x..16x the budget (resumable)
    python -m benchmarks.ladder budget --budgets 1,4         # some budgets only
    python -m benchmarks.ladder budget --report              # table + plot from the JSON, no training
    nice -n 10 python -m benchmarks.ladder size --jobs 2     # larger models: GPT-2 2x32..4x256, a Llama
    python -m benchmarks.ladder size --sizes gpt2-2x64       # one model size
    python -m benchmarks.ladder size --report                # tables + plot from the JSON, no training
    python -m benchmarks.ladder budget --quick --out /tmp/x  # a smoke run (the test suite uses it; size too)
    bash benchmarks/gpu_scaling_check.sh                     # on a GPU: GPT-2 small, Muon vs tuned AdamW

``python -m benchmarks.budget_ladder`` is ``python -m benchmarks.ladder budget``, and ``python -m
benchmarks.scaling`` is ``python -m benchmarks.ladder size``, with the same options and output files.

A rung is one setup of the time-to-loss harness (``benchmarks._harness.lm``: the stdlib corpus, vocab 4096,
16 x 128-token rows per step, 12 evals on the same held-out rows). At each rung every optimizer's peak lr is
swept: 3 lrs a factor 2 apart, an edge extended by a factor 2 when it is the best, some seeds each. Every run is
a harness arm with its peak lr replaced: ``adamw`` the ``hf-tuned`` arm (transformers.Trainer, AdamW, 2% warmup,
cosine to 10%, wd 0.1, beta2 0.95, clip 1), ``recipe`` the ``fasttrain`` arm (Muon + EMA + sequence-length
warmup), ``muon`` the ``opt-muon`` arm (hf-tuned's settings through FastTrainer with Muon on the hidden matrices).
Reported per rung: each optimizer's best lr and final eval loss (median over seeds), the other's tokens to
AdamW's best final loss over the budget (AdamW reaches it at the budget), and least-squares trends across rungs.

``budget``: GPT-2 2x128 at ``multiple x 300`` optimizer steps, AdamW against the recipe. Each run is complete at
its budget. Each budget's grid is centred on the previous budget's best, seeds in the order of
``phase_order``. The ``unique`` corpus (``--unique-budgets``) adds Python sources of the installed packages so
the budget is covered without repeats, at the stdlib budget's best lrs. Earlier 1x runs are taken over
(``imported_from``). The report adds the complete-run measure, two log-log fits, and the rows against hf-best
read from hf_best.json (``benchmarks.hf_best``). Writes budget_ladder.json, .md and .png.

``size``: GPT-2 at four sizes and Llama at one, AdamW against Muon, at ``tokens = 300 steps x 2048 x sqrt(N /
N_2x128)`` (N = non-embedding parameters), rounded to whole multiples of 12 steps: the budget grows with size,
though more slowly than Chinchilla's 20 tokens per parameter, which a 2-core CPU cannot afford. The trends are
log(token ratio) against log(parameters) and log(best lr) against log(width); the Muon/AdamW step-time ratio is
measured apart, side by side in one process (alternating steps), so machine load hits both alike. Writes
scaling.json, .md and .png.

Resumable: each run is written to the JSON as it ends; a rerun skips every finished run. The runs go through the
harness's process pool (``--jobs``). Output files go into --out (benchmarks/results).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.ladder [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import copy
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from hf_fasttrain import DataArguments
from hf_fasttrain.data.front import prepare_data
from hf_fasttrain.runinfo import environment_info

from benchmarks._harness import RESULTS, UsageError, display_command, display_path, fmt as _fmt, machine_info, run_cli
from benchmarks._harness.budget import BASE_STEPS, budget_setup, data_args, unique_corpus_data
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import (ARMS, QUICK, Setup, crossing, load_saved_run, non_embedding_params, optimizer_arm,
                                    run_arm)
from benchmarks._harness.lm import run_key as saved_run_key
from benchmarks._harness.long_runs import (complete_run_budget, complete_runs_of, fastest_one_run, peak_lr,
                                           rung_suffix, search_ledger)
from benchmarks._harness.processes import STOP, as_finished, in_order, set_threads, worker_pool
from benchmarks._harness.sweeps import edge_extension, fit_line, interpolated_best_lr, sweep_losses

BUDGET_OPTIMIZERS = ("adamw", "recipe")  # the budget ladder's: hf-tuned against the recipe
SIZE_OPTIMIZERS = ("adamw", "muon")  # the size ladder's: hf-tuned against Muon
FIRST_GRID = {"adamw": [1e-3, 2e-3, 4e-3], "recipe": [8e-3, 1.6e-2, 3.2e-2]}
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022
STEP_MULTIPLE = 12  # 12 evaluations per run


# --- Both ladders: the arms, a run, the summary of a rung's sweeps ----------------------------------------
def arm_for(optimizer: str, lr: float):
    """The harness arm of ``optimizer`` at peak lr ``lr``: ``adamw`` hf-tuned, ``recipe`` fasttrain, ``muon``
    opt-muon."""
    if optimizer == "muon":
        return optimizer_arm(optimizer, lr)
    base = ARMS[{"adamw": "hf-tuned", "recipe": "fasttrain"}[optimizer]]
    return dataclasses.replace(base, name=f"{base.name}@{lr:g}", args={**base.args, "learning_rate": lr})


def run_key(rung: str, optimizer: str, lr: float, seed: int) -> str:
    return f"{rung}|{optimizer}|{lr:g}|{seed}"


_SHARED: dict[str, Any] = {}  # set before the pool forks: each rung's setup and (tokenizer, lm), the work folder


def _run_one(job: tuple[str, str, float, int]) -> dict[str, Any]:
    rung, optimizer, lr, seed = job
    setup = _SHARED["setups"][rung]
    tokenizer, lm = _SHARED["data"][rung]
    cpu0 = time.process_time()
    r = run_arm(arm_for(optimizer, lr), seed, setup, tokenizer, lm, Path(_SHARED["work"]))
    r.update(rung=rung, optimizer=optimizer, lr=lr, cpu_seconds=time.process_time() - cpu0,
             max_steps=setup.max_steps, tokens_per_step=setup.tokens_per_step)
    return r


def run_and_record(ledger: Ledger, pool, jobs: list[tuple[str, str, float, int]], note: str = "") -> None:
    """``jobs`` in the pool's workers (or here), each run kept in the ledger as soon as it ends."""
    for _, r in as_finished(pool, _run_one, jobs):
        ledger.data["runs"][run_key(r["rung"], r["optimizer"], r["lr"], r["seed"])] = r
        ledger.save()
        print(f"[ladder] {r['rung']} {r['optimizer']:>6s} lr {r['lr']:<8g} seed {r['seed']}{note}: final eval "
              f"loss {r['final_eval_loss']:.4f} ({r['cpu_seconds']:.0f} CPU-s, {r['train_seconds']:.0f} s training)",
              flush=True)


def sweep_summary(mine: list[dict[str, Any]], rung: str, optimizers, tokens: float,
                  fastest: bool = False) -> tuple[dict[str, Any], Optional[float]]:
    """Each of ``optimizers`` swept at ``rung`` (``mine``: the rung's runs): its final loss per lr (median over
    seeds), best lr (and the parabola's vertex), whether that is at the grid's edge, and its seeds there. With
    AdamW among them, each one's tokens to AdamW's best final loss, over ``tokens`` (the budget: AdamW reaches its
    own loss there); with ``fastest``, also the lr (of those swept) that gets there first. Returns the rows and
    AdamW's loss (None without AdamW)."""
    rows: dict[str, Any] = {}
    for opt in optimizers:
        losses = sweep_losses(mine, rung, opt)
        if not losses:
            continue
        best = min(losses, key=losses.get)
        rows[opt] = {
            "final_eval_loss_by_lr": {f"{lr:g}": v for lr, v in losses.items()}, "best_lr": best,
            "best_lr_interpolated": interpolated_best_lr(losses), "final_eval_loss": losses[best],
            "best_at_edge": len(losses) > 1 and best in (min(losses), max(losses)),
            "seeds_at_best": sum(1 for r in mine if r["optimizer"] == opt and r["lr"] == best)}
    if "adamw" not in rows:
        return rows, None
    target = rows["adamw"]["final_eval_loss"]
    for opt, row in rows.items():
        at_best = [r for r in mine if r["optimizer"] == opt and r["lr"] == row["best_lr"]]
        toks = [crossing(r["curve"], target, "tokens") for r in at_best]
        row["tokens_to_target"] = statistics.median(toks)
        row["seeds_reaching_target"] = sum(math.isfinite(t) for t in toks)
        row["token_ratio_vs_adamw"] = row["tokens_to_target"] / tokens  # AdamW reaches its own loss at the budget
        if fastest:  # the swept lr that reaches the target first: not always the one with the best final loss
            by_lr = {}
            for lr in {r["lr"] for r in mine if r["optimizer"] == opt}:
                runs_lr = [r for r in mine if r["optimizer"] == opt and r["lr"] == lr]
                by_lr[lr] = statistics.median(crossing(r["curve"], target, "tokens") for r in runs_lr)
            quickest = min(by_lr, key=by_lr.get)
            row["fastest_lr"], row["fastest_token_ratio"] = quickest, by_lr[quickest] / tokens
    return rows, target


def lr_cell(row: Optional[dict[str, Any]], shown: Callable[[float], str] = lambda lr: f"{lr:g}") -> str:
    """A sweep's best lr as the tables show it: ``(edge)`` at the grid's edge, else ``(~x)``, the parabola's vertex."""
    if not row:
        return "n/a"
    interp = row.get("best_lr_interpolated")
    return shown(row["best_lr"]) + (" (edge)" if row["best_at_edge"] else f" (~{interp:.2g})" if interp else "")


def write_report(ledger: Ledger, out: Path, name: str, text: str, draw: Callable[[Path], None]) -> None:
    """The ledger saved with its summary, ``<name>.md`` and the figure ``<name>.png`` (a failed plot is said, and
    loses no result)."""
    ledger.save()
    (out / f"{name}.md").write_text(text)
    try:
        draw(out / f"{name}.png")
    except Exception as e:  # a plot must not lose the results
        print(f"[ladder] plot failed: {e}", flush=True)


def sweep_plot(ax, summary: dict[str, Any], colours: dict[str, str], marker: Callable[[str], str],
               alpha: Callable[[str], float]) -> None:
    """Each rung's lr sweeps (final eval loss against the peak lr), one line per optimizer, its best lr named."""
    for name, s in summary.items():
        if not s:
            continue
        for opt, colour in colours.items():
            row = s["optimizers"].get(opt)
            if row:
                lrs = [float(x) for x in row["final_eval_loss_by_lr"]]
                ax.plot(lrs, list(row["final_eval_loss_by_lr"].values()), marker=marker(name), color=colour,
                        alpha=alpha(name), lw=1)
                ax.annotate(name, (row["best_lr"], row["final_eval_loss"]), fontsize=6)
    ax.set_xscale("log")
    ax.set_ylabel("final eval loss (median of seeds)")
    ax.grid(alpha=0.3)


# --- The budget ladder: longer runs of GPT-2 2x128 --------------------------------------------------------
def rung_name(multiple: int, corpus: str = "stdlib") -> str:
    return f"{multiple}x" + ("" if corpus == "stdlib" else f"-{corpus}")


def centred_grid(best: float) -> list[float]:
    """Three lrs a factor 2 apart around ``best``."""
    return [best / 2, best, best * 2]


def best_lr(runs: list[dict[str, Any]], rung: str, optimizer: str) -> Optional[float]:
    losses = sweep_losses(runs, rung, optimizer)
    return min(losses, key=losses.get) if losses else None


def phase_order(stdlib_rungs: list[str], unique_rungs: list[str], seeds: int) -> list[tuple[str, int, str]]:
    """(rung, seed, which) in run order; ``which`` is ``all`` (the sweep), ``best`` or ``rest`` (of seed 0's lrs).

    Seed 0 of every budget first (a ladder cut short still spans the budgets), then the later seeds at each
    budget's best lrs, then the corpus that does not repeat, then the later seeds at the other lrs."""
    later = range(1, seeds)
    return ([(r, 0, "all") for r in stdlib_rungs]
            + [(r, s, "best") for s in later for r in stdlib_rungs]
            + [(r, s, "all") for s in range(seeds) for r in unique_rungs]
            + [(r, s, "rest") for s in later for r in stdlib_rungs])


# Imports of earlier runs of the 1x setup
def import_earlier(ledger: Ledger, results: Path, setup: Setup) -> int:
    """AdamW's 1x runs from scaling.json (rung gpt2-2x128) and the recipe's from time_to_loss_runs/."""
    added = 0
    sc = results / "scaling.json"
    if sc.exists() and setup == Setup():
        for r in json.loads(sc.read_text())["runs"].values():
            if r.get("rung") == "gpt2-2x128" and r["optimizer"] == "adamw":
                key = run_key("1x", "adamw", r["lr"], r["seed"])
                if key not in ledger.data["runs"]:
                    ledger.data["runs"][key] = {**r, "rung": "1x", "imported_from": r.get("imported_from", "scaling.json")}
                    added += 1
    saved = results / "time_to_loss_runs"
    for seed in range(3):
        key = run_key("1x", "recipe", ARMS["fasttrain"].args["learning_rate"], seed)
        path = saved / f"fasttrain-seed{seed}.json"
        r = load_saved_run(path, saved_run_key(ARMS["fasttrain"], seed, setup)) if path.exists() else None
        if r and key not in ledger.data["runs"]:
            ledger.data["runs"][key] = {**r, "rung": "1x", "optimizer": "recipe", "lr": ARMS["fasttrain"].args["learning_rate"],
                                        "max_steps": setup.max_steps, "tokens_per_step": setup.tokens_per_step,
                                        "imported_from": "time_to_loss_runs/" + path.name}
            added += 1
    return added


def summarise_budget(runs: list[dict[str, Any]], rung: str, n_params: int) -> Optional[dict[str, Any]]:
    """Best lr and loss per optimizer; the recipe's tokens to AdamW's best final loss, over the budget."""
    mine = [r for r in runs if r["rung"] == rung]
    if not mine:
        return None
    tokens = mine[0]["max_steps"] * mine[0]["tokens_per_step"]
    out: dict[str, Any] = {"tokens": tokens, "max_steps": mine[0]["max_steps"], "tokens_per_param": tokens / n_params}
    out["optimizers"], target = sweep_summary(mine, rung, BUDGET_OPTIMIZERS, tokens, fastest=True)
    if target is not None:
        out["target_eval_loss"] = target
    return out


def budget_trend(summary: dict[str, Any]) -> dict[str, Any]:
    """log10(recipe's token ratio) against log10(tokens per parameter); log2(best lr) against log2(budget)."""
    xs, ys, budgets, best = [], [], [], {o: [] for o in BUDGET_OPTIMIZERS}
    for s in summary.values():
        if not s or s.get("corpus", "stdlib") != "stdlib" or set(BUDGET_OPTIMIZERS) - set(s["optimizers"]):
            continue
        ratio = s["optimizers"]["recipe"].get("token_ratio_vs_adamw", math.nan)
        xs.append(math.log10(s["tokens_per_param"]))
        ys.append(math.log10(ratio) if 0 < ratio < math.inf else math.nan)
        budgets.append(math.log2(s["multiple"]))
        for opt in BUDGET_OPTIMIZERS:
            row = s["optimizers"][opt]
            best[opt].append(math.log2(row.get("best_lr_interpolated") or row["best_lr"]))
    out: dict[str, Any] = {"budgets": len(xs)}
    cx, cy = [], []
    for s in summary.values():
        if s and s.get("corpus", "stdlib") == "stdlib" and "recipe" in s["optimizers"]:
            c = s["optimizers"]["recipe"].get("complete_run_ratio_vs_adamw", math.nan)
            if 0 < c < math.inf and not s["optimizers"]["recipe"].get("complete_run_extrapolated_vs_adamw"):
                cx.append(math.log10(s["tokens_per_param"]))
                cy.append(math.log10(c))
    cline = fit_line(cx, cy)
    if cline:
        out["complete_log10_ratio_vs_log10_tokens_per_param"] = cline
        out["complete_ratio_change_per_4x_budget"] = 4 ** cline["slope"]
        out["complete_ratio_at_chinchilla"] = 10 ** (cline["intercept"] + cline["slope"]
                                                     * math.log10(CHINCHILLA_TOKENS_PER_PARAM))
    line = fit_line(xs, ys)
    if line:
        out["log10_ratio_vs_log10_tokens_per_param"] = line
        out["ratio_change_per_4x_budget"] = 4 ** line["slope"]
        out["ratio_at_chinchilla"] = 10 ** (line["intercept"] + line["slope"] * math.log10(CHINCHILLA_TOKENS_PER_PARAM))
    for opt, vals in best.items():
        line = fit_line(budgets, vals)
        if line:
            out[f"{opt}_log2_lr_vs_log2_budget"] = line
            out[f"{opt}_lr_change_per_4x_budget"] = 4 ** line["slope"]
    return out


def add_complete_run_ratios(summary: dict[str, Any], baseline: str = "adamw") -> None:
    """Per stdlib budget: the budget a complete recipe run needs to end at ``baseline``'s final loss, over the
    budget (``complete_run_ratio_vs_<baseline>``), from the recipe's complete runs at every budget."""
    rows = {s["multiple"]: s for s in summary.values() if s and s.get("corpus", "stdlib") == "stdlib"}
    finals = {m: s["optimizers"]["recipe"]["final_eval_loss"] for m, s in rows.items() if "recipe" in s["optimizers"]}
    lo, hi = (min(finals.values()), max(finals.values())) if finals else (math.nan, math.nan)
    for m, s in rows.items():
        base = s["optimizers"].get(baseline)
        if base and "recipe" in s["optimizers"]:
            target = base["final_eval_loss"]
            s["optimizers"]["recipe"][f"complete_run_ratio_vs_{baseline}"] = complete_run_budget(finals, target) / m
            # outside the recipe's complete runs the line is extended: say so wherever the figure is shown
            s["optimizers"]["recipe"][f"complete_run_extrapolated_vs_{baseline}"] = not (lo <= target <= hi)


def budget_markdown(summary: dict[str, Any], tr: dict[str, Any]) -> str:
    """Two tables: the headline (both measures of the speed-up, the final losses, seeds), then the sweeps."""
    lines = ["| budget | recipe's tokens to AdamW's loss, one run | complete run at AdamW's loss: budget ratio "
             "| AdamW loss | recipe loss | seeds |", "|---|---|---|---|---|---|"]
    sweeps = ["| budget | optimizer | best lr | lrs swept: final eval loss (median of seeds; * best) |",
              "|---|---|---|---|"]
    for name, s in summary.items():
        if not s:
            continue
        a, m = s["optimizers"].get("adamw"), s["optimizers"].get("recipe")
        seeds = min(row["seeds_at_best"] for row in s["optimizers"].values())
        ratio = m.get("token_ratio_vs_adamw", math.nan) if m else math.nan
        cell = "never reached" if ratio == math.inf else f"**{_fmt(ratio)}**"
        if m and m.get("fastest_lr") is not None and m["fastest_lr"] != m["best_lr"]:
            cell += f" ({_fmt(m['fastest_token_ratio'])} at lr {m['fastest_lr']:g})"
        complete = m.get("complete_run_ratio_vs_adamw") if m else None
        complete_cell = "n/a" if complete is None else "beyond the runs" if complete == math.inf else _fmt(complete)
        if complete is not None and m.get("complete_run_extrapolated_vs_adamw"):
            complete_cell += " (extrapolated)"
        lines.append(f"| {name}, {s['tokens_per_param']:.1f} tokens/param | {cell} | {complete_cell} "
                     f"| {_fmt(a['final_eval_loss'], 4) if a else 'n/a'} | {_fmt(m['final_eval_loss'], 4) if m else 'n/a'} "
                     f"| {seeds} |")
        for label, row in (("AdamW (hf-tuned)", a), ("recipe", m)):
            if not row:
                continue
            best = lr_cell(row)
            swept = ", ".join(f"{lr}{'*' if float(lr) == row['best_lr'] else ''}: {v:.3f}"
                              for lr, v in row["final_eval_loss_by_lr"].items())
            sweeps.append(f"| {name} | {label} | {best} | {swept} |")
    text = "\n".join(lines) + "\n\n" + "\n".join(sweeps) + "\n"
    if "ratio_change_per_4x_budget" in tr:
        text += (f"\nTrend over {tr['budgets']} budgets: the recipe's token ratio changes by a factor "
                 f"{tr['ratio_change_per_4x_budget']:.2f} per 4x budget; extrapolated to {CHINCHILLA_TOKENS_PER_PARAM} "
                 f"tokens per parameter: {tr['ratio_at_chinchilla']:.2f}.\n")
    if "complete_ratio_change_per_4x_budget" in tr:
        text += (f"By complete runs: a factor {tr['complete_ratio_change_per_4x_budget']:.2f} per 4x budget; "
                 f"{tr['complete_ratio_at_chinchilla']:.2f} at {CHINCHILLA_TOKENS_PER_PARAM} tokens per parameter.\n")
    for opt in BUDGET_OPTIMIZERS:
        if f"{opt}_lr_change_per_4x_budget" in tr:
            text += f"{opt} best lr changes by a factor {tr[f'{opt}_lr_change_per_4x_budget']:.2f} per 4x budget.\n"
    return text


def budget_plot(summary: dict[str, Any], path: Path, best_rows: Optional[dict[str, Any]] = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6.5, 8.4))  # stacked: legible at a page's width
    for corpus, marker in (("stdlib", "o"), ("unique", "s")):
        pts = [(s["tokens_per_param"], s["optimizers"]["recipe"]["token_ratio_vs_adamw"]) for s in summary.values()
               if s and s.get("corpus", "stdlib") == corpus and "recipe" in s["optimizers"] and "adamw" in s["optimizers"]
               and 0 < s["optimizers"]["recipe"].get("token_ratio_vs_adamw", math.inf) < math.inf]
        if pts:
            ax.plot(*zip(*sorted(pts)), marker=marker, ls="-" if corpus == "stdlib" else "none", ms=8,
                    label="gpt2_tiny vs hf-tuned, one run" if corpus == "stdlib"
                    else "gpt2_tiny vs hf-tuned, one run, no repeated data")
    pts = hf_best_points(best_rows or {}, summary)
    # one line per recipe: the ladder's recipe where the ladder ran, the searched recipe at each budget apart
    for measure, colour, ls, label in (
            ("one_run", "C3", "-", "gpt2_tiny vs hf-best, one run"),
            ("complete_runs", "C2", "-", "gpt2_tiny vs hf-best, complete runs (hollow: extrapolated)"),
            ("searched_one_run", "C3", "--", "recipe searched per budget vs hf-best, one run"),
            ("searched_complete_runs", "C2", "--", "recipe searched per budget vs hf-best, complete runs")):
        if pts.get(measure):
            xs, ys, extra = zip(*pts[measure])
            ax.plot(xs, ys, color=colour, lw=1, ls=ls, label=label)
            ax.scatter(xs, ys, s=50, edgecolors=colour, facecolors=[("none" if e else colour) for e in extra], zorder=3)
    longest = max([s["tokens_per_param"] for s in summary.values() if s] + [p[0] for v in pts.values() for p in v] + [20])
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.axvline(CHINCHILLA_TOKENS_PER_PARAM, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_xticks([t for t in (1, 2, 5, 10, 20, 50, 100, 200) if t <= longest * 2])
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlim(1, 50 if longest < 40 else longest * 1.5)
    ax.set_ylim(0, 1.1)
    ax.set_xlabel("training tokens per non-embedding parameter")
    ax.set_ylabel("recipe's tokens to the baseline's loss / budget")
    ax.set_title("Recipe vs AdamW, each at its best lr (lower is better)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    sweep_plot(ax2, summary, {"adamw": "C0", "recipe": "C1"}, lambda name: "o",
               lambda name: 0.3 + 0.7 * min(1.0, math.log2(summary[name]["multiple"] + 1) / 4))
    ax2.set_xlabel("peak lr (blue AdamW, orange recipe; darker = longer)")
    ax2.set_title("lr sweeps per budget")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def budget_report(ledger: Ledger, rungs: dict[str, tuple[int, str]], setups: dict[str, Setup], out: Path, name: str):
    runs = list(ledger.data["runs"].values())
    n_params = non_embedding_params(next(iter(setups.values())).n_layer, next(iter(setups.values())).n_embd,
                                    "gpt2", next(iter(setups.values())).n_head)
    summary = {}
    for rung, (multiple, corpus) in rungs.items():
        s = summarise_budget(runs, rung, n_params)
        if s:
            s.update(multiple=multiple, corpus=corpus, non_embedding_params=n_params,
                     imported=any("imported_from" in r for r in runs if r["rung"] == rung))
        summary[rung] = s
    add_complete_run_ratios(summary)
    tr = budget_trend(summary)
    hb = search_ledger(out / "hf_best.json")
    best_rows = versus_hf_best(summary, runs, hb) if hb is not None else {}
    best_trend = versus_hf_best_trend(best_rows, summary)
    ledger.data["summary"], ledger.data["trend"], ledger.data["versus_hf_best"] = summary, tr, best_rows
    ledger.data["trend_versus_hf_best"] = best_trend
    table = budget_markdown(summary, tr) + hf_best_markdown(best_rows, best_trend)
    env = ledger.data.get("environment") or environment_info()
    machine = f"{env['cpu_count']}-core x86_64 CPU" if not env.get("cuda_devices") else env["cuda_devices"][0]
    header = (f"Machine: {machine}, shared with other jobs (token counts do not depend on load). "
              f"torch {env['torch']}, transformers {env['transformers']}.\n\n"
              f"Command: `{ledger.data.get('command', 'python -m benchmarks.ladder budget')}`\n\n"
              f"Model: GPT-2 2x128 ({n_params / 1e6:.2f}M non-embedding parameters); budget = multiple x {BASE_STEPS} steps "
              f"x 2048 tokens. Loss = median over seeds of the final eval loss; ratio = the recipe's tokens to AdamW's "
              f"best final loss (median over seeds, at the recipe's best lr) / the budget, and in brackets the ratio at "
              f"the recipe's lr that gets there first when that is another; * marks the best lr; (~x): "
              f"the vertex of a parabola through the best lr and its neighbours in log(lr). The stdlib corpus holds "
              f"about 3.3M training tokens: 16x reads it about 3 times; `-unique` rows train on it plus package "
              f"sources, with no repeats.\n\n")
    write_report(ledger, out, name, header + table, lambda path: budget_plot(summary, path, best_rows))
    return {"summary": summary, "trend": tr, "table": table}


# Against hf-best: the budget ladder's recipe and the long-run search's winners, both ledgers read together
def versus_hf_best(summary: dict[str, Any], runs: list[dict[str, Any]], hf_best: dict[str, Any]) -> dict[str, Any]:
    """Per budget where benchmarks/hf_best.py finished its search: the recipe (the ladder's, at its best lr, and
    the long-horizon winner of the recipe's search) against hf-best's final loss, by both measures."""
    out = {}
    finals = {s["multiple"]: s["optimizers"]["recipe"]["final_eval_loss"] for s in summary.values()
              if s and s.get("corpus", "stdlib") == "stdlib" and "recipe" in s["optimizers"]}
    searched = hf_best.get("summary") or {}
    for rung, families in sorted(searched.items(), key=lambda kv: int(kv[0].split("x")[0])):
        s = summary.get(rung)
        if not s and {"hf-best", "recipe"} <= set(families):
            # a budget only hf_best.py ran (the 16x winners at 64x; the same on the corpus that does not repeat, or
            # on a larger model)
            row = beyond_the_ladder(rung, families, summary, finals, hf_best)
            if row:
                out[rung] = row
            continue
        if not s or "hf-best" not in families or "recipe" not in s["optimizers"]:
            continue
        target = families["hf-best"]["final_eval_loss"]
        budget = s["tokens"]
        m = s["optimizers"]["recipe"]
        ladder = [r for r in runs if r["rung"] == rung and r["optimizer"] == "recipe" and r["lr"] == m["best_lr"]]
        row = {"target_eval_loss": target, "hf_best": families["hf-best"]["best"],
               "search_complete": families["hf-best"].get("complete", True),
               "hf_tuned_eval_loss": s["optimizers"].get("adamw", {}).get("final_eval_loss"),
               "recipe_token_ratio": statistics.median(crossing(r["curve"], target, "tokens") for r in ladder) / budget,
               "recipe_complete_run_ratio": complete_run_budget(finals, target) / s["multiple"],
               "recipe_complete_run_extrapolated": not (min(finals.values()) <= target <= max(finals.values()))}
        long_run = families.get("recipe")
        if long_run:
            mine = [r for r in hf_best.get("runs", {}).values() if r["rung"] == rung and r["family"] == "recipe"
                    and json.dumps(r["config"], sort_keys=True) == json.dumps(long_run["best"], sort_keys=True)]
            row["long_horizon_recipe"] = long_run["best"]
            row["long_horizon_eval_loss"] = long_run["final_eval_loss"]
            row["long_horizon_token_ratio"] = (statistics.median(crossing(r["curve"], target, "tokens") for r in mine)
                                               / budget if mine else math.nan)
        fastest = fastest_one_run(hf_best, rung, target, budget)
        if fastest:
            row["fastest_one_run"] = fastest
        out[rung] = row
    return out


def beyond_the_ladder(rung: str, families: dict[str, Any], summary: dict[str, Any], finals: dict[int, float],
                      hf_best: dict[str, Any]) -> Optional[dict[str, Any]]:
    """A budget longer than the ladder's, where hf_best.py ran both families at their shorter budget's winners
    with the peak lr swept: the winner of the recipe's sweep against hf-best's. The complete-run measure
    interpolates between complete runs of the same settings at shorter budgets (each at its own tuned lr; the
    ladder's recipe runs where these settings ran nowhere else) and this budget's winner; on the
    corpus that does not repeat (``64x-unique``) and on a larger model (``54x-3x192``) only complete runs of the same
    settings on that corpus or model count (the ladder's recipe ran on neither); without any, that measure is n/a.
    As at a searched budget, the recipe setting with two or more seeds that reaches hf-best's loss soonest inside
    one run is ``fastest_one_run``."""
    setup = (hf_best.get("setups") or {}).get(rung)
    ladder_rows = [v for v in summary.values() if v]
    if not setup or not ladder_rows:
        return None
    multiple = int(rung.split("x")[0])
    budget = setup["max_steps"] * setup["batch_size"] * setup["block_size"]
    suffix = rung_suffix(rung)
    model = suffix if suffix not in ("", "unique") else None  # a larger model's rung, e.g. 54x-3x192
    params = (non_embedding_params(setup["n_layer"], setup["n_embd"], setup.get("model_type", "gpt2"),
                                   setup.get("n_head")) if model else ladder_rows[0]["non_embedding_params"])
    target = families["hf-best"]["final_eval_loss"]
    mine = families["recipe"]
    curves = [r["curve"] for r in hf_best.get("runs", {}).values() if r["rung"] == rung and r["family"] == "recipe"
              and json.dumps(r["config"], sort_keys=True) == json.dumps(mine["best"], sort_keys=True)]
    unique = rung.endswith("-unique")
    # the complete-run measure interpolates between complete runs of one recipe: this winner's settings where
    # they ran at other budgets (the transfer's source winner, each at its own lr), else the ladder's recipe,
    # which ran on the ladder's model and corpus only
    same = complete_runs_of(hf_best, mine["best"], rung)
    alone = (unique or model is not None) and not same  # no other complete runs of this corpus or model
    with_this = {**({m: loss for m, (loss, _) in same.items()} if same else finals), multiple: mine["final_eval_loss"]}
    complete = None if alone else complete_run_budget(with_this, target) / multiple
    fastest = fastest_one_run(hf_best, rung, target, budget)
    # hf-best's own winner as complete runs at shorter budgets of this model or corpus: were one to end under its
    # full-length loss, the complete-run ratio would compare the recipe's best length with hf-best's worse one
    theirs = complete_runs_of(hf_best, families["hf-best"]["best"], rung, family="hf-best")
    return {**({"fastest_one_run": fastest} if fastest else {}),"target_eval_loss": target, "hf_best": families["hf-best"]["best"],
            "search_complete": families["hf-best"].get("complete", True) and mine.get("complete", True),
            "transfer_from": families["hf-best"].get("transfer_from"), "tokens": budget,
            "tokens_per_param": budget / params, "model": model, "non_embedding_params": params,
            "hf_tuned_eval_loss": None, "recipe_token_ratio": None,
            "recipe_complete_run_ratio": complete, "corpus": "unique" if unique else "stdlib",
            "hf_best_multiples": sorted({int(r["rung"].split("x")[0]) for r in hf_best.get("runs", {}).values()
                                         if r["family"] == "hf-best" and rung_suffix(r["rung"]) == suffix}),
            **({"hf_best_complete_runs": {m: loss for m, (loss, _) in sorted(theirs.items())},
                "hf_best_complete_run_lrs": {m: lr for m, (_, lr) in sorted(theirs.items())},
                "hf_best_shorter_run_lower": any(loss < target for loss, _ in theirs.values())} if theirs else {}),
            **({} if alone else {"complete_runs": dict(sorted(with_this.items())),
                                 "complete_runs_of": "these settings" if same else "the ladder's recipe"}),
            **({"complete_run_lrs": {**{m: lr for m, (_, lr) in sorted(same.items())},
                                     multiple: peak_lr(mine["best"])}} if same else {}),
            "recipe_complete_run_extrapolated": not alone and not (min(with_this.values()) <= target <= max(with_this.values())),
            "long_horizon_recipe": mine["best"], "long_horizon_eval_loss": mine["final_eval_loss"],
            "long_horizon_token_ratio": (statistics.median(crossing(c, target, "tokens") for c in curves) / budget
                                         if curves else math.nan)}


def versus_hf_best_trend(rows: dict[str, Any], summary: dict[str, Any]) -> dict[str, Any]:
    """Both measures against hf-best, each fitted as log10(ratio) against log10(tokens per parameter) over the
    budgets whose hf-best search has finished (a complete-run ratio only where it interpolates): factor per 4x
    budget."""
    out: dict[str, Any] = {}
    for name, key in (("one_run", "recipe_token_ratio"), ("complete_runs", "recipe_complete_run_ratio")):
        xs, ys = [], []
        for rung, r in rows.items():
            if not r.get("search_complete", True) or r.get("corpus", "stdlib") != "stdlib" or r.get("model"):
                continue  # hf-best not found yet there (its loss is not the target), or another corpus or model
            v = r.get(key)
            if v is None and key == "recipe_token_ratio":  # beyond the ladder: the recipe there is the winner's
                v = r.get("long_horizon_token_ratio")
            v = math.nan if v is None else v
            if not (0 < v < math.inf) or (key == "recipe_complete_run_ratio" and r["recipe_complete_run_extrapolated"]):
                continue
            xs.append(math.log10(r["tokens_per_param"] if rung not in summary else summary[rung]["tokens_per_param"]))
            ys.append(math.log10(v))
        line = fit_line(xs, ys)
        if line:
            out[name] = {**line, "change_per_4x_budget": 4 ** line["slope"]}
    return out


def hf_best_points(rows: dict[str, Any], summary: dict[str, Any]) -> dict[str, list[tuple[float, float, bool]]]:
    """The plot's points against hf-best, budgets whose search has finished: (tokens per parameter, ratio,
    extrapolated), one series per recipe so that no line joins two recipes' points. ``one_run`` and
    ``complete_runs``: the ladder's recipe (``gpt2_tiny``) at its budgets; ``searched_one_run`` and
    ``searched_complete_runs``: the fastest searched recipe at each budget (``fastest_one_run``; beyond the
    ladder, the 16x winners with their lr swept)."""
    out: dict[str, list[tuple[float, float, bool]]] = {"one_run": [], "complete_runs": [], "searched_one_run": [],
                                                        "searched_complete_runs": []}
    for rung, r in rows.items():
        if not r.get("search_complete", True) or r.get("corpus", "stdlib") != "stdlib" or r.get("model"):
            continue
        tpp = summary[rung]["tokens_per_param"] if summary.get(rung) else r["tokens_per_param"]
        on_ladder = r.get("recipe_token_ratio") is not None
        fastest = r.get("fastest_one_run") or {}
        points = (("one_run", r.get("recipe_token_ratio"), False),
                  ("complete_runs", r.get("recipe_complete_run_ratio") if on_ladder else None,
                   bool(r.get("recipe_complete_run_extrapolated"))),
                  ("searched_one_run", fastest.get("token_ratio", r.get("long_horizon_token_ratio")), False),
                  ("searched_complete_runs", fastest.get("complete_run_ratio") if on_ladder
                   else r.get("recipe_complete_run_ratio"),
                   bool(fastest.get("complete_run_extrapolated") if on_ladder
                        else r.get("recipe_complete_run_extrapolated"))))
        for measure, value, extrapolated in points:
            if value is not None and 0 < value < math.inf:
                out[measure].append((tpp, value, extrapolated))
    return {k: sorted(v) for k, v in out.items()}


def hf_best_markdown(rows: dict[str, Any], tr: Optional[dict[str, Any]] = None) -> str:
    if not rows:
        return ""
    lines = ["", "Against hf-best (the Trainer's own knobs swept by coordinate descent: benchmarks/hf_best.py):", "",
             "| budget | recipe's tokens to hf-best's loss, one run | complete run: budget ratio | long-horizon recipe, "
             "one run | hf-best loss | hf-tuned loss | long-horizon recipe loss |", "|---|---|---|---|---|---|---|"]
    for rung, r in rows.items():
        complete = ("n/a" if r["recipe_complete_run_ratio"] is None else _fmt(r["recipe_complete_run_ratio"])
                    + (" (extrapolated)" if r["recipe_complete_run_extrapolated"] else ""))
        one = ("n/a (not on the ladder)" if r["recipe_token_ratio"] is None else
               "never reached" if r["recipe_token_ratio"] == math.inf else f"**{_fmt(r['recipe_token_ratio'])}**")
        lh = r.get("long_horizon_token_ratio")
        lh_cell = "n/a" if lh is None else "never reached" if lh == math.inf else f"**{_fmt(lh)}**"
        running = "" if r.get("search_complete", True) else " (search running: best so far)"
        if r.get("transfer_from"):
            running += f" ({r['transfer_from']} winners, lr swept)"
        if r.get("corpus", "stdlib") != "stdlib":
            running += " (no repeats)"
        if r.get("model"):
            running += (f" (GPT-2 {r['model']}, {r['non_embedding_params'] / 1e6:.2f}M non-embedding parameters, "
                        f"{r['tokens_per_param']:.1f} tokens/param)")
        lines.append(f"| {rung}{running} | {one} | {complete} | {lh_cell} | {_fmt(r['target_eval_loss'], 4)} "
                     f"| {_fmt(r['hf_tuned_eval_loss'], 4)} | {_fmt(r.get('long_horizon_eval_loss', math.nan), 4)} |")
    for rung, r in rows.items():
        f = r.get("fastest_one_run")
        if f and r.get("long_horizon_recipe") and f["config"] != r["long_horizon_recipe"]:
            diff = ", ".join(f"{k} {v}" for k, v in f["config"].items() if r["long_horizon_recipe"].get(k) != v)
            other = f" ({f['ns_dtype_other']} with Muon's Newton-Schulz in fp32)" if f["ns_dtype_other"] else ""
            complete = ""
            if f.get("complete_run_ratio") is not None:
                lrs = f.get("complete_run_lrs") or {}
                runs = ", ".join(f"{m}x {_fmt(v, 4)}" + (f" at lr {lrs[m]:g}" if m in lrs else "")
                                 for m, v in f["complete_runs"].items())
                each = ", each budget at its best lr run" if lrs else ""
                complete = (f" By complete runs of these settings ({runs}{each}): "
                            f"**{_fmt(f['complete_run_ratio'])}** of the budget"
                            + (" (extrapolated)." if f["complete_run_extrapolated"] else "."))
            lines.append(f"\nAt {rung}, fastest inside one run of the recipe settings with {f.get('min_seeds', 2)} or more seeds: "
                         f"the long-horizon recipe with {diff}, **{_fmt(f['token_ratio'])}** (median of {f['seeds']} "
                         f"seeds{other}: {', '.join(_fmt(x) for x in f['token_ratios'])}), final loss "
                         f"{_fmt(f['eval_loss'], 4)} (median).{complete}")
    for rung, r in rows.items():
        if r.get("complete_runs_of") == "these settings":
            at = r.get("complete_run_lrs") or {}
            runs = ", ".join(f"{m}x {_fmt(v, 4)}" + (f" at lr {at[m]:g}" if m in at else "")
                             for m, v in r["complete_runs"].items())
            ran = ", ".join(f"{m}x" for m in r.get("hf_best_multiples") or [])
            whole = rung.split("-")[0]
            theirs = r.get("hf_best_complete_runs") or {}
            if not theirs:
                caveat = f"hf-best ran at: {ran}; on a repeated corpus a shorter run of either may end lower"
            else:
                lrs = r.get("hf_best_complete_run_lrs") or {}
                shorter = ", ".join(f"{m}x {_fmt(v, 4)} at lr {lrs[m]:g}" for m, v in theirs.items())
                caveat = (f"hf-best's winner as complete runs at shorter budgets: {shorter}; "
                          + ("one ends under its full-length loss, so the ratio compares the recipe's best length "
                             "with a worse one of hf-best's" if r.get("hf_best_shorter_run_lower") else
                             f"none ends under its {whole} loss, {_fmt(r['target_eval_loss'], 4)}"))
            lines.append(f"\nAt {rung}, complete runs of the long-horizon recipe's settings ({runs}) give the complete-run "
                         f"ratio against hf-best's {whole} loss ({caveat}).")
    for name, label in (("one_run", "one run"), ("complete_runs", "complete runs")):
        fit = (tr or {}).get(name)
        if fit:
            lines.append(f"\nTrend against hf-best, {label}: a factor {fit['change_per_4x_budget']:.2f} per 4x budget "
                         f"({fit['points']} budgets).")
    return "\n".join(lines) + "\n"


def budget_main(ns: argparse.Namespace, command: str) -> dict[str, Any]:
    """``budget``: the budgets' sweeps (``--report``: only the report), recorded as run by ``command``."""
    try:
        multiples = [int(x) for x in ns.budgets.split(",") if x.strip()]
        unique = [int(x) for x in ns.unique_budgets.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--budgets / --unique-budgets: {ns.budgets!r} / {ns.unique_budgets!r}: comma-separated integers")
    if not multiples or min(multiples) < 1 or ns.seeds < 1 or ns.jobs < 1 or ns.threads < 1:
        raise UsageError("--budgets need integers >= 1; --seeds, --jobs and --threads must be >= 1")
    base_steps = 2 if ns.quick else BASE_STEPS
    rungs = {rung_name(m): (m, "stdlib") for m in multiples}
    rungs.update({rung_name(m, "unique"): (m, "unique") for m in unique if m in multiples})
    setups = {r: budget_setup(m, ns.quick, base_steps) for r, (m, _) in rungs.items()}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / f"{ns.name}.json")
    if ns.report:  # every budget with runs in the file, not only the ones named
        for r in ledger.data["runs"].values():
            m, corpus = int(r["rung"].split("x")[0]), ("unique" if r["rung"].endswith("-unique") else "stdlib")
            if rung_name(m, corpus) == r["rung"] and r["rung"] not in rungs:
                rungs[r["rung"]] = (m, corpus)
                setups[r["rung"]] = budget_setup(m, ns.quick, base_steps)
        rungs = dict(sorted(rungs.items(), key=lambda kv: (kv[1][1] != "stdlib", kv[1][0])))
        return budget_report(ledger, rungs, setups, out, ns.name)
    if not ns.quick:
        n = import_earlier(ledger, RESULTS, budget_setup(1))
        if n:
            print(f"[ladder] imported {n} earlier 1x runs", flush=True)
    ledger.data["command"] = command
    env = environment_info()
    env["argv"] = [display_path(a) if Path(a).is_absolute() else a for a in env.get("argv", [])]
    ledger.data["environment"] = env
    ledger.data["setups"] = {r: dataclasses.asdict(s) for r, s in setups.items()}
    ledger.save()
    first = next(iter(setups.values()))
    corpora = {"stdlib": prepare_data(data_args(first))}
    if any(c == "unique" for _, c in rungs.values()):
        most = max(m for m, c in rungs.values() if c == "unique")
        corpora["unique"] = unique_corpus_data(first, most * base_steps * first.tokens_per_step)
        print(f"[ladder] unique corpus: {len(corpora['unique'][1]['train']) * first.block_size / 1e6:.1f}M "
              f"training tokens (stdlib alone: {len(corpora['stdlib'][1]['train']) * first.block_size / 1e6:.1f}M)",
              flush=True)
    _SHARED["data"] = {r: corpora[c] for r, (_, c) in rungs.items()}
    grids = {o: ([1e-3, 2e-3] if ns.quick and o == "adamw" else [8e-3, 1.6e-2] if ns.quick else FIRST_GRID[o])
             for o in BUDGET_OPTIMIZERS}
    # (rung, seed) phases: seed 0 of every budget first, so a ladder cut short still spans the budgets
    stdlib_rungs = [r for r, (_, c) in rungs.items() if c == "stdlib"]
    phases = phase_order(stdlib_rungs, [r for r, (_, c) in rungs.items() if c == "unique"], ns.seeds)
    with tempfile.TemporaryDirectory(prefix="budget-ladder-") as work:  # before the pool forks: workers inherit it
        _SHARED.update(setups=setups, work=work)
        with worker_pool(ns.jobs, ns.threads) as pool:
            for rung, seed, which in phases:
                multiple, corpus = rungs[rung]
                while not STOP:
                    runs = list(ledger.data["runs"].values())
                    points: set[tuple[str, float]] = set()
                    centre: dict[str, float] = {}
                    for o in BUDGET_OPTIMIZERS:
                        if corpus == "unique":  # the stdlib budget's best lr
                            lr = best_lr(runs, rung_name(multiple), o)
                            points |= {(o, lr)} if lr else set()
                            continue
                        # centred on the previous budget's best lr over its seed-0 runs (stable across reruns)
                        seed0 = [r for r in runs if r["seed"] == 0]
                        prev = [m for m in multiples if m < multiple and best_lr(seed0, rung_name(m), o)]
                        grid = centred_grid(best_lr(seed0, rung_name(max(prev)), o)) if prev else grids[o]
                        centre[o] = grid[len(grid) // 2]
                        have = {float(r["lr"]) for r in runs if r["rung"] == rung and r["optimizer"] == o}
                        points |= {(o, lr) for lr in have | set(grid)}
                    # each optimizer's expected best first, so a ladder cut short has the pair that matters
                    order = sorted(points, key=lambda p: (abs(math.log2(p[1] / centre.get(p[0], p[1]))), p))
                    jobs = [(rung, o, lr, seed) for o, lr in order
                            if run_key(rung, o, lr, seed) not in ledger.data["runs"]]
                    if seed > 0 and corpus == "stdlib":  # later seeds: only at the lrs seed 0 ran
                        seed0 = [r for r in runs if r["rung"] == rung and r["seed"] == 0]
                        keep = {(r["optimizer"], float(r["lr"])) for r in seed0}
                        if which == "best":
                            keep = {(o, best_lr(seed0, rung, o)) for o in BUDGET_OPTIMIZERS}
                        jobs = [j for j in jobs if (j[1], j[2]) in keep]
                    run_and_record(ledger, pool, jobs)
                    if corpus == "unique" or seed > 0:
                        break
                    runs = list(ledger.data["runs"].values())
                    extra = []
                    extended = ledger.data.setdefault("extensions", {})
                    for o in BUDGET_OPTIMIZERS:
                        seed0 = [r for r in runs if r["seed"] == 0]
                        new = edge_extension(sweep_losses(seed0, rung, o))
                        if new is not None and extended.get(f"{rung}|{o}", 0) < ns.max_extend:
                            extended[f"{rung}|{o}"] = extended.get(f"{rung}|{o}", 0) + 1
                            extra.append((rung, o, new, 0))
                    if not extra:
                        break
                    # run the extensions now, side by side (the next loop picks them up from the ledger)
                    run_and_record(ledger, pool, extra, note=" (edge)")
                budget_report(ledger, rungs, setups, out, ns.name)
    return budget_report(ledger, rungs, setups, out, ns.name)


# --- The size ladder: larger models at a budget that grows with size -------------------------------------
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


def size_steps(n_params: int, ref_params: int, base_steps: int = BASE_STEPS, multiple: int = STEP_MULTIPLE) -> int:
    """Optimizer steps at a fixed batch: ``base_steps * sqrt(n_params / ref_params)``, rounded to ``multiple``."""
    return max(multiple, multiple * round(base_steps * math.sqrt(n_params / ref_params) / multiple))


def size_setup(rung: Rung, quick: bool = False) -> Setup:
    base = QUICK if quick else Setup()
    shape = {k: v for k, v in rung.shape.items()}
    setup = dataclasses.replace(base, **shape)
    if not quick and rung.name not in GPU_RUNGS:
        n = non_embedding_params(setup.n_layer, setup.n_embd, setup.model_type, setup.n_head, setup.n_kv_head)
        ref = non_embedding_params(2, 128, "gpt2", 4)
        setup.max_steps = size_steps(n, ref)
        setup.eval_steps = setup.max_steps // STEP_MULTIPLE
    return setup


# Step-time ratio: both optimizers side by side in one process
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


def summarise_size(runs: list[dict[str, Any]], rung: str) -> Optional[dict[str, Any]]:
    """Best lr per optimizer, loss at budget, and Muon's tokens to AdamW's best final loss as a ratio."""
    mine = [r for r in runs if r["rung"] == rung]
    if not mine:
        return None
    first = mine[0]
    tokens = first["max_steps"] * first["tokens_per_step"]
    rows, target = sweep_summary(mine, rung, sorted({r["optimizer"] for r in mine}), tokens)
    out: dict[str, Any] = {"optimizers": rows, "max_steps": first["max_steps"], "tokens": tokens}
    if target is not None:
        out["target_eval_loss"] = target
    return out

GPT2_SMALL_NON_EMBEDDING = 84_934_656 + 12 * 12_288 + 12 * 7_680  # 12 x 768 matrices + biases + norms (approx)


def size_trend(summary: dict[str, Any], setups: dict[str, Setup]) -> dict[str, Any]:
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


# Earlier runs of the same setup
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


def size_markdown(summary: dict[str, Any], step_times: dict[str, Any], tr: dict[str, Any]) -> str:
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
        seeds = min(row["seeds_at_best"] for row in s["optimizers"].values())
        imported = " imported" if s.get("imported") else ""
        lines.append(
            f"| {name} ({seeds} seed{'s' if seeds != 1 else ''}{imported}) | {s['non_embedding_params'] / 1e6:.2f}M | {s['tokens'] / 1e6:.2f}M "
            f"| {lr_cell(a, _fmt)} | {_fmt(a['final_eval_loss'], 4) if a else 'n/a'} "
            f"| {lr_cell(m, _fmt)} | {_fmt(m['final_eval_loss'], 4) if m else 'n/a'} "
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


def size_plot(summary: dict[str, Any], setups: dict[str, Setup], tr: dict[str, Any], path: Path) -> None:
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
    sweep_plot(ax2, summary, {"adamw": "C0", "muon": "C1"}, lambda n: "o" if setups[n].model_type == "gpt2" else "s",
               lambda n: 0.35 + 0.65 * setups[n].n_embd / 256)
    ax2.set_xlabel("peak lr (blue AdamW, orange Muon; darker = wider)")
    ax2.set_title("lr sweeps per rung")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def size_report(ledger: Ledger, rungs: dict[str, Rung], setups: dict[str, Setup], out: Path, name: str) -> dict[str, Any]:
    runs = list(ledger.data["runs"].values())
    summary = {}
    for n in rungs:
        s = summarise_size(runs, n)
        if s:
            st = setups[n]
            s["non_embedding_params"] = non_embedding_params(st.n_layer, st.n_embd, st.model_type, st.n_head, st.n_kv_head)
            s["shape"] = dataclasses.asdict(st)
            s["imported"] = any("imported_from" in r for r in runs if r["rung"] == n)
        summary[n] = s
    tr = size_trend(summary, setups)
    ledger.data["summary"], ledger.data["trend"] = summary, tr
    side = out / f"{name}_step_time.json"  # written by --step-time-only (another process: its own file)
    step_times = {**(json.loads(side.read_text()) if side.exists() else {}), **ledger.data["step_time"]}
    table = size_markdown(summary, step_times, tr)
    env = ledger.data.get("environment") or machine_info()
    machine = env["cuda_devices"][0] if env.get("cuda_devices") else f"{env['cpu_count']}-core CPU ({env['processor']})"
    header = (f"Machine: {machine}, shared with other jobs (token counts do not depend on load; step-time ratios were "
              f"measured side by side in one process). torch {env['torch']}, transformers {env['transformers']}.\n"
              f"Command: `{ledger.data.get('command', 'python -m benchmarks.ladder size')}`\n\n"
              f"Budget: tokens = {BASE_STEPS} steps x 2048 x sqrt(N / N(gpt2-2x128)), N = non-embedding parameters. "
              f"Loss = median over seeds of the final eval loss; ratio = Muon's tokens to AdamW's best final loss "
              f"(median over seeds, at Muon's best lr) / the budget (AdamW reaches that loss at the budget); "
              f"* marks the best lr; (~x): the vertex of a parabola through the best lr and its neighbours in "
              f"log(lr), used for the lr trend.\n\n")
    write_report(ledger, out, name, header + table, lambda path: size_plot(summary, setups, tr, path))
    return {"summary": summary, "trend": tr, "table": table}


def size_main(ns: argparse.Namespace, command: str) -> dict[str, Any]:
    """``size``: the model sizes' sweeps (``--report``: only the report; ``--step-time-only``: only the step-time
    ratios), recorded as run by ``command``."""
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
    setups = {n: size_setup(r, ns.quick) for n, r in rungs.items()}
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / f"{ns.name}.json")
    for path in ns.imports:
        print(f"[ladder] imported {import_runs(ledger, Path(path), setups)} runs from {path}", flush=True)
    if ns.step_time_only:
        side = out / f"{ns.name}_step_time.json"
        set_threads(ns.threads)
        for n, st in setups.items():
            done = json.loads(side.read_text()) if side.exists() else {}
            if n in done:
                continue
            done[n] = step_time_ratio(st, steps=ns.step_time_steps or 20)
            side.write_text(json.dumps(done, indent=1))
            print(f"[ladder] {n}: Muon/AdamW step time {done[n]['step_ratio']:.3f} "
                  f"(optimizer step alone {done[n]['optimizer_ratio']:.2f})", flush=True)
        return done
    if ns.report:
        return size_report(ledger, rungs, setups, out, ns.name)
    set_threads(ns.threads)  # the step-time ratios run here
    ledger.data["command"] = command
    ledger.data["environment"] = machine_info()
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
        with worker_pool(ns.jobs, ns.threads) as pool:
            for name, rung in rungs.items():
                if STOP:
                    break
                if ns.step_time_steps and name not in ledger.data["step_time"]:
                    ledger.data["step_time"][name] = step_time_ratio(setups[name], steps=ns.step_time_steps)
                    ledger.save()
                    print(f"[ladder] {name}: Muon/AdamW step time {ledger.data['step_time'][name]['step_ratio']:.3f} "
                          f"(optimizer step alone {ledger.data['step_time'][name]['optimizer_ratio']:.2f})", flush=True)
                base = {o: list(rung.grids[o]) for o in optimizers}
                extra: set[tuple[str, float]] = set()
                while not STOP:
                    runs = [r for r in ledger.data["runs"].values() if r["rung"] == name]
                    points = {(o, float(lr)) for o in optimizers for lr in base[o]} | extra
                    points |= {(r["optimizer"], float(r["lr"])) for r in runs if r["optimizer"] in optimizers}
                    jobs = [(name, o, lr, seed) for seed in range(ns.seeds) for o, lr in sorted(points)
                            if run_key(name, o, lr, seed) not in ledger.data["runs"]]
                    run_and_record(ledger, pool, jobs)
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
                        for r in in_order(pool, _run_one, [(name, o, best, 0)]):
                            checks[key] = {"imported": ledger.data["runs"][key]["final_eval_loss"],
                                           "rerun": r["final_eval_loss"], "rerun_cpu_seconds": r["cpu_seconds"]}
                            ledger.save()
                            print(f"[ladder] check {key}: imported {checks[key]['imported']:.4f}, rerun "
                                  f"{checks[key]['rerun']:.4f}", flush=True)
                size_report(ledger, rungs, setups, out, ns.name)
    return size_report(ledger, rungs, setups, out, ns.name)


# --- The command ----------------------------------------------------------------------------------------
LADDERS = {"budget": (budget_main, "budget_ladder"), "size": (size_main, "scaling")}  # axis -> (its run, its files)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ladder", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False)
    axes = p.add_subparsers(dest="axis", required=True, metavar="{budget,size}")
    b = axes.add_parser("budget", allow_abbrev=False, help="longer runs of GPT-2 2x128: AdamW against the recipe",
                        description="The budget ladder: AdamW against the recipe at multiples of the 1x budget.")
    b.add_argument("--budgets", default="1,2,4,8,16",
                   help="comma-separated multiples of the 1x budget (300 steps); --report adds every budget the "
                        "JSON holds runs of")
    b.add_argument("--unique-budgets", default="16",
                   help="budgets also run on the corpus that does not repeat, at each optimizer's best lr there "
                        "(empty: none)")
    b.add_argument("--seeds", type=int, default=2)
    b.add_argument("--max-extend", type=int, default=1, help="grid extensions (x2 or /2) when the best lr is at an edge")
    b.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (results do not depend on it)")
    b.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    b.add_argument("--report", action="store_true", help="only rebuild the table and plot from the JSON")
    b.add_argument("--quick", action="store_true", help="tiny smoke ladder (1-layer-ish model, 2-step budget, 1 seed)")
    b.add_argument("--out", default=str(RESULTS))
    b.add_argument("--name", default="budget_ladder", help="basename of the output files")
    s = axes.add_parser("size", allow_abbrev=False, help="larger models: AdamW against Muon",
                        description="The size ladder: AdamW against Muon at each model size.")
    s.add_argument("--sizes", default=None, help=f"comma-separated rungs, in order (default: all); known: {', '.join(RUNGS)}")
    s.add_argument("--optimizers", default="adamw,muon", help="comma-separated: adamw (hf-tuned), muon")
    s.add_argument("--seeds", type=int, default=2)
    s.add_argument("--max-extend", type=int, default=2, help="grid extensions (x2 or /2) when the best lr is at an edge")
    s.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (results do not depend on it)")
    s.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    s.add_argument("--step-time-steps", type=int, default=20, help="alternating steps per optimizer for the step-time ratio (0: skip)")
    s.add_argument("--report", action="store_true", help="only rebuild the table and plot from the JSON")
    s.add_argument("--step-time-only", action="store_true",
                   help="only measure the Muon/AdamW step-time ratio of each rung, into <name>_step_time.json "
                        "(safe beside a running ladder)")
    s.add_argument("--import", dest="imports", action="append", default=[], metavar="JSON",
                   help="add the hf-tuned@LR and Muon runs of an earlier time_to_loss / optimizer_lr_sweep JSON "
                        "whose setup is a rung's (repeatable); they are marked imported_from")
    s.add_argument("--quick", action="store_true", help="tiny smoke ladder (two 1-layer rungs, 1 seed)")
    s.add_argument("--out", default=str(RESULTS))
    s.add_argument("--name", default="scaling", help="basename of the output files")
    return p


def main(argv=None, command: Optional[str] = None) -> dict[str, Any]:
    """``python -m benchmarks.ladder {budget,size} [options]``; ``command`` is what the ledger records as the command
    (default ``python -m benchmarks.ladder <axis>``; the old commands record their own names)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = make_parser().parse_args(argv)
    run, _ = LADDERS[ns.axis]
    rest = argv[argv.index(ns.axis) + 1:]
    result = run(ns, display_command(command or f"python -m benchmarks.ladder {ns.axis}", rest))
    if "table" in result:
        print(result["table"])
    return result


if __name__ == "__main__":
    run_cli(main)
