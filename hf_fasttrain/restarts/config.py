"""Settings of a random-restart search, validated on construction; built from ``FastTrainingArguments``.

Standard library only (no import of the package), so ``args.py`` can import it at module top.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from ..validation import ConfigError

__all__ = ["RestartConfig", "ARG_FIELDS", "restart_config_from_args", "DIRECTIONS", "VARY", "BACKENDS",
           "EXECUTION_FIELDS"]

DIRECTIONS = ("min", "max")
VARY = ("both", "model", "data")
BACKENDS = ("local", "ray")
_PARALLEL = (False, "per_gpu")
# settings of how the trials run, not of which ones run or win: a search may resume with other values
EXECUTION_FIELDS = ("parallel", "devices", "backend", "ray_address", "trial_resources", "max_concurrent")


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
        backend (`str`, *optional*, defaults to `"local"`):
            ``"local"`` runs the trials on this machine (see ``parallel``); ``"ray"`` runs each stage as a Ray
            task (``hf_fasttrain[ray]``), on a cluster or a local one; the search itself stays here.
        ray_address (`str`, *optional*, defaults to `None`):
            With ``backend="ray"``: ``"auto"`` (the cluster this machine belongs to), ``"ray://host:port"`` (Ray
            Client), ``"host:port"`` (a head node's address), or ``None`` to start a local cluster.
        trial_resources (`dict`, *optional*, defaults to `None`):
            With ``backend="ray"``: the Ray resources one stage asks for, e.g. ``{"num_gpus": 1, "num_cpus": 8}``
            (``None``: one CPU).
        max_concurrent (`int`, *optional*, defaults to `None`):
            With ``backend="ray"``: most stages running at once (``None``: every stage of a rung; Ray queues
            those its resources cannot place yet).

    Example:
        ```python
        >>> from hf_fasttrain.restarts import RestartConfig
        >>> cfg = RestartConfig(num_seeds=8, explore_fraction=0.2, rungs=3)
        >>> cfg.metric, cfg.direction, cfg.keep_fraction
        ('eval_loss', 'min', 0.5)
        >>> RestartConfig(num_seeds=0)
        Traceback (most recent call last):
        ...
        hf_fasttrain.validation.ConfigError: RestartConfig.num_seeds: got 0; must be an integer >= 1
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
    backend: str = "local"
    ray_address: Optional[str] = None
    trial_resources: Optional[Dict[str, float]] = None
    max_concurrent: Optional[int] = None

    def __post_init__(self):
        def bad(name, allowed):
            return ConfigError(f"RestartConfig.{name}", getattr(self, name),
                               allowed if allowed.startswith("allowed:") else f"must be {allowed}")

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
            raise bad("direction", "allowed: " + ", ".join(DIRECTIONS))
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
            raise bad("vary", "allowed: " + ", ".join(VARY))
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
        if self.backend not in BACKENDS:
            raise bad("backend", "allowed: " + ", ".join(BACKENDS))
        if isinstance(self.ray_address, str) and self.ray_address.strip().lower() in ("", "none", "null", "local"):
            self.ray_address = None
        if self.ray_address is not None and not _is_ray_address(self.ray_address):
            raise bad("ray_address", "None (a local cluster), 'auto', 'ray://host:port' or 'host:port'")
        if isinstance(self.trial_resources, str):
            self.trial_resources = _parse_resources(self.trial_resources)
        if self.trial_resources is not None and not _good_resources(self.trial_resources):
            raise bad("trial_resources", "None or a mapping of resource names to numbers >= 0, e.g. "
                      "{'num_gpus': 1, 'num_cpus': 8}")
        if self.max_concurrent is not None and (
            isinstance(self.max_concurrent, bool) or not isinstance(self.max_concurrent, int) or self.max_concurrent < 1
        ):
            raise bad("max_concurrent", "None or an integer >= 1")
        if self.backend == "local":
            for name in ("ray_address", "trial_resources", "max_concurrent"):
                if getattr(self, name) is not None:
                    raise bad(name, "None with backend='local' (it is a setting of backend='ray')")
        elif self.parallel:
            raise bad("parallel", "False with backend='ray' (Ray places the stages; use trial_resources)")

    def search_dict(self) -> Dict[str, Any]:
        """The settings that decide which trials run and which one wins (how they run, e.g. ``parallel``,
        ``devices``, ``backend``, does not)."""
        d = dataclasses.asdict(self)
        for name in EXECUTION_FIELDS:
            d.pop(name)
        return d


def _is_real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(float(x))


def _is_ray_address(a) -> bool:
    if not isinstance(a, str):
        return False
    a = a.strip()
    if a == "auto":
        return True
    rest = a[len("ray://"):] if a.startswith("ray://") else a
    host, _, port = rest.rpartition(":")
    return bool(host) and port.isdigit()


def _parse_resources(text: str):
    """A JSON object (the command line's form of ``trial_resources``); anything else is left to the check."""
    import json

    try:
        return json.loads(text) if text.strip().lower() not in ("", "none", "null") else None
    except ValueError:
        return text


def _good_resources(r) -> bool:
    return isinstance(r, dict) and all(
        isinstance(k, str) and k and _is_real(v) and math.isfinite(v) and v >= 0 for k, v in r.items()
    )


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
    "restart_backend": "backend",
    "restart_ray_address": "ray_address",
    "restart_trial_resources": "trial_resources",
    "restart_max_concurrent": "max_concurrent",
}


def restart_config_from_args(training_args, **overrides) -> RestartConfig:
    """The :class:`RestartConfig` described by a ``FastTrainingArguments``' ``restart_*`` fields; the base seeds
    are its ``seed`` and ``data_seed``. Errors name the ``restart_*`` field."""
    kwargs = {cfg: getattr(training_args, arg) for arg, cfg in ARG_FIELDS.items() if hasattr(training_args, arg)}
    kwargs.update(seed=training_args.seed, data_seed=getattr(training_args, "data_seed", None), **overrides)
    try:
        return RestartConfig(**kwargs)
    except ConfigError as err:
        raise in_option_words(err) from None


def in_option_words(err: ConfigError) -> ConfigError:
    """A refusal naming a ``RestartConfig`` field (``RestartConfig.metric``) as the option that sets it
    (``restart_metric``), for the command line and ``FastTrainingArguments`` users.

    Example:
        >>> str(in_option_words(ConfigError("RestartConfig.rungs", 0, "must be an integer >= 1")))
        'restart_rungs: got 0; must be an integer >= 1'
    """
    names = {f"RestartConfig.{cfg}": arg for arg, cfg in ARG_FIELDS.items()}
    names.update({f"RestartConfig.{name}": name for name in ("seed", "data_seed")})
    names.update({cfg: arg for arg, cfg in ARG_FIELDS.items() if cfg not in ("metric", "direction")})
    return err.renamed(names)

