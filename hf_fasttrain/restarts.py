"""Random restart: train N seeds briefly, continue the best one to the end, report statistics over seeds.

A run can start from an unlucky initialisation or data order and converge slowly or not at all. Training
several seeds for a short exploration budget, keeping the best and finishing only that one buys a better
model for a small extra cost (the "random restarts" of Dodge et al., 2020, "Fine-Tuning Pretrained Language
Models: Weight Initializations, Data Orders, and Early Stopping", arXiv:2002.06305, who also show that
model initialisation and data order are separate sources of variance, hence two seeds per trial here).

Optionally the exploration is cut in rungs by successive halving (Jamieson & Talwalkar, 2016,
"Non-stochastic Best Arm Identification and Hyperparameter Optimization", arXiv:1502.07943; Li et al.,
2017, "Hyperband", arXiv:1603.06560): at each rung only the best ``keep_fraction`` of the seeds go on, and
the budget between rungs grows by ``1 / keep_fraction`` so each rung costs about the same compute.

Every exploration is an exact prefix of the full run: a trial is configured with the FULL run's
``max_steps`` (so the same LR schedule) and stopped at the rung step, where it saves a checkpoint; the next
rung, and finally the winner's continuation to ``max_steps``, resume from that checkpoint. The winner's
loss log therefore equals an uninterrupted run of that seed.

Trials are executed through a small :class:`TrialRunner` interface, so the selection and state logic here
knows nothing about the Trainer and is tested with a stub. The orchestrator's state is a JSON file in the
output directory, written atomically after every transition: killed at any moment and started again on the
same directory, it resumes without rerunning any trial recorded as finished.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import math
import os
import queue
import statistics
import threading
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Protocol, Sequence, Tuple, Union, runtime_checkable

__all__ = [
    "RestartConfig",
    "TrialSpec",
    "TrialResult",
    "TrialRunner",
    "RestartOrchestrator",
    "run_restarts",
    "compute_rung_steps",
    "derive_seeds",
    "rank_trials",
    "num_to_keep",
    "divergence_reason",
    "seed_statistics",
    "planned_steps",
    "search_time_curve",
    "RecipeTrialRunner",
    "restart_config_from_args",
    "latest_checkpoint_before",
    "train_with_restarts",
    "ARG_FIELDS",
    "STATE_FILE",
    "SUMMARY_JSON",
    "SUMMARY_MD",
    "CURVES_PNG",
]

STATE_FILE = "restarts_state.json"
SUMMARY_JSON = "restarts_summary.json"
SUMMARY_MD = "restarts_summary.md"
CURVES_PNG = "restarts_curves.png"

_STATE_VERSION = 1
_DIRECTIONS = ("min", "max")
_VARY = ("both", "model", "data")
_PARALLEL = (False, "per_gpu")


# ----------------------------------------------------------------------------------------------------------
# Configuration
# ----------------------------------------------------------------------------------------------------------


@dataclass
class RestartConfig:
    """Settings of a random-restart search. Validated on construction, before any trial starts.

    Args:
        num_seeds: number of seeds explored at the first rung (>= 1).
        explore_fraction: exploration budget as a fraction of the full run's ``max_steps``, in (0, 1].
            With 1 the exploration is the whole run and the best finished seed is the winner.
        metric: eval metric that ranks the seeds. A name without the ``eval_`` prefix gets it, as with
            ``TrainingArguments.metric_for_best_model``.
        direction: ``"min"`` (lower is better, e.g. a loss) or ``"max"`` (e.g. an accuracy).
        rungs: number of successive-halving rungs (>= 1). Rung ``r`` of ``R`` sits at
            ``explore_fraction * keep_fraction ** (R - 1 - r)`` of the run; the last rung is the exploration
            budget. With 1 rung every seed trains for the whole exploration budget.
        keep_fraction: share of the surviving seeds kept at each rung before the last, in (0, 1)
            (0.5: successive halving). At least one seed is always kept.
        divergence_threshold: a trial whose metric at a rung is worse than this (above it for ``min``,
            below it for ``max``) is diverged: it did not improve past the threshold. ``None``: only
            non-finite metrics (and the runner's own ``diverged`` flag) count as divergence.
        replace_diverged: replace each diverged seed by a fresh one that trains up to the same rung.
        max_replacements: cap on fresh seeds drawn for diverged ones (``None``: ``num_seeds``).
        seed: base model seed; trial ``i`` gets ``seed + i`` (see :func:`derive_seeds`).
        data_seed: base data-order seed (``None``: ``seed``).
        vary: which seed changes across trials: ``"both"``, ``"model"`` (data order fixed) or ``"data"``
            (initialisation fixed).
        parallel: ``False`` runs trials one after another; ``"per_gpu"`` runs the trials of a rung at the
            same time, one per device in ``devices``.
        devices: device ids handed to the runner under ``"per_gpu"`` (``None``: the visible GPUs).

    Example:

    >>> from hf_fasttrain.restarts import RestartConfig
    >>> cfg = RestartConfig(num_seeds=8, explore_fraction=0.2, rungs=3)
    >>> cfg.metric, cfg.direction, cfg.keep_fraction
    ('eval_loss', 'min', 0.5)
    >>> RestartConfig(num_seeds=0)
    Traceback (most recent call last):
    ...
    ValueError: RestartConfig.num_seeds=0 is invalid: it must be an integer >= 1.
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
        if self.direction not in _DIRECTIONS:
            raise bad("direction", f"one of {list(_DIRECTIONS)}")
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
        if self.vary not in _VARY:
            raise bad("vary", f"one of {list(_VARY)}")
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


# ----------------------------------------------------------------------------------------------------------
# Pure functions: rung steps, seeds, ranking, divergence, statistics
# ----------------------------------------------------------------------------------------------------------


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
        raise ValueError(f"max_steps={max_steps!r} is invalid: it must be an integer >= 1.")
    steps = []
    for r in range(rungs):
        frac = explore_fraction * keep_fraction ** (rungs - 1 - r)
        steps.append(min(max_steps, max(1, math.floor(frac * max_steps + 0.5))))
    if any(b <= a for a, b in zip(steps, steps[1:])):
        raise ValueError(
            f"rungs={rungs} with explore_fraction={explore_fraction} and keep_fraction={keep_fraction} gives "
            f"rung steps {steps} for max_steps={max_steps}; they must strictly increase: use fewer rungs, "
            "a larger explore_fraction or a longer run."
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
    if direction not in _DIRECTIONS:
        raise ValueError(f"direction={direction!r} is invalid: it must be one of {list(_DIRECTIONS)}.")
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


# ----------------------------------------------------------------------------------------------------------
# Runner interface
# ----------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TrialSpec:
    """One seed of the search, as handed to the runner.

    ``max_steps`` is the FULL run's step count: the runner must build its LR schedule from it and stop at the
    ``until_step`` it is given, so every exploration is an exact prefix of the full run. ``output_dir`` is
    this trial's own directory; ``device`` is set under ``parallel="per_gpu"`` (e.g. for
    ``CUDA_VISIBLE_DEVICES``).

    Example:

    >>> spec = TrialSpec("seed-0", 0, model_seed=42, data_seed=42, max_steps=100, output_dir="out/trials/seed-0")
    >>> spec.model_seed, spec.data_seed, spec.max_steps, spec.device
    (42, 42, 100, None)
    """

    trial_id: str
    index: int
    model_seed: int
    data_seed: int
    max_steps: int
    output_dir: str
    device: Optional[str] = None


@dataclass
class TrialResult:
    """What a runner returns after training a trial up to ``until_step``.

    Args:
        eval_history: evaluations made in this call, as dicts with ``"step"`` and metric keys (the shape of
            the Trainer's ``log_history`` eval entries). Entries from earlier calls may be repeated.
        final_eval: the metrics of the evaluation at ``until_step``.
        checkpoint_dir: checkpoint saved at ``until_step`` (resumed by the next rung or the continuation).
        diverged: the runner saw the run blow up (e.g. a NaN training loss) whatever the eval says.

    Example:

    >>> r = TrialResult([{"step": 5, "eval_loss": 3.2}], {"eval_loss": 3.2}, "out/checkpoint-5")
    >>> r.diverged
    False
    """

    eval_history: List[Dict[str, float]]
    final_eval: Dict[str, float]
    checkpoint_dir: Optional[str]
    diverged: bool = False


@runtime_checkable
class TrialRunner(Protocol):
    """Trains one trial. ``run`` trains ``trial`` (with ``trial.max_steps`` as the schedule length) from
    ``resume_from`` (a checkpoint from an earlier call, or ``None`` for a fresh start) up to ``until_step``,
    evaluates there, saves a checkpoint there and returns a :class:`TrialResult`.

    A runner may also define ``available_metrics() -> Iterable[str]``; the orchestrator then checks the
    configured metric against it before any trial starts.

    Example:

    >>> class ConstantRunner:
    ...     def run(self, trial, until_step, resume_from):
    ...         m = {"eval_loss": 1.0 + trial.index}
    ...         return TrialResult([{"step": until_step, **m}], m, f"{trial.output_dir}/checkpoint-{until_step}")
    >>> isinstance(ConstantRunner(), TrialRunner)
    True
    """

    def run(self, trial: TrialSpec, until_step: int, resume_from: Optional[str]) -> TrialResult: ...


# ----------------------------------------------------------------------------------------------------------
# Orchestrator
# ----------------------------------------------------------------------------------------------------------


def _jsonable(obj):
    """Non-finite floats become the strings 'nan', 'inf', '-inf' (valid JSON; ``float()`` reads them back)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def _atomic_write_text(path: str, text: str) -> None:
    """Write then ``os.replace``: a reader (or a restart after a kill) sees the old file or the new one."""
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _visible_gpus() -> List[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # torch missing or CUDA unusable: no GPU
        return []


class RestartOrchestrator:
    """Runs a random-restart search: explores ``num_seeds`` seeds (with optional successive halving), drops
    diverged ones, continues the best from its checkpoint to ``max_steps``, and writes a summary.

    Files in ``output_dir``: ``restarts_state.json`` (the resumable state, rewritten atomically after every
    transition), ``restarts_summary.json``, ``restarts_summary.md`` and ``restarts_curves.png``; trial ``t``
    gets ``output_dir/trials/t`` as its own output directory.

    Args:
        config: the search settings.
        runner: trains the trials (see :class:`TrialRunner`).
        output_dir: where state, summary and trial directories live. A state file already there is resumed;
            it must have been made with the same search settings and ``max_steps``.
        max_steps: the full run's optimizer steps (the LR schedule's length for every trial).

    Example:

    >>> import tempfile
    >>> class TableRunner:  # eval loss = 1 + model_seed % 3, whatever the step
    ...     def run(self, trial, until_step, resume_from):
    ...         m = {"eval_loss": 1.0 + trial.model_seed % 3}
    ...         return TrialResult([{"step": until_step, **m}], m, f"{trial.output_dir}/checkpoint-{until_step}")
    >>> out = tempfile.mkdtemp()
    >>> cfg = RestartConfig(num_seeds=3, explore_fraction=0.5, seed=1)
    >>> summary = RestartOrchestrator(cfg, TableRunner(), out, max_steps=10).run()
    >>> summary["winner"], summary["winner_model_seed"], summary["winner_final_metric"]
    ('seed-2', 3, 1.0)
    """

    def __init__(self, config: RestartConfig, runner: TrialRunner, output_dir: str, max_steps: int):
        if not isinstance(config, RestartConfig):
            raise ValueError(f"config={config!r} is invalid: it must be a RestartConfig.")
        if not callable(getattr(runner, "run", None)):
            raise ValueError(
                f"runner={runner!r} is invalid: it must have a run(trial, until_step, resume_from) method."
            )
        self.config = config
        self.runner = runner
        self.output_dir = os.fspath(output_dir)
        self.max_steps = max_steps
        # Everything below is checked now, so bad settings fail before any trial starts.
        self.rung_steps = compute_rung_steps(max_steps, config.explore_fraction, config.rungs, config.keep_fraction)
        available = getattr(runner, "available_metrics", None)
        if callable(available):
            names = sorted(available())
            if config.metric not in names:
                raise ValueError(
                    f"RestartConfig.metric={config.metric!r} is invalid: this runner reports {names}."
                )
        self.devices: List[str] = []
        if config.parallel == "per_gpu":
            self.devices = list(config.devices) if config.devices is not None else _visible_gpus()
            if not self.devices:
                raise ValueError(
                    "RestartConfig.parallel='per_gpu' is invalid here: no GPU is visible; "
                    "use parallel=False or give devices."
                )
        self.state_path = os.path.join(self.output_dir, STATE_FILE)
        self._lock = threading.RLock()
        self.state: Dict[str, Any] = {}

    # -- state -------------------------------------------------------------------------------------------

    def _new_state(self) -> Dict[str, Any]:
        state = {
            "version": _STATE_VERSION,
            "search": self.config.search_dict(),
            "max_steps": self.max_steps,
            "rung_steps": list(self.rung_steps),
            "trials": {},
            "order": [],
            "rungs": [],
            "replacements_used": 0,
            "continuation": None,
            "winner": None,
            "done": False,
        }
        return state

    def _load_or_init(self) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        if not os.path.exists(self.state_path):
            self.state = self._new_state()
            for i in range(self.config.num_seeds):
                self._add_trial(i, replaces=None)
            self._save()
            return
        with open(self.state_path, encoding="utf-8") as f:
            state = json.load(f)
        if state.get("version") != _STATE_VERSION:
            raise ValueError(
                f"{self.state_path} has state version {state.get('version')!r}; expected {_STATE_VERSION}."
            )
        old = dict(state["search"], max_steps=state["max_steps"])
        new = dict(self.config.search_dict(), max_steps=self.max_steps)
        changed = [k for k in new if old.get(k) != new[k]]
        if changed:
            diffs = ", ".join(f"{k}: {old.get(k)!r} in the state, {new[k]!r} now" for k in changed)
            raise ValueError(
                f"{self.state_path} was made with other settings ({diffs}); resume with the same settings "
                "or use a new output_dir."
            )
        self.state = state

    def _save(self) -> None:
        with self._lock:
            text = json.dumps(_jsonable(self.state), indent=1, sort_keys=True)
            _atomic_write_text(self.state_path, text)

    def _add_trial(self, index: int, replaces: Optional[str]) -> str:
        model_seed, data_seed = derive_seeds(index, self.config.seed, self.config.data_seed, self.config.vary)
        tid = f"seed-{index}"
        self.state["trials"][tid] = {
            "index": index,
            "model_seed": model_seed,
            "data_seed": data_seed,
            "output_dir": os.path.join(self.output_dir, "trials", tid),
            "status": "pending",  # pending | running | alive | dropped | diverged | chosen
            "results": {},  # str(step) -> {"value", "final_eval", "checkpoint_dir", "diverged"}
            "history": {},  # str(step) -> metric value (every evaluation seen)
            "starts": 0,
            "diverged_reason": None,
            "dropped_at_rung": None,
            "replaces": replaces,
            "replaced_by": None,
        }
        self.state["order"].append(tid)
        return tid

    def _spec(self, tid: str, device: Optional[str] = None) -> TrialSpec:
        t = self.state["trials"][tid]
        return TrialSpec(tid, t["index"], t["model_seed"], t["data_seed"], self.max_steps, t["output_dir"], device)

    # -- running trials ----------------------------------------------------------------------------------

    def _last_checkpoint(self, tid: str, before_step: int) -> Optional[str]:
        results = self.state["trials"][tid]["results"]
        steps = [int(s) for s in results if int(s) < before_step]
        return results[str(max(steps))]["checkpoint_dir"] if steps else None

    def _execute(self, tid: str, until_step: int, device: Optional[str]) -> None:
        """Runs one trial stage and records it; the only place that calls the runner."""
        resume_from = self._last_checkpoint(tid, until_step)
        with self._lock:
            t = self.state["trials"][tid]
            t["status"] = "running"
            t["starts"] += 1
            self._save()
        result = self.runner.run(self._spec(tid, device), until_step, resume_from)
        metric = self.config.metric
        if metric not in result.final_eval:
            raise ValueError(
                f"RestartConfig.metric={metric!r} is not in the eval results of {tid} "
                f"(they have {sorted(result.final_eval)})."
            )
        value = float(result.final_eval[metric])
        with self._lock:
            t = self.state["trials"][tid]
            for entry in result.eval_history:
                if metric in entry and "step" in entry:
                    t["history"][str(int(entry["step"]))] = float(entry[metric])
            t["history"][str(until_step)] = value
            t["results"][str(until_step)] = {
                "value": value,
                "final_eval": {k: float(v) for k, v in result.final_eval.items() if _is_number(v)},
                "checkpoint_dir": result.checkpoint_dir,
                "diverged": bool(result.diverged),
            }
            t["status"] = "alive"
            self._save()

    def _execute_many(self, tids: List[str], until_step: int) -> None:
        if not tids:
            return
        if not self.devices or len(tids) == 1:
            for tid in tids:
                self._execute(tid, until_step, self.devices[0] if self.devices else None)
            return
        free: "queue.Queue[str]" = queue.Queue()
        for d in self.devices:
            free.put(d)

        def work(tid):
            device = free.get()
            try:
                self._execute(tid, until_step, device)
            finally:
                free.put(device)

        errors = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(self.devices)) as pool:
            for fut in [pool.submit(work, tid) for tid in tids]:
                try:
                    fut.result()
                except BaseException as e:  # the others finish and are recorded; then re-raise
                    errors.append(e)
        if errors:
            raise errors[0]

    def _value(self, tid: str, step: int) -> float:
        return float(self.state["trials"][tid]["results"][str(step)]["value"])

    def _check_divergence(self, tid: str, step: int) -> bool:
        t = self.state["trials"][tid]
        if t["status"] == "diverged":
            return True
        res = t["results"][str(step)]
        reason = "the runner reported divergence" if res["diverged"] else None
        if reason is None:
            hist = [(int(s), float(v)) for s, v in t["history"].items() if int(s) <= step]
            reason = divergence_reason(
                sorted(hist), self.config.metric, self.config.direction, self.config.divergence_threshold,
                float(res["value"]), step,
            )
        if reason is None:
            return False
        t["status"] = "diverged"
        t["diverged_reason"] = reason
        self._save()
        return True

    # -- the search --------------------------------------------------------------------------------------

    def _run_rung(self, r: int) -> None:
        step = self.rung_steps[r]
        rung = self.state["rungs"][r]
        trials = self.state["trials"]
        while True:
            # Check before running too: a kill may have come between a recorded result and its check.
            for tid in list(rung["entrants"]):
                if str(step) in trials[tid]["results"] and self._check_divergence(tid, step):
                    self._maybe_replace(tid, rung)
            todo = [
                t for t in rung["entrants"]
                if str(step) not in trials[t]["results"] and trials[t]["status"] != "diverged"
            ]
            if not todo:
                break
            self._execute_many(todo, step)
        alive = [t for t in rung["entrants"] if trials[t]["status"] != "diverged"]
        values = {t: self._value(t, step) for t in alive}
        ranking = rank_trials(values, self.config.direction, self.state["order"])
        last = r == len(self.rung_steps) - 1
        kept = ranking if last else ranking[: num_to_keep(len(ranking), self.config.keep_fraction)]
        for tid in alive:
            if tid not in kept:
                trials[tid]["status"] = "dropped"
                trials[tid]["dropped_at_rung"] = r
        rung["ranking"] = ranking
        rung["kept"] = kept
        rung["done"] = True
        self._save()

    def _maybe_replace(self, tid: str, rung: Dict[str, Any]) -> None:
        t = self.state["trials"][tid]
        if not self.config.replace_diverged or t["replaced_by"] is not None:
            return
        if self.state["replacements_used"] >= self.config.max_replacements:
            return
        new = self._add_trial(len(self.state["order"]), replaces=tid)
        t["replaced_by"] = new
        self.state["replacements_used"] += 1
        rung["entrants"].append(new)
        self._save()

    def _continue_winner(self) -> None:
        final_rung = self.state["rungs"][-1]
        explore_step = self.rung_steps[-1]
        trials = self.state["trials"]
        cont = self.state["continuation"]
        if cont is None:
            cont = self.state["continuation"] = {"candidates": list(final_rung["ranking"]), "tried": []}
            self._save()
        for tid in cont["candidates"]:
            if trials[tid]["status"] == "diverged":
                continue
            if explore_step < self.max_steps and str(self.max_steps) not in trials[tid]["results"]:
                if tid not in cont["tried"]:
                    cont["tried"].append(tid)
                    self._save()
                self._execute_many([tid], self.max_steps)
            if explore_step < self.max_steps and self._check_divergence(tid, self.max_steps):
                continue  # a diverged seed is never chosen: fall back to the next best explored seed
            self.state["winner"] = tid
            trials[tid]["status"] = "chosen"
            break
        for tid in cont["candidates"]:
            if tid != self.state["winner"] and trials[tid]["status"] == "alive":
                trials[tid]["status"] = "dropped"
                trials[tid]["dropped_at_rung"] = len(self.rung_steps) - 1
        self.state["done"] = True
        self._save()

    def run(self) -> Dict[str, Any]:
        """Runs (or resumes) the search to the end; writes and returns the summary.

        Raises ``RuntimeError`` (after writing the summary) when every seed diverged.
        """
        self._load_or_init()
        trials = self.state["trials"]
        if not self.state["done"]:
            for r in range(len(self.rung_steps)):
                if r == len(self.state["rungs"]):
                    if r == 0:
                        entrants = [t for t in self.state["order"] if trials[t]["replaces"] is None]
                    else:
                        entrants = list(self.state["rungs"][r - 1]["kept"])
                    self.state["rungs"].append(
                        {"step": self.rung_steps[r], "entrants": entrants, "ranking": None, "kept": None, "done": False}
                    )
                    self._save()
                rung = self.state["rungs"][r]
                if not rung["done"]:
                    self._run_rung(r)
            self._continue_winner()
        summary = self.summary()
        self.write_summary(summary)
        if summary["winner"] is None:
            raise RuntimeError(
                f"all {len(trials)} trials diverged; see {os.path.join(self.output_dir, SUMMARY_MD)}"
            )
        return summary

    # -- reporting ---------------------------------------------------------------------------------------

    def summary(self) -> Dict[str, Any]:
        """Per-seed table, statistics over seeds at each rung, and the winner (a JSON-ready dict)."""
        trials = self.state["trials"]
        rows = []
        for tid in self.state["order"]:
            t = trials[tid]
            rung_values = [
                float(t["results"][str(s)]["value"]) if str(s) in t["results"] else None for s in self.rung_steps
            ]
            final = t["results"].get(str(self.max_steps))
            reached = max([int(s) for s in t["results"]], default=0)
            rows.append(
                {
                    "trial_id": tid,
                    "index": t["index"],
                    "model_seed": t["model_seed"],
                    "data_seed": t["data_seed"],
                    "rung_metrics": rung_values,
                    "final_metric": float(final["value"]) if final else None,
                    "status": t["status"],
                    "chosen": tid == self.state["winner"],
                    "diverged": t["status"] == "diverged",
                    "diverged_reason": t["diverged_reason"],
                    "dropped_at_rung": t["dropped_at_rung"],
                    "replaces": t["replaces"],
                    "stage_evals": {int(s): dict(r["final_eval"]) for s, r in t["results"].items()},
                    "steps_trained": reached,
                    "starts": t["starts"],
                    "history": sorted((int(s), float(v)) for s, v in t["history"].items()),
                    "output_dir": t["output_dir"],
                }
            )
        rung_stats = []
        for r, s in enumerate(self.rung_steps):
            vals = [row["rung_metrics"][r] for row in rows if not row["diverged"]]
            rung_stats.append({"rung": r, "step": s, **seed_statistics(vals)})
        winner = self.state["winner"]
        w = trials[winner] if winner else None
        w_final = None
        if w is not None:
            w_final = w["results"].get(str(self.max_steps), {}).get("value")
        return {
            "metric": self.config.metric,
            "direction": self.config.direction,
            "max_steps": self.max_steps,
            "rung_steps": list(self.rung_steps),
            "config": dataclasses.asdict(self.config),
            "trials": rows,
            "rung_stats": rung_stats,
            "num_trials": len(rows),
            "num_diverged": sum(row["diverged"] for row in rows),
            "winner": winner,
            "winner_model_seed": w["model_seed"] if w else None,
            "winner_data_seed": w["data_seed"] if w else None,
            "winner_final_metric": float(w_final) if w_final is not None else None,
            "winner_checkpoint": w["results"].get(str(self.max_steps), {}).get("checkpoint_dir") if w else None,
            "total_steps": sum(row["steps_trained"] for row in rows),
            "compute_ratio": sum(row["steps_trained"] for row in rows) / self.max_steps,
            "planned_steps": planned_steps(
                self.config.num_seeds, self.rung_steps, self.max_steps, self.config.keep_fraction
            ),
        }

    def markdown(self, summary: Dict[str, Any]) -> str:
        """The summary as a markdown table: one row per seed, then mean/std/min/max over seeds per rung."""

        def fmt(v):
            if v is None:
                return "-"
            return f"{v:.4f}" if math.isfinite(v) else str(v)

        m = summary["metric"]
        head = ["trial", "model_seed", "data_seed"] + [f"{m} @ {s}" for s in summary["rung_steps"]]
        head += [f"{m} @ {summary['max_steps']} (final)", "status"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for row in summary["trials"]:
            if row["chosen"]:
                status = "**chosen**"
            elif row["diverged"]:
                status = f"diverged ({row['diverged_reason']})"
            elif row["dropped_at_rung"] is not None:
                status = f"dropped at rung {row['dropped_at_rung']}"
            else:
                status = row["status"]
            if row["replaces"]:
                status += f", replaces {row['replaces']}"
            cells = [row["trial_id"], str(row["model_seed"]), str(row["data_seed"])]
            cells += [fmt(v) for v in row["rung_metrics"]] + [fmt(row["final_metric"]), status]
            lines.append("| " + " | ".join(cells) + " |")
        for stat in ("mean", "std", "min", "max"):
            cells = [f"*{stat}*", "", ""] + [fmt(s[stat]) for s in summary["rung_stats"]] + ["", ""]
            lines.append("| " + " | ".join(cells) + " |")
        n = [str(s["n"]) for s in summary["rung_stats"]]
        lines.append("| *n (finite, not diverged)* |  |  | " + " | ".join(n) + " |  |  |")
        lines.append("")
        if summary["winner"]:
            lines.append(
                f"Winner: {summary['winner']} (model_seed {summary['winner_model_seed']}, data_seed "
                f"{summary['winner_data_seed']}), final {m} {fmt(summary['winner_final_metric'])} at step "
                f"{summary['max_steps']}."
            )
        else:
            lines.append("No winner: every seed diverged.")
        lines.append(
            f"Compute: {summary['total_steps']} optimizer steps over all trials = {summary['compute_ratio']:.2f}x "
            f"one run of {summary['max_steps']} steps; "
            f"{summary['num_diverged']} of {summary['num_trials']} trials diverged."
        )
        return "\n".join(lines) + "\n"

    def plot(self, summary: Dict[str, Any], path: str) -> None:
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

    def write_summary(self, summary: Dict[str, Any]) -> None:
        """Writes ``restarts_summary.json``, ``restarts_summary.md`` and ``restarts_curves.png``."""
        _atomic_write_text(
            os.path.join(self.output_dir, SUMMARY_JSON), json.dumps(_jsonable(summary), indent=1, sort_keys=True)
        )
        _atomic_write_text(os.path.join(self.output_dir, SUMMARY_MD), self.markdown(summary))
        self.plot(summary, os.path.join(self.output_dir, CURVES_PNG))


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def run_restarts(config: RestartConfig, runner: TrialRunner, output_dir: str, max_steps: int) -> Dict[str, Any]:
    """Runs or resumes a search in ``output_dir``; returns the summary dict. See :class:`RestartOrchestrator`."""
    return RestartOrchestrator(config, runner, output_dir, max_steps).run()


# ----------------------------------------------------------------------------------------------------------
# Trials as recipe runs (the Trainer side)
# ----------------------------------------------------------------------------------------------------------

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


def _checkpoint_step(path: str) -> Optional[int]:
    name = os.path.basename(os.path.normpath(path))
    if name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit():
        return int(name[len("checkpoint-"):])
    return None


def latest_checkpoint_before(trial_dir: str, before_step: int, hint: Optional[str] = None) -> Optional[str]:
    """The newest complete ``checkpoint-N`` (has ``trainer_state.json``) in ``trial_dir`` with ``N < before_step``.

    A trial stage resumes from there: the orchestrator's checkpoint (``hint``) or a newer one a killed attempt
    left behind (resuming any checkpoint of the same run equals the uninterrupted run). A checkpoint at or
    after ``before_step`` is never used: the stage must end exactly at ``before_step``.
    """
    found = []
    paths = [os.path.join(trial_dir, d) for d in os.listdir(trial_dir)] if os.path.isdir(trial_dir) else []
    if hint:
        paths.append(hint)
    for p in paths:
        step = _checkpoint_step(p)
        if step is not None and step < before_step and os.path.isfile(os.path.join(p, "trainer_state.json")):
            found.append((step, p))
    return max(found)[1] if found else None


class RecipeTrialRunner:
    """Runs each trial as a normal recipe run: :func:`hf_fasttrain.run.train` in this process, or the recipe's
    command line in a subprocess (one per GPU under ``parallel="per_gpu"``, with ``CUDA_VISIBLE_DEVICES``).

    A trial's arguments are the recipe's with ``seed = model_seed``, ``data_seed = data_seed``, the trial's
    ``output_dir``, the full run's ``max_steps`` and ``restart_stop_at_step = until_step`` (the run stops and
    saves ``checkpoint-<until_step>`` there, see :class:`~hf_fasttrain.callbacks.stop_at_step.StopAtStepCallback`).
    The eval history is read from that checkpoint's ``trainer_state.json``; the run's final evaluation (at
    ``until_step``) is the rung value. A non-finite training loss in the log marks the trial diverged.

    Args:
        model_args, data_args, training_args: the recipe's resolved arguments.
        subprocess: run trials as subprocesses (always so under ``per_gpu``).
        launcher: command prefix for subprocess trials; the trial's config file follows as ``--config PATH``.
            Default: ``python -m hf_fasttrain.cli train``; e.g. ``["accelerate", "launch", "-m",
            "hf_fasttrain.cli", "train"]``.
        trial_overrides: ``{trial index: {field: value}}`` applied to that trial's training arguments (for
            experiments, e.g. forcing one seed to diverge with a huge ``learning_rate``).
        callbacks: extra Trainer callbacks for in-process trials.

    Example:
        >>> # model_args, data_args, training_args = parse_config(["--config", "gpt2_tiny"])
        >>> # runner = RecipeTrialRunner(model_args, data_args, training_args)
        >>> # RestartOrchestrator(restart_config_from_args(training_args), runner, "runs/r", 300).run()
    """

    def __init__(self, model_args, data_args, training_args, subprocess: bool = False,
                 launcher: Optional[Sequence[str]] = None, trial_overrides: Optional[Dict[int, Dict[str, Any]]] = None,
                 callbacks: Optional[Sequence[Any]] = None):
        self.model_args = model_args
        self.data_args = data_args
        self.training_args = training_args
        self.subprocess = subprocess
        self.launcher = list(launcher) if launcher else None
        self.trial_overrides = dict(trial_overrides or {})
        self.callbacks = list(callbacks or [])

    def available_metrics(self) -> List[str]:
        """Metrics every recipe evaluation reports (FastTrainer's eval loss, perplexity, next-token accuracy)."""
        return ["eval_loss", "eval_perplexity", "eval_next_token_accuracy"]

    def trial_args(self, trial: TrialSpec, until_step: int, resume_from: Optional[str]):
        """The trial's training arguments: a copy of the recipe's with the seeds, directory and stop step."""
        import copy

        args = copy.deepcopy(self.training_args)
        changes = {
            "seed": trial.model_seed,
            "data_seed": trial.data_seed,
            "output_dir": trial.output_dir,
            "max_steps": trial.max_steps,
            "restart_num_seeds": 1,
            "restart_stop_at_step": until_step,
            "resume_from_checkpoint": latest_checkpoint_before(trial.output_dir, until_step, resume_from),
            "auto_resume": False,
        }
        changes.update(self.trial_overrides.get(trial.index, {}))
        for k, v in changes.items():
            setattr(args, k, v)
        return args

    def run(self, trial: TrialSpec, until_step: int, resume_from: Optional[str]) -> TrialResult:
        args = self.trial_args(trial, until_step, resume_from)
        os.makedirs(trial.output_dir, exist_ok=True)
        if self.subprocess:
            metrics = self._run_subprocess(trial, args)
        else:
            from .run import train

            metrics = train(self.model_args, self.data_args, args, callbacks=list(self.callbacks))
        ckpt = os.path.join(trial.output_dir, f"checkpoint-{until_step}")
        with open(os.path.join(ckpt, "trainer_state.json"), encoding="utf-8") as f:
            log_history = json.load(f)["log_history"]
        history = [dict(e) for e in log_history if "step" in e and any(k.startswith("eval_") for k in e)]
        final = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        history.append({"step": until_step, **final})
        losses = [float(e["loss"]) for e in log_history if _is_number(e.get("loss"))]
        diverged = any(not math.isfinite(v) for v in losses)
        return TrialResult(history, final, ckpt, diverged)

    def _run_subprocess(self, trial: TrialSpec, args) -> Dict[str, Any]:
        import subprocess
        import sys

        import yaml

        from .recipes import resolved_config

        config = resolved_config(self.model_args, self.data_args, args)
        path = os.path.join(trial.output_dir, f"trial_config_{args.restart_stop_at_step}.yaml")
        _atomic_write_text(path, yaml.safe_dump(config, sort_keys=False))
        cmd = (self.launcher or [sys.executable, "-m", "hf_fasttrain.cli", "train"]) + ["--config", path]
        env = dict(os.environ)
        # the trial imports the same hf_fasttrain as this process (a checkout may shadow an installed copy)
        pkg_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        if trial.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(trial.device)
        log_path = os.path.join(trial.output_dir, f"trial_{args.restart_stop_at_step}.log")
        with open(log_path, "a", encoding="utf-8") as log:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise RuntimeError(f"trial {trial.trial_id} failed (exit {proc.returncode}); see {log_path}")
        with open(os.path.join(trial.output_dir, "metrics.json"), encoding="utf-8") as f:
            record = json.load(f)
        if "final_metrics" not in record:
            raise RuntimeError(f"trial {trial.trial_id}: {trial.output_dir}/metrics.json has no final_metrics")
        return record["final_metrics"]


def train_with_restarts(model_args, data_args, training_args, callbacks: Optional[Sequence[Any]] = None,
                        runner: Optional[TrialRunner] = None, **config_overrides) -> Dict[str, Any]:
    """The random-restart search for a recipe: explores ``restart_num_seeds`` seeds, continues the best to
    ``max_steps``; state, summary and trials live in ``training_args.output_dir``. Returns the summary."""
    config = restart_config_from_args(training_args, **config_overrides)
    if training_args.max_steps is None or training_args.max_steps <= 0:
        raise ValueError(
            f"max_steps={training_args.max_steps!r} is invalid for random restart: set max_steps > 0 (the "
            "exploration budget is a fraction of it)."
        )
    if runner is None:
        runner = RecipeTrialRunner(model_args, data_args, training_args, subprocess=config.parallel == "per_gpu",
                                   callbacks=callbacks)
    return RestartOrchestrator(config, runner, training_args.output_dir, training_args.max_steps).run()
