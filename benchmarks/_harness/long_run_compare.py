"""The budget ladder's recipe against the long-run search's winners: both ledgers read together (the ladder's
summary and runs, the search's runs and summary) into the rows of the ladder's report."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any, Optional

from benchmarks._harness.lm import crossing, non_embedding_params
from benchmarks._harness.sweeps import fit_line


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
