#!/usr/bin/env python
"""Budget ladder: does the recipe's gain over tuned AdamW hold when the run is 4x and 16x longer?

    nice -n 10 python -m benchmarks.budget_ladder --jobs 2     # the ladder (resumable: rerun to continue)
    python -m benchmarks.budget_ladder --budgets 1,4           # some budgets only
    python -m benchmarks.budget_ladder --report                # table + plot from the JSON, no training
    python -m benchmarks.budget_ladder --quick --out /tmp/x    # a smoke run (the test suite uses it)

The model and data are the time-to-loss setup (``benchmarks._harness.lm``): GPT-2 2x128 on the stdlib corpus,
16 x 128-token rows per step, 12 evals on the same held-out rows. A budget is ``multiple x 300`` optimizer steps;
each run is complete at its budget (2% warmup, the cosine at its 10% floor at the end, sequence-length warmup over
30% of the tokens). Two optimizers: ``adamw`` (the ``hf-tuned`` arm) and ``recipe`` (the ``fasttrain`` arm).

Per budget and optimizer: 3 peak lrs a factor 2 apart, centred on the previous budget's best, extended by a factor
2 when the best is at an edge; ``--seeds`` seeds per lr, in the order of ``phase_order``. The ``unique`` corpus
(``--unique-budgets``) adds Python sources of the installed packages so the budget is covered without repeats, at
the stdlib budget's best lrs. Reported per budget: each optimizer's best lr and final eval loss (median over seeds),
the recipe's tokens to AdamW's best final loss over the budget, two log-log fits, and the rows against hf-best read
from hf_best.json.

Resumable: each run is written to the JSON as it ends; a rerun skips every finished run. Earlier 1x runs are taken
over (``imported_from``). Writes budget_ladder.json, .md and .png into --out (benchmarks/results).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.budget_ladder [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import concurrent.futures
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

from hf_fasttrain.data.front import prepare_data
from hf_fasttrain.runinfo import environment_info

from benchmarks._harness import RESULTS, UsageError, display_command, display_path, fmt as _fmt, run_cli
from benchmarks._harness.budget import BASE_STEPS, budget_setup, data_args, unique_corpus_data
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import ARMS, Setup, crossing, load_saved_run, non_embedding_params, run_arm
from benchmarks._harness.lm import run_key as saved_run_key
from benchmarks._harness.long_run_compare import (complete_run_budget, hf_best_points, versus_hf_best,
                                                 versus_hf_best_trend)
from benchmarks._harness.long_runs import search_ledger
from benchmarks._harness.sweeps import edge_extension, fit_line, interpolated_best_lr, sweep_losses

OPTIMIZERS = {"adamw": "hf-tuned", "recipe": "fasttrain"}  # ledger name -> time_to_loss arm
FIRST_GRID = {"adamw": [1e-3, 2e-3, 4e-3], "recipe": [8e-3, 1.6e-2, 3.2e-2]}
CHINCHILLA_TOKENS_PER_PARAM = 20  # Hoffmann et al. 2022


def rung_name(multiple: int, corpus: str = "stdlib") -> str:
    return f"{multiple}x" + ("" if corpus == "stdlib" else f"-{corpus}")


def ledger_key(rung: str, optimizer: str, lr: float, seed: int) -> str:
    return f"{rung}|{optimizer}|{lr:g}|{seed}"


def arm_for(optimizer: str, lr: float):
    base = ARMS[OPTIMIZERS[optimizer]]
    return dataclasses.replace(base, name=f"{base.name}@{lr:g}", args={**base.args, "learning_rate": lr})


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


# --- Imports of earlier runs of the 1x setup --------------------------------------------------------------
def import_earlier(ledger: Ledger, results: Path, setup: Setup) -> int:
    """AdamW's 1x runs from scaling.json (rung gpt2-2x128) and the recipe's from time_to_loss_runs/."""
    added = 0
    sc = results / "scaling.json"
    if sc.exists() and setup == Setup():
        for r in json.loads(sc.read_text())["runs"].values():
            if r.get("rung") == "gpt2-2x128" and r["optimizer"] == "adamw":
                key = ledger_key("1x", "adamw", r["lr"], r["seed"])
                if key not in ledger.data["runs"]:
                    ledger.data["runs"][key] = {**r, "rung": "1x", "imported_from": r.get("imported_from", "scaling.json")}
                    added += 1
    saved = results / "time_to_loss_runs"
    for seed in range(3):
        key = ledger_key("1x", "recipe", ARMS["fasttrain"].args["learning_rate"], seed)
        path = saved / f"fasttrain-seed{seed}.json"
        r = load_saved_run(path, saved_run_key(ARMS["fasttrain"], seed, setup)) if path.exists() else None
        if r and key not in ledger.data["runs"]:
            ledger.data["runs"][key] = {**r, "rung": "1x", "optimizer": "recipe", "lr": ARMS["fasttrain"].args["learning_rate"],
                                        "max_steps": setup.max_steps, "tokens_per_step": setup.tokens_per_step,
                                        "imported_from": "time_to_loss_runs/" + path.name}
            added += 1
    return added


# --- Summary -----------------------------------------------------------------------------------------------
def summarise_budget(runs: list[dict[str, Any]], rung: str, n_params: int) -> Optional[dict[str, Any]]:
    """Best lr and loss per optimizer; the recipe's tokens to AdamW's best final loss, over the budget."""
    mine = [r for r in runs if r["rung"] == rung]
    if not mine:
        return None
    tokens = mine[0]["max_steps"] * mine[0]["tokens_per_step"]
    out: dict[str, Any] = {"tokens": tokens, "max_steps": mine[0]["max_steps"], "tokens_per_param": tokens / n_params,
                           "optimizers": {}}
    for opt in OPTIMIZERS:
        losses = sweep_losses(mine, rung, opt)
        if not losses:
            continue
        best = min(losses, key=losses.get)
        out["optimizers"][opt] = {
            "final_eval_loss_by_lr": {f"{lr:g}": v for lr, v in losses.items()}, "best_lr": best,
            "best_lr_interpolated": interpolated_best_lr(losses), "final_eval_loss": losses[best],
            "best_at_edge": len(losses) > 1 and best in (min(losses), max(losses)),
            "seeds_at_best": sum(1 for r in mine if r["optimizer"] == opt and r["lr"] == best)}
    if "adamw" in out["optimizers"]:
        target = out["optimizers"]["adamw"]["final_eval_loss"]
        out["target_eval_loss"] = target
        for opt, row in out["optimizers"].items():
            at_best = [r for r in mine if r["optimizer"] == opt and r["lr"] == row["best_lr"]]
            toks = [crossing(r["curve"], target, "tokens") for r in at_best]
            row["tokens_to_target"] = statistics.median(toks)
            row["seeds_reaching_target"] = sum(math.isfinite(t) for t in toks)
            row["token_ratio_vs_adamw"] = row["tokens_to_target"] / tokens  # AdamW reaches its own loss at the budget
            # the lr (of those swept) that reaches the target first: not always the one with the best final loss
            by_lr = {}
            for lr in {r["lr"] for r in mine if r["optimizer"] == opt}:
                runs_lr = [r for r in mine if r["optimizer"] == opt and r["lr"] == lr]
                by_lr[lr] = statistics.median(crossing(r["curve"], target, "tokens") for r in runs_lr)
            fastest = min(by_lr, key=by_lr.get)
            row["fastest_lr"], row["fastest_token_ratio"] = fastest, by_lr[fastest] / tokens
    return out


def trend(summary: dict[str, Any]) -> dict[str, Any]:
    """log10(recipe's token ratio) against log10(tokens per parameter); log2(best lr) against log2(budget)."""
    xs, ys, budgets, best = [], [], [], {o: [] for o in OPTIMIZERS}
    for s in summary.values():
        if not s or s.get("corpus", "stdlib") != "stdlib" or set(OPTIMIZERS) - set(s["optimizers"]):
            continue
        ratio = s["optimizers"]["recipe"].get("token_ratio_vs_adamw", math.nan)
        xs.append(math.log10(s["tokens_per_param"]))
        ys.append(math.log10(ratio) if 0 < ratio < math.inf else math.nan)
        budgets.append(math.log2(s["multiple"]))
        for opt in OPTIMIZERS:
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


def markdown(summary: dict[str, Any], tr: dict[str, Any]) -> str:
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
            interp = row.get("best_lr_interpolated")
            best = f"{row['best_lr']:g}" + (" (edge)" if row["best_at_edge"] else f" (~{interp:.2g})" if interp else "")
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
    for opt in OPTIMIZERS:
        if f"{opt}_lr_change_per_4x_budget" in tr:
            text += f"{opt} best lr changes by a factor {tr[f'{opt}_lr_change_per_4x_budget']:.2f} per 4x budget.\n"
    return text


def plot(summary: dict[str, Any], path: Path, best_rows: Optional[dict[str, Any]] = None) -> None:
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
    for name, s in summary.items():
        if not s:
            continue
        for opt, colour in (("adamw", "C0"), ("recipe", "C1")):
            row = s["optimizers"].get(opt)
            if row:
                lrs = [float(x) for x in row["final_eval_loss_by_lr"]]
                ax2.plot(lrs, list(row["final_eval_loss_by_lr"].values()), marker="o", color=colour,
                         alpha=0.3 + 0.7 * min(1.0, math.log2(s["multiple"] + 1) / 4), lw=1)
                ax2.annotate(name, (row["best_lr"], row["final_eval_loss"]), fontsize=6)
    ax2.set_xscale("log")
    ax2.set_xlabel("peak lr (blue AdamW, orange recipe; darker = longer)")
    ax2.set_ylabel("final eval loss (median of seeds)")
    ax2.set_title("lr sweeps per budget")
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(ledger: Ledger, rungs: dict[str, tuple[int, str]], setups: dict[str, Setup], out: Path, name: str):
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
    tr = trend(summary)
    hb = search_ledger(out / "hf_best.json")
    best_rows = versus_hf_best(summary, runs, hb) if hb is not None else {}
    best_trend = versus_hf_best_trend(best_rows, summary)
    ledger.data["summary"], ledger.data["trend"], ledger.data["versus_hf_best"] = summary, tr, best_rows
    ledger.data["trend_versus_hf_best"] = best_trend
    table = markdown(summary, tr) + hf_best_markdown(best_rows, best_trend)
    env = ledger.data.get("environment") or environment_info()
    machine = f"{env['cpu_count']}-core x86_64 CPU" if not env.get("cuda_devices") else env["cuda_devices"][0]
    header = (f"Machine: {machine}, shared with other jobs (token counts do not depend on load). "
              f"torch {env['torch']}, transformers {env['transformers']}.\n\n"
              f"Command: `{ledger.data.get('command', 'python -m benchmarks.budget_ladder')}`\n\n"
              f"Model: GPT-2 2x128 ({n_params / 1e6:.2f}M non-embedding parameters); budget = multiple x {BASE_STEPS} steps "
              f"x 2048 tokens. Loss = median over seeds of the final eval loss; ratio = the recipe's tokens to AdamW's "
              f"best final loss (median over seeds, at the recipe's best lr) / the budget, and in brackets the ratio at "
              f"the recipe's lr that gets there first when that is another; * marks the best lr; (~x): "
              f"the vertex of a parabola through the best lr and its neighbours in log(lr). The stdlib corpus holds "
              f"about 3.3M training tokens: 16x reads it about 3 times; `-unique` rows train on it plus package "
              f"sources, with no repeats.\n\n")
    ledger.save()
    (out / f"{name}.md").write_text(header + table)
    try:
        plot(summary, out / f"{name}.png", best_rows)
    except Exception as e:  # a plot must not lose the results
        print(f"[budget_ladder] plot failed: {e}", flush=True)
    return {"summary": summary, "trend": tr, "table": table}


# --- Runs ----------------------------------------------------------------------------------------------
_SHARED: dict[str, Any] = {}


def _init_worker(threads: int) -> None:
    if not torch.cuda.is_available():
        torch.set_num_threads(threads)


def _run_one(job: tuple[str, str, float, int]) -> dict[str, Any]:
    rung, optimizer, lr, seed = job
    setup = _SHARED["setups"][rung]
    tokenizer, lm = _SHARED["data"][_SHARED["corpus_of"][rung]]
    cpu0 = time.process_time()
    r = run_arm(arm_for(optimizer, lr), seed, setup, tokenizer, lm, Path(_SHARED["work"]))
    r.update(rung=rung, optimizer=optimizer, lr=lr, cpu_seconds=time.process_time() - cpu0,
             max_steps=setup.max_steps, tokens_per_step=setup.tokens_per_step)
    return r


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--budgets", default="1,2,4,8,16",
                   help="comma-separated multiples of the 1x budget (300 steps); --report adds every budget the "
                        "JSON holds runs of")
    p.add_argument("--unique-budgets", default="16",
                   help="budgets also run on the corpus that does not repeat, at each optimizer's best lr there "
                        "(empty: none)")
    p.add_argument("--seeds", type=int, default=2)
    p.add_argument("--max-extend", type=int, default=1, help="grid extensions (x2 or /2) when the best lr is at an edge")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (results do not depend on it)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    p.add_argument("--report", action="store_true", help="only rebuild the table and plot from the JSON")
    p.add_argument("--quick", action="store_true", help="tiny smoke ladder (1-layer-ish model, 2-step budget, 1 seed)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="budget_ladder", help="basename of the output files")
    return p


def main(argv=None) -> dict[str, Any]:
    ns = make_parser().parse_args(argv)
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
        result = report(ledger, rungs, setups, out, ns.name)
        print(result["table"])
        return result
    if not ns.quick:
        n = import_earlier(ledger, RESULTS, budget_setup(1))
        if n:
            print(f"[budget_ladder] imported {n} earlier 1x runs", flush=True)
    _init_worker(ns.threads)
    ledger.data["command"] = display_command("python -m benchmarks.budget_ladder", argv if argv is not None else sys.argv[1:])
    env = environment_info()
    env["argv"] = [display_path(a) if Path(a).is_absolute() else a for a in env.get("argv", [])]
    ledger.data["environment"] = env
    ledger.data["setups"] = {r: dataclasses.asdict(s) for r, s in setups.items()}
    ledger.save()
    first = next(iter(setups.values()))
    _SHARED["data"] = {"stdlib": prepare_data(data_args(first))}
    _SHARED["corpus_of"] = {r: c for r, (_, c) in rungs.items()}
    if any(c == "unique" for _, c in rungs.values()):
        most = max(m for m, c in rungs.values() if c == "unique")
        _SHARED["data"]["unique"] = unique_corpus_data(first, most * base_steps * first.tokens_per_step)
        print(f"[budget_ladder] unique corpus: {len(_SHARED['data']['unique'][1]['train']) * first.block_size / 1e6:.1f}M "
              f"training tokens (stdlib alone: {len(_SHARED['data']['stdlib'][1]['train']) * first.block_size / 1e6:.1f}M)",
              flush=True)
    grids = {o: ([1e-3, 2e-3] if ns.quick and o == "adamw" else [8e-3, 1.6e-2] if ns.quick else FIRST_GRID[o])
             for o in OPTIMIZERS}
    # (rung, seed) phases: seed 0 of every budget first, so a ladder cut short still spans the budgets
    stdlib_rungs = [r for r, (_, c) in rungs.items() if c == "stdlib"]
    phases = phase_order(stdlib_rungs, [r for r, (_, c) in rungs.items() if c == "unique"], ns.seeds)
    with tempfile.TemporaryDirectory(prefix="budget-ladder-") as work:  # before the pool forks: workers inherit it
        _SHARED.update(setups=setups, work=work)
        ctx = multiprocessing.get_context("fork")
        pool = (concurrent.futures.ProcessPoolExecutor(ns.jobs, mp_context=ctx, initializer=_init_worker,
                                                       initargs=(ns.threads,)) if ns.jobs > 1 else None)
        try:
            for rung, seed, which in phases:
                multiple, corpus = rungs[rung]
                while True:
                    runs = list(ledger.data["runs"].values())
                    points: set[tuple[str, float]] = set()
                    centre: dict[str, float] = {}
                    for o in OPTIMIZERS:
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
                            if ledger_key(rung, o, lr, seed) not in ledger.data["runs"]]
                    if seed > 0 and corpus == "stdlib":  # later seeds: only at the lrs seed 0 ran
                        seed0 = [r for r in runs if r["rung"] == rung and r["seed"] == 0]
                        keep = {(r["optimizer"], float(r["lr"])) for r in seed0}
                        if which == "best":
                            keep = {(o, best_lr(seed0, rung, o)) for o in OPTIMIZERS}
                        jobs = [j for j in jobs if (j[1], j[2]) in keep]
                    futures = [pool.submit(_run_one, j) for j in jobs] if pool else None
                    done = concurrent.futures.as_completed(futures) if pool else (None for _ in jobs)
                    for i, f in enumerate(done):
                        r = f.result() if pool else _run_one(jobs[i])
                        ledger.data["runs"][ledger_key(rung, r["optimizer"], r["lr"], r["seed"])] = r
                        ledger.save()  # each run is kept as soon as it ends
                        print(f"[budget_ladder] {rung} {r['optimizer']:>6s} lr {r['lr']:<8g} seed {r['seed']}: final eval "
                              f"loss {r['final_eval_loss']:.4f} ({r['cpu_seconds']:.0f} CPU-s, "
                              f"{r['train_seconds']:.0f} s training)", flush=True)
                    if corpus == "unique" or seed > 0:
                        break
                    runs = list(ledger.data["runs"].values())
                    extra = []
                    extended = ledger.data.setdefault("extensions", {})
                    for o in OPTIMIZERS:
                        seed0 = [r for r in runs if r["seed"] == 0]
                        new = edge_extension(sweep_losses(seed0, rung, o))
                        if new is not None and extended.get(f"{rung}|{o}", 0) < ns.max_extend:
                            extended[f"{rung}|{o}"] = extended.get(f"{rung}|{o}", 0) + 1
                            extra.append((rung, o, new, 0))
                    if not extra:
                        break
                    # run the extensions now, side by side (the next loop picks them up from the ledger)
                    results = ([f.result() for f in [pool.submit(_run_one, j) for j in extra]] if pool
                               else [_run_one(j) for j in extra])
                    for r in results:
                        ledger.data["runs"][ledger_key(rung, r["optimizer"], r["lr"], r["seed"])] = r
                        ledger.save()
                        print(f"[budget_ladder] {rung} {r['optimizer']:>6s} lr {r['lr']:<8g} seed 0 (edge): final "
                              f"eval loss {r['final_eval_loss']:.4f}", flush=True)
                report(ledger, rungs, setups, out, ns.name)
        finally:
            if pool:
                pool.shutdown(wait=True, cancel_futures=True)
    result = report(ledger, rungs, setups, out, ns.name)
    print(result["table"])
    return result


if __name__ == "__main__":
    run_cli(main)
