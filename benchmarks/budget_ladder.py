#!/usr/bin/env python
"""Budget ladder: does the recipe's gain over tuned AdamW hold when the run is 4x and 16x longer?

    nice -n 10 python -m benchmarks.budget_ladder --jobs 2     # the ladder (resumable: rerun to continue)
    python -m benchmarks.budget_ladder --budgets 1,4           # some budgets only
    python -m benchmarks.budget_ladder --report                # table + plot from the JSON, no training
    python -m benchmarks.budget_ladder --quick --out /tmp/x    # a smoke run (the test suite uses it)

The model and data are the time-to-loss setup (benchmarks._harness.lm): GPT-2 2x128 (0.40M
non-embedding parameters) on the stdlib corpus, vocab 4096, 16 x 128-token rows per step, eval on the
same 128 held-out rows 12 times per run. One budget is ``multiple x 300`` optimizer steps (1x = the
headline's 0.61M tokens, about 1.5 tokens per parameter; 4x about 6; 16x about 24, past Chinchilla's 20).
Each run is complete at its budget: the warmup is a fraction of the run (2%), the cosine reaches its
10% floor at the run's end, and sequence-length warmup spans 30% of the run's tokens.

Two optimizers, each at its own swept peak lr:
- ``adamw``: the ``hf-tuned`` arm (transformers.Trainer, AdamW, 2% warmup, cosine to 10%, wd 0.1,
  beta2 0.95, clip 1);
- ``recipe``: the ``fasttrain`` arm (FastTrainer: Muon on the hidden matrices + AdamW on the rest, the
  same warmup and cosine, divergence guard, EMA of the weights, sequence-length warmup 16 -> 128).

Per budget and optimizer: 3 peak lrs a factor 2 apart, centred on the previous budget's best (the
first budget on the time-to-loss sweeps' best), extended by a factor 2 when the best is at an edge;
``--seeds`` seeds per lr. Order (a ladder cut short keeps what matters most): seed 0 of every budget;
then the later seeds at each budget's best lrs; then the corpus that does not repeat; then the later
seeds at the other lrs. Reported per budget: each optimizer's best lr and final eval loss (median over
seeds), and the recipe's tokens to AdamW's best final loss divided by the budget. Then two fits:
log(ratio) against log(tokens per parameter), and log(best lr) against log(budget) per optimizer.

Repeated data: the stdlib corpus holds about 3.3M training tokens, so 4x (2.5M) reads 0.75 of it and 16x
(9.8M) reads it about 3 times. The ``unique`` corpus (``--unique-budgets``) adds Python sources of the installed
packages (transformers, torch, ...) until the budget is covered without repeats; the tokenizer and the
held-out rows are the stdlib corpus's, so losses stay comparable. It runs each optimizer at the best
lr of the same budget on the stdlib corpus (``--unique-budgets``, default 16).

Resumable: each run's result is written to the JSON as it ends; a rerun skips every finished run.
AdamW's 1x runs are the time-to-loss lr sweep's (results/lr_sweep_hf_tuned.json, imported through
results/scaling.json's gpt2-2x128 rung), the recipe's 1x runs at 1.6e-2 are the headline's
(results/time_to_loss_runs); both are marked ``imported_from``.
Writes budget_ladder.json, .md and .png into --out (benchmarks/results).
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

from hf_fasttrain.run import prepare_data
from hf_fasttrain.runinfo import environment_info

from benchmarks._harness import RESULTS, UsageError, display_command, display_path, fmt as _fmt, run_cli
from benchmarks._harness.budget import BASE_STEPS, budget_setup, data_args, unique_corpus_data
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.long_runs import summarise as summarise_search
from benchmarks._harness.lm import ARMS, Setup, crossing, load_saved_run, non_embedding_params, run_arm
from benchmarks._harness.lm import run_key as saved_run_key
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


# --- The corpus that does not repeat -------------------------------------------------------------------
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


def complete_run_budget(finals: dict[int, float], target: float) -> float:
    """The budget (a multiple) at which a complete run ends at ``target``: ``finals`` maps the multiples of the
    complete runs to their final losses; linear interpolation of the loss in log budget between the two runs that
    bracket ``target``, extrapolation from the nearest two outside them (inf with fewer than two runs).

    The optimizer literature's measure of a speed-up (Wen et al. 2025, arXiv:2509.02046), beside the crossing
    inside one run.

    Example:
        >>> round(complete_run_budget({1: 3.973, 4: 3.245, 16: 2.808}, 3.746), 3)   # recipe runs vs AdamW at 4x
        1.541
        >>> complete_run_budget({27: 2.429, 54: 2.446}, 2.501)   # the shorter run ends lower: at most 27
        27.0
    """
    pts = sorted((math.log(m), loss) for m, loss in finals.items() if math.isfinite(loss))
    if len(pts) < 2:
        return math.inf
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if min(y0, y1) <= target <= max(y0, y1) and y0 != y1:
            return math.exp(x0 + (y0 - target) / (y0 - y1) * (x1 - x0))
    below = target > pts[0][1]  # the shortest complete run already ends under the target
    (x0, y0), (x1, y1) = (pts[:2] if below else pts[-2:])
    if y1 >= y0:  # the loss did not fall with the budget there: no budget is found by extending it
        return math.exp(x0) if below else math.inf  # below: at most the shortest run's budget (a bound)
    return math.exp(x0 + (y0 - target) / (y0 - y1) * (x1 - x0))


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


def fastest_one_run(hf_best: dict[str, Any], rung: str, target: float, budget: float,
                    min_seeds: int = 2) -> Optional[dict[str, Any]]:
    """Of the recipe settings run at ``rung`` with at least ``min_seeds`` seeds, the one that reaches ``target``
    soonest inside a run (median over its seeds): the search decides by the final loss, and a setting can end
    level and still get there much sooner. None without such a setting. Where the same settings also ran as
    complete runs at other budgets of the ladder's model and corpus (``hf_best --budget 8 --config ...``), the
    row also gives the complete-run measure for them: ``complete_runs`` (multiple -> median final loss) and
    ``complete_run_ratio`` (:func:`complete_run_budget` over this budget's multiple)."""
    by_config: dict[str, list] = {}
    for r in (hf_best.get("runs") or {}).values():
        if r["rung"] == rung and r["family"] == "recipe" and r.get("curve"):
            by_config.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r)
    rows = [{"config": rs[0]["config"], "seeds": len(rs),
             "token_ratio": statistics.median(crossing(r["curve"], target, "tokens") for r in rs) / budget,
             "token_ratios": sorted(crossing(r["curve"], target, "tokens") / budget for r in rs),
             "eval_loss": statistics.median(r["final_eval_loss"] for r in rs),
             "ns_dtype_other": sum(bool(r.get("ns_dtype")) for r in rs), "min_seeds": min_seeds}
            for rs in by_config.values() if len(rs) >= min_seeds]
    if not rows:
        return None
    best = min(rows, key=lambda x: (x["token_ratio"], x["eval_loss"]))
    if "-" not in rung:  # the ladder's model and corpus: complete runs of the same settings at other budgets
        chosen = complete_runs_of(hf_best, best["config"], rung)
        if chosen:
            multiple = int(rung.split("x")[0])
            finals = {**{m: loss for m, (loss, _) in chosen.items()}, multiple: best["eval_loss"]}
            lrs = {**{m: lr for m, (_, lr) in chosen.items()}, multiple: peak_lr(best["config"])}
            best["complete_runs"] = dict(sorted(finals.items()))
            if len(set(lrs.values())) > 1:
                best["complete_run_lrs"] = dict(sorted(lrs.items()))
            best["complete_run_ratio"] = complete_run_budget(finals, target) / multiple
            best["complete_run_extrapolated"] = not (min(finals.values()) <= target <= max(finals.values()))
    return best


def _rung_suffix(rung: str) -> str:
    """What a rung name says beside its budget: ``""`` on the ladder, ``3x192`` (a model), ``unique`` (a corpus)."""
    return rung.split("-", 1)[1] if "-" in rung else ""


def complete_runs_of(hf_best: dict[str, Any], config: dict[str, Any], rung: str,
                     family: str = "recipe") -> dict[int, tuple[float, float]]:
    """``family``'s ``config`` settings as complete runs at ``rung``'s other budgets, on its model and corpus (the
    ladder's, or a larger model's such as ``27x-3x192`` beside ``54x-3x192``): multiple -> (median final loss over
    the seeds, peak lr). Each budget counts at its own tuned lr, as complete runs are compared in the optimizer
    literature: the budget's search or walk winner where that is these settings, else the lr that ended lowest
    there (at a budget with one lr, that lr, untuned: the ratio then leans against the family)."""
    key = _settings_key(config)
    suffix = _rung_suffix(rung)
    by_multiple: dict[int, dict[float, list]] = {}
    for r in (hf_best.get("runs") or {}).values():
        if (r["family"] == family and _rung_suffix(r["rung"]) == suffix and r["rung"] != rung
                and _settings_key(r["config"]) == key):
            by_lr = by_multiple.setdefault(int(r["rung"].split("x")[0]), {})
            by_lr.setdefault(peak_lr(r["config"]), []).append(r["final_eval_loss"])
    chosen = {}
    for m, by_lr in sorted(by_multiple.items()):
        name = f"{m}x-{suffix}" if suffix else f"{m}x"
        winner = ((hf_best.get("summary") or {}).get(name) or {}).get(family, {}).get("best")
        if winner and _settings_key(winner) == key and peak_lr(winner) in by_lr:
            chosen[m] = (statistics.median(by_lr[peak_lr(winner)]), peak_lr(winner))
        else:
            chosen[m] = min((statistics.median(v), lr) for lr, v in by_lr.items())
    return chosen


def peak_lr(config: dict[str, Any]) -> float:
    """A recipe setting's peak lr: its ``lr`` times its ``lr_scale`` (the walk's factor), rounded for equality."""
    return float(f"{config.get('lr', 0.0) * config.get('lr_scale', 1.0):.6g}")


def _settings_key(config: dict[str, Any]) -> str:
    """A recipe setting apart from its peak lr: the same settings run at another lr share it."""
    return json.dumps({k: v for k, v in config.items() if k not in ("lr", "lr_scale")}, sort_keys=True)


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
    suffix = _rung_suffix(rung)
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
                                         if r["family"] == "hf-best" and _rung_suffix(r["rung"]) == suffix}),
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


def hf_best_points(rows: dict[str, Any], summary: dict[str, Any]) -> dict[str, list[tuple[float, float, bool]]]:
    """The plot's points against hf-best, budgets whose search has finished: (tokens per parameter, ratio,
    extrapolated) per measure; one run is the ladder's recipe, or the recipe's winner beyond the ladder."""
    out: dict[str, list[tuple[float, float, bool]]] = {"one_run": [], "complete_runs": []}
    for rung, r in rows.items():
        if not r.get("search_complete", True) or r.get("corpus", "stdlib") != "stdlib" or r.get("model"):
            continue
        tpp = summary[rung]["tokens_per_param"] if summary.get(rung) else r["tokens_per_param"]
        one = r["recipe_token_ratio"] if r.get("recipe_token_ratio") is not None else r.get("long_horizon_token_ratio")
        if one is not None and 0 < one < math.inf:
            out["one_run"].append((tpp, one, False))
        whole = r.get("recipe_complete_run_ratio")
        if whole is not None and 0 < whole < math.inf:
            out["complete_runs"].append((tpp, whole, bool(r.get("recipe_complete_run_extrapolated"))))
    return {k: sorted(v) for k, v in out.items()}


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
                    label="vs hf-tuned, one run" if corpus == "stdlib" else "vs hf-tuned, one run, no repeated data")
    pts = hf_best_points(best_rows or {}, summary)
    for measure, colour, label in (("one_run", "C3", "vs hf-best, one run"),
                                   ("complete_runs", "C2", "vs hf-best, complete runs (hollow: extrapolated)")):
        if pts[measure]:
            xs, ys, extra = zip(*pts[measure])
            ax.plot(xs, ys, color=colour, lw=1, label=label)
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
    hb_path = out / "hf_best.json"
    best_rows = {}
    if hb_path.exists():  # summarised here from its runs: a search still running has written no summary yet
        hb = json.loads(hb_path.read_text())
        view = type("View", (), {"data": hb})()
        hb["summary"] = {r: summarise_search(view, r) for r in {run["rung"] for run in hb.get("runs", {}).values()}}
        best_rows = versus_hf_best(summary, runs, hb)
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
