"""Settings of a random-restart search, validated on construction; built from ``FastTrainingArguments``.

Standard library only (no import of the package), so ``args.py`` can import it at module top.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

__all__ = ["RestartConfig", "ARG_FIELDS", "restart_config_from_args", "DIRECTIONS", "VARY"]

DIRECTIONS = ("min", "max")
VARY = ("both", "model", "data")
_PARALLEL = (False, "per_gpu")


@dataclass
class RestartConfig:
    """Settings of a random-restart search. Validated on construction, before any trial starts.

    Args:
        num_seeds (`int`, *optional*, defaults to `4`):
            Seeds explored at the first rung (>= 1).
        explore_fraction (`float`, *optional*, defaults to `0.1`):
            Exploration budget as a fraction of the full run's ``max_steps``, in (0, 1]. With 1 the
            exploration is the whole run and the best finished seed is the winner.
        metric (`str`, *optional*, defaults to `"eval_loss"`):
            Eval metric that ranks the seeds. A name without the ``eval_`` prefix gets it, as with
            ``TrainingArguments.metric_for_best_model``.
        direction (`str`, *optional*, defaults to `"min"`):
            ``"min"`` (lower is better, e.g. a loss) or ``"max"`` (e.g. an accuracy).
        rungs (`int`, *optional*, defaults to `1`):
            Successive-halving rungs (>= 1). Rung ``r`` of ``R`` sits at
            ``explore_fraction * keep_fraction ** (R - 1 - r)`` of the run; the last rung is the exploration
            budget. With 1 rung every seed trains for the whole exploration budget.
        keep_fraction (`float`, *optional*, defaults to `0.5`):
            Share of the surviving seeds kept at each rung before the last, in (0, 1) (0.5: successive
            halving). At least one seed is always kept.
        divergence_threshold (`float`, *optional*, defaults to `None`):
            A trial whose metric at a rung is worse than this (above it for ``min``, below it for ``max``) is
            diverged: it did not improve past the threshold. ``None``: only non-finite metrics (and the
            runner's own ``diverged`` flag) count as divergence.
        replace_diverged (`bool`, *optional*, defaults to `False`):
            Replace each diverged seed by a fresh one that trains up to the same rung.
        max_replacements (`int`, *optional*, defaults to `None`):
            Cap on fresh seeds drawn for diverged ones (``None``: ``num_seeds``).
        seed (`int`, *optional*, defaults to `42`):
            Base model seed; trial ``i`` gets ``seed + i`` (see :func:`derive_seeds`).
        data_seed (`int`, *optional*, defaults to `None`):
            Base data-order seed (``None``: ``seed``).
        vary (`str`, *optional*, defaults to `"both"`):
            Which seed changes across trials: ``"both"``, ``"model"`` (data order fixed) or ``"data"``
            (initialisation fixed).
        parallel (`bool` or `str`, *optional*, defaults to `False`):
            ``False`` runs trials one after another; ``"per_gpu"`` runs the trials of a rung at the same time,
            one per device in ``devices``.
        devices (`list[str]`, *optional*, defaults to `None`):
            Device ids handed to the runner under ``"per_gpu"`` (``None``: the visible GPUs).

    Example:
        ```python
        >>> from hf_fasttrain.restarts import RestartConfig
        >>> cfg = RestartConfig(num_seeds=8, explore_fraction=0.2, rungs=3)
        >>> cfg.metric, cfg.direction, cfg.keep_fraction
        ('eval_loss', 'min', 0.5)
        >>> RestartConfig(num_seeds=0)
        Traceback (most recent call last):
        ...
        ValueError: RestartConfig.num_seeds=0 is invalid: it must be an integer >= 1.
        ```
    """

    num_seeds: int = 4
    explore_fraction: float = 0.1
    metric: str = "eval_loss"
    direction: str = "min"
    rungs: int = 1
    keep_fraction: float = 0.5
    divergence_threshold: Optional[float] = None
    replace_diverged: bool = False
    max_replacements: Optional[int] = None
    seed: int = 42
    data_seed: Optional[int] = None
    vary: str = "both"
    parallel: Union[bool, str] = False
    devices: Optional[List[str]] = None

    def __post_init__(self):
        def bad(name, allowed):
            return ValueError(f"RestartConfig.{name}={getattr(self, name)!r} is invalid: it must be {allowed}.")

        if isinstance(self.num_seeds, bool) or not isinstance(self.num_seeds, int) or self.num_seeds < 1:
            raise bad("num_seeds", "an integer >= 1")
        if not _is_real(self.explore_fraction) or not 0.0 < float(self.explore_fraction) <= 1.0:
            raise bad("explore_fraction", "a number in (0, 1]")
        if not isinstance(self.metric, str) or not self.metric.strip():
            raise bad("metric", "a non-empty metric name such as 'eval_loss'")
        self.metric = self.metric.strip()
        if not self.metric.startswith("eval_"):
            self.metric = f"eval_{self.metric}"
        if self.direction not in DIRECTIONS:
            raise bad("direction", f"one of {list(DIRECTIONS)}")
        if isinstance(self.rungs, bool) or not isinstance(self.rungs, int) or self.rungs < 1:
            raise bad("rungs", "an integer >= 1")
        if not _is_real(self.keep_fraction) or not 0.0 < float(self.keep_fraction) < 1.0:
            raise bad("keep_fraction", "a number in (0, 1)")
        if self.divergence_threshold is not None and (
            not _is_real(self.divergence_threshold) or not math.isfinite(self.divergence_threshold)
        ):
            raise bad("divergence_threshold", "None or a finite number")
        if not isinstance(self.replace_diverged, bool):
            raise bad("replace_diverged", "True or False")
        if self.max_replacements is None:
            self.max_replacements = self.num_seeds
        if (
            isinstance(self.max_replacements, bool)
            or not isinstance(self.max_replacements, int)
            or self.max_replacements < 0
        ):
            raise bad("max_replacements", "None or an integer >= 0")
        for name in ("seed", "data_seed"):
            value = getattr(self, name)
            if value is None and name == "data_seed":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise bad(name, "an integer >= 0" + (" or None" if name == "data_seed" else ""))
        if self.vary not in VARY:
            raise bad("vary", f"one of {list(VARY)}")
        if self.parallel in (None, "no", "none", "false", ""):
            self.parallel = False
        if self.parallel not in _PARALLEL or self.parallel is True:
            raise bad("parallel", "False (one trial after another) or 'per_gpu'")
        if self.devices is not None:
            if isinstance(self.devices, str):
                self.devices = [d for d in self.devices.split(",") if d.strip()]
            self.devices = [str(d).strip() for d in self.devices]
            if not self.devices or len(set(self.devices)) != len(self.devices):
                raise bad("devices", "None or a non-empty list of distinct device ids")

    def search_dict(self) -> Dict[str, Any]:
        """The settings that decide which trials run and which one wins (``parallel``/``devices`` do not)."""
        d = dataclasses.asdict(self)
        d.pop("parallel")
        d.pop("devices")
        return d


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(float(x))


# FastTrainingArguments field -> RestartConfig field
ARG_FIELDS = {
    "restart_num_seeds": "num_seeds",
    "restart_explore_fraction": "explore_fraction",
    "restart_rungs": "rungs",
    "restart_keep_fraction": "keep_fraction",
    "restart_metric": "metric",
    "restart_direction": "direction",
    "restart_divergence_threshold": "divergence_threshold",
    "restart_replace_diverged": "replace_diverged",
    "restart_vary": "vary",
    "restart_parallel": "parallel",
}


def restart_config_from_args(training_args, **overrides) -> RestartConfig:
    """The :class:`RestartConfig` described by a ``FastTrainingArguments``' ``restart_*`` fields; the base seeds
    are its ``seed`` and ``data_seed``. Errors name the ``restart_*`` field."""
    kwargs = {cfg: getattr(training_args, arg) for arg, cfg in ARG_FIELDS.items()}
    kwargs.update(seed=training_args.seed, data_seed=getattr(training_args, "data_seed", None), **overrides)
    try:
        return RestartConfig(**kwargs)
    except ValueError as e:
        msg = str(e)
        for arg, cfg in ARG_FIELDS.items():
            msg = msg.replace(f"RestartConfig.{cfg}=", f"{arg}=")
        raise ValueError(msg.replace("RestartConfig.", "")) from None

