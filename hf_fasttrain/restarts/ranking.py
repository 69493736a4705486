"""Pure functions of the search: rung steps, seeds, ranking, divergence, statistics over seeds, planned cost."""

from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence, Tuple

from ..validation import ConfigError
from .config import DIRECTIONS

__all__ = [
    "compute_rung_steps",
    "derive_seeds",
    "rank_trials",
    "num_to_keep",
    "divergence_reason",
    "seed_statistics",
    "planned_steps",
]


def compute_rung_steps(
    max_steps: int, explore_fraction: float, rungs: int = 1, keep_fraction: float = 0.5
) -> List[int]:
    """Optimizer steps at which the rungs are cut, increasing; the last is the exploration budget.

    Rung ``r`` of ``R`` sits at ``explore_fraction * keep_fraction ** (R - 1 - r)`` of ``max_steps``, rounded
    half up and at least 1 (geometric spacing: with ``keep_fraction`` of the seeds kept per rung, each rung
    costs about the same compute, as in successive halving).

    >>> compute_rung_steps(100, 0.2, rungs=3, keep_fraction=0.5)
    [5, 10, 20]
    """
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        raise ConfigError("max_steps", max_steps, "must be an integer >= 1")
    steps = []
    for r in range(rungs):
        frac = explore_fraction * keep_fraction ** (rungs - 1 - r)
        steps.append(min(max_steps, max(1, math.floor(frac * max_steps + 0.5))))
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ConfigError(
            "RestartConfig.rungs", rungs, "they must strictly increase: lower rungs, raise explore_fraction or "
            "train longer",
            problem=f"got {rungs}, which with explore_fraction={explore_fraction} and keep_fraction={keep_fraction} "
            f"cuts the {max_steps} steps at {', '.join(map(str, steps))}",
        )
    return steps


def derive_seeds(index: int, seed: int, data_seed: Optional[int] = None, vary: str = "both") -> Tuple[int, int]:
    """``(model_seed, data_seed)`` of trial ``index``.

    The model seed (initialisation, dropout) and the data seed (sampling order) are separate streams
    (Dodge et al., 2020): ``vary="model"`` keeps the data order of every trial fixed, ``vary="data"`` keeps
    the initialisation fixed, ``"both"`` moves both.

    >>> [derive_seeds(i, 42, 7, "both") for i in range(3)]
    [(42, 7), (43, 8), (44, 9)]
    >>> [derive_seeds(i, 42, 7, "data") for i in range(3)]
    [(42, 7), (42, 8), (42, 9)]
    """
    base_data = seed if data_seed is None else data_seed
    model = seed + index if vary in ("both", "model") else seed
    data = base_data + index if vary in ("both", "data") else base_data
    return model, data


def rank_trials(values: Dict[str, float], direction: str, order: Sequence[str]) -> List[str]:
    """Trial ids sorted best first by ``values``; ties go to the earlier trial in ``order``.

    >>> rank_trials({"a": 2.0, "b": 1.0, "c": 1.0}, "min", ["a", "b", "c"])
    ['b', 'c', 'a']
    >>> rank_trials({"a": 2.0, "b": 1.0, "c": 1.0}, "max", ["a", "b", "c"])
    ['a', 'b', 'c']
    """
    if direction not in DIRECTIONS:
        raise ConfigError("direction", direction, "allowed: " + ", ".join(DIRECTIONS))
    position = {t: i for i, t in enumerate(order)}
    sign = 1.0 if direction == "min" else -1.0
    return sorted(values, key=lambda t: (sign * values[t], position[t]))


def num_to_keep(num_alive: int, keep_fraction: float) -> int:
    """Seeds kept at a rung that is not the last: ``ceil(keep_fraction * num_alive)``, at least 1.

    >>> [num_to_keep(n, 0.5) for n in (1, 2, 3, 4, 5, 8)]
    [1, 1, 2, 2, 3, 4]
    """
    if num_alive <= 0:
        return 0
    return max(1, math.ceil(keep_fraction * num_alive - 1e-9))


def divergence_reason(
    values: Sequence[Tuple[int, float]],
    metric: str,
    direction: str,
    threshold: Optional[float],
    rung_value: float,
    rung_step: int,
) -> Optional[str]:
    """Why a trial counts as diverged, or ``None`` if it does not.

    Diverged: any metric value seen (``values`` as ``(step, value)``) is NaN or infinite, or the metric at the
    rung did not improve past ``threshold`` (is above it for ``min``, below it for ``max``).

    >>> divergence_reason([(2, 3.0), (4, float("nan"))], "eval_loss", "min", None, float("nan"), 4)
    'eval_loss is nan at step 4'
    >>> divergence_reason([(4, 9.5)], "eval_loss", "min", 9.0, 9.5, 4)
    'eval_loss 9.5 at step 4 did not improve past divergence_threshold 9.0'
    >>> divergence_reason([(4, 2.0)], "eval_loss", "min", 9.0, 2.0, 4) is None
    True
    """
    for step, value in list(values) + [(rung_step, rung_value)]:
        if not math.isfinite(value):
            return f"{metric} is {value} at step {step}"
    if threshold is not None:
        worse = rung_value > threshold if direction == "min" else rung_value < threshold
        if worse:
            return (
                f"{metric} {rung_value:.6g} at step {rung_step} did not improve past divergence_threshold {threshold}"
            )
    return None


def seed_statistics(values: Sequence[float]) -> Dict[str, Optional[float]]:
    """``n``, ``mean``, ``std`` (sample, n-1), ``min`` and ``max`` of the finite values (``None`` when undefined).

    >>> seed_statistics([1.0, 2.0, 3.0])
    {'n': 3, 'mean': 2.0, 'std': 1.0, 'min': 1.0, 'max': 3.0}
    """
    xs = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not xs:
        return {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    return {
        "n": len(xs),
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else None,
        "min": min(xs),
        "max": max(xs),
    }


def planned_steps(num_seeds: int, rung_steps: Sequence[int], max_steps: int, keep_fraction: float = 0.5) -> int:
    """Optimizer steps a search costs when no seed diverges: explorations plus the winner's continuation.

    With one rung this is ``num_seeds * explore_steps + (max_steps - explore_steps)``; use it to give a
    single-seed baseline the same total compute.

    >>> planned_steps(4, [10], 100)
    130
    >>> planned_steps(8, [5, 10, 20], 100, 0.5)  # 8*5 + 4*5 + 2*10 + 80
    160
    """
    total, alive, prev = 0, num_seeds, 0
    for r, step in enumerate(rung_steps):
        total += alive * (step - prev)
        prev = step
        if r < len(rung_steps) - 1:
            alive = num_to_keep(alive, keep_fraction)
    return total + (max_steps - prev)
