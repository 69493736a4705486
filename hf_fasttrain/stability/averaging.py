"""Weight averaging: an exponential moving average of the weights (EMA) or the uniform average of the
latest checkpoints (LAWA). Plain tensors in, plain tensors out; no Trainer inside.

At a high learning rate the iterate bounces across a valley; an average of recent iterates sits lower in
it, so evaluating (and shipping) the average reaches a given loss sooner.

- ``"ema"``: after optimizer step t, ``avg <- d_t * avg + (1 - d_t) * w`` with
  ``d_t = min(decay, (1 + t) / (10 + t))`` when ``warmup`` is on (the step-count warmup of
  ``tf.train.ExponentialMovingAverage``, so the random init is forgotten early), else ``d_t = decay``.
  Composer's ``EMA`` algorithm is this rule with ``decay = 2 ** (-1 / half_life)``
  (:func:`decay_from_half_life`) and no warmup.
- ``"lawa"``: every ``interval`` steps the weights are copied into a window of the last ``k`` copies;
  the average is their mean (Sanyal et al. 2023, "Early Weight Averaging meets High Learning Rates for
  LLM Pre-training"). Before the first copy the average is the current weights.

Only floating-point tensors are averaged, in float32 (a bf16 model's average does not lose its small
updates); other tensors are left alone.

References:
- Polyak and Juditsky 1992; Izmailov et al. 2018 (SWA); Composer ``composer/algorithms/ema``.
- Sanyal et al. 2023, arXiv:2306.03241 (LAWA).

Example:
    ```python
    >>> import torch
    >>> w = {"x": torch.tensor([0.0])}
    >>> avg = WeightAverage(w, mode="ema", decay=0.5, warmup=False)
    >>> _ = w["x"].fill_(1.0); _ = avg.update(w, step=1)
    >>> avg.average()["x"].tolist()
    [0.5]
    ```
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Literal, Optional, get_args

import torch

from ..validation import ConfigError

__all__ = ["AVERAGING_MODES", "AveragingSpec", "ARGS_FIELDS", "decay_from_half_life", "ema_decay_at", "ema_update_", "WeightAverage",
           "check_averaging_settings", "save_average_file", "load_average_file"]

AveragingMode = Literal["none", "ema", "lawa"]
AVERAGING_MODES: tuple[str, ...] = get_args(AveragingMode)


def decay_from_half_life(half_life_steps: float) -> float:
    """EMA decay whose weight on an iterate halves every ``half_life_steps`` steps (Composer's half_life)."""
    if not (isinstance(half_life_steps, (int, float)) and half_life_steps > 0):
        raise ConfigError("half_life_steps", half_life_steps, "must be a number > 0")
    return 2.0 ** (-1.0 / half_life_steps)


def ema_decay_at(step: int, decay: float, warmup: bool = True) -> float:
    """Decay used by the update after optimizer step ``step`` (1 for the first): ``min(decay, (1+t)/(10+t))``
    with ``warmup``, else ``decay``."""
    return min(decay, (1.0 + step) / (10.0 + step)) if warmup else decay


def ema_update_(average: list[torch.Tensor], params: list[torch.Tensor], decay: float) -> None:
    """``average <- decay * average + (1 - decay) * params``, in place (one fused lerp)."""
    params = [p.to(dtype=a.dtype, device=a.device) for a, p in zip(average, params)]
    torch._foreach_lerp_(average, params, 1.0 - decay)


# FastTrainingArguments' names for the settings, so one check serves both
ARGS_FIELDS = {"mode": "weight_averaging", "decay": "ema_decay", "update_every": "ema_update_every",
               "lawa_k": "lawa_checkpoints", "lawa_interval": "lawa_interval"}


def check_averaging_settings(mode: str, decay: float, update_every: int, lawa_k: int, lawa_interval: int,
                             names: Optional[Mapping[str, str]] = None) -> None:
    """Raise ValueError naming the field, the value and what is allowed (``names``: how the caller
    spells each setting, e.g. ``ARGS_FIELDS``)."""
    names = {k: k for k in ARGS_FIELDS} | dict(names or {})
    if mode not in AVERAGING_MODES:
        raise ValueError(f"{names['mode']}: got {mode!r}; allowed: {', '.join(AVERAGING_MODES)}")
    if not (isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0.0 < decay < 1.0):
        raise ValueError(f"{names['decay']}: got {decay!r}; must be in (0, 1), e.g. 0.99")
    for key, value in (("update_every", update_every), ("lawa_k", lawa_k), ("lawa_interval", lawa_interval)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{names[key]}: got {value!r}; must be an integer >= 1")


@dataclasses.dataclass(frozen=True)
class AveragingSpec:
    """Weight averaging's settings in one object: read once from the arguments (:meth:`from_args`), checked in
    one place (:meth:`validate`) and handed whole to the callback."""

    mode: AveragingMode = "none"
    decay: float = 0.99
    warmup: bool = True
    update_every: int = 1
    lawa_k: int = 5
    lawa_interval: int = 10

    @classmethod
    def from_args(cls, args) -> "AveragingSpec":
        """From FastTrainingArguments' fields (``weight_averaging``, ``ema_decay``, ``ema_warmup``,
        ``ema_update_every``, ``lawa_checkpoints``, ``lawa_interval``; their defaults on other arguments),
        checked; a refusal names the arguments' field."""
        spec = cls(mode=getattr(args, "weight_averaging", "none"), decay=getattr(args, "ema_decay", 0.99),
                   warmup=getattr(args, "ema_warmup", True), update_every=getattr(args, "ema_update_every", 1),
                   lawa_k=getattr(args, "lawa_checkpoints", 5), lawa_interval=getattr(args, "lawa_interval", 10))
        spec.validate(names=ARGS_FIELDS)
        return spec

    def validate(self, names: Optional[Mapping[str, str]] = None) -> None:
        """Raise ValueError naming the field (as ``names`` spells it), the value and what is allowed."""
        check_averaging_settings(self.mode, self.decay, self.update_every, self.lawa_k, self.lawa_interval,
                                 names=names)


class WeightAverage:
    """An average of a set of named weights, updated after each optimizer step.

    Args:
        weights: name -> tensor (e.g. ``dict(model.named_parameters())``): the starting point, read once.
        mode: ``"ema"`` or ``"lawa"``.
        decay: EMA decay (``ema``).
        warmup: EMA decay warmup ``min(decay, (1+t)/(10+t))`` (``ema``).
        update_every: ``ema`` updates after every ``update_every``-th step only (a cheaper average on large
            models; Composer's ``update_interval``), with the decay raised to that power.
        lawa_k: copies kept in the window (``lawa``).
        lawa_interval: steps between copies (``lawa``).
        device: where the average lives (default: beside each weight).
    """

    def __init__(self, weights: Mapping[str, torch.Tensor], mode: str = "ema", decay: float = 0.99,
                 warmup: bool = True, update_every: int = 1, lawa_k: int = 5, lawa_interval: int = 10,
                 device: Optional[torch.device] = None):
        check_averaging_settings(mode, decay, update_every, lawa_k, lawa_interval)
        if mode == "none":
            raise ValueError("mode='none' has no average; do not build a WeightAverage")
        self.mode = mode
        self.decay = float(decay)
        self.warmup = bool(warmup)
        self.update_every = int(update_every)
        self.lawa_k = int(lawa_k)
        self.lawa_interval = int(lawa_interval)
        self.device = device
        self.names = [n for n, w in weights.items() if torch.is_floating_point(w)]
        self.num_updates = 0
        self.ema: dict[str, torch.Tensor] = {}
        self.window: deque[dict[str, torch.Tensor]] = deque(maxlen=self.lawa_k)
        if mode == "ema":
            self.ema = {n: self._copy(weights[n]) for n in self.names}
        self._current = {n: weights[n] for n in self.names}  # live references: the average before any copy

    def _copy(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach().to(device=self.device or t.device, dtype=torch.float32, copy=True)

    # -- updates -------------------------------------------------------------------------------
    def update(self, weights: Mapping[str, torch.Tensor], step: int) -> bool:
        """Fold in the weights after optimizer step ``step`` (1 for the first). Returns whether it did."""
        self._current = {n: weights[n] for n in self.names}
        if self.mode == "ema":
            if step % self.update_every:
                return False
            decay = ema_decay_at(step, self.decay, self.warmup) ** self.update_every
            with torch.no_grad():
                ema_update_([self.ema[n] for n in self.names], [weights[n].detach() for n in self.names], decay)
        else:
            if step % self.lawa_interval:
                return False
            self.window.append({n: self._copy(weights[n]) for n in self.names})
        self.num_updates += 1
        return True

    def average(self) -> dict[str, torch.Tensor]:
        """name -> averaged tensor (float32)."""
        if self.mode == "ema":
            return dict(self.ema)
        if not self.window:
            return {n: self._copy(t) for n, t in self._current.items()}
        out = {}
        for n in self.names:
            acc = torch.zeros_like(self.window[0][n])
            for snap in self.window:
                acc += snap[n]
            out[n] = acc / len(self.window)
        return out

    # -- the average in a model ----------------------------------------------------------------
    def copy_to(self, model: torch.nn.Module) -> None:
        """Write the average into ``model``'s parameters (cast to each parameter's dtype)."""
        avg = self.average()
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n in self.names:
                params[n].copy_(avg[n].to(device=params[n].device, dtype=params[n].dtype))

    @contextlib.contextmanager
    def swapped_into(self, model: torch.nn.Module) -> Iterator[None]:
        """Inside the block ``model`` holds the average; afterwards its own weights, bit for bit."""
        params = dict(model.named_parameters())
        backup = {n: params[n].detach().clone() for n in self.names}
        self.copy_to(model)
        try:
            yield
        finally:
            with torch.no_grad():
                for n in self.names:
                    params[n].copy_(backup[n])

    # -- checkpoint state ----------------------------------------------------------------------
    # NOTE: the settings (decay, k, interval) are configuration and come from the resumed run's arguments;
    # only the averaged tensors and the update count are state.
    def state_dict(self) -> dict:
        return {"mode": self.mode, "num_updates": self.num_updates, "names": list(self.names),
                "ema": {n: t.cpu() for n, t in self.ema.items()},
                "window": [{n: t.cpu() for n, t in snap.items()} for snap in self.window]}

    def load_state_dict(self, state: Mapping) -> None:
        if state["mode"] != self.mode or list(state["names"]) != self.names:
            raise ValueError(
                f"cannot resume the weight average: the checkpoint holds mode={state['mode']!r} over "
                f"{len(state['names'])} tensors, this run mode={self.mode!r} over {len(self.names)}"
            )
        self.num_updates = int(state["num_updates"])
        if self.mode == "ema":
            for n in self.names:
                self.ema[n].copy_(state["ema"][n])
        self.window.clear()
        for snap in state["window"]:
            ref = self._current
            self.window.append({n: snap[n].to(device=self.device or ref[n].device, dtype=torch.float32)
                                for n in self.names})

    def finite(self) -> bool:
        """Whether every averaged value is finite (one host read)."""
        tensors = list(self.average().values())
        if not tensors:
            return True
        return bool(torch.stack([torch.isfinite(t).all().to(tensors[0].device) for t in tensors]).all())

    def nbytes(self) -> int:
        """Memory held by the average (the EMA copy, or the LAWA window)."""
        tensors = list(self.ema.values()) + [t for snap in self.window for t in snap.values()]
        return sum(t.numel() * t.element_size() for t in tensors)

    def __repr__(self) -> str:
        if self.mode == "ema":
            return f"WeightAverage(mode='ema', decay={self.decay}, warmup={self.warmup}, updates={self.num_updates})"
        return (f"WeightAverage(mode='lawa', k={self.lawa_k}, interval={self.lawa_interval}, "
                f"copies={len(self.window)})")


def save_average_file(state: Mapping, path: str) -> None:
    """Write a :meth:`WeightAverage.state_dict` to ``path`` (``torch.save``; plain tensors and lists).

    Atomic: written beside ``path`` and renamed, so a kill leaves the whole file or none.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        torch.save(dict(state), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def load_average_file(path: str) -> dict:
    """Read what :func:`save_average_file` wrote (``weights_only``: no code is unpickled)."""
    return torch.load(path, map_location="cpu", weights_only=True)
