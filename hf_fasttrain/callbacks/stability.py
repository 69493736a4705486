"""Training stability for the Hugging Face Trainer: gradient clipping and a divergence guard.

Two callbacks that work in a plain ``transformers.Trainer``::

    trainer.add_callback(DivergenceGuardCallback())                          # skip / roll back
    trainer.add_callback(GradientClippingCallback(mode="value", clip_value=1.0))

Add the guard first: callbacks run in the order they were added, and the guard should see the
gradients before they are clipped (it still sees NaN/inf after clipping, since clipping leaves
non-finite gradients alone, but a clipped gradient no longer looks like a spike).

Where they run. The Trainer's optimizer step is ``clip (max_grad_norm) -> on_pre_optimizer_step ->
optimizer.step() -> on_optimizer_step -> lr_scheduler.step() -> zero_grad -> on_step_end``. Both
callbacks act at ``on_pre_optimizer_step``: once per optimizer step whatever the gradient
accumulation, after DDP has averaged the gradients, and after fp16 gradients were unscaled (in
transformers 5.x the Trainer unscales through ``accelerator.clip_grad_norm_`` even when
``max_grad_norm`` is 0; :func:`ensure_unscaled` makes sure of it regardless, without unscaling twice).

Loss access. Callbacks are not given the loss. :class:`StabilityTrainerMixin` (used by
``FastTrainer``) hands each micro-batch loss from ``training_step`` to the guard, which then judges
every optimizer step before it is applied. Without the mixin, the guard reads ``logs["loss"]`` in
``on_log`` (the mean over the logging window; use ``logging_steps=1`` for per-step resolution) and
rolls back after the fact; NaN/inf are still caught every step from the gradients (a non-finite
loss gives non-finite gradients).

Logs. Callbacks cannot add to the Trainer's logs before they are written. The mixin's ``log`` merges
each callback's :meth:`pop_log_stats` first, so the numbers reach every integration. Without the
mixin, ``on_log`` merges them into ``logs`` and ``state.log_history[-1]``: they reach
``log_history`` and callbacks added after these, but not integrations (wandb, tensorboard), which run
earlier.

Not supported: DeepSpeed and FSDP (sharded gradients); the callbacks raise at ``on_train_begin``.
"""

from __future__ import annotations

import copy
import logging
import math
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..clipping import (
    ClipStats,
    agc_unit_dims,
    clip_agc_,
    clip_by_global_norm_,
    clip_by_value_,
    default_unit_dims,
    global_grad_norm,
)

__all__ = [
    "GradientClippingCallback",
    "DivergenceGuardCallback",
    "DivergenceError",
    "StabilityTrainerMixin",
    "ClipStatsWindow",
    "stability_callbacks",
    "TrainingSnapshot",
    "take_snapshot",
    "restore_snapshot",
    "load_checkpoint_state",
    "detect_spike",
    "ensure_unscaled",
    "report_loss",
    "merge_log_stats",
    "CLIP_MODES",
    "ROLLBACK_MODES",
]

logger = logging.getLogger(__name__)

CLIP_MODES = ("norm", "value", "agc", "none")
ROLLBACK_MODES = ("auto", "memory", "checkpoint", "none")


# --------------------------------------------------------------------------------------------------
# Shared helpers
# --------------------------------------------------------------------------------------------------


def ensure_unscaled(optimizer: Any) -> bool:
    """Unscale fp16 gradients if the optimizer's ``GradScaler`` has not done so this step.

    ``optimizer`` is what callbacks receive: accelerate's ``AcceleratedOptimizer``, which holds the
    ``scaler`` (None without fp16). Returns True if this call unscaled. Calling ``unscale_`` twice in
    one step raises in torch, so the scaler's per-optimizer stage is checked first.
    """
    scaler = getattr(optimizer, "scaler", None)
    if scaler is None or not scaler.is_enabled():
        return False
    from torch.amp.grad_scaler import OptState

    inner = getattr(optimizer, "optimizer", optimizer)
    if scaler._per_optimizer_states[id(inner)]["stage"] is OptState.READY:
        scaler.unscale_(inner)
        return True
    return False


def _optimizer_params(optimizer: Any) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def _unsupported_parallelism(args: Any) -> str | None:
    if getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return "DeepSpeed"
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "FSDP"
    return None


def _world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def _all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    """Sum or max over ranks (identity in a single process); decisions must agree on every rank."""
    if _world_size() > 1:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX)
    return t


def report_loss(callbacks: Iterable[Any], loss: torch.Tensor) -> None:
    """Hand a micro-batch loss (as returned by ``Trainer.training_step``) to callbacks that want it."""
    for cb in callbacks:
        if hasattr(cb, "observe_loss"):
            cb.observe_loss(loss)


def merge_log_stats(callbacks: Iterable[Any], logs: dict[str, float]) -> None:
    """Merge each callback's pending statistics into a training log (one that has ``loss``)."""
    if "loss" not in logs:
        return
    for cb in callbacks:
        if hasattr(cb, "pop_log_stats"):
            logs.update(cb.pop_log_stats())


def _merge_in_on_log(cb: Any, state: Any, logs: dict[str, float] | None) -> None:
    """The fallback without the mixin: add stats to ``logs`` and to the entry ``Trainer.log`` just stored."""
    if logs is None or "loss" not in logs:
        return
    stats = cb.pop_log_stats()
    if not stats:
        return
    logs.update(stats)
    if state.log_history and state.log_history[-1].get("step") == state.global_step and "loss" in state.log_history[-1]:
        state.log_history[-1].update(stats)


class StabilityTrainerMixin:
    """Trainer mixin: gives the divergence guard every loss, and puts stability stats in the logs.

    Overrides two public hooks and calls ``super()`` in both: ``training_step`` (hands the returned
    loss to callbacks with ``observe_loss``) and ``log`` (merges ``pop_log_stats()`` of callbacks into
    training logs before they are written). Callbacks are looked up on each call, so callbacks the
    Trainer re-creates when it restores their state from a checkpoint are found too.

    Example:
        ```python
        from transformers import Trainer
        from hf_fasttrain.callbacks.stability import (
            DivergenceGuardCallback, GradientClippingCallback, StabilityTrainerMixin)

        class MyTrainer(StabilityTrainerMixin, Trainer):
            pass

        trainer = MyTrainer(model=model, args=args, train_dataset=ds,
                            callbacks=[DivergenceGuardCallback(), GradientClippingCallback(mode="agc")])
        ```
    """

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        report_loss(self.callback_handler.callbacks, loss)
        return loss

    def log(self, logs, start_time=None):
        merge_log_stats(self.callback_handler.callbacks, logs)
        super().log(logs, start_time)


# --------------------------------------------------------------------------------------------------
# Gradient clipping
# --------------------------------------------------------------------------------------------------


class ClipStatsWindow:
    """Clip statistics of the optimizer steps since the last log, kept as tensors (no host sync).

    ``pop()`` gives the means over those steps: ``clip_pre_norm``, ``clip_post_norm``, ``clip_fraction``
    and the largest ``clip_pre_norm_max``.

    Example:
        >>> from hf_fasttrain.clipping import norm_clip_stats
        >>> w = ClipStatsWindow()
        >>> w.add(norm_clip_stats(torch.tensor(4.0), 1.0)); w.add(norm_clip_stats(torch.tensor(0.5), 1.0))
        >>> {k: round(v, 4) for k, v in w.pop().items()}
        {'clip_pre_norm': 2.25, 'clip_pre_norm_max': 4.0, 'clip_post_norm': 0.75, 'clip_fraction': 0.5}
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


def _check_number(name: str, value: Any, *, positive: bool = True, integer: bool = False) -> None:
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok_type or (isinstance(value, float) and not math.isfinite(value)):
        kind = "an integer" if integer else "a finite number"
        raise ValueError(f"{name} must be {kind}, got {value!r}")
    if positive and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


class GradientClippingCallback(TrainerCallback, ExportableState):
    """Clips gradients by value, by global L2 norm or adaptively (AGC) once per optimizer step.

    Runs at ``on_pre_optimizer_step``: after gradient accumulation, after DDP reduction and after fp16
    unscaling. The statistics of each logging window are added to the training logs: ``clip_pre_norm``
    and ``clip_post_norm`` (mean global L2 norm before / after this callback clips), ``clip_pre_norm_max``
    and ``clip_fraction`` (value mode: mean fraction of gradient elements clipped; norm mode: fraction
    of steps clipped; AGC: mean fraction of units clipped).

    Args:
        mode: ``"value"`` (clamp each element to ``[-clip_value, clip_value]``), ``"norm"`` (scale all
            gradients to global norm ``max_norm`` when above it), ``"agc"`` (adaptive, unit-wise, see
            :func:`hf_fasttrain.clipping.clip_agc_`) or ``"none"`` (measure and log only).
        clip_value: the bound for ``"value"``.
        max_norm: the threshold for ``"norm"``. The Trainer already clips by norm with
            ``TrainingArguments.max_grad_norm`` (default 1.0), which is what most users want; this mode
            exists for symmetry and requires ``max_grad_norm=0`` so the two do not stack.
        agc_lambda: AGC's threshold lambda on ``||G_i|| / max(||W_i||, eps)``. Default 0.01
            (Brock et al. 2021 use 0.01 at batch 4096 and larger values for smaller batches).
        agc_eps: AGC's floor on unit weight norms (paper: 1e-3).
        agc_clip_output_layer: also clip the output layer (the paper does not; with tied embeddings
            this concerns the input embedding too).

    With ``mode="value"`` or ``"agc"`` and the Trainer's ``max_grad_norm > 0`` both clips apply (norm
    first); a warning says so. Set ``max_grad_norm=0`` to use value or AGC clipping alone.

    Example:
        ```python
        args = TrainingArguments(output_dir="out", max_grad_norm=0.0, logging_steps=10)
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
            raise ValueError(f"mode must be one of {list(CLIP_MODES)}, got {mode!r}")
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
        unsupported = _unsupported_parallelism(args)
        if unsupported:
            raise ValueError(
                f"GradientClippingCallback supports one process and DDP, not {unsupported} (sharded gradients); "
                "use TrainingArguments.max_grad_norm for norm clipping there"
            )
        trainer_clip = args.max_grad_norm or 0.0
        if getattr(args, "clip_mode", "norm") != "norm":
            trainer_clip = 0.0  # FastTrainingArguments: FastTrainer applies max_grad_norm in 'norm' mode only
        if self.mode == "norm" and trainer_clip > 0:
            raise ValueError(
                f"GradientClippingCallback(mode='norm') clips by itself, but TrainingArguments.max_grad_norm="
                f"{trainer_clip} already clips by norm before it; use max_grad_norm alone (no callback needed) "
                "or set max_grad_norm=0"
            )
        if self.mode in ("value", "agc") and trainer_clip > 0:
            logger.warning(
                f"TrainingArguments.max_grad_norm={trainer_clip} clips by norm before "
                f"GradientClippingCallback(mode={self.mode!r}); set max_grad_norm=0 for {self.mode} clipping alone"
            )
        if self.mode == "agc" and model is not None:
            self._agc_dims = {id(p): dims for p, dims in agc_unit_dims(model, clip_output_layer=self.agc_clip_output_layer)}

    def on_pre_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if optimizer is None:
            return
        ensure_unscaled(optimizer)
        params = [p for p in _optimizer_params(optimizer) if p.grad is not None]
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
        _merge_in_on_log(self, state, logs)


# --------------------------------------------------------------------------------------------------
# Divergence guard: pure parts
# --------------------------------------------------------------------------------------------------


def detect_spike(value: float, history: list[float], sigma: float, ratio: float, warmup: int) -> bool:
    """Whether ``value`` is a spike against the recent ``history`` (healthy values, oldest first).

    A spike is ``value > mean + sigma * std`` and ``value > mean + (ratio - 1) * |mean|`` over ``history``
    (``std`` is the sample standard deviation), judged only once ``history`` holds ``warmup`` values.
    The z-score rule over a rolling window follows OLMo-core's ``SkipStepOptimizer`` (OLMo 2, Team OLMo
    2025: window 128, 6 sigma, judged after ``max(20, window // 2)`` values), made one-sided; the ratio
    floor keeps a nearly constant series (tiny std) from flagging noise.

    Example:
        >>> detect_spike(5.0, [2.0, 2.1, 1.9, 2.0], sigma=6.0, ratio=1.1, warmup=4)
        True
        >>> detect_spike(2.2, [2.0, 2.1, 1.9, 2.0], sigma=6.0, ratio=1.1, warmup=4)
        False
    """
    if len(history) < max(warmup, 2):
        return False
    mean = statistics.fmean(history)
    std = statistics.stdev(history)
    return value > mean + sigma * std and value > mean + (ratio - 1.0) * abs(mean)


def _clone_tensors(obj: Any, device: str | torch.device | None = None) -> Any:
    """Deep copy of a (nested) state dict, with every tensor cloned (to ``device`` if given)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to(device, copy=True) if device is not None else t.clone()
    if isinstance(obj, dict):
        return type(obj)((k, _clone_tensors(v, device)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone_tensors(v, device) for v in obj)
    return copy.deepcopy(obj)


@dataclass
class TrainingSnapshot:
    """An in-memory copy of the training state after optimizer step ``step`` (tensors on CPU).

    ``step`` is also the data position: the Trainer had consumed ``step`` optimizer steps of batches.
    A rollback restores model, optimizer, scheduler and learning rates; the data position then moves
    on past the batches that led to the spike (they are skipped, not replayed).
    """

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict
    scheduler: dict | None
    lrs: list[float]


def take_snapshot(model: torch.nn.Module, optimizer: Any, scheduler: Any, step: int) -> TrainingSnapshot:
    """Copy model weights and buffers, optimizer state, scheduler state and param-group lrs to CPU."""
    return TrainingSnapshot(
        step=step,
        model=_clone_tensors(model.state_dict(), "cpu"),
        optimizer=_clone_tensors(optimizer.state_dict(), "cpu"),
        scheduler=copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
        lrs=[g["lr"] for g in optimizer.param_groups],
    )


def _restore_scheduler(scheduler: Any, optimizer: Any, sched_state: dict | None, lrs: list[float]) -> None:
    if scheduler is not None and sched_state is not None:
        scheduler.load_state_dict(copy.deepcopy(sched_state))
    # a scheduler writes the current lr into the param groups; its state_dict does not carry them
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr


def restore_snapshot(snapshot: TrainingSnapshot, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    """Copy a snapshot back in place (parameters keep their identity, so the optimizer still owns them)."""
    model.load_state_dict(snapshot.model)
    # Optimizer.load_state_dict keeps tensors that are already on the right device: clone so that the
    # next optimizer steps cannot write into the snapshot.
    optimizer.load_state_dict(_clone_tensors(snapshot.optimizer))
    _restore_scheduler(scheduler, optimizer, snapshot.scheduler, snapshot.lrs)


def load_checkpoint_state(checkpoint_dir: str, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    """Load model weights, optimizer and scheduler in place from a Trainer checkpoint directory.

    Handles the files ``Trainer._save_checkpoint`` writes for one process or DDP: ``model.safetensors``
    (or a sharded ``model.safetensors.index.json``), ``optimizer.pt``, ``scheduler.pt``.
    """
    import json

    import safetensors.torch

    single = os.path.join(checkpoint_dir, "model.safetensors")
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        state_dict = safetensors.torch.load_file(single, device="cpu")
    elif os.path.isfile(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
        state_dict = {}
        for shard in shards:
            state_dict.update(safetensors.torch.load_file(os.path.join(checkpoint_dir, shard), device="cpu"))
    else:
        raise FileNotFoundError(f"no model.safetensors(.index.json) in checkpoint {checkpoint_dir!r}")
    result = model.load_state_dict(state_dict, strict=False)
    # tied weights (e.g. GPT-2's lm_head = wte) are saved once; anything else missing is an error
    current = model.state_dict()
    loaded = {current[k].data_ptr() for k in state_dict if k in current}
    missing = [k for k in result.missing_keys if current[k].data_ptr() not in loaded]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"checkpoint {checkpoint_dir!r} does not match the model: missing {missing}, unexpected {result.unexpected_keys}"
        )
    device = next(model.parameters()).device
    optimizer.load_state_dict(torch.load(os.path.join(checkpoint_dir, "optimizer.pt"), map_location=device, weights_only=True))
    sched_file = os.path.join(checkpoint_dir, "scheduler.pt")
    if scheduler is not None and os.path.isfile(sched_file):
        scheduler.load_state_dict(torch.load(sched_file, weights_only=True))
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr


def _params_finite(model: torch.nn.Module) -> bool:
    flags = [torch.isfinite(p.detach()).all() for p in model.parameters()]
    return bool(torch.stack([f.to(flags[0].device) for f in flags]).all()) if flags else True


class DivergenceError(RuntimeError):
    """Raised at the end of training when the divergence guard had to stop it."""


# --------------------------------------------------------------------------------------------------
# Divergence guard: the callback
# --------------------------------------------------------------------------------------------------


class DivergenceGuardCallback(TrainerCallback, ExportableState):
    """Skips non-finite steps, rolls back loss spikes, and stops a run that keeps diverging.

    Every optimizer step, at ``on_pre_optimizer_step`` (before the update is applied):

    1. **Non-finite loss or gradient** -> the step is skipped: gradients are dropped (set to None, so
       the optimizer leaves weights and its state untouched) and the lr scheduler is put back, so it
       counts applied updates only (as the Trainer does for fp16 overflow steps).
    2. **Loss spike** (:func:`detect_spike` on the step loss against the last ``spike_window`` healthy
       losses) -> **rollback**: model, optimizer, scheduler and learning rates are restored from the
       last good state, this step is dropped, and training continues with the next batch, so the
       batches since that state are skipped (PaLM, Chowdhery et al. 2022, section 5.1, restarts about
       100 steps before a spike and skips 200-500 batches). Without a good state to return to (or
       with ``rollback="none"``) the step is skipped instead.
    3. **Gradient-norm spike** (same rule on the global gradient norm, ratio ``grad_spike_ratio``) ->
       the step is skipped (OLMo-core's skip-step rule).

    More than ``max_rollbacks`` rollbacks within ``rollback_window`` steps (or, with nothing to roll back
    to, more than ``max_consecutive_skips`` skipped steps in a row) stops training: the last good state
    is restored, a checkpoint is saved, and :class:`DivergenceError` is raised at the end of ``train()``
    (``raise_on_divergence=False`` only logs). Before any checkpoint is written the weights are checked:
    non-finite weights are never saved.

    The last good state. ``rollback="memory"`` copies model, optimizer and scheduler state to CPU every
    ``snapshot_every`` healthy steps; a copy becomes the rollback target once the loss of a later step
    was healthy too (the copy holds the update of its own step, which only a later loss can vouch for).
    ``rollback="checkpoint"`` uses the Trainer's checkpoints the same way (set ``save_steps``).
    ``"auto"`` picks memory when model + optimizer state (estimated as 3 x parameter bytes) fits in
    ``max_snapshot_bytes``, else checkpoint.

    After a rollback the Trainer's ``global_step`` keeps counting batches consumed, while the optimizer
    and scheduler count updates applied: a rollback from step t to step s costs ``t - s`` updates of the
    ``max_steps`` budget and leaves the lr schedule ``t - s`` steps short of its end.

    Loss access: see the module docstring (with :class:`StabilityTrainerMixin` or ``FastTrainer`` the
    guard judges the loss of every step before it is applied; without it, from ``logs["loss"]``).

    Logged with each training log: ``guard_skipped_nonfinite``, ``guard_skipped_spike`` and
    ``guard_rollbacks`` (totals); every event is also a warning in the log and an entry in ``events``.
    With ``restore_callback_states_from_checkpoint=True`` these counters and the loss history survive
    a resume (in-memory snapshots do not: after a resume the first good state is the resumed one).

    Args:
        spike_window: number of recent healthy steps the mean and std are taken over (OLMo-core: 128).
        spike_sigma: how many standard deviations above the mean is a spike (OLMo-core: 6).
        spike_warmup: healthy steps needed before spikes are judged; None: ``max(20, spike_window // 2)``
            (at most ``spike_window``).
        loss_spike_ratio: a loss spike must also exceed the mean by this factor (1.1: 10% above).
        grad_spike_ratio: a gradient-norm spike must also exceed the mean by this factor; None turns
            gradient-norm spike skipping off.
        rollback: ``"auto"``, ``"memory"``, ``"checkpoint"`` or ``"none"`` (skip only).
        snapshot_every: optimizer steps between in-memory snapshots.
        max_rollbacks: rollbacks allowed within ``rollback_window`` steps; one more stops training.
        rollback_window: the window, in optimizer steps.
        max_consecutive_skips: skipped steps in a row before the guard rolls back (or stops).
        max_snapshot_bytes: the budget for ``rollback="auto"`` to choose memory.
        raise_on_divergence: raise :class:`DivergenceError` at the end of a stopped run.

    Example:
        ```python
        from transformers import Trainer
        from hf_fasttrain.callbacks.stability import DivergenceGuardCallback, StabilityTrainerMixin

        class MyTrainer(StabilityTrainerMixin, Trainer):   # optional: per-step loss for the guard
            pass

        trainer = MyTrainer(model=model, args=args, train_dataset=ds)
        trainer.add_callback(DivergenceGuardCallback(snapshot_every=50))
        trainer.train()
        ```
    """

    def __init__(
        self,
        spike_window: int = 128,
        spike_sigma: float = 6.0,
        spike_warmup: int | None = None,
        loss_spike_ratio: float = 1.1,
        grad_spike_ratio: float | None = 10.0,
        rollback: str = "auto",
        snapshot_every: int = 50,
        max_rollbacks: int = 3,
        rollback_window: int = 1000,
        max_consecutive_skips: int = 20,
        max_snapshot_bytes: int = 4 * 2**30,
        raise_on_divergence: bool = True,
    ):
        _check_number("spike_window", spike_window, integer=True)
        if spike_window < 2:
            raise ValueError(f"spike_window must be >= 2, got {spike_window}")
        _check_number("spike_sigma", spike_sigma)
        if spike_warmup is not None:
            _check_number("spike_warmup", spike_warmup, integer=True)
            if spike_warmup < 2 or spike_warmup > spike_window:
                raise ValueError(f"spike_warmup must be between 2 and spike_window ({spike_window}), got {spike_warmup}")
        _check_number("loss_spike_ratio", loss_spike_ratio)
        if loss_spike_ratio < 1:
            raise ValueError(f"loss_spike_ratio must be >= 1, got {loss_spike_ratio}")
        if grad_spike_ratio is not None:
            _check_number("grad_spike_ratio", grad_spike_ratio)
            if grad_spike_ratio < 1:
                raise ValueError(f"grad_spike_ratio must be >= 1 or None, got {grad_spike_ratio}")
        if rollback not in ROLLBACK_MODES:
            raise ValueError(f"rollback must be one of {list(ROLLBACK_MODES)}, got {rollback!r}")
        _check_number("snapshot_every", snapshot_every, integer=True)
        _check_number("max_rollbacks", max_rollbacks, positive=False, integer=True)
        if max_rollbacks < 0:
            raise ValueError(f"max_rollbacks must be >= 0, got {max_rollbacks}")
        _check_number("rollback_window", rollback_window, integer=True)
        _check_number("max_consecutive_skips", max_consecutive_skips, integer=True)
        _check_number("max_snapshot_bytes", max_snapshot_bytes, integer=True)
        self.spike_window = spike_window
        self.spike_sigma = spike_sigma
        self.spike_warmup = spike_warmup
        self.loss_spike_ratio = loss_spike_ratio
        self.grad_spike_ratio = grad_spike_ratio
        self.rollback = rollback
        self.snapshot_every = snapshot_every
        self.max_rollbacks = max_rollbacks
        self.rollback_window = rollback_window
        self.max_consecutive_skips = max_consecutive_skips
        self.max_snapshot_bytes = max_snapshot_bytes
        self.raise_on_divergence = bool(raise_on_divergence)

        # saved with checkpoints (ExportableState)
        self.loss_history: list[float] = []
        self.grad_norm_history: list[float] = []
        self.num_skipped_nonfinite = 0
        self.num_skipped_spike = 0
        self.num_rollbacks = 0
        self.rollback_steps: list[int] = []
        self.consecutive_skips = 0
        self.events: list[dict] = []

        # per run, in memory
        self._mode: str | None = None  # the effective rollback mode
        self._pending_loss: torch.Tensor | None = None
        self._candidate: TrainingSnapshot | tuple[int, str] | None = None
        self._good: TrainingSnapshot | tuple[int, str] | None = None
        self._sched_restore: tuple[dict | None, list[float]] | None = None
        self._step_skipped = False
        self._stop_reason: str | None = None
        self._save_on_stop = True
        self._last_checkpoint: str | None = None
        self._saw_step_loss = False
        self._skipped_since_log = False

    # ---- ExportableState ----
    def state(self) -> dict:
        return {
            "args": {
                "spike_window": self.spike_window,
                "spike_sigma": self.spike_sigma,
                "spike_warmup": self.spike_warmup,
                "loss_spike_ratio": self.loss_spike_ratio,
                "grad_spike_ratio": self.grad_spike_ratio,
                "rollback": self.rollback,
                "snapshot_every": self.snapshot_every,
                "max_rollbacks": self.max_rollbacks,
                "rollback_window": self.rollback_window,
                "max_consecutive_skips": self.max_consecutive_skips,
                "max_snapshot_bytes": self.max_snapshot_bytes,
                "raise_on_divergence": self.raise_on_divergence,
            },
            "attributes": {
                "loss_history": list(self.loss_history),
                "grad_norm_history": list(self.grad_norm_history),
                "num_skipped_nonfinite": self.num_skipped_nonfinite,
                "num_skipped_spike": self.num_skipped_spike,
                "num_rollbacks": self.num_rollbacks,
                "rollback_steps": list(self.rollback_steps),
                "consecutive_skips": self.consecutive_skips,
                "events": list(self.events[-100:]),
            },
        }

    # ---- inputs ----
    @property
    def warmup(self) -> int:
        if self.spike_warmup is not None:
            return self.spike_warmup
        return min(self.spike_window, max(20, self.spike_window // 2))

    def observe_loss(self, loss: torch.Tensor) -> None:
        """Add one micro-batch loss (as ``training_step`` returns it) to the current optimizer step."""
        loss = loss.detach().float().reshape(())
        self._pending_loss = loss if self._pending_loss is None else self._pending_loss + loss
        self._saw_step_loss = True

    def pop_log_stats(self) -> dict[str, float]:
        return {
            "guard_skipped_nonfinite": self.num_skipped_nonfinite,
            "guard_skipped_spike": self.num_skipped_spike,
            "guard_rollbacks": self.num_rollbacks,
        }

    # ---- events ----
    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        unsupported = _unsupported_parallelism(args)
        if unsupported:
            raise ValueError(f"DivergenceGuardCallback supports one process and DDP, not {unsupported}")
        mode = self.rollback
        if mode == "auto":
            param_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) if model is not None else 0
            mode = "memory" if 3 * param_bytes <= self.max_snapshot_bytes else "checkpoint"
        self._mode = mode
        self._pending_loss = None
        self._candidate = self._good = None
        self._sched_restore = None
        self._stop_reason = None
        self._save_on_stop = True
        self._saw_step_loss = False
        self._skipped_since_log = False
        if mode == "memory" and model is not None and optimizer is not None:
            self._candidate = take_snapshot(model, optimizer, lr_scheduler, state.global_step)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if optimizer is None:
            return
        step = state.global_step + 1  # the step about to be applied
        self._step_skipped = False
        self._sched_restore = None
        ensure_unscaled(optimizer)
        grads = [p.grad for p in _optimizer_params(optimizer) if p.grad is not None]
        grad_norm = global_grad_norm(grads)
        device = grad_norm.device
        loss = self._pending_loss
        self._pending_loss = None
        has_loss = loss is not None
        # one small reduction so every rank takes the same decision, then one host sync
        values = torch.stack([loss.to(device) if has_loss else torch.zeros((), device=device), grad_norm])
        bad = (~torch.isfinite(values)).any().float().reshape(1)
        values = torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        world = _world_size()
        summed = _all_reduce(torch.cat([values[:1], bad]), "sum")
        gmax = _all_reduce(values[1:].clone(), "max")
        loss_v, n_bad, gnorm_v = float(summed[0]) / world, float(summed[1]), float(gmax[0])

        reason, kind = None, None
        if n_bad > 0:
            kind = "nonfinite"
            reason = "non-finite loss or gradient"
        elif has_loss and self._is_loss_spike(loss_v):
            kind = "loss_spike"
            reason = f"loss spike ({loss_v:.4g} against a mean of {statistics.fmean(self.loss_history):.4g})"
        elif self.grad_spike_ratio is not None and detect_spike(
            gnorm_v, self.grad_norm_history, self.spike_sigma, self.grad_spike_ratio, self.warmup
        ):
            kind = "grad_spike"
            reason = f"gradient-norm spike ({gnorm_v:.4g} against a mean of {statistics.fmean(self.grad_norm_history):.4g})"

        if kind is None:
            self._healthy(step, loss_v if has_loss else None, gnorm_v)
            return
        if kind == "loss_spike" and self._can_roll_back():
            self._drop_grads(optimizer)
            self._roll_back(step, reason, model, optimizer, lr_scheduler, after_step=False)
            return
        # skip this step
        self._drop_grads(optimizer)
        if lr_scheduler is not None:
            self._sched_restore = (copy.deepcopy(lr_scheduler.state_dict()), [g["lr"] for g in optimizer.param_groups])
        if kind == "nonfinite":
            self.num_skipped_nonfinite += 1
        else:
            self.num_skipped_spike += 1
        self.consecutive_skips += 1
        self._event(step, "skip", reason)
        if self.consecutive_skips > self.max_consecutive_skips:
            why = f"{self.consecutive_skips} steps skipped in a row (max_consecutive_skips={self.max_consecutive_skips})"
            if self._can_roll_back():
                self._roll_back(step, why, model, optimizer, lr_scheduler, after_step=False)
            else:
                self._stop(step, why)

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if self._sched_restore is not None and optimizer is not None:
            # the Trainer stepped the scheduler after our no-op step: put it back
            _restore_scheduler(lr_scheduler, optimizer, *self._sched_restore)
            self._sched_restore = None
        if (
            self._mode == "memory"
            and not self._step_skipped
            and self._stop_reason is None
            and state.global_step % self.snapshot_every == 0
            and model is not None
        ):
            self._candidate = take_snapshot(model, optimizer, lr_scheduler, state.global_step)
        self._before_save(state, control, model, optimizer, lr_scheduler)

    def on_epoch_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        self._before_save(state, control, model, optimizer, lr_scheduler)

    def on_log(self, args, state, control, logs=None, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        # without the mixin the loss arrives here: the mean over the logging window, after the fact
        if logs is not None and "loss" in logs and not self._saw_step_loss and optimizer is not None:
            # a window with a skipped step logs a made-up loss (the Trainer's NaN filter): do not learn from it
            trust = not self._skipped_since_log
            self._skipped_since_log = False
            loss_v = float(logs["loss"]) if trust else float("nan")
            step = state.global_step
            if math.isfinite(loss_v):
                if self._is_loss_spike(loss_v):
                    reason = f"loss spike ({loss_v:.4g} against a mean of {statistics.fmean(self.loss_history):.4g})"
                    if self._can_roll_back():
                        self._roll_back(step, reason, model, optimizer, lr_scheduler, after_step=True)
                    else:
                        self._event(step, "spike_unhandled", reason + "; no good state to roll back to, continuing")
                else:
                    self.loss_history = (self.loss_history + [loss_v])[-self.spike_window :]
                    self._promote(step)
            if self._stop_reason is not None:
                self._set_stop_flags(control)
        _merge_in_on_log(self, state, logs)

    def on_save(self, args, state, control, **kwargs):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        path = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        self._last_checkpoint = path
        if self._mode == "checkpoint" and self._stop_reason is None and not self._step_skipped:
            self._candidate = (state.global_step, path)

    def on_train_end(self, args, state, control, **kwargs):
        if self._stop_reason is not None:
            msg = (
                f"DivergenceGuardCallback stopped training: {self._stop_reason}. The last good state"
                f"{'' if self._good is None else f' (step {self._good_step()})'} was restored"
                f"{'' if self._last_checkpoint is None else f' and saved to {self._last_checkpoint}'}. "
                "Try a lower learning rate, longer warmup, or clipping (clip_mode)."
            )
            logger.error(msg)
            if self.raise_on_divergence:
                raise DivergenceError(msg)

    # ---- internals ----
    def _is_loss_spike(self, loss_v: float) -> bool:
        return detect_spike(loss_v, self.loss_history, self.spike_sigma, self.loss_spike_ratio, self.warmup)

    def _healthy(self, step: int, loss_v: float | None, gnorm_v: float) -> None:
        if loss_v is not None:
            self.loss_history = (self.loss_history + [loss_v])[-self.spike_window :]
            self._promote(step)
        self.grad_norm_history = (self.grad_norm_history + [gnorm_v])[-self.spike_window :]
        self.consecutive_skips = 0

    def _promote(self, step: int) -> None:
        """A healthy loss at ``step`` vouches for a candidate taken after an earlier step."""
        if self._candidate is not None and self._snap_step(self._candidate) < step:
            self._good, self._candidate = self._candidate, None

    @staticmethod
    def _snap_step(snap: TrainingSnapshot | tuple[int, str]) -> int:
        return snap.step if isinstance(snap, TrainingSnapshot) else snap[0]

    def _good_step(self) -> int | None:
        return None if self._good is None else self._snap_step(self._good)

    def _can_roll_back(self) -> bool:
        if self._mode in (None, "none") or self._good is None:
            return False
        if isinstance(self._good, tuple) and not os.path.isdir(self._good[1]):
            return False  # rotated away by save_total_limit
        return True

    def _drop_grads(self, optimizer: Any) -> None:
        for p in _optimizer_params(optimizer):
            p.grad = None
        self._step_skipped = True
        self._skipped_since_log = True

    def _roll_back(self, step, reason, model, optimizer, lr_scheduler, after_step: bool) -> None:
        good = self._good
        if isinstance(good, TrainingSnapshot):
            restore_snapshot(good, model, optimizer, lr_scheduler)
            sched, lrs = good.scheduler, good.lrs
        else:
            load_checkpoint_state(good[1], model, optimizer, lr_scheduler)
            sched = copy.deepcopy(lr_scheduler.state_dict()) if lr_scheduler is not None else None
            lrs = [g["lr"] for g in optimizer.param_groups]
        if not after_step:
            self._sched_restore = (sched, lrs)  # re-applied after the Trainer's scheduler.step()
        self._step_skipped = True
        self._candidate = None
        self.consecutive_skips = 0
        self.num_rollbacks += 1
        self.rollback_steps = (self.rollback_steps + [step])[-(self.max_rollbacks + 1) :]
        good_step = self._snap_step(good)
        self._event(step, "rollback", f"{reason}; restored step {good_step}, skipping the batches of steps {good_step + 1}-{step}")
        recent = [s for s in self.rollback_steps if s > step - self.rollback_window]
        if len(recent) > self.max_rollbacks:
            self._stop(step, f"{len(recent)} rollbacks within {self.rollback_window} steps (max_rollbacks={self.max_rollbacks})")

    def _stop(self, step: int, reason: str) -> None:
        self._stop_reason = f"step {step}: {reason}"
        self._event(step, "stop", reason)

    def _set_stop_flags(self, control) -> None:
        control.should_training_stop = True
        control.should_save = self._save_on_stop
        control.should_log = True

    def _before_save(self, state, control, model, optimizer, lr_scheduler) -> None:
        if self._stop_reason is not None:
            self._set_stop_flags(control)
        if control.should_save and model is not None and not _params_finite(model):
            # never write NaN weights: go back to the last good state, or do not save at all
            if self._can_roll_back():
                self._roll_back(state.global_step, "non-finite weights before a save", model, optimizer, lr_scheduler, after_step=True)
                if self._stop_reason is not None:
                    self._set_stop_flags(control)
            else:
                self._stop(state.global_step, "non-finite weights and no good state to restore; checkpoint not saved")
                self._save_on_stop = False
                self._set_stop_flags(control)

    def _event(self, step: int, kind: str, reason: str) -> None:
        self.events = (self.events + [{"step": step, "kind": kind, "reason": reason}])[-100:]
        logger.warning(f"DivergenceGuardCallback: step {step}: {kind}: {reason}")


def stability_callbacks(args: Any) -> list[TrainerCallback]:
    """The callbacks that ``FastTrainingArguments`` ask for, guard first (it must see unclipped gradients).

    ``clip_mode`` 'value' or 'agc' gives a :class:`GradientClippingCallback`; 'norm' is the Trainer's own
    clipping with ``max_grad_norm`` and 'none' clips nothing (FastTrainer turns the Trainer's norm clip
    off for both). ``divergence_guard`` gives a :class:`DivergenceGuardCallback`. Plain
    ``TrainingArguments`` (without these fields) give no callbacks.
    """
    callbacks: list[TrainerCallback] = []
    if getattr(args, "divergence_guard", False):
        callbacks.append(
            DivergenceGuardCallback(
                spike_window=args.guard_spike_window,
                spike_sigma=args.guard_spike_sigma,
                rollback=args.guard_rollback,
                snapshot_every=args.guard_snapshot_every,
                max_rollbacks=args.guard_max_rollbacks,
            )
        )
    mode = getattr(args, "clip_mode", "norm")
    if mode in ("value", "agc"):
        callbacks.append(GradientClippingCallback(mode=mode, clip_value=args.clip_value, agc_lambda=args.agc_lambda))
    return callbacks
