"""What a search reports: the summary dict (per-seed table, statistics over seeds, winner), its markdown
table, the plot of every seed's eval curve, and the search's eval curve on the compute axis."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence

from .._files import atomic_write_text
from .config import RestartConfig
from .ranking import planned_steps, seed_statistics
from .state import SearchState, jsonable

__all__ = [
    "SUMMARY_JSON",
    "SUMMARY_MD",
    "CURVES_PNG",
    "build_summary",
    "summary_markdown",
    "plot_curves",
    "write_summary",
    "search_time_curve",
]

SUMMARY_JSON = "restarts_summary.json"
SUMMARY_MD = "restarts_summary.md"
CURVES_PNG = "restarts_curves.png"


def build_summary(state: SearchState, config: RestartConfig, root: Optional[str] = None) -> Dict[str, Any]:
    """Per-seed table, statistics over seeds at each rung, and the winner (a JSON-ready dict). Paths are
    joined to ``root`` (the search's ``output_dir``; a version-2 state holds them relative to it)."""
    rung_steps, max_steps = list(state.rung_steps), state.max_steps

    def path(p):
        return os.path.join(root, p) if root is not None and p is not None else p

    rows = []
    for tid in state.order:
        t = state.trials[tid]
        final = t.results.get(max_steps)
        rows.append(
            {
                "trial_id": tid,
                "index": t.index,
                "model_seed": t.model_seed,
                "data_seed": t.data_seed,
                "rung_metrics": [t.results[s].value if s in t.results else None for s in rung_steps],
                "final_metric": final.value if final else None,
                "status": t.status,
                "chosen": tid == state.winner,
                "diverged": t.status == "diverged",
                "diverged_reason": t.diverged_reason,
                "failed": t.status == "failed",
                "failed_reason": t.failed_reason,
                "dropped_at_rung": t.dropped_at_rung,
                "replaces": t.replaces,
                "stage_evals": {s: dict(r.final_eval) for s, r in t.results.items()},
                "steps_trained": t.steps_trained,
                "starts": t.starts,
                "history": sorted(t.history.items()),
                "output_dir": path(t.output_dir),
            }
        )
    rung_stats = []
    for r, s in enumerate(rung_steps):
        vals = [row["rung_metrics"][r] for row in rows if not row["diverged"] and not row["failed"]]
        rung_stats.append({"rung": r, "step": s, **seed_statistics(vals)})
    w = state.trials[state.winner] if state.winner else None
    w_final = w.results.get(max_steps) if w else None
    return {
        "metric": config.metric,
        "direction": config.direction,
        "max_steps": max_steps,
        "rung_steps": rung_steps,
        "config": dataclasses.asdict(config),
        "trials": rows,
        "rung_stats": rung_stats,
        "num_trials": len(rows),
        "num_diverged": sum(row["diverged"] for row in rows),
        "num_failed": sum(row["failed"] for row in rows),
        "winner": state.winner,
        "winner_model_seed": w.model_seed if w else None,
        "winner_data_seed": w.data_seed if w else None,
        "winner_final_metric": w_final.value if w_final else None,
        "winner_checkpoint": path(w_final.checkpoint_dir) if w_final else None,
        "total_steps": sum(row["steps_trained"] for row in rows),
        "compute_ratio": sum(row["steps_trained"] for row in rows) / max_steps,
        "planned_steps": planned_steps(config.num_seeds, rung_steps, max_steps, config.keep_fraction),
    }


def _fmt(v) -> str:
    if v is None:
        return "-"
    return f"{v:.4f}" if math.isfinite(v) else str(v)


def summary_markdown(summary: Dict[str, Any]) -> str:
    """The summary as a markdown table: one row per seed, then mean/std/min/max over seeds per rung."""
    m = summary["metric"]
    head = ["trial", "model_seed", "data_seed"] + [f"{m} @ {s}" for s in summary["rung_steps"]]
    head += [f"{m} @ {summary['max_steps']} (final)", "status"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in summary["trials"]:
        if row["chosen"]:
            status = "**chosen**"
        elif row["diverged"]:
            status = f"diverged ({row['diverged_reason']})"
        elif row.get("failed"):
            status = f"failed ({row['failed_reason']})"
        elif row["dropped_at_rung"] is not None:
            status = f"dropped at rung {row['dropped_at_rung']}"
        else:
            status = row["status"]
        if row["replaces"]:
            status += f", replaces {row['replaces']}"
        cells = [row["trial_id"], str(row["model_seed"]), str(row["data_seed"])]
        cells += [_fmt(v) for v in row["rung_metrics"]] + [_fmt(row["final_metric"]), status]
        lines.append("| " + " | ".join(cells) + " |")
    for stat in ("mean", "std", "min", "max"):
        cells = [f"*{stat}*", "", ""] + [_fmt(s[stat]) for s in summary["rung_stats"]] + ["", ""]
        lines.append("| " + " | ".join(cells) + " |")
    n = [str(s["n"]) for s in summary["rung_stats"]]
    lines.append("| *n (finite, not diverged)* |  |  | " + " | ".join(n) + " |  |  |")
    lines.append("")
    if summary["winner"]:
        lines.append(
            f"Winner: {summary['winner']} (model_seed {summary['winner_model_seed']}, data_seed "
            f"{summary['winner_data_seed']}), final {m} {_fmt(summary['winner_final_metric'])} at step "
            f"{summary['max_steps']}."
        )
    else:
        lines.append("No winner: every seed diverged or failed." if summary.get("num_failed")
                     else "No winner: every seed diverged.")
    lines.append(
        f"Compute: {summary['total_steps']} optimizer steps over all trials = {summary['compute_ratio']:.2f}x "
        f"one run of {summary['max_steps']} steps; "
        f"{summary['num_diverged']} of {summary['num_trials']} trials diverged"
        + (f", {summary['num_failed']} failed." if summary.get("num_failed") else ".")
    )
    return "\n".join(lines) + "\n"


def plot_curves(summary: Dict[str, Any], path: str) -> None:
    """PNG of every seed's eval curve; the winner thick, diverged seeds dashed, rungs as vertical lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    plotted = False
    for row in summary["trials"]:
        pts = [(s, v) for s, v in row["history"] if math.isfinite(v)]
        if not pts:
            continue
        xs, ys = zip(*pts)
        style = {"lw": 2.5, "zorder": 3} if row["chosen"] else {"lw": 1.0, "alpha": 0.8}
        if row["diverged"]:
            style["ls"] = "--"
        label = f"{row['trial_id']} (m{row['model_seed']}, d{row['data_seed']})"
        label += " chosen" if row["chosen"] else (" diverged" if row["diverged"] else "")
        ax.plot(xs, ys, marker="o", ms=3, label=label, **style)
        plotted = True
    for s in summary["rung_steps"]:
        ax.axvline(s, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel(summary["metric"])
    ax.set_title(f"random restarts: {summary['num_trials']} seeds, rungs at {summary['rung_steps']}")
    if plotted:
        ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_summary(summary: Dict[str, Any], output_dir: str, plot: bool = True) -> None:
    """Writes ``restarts_summary.json``, ``restarts_summary.md`` and (``plot``) ``restarts_curves.png``."""
    atomic_write_text(
        os.path.join(output_dir, SUMMARY_JSON), json.dumps(jsonable(summary), indent=1, sort_keys=True)
    )
    atomic_write_text(os.path.join(output_dir, SUMMARY_MD), summary_markdown(summary))
    if plot:
        plot_curves(summary, os.path.join(output_dir, CURVES_PNG))


def search_time_curve(summary: Dict[str, Any], winner_evals: Sequence[Dict[str, Any]], tokens_per_step: int,
                      seconds_key: str = "train_seconds") -> List[Dict[str, float]]:
    """The eval curve of a whole search on the compute axis, to compare it with single runs (time to loss).

    Nothing counts before the winner is known: the first point is the end of the exploration, at the
    seconds and tokens of every trial's training so far (losers, diverged seeds and failed continuations
    included), with the winner's metric there; then the winner's evaluations after the exploration, shifted
    by that cost. ``winner_evals`` are the winner's eval logs (``step``, the metric, ``seconds_key``); its
    ``stage_evals`` in the summary are merged in. Returns points ``{step, tokens, seconds, <metric>}``.

    >>> summary = {"metric": "eval_loss", "winner": "a", "rung_steps": [2], "trials": [
    ...     {"trial_id": "a", "stage_evals": {2: {"eval_loss": 3.0, "train_seconds": 1.0},
    ...                                      6: {"eval_loss": 2.0, "train_seconds": 5.0}}},
    ...     {"trial_id": "b", "stage_evals": {"2": {"eval_loss": 3.5, "train_seconds": 1.5}}}]}
    >>> search_time_curve(summary, [{"step": 4, "eval_loss": 2.5, "train_seconds": 3.0}], tokens_per_step=10)
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'step': 2, 'tokens': 40, 'seconds': 2.5, 'eval_loss': 3.0},
     {'step': 4, 'tokens': 60, 'seconds': 4.5, 'eval_loss': 2.5},
     {'step': 6, 'tokens': 80, 'seconds': 6.5, 'eval_loss': 2.0}]
    """
    metric, winner = summary["metric"], summary["winner"]
    explore_step = int(summary["rung_steps"][-1])
    cost_seconds, cost_steps, w = 0.0, 0, None
    for row in summary["trials"]:
        stages = {int(k): v for k, v in row["stage_evals"].items()}
        if row["trial_id"] == winner:
            w = stages
            stages = {k: v for k, v in stages.items() if k <= explore_step}
        if stages:
            last = max(stages)
            cost_seconds += float(stages[last][seconds_key])
            cost_steps += last
    if w is None or explore_step not in w:
        raise ValueError(f"summary has no winner with an evaluation at the exploration step {explore_step}")
    w_explore_seconds = float(w[explore_step][seconds_key])
    points = {explore_step: {"seconds": cost_seconds, metric: float(w[explore_step][metric])}}
    later = [dict(e) for e in winner_evals if metric in e] + [{"step": k, **v} for k, v in w.items()]
    for e in sorted(later, key=lambda e: int(e["step"])):
        step = int(e["step"])
        if step > explore_step and seconds_key in e:
            seconds = cost_seconds + float(e[seconds_key]) - w_explore_seconds
            points[step] = {"seconds": seconds, metric: float(e[metric])}
    return [
        {"step": s, "tokens": (cost_steps + s - explore_step) * tokens_per_step, "seconds": p["seconds"],
         metric: p[metric]}
        for s, p in sorted(points.items())
    ]
