#!/usr/bin/env python
"""The gain across width: the recipe against hf-best at widths 128, 256 and 512, the same tokens per parameter.

    nice -n 10 python -m benchmarks.transfer_gain                       # 0.1 tokens per parameter, widths 128-512
    nice -n 10 python -m benchmarks.transfer_gain --tokens-per-param 0.2 --widths 128,256
    python -m benchmarks.transfer_gain --report                         # tables from the JSON only

The model, data and batch are the transfer study's (``benchmarks.transfer``: a 2-layer GPT-2, head size 32, 8 rows
of 64 tokens a step, the embedded corpus). Each width trains ``--tokens-per-param`` x its non-embedding parameters.
Two arms, each tuned at the smallest width and carried to the wider ones by its own transfer rule:

- ``recipe``: the tiny recipe's settings (the ``fasttrain`` arm: Muon, cosine to 10%, the divergence guard, the EMA
  of the weights, the sequence-length warmup) with ``parameterization: mup`` based at the smallest width. muP
  holds the lr across width at equal tokens; a wider width here also trains more tokens, so its peak lr is carried
  as lr x (tokens / base tokens)^k, with k the mean exponent ``budget_aware``'s table measured for Muon under muP
  (``hf_fasttrain.config.budget.LR_BY_TOKENS``; ``--recipe-tokens-exponent`` overrides it, 0 carries it unchanged).
- ``hf-best``: the Trainer with hf-best's options (AdamW, warmup-stable-decay, beta2 0.999, wd 0.1, clip 1); its
  peak lr is carried as lr x (width / base)^a, with a the slope of log2 best lr against log2 width that the
  transfer study measured for standard AdamW (``transfer.json``; ``--hf-exponent`` overrides it).

At the smallest width each arm's lr walks a factor-2 grid until the best is inside it. At the widest width each arm
also runs its carried lr x 1/2 and x 2: the walk the carried setting is judged against. Reported per width: each
arm's final eval loss, the tokens the recipe needs to reach hf-best's final loss (interpolated between evaluations)
and their ratio to hf-best's tokens. At the widest width the ratio is also given between the best runs of the two
walks. Each run is saved into ``<out>/<name>.json`` as it ends, keyed by its settings: rerun to continue.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.transfer_gain [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import dataclasses
import json
import math
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from benchmarks._harness import RESULTS, UsageError, display_command, display_path, machine_info, run_cli
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import FASTTRAIN_EXTRA, HF_BEST, MUON_RECIPE, Arm, crossing, run_key
from benchmarks._harness.sweeps import fit_line
from benchmarks.transfer import (BATCH, BLOCK, MAX_EXTEND, ArmSweep, _non_embedding, gain_tables as tables,
                                 width_setup)
from hf_fasttrain.config.budget import LR_BY_TOKENS

__all__ = ["ARMS", "WIDTHS", "steps_for", "gain_arm", "hf_exponent", "recipe_tokens_exponent", "carried_lr", "summarise", "main"]

WIDTHS = (128, 256, 512)
TOKENS_PER_PARAM = 0.1  # 630K tokens at width 512: about 10-20 minutes a run on one CPU core
EVALS = 8  # evaluations after the one at the start: the recipe's curve is read between them
ARMS = ("recipe", "hf-best")
# the first grid's centre: Muon-muP's best lr at width 128 in the transfer study (0.025, rounded to the grid) and
# hf-best's AdamW lr
START_LR = {"recipe": 3.2e-2, "hf-best": 2e-3}


def steps_for(width: int, tokens_per_param: float) -> int:
    """Optimizer steps of 8 x 64 tokens that train ``tokens_per_param`` x the width's non-embedding parameters."""
    return max(EVALS, round(tokens_per_param * _non_embedding(width) / (BATCH * BLOCK)))


def gain_arm(name: str, width: int, lr: float, base_width: int) -> Arm:
    """The arm ``name`` at ``width`` and peak ``lr``; the recipe's muP is based at ``base_width``."""
    if name == "recipe":
        args = {**MUON_RECIPE, **FASTTRAIN_EXTRA, "learning_rate": lr,
                "optimizer_kwargs": {"parameterization": "mup", "base_width": base_width}}
        return Arm(f"recipe@w{width}", f"the tiny recipe with muP based at width {base_width}, lr {lr:g}",
                   fast=True, args=args)
    if name == "hf-best":
        return Arm(f"hf-best@w{width}", f"Trainer, hf-best's options, lr {lr:g}", fast=False,
                   args={**HF_BEST, "learning_rate": lr})
    raise UsageError(f"--arms: unknown arm {name!r}; known: {', '.join(ARMS)}")


def hf_exponent(transfer: dict[str, Any]) -> Optional[float]:
    """The slope of log2 best lr against log2 width of standard AdamW in the transfer study's summary (the
    embedded corpus, 1x tokens); None where the study has fewer than two widths of it."""
    arm = (((transfer.get("summary") or {}).get("transfer") or {}).get("python") or {}).get("1", {}).get("adamw")
    if not arm:
        return None
    pts = [(int(w), row["best_lr"]) for w, row in arm["widths"].items() if row.get("best_lr")]
    line = fit_line([math.log2(w) for w, _ in pts], [math.log2(lr) for _, lr in pts])
    return line["slope"] if line else None


def recipe_tokens_exponent() -> float:
    """The mean over widths of the exponent of Muon-muP's best lr against tokens in ``budget_aware``'s table."""
    ks = list(LR_BY_TOKENS["families"]["muon"]["exponents"].values())
    return sum(ks) / len(ks)


def carried_lr(arm: str, base_lr: float, width: int, base_width: int, exponent: float,
               tokens_exponent: float = 0.0, tokens_per_param: float = TOKENS_PER_PARAM) -> float:
    """The lr an arm carries from ``base_width`` to ``width``: for the recipe (muP) scaled by the run's tokens over
    the base width's to the ``tokens_exponent``; for hf-best by (width / base)^exponent."""
    if arm == "recipe":
        ratio = steps_for(width, tokens_per_param) / steps_for(base_width, tokens_per_param)
        return base_lr * ratio ** tokens_exponent
    return base_lr * (width / base_width) ** exponent


def _ratio(recipe_run: dict[str, Any], hf_run: dict[str, Any]) -> dict[str, Any]:
    target = hf_run["final_eval_loss"]
    tokens = crossing(recipe_run["curve"], target, "tokens")
    hf_tokens = hf_run["curve"][-1]["tokens"]
    return {"target_eval_loss": target, "recipe_tokens_to_target": tokens if math.isfinite(tokens) else None,
            "hf_best_tokens": hf_tokens, "tokens_ratio": tokens / hf_tokens if math.isfinite(tokens) else None}


def summarise(data: dict[str, Any]) -> dict[str, Any]:
    """Per width: the carried runs of both arms and the recipe's token ratio; at the widest width the walks."""
    plan = data.get("plan") or {}
    runs = data["runs"]
    rows: dict[str, Any] = {}
    for w in plan.get("widths", []):
        carried = {arm: plan["carried"].get(arm, {}).get(str(w)) for arm in ARMS}
        got = {arm: runs.get(key) for arm, key in carried.items() if key}
        if len(got) < len(ARMS):
            continue
        row = {"tokens": got["hf-best"]["tokens"], "steps": got["hf-best"]["steps"],
               "non_embedding_params": _non_embedding(w),
               **{f"{arm}_lr": got[arm]["lr"] for arm in ARMS},
               **{f"{arm}_final_eval_loss": got[arm]["final_eval_loss"] for arm in ARMS},
               **_ratio(got["recipe"], got["hf-best"])}
        # the walk: this width's runs of the arm at the carried lr x 1/2, x 1 and x 2 (read from the runs, so two
        # processes may each run a part of it)
        walk_runs = {arm: sorted((r for r in runs.values() if r["arm"] == arm and r["width"] == w
                                  and any(math.isclose(r["lr"], got[arm]["lr"] * 2.0 ** k, rel_tol=1e-9)
                                          for k in (-1, 0, 1))), key=lambda r: r["lr"]) for arm in ARMS}
        walks = {arm: {f"{r['lr']:.3g}": r["final_eval_loss"] for r in rs} for arm, rs in walk_runs.items()}
        if w == plan["widths"][-1] and any(len(v) > 1 for v in walks.values()):
            best = {arm: min(walk_runs[arm], key=lambda r: r["final_eval_loss"]) for arm in ARMS}
            row["walk"] = walks
            row["walk_missing"] = {arm: [f"{got[arm]['lr'] * 2.0 ** k:.3g}" for k in (-1, 1)
                                         if not any(math.isclose(r["lr"], got[arm]["lr"] * 2.0 ** k, rel_tol=1e-9)
                                                    for r in walk_runs[arm])] for arm in ARMS}
            row["carried_above_walk_best_pct"] = {
                arm: 100 * (got[arm]["final_eval_loss"] / best[arm]["final_eval_loss"] - 1) for arm in ARMS}
            if not any(row["walk_missing"].values()):
                row["walk_best"] = ({f"{arm}_lr": best[arm]["lr"] for arm in ARMS}
                                    | _ratio(best["recipe"], best["hf-best"]))
        rows[str(w)] = row
    # the recipe at the base width's lr unchanged (muP alone), where such a run is in the ledger
    unchanged = {}
    base_lr = (plan.get("base_lrs") or {}).get("recipe")
    for w in plan.get("widths", [])[1:]:
        hf_key = plan["carried"].get("hf-best", {}).get(str(w))
        same = [r for k, r in runs.items() if r["arm"] == "recipe" and r["width"] == w and r["lr"] == base_lr
                and k != plan["carried"]["recipe"].get(str(w))]
        if same and hf_key in runs:
            unchanged[str(w)] = {"lr": base_lr, "final_eval_loss": same[0]["final_eval_loss"],
                                 **_ratio(same[0], runs[hf_key])}
    ratios = [(int(w), r["tokens_ratio"]) for w, r in rows.items() if r["tokens_ratio"] is not None]
    change = (ratios[-1][1] - ratios[0][1]) if len(ratios) > 1 else None
    return {"widths": rows, "tokens_per_param": plan.get("tokens_per_param"), "hf_exponent": plan.get("hf_exponent"),
            "recipe_tokens_exponent": plan.get("recipe_tokens_exponent"), "recipe_lr_unchanged": unchanged,
            "base_lrs": plan.get("base_lrs"), "ratio_change_smallest_to_widest": change}


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [(int(w), r["tokens_ratio"]) for w, r in summary["widths"].items() if r["tokens_ratio"] is not None]
    fig, ax = plt.subplots(figsize=(5, 3.5))
    if pts:
        ax.plot([w for w, _ in pts], [r for _, r in pts], "o-", label="carried settings")
    walk = [(int(w), r["walk_best"]["tokens_ratio"]) for w, r in summary["widths"].items()
            if r.get("walk_best", {}).get("tokens_ratio") is not None]
    if walk:
        ax.plot([w for w, _ in walk], [r for _, r in walk], "s", label="best of each walk")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("width")
    ax.set_ylabel("recipe's tokens / hf-best's tokens")
    ax.set_title(f"Token ratio at {summary.get('tokens_per_param')} tokens per parameter")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(ledger: Ledger, out: Path, name: str) -> dict[str, Any]:
    summary = summarise(ledger.data)
    ledger.data["summary"] = summary
    ledger.save()
    text = tables(summary)
    (out / f"{name}.md").write_text("Commands:\n\n" + "\n".join(f"- `{c}`" for c in ledger.data.get("commands", []))
                                    + "\n\n" + text + "\n")
    plot(summary, out / f"{name}.png")
    print(text)
    study = out / "transfer.json"
    if name == "transfer_gain" and study.exists():  # the study page's section on the gain, from the same JSON
        from benchmarks import transfer

        page = transfer.PAGE if out.resolve() == RESULTS.resolve() else None
        transfer.report(Ledger(study), out, "transfer", page)
    return summary


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transfer_gain", allow_abbrev=False,
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)),
                   help="comma-separated widths (multiples of 32); the smallest is where both arms are tuned")
    p.add_argument("--tokens-per-param", type=float, default=TOKENS_PER_PARAM,
                   help="tokens trained per non-embedding parameter at every width")
    p.add_argument("--hf-exponent", type=float, default=None,
                   help="hf-best's lr ~ width^a; default: the slope the transfer study measured for standard AdamW")
    p.add_argument("--recipe-tokens-exponent", type=float, default=None,
                   help="the recipe's lr ~ tokens^k from the smallest width's run; default: budget_aware's measured "
                        "Muon-muP exponent (mean over its widths)")
    p.add_argument("--walk", default="-1,1",
                   help="the widest width's lr walk: the carried lr x 2^k for these k (comma-separated; -1,1 runs "
                        "the walk; a part of it, e.g. 1, lets a second process run beside the first)")
    p.add_argument("--walk-arms", default=",".join(ARMS), help="the arms whose walk runs (comma-separated)")
    p.add_argument("--max-extend", type=int, default=MAX_EXTEND, help="grid growths at an edge at the smallest width")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (one run at a time)")
    p.add_argument("--report", action="store_true", help="rebuild the tables and the PNG from the JSON; no training")
    p.add_argument("--out", default=str(RESULTS), help="folder of <name>.json, .md, .png")
    p.add_argument("--name", default="transfer_gain", help="basename of the output files")
    return p


class Runner:
    def __init__(self, ledger: Ledger, tokens_per_param: float, base_width: int):
        self.ledger, self.tpp, self.base, self._data = ledger, tokens_per_param, base_width, None

    def run(self, arm_name: str, width: int, lr: float) -> dict[str, Any]:
        from benchmarks._harness.lm import data_arguments, run_arm

        steps = steps_for(width, self.tpp)
        setup = dataclasses.replace(width_setup(width, steps), eval_steps=max(1, steps // EVALS))
        arm = gain_arm(arm_name, width, lr, self.base)
        key = run_key(arm, 0, setup)
        if key not in self.ledger.data["runs"]:
            if self._data is None:
                from hf_fasttrain.data.front import prepare_data

                self._data = prepare_data(data_arguments(setup))
            tokenizer, lm = self._data
            with tempfile.TemporaryDirectory(prefix="transfer-gain-") as work:
                r = run_arm(arm, 0, setup, tokenizer, lm, Path(work))
            r.update(arm=arm_name, width=width, lr=lr, steps=steps, tokens=steps * setup.tokens_per_step, key=key)
            self.ledger.data["runs"][key] = r
            self.ledger.save()
            print(f"[transfer_gain] {arm_name:>7s} w{width:<4d} lr {lr:<9.3g}: loss {r['final_eval_loss']:.4f}, "
                  f"{r['train_seconds']:.0f} s", flush=True)
        return self.ledger.data["runs"][key] | {"key": key}


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    ns = make_parser().parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / f"{ns.name}.json")
    if ns.report:
        return report(ledger, out, ns.name)
    try:
        widths = sorted({int(w) for w in ns.widths.split(",") if w.strip()})
    except ValueError:
        raise UsageError(f"--widths: {ns.widths!r} is not a comma-separated list of integers") from None
    if len(widths) < 2:
        raise UsageError(f"--widths: {ns.widths!r}; give at least two widths")
    for w in widths:
        width_setup(w)  # a width off the head size fails here, before any training
    try:
        walk = [int(k) for k in ns.walk.split(",") if k.strip()]
    except ValueError:
        raise UsageError(f"--walk: {ns.walk!r} is not a comma-separated list of integers (e.g. -1,1)") from None
    walk_arms = [a.strip() for a in ns.walk_arms.split(",") if a.strip()]
    if not walk_arms or set(walk_arms) - set(ARMS):
        raise UsageError(f"--walk-arms: {ns.walk_arms!r}; allowed: a comma-separated subset of {', '.join(ARMS)}")
    if not ns.tokens_per_param > 0:
        raise UsageError(f"--tokens-per-param: {ns.tokens_per_param}; must be > 0")
    exponent = ns.hf_exponent
    if exponent is None:
        study = out / "transfer.json"
        exponent = hf_exponent(json.loads(study.read_text())) if study.exists() else None
        if exponent is None:
            raise UsageError(f"--hf-exponent: not given and {display_path(study)} has no standard-AdamW widths to "
                             "fit it from; give a number (e.g. -1 for lr ~ 1/width)")
    import torch

    torch.set_num_threads(ns.threads)
    ledger.data["environment"] = machine_info()
    command = display_command("python -m benchmarks.transfer_gain", argv)
    ledger.data.setdefault("commands", [])
    if command not in ledger.data["commands"]:
        ledger.data["commands"].append(command)
    base = widths[0]
    k = recipe_tokens_exponent() if ns.recipe_tokens_exponent is None else ns.recipe_tokens_exponent
    plan = {"widths": widths, "tokens_per_param": ns.tokens_per_param, "hf_exponent": exponent,
            "recipe_tokens_exponent": k,
            "base_lrs": {}, "carried": {a: {} for a in ARMS}, "grid": {a: {} for a in ARMS}}
    ledger.data["plan"] = plan
    runner = Runner(ledger, ns.tokens_per_param, base)
    # 1. tune each arm at the smallest width on a factor-2 grid
    for arm in ARMS:
        grid: dict[float, dict[str, Any]] = {}

        def run(w: int, lr: float, arm=arm, grid=grid) -> float:
            r = runner.run(arm, w, lr)
            grid[lr] = r
            return r["final_eval_loss"] if math.isfinite(r["final_eval_loss"]) else math.inf

        ArmSweep(START_LR[arm], run, ns.max_extend).width(base)
        best = min(grid.values(), key=lambda r: r["final_eval_loss"])
        plan["base_lrs"][arm] = best["lr"]
        plan["carried"][arm][str(base)] = best["key"]
        plan["grid"][arm][str(base)] = {f"{lr:g}": r["final_eval_loss"] for lr, r in sorted(grid.items())}
        ledger.save()
    # 2. carry both to each wider width; 3. at the widest, the walk x 1/2 and x 2 around each carried lr
    for w in widths[1:]:
        for arm in ARMS:
            lr = carried_lr(arm, plan["base_lrs"][arm], w, base, exponent, k, ns.tokens_per_param)
            plan["carried"][arm][str(w)] = runner.run(arm, w, lr)["key"]
            ledger.save()
    w = widths[-1]
    for step in walk:
        for arm in walk_arms:
            lr = carried_lr(arm, plan["base_lrs"][arm], w, base, exponent, k, ns.tokens_per_param)
            runner.run(arm, w, lr * 2.0 ** step)
    return report(ledger, out, ns.name)


if __name__ == "__main__":
    run_cli(main)
