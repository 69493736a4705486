"""The long-run search's tables read from its ledger: per-group ratios, the tokens of one run to a baseline's loss,
Newton-Schulz precision, memorisation, and the curves' plot."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Optional

from benchmarks._harness import RESULTS
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import crossing
from benchmarks._harness.long_run_compare import fastest_one_run
from benchmarks._harness.long_runs import KNOB_DEFAULTS, NOISE, config_key, ladder_best_lr, searched_rungs


def base_ledger() -> dict[str, Any]:
    """hf_best's own ledger in the results folder (empty where it has none): the per-group families' bases."""
    path = RESULTS / "hf_best.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ladder_ledger() -> dict[str, Any]:
    """The budget ladder's ledger in the results folder (empty where it has none)."""
    path = RESULTS / "budget_ladder.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _start_runs(ledger: Ledger, rung: str, family: str) -> list[dict[str, Any]]:
    """The runs a per-group search took over from its base family's winner (its start, every seed)."""
    return [r for r in ledger.data["runs"].values()
            if r["rung"] == rung and r["family"] == family and r.get("imported_from")]


def _winner_runs(base: Optional[dict[str, Any]], rung: str, family: str) -> list[dict[str, Any]]:
    """The runs of ``family``'s searched winner at ``rung`` in ``base`` (an hf_best ledger), every seed."""
    won = (((base or {}).get("searches") or {}).get(rung) or {}).get(family)
    if won is None:
        return []
    return [r for r in base["runs"].values() if r["rung"] == rung and r["family"] == family
            and config_key(r["config"]) == config_key(won["best"])]


def group_ratios(ledger: Ledger, rung: str, summary: dict[str, Any],
                 ladder: Optional[dict[str, Any]] = None, base: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Where the per-group searches ran (``hf-best+``, ``recipe+groups``): each baseline's final loss (hf-best: the
    winner hf-best+ started from; hf-best+: its winner), and for the recipe (the budget ladder's runs at its best
    lr, from ``ladder``, the headline's; the searched winner, recipe+groups' start; recipe+groups' winner), each
    seed's tokens to that loss over the budget (the one-run measure, interpolated between evaluations) and their
    median; empty where neither search ran. Where the per-group family was carried to ``rung`` rather than
    searched there, hf-best and the recipe's searched winner are the base ledger's (``base``) winners."""
    baselines: dict[str, float] = {}
    carried = "hf-best+" in summary or "recipe+groups" in summary
    start = _start_runs(ledger, rung, "hf-best+") or (_winner_runs(base, rung, "hf-best") if carried else [])
    if start:
        baselines["hf-best"] = statistics.median(r["final_eval_loss"] for r in start)
    if "hf-best+" in summary:
        baselines["hf-best+"] = summary["hf-best+"]["final_eval_loss"]
    if not baselines:
        return {}
    arms = {}
    if "hf-best+" in summary:  # an AdamW user's own gain: hf-best+'s tokens to hf-best's loss
        plus = summary["hf-best+"]["best"]
        arms[PLUS_ARM] = [r for r in ledger.data["runs"].values() if r["rung"] == rung and r["family"] == "hf-best+"
                          and config_key(r["config"]) == config_key(plus)]
    best_lr = ladder_best_lr(ladder or {}, rung, "recipe")
    headline = [r for r in (ladder or {}).get("runs", {}).values()
                if r["rung"] == rung and r["optimizer"] == "recipe" and r["lr"] == best_lr]
    if headline:
        arms["recipe (the budget ladder's, at its best lr)"] = headline
    recipe_start = _start_runs(ledger, rung, "recipe+groups") or _winner_runs(base, rung, "recipe")
    if recipe_start:
        arms["recipe (its searched winner)"] = recipe_start
    fastest = _fastest_runs(base, rung, baselines.get("hf-best"))
    if fastest and not (recipe_start and config_key(fastest[0]["config"]) == config_key(recipe_start[0]["config"])):
        arms[FASTEST_ARM] = fastest
    if "recipe+groups" in summary and not (recipe_start and config_key(summary["recipe+groups"]["best"])
                                           == config_key(recipe_start[0]["config"])):  # not the start again
        best = summary["recipe+groups"]["best"]
        arms["recipe+groups"] = [r for r in ledger.data["runs"].values() if r["rung"] == rung
                                 and r["family"] == "recipe+groups" and config_key(r["config"]) == config_key(best)]
    rows = {}
    for arm, runs in arms.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        per = {}
        for baseline, target in baselines.items():
            if arm == PLUS_ARM and baseline == "hf-best+":  # its own loss: 1 by definition
                continue
            ratios = [crossing(r["curve"], target, "tokens") / (r["max_steps"] * r["tokens_per_step"]) for r in runs]
            per[baseline] = {"per_seed": ratios, "median": statistics.median(ratios)}
        rows[arm] = {"seeds": [r["seed"] for r in runs], "config": runs[0].get("config", {"lr": runs[0].get("lr")}),
                     "final_eval_loss": statistics.median(r["final_eval_loss"] for r in runs), "to": per}
    return {"baselines": baselines, "rows": rows}


PLUS_ARM = "hf-best+ (AdamW with per-group lrs)"
# the long-run summary's recipe (budget_ladder's ``fastest_one_run``): where it is not the searched winner
FASTEST_ARM = "recipe (the setting that reaches hf-best's loss soonest)"


def _fastest_runs(base: Optional[dict[str, Any]], rung: str, target: Optional[float]) -> list[dict[str, Any]]:
    """The runs (every seed) of the recipe setting in ``base`` (an hf_best ledger) that reaches ``target``, hf-best's
    loss, soonest inside a run at ``rung`` (:func:`fastest_one_run`, the long-run summary's recipe); empty without
    one."""
    runs = [r for r in ((base or {}).get("runs") or {}).values() if r["rung"] == rung and r["family"] == "recipe"]
    if target is None or not runs:
        return []
    fastest = fastest_one_run(base, rung, target, runs[0]["max_steps"] * runs[0]["tokens_per_step"])
    if fastest is None:
        return []
    return [r for r in runs if config_key(r["config"]) == config_key(fastest["config"])]


def group_ratio_table(ratios: dict[str, Any]) -> str:
    """The markdown of :func:`group_ratios`."""
    if not ratios:
        return ""
    bases = ratios["baselines"]
    out = ["", "Against both baselines: each one's final eval loss (median of its seeds) and each arm's tokens to it "
           "over the budget (median of the seeds; each seed in brackets):", "",
           "| baseline | final eval loss |", "|---|---|"]
    out += [f"| {b} | {loss:.3f} |" for b, loss in bases.items()]
    if ratios["rows"]:
        out += ["", "| arm | final eval loss | seeds | " + " | ".join(f"tokens to {b}'s loss / budget" for b in bases)
                + " |", "|---|---|---|" + "---|" * len(bases)]
        for arm, row in ratios["rows"].items():
            cells = []
            for b in bases:
                to = row["to"].get(b)
                if to is None:
                    cells.append("-")
                    continue
                each = ", ".join("never" if math.isinf(x) else f"{x:.3f}" for x in to["per_seed"])
                cells.append(("never" if math.isinf(to["median"]) else f"{to['median']:.3f}") + f" ({each})")
            out.append(f"| {arm} | {row['final_eval_loss']:.3f} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def group_plot(ledger: Ledger, path: Path, base: Optional[dict[str, Any]] = None) -> Optional[Path]:
    """Eval loss against tokens of each per-group search's start and winner (seed 0), one panel per budget. Where a
    family was carried to a budget (no start of its own), its base family's winner there comes from ``base`` (an
    hf_best ledger, default results/hf_best.json), and the recipe setting that reaches hf-best's loss soonest is
    drawn where it is not the searched winner."""
    base = base_ledger() if base is None else base
    rungs = [r for r in searched_rungs(ledger) if any(f in (ledger.data.get("summary", {}).get(r) or {})
                                                    for f in ("hf-best+", "recipe+groups"))]
    if not rungs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rungs), figsize=(6 * len(rungs), 4.2), squeeze=False)
    for ax, rung in zip(axes[0], rungs):
        summary = ledger.data["summary"][rung]
        for family, label in (("hf-best+", "hf-best"), ("recipe+groups", "recipe")):
            if family not in summary:
                continue
            start = [r for r in _start_runs(ledger, rung, family) or _winner_runs(base, rung, label) if r["seed"] == 0]
            best = [r for r in ledger.data["runs"].values() if r["rung"] == rung and r["family"] == family
                    and r["seed"] == 0 and config_key(r["config"]) == config_key(summary[family]["best"])]
            if start and best and config_key(best[0]["config"]) == config_key(start[0]["config"]):
                best = []  # the search kept the start
            for runs, name, style in ((start, label, "--"), (best, family, "-")):
                if runs:
                    c = runs[0]["curve"]
                    ax.plot([p["tokens"] / 1e6 for p in c], [p["eval_loss"] for p in c], style, label=name)
        hf_best = _winner_runs(base, rung, "hf-best")
        winner = _winner_runs(base, rung, "recipe")
        fastest = [r for r in _fastest_runs(base, rung, statistics.median(r["final_eval_loss"] for r in hf_best)
                                            if hf_best else None) if r["seed"] == 0]
        if fastest and not (winner and config_key(winner[0]["config"]) == config_key(fastest[0]["config"])):
            c = fastest[0]["curve"]
            ax.plot([p["tokens"] / 1e6 for p in c], [p["eval_loss"] for p in c], "-.",
                    label="recipe (soonest to hf-best's loss)")
        ladder = ladder_ledger()
        best_lr = ladder_best_lr(ladder, rung, "recipe")
        headline = [r for r in (ladder.get("runs") or {}).values() if r["rung"] == rung and r["optimizer"] == "recipe"
                    and r["lr"] == best_lr and r["seed"] == 0]
        if headline:
            c = headline[0]["curve"]
            ax.plot([p["tokens"] / 1e6 for p in c], [p["eval_loss"] for p in c], ":", label="recipe (budget ladder)")
        ax.set_title(f"budget {rung}, seed 0")
        ax.set_xlabel("training tokens (M)")
        ax.set_ylabel("eval loss")
        ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def one_run_ratios(ledger: Ledger, rung: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each recipe run at ``rung``: its tokens to hf-best's final loss (median of its seeds) inside the run,
    over the budget (the budget ladder's one-run measure), beside its final loss, best first; empty without
    hf-best's result there. A candidate can tie on the final loss and still get there much sooner."""
    target = (summary.get("hf-best") or {}).get("final_eval_loss")
    if target is None:
        return []
    rows = []
    for r in ledger.data["runs"].values():
        if r["rung"] == rung and r["family"] == "recipe" and r.get("curve"):
            budget = r["max_steps"] * r["tokens_per_step"]
            rows.append({"config": r["config"], "seed": r["seed"], "final_eval_loss": r["final_eval_loss"],
                         "ratio": crossing(r["curve"], target, "tokens") / budget, "target": target,
                         "diverged_at": (r.get("diverged") or {}).get("step"), "ns_dtype": r.get("ns_dtype")})
    return sorted(rows, key=lambda x: (x["ratio"], x["final_eval_loss"]))


def one_run_table(ledger: Ledger, rung: str, summary: dict[str, Any]) -> str:
    """The markdown of :func:`one_run_ratios` (the settings as they differ from the recipe's start)."""
    rows = one_run_ratios(ledger, rung, summary)
    if not rows:
        return ""
    start = recipe_start(ledger, rung)
    out = ["", f"Inside one run: each recipe run's tokens to hf-best's final loss ({rows[0]['target']:.3f}) over the "
           "budget (the budget ladder's one-run measure; interpolated between evaluations), beside its final loss:",
           "", "| settings (as they differ from the recipe's start) | seed | tokens to hf-best's loss / budget | final eval loss |",
           "|---|---|---|---|"]
    for x in rows:
        diff = ", ".join(f"{k} {v}" for k, v in sorted(x["config"].items()) if start.get(k, KNOB_DEFAULTS.get(k)) != v)
        ratio = "never" if math.isinf(x["ratio"]) else f"{x['ratio']:.3f}"
        if x["diverged_at"] is not None:
            ratio += f" (the guard stopped it at step {x['diverged_at']})"
        seed = f"{x['seed']} (Newton-Schulz in {x['ns_dtype']})" if x.get("ns_dtype") else str(x["seed"])
        out.append(f"| {diff or 'the start'} | {seed} | {ratio} | {x['final_eval_loss']:.3f} |")
    return "\n".join(out) + "\n"


def recipe_start(ledger: Ledger, rung: str) -> dict[str, Any]:
    """The recipe's settings the search at ``rung`` started from (the tables show each run's difference)."""
    start = ((ledger.data.get("progress") or {}).get(rung, {}).get("recipe") or {}).get("start")
    if not start:  # a search that began from the budget ladder's run: that run's settings
        first = [r for r in ledger.data["runs"].values()
                 if r["rung"] == rung and r["family"] == "recipe" and r.get("imported_from")]
        start = first[0]["config"] if first else {}
    return start


def precision_table(ledger: Ledger, rung: str, summary: dict[str, Any]) -> str:
    """``--precision-check``'s reruns at ``rung`` beside the runs they repeat (same settings, same seed, Muon's
    Newton-Schulz iteration at another precision): what the precision alone moves, against the seed noise."""
    checks = {k: r for k, r in (ledger.data.get("precision_check") or {}).items() if r["rung"] == rung}
    if not checks:
        return ""
    target = (summary.get("hf-best") or {}).get("final_eval_loss")
    start = recipe_start(ledger, rung)
    out = ["", ("The same run with Muon's Newton-Schulz iteration at another precision (`--precision-check`: same "
                "settings, same seed; every other run here is bfloat16 unless its seed says otherwise), against the "
                f"seed noise threshold {NOISE.get('recipe')}:"), "",
           "| settings | seed | precision | final eval loss: bfloat16 / it | difference | tokens to hf-best's loss / budget: bfloat16 / it |",
           "|---|---|---|---|---|---|"]
    for key, r in sorted(checks.items()):
        base = ledger.data["runs"].get(key.rsplit("|", 1)[0])
        if base is None:
            continue
        diff = ", ".join(f"{k} {v}" for k, v in r["config"].items() if start.get(k, KNOB_DEFAULTS.get(k)) != v)
        ratios = "n/a"
        if target is not None and base.get("curve") and r.get("curve"):
            budget = r["max_steps"] * r["tokens_per_step"]
            ratios = " / ".join(f"{crossing(x['curve'], target, 'tokens') / budget:.3f}" for x in (base, r))
        out.append(f"| {diff or 'the start'} | {r['seed']} | {r['ns_dtype']} | {base['final_eval_loss']:.3f} / "
                   f"{r['final_eval_loss']:.3f} | {r['final_eval_loss'] - base['final_eval_loss']:+.3f} | {ratios} |")
    return "\n".join(out) + "\n"


def memorisation(ledger: Ledger, rung: str) -> str:
    """The runs that measured their loss on training rows (``final_train_loss``): epochs read, that loss and its
    gap to the eval loss (past one epoch, the share of the gain that is memorised data); empty if none."""
    runs = [r for r in ledger.data["runs"].values() if r["rung"] == rung and "final_train_loss" in r]
    if not runs:
        return ""
    rows = ["", "Loss on training rows (as many as the eval rows, spread over the training set) at the end of each "
            "run that measured it:", "", "| family | settings | seed | epochs read | eval loss | training-rows loss | gap |",
            "|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["family"], r["final_eval_loss"])):
        settings = ", ".join(f"{k} {v}" for k, v in sorted(r["config"].items()))
        rows.append(f"| {r['family']} | {settings} | {r['seed']} | {r['epochs']:.2f} | "
                    f"{r['final_eval_loss']:.3f} | {r['final_train_loss']:.3f} | "
                    f"{r['final_eval_loss'] - r['final_train_loss']:+.3f} |")
    return "\n".join(rows) + "\n"
