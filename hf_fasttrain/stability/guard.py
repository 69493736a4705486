"""The divergence guard's decision, as a pure function: healthy, skip, roll back or stop.

Each optimizer step the guard sees one :class:`StepObservation` (the step's loss and pre-clip gradient
norm, whether anything was non-finite, and whether the update has already reached the weights) and
its :class:`GuardMemory` (recent healthy values and counters). :func:`guard_decision` answers with one
of :class:`Healthy`, :class:`Skip`, :class:`RollBack` or :class:`Stop`; :func:`remember` gives the
memory after that decision. Neither touches a model, a Trainer or a tensor: the callback in
``hf_fasttrain.callbacks.guard`` measures, asks, and carries the answer out.

The rules, in order (``applied``: the update of this step is already in the weights):

1. Non-finite loss or gradient. Weights non-finite too, or ``applied``: the bad update reached the
   weights -> roll back (stop when there is no good state). Otherwise -> skip the step.
2. Gradient norm above ``grad_norm_ceiling`` (an absolute bound, judged from the first step, also
   during the warm-up of the statistics) -> skip.
3. Loss spike (:func:`detect_spike` against the last healthy losses). Judged before the update -> skip,
   unless the loss has now been a spike on ``rollback_after_spikes`` steps in a row: the weights, not
   the batches, are bad -> roll back. Judged after the update (``applied``) -> roll back; with nothing
   to roll back to, the step is only kept out of the statistics.
4. Gradient-norm spike (same rule on the pre-clip norm, ratio ``grad_spike_ratio``) -> skip.
5. More than ``max_consecutive_skips`` skips in a row -> roll back (stop when there is no good state).
6. A rollback that makes more than ``max_rollbacks`` within ``rollback_window`` steps -> stop (after
   restoring the last good state).

Example:
    ```python
    >>> cfg = GuardConfig(spike_window=4, spike_warmup=4)
    >>> mem = GuardMemory(loss_history=[2.0, 2.1, 1.9, 2.0], grad_norm_history=[1.0, 1.1, 0.9, 1.0])
    >>> guard_decision(StepObservation(step=5, loss=100.0, grad_norm=1.0), mem, cfg, can_roll_back=True)
    Skip(kind='loss_spike', reason='loss spike (100 against a mean of 2)')
    >>> guard_decision(StepObservation(step=5, loss=2.0, grad_norm=1.0), mem, cfg, can_roll_back=True)
    Healthy()
    ```
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Union

from ..validation import ConfigError

__all__ = [
    "ROLLBACK_MODES",
    "GuardConfig",
    "GuardMemory",
    "StepObservation",
    "Healthy",
    "Skip",
    "RollBack",
    "Stop",
    "Decision",
    "guard_decision",
    "remember",
    "detect_spike",
    "check_stability_sharding",
]

ROLLBACK_MODES = ("auto", "memory", "checkpoint", "none")


def _invalid(name: str, value: Any, allowed: str) -> ConfigError:
    return ConfigError(name, value, allowed)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


@dataclass(frozen=True)
class GuardConfig:
    """Settings of the divergence guard; checks itself on creation.

    Args:
        spike_window: recent healthy steps the mean and std are taken over (OLMo-core: 128).
        spike_sigma: how many standard deviations above the mean is a spike (OLMo-core: 6).
        spike_warmup: healthy steps needed before spikes are judged; None: ``max(20, spike_window // 2)``
            (at most ``spike_window``).
        loss_spike_ratio: a loss spike must also exceed the mean by this factor (1.1: 10% above).
        grad_spike_ratio: a gradient-norm spike must also exceed the mean by this factor; None turns
            gradient-norm spike skipping off.
        grad_norm_ceiling: a pre-clip gradient norm above this is skipped at any step, the warm-up
            included; None: no ceiling.
        rollback_after_spikes: loss spikes in a row, each skipped before its update, after which the
            guard rolls back (the loss stays high: the weights are bad, not the batches).
        rollback: where the last good state lives: ``"auto"``, ``"memory"``, ``"checkpoint"`` or
            ``"none"`` (skip only, never roll back).
        snapshot_every: optimizer steps between in-memory snapshots.
        max_rollbacks: rollbacks allowed within ``rollback_window`` steps; one more stops training.
        rollback_window: the window, in optimizer steps.
        max_consecutive_skips: skipped steps in a row before the guard rolls back (or stops).
        max_snapshot_bytes: the budget for ``rollback="auto"`` to choose memory.
        raise_on_divergence: raise ``DivergenceError`` at the end of a stopped run.
    """

    spike_window: int = 128
    spike_sigma: float = 6.0
    spike_warmup: int | None = None
    loss_spike_ratio: float = 1.1
    grad_spike_ratio: float | None = 10.0
    grad_norm_ceiling: float | None = 1e4
    rollback_after_spikes: int = 8
    rollback: str = "auto"
    snapshot_every: int = 50
    max_rollbacks: int = 3
    rollback_window: int = 1000
    max_consecutive_skips: int = 20
    max_snapshot_bytes: int = 4 * 2**30
    raise_on_divergence: bool = True

    def __post_init__(self) -> None:
        def integer(name: str, low: int, high: int | None = None) -> None:
            v = getattr(self, name)
            if not _is_int(v) or v < low or (high is not None and v > high):
                bound = f">= {low}" if high is None else f"between {low} and {high}"
                raise _invalid(name, v, f"must be an integer {bound}")

        def number(name: str, low: float, strict: bool, optional: bool = False) -> None:
            v = getattr(self, name)
            if optional and v is None:
                return
            if not _is_number(v) or (v <= low if strict else v < low):
                rel = ">" if strict else ">="
                raise _invalid(name, v, f"must be a finite number {rel} {low}" + (" or null" if optional else ""))

        integer("spike_window", 2)
        number("spike_sigma", 0, strict=True)
        if self.spike_warmup is not None:
            integer("spike_warmup", 2, self.spike_window)
        number("loss_spike_ratio", 1, strict=False)
        number("grad_spike_ratio", 1, strict=False, optional=True)
        number("grad_norm_ceiling", 0, strict=True, optional=True)
        integer("rollback_after_spikes", 1)
        if self.rollback not in ROLLBACK_MODES:
            raise _invalid("rollback", self.rollback, f"allowed: {', '.join(ROLLBACK_MODES)}")
        integer("snapshot_every", 1)
        integer("max_rollbacks", 0)
        integer("rollback_window", 1)
        integer("max_consecutive_skips", 1)
        integer("max_snapshot_bytes", 1)
        if not isinstance(self.raise_on_divergence, bool):
            raise _invalid("raise_on_divergence", self.raise_on_divergence, "must be true or false")

    @property
    def warmup(self) -> int:
        """Healthy values needed before spikes are judged (OLMo-core: ``max(20, window // 2)``)."""
        if self.spike_warmup is not None:
            return self.spike_warmup
        return min(self.spike_window, max(20, self.spike_window // 2))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_training_args(cls, args: Any) -> "GuardConfig":
        """The config that ``FastTrainingArguments``' ``guard_*`` fields ask for (missing ones: defaults).

        A bad value raises naming the ``guard_*`` field, as the user wrote it.
        """
        settings = {name: getattr(args, f"guard_{name}") for name in GUARD_ARGS_FIELDS if hasattr(args, f"guard_{name}")}
        try:
            return cls(**settings)
        except ConfigError as err:
            if err.field not in GUARD_ARGS_FIELDS:
                raise
            raise ConfigError(f"guard_{err.field}", err.value, err.allowed, err.problem) from None


# GuardConfig fields that FastTrainingArguments offers as guard_<name>
GUARD_ARGS_FIELDS = ("spike_window", "spike_sigma", "rollback", "snapshot_every", "max_rollbacks", "grad_norm_ceiling")


@dataclass
class GuardMemory:
    """What the guard remembers across steps, and across a resume (it is saved with each checkpoint).

    Histories hold healthy values only, oldest first, at most ``spike_window`` of each.
    """

    loss_history: list[float] = field(default_factory=list)
    grad_norm_history: list[float] = field(default_factory=list)
    num_skipped_nonfinite: int = 0
    num_skipped_spike: int = 0
    num_rollbacks: int = 0
    rollback_steps: list[int] = field(default_factory=list)
    consecutive_skips: int = 0
    spike_streak: int = 0  # loss spikes in a row, each skipped before its update
    events: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, list) else v) for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "GuardMemory":
        """From :meth:`as_dict` (unknown keys, e.g. of a newer version, are ignored)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})


@dataclass(frozen=True)
class StepObservation:
    """One optimizer step as the guard sees it.

    Attributes:
        step: the step number (1-based: the step about to be, or just, applied).
        loss: the step's loss (mean over micro-batches and ranks); None when not known.
        grad_norm: the global gradient norm before clipping; None when not measured.
        nonfinite: the loss or a gradient was NaN/inf (on any rank).
        applied: the update of this step has already reached the weights (judged after the fact).
        weights_finite: whether the weights are finite (checked when something was non-finite).
    """

    step: int
    loss: float | None = None
    grad_norm: float | None = None
    nonfinite: bool = False
    applied: bool = False
    weights_finite: bool = True


@dataclass(frozen=True)
class Healthy:
    """Apply the step and learn from its loss and gradient norm."""


@dataclass(frozen=True)
class Skip:
    """Do not apply the step (drop its gradients; the lr schedule does not advance) nor learn from it.

    ``kind``: ``"nonfinite"``, ``"grad_ceiling"``, ``"loss_spike"`` or ``"grad_spike"``. When the update
    was already applied (a spike seen after the fact with no good state), nothing can be dropped: the
    step is only kept out of the statistics.
    """

    kind: str
    reason: str


@dataclass(frozen=True)
class RollBack:
    """Restore the last good state and go on with the next batch (the ones in between are skipped)."""

    reason: str


@dataclass(frozen=True)
class Stop:
    """End training. ``restore``: first go back to the last good state (then save it)."""

    reason: str
    restore: bool


Decision = Union[Healthy, Skip, RollBack, Stop]


def check_stability_sharding(args: Any) -> None:
    """The guard and value/AGC clipping need whole gradients: refuse FSDP and DeepSpeed in ``args``
    (``divergence_guard``, ``clip_mode``) when the arguments are built, before any data work (the callbacks would
    otherwise raise at on_train_begin, after the data is prepared)."""
    from ..validation import check
    from ..optim.sharding import detect_sharding

    mode = detect_sharding(args=args)
    if mode not in ("fsdp1", "fsdp2", "deepspeed"):
        return
    shown = {"fsdp1": "FSDP", "fsdp2": "FSDP2", "deepspeed": "DeepSpeed ZeRO"}[mode]
    check(not args.divergence_guard, "divergence_guard", args.divergence_guard,
          f"set it to false under {shown}, or train with DDP; the guard needs whole (unsharded) gradients",
          problem=f"not supported under {shown}")
    check(args.clip_mode in ("norm", "none"), "clip_mode", args.clip_mode,
          f"use 'norm' (max_grad_norm) under {shown}; value and AGC clipping need whole gradients",
          problem=f"not supported under {shown}")


def detect_spike(value: float, history: list[float], sigma: float, ratio: float, warmup: int) -> bool:
    """Whether ``value`` is a spike against the recent ``history`` (healthy values, oldest first).

    A spike is ``value > mean + sigma * std`` and ``value > mean + (ratio - 1) * |mean|`` over ``history``
    (``std`` is the sample standard deviation), judged only once ``history`` holds ``warmup`` values.
    The z-score rule over a rolling window follows OLMo-core's ``SkipStepOptimizer`` (OLMo 2, Team OLMo
    2025: window 128, 6 sigma, judged after ``max(20, window // 2)`` values), made one-sided; the ratio
    floor keeps a nearly constant series (tiny std) from flagging noise.

    Example:
        ```python
        >>> detect_spike(5.0, [2.0, 2.1, 1.9, 2.0], sigma=6.0, ratio=1.1, warmup=4)
        True
        >>> detect_spike(2.2, [2.0, 2.1, 1.9, 2.0], sigma=6.0, ratio=1.1, warmup=4)
        False
        ```
    """
    if len(history) < max(warmup, 2):
        return False
    mean = statistics.fmean(history)
    std = statistics.stdev(history)
    return value > mean + sigma * std and value > mean + (ratio - 1.0) * abs(mean)


def _roll_back_or_stop(step: int, reason: str, memory: GuardMemory, config: GuardConfig, can_roll_back: bool) -> Decision:
    if not can_roll_back:
        return Stop(f"{reason}; no good state to restore", restore=False)
    recent = [s for s in memory.rollback_steps if s > step - config.rollback_window] + [step]
    if len(recent) > config.max_rollbacks:
        return Stop(
            f"{reason}; {len(recent)} rollbacks within {config.rollback_window} steps "
            f"(max_rollbacks={config.max_rollbacks})",
            restore=True,
        )
    return RollBack(reason)


def guard_decision(obs: StepObservation, memory: GuardMemory, config: GuardConfig, can_roll_back: bool) -> Decision:
    """What to do with one optimizer step (see the module docstring for the rules).

    ``can_roll_back``: a good state to return to exists (and ``config.rollback`` is not ``"none"``).
    """
    can_roll_back = can_roll_back and config.rollback != "none"
    step = obs.step
    if obs.nonfinite:
        if obs.applied or not obs.weights_finite:
            return _roll_back_or_stop(step, "non-finite weights", memory, config, can_roll_back)
        decision: Decision = Skip("nonfinite", "non-finite loss or gradient")
    elif obs.grad_norm is not None and config.grad_norm_ceiling is not None and obs.grad_norm > config.grad_norm_ceiling:
        decision = Skip("grad_ceiling", f"gradient norm {obs.grad_norm:.4g} above grad_norm_ceiling={config.grad_norm_ceiling:g}")
    elif obs.loss is not None and detect_spike(
        obs.loss, memory.loss_history, config.spike_sigma, config.loss_spike_ratio, config.warmup
    ):
        reason = f"loss spike ({obs.loss:.4g} against a mean of {statistics.fmean(memory.loss_history):.4g})"
        if obs.applied:
            if can_roll_back:
                return _roll_back_or_stop(step, reason, memory, config, can_roll_back)
            return Skip("loss_spike", reason + "; already applied and no good state to roll back to, continuing")
        streak = memory.spike_streak + 1
        if streak >= config.rollback_after_spikes and can_roll_back:
            return _roll_back_or_stop(step, f"{reason}, {streak} steps in a row", memory, config, can_roll_back)
        decision = Skip("loss_spike", reason)
    elif (
        obs.grad_norm is not None
        and config.grad_spike_ratio is not None
        and detect_spike(obs.grad_norm, memory.grad_norm_history, config.spike_sigma, config.grad_spike_ratio, config.warmup)
    ):
        mean = statistics.fmean(memory.grad_norm_history)
        decision = Skip("grad_spike", f"gradient-norm spike ({obs.grad_norm:.4g} against a mean of {mean:.4g})")
    else:
        return Healthy()
    if not obs.applied and memory.consecutive_skips + 1 > config.max_consecutive_skips:
        why = f"{memory.consecutive_skips + 1} steps skipped in a row (max_consecutive_skips={config.max_consecutive_skips})"
        return _roll_back_or_stop(step, why, memory, config, can_roll_back)
    return decision


def remember(obs: StepObservation, memory: GuardMemory, decision: Decision, config: GuardConfig) -> GuardMemory:
    """The memory after ``decision`` was carried out for ``obs`` (a new object; ``memory`` is unchanged)."""
    window = config.spike_window
    if isinstance(decision, Healthy):
        losses, norms = memory.loss_history, memory.grad_norm_history
        if obs.loss is not None:
            losses = (losses + [obs.loss])[-window:]
        if obs.grad_norm is not None:
            norms = (norms + [obs.grad_norm])[-window:]
        return replace(memory, loss_history=list(losses), grad_norm_history=list(norms), consecutive_skips=0, spike_streak=0)
    if isinstance(decision, Skip):
        if obs.applied:  # nothing was dropped: only kept out of the statistics
            return replace(memory)
        return replace(
            memory,
            num_skipped_nonfinite=memory.num_skipped_nonfinite + (decision.kind == "nonfinite"),
            num_skipped_spike=memory.num_skipped_spike + (decision.kind != "nonfinite"),
            consecutive_skips=memory.consecutive_skips + 1,
            spike_streak=memory.spike_streak + 1 if decision.kind == "loss_spike" else memory.spike_streak,
        )
    if isinstance(decision, RollBack) or (isinstance(decision, Stop) and decision.restore):
        return replace(
            memory,
            num_rollbacks=memory.num_rollbacks + 1,
            rollback_steps=(memory.rollback_steps + [obs.step])[-(config.max_rollbacks + 1) :],
            consecutive_skips=0,
            spike_streak=0,
        )
    return replace(memory)
