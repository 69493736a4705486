"""Reading a peak-lr sweep: the median loss at each lr, where to extend a grid whose best is at its edge, the
best lr between grid points, and a least-squares line for trends across budgets or sizes."""

from __future__ import annotations

import math
import statistics
from typing import Any, Optional

__all__ = ["sweep_losses", "edge_extension", "interpolated_best_lr", "fit_line"]


def sweep_losses(runs: list[dict[str, Any]], rung: str, optimizer: str) -> dict[float, float]:
    """lr -> median final eval loss over the seeds run at that lr."""
    by_lr: dict[float, list[float]] = {}
    for r in runs:
        if r["rung"] == rung and r["optimizer"] == optimizer:
            by_lr.setdefault(float(r["lr"]), []).append(r["final_eval_loss"])
    return {lr: statistics.median(v) for lr, v in sorted(by_lr.items())}


def edge_extension(losses: dict[float, float]) -> Optional[float]:
    """The lr to add when the best is at an edge of the grid (x2 above, /2 below), else None."""
    if len(losses) < 2:
        return None
    lrs = sorted(losses)
    best = min(losses, key=losses.get)
    if best == lrs[-1]:
        return best * 2
    if best == lrs[0]:
        return best / 2
    return None


def interpolated_best_lr(losses: dict[float, float]) -> Optional[float]:
    """The vertex of the parabola through the best lr and its two neighbours in log2(lr) (clipped to them);
    None when the best is at an edge of the grid."""
    lrs = sorted(losses)
    best = min(lrs, key=losses.get)
    i = lrs.index(best)
    if i == 0 or i == len(lrs) - 1:
        return None
    (x0, x1, x2) = (math.log2(lrs[i - 1]), math.log2(best), math.log2(lrs[i + 1]))
    (y0, y1, y2) = (losses[lrs[i - 1]], losses[best], losses[lrs[i + 1]])
    denom = (x0 - x1) * (x0 - x2) * (x1 - x2)
    a = (x2 * (y1 - y0) + x1 * (y0 - y2) + x0 * (y2 - y1)) / denom
    b = (x2 * x2 * (y0 - y1) + x1 * x1 * (y2 - y0) + x0 * x0 * (y1 - y2)) / denom
    if a <= 0:
        return best
    return 2 ** min(max(-b / (2 * a), x0), x2)


def fit_line(xs: list[float], ys: list[float]) -> Optional[dict[str, float]]:
    """Least squares y = a + b x; None with fewer than 2 distinct x."""
    pts = [(x, y) for x, y in zip(xs, ys) if math.isfinite(x) and math.isfinite(y)]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = statistics.fmean(x for x, _ in pts)
    my = statistics.fmean(y for _, y in pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    b = sum((x - mx) * (y - my) for x, y in pts) / sxx
    return {"intercept": my - b * mx, "slope": b, "points": len(pts)}
