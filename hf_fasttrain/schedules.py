"""Learning-rate schedules: linear warmup, then a decay shape down to a floor.

Every schedule here is a pure function giving the multiplier of a param group's peak lr at a point of
training. `functools.partial` binds the settings, which travel whole as one `ScheduleSpec` (a frozen
dataclass that checks itself); `torch.optim.lr_scheduler.LambdaLR` wraps the function only at
the edge (`ScheduleSpec.build`, `make_scheduler`), with one lambda per param group, so a hybrid optimizer
with several groups keeps their lr ratios, and an absolute floor (`min_lr`) lands at the same lr in every
group.

The shape of the multiplier `f(x)` over training progress `x` (optimizer steps, or tokens):

    (1) warmup   x < W:          f = s + (1 - s) * x / W               s = warmup_start_factor
    (2) stable   W <= x < D:     f = 1                                 only with decay_fraction (WSD)
    (3) decay    D <= x:         f = r + (1 - r) * shape(p)            p = min(1, (x - D) / (N - D))

with N the total, W the warmup length, D the start of the decay (D = W, or D = N * (1 - decay_fraction))
and r the floor as a fraction of the group's peak lr (`min_lr_ratio`, or `min_lr / peak`). Written with
min and max lrs this is `min + (max - min) * shape(p)`, with the shapes

    cosine    0.5 * (1 + cos(pi * p))                  Loshchilov & Hutter, 2017 (SGDR)
    sqrt      sqrt(1 - p)       = sqrt((T - t) / T)
    linear    1 - p             = (T - t) / T
    1-sqrt    1 - sqrt(p)       the WSD cooldown of Hägele et al., 2024 ("Scaling Laws and
                                Compute-Optimal Training Beyond Fixed Training Durations"), held at the
                                peak until the last `decay_fraction` (default 0.2) of training
    constant  1

Beyond the end (x > N) the multiplier stays at the floor. The warmup matches `torch.optim.lr_scheduler.
LinearLR` (factor `s` at step 0, 1 at step W), so warmup + cosine equals torch's
`SequentialLR(LinearLR, CosineAnnealingLR)` step by step (tests/test_schedules.py checks it).

Progress in tokens: give `progress=TokenProgress(total_tokens)` and feed it the tokens actually trained
on (`progress.add(n)` before each `scheduler.step()`); the schedule then follows tokens_seen /
total_tokens instead of step / num_training_steps, which matters when the tokens per step change during
training (sequence-length warmup). Its state is saved in the scheduler's `state_dict`, so it survives a
Trainer checkpoint.

Plot the shapes: `python -m hf_fasttrain.schedules --plot schedules.png --decays cosine,sqrt,linear,1-sqrt`.
"""

from __future__ import annotations

import argparse
import functools
import math
import numbers
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Sequence

import torch
from torch.optim.lr_scheduler import LambdaLR

from .validation import ConfigError

__all__ = [
    "ScheduleSpec", "make_scheduler", "ScheduleLR", "TokenProgress", "lr_factor", "resolve_warmup_steps",
    "DECAY_SHAPES", "DEFAULT_DECAY_FRACTION", "DecayName", "get_decay_shape", "SCHEDULE_UNITS", "ScheduleUnit",
    "cosine_shape", "sqrt_shape", "linear_shape", "one_minus_sqrt_shape", "constant_shape", "plot_schedules",
]

#: The names of `DECAY_SHAPES`, for type checkers (a test keeps the two the same).
DecayName = Literal["cosine", "sqrt", "linear", "1-sqrt", "constant"]
#: What a schedule's progress counts: optimizer steps, or tokens trained on (see `TokenProgress`).
ScheduleUnit = Literal["steps", "tokens"]
SCHEDULE_UNITS: tuple[str, ...] = ("steps", "tokens")


# ---------------------------------------------------------------------------------------------------------
# Decay shapes: p in [0, 1] (progress through the decay) -> fraction of the way from the floor to the peak,
# 1 at p = 0 and 0 at p = 1 (constant excepted).
# ---------------------------------------------------------------------------------------------------------


def cosine_shape(p: float) -> float:
    """Half a cosine wave: `0.5 * (1 + cos(pi * p))` (Loshchilov & Hutter, 2017)."""
    return 0.5 * (1.0 + math.cos(math.pi * p))


def sqrt_shape(p: float) -> float:
    """Square-root decay: `sqrt(1 - p)`, i.e. `sqrt((T - t) / T)`; falls slowly at first, steeply at the end."""
    return math.sqrt(1.0 - p)


def linear_shape(p: float) -> float:
    """Linear decay: `1 - p`, i.e. `(T - t) / T`."""
    return 1.0 - p


def one_minus_sqrt_shape(p: float) -> float:
    """The WSD cooldown `1 - sqrt(p)` of Hägele et al., 2024 (arXiv:2405.18392): steep first, flat at the end."""
    return 1.0 - math.sqrt(p)


def constant_shape(p: float) -> float:
    """No decay: the peak lr for the whole run (after warmup)."""
    return 1.0


#: Registry: decay name -> shape function `p -> [0, 1]`. Add a shape by adding an entry.
DECAY_SHAPES: dict[str, Callable[[float], float]] = {
    "cosine": cosine_shape,
    "sqrt": sqrt_shape,
    "linear": linear_shape,
    "1-sqrt": one_minus_sqrt_shape,
    "constant": constant_shape,
}

#: Fraction of training spent in the decay when `decay_fraction` is not given; shapes not listed decay over
#: everything after the warmup. 0.2: Hägele et al., 2024 find a 20% 1-sqrt cooldown matches cosine.
DEFAULT_DECAY_FRACTION: dict[str, float] = {"1-sqrt": 0.2}


def get_decay_shape(name: str) -> Callable[[float], float]:
    """The shape function registered under `name`; an unknown name raises ValueError listing the known ones."""
    if name not in DECAY_SHAPES:
        raise ValueError(f"lr_decay: got {name!r}; allowed: {', '.join(DECAY_SHAPES)}")
    return DECAY_SHAPES[name]


# ---------------------------------------------------------------------------------------------------------
# The multiplier: a pure function of progress, settings bound with functools.partial.
# ---------------------------------------------------------------------------------------------------------


def lr_factor(
    x: float,
    *,
    shape: Callable[[float], float],
    total: float,
    warmup: float,
    decay_start: float,
    warmup_start_factor: float,
    floor: float,
) -> float:
    """Multiplier of the peak lr at progress `x` (steps or tokens; `total`, `warmup`, `decay_start` in the same unit).

    Args:
        x: progress so far: optimizer steps taken, or tokens trained on.
        shape: decay shape `p -> [0, 1]`, see `DECAY_SHAPES`.
        total: progress at the end of training (N).
        warmup: length of the linear warmup (W), `0 <= W <= decay_start`.
        decay_start: where the decay begins (D); `D = W` unless a stable phase is wanted (WSD).
        warmup_start_factor: multiplier at x = 0 (s).
        floor: multiplier reached at the end of the decay (r), `min_lr / peak` or `min_lr_ratio`.
    """
    # (1) linear warmup from s to 1, as torch's LinearLR: s at x = 0, 1 at x = W
    if x < warmup:
        return warmup_start_factor + (1.0 - warmup_start_factor) * x / warmup
    # (2) stable phase at the peak until the decay starts (only when decay_start > warmup)
    if x < decay_start:
        return 1.0
    # (3) decay from the peak to the floor over [D, N]; held at the floor beyond N
    span = total - decay_start
    p = min(1.0, (x - decay_start) / span) if span > 0 else 1.0
    return floor + (1.0 - floor) * shape(p)


def _factor_at_step(step: int, **kwargs) -> float:
    return lr_factor(float(step), **kwargs)


def _factor_at_tokens(step: int, *, progress: "TokenProgress", **kwargs) -> float:
    # LambdaLR passes its step count; a token schedule follows the tokens fed to `progress` instead.
    return lr_factor(float(progress.tokens_seen), **kwargs)


# ---------------------------------------------------------------------------------------------------------
# Token-based progress
# ---------------------------------------------------------------------------------------------------------


class TokenProgress:
    """Counts the tokens trained on, so a schedule can follow tokens_seen / total_tokens instead of steps.

    Feed it the tokens actually trained on (summed over processes) before each `scheduler.step()`. Its state
    is two integers; `ScheduleLR.state_dict()` carries it, so a checkpoint restores it.

    Args:
        total_tokens (`int`):
            Tokens in the whole run (summed over processes); the schedule reaches its floor there.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.schedules import TokenProgress, make_scheduler
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        >>> progress = TokenProgress(total_tokens=1000)
        >>> sched = make_scheduler(opt, num_training_steps=10, lr_decay="linear", progress=progress)
        >>> progress.add(250); opt.step(); sched.step()
        >>> sched.get_last_lr()
        [0.75]
        ```
    """

    def __init__(self, total_tokens: int):
        if isinstance(total_tokens, bool) or not isinstance(total_tokens, numbers.Integral) or total_tokens <= 0:
            raise ConfigError("total_tokens", total_tokens, "must be an integer >= 1")
        self.total_tokens = int(total_tokens)
        self._seen = 0
        self._pending: list = []

    def add(self, n) -> None:
        """Count `n` more tokens trained on: an int (FastTrainer counts each batch on the host, before it
        moves to the device), or an object whose ``value()`` gives the int later (a count still being copied
        from the device, :class:`hf_fasttrain.throughput.HostCopy`: a sum over processes); it is read when
        the count is next needed, at ``scheduler.step()``."""
        if hasattr(n, "value"):
            self._pending.append(n)
            return
        n = int(n)
        if n < 0:
            raise ValueError(f"TokenProgress.add(n={n}): n must be >= 0")
        self._seen += n

    @property
    def tokens_seen(self) -> int:
        """Tokens trained on so far (reads the counts added as pending values)."""
        if self._pending:
            pending, self._pending = self._pending, []
            for p in pending:
                self.add(p.value())
        return self._seen

    @tokens_seen.setter
    def tokens_seen(self, n: int) -> None:
        self._pending = []
        self._seen = int(n)

    @property
    def fraction(self) -> float:
        """tokens_seen / total_tokens (may exceed 1 when training runs past the budget)."""
        return self.tokens_seen / self.total_tokens

    # NOTE: total_tokens is configuration, not state: on resume it comes from the new run's settings, as
    # num_training_steps does for a step schedule. Only the count is restored.
    def state_dict(self) -> dict[str, int]:
        return {"tokens_seen": self.tokens_seen, "total_tokens": self.total_tokens}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        self.tokens_seen = int(state["tokens_seen"])

    def __repr__(self) -> str:
        return f"TokenProgress(tokens_seen={self.tokens_seen}, total_tokens={self.total_tokens})"


# ---------------------------------------------------------------------------------------------------------
# The spec: the schedule's settings, checked in one place, passed whole
# ---------------------------------------------------------------------------------------------------------


def _is_number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def resolve_warmup_steps(warmup_steps: float, num_training_steps: int) -> int:
    """Warmup length in steps: an integer count, or for `0 < warmup_steps < 1` a fraction of training.

    Fractions round up, as `TrainingArguments.get_warmup_steps` does (`ceil(N * fraction)`).
    Raises ValueError for a negative value, a non-integral value >= 1, or a warmup longer than training.
    """
    if not _is_number(warmup_steps) or warmup_steps < 0:
        raise ValueError(
            f"warmup_steps: got {warmup_steps!r}; must be an integer >= 0 (steps) "
            f"or a fraction 0 < warmup_steps < 1 of the training steps"
        )
    if warmup_steps >= 1 and warmup_steps != int(warmup_steps):
        raise ValueError(
            f"warmup_steps: got {warmup_steps!r}; values >= 1 count steps and must be whole numbers "
            f"(a fraction of training must be < 1)"
        )
    steps = int(warmup_steps) if warmup_steps >= 1 or warmup_steps == 0 else math.ceil(num_training_steps * warmup_steps)
    if steps > num_training_steps:
        raise ValueError(
            f"warmup_steps: got {warmup_steps!r} ({steps} steps), longer than training ({num_training_steps} "
            f"steps); must be at most {num_training_steps} steps, or a fraction < 1 of the run"
        )
    return steps


def _floor_ratios(base_lrs: Sequence[float], min_lr, min_lr_ratio) -> list[float]:
    """Per-group floor as a fraction of that group's peak lr."""
    if min_lr is None:
        return [float(min_lr_ratio or 0.0)] * len(base_lrs)
    floors = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr] * len(base_lrs)
    if len(floors) != len(base_lrs):
        raise ConfigError("min_lr", min_lr, "give one, or one per param group",
                          problem=f"got {min_lr!r}: {len(floors)} floors for {len(base_lrs)} param groups")
    ratios = []
    for i, (floor, peak) in enumerate(zip(floors, base_lrs)):
        if floor > peak:
            raise ConfigError(
                "min_lr", min_lr, "the floor must be <= the peak (or use min_lr_ratio, a fraction of each group's "
                "own peak)", problem=f"got {floor!r}, above the peak lr {peak!r} of param group {i}",
            )
        ratios.append(floor / peak if peak > 0 else 0.0)
    return ratios


@dataclass(frozen=True)
class ScheduleSpec:
    """The settings of one lr schedule: linear warmup, then a decay shape down to a floor. Checks itself on creation.

    Built once, from the flat options (`from_args`) or from the keywords of `make_scheduler` and
    `LRScheduleCallback` (the same names, `lr_decay` being `decay`), then passed whole:
    `spec.build(optimizer, num_training_steps)` is the `LambdaLR`, `spec.factor(step, num_training_steps)`
    one multiplier. Refusals name the option as users write it (`lr_decay`, `schedule_unit`, ...).

    Args:
        decay: a name in `DECAY_SHAPES`: `"cosine"`, `"sqrt"`, `"linear"`, `"1-sqrt"` or `"constant"`.
        warmup_steps: linear warmup length: an integer number of steps, or a fraction `0 < x < 1` of training
            (checked against the run's length when a schedule is built).
        warmup_start_factor: multiplier at step 0, rising linearly to 1 at the end of the warmup.
        min_lr: absolute floor lr (one for all groups, or one per group); must be <= each group's peak.
        min_lr_ratio: floor as a fraction of each group's peak lr. At most one of `min_lr` / `min_lr_ratio`;
            neither means a floor of 0.
        decay_fraction: decay only over the last `decay_fraction` of training, at the peak before (WSD).
            `None`: 0.2 for `"1-sqrt"`, the whole post-warmup span for the other shapes.
        unit: progress counted in optimizer `"steps"`, or in `"tokens"` trained on (pass a `TokenProgress`).
        total_tokens: with `unit="tokens"`, the tokens at which the schedule reaches its floor; `None` leaves
            the total to the caller (FastTrainer: steps x global batch x row length).

    Example:
        ```python
        >>> from hf_fasttrain.schedules import ScheduleSpec
        >>> spec = ScheduleSpec("linear", warmup_steps=2, min_lr_ratio=0.1)
        >>> [round(spec.factor(step, 12), 3) for step in (0, 1, 2, 7, 12)]
        [0.0, 0.5, 1.0, 0.55, 0.1]
        ```
    """

    decay: DecayName = "cosine"
    warmup_steps: float = 0
    warmup_start_factor: float = 0.0
    min_lr: float | Sequence[float] | None = None
    min_lr_ratio: float | None = None
    decay_fraction: float | None = None
    unit: ScheduleUnit = "steps"
    total_tokens: int | None = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check the settings that do not depend on the run length or the optimizer. Raises ValueError."""
        get_decay_shape(self.decay)
        if not _is_number(self.warmup_start_factor) or not 0.0 <= self.warmup_start_factor <= 1.0:
            raise ValueError(f"warmup_start_factor: got {self.warmup_start_factor!r}; must be in [0, 1]")
        min_lr, min_lr_ratio, decay_fraction = self.min_lr, self.min_lr_ratio, self.decay_fraction
        if min_lr is not None and min_lr_ratio is not None:
            raise ValueError(
                f"min_lr: got {min_lr!r} with min_lr_ratio={min_lr_ratio!r}; set at most one "
                f"(min_lr is an absolute floor, min_lr_ratio a fraction of each param group's peak lr)"
            )
        if min_lr_ratio is not None and (not _is_number(min_lr_ratio) or not 0.0 <= min_lr_ratio <= 1.0):
            raise ValueError(f"min_lr_ratio: got {min_lr_ratio!r}; must be in [0, 1] (a floor above the peak is not)")
        if min_lr is not None:
            values = list(min_lr) if isinstance(min_lr, (list, tuple)) else [min_lr]
            if not values or not all(_is_number(v) and v >= 0 for v in values):
                raise ValueError(f"min_lr: got {min_lr!r}; must be a number >= 0 or one per param group")
        if decay_fraction is not None:
            if not _is_number(decay_fraction) or not 0.0 < decay_fraction <= 1.0:
                raise ValueError(f"decay_fraction: got {decay_fraction!r}; must be in (0, 1]")
            if self.decay == "constant":
                raise ValueError(
                    f"decay_fraction: got {decay_fraction!r} with lr_decay='constant', which never decays; "
                    f"choose a decaying shape ({', '.join(n for n in DECAY_SHAPES if n != 'constant')}) or drop decay_fraction"
                )
        if self.unit not in SCHEDULE_UNITS:
            raise ConfigError("schedule_unit", self.unit, "allowed: " + ", ".join(map(repr, SCHEDULE_UNITS)))
        if self.total_tokens is not None:
            if self.unit != "tokens":
                raise ConfigError("schedule_total_tokens", self.total_tokens, "only used with schedule_unit='tokens'")
            if isinstance(self.total_tokens, bool) or not isinstance(self.total_tokens, int) or self.total_tokens <= 0:
                raise ConfigError("schedule_total_tokens", self.total_tokens, "must be a positive integer or null")

    @classmethod
    def from_args(cls, args) -> "ScheduleSpec | None":
        """The spec of `FastTrainingArguments` (or any object with those attributes, e.g. `FastOptions(args)`);
        None when `args.lr_decay` is None (the Trainer's `lr_scheduler_type` is in charge). The warmup is the
        Trainer's own `warmup_steps`."""
        if args.lr_decay is None:
            return None
        return cls(args.lr_decay, args.warmup_steps, args.warmup_start_factor, args.min_lr, args.min_lr_ratio,
                   args.decay_fraction, args.schedule_unit, args.schedule_total_tokens)

    def phases(self, num_training_steps: int, progress: TokenProgress | None = None) -> tuple[float, float, float]:
        """N, W and D of the module's formula for a run of `num_training_steps`, in steps (or tokens, with `progress`:
        an integer warmup keeps its share of the steps, a fraction is taken of the tokens). Raises ValueError where
        the warmup or the decay does not fit the run."""
        if isinstance(num_training_steps, bool) or not isinstance(num_training_steps, numbers.Integral) or num_training_steps <= 0:
            raise ConfigError("num_training_steps", num_training_steps, "must be an integer >= 1")
        if progress is not None and not isinstance(progress, TokenProgress):
            raise ConfigError("progress", progress, "pass a TokenProgress or None (count steps)")
        warmup = resolve_warmup_steps(self.warmup_steps, num_training_steps)
        decay_fraction = self.decay_fraction if self.decay_fraction is not None else DEFAULT_DECAY_FRACTION.get(self.decay)
        total = float(num_training_steps) if progress is None else float(progress.total_tokens)
        if progress is None:
            warmup_x = float(warmup)
        elif 0 < self.warmup_steps < 1:
            warmup_x = self.warmup_steps * total
        else:
            warmup_x = warmup * total / num_training_steps
        decay_start = warmup_x if decay_fraction is None else total * (1.0 - decay_fraction)
        if decay_start < warmup_x - 1e-9 * total:
            raise ValueError(
                f"decay_fraction: got {decay_fraction!r}, which starts the decay inside the warmup (warmup_steps="
                f"{self.warmup_steps!r} of {num_training_steps} steps); must be <= {1.0 - warmup_x / total:g}"
            )
        return total, warmup_x, max(decay_start, warmup_x)

    def lr_lambdas(
        self, base_lrs: Sequence[float], num_training_steps: int, progress: TokenProgress | None = None
    ) -> list[functools.partial]:
        """One multiplier function `step -> factor` per param group (peak lrs `base_lrs`), for `LambdaLR`.

        With `progress` the functions follow `progress.tokens_seen` and ignore the step LambdaLR passes.
        """
        total, warmup, decay_start = self.phases(num_training_steps, progress)
        fn = _factor_at_step if progress is None else functools.partial(_factor_at_tokens, progress=progress)
        shape = get_decay_shape(self.decay)
        return [
            functools.partial(fn, shape=shape, total=total, warmup=warmup, decay_start=decay_start,
                              warmup_start_factor=float(self.warmup_start_factor), floor=floor)
            for floor in _floor_ratios(list(base_lrs), self.min_lr, self.min_lr_ratio)
        ]

    def factor(self, step: int, num_training_steps: int, peak_lr: float = 1.0) -> float:
        """Multiplier of a param group with peak `peak_lr` at optimizer step `step` of `num_training_steps`."""
        (fn,) = self.lr_lambdas([peak_lr], num_training_steps)
        return fn(step)

    def curve(self, num_training_steps: int, peak_lr: float = 1.0) -> list[float]:
        """The lr at steps 0..num_training_steps of one param group with peak `peak_lr`."""
        (fn,) = self.lr_lambdas([peak_lr], num_training_steps)
        return [peak_lr * fn(step) for step in range(num_training_steps + 1)]

    def build(
        self, optimizer: torch.optim.Optimizer, num_training_steps: int, progress: TokenProgress | None = None
    ) -> "ScheduleLR":
        """The schedule as a `ScheduleLR` (a `LambdaLR`) over `optimizer`, whose param groups' current `lr` (or
        `initial_lr`) are the peak lrs; `progress` follows tokens instead of steps."""
        base_lrs = [group.get("initial_lr", group["lr"]) for group in optimizer.param_groups]
        return ScheduleLR(optimizer, self.lr_lambdas(base_lrs, num_training_steps, progress), progress=progress)


# ---------------------------------------------------------------------------------------------------------
# The edge: LambdaLR
# ---------------------------------------------------------------------------------------------------------


class ScheduleLR(LambdaLR):
    """`LambdaLR` whose `state_dict` also carries the `TokenProgress` of a token-based schedule.

    Built by `ScheduleSpec.build` (and `make_scheduler`). A step-based schedule needs no more state than
    LambdaLR's `last_epoch` (the multiplier is a pure function of it); a token-based one adds the token count.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.schedules import make_scheduler
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = make_scheduler(opt, 100, lr_decay="cosine", warmup_steps=10, warmup_start_factor=0.1)
        >>> sched.get_last_lr()
        [0.1]
        ```
    """

    def __init__(self, optimizer: torch.optim.Optimizer, lr_lambdas, progress: TokenProgress | None = None):
        self.progress = progress
        super().__init__(optimizer, lr_lambdas)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state.pop("progress", None)  # the object itself is not saved, only its counts (loads with weights_only)
        state["token_progress"] = None if self.progress is None else self.progress.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state_dict = dict(state_dict)
        token_state = state_dict.pop("token_progress", None)
        progress = self.progress
        super().load_state_dict(state_dict)
        self.progress = progress
        if token_state is not None:
            if progress is None:
                raise ValueError("the checkpoint holds a token-based schedule but this scheduler counts steps (progress=None)")
            progress.load_state_dict(token_state)


def make_scheduler(
    optimizer: torch.optim.Optimizer,
    num_training_steps: int,
    lr_decay: DecayName = "cosine",
    warmup_steps: float = 0,
    warmup_start_factor: float = 0.0,
    min_lr: float | Sequence[float] | None = None,
    min_lr_ratio: float | None = None,
    decay_fraction: float | None = None,
    progress: TokenProgress | None = None,
) -> ScheduleLR:
    """Warmup then decay to a floor, as a `LambdaLR` with one multiplier per param group.

    Args:
        optimizer (`torch.optim.Optimizer`):
            Its param groups' current `lr` (or `initial_lr`) are the peak lrs.
        num_training_steps (`int`):
            Optimizer steps in the run.
        lr_decay: the decay shape: `"cosine"`, `"sqrt"`, `"linear"`, `"1-sqrt"` or `"constant"` (`ScheduleSpec.decay`).
        warmup_steps: steps, or a fraction `0 < x < 1` of training (`ScheduleSpec.warmup_steps`).
        warmup_start_factor: multiplier at step 0 (`ScheduleSpec.warmup_start_factor`).
        min_lr: absolute floor lr, one or one per param group (`ScheduleSpec.min_lr`).
        min_lr_ratio: floor as a fraction of each group's peak lr (`ScheduleSpec.min_lr_ratio`).
        decay_fraction: decay over only this last fraction of training (WSD) (`ScheduleSpec.decay_fraction`).
        progress (`TokenProgress`, *optional*, defaults to `None`):
            Follow tokens instead of steps; `None` counts optimizer steps.

    Returns:
        `ScheduleLR` (a `LambdaLR`): call `step()` after each `optimizer.step()`.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.schedules import make_scheduler
        >>> opt = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=1.0)
        >>> sched = make_scheduler(opt, num_training_steps=100, lr_decay="cosine", warmup_steps=10, min_lr_ratio=0.1)
        >>> for _ in range(10):
        ...     opt.step(); sched.step()
        >>> sched.get_last_lr()
        [1.0]
        ```
    """
    spec = ScheduleSpec(lr_decay, warmup_steps, warmup_start_factor, min_lr, min_lr_ratio, decay_fraction,
                        unit="steps" if progress is None else "tokens")
    return spec.build(optimizer, num_training_steps, progress)


# ---------------------------------------------------------------------------------------------------------
# Plot: python -m hf_fasttrain.schedules --plot out.png
# ---------------------------------------------------------------------------------------------------------


def plot_schedules(path: str, decays: Sequence[str], num_training_steps: int, peak_lr: float = 1.0, **settings) -> None:
    """Draw the lr of each decay shape in its own panel, two to a row, the other shapes faint for comparison."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {name: ScheduleSpec(name, **settings).curve(num_training_steps, peak_lr) for name in decays}
    steps = list(range(num_training_steps + 1))
    # two panels to a row: the figure stays legible at a documentation page's width
    cols = min(2, len(decays))
    rows = -(-len(decays) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.6 * rows), sharey=True, squeeze=False)
    for ax in axes.flat[len(decays):]:
        ax.set_visible(False)
    for ax, (name, lrs) in zip(axes.flat, curves.items()):
        for other, other_lrs in curves.items():
            if other != name:
                ax.plot(steps, other_lrs, color="0.85", linewidth=1)
        ax.plot(steps, lrs, linewidth=2)
        ax.set_title(name)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
    for row in axes:
        row[0].set_ylabel("learning rate")
    shown = ", ".join(f"{k}={v}" for k, v in settings.items() if v is not None)
    fig.suptitle(f"num_training_steps={num_training_steps}, peak lr={peak_lr:g}, {shown}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, prog="python -m hf_fasttrain.schedules", description="Plot lr schedules.")
    parser.add_argument("--plot", required=True, help="output PNG path")
    parser.add_argument("--decays", default="cosine,sqrt,linear,1-sqrt", help=f"comma-separated, from: {', '.join(DECAY_SHAPES)}")
    parser.add_argument("--total-steps", type=int, default=1000)
    parser.add_argument("--warmup-steps", type=float, default=0.02, help="steps, or a fraction of training if < 1")
    parser.add_argument("--warmup-start-factor", type=float, default=0.0)
    parser.add_argument("--peak-lr", type=float, default=1.0)
    floor = parser.add_mutually_exclusive_group()
    floor.add_argument("--min-lr", type=float, default=None)
    floor.add_argument("--min-lr-ratio", type=float, default=None)
    parser.add_argument("--decay-fraction", type=float, default=None, help="WSD: decay over this last fraction only")
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    settings = vars(make_parser().parse_args(argv))  # the other options are `plot_schedules`' keywords, same names
    path, decays, total_steps = settings.pop("plot"), settings.pop("decays"), settings.pop("total_steps")
    if settings["warmup_steps"] >= 1:
        settings["warmup_steps"] = int(settings["warmup_steps"])
    plot_schedules(path, [d.strip() for d in decays.split(",") if d.strip()], total_steps, **settings)
    print(f"wrote {path}")

if __name__ == "__main__":
    main()
