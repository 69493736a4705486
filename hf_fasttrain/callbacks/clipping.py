"""Gradient clipping by value, by global norm or adaptively (AGC), as a callback for any Trainer.

The math lives in :mod:`hf_fasttrain.stability.clipping`; this module runs it once per optimizer step at
``on_pre_optimizer_step`` and keeps the statistics for the logs (see :mod:`.mixin` for where that is
in the Trainer's step).
"""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..validation import ConfigError
from ..config.args import fast_option
from ..stability.clipping import (
    CLIP_MODES,
    ClipStats,
    agc_unit_dims,
    clip_agc_,
    clip_by_global_norm_,
    clip_by_value_,
    default_unit_dims,
    global_grad_norm,
)
from .mixin import ensure_unscaled, merge_in_on_log, optimizer_params, unsupported_parallelism

__all__ = ["GradientClippingCallback", "ClipStatsWindow"]

logger = logging.getLogger(__name__)


class ClipStatsWindow:
    """Clip statistics of the optimizer steps since the last log, kept as tensors (no host sync).

    ``pop()`` gives the means over those steps: ``clip_pre_norm``, ``clip_post_norm``, ``clip_fraction``
    and the largest ``clip_pre_norm_max``.

    Example:
        ```python
        >>> from hf_fasttrain.stability.clipping import norm_clip_stats
        >>> w = ClipStatsWindow()
        >>> w.add(norm_clip_stats(torch.tensor(4.0), 1.0)); w.add(norm_clip_stats(torch.tensor(0.5), 1.0))
        >>> {k: round(v, 4) for k, v in w.pop().items()}
        {'clip_pre_norm': 2.25, 'clip_pre_norm_max': 4.0, 'clip_post_norm': 0.75, 'clip_fraction': 0.5}
        ```
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.steps = 0
        self.pre_sum = self.pre_max = self.post_sum = self.frac_sum = None

    def add(self, stats: ClipStats) -> None:
        pre, post, frac = stats.pre_norm.detach(), stats.post_norm.detach(), stats.fraction.detach()
        if self.steps == 0:
            self.pre_sum, self.pre_max, self.post_sum, self.frac_sum = pre.clone(), pre.clone(), post.clone(), frac.clone()
        else:
            self.pre_sum += pre
            self.pre_max = torch.maximum(self.pre_max, pre)
            self.post_sum += post
            self.frac_sum += frac
        self.steps += 1

    def pop(self) -> dict[str, float]:
        if self.steps == 0:
            return {}
        n = self.steps
        out = {
            "clip_pre_norm": float(self.pre_sum) / n,
            "clip_pre_norm_max": float(self.pre_max),
            "clip_post_norm": float(self.post_sum) / n,
            "clip_fraction": float(self.frac_sum) / n,
        }
        self.reset()
        return out


def _check_number(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or not value > 0:
        raise ConfigError(name, value, "must be a finite number > 0")


class GradientClippingCallback(TrainerCallback, ExportableState):
    """Clips gradients by value, by global L2 norm or adaptively (AGC) once per optimizer step.

    Runs at ``on_pre_optimizer_step``: after gradient accumulation, after DDP reduction and after fp16
    unscaling. The statistics of each logging window are added to the training logs: ``clip_pre_norm``
    and ``clip_post_norm`` (mean global L2 norm before / after this callback clips), ``clip_pre_norm_max``
    and ``clip_fraction`` (value mode: mean fraction of gradient elements clipped; norm mode: fraction
    of steps clipped; AGC: mean fraction of units clipped).

    Args:
        mode (`str`, *optional*, defaults to `"value"`):
            ``"value"`` (clamp each element to ``[-clip_value, clip_value]``), ``"norm"`` (scale all
            gradients to global norm ``max_norm`` when above it), ``"agc"`` (adaptive, unit-wise, see
            :func:`hf_fasttrain.stability.clipping.clip_agc_`) or ``"none"`` (measure and log only).
        clip_value (`float`, *optional*, defaults to `1.0`):
            The bound for ``"value"``.
        max_norm (`float`, *optional*, defaults to `1.0`):
            The threshold for ``"norm"``. The Trainer already clips by norm with
            ``TrainingArguments.max_grad_norm`` (default 1.0), which is what most users want; this mode
            exists for symmetry and requires ``max_grad_norm=0`` so the two do not stack.
        agc_lambda (`float`, *optional*, defaults to `0.01`):
            AGC's threshold lambda on ``||G_i|| / max(||W_i||, eps)`` (Brock et al. 2021 use 0.01 at batch
            4096 and larger values for smaller batches).
        agc_eps (`float`, *optional*, defaults to `1e-3`):
            AGC's floor on unit weight norms (the paper's).
        agc_clip_output_layer (`bool`, *optional*, defaults to `False`):
            Also clip the output layer (the paper does not; with tied embeddings this concerns the input
            embedding too).

    With ``mode="value"`` or ``"agc"`` and the Trainer's ``max_grad_norm > 0`` (its default, 1.0) both
    clips apply, norm first. Keep it so: value and AGC clipping bound each element or unit, not the
    update, and a x1e6 gradient clipped by value alone still moves every weight by ``clip_value``
    (measured in ``benchmarks/faults.py``). ``max_grad_norm=0`` gives value or AGC clipping alone.

    Example:
        ```python
        args = TrainingArguments(output_dir="out", logging_steps=10)   # max_grad_norm=1.0 stays on
        trainer = Trainer(model=model, args=args, train_dataset=ds)
        trainer.add_callback(GradientClippingCallback(mode="value", clip_value=1.0))
        trainer.train()   # logs clip_pre_norm, clip_post_norm, clip_fraction every 10 steps
        ```
    """

    def __init__(
        self,
        mode: str = "value",
        clip_value: float = 1.0,
        max_norm: float = 1.0,
        agc_lambda: float = 0.01,
        agc_eps: float = 1e-3,
        agc_clip_output_layer: bool = False,
    ):
        if mode not in CLIP_MODES:
            raise ConfigError("mode", mode, f"allowed: {', '.join(CLIP_MODES)}")
        _check_number("clip_value", clip_value)
        _check_number("max_norm", max_norm)
        _check_number("agc_lambda", agc_lambda)
        _check_number("agc_eps", agc_eps)
        self.mode = mode
        self.clip_value = clip_value
        self.max_norm = max_norm
        self.agc_lambda = agc_lambda
        self.agc_eps = agc_eps
        self.agc_clip_output_layer = bool(agc_clip_output_layer)
        self._window = ClipStatsWindow()
        self._agc_dims: dict[int, Any] = {}
        self.last_stats: ClipStats | None = None

    # ExportableState: no training state, but being exportable keeps this callback's order relative to
    # the guard when the Trainer re-creates stateful callbacks on resume.
    def state(self) -> dict:
        return {
            "args": {
                "mode": self.mode,
                "clip_value": self.clip_value,
                "max_norm": self.max_norm,
                "agc_lambda": self.agc_lambda,
                "agc_eps": self.agc_eps,
                "agc_clip_output_layer": self.agc_clip_output_layer,
            },
            "attributes": {},
        }

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        unsupported = unsupported_parallelism(args)
        if unsupported:
            raise ValueError(
                f"GradientClippingCallback supports one process and DDP, not {unsupported} (sharded gradients); "
                "use TrainingArguments.max_grad_norm for norm clipping there"
            )
        trainer_clip = args.max_grad_norm or 0.0
        if fast_option(args, "clip_mode") != "norm":
            trainer_clip = 0.0  # FastTrainingArguments: FastTrainer applies max_grad_norm in 'norm' mode only
        if self.mode == "norm" and trainer_clip > 0:
            raise ValueError(
                f"GradientClippingCallback(mode='norm') clips by itself, but TrainingArguments.max_grad_norm="
                f"{trainer_clip} already clips by norm before it; use max_grad_norm alone (no callback needed) "
                "or set max_grad_norm=0"
            )
        if self.mode in ("value", "agc") and trainer_clip > 0:
            # both apply, norm first: the norm clip bounds the size of the whole update, which value and
            # AGC clipping alone do not (a x1e6 gradient clipped by value still moves every weight by
            # clip_value in the direction of its sign)
            logger.info(f"max_grad_norm={trainer_clip} clips by norm before GradientClippingCallback(mode={self.mode!r})")
        self._window = ClipStatsWindow()  # a fresh train() (e.g. a hyperparameter_search trial) logs its own
        if self.mode == "agc" and model is not None:
            self._agc_dims = {id(p): dims for p, dims in agc_unit_dims(model, clip_output_layer=self.agc_clip_output_layer)}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is None:
            return
        ensure_unscaled(optimizer)
        params = [p for p in optimizer_params(optimizer) if p.grad is not None]
        if not params:  # a step the divergence guard dropped: nothing to clip or to count
            return
        grads = [p.grad for p in params]
        if self.mode == "value":
            stats = clip_by_value_(grads, self.clip_value)
        elif self.mode == "norm":
            stats = clip_by_global_norm_(grads, self.max_norm)
        elif self.mode == "agc":
            dims = [self._agc_dims.get(id(p), default_unit_dims(p)) for p in params]
            stats = clip_agc_(params, grads, self.agc_lambda, self.agc_eps, dims)
        else:
            pre = global_grad_norm(grads)
            stats = ClipStats(pre, pre, torch.zeros((), dtype=torch.int64, device=pre.device), 1)
        self.last_stats = stats
        self._window.add(stats)

    def pop_log_stats(self) -> dict[str, float]:
        """The statistics since the last call, as floats (empty if no step was taken)."""
        return self._window.pop()


    def on_log(self, args, state, control, logs=None, **kwargs):
        merge_in_on_log(self, state, logs)
