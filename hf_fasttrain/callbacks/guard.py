"""The divergence guard as a callback for any Trainer: measures each step, asks
:func:`hf_fasttrain.stability.guard.guard_decision`, and carries the answer out (skip, roll back, stop).

Loss access. Callbacks are not given the loss nor the pre-clip gradient norm.
:class:`~hf_fasttrain.callbacks.mixin.StabilityTrainerMixin` (used by ``FastTrainer``) hands both to
the guard, which then judges every optimizer step before it is applied. Without the mixin, the guard
reads ``logs["loss"]`` in ``on_log`` (the mean over the logging window; use ``logging_steps=1`` for
per-step resolution) and rolls back after the fact; NaN/inf are still caught every step from the
gradients (a non-finite loss gives non-finite gradients). Without the mixin and with the Trainer's
``max_grad_norm > 0``, the gradients it sees are already clipped: the gradient-norm rules are then off
(a warning says so).

Not supported: DeepSpeed and FSDP (sharded gradients); the callback raises at ``on_train_begin``.
"""

from __future__ import annotations

import copy
import logging
import math
import os
from dataclasses import fields
from typing import Any, Optional

import torch
from transformers import TrainerCallback
from transformers.trainer_callback import ExportableState

from ..config.args import FastOptions, fast_option
from ..stability.clipping import global_grad_norm
from ..stability.guard import (
    Decision,
    GuardConfig,
    GuardMemory,
    Healthy,
    RollBack,
    Skip,
    StepObservation,
    guard_decision,
    remember,
)
from ..stability.snapshots import (
    TrainingSnapshot,
    check_free_space,
    checkpoint_bytes,
    load_checkpoint_state,
    params_finite,
    restore_scheduler,
    restore_snapshot,
    take_snapshot,
)
from ..stability.trainables import trainable_bytes
from ._rollback import participants
from .clipping import GradientClippingCallback
from .mixin import all_reduce, ensure_unscaled, merge_in_on_log, optimizer_params, unsupported_parallelism, world_size

__all__ = ["DivergenceGuardCallback", "DivergenceError", "stability_callbacks"]

logger = logging.getLogger(__name__)

_CONFIG_FIELDS = {f.name for f in fields(GuardConfig)}
_MEMORY_FIELDS = {f.name for f in fields(GuardMemory)}


class DivergenceError(RuntimeError):
    """Raised at the end of training when the divergence guard had to stop it."""


class DivergenceGuardCallback(TrainerCallback, ExportableState):
    """Skips bad steps before they are applied, rolls back bad updates, and stops a run that keeps diverging.

    Every optimizer step, at ``on_pre_optimizer_step`` (before the update is applied), the guard
    measures the step (loss, pre-clip gradient norm, non-finite values) and acts on
    :func:`hf_fasttrain.stability.guard.guard_decision`:

    - **skip** a step with a NaN/inf loss or gradient, a gradient norm above ``grad_norm_ceiling``, a
      loss spike or a gradient-norm spike (6 sigma over the last 128 healthy steps: OLMo-core's rule).
      Its gradients are dropped (the optimizer leaves weights and state untouched) and the lr
      scheduler is put back, so it counts applied updates only. The batch is not replayed.
    - **roll back** when a bad update already reached the weights: non-finite weights, a spike seen only
      after its update (plain Trainer without the mixin), or a loss that stays a spike for
      ``rollback_after_spikes`` steps in a row. Model, optimizer, scheduler and lrs come back from the
      last good state; the batches since then are skipped (PaLM, Chowdhery et al. 2022, section 5.1).
      A :class:`~hf_fasttrain.callbacks.averaging.WeightAveragingCallback` in the same Trainer rolls back
      with them, so the average saved at the end holds no update the guard undid.
    - **stop** after more than ``max_rollbacks`` rollbacks within ``rollback_window`` steps, or when
      there is nothing to roll back to: the last good state is restored and saved, and
      :class:`DivergenceError` is raised at the end of ``train()`` (``raise_on_divergence=False`` only
      logs). Non-finite weights are never saved.

    The last good state. ``rollback="memory"`` copies model, optimizer and scheduler state to CPU every
    ``snapshot_every`` healthy steps; a copy becomes the rollback target once the loss of a later step
    was healthy too (the copy holds the update of its own step, which only a later loss can vouch for).
    ``rollback="checkpoint"`` uses the Trainer's checkpoints the same way (set ``save_steps``), a peft
    model's adapter checkpoints included. ``"auto"`` picks memory when the trainable parameters and their
    optimizer state (estimated as 3 x trainable parameter bytes) fit in ``max_snapshot_bytes``, else
    checkpoint. A snapshot holds the trainable parameters and the buffers, never a frozen base.

    Resume. The guard's memory (recent healthy losses and gradient norms, the ``guard_*`` counters,
    events) is saved in every checkpoint's ``trainer_state.json`` and read back at ``on_train_begin``
    of a resumed run, in any Trainer, without ``restore_callback_states_from_checkpoint``. In-memory
    snapshots are not saved: after a resume the first good state is the resumed one.

    Before each checkpoint the free disk space is checked against the checkpoint's size; a full disk
    raises :class:`~hf_fasttrain.stability.snapshots.NoSpaceError` before anything is written.

    Logged with each training log: ``guard_skipped_nonfinite``, ``guard_skipped_spike`` and
    ``guard_rollbacks`` (totals over the run, resumes included); every event is also a warning in the
    log and an entry in ``events``.

    Args:
        config (`GuardConfig`, *optional*, defaults to `None`):
            The guard's settings (:class:`~hf_fasttrain.stability.guard.GuardConfig`); `None` builds one from
            ``**settings``, or the defaults.
        **settings:
            ``GuardConfig`` fields as keyword arguments instead of ``config`` (``spike_window=128,
            spike_sigma=6.0, grad_norm_ceiling=1e4, rollback="auto", snapshot_every=50, ...``); a bad value
            is refused on creation, naming the field.

    Example:
        ```python
        from transformers import Trainer
        from hf_fasttrain import DivergenceGuardCallback
        from hf_fasttrain.callbacks import StabilityTrainerMixin

        class MyTrainer(StabilityTrainerMixin, Trainer):   # optional: per-step loss and pre-clip norm
            pass

        trainer = MyTrainer(model=model, args=args, train_dataset=ds)
        trainer.add_callback(DivergenceGuardCallback(snapshot_every=50))
        trainer.train()
        ```
    """

    def __init__(self, config: GuardConfig | None = None, **settings: Any):
        if config is not None and settings:
            raise TypeError("give either a GuardConfig or its fields as keyword arguments, not both")
        unknown = sorted(set(settings) - _CONFIG_FIELDS)
        if unknown:
            raise TypeError(f"DivergenceGuardCallback got unknown settings {unknown}; allowed: {sorted(_CONFIG_FIELDS)}")
        self.config = config if config is not None else GuardConfig(**settings)
        self._memory = GuardMemory()  # saved with checkpoints (ExportableState)

        # per run, in memory
        self._mode: str | None = None  # the effective rollback mode
        self._trainer_state = None  # the run's TrainerState: where the rollback participants register
        self._initial_snapshot_pending = False
        self._step_skipped = False
        self._last_checkpoint: str | None = None
        self._clipped_warned = False
        self._start_run()

    def _start_run(self) -> None:
        """The state one train() builds up, empty (at construction and at every train begin)."""
        self._pending_loss: torch.Tensor | None = None
        self._pending_grad_norm: torch.Tensor | None = None
        self._candidate: TrainingSnapshot | tuple[int, str] | None = None
        self._good: TrainingSnapshot | tuple[int, str] | None = None
        self._sched_restore: tuple[dict | None, list[float]] | None = None
        self._stop_reason: str | None = None
        self._save_on_stop = True
        self._saw_step_loss = False
        self._skipped_since_log = False

    # ---- settings and memory read as attributes (guard.spike_window, guard.loss_history, ...) ----
    def __getattr__(self, name: str) -> Any:
        d = self.__dict__
        if name in _CONFIG_FIELDS and "config" in d:
            return getattr(d["config"], name)
        if name in _MEMORY_FIELDS and "_memory" in d:
            return getattr(d["_memory"], name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def memory(self) -> GuardMemory:
        return self._memory

    @memory.setter
    def memory(self, value: GuardMemory | dict) -> None:  # the Trainer's restore sets a dict
        self._memory = value if isinstance(value, GuardMemory) else GuardMemory.from_dict(value)

    @property
    def warmup(self) -> int:
        return self.config.warmup

    # ---- ExportableState ----
    def state(self) -> dict:
        return {"args": self.config.as_dict(), "attributes": {"memory": self._memory.as_dict()}}

    # ---- inputs ----
    def observe_loss(self, loss: torch.Tensor) -> None:
        """Add one micro-batch loss (as ``training_step`` returns it) to the current optimizer step."""
        loss = loss.detach().float().reshape(())
        self._pending_loss = loss if self._pending_loss is None else self._pending_loss + loss
        self._saw_step_loss = True

    def observe_grad_norm(self, grad_norm: torch.Tensor) -> None:
        """The step's global gradient norm before any clipping (the Trainer's measurement)."""
        self._pending_grad_norm = grad_norm

    def pop_log_stats(self) -> dict[str, float]:
        m = self._memory
        return {
            "guard_skipped_nonfinite": m.num_skipped_nonfinite,
            "guard_skipped_spike": m.num_skipped_spike,
            "guard_rollbacks": m.num_rollbacks,
        }

    # ---- events ----
    def on_train_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        unsupported = unsupported_parallelism(args)
        if unsupported:
            raise ValueError(f"DivergenceGuardCallback supports one process and DDP, not {unsupported}")
        if state.global_step > 0:
            self._restore_memory(state)
        else:  # a fresh run: nothing of an earlier train() on this Trainer (a hyperparameter_search trial)
            self._memory = GuardMemory()
        mode = self.config.rollback
        if mode == "auto":
            mode = "memory" if 3 * (trainable_bytes(model) if model is not None else 0) <= self.config.max_snapshot_bytes \
                else "checkpoint"
        self._mode = mode
        self._start_run()
        self._trainer_state = state
        # the first good state is taken before the first step, once every callback's on_train_begin has run
        # (a weight average registers there and loads its resumed state)
        self._initial_snapshot_pending = mode == "memory" and model is not None and optimizer is not None

    def on_step_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if self._initial_snapshot_pending:
            self._initial_snapshot_pending = False
            self._candidate = self._snapshot(model, optimizer, lr_scheduler, state.global_step)

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if optimizer is None:
            return
        step = state.global_step + 1  # the step about to be applied
        self._step_skipped = False
        self._sched_restore = None
        ensure_unscaled(optimizer)
        loss, self._pending_loss = self._pending_loss, None
        grad_norm, self._pending_grad_norm = self._pending_grad_norm, None
        judge_norm = grad_norm is not None or not self._trainer_clipped(args)
        if grad_norm is None:
            grad_norm = global_grad_norm([p.grad for p in optimizer_params(optimizer) if p.grad is not None])
        has_loss = loss is not None
        device = loss.device if has_loss else grad_norm.device
        # one small reduction so every rank takes the same decision, then the guard's one host read per step:
        # the decision to skip must come before optimizer.step(), so it cannot wait for a later, free read
        values = torch.stack([loss.to(device) if has_loss else torch.zeros((), device=device), grad_norm.to(device)])
        bad = (~torch.isfinite(values)).any().float().reshape(1)
        values = torch.nan_to_num(values, nan=0.0, posinf=0.0, neginf=0.0)
        summed = all_reduce(torch.cat([values[:1], bad]), "sum")
        gmax = all_reduce(values[1:].clone(), "max")
        loss_sum, n_bad, gnorm_v = torch.cat([summed, gmax]).tolist()
        loss_v = loss_sum / world_size()
        nonfinite = n_bad > 0
        obs = StepObservation(
            step=step,
            loss=loss_v if has_loss else None,
            grad_norm=gnorm_v if judge_norm else None,
            nonfinite=nonfinite,
            applied=False,
            weights_finite=params_finite(model) if nonfinite and model is not None else True,
        )
        self._act(obs, model, optimizer, lr_scheduler)

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        if self._sched_restore is not None and optimizer is not None:
            # the Trainer stepped the scheduler after our no-op step: put it back
            restore_scheduler(lr_scheduler, optimizer, *self._sched_restore)
            self._sched_restore = None
        if (
            self._mode == "memory"
            and not self._step_skipped
            and self._stop_reason is None
            and state.global_step % self.config.snapshot_every == 0
            and model is not None
        ):
            self._candidate = self._snapshot(model, optimizer, lr_scheduler, state.global_step)
        self._before_save(args, state, control, model, optimizer, lr_scheduler)

    def on_epoch_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        self._before_save(args, state, control, model, optimizer, lr_scheduler)

    def on_log(self, args, state, control, logs=None, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        # without the mixin the loss arrives here: the mean over the logging window, after the fact
        if logs is not None and "loss" in logs and not self._saw_step_loss and optimizer is not None:
            # a window with a skipped step logs a made-up loss (the Trainer's NaN filter): do not learn from it
            trust = not self._skipped_since_log
            self._skipped_since_log = False
            loss_v = float(logs["loss"]) if trust else float("nan")
            if math.isfinite(loss_v):
                obs = StepObservation(step=state.global_step, loss=loss_v, applied=True)
                self._act(obs, model, optimizer, lr_scheduler)
            if self._stop_reason is not None:
                self._set_stop_flags(control)
        merge_in_on_log(self, state, logs)

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
            if self.config.raise_on_divergence:
                raise DivergenceError(msg)

    # ---- carrying out a decision ----
    def _act(self, obs: StepObservation, model, optimizer, lr_scheduler) -> Decision:
        decision = guard_decision(obs, self._memory, self.config, self._can_roll_back())
        step = obs.step
        if isinstance(decision, Healthy):
            if obs.loss is not None:
                self._promote(step)
        elif isinstance(decision, Skip):
            if obs.applied:
                self._event(step, "spike_unhandled", decision.reason)
            else:
                self._skip_step(optimizer, lr_scheduler)
                self._event(step, "skip", decision.reason)
        elif isinstance(decision, RollBack):
            self._roll_back(step, decision.reason, model, optimizer, lr_scheduler, after_step=obs.applied)
        else:  # Stop
            if not obs.applied:
                self._skip_step(optimizer, lr_scheduler)
            if decision.restore:
                self._roll_back(step, decision.reason, model, optimizer, lr_scheduler, after_step=obs.applied)
            elif obs.applied or not obs.weights_finite:
                self._save_on_stop = False  # the weights are bad and there is nothing to restore
            self._stop_reason = f"step {step}: {decision.reason}"
            self._event(step, "stop", decision.reason)
        self._memory = remember(obs, self._memory, decision, self.config)
        return decision

    def _skip_step(self, optimizer, lr_scheduler) -> None:
        for p in optimizer_params(optimizer):
            p.grad = None
        self._step_skipped = True
        self._skipped_since_log = True
        if lr_scheduler is not None:
            self._sched_restore = (copy.deepcopy(lr_scheduler.state_dict()), [g["lr"] for g in optimizer.param_groups])

    def _roll_back(self, step, reason, model, optimizer, lr_scheduler, after_step: bool) -> None:
        good = self._good
        if isinstance(good, TrainingSnapshot):
            restore_snapshot(good, model, optimizer, lr_scheduler)
            sched, lrs = good.scheduler, good.lrs
            for part in participants(self._trainer_state):
                part.rollback_restore(model, good.extra.get(id(part)))
        else:
            load_checkpoint_state(good[1], model, optimizer, lr_scheduler)
            sched = copy.deepcopy(lr_scheduler.state_dict()) if lr_scheduler is not None else None
            lrs = [g["lr"] for g in optimizer.param_groups]
            for part in participants(self._trainer_state):
                part.rollback_restore(model, None, checkpoint=good[1])
        if not after_step:
            for p in optimizer_params(optimizer):
                p.grad = None
            self._sched_restore = (sched, lrs)  # re-applied after the Trainer's scheduler.step()
        self._step_skipped = True
        self._skipped_since_log = True
        self._candidate = None
        good_step = self._snap_step(good)
        self._event(step, "rollback", f"{reason}; restored step {good_step}, skipping the batches of steps {good_step + 1}-{step}")

    # ---- internals ----
    def _snapshot(self, model, optimizer, lr_scheduler, step: int) -> TrainingSnapshot:
        """The training state after ``step``, with the rollback participants' (a weight average) at that step."""
        snap = take_snapshot(model, optimizer, lr_scheduler, step)
        snap.extra = {id(p): p.rollback_state(model, step) for p in participants(self._trainer_state)}
        return snap

    def _trainer_clipped(self, args) -> bool:
        """Whether the Trainer clipped the gradients by norm before this callback (without the mixin)."""
        clipped = (getattr(args, "max_grad_norm", 0.0) or 0.0) > 0 and fast_option(args, "clip_mode") == "norm"
        if clipped and not self._clipped_warned:
            self._clipped_warned = True
            logger.warning(
                "DivergenceGuardCallback sees gradients after the Trainer clipped them to max_grad_norm="
                f"{args.max_grad_norm}: gradient-norm spikes and grad_norm_ceiling are not judged (NaN/inf and "
                "loss spikes are). Mix StabilityTrainerMixin into the Trainer class to judge the pre-clip norm."
            )
        return clipped

    def _restore_memory(self, state) -> None:
        """Read this guard's memory back from the resumed checkpoint's trainer state."""
        saved = (getattr(state, "stateful_callbacks", None) or {}).get(type(self).__name__)
        if isinstance(saved, list):
            saved = saved[0] if saved else None
        if not isinstance(saved, dict):
            return
        attributes = saved.get("attributes", {})
        self._memory = GuardMemory.from_dict(attributes.get("memory", attributes))  # older files: flat

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

    def _set_stop_flags(self, control) -> None:
        control.should_training_stop = True
        control.should_save = self._save_on_stop
        control.should_log = True

    def _before_save(self, args, state, control, model, optimizer, lr_scheduler) -> None:
        if self._stop_reason is not None:
            self._set_stop_flags(control)
        if control.should_save and model is not None and not params_finite(model):
            # never write NaN weights: go back to the last good state, or do not save at all
            obs = StepObservation(step=state.global_step, nonfinite=True, applied=True, weights_finite=False)
            self._act(obs, model, optimizer, lr_scheduler)
            if self._stop_reason is not None:
                self._set_stop_flags(control)
        if control.should_save and model is not None and getattr(args, "should_save", True):
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            name = f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
            model_only = bool(getattr(args, "save_only_model", False))
            check_free_space(os.path.join(args.output_dir, name), checkpoint_bytes(model, optimizer, model_only), name)

    def _event(self, step: int, kind: str, reason: str) -> None:
        self._memory.events = (self._memory.events + [{"step": step, "kind": kind, "reason": reason}])[-100:]
        logger.warning(f"DivergenceGuardCallback: step {step}: {kind}: {reason}")


def stability_callbacks(args: Any, guard: Optional[GuardConfig] = None) -> list[TrainerCallback]:
    """The callbacks that ``FastTrainingArguments`` ask for, guard first (it must see unclipped gradients).

    ``clip_mode`` 'value' or 'agc' gives a :class:`GradientClippingCallback`; 'norm' is the Trainer's own
    clipping with ``max_grad_norm`` and 'none' clips nothing (FastTrainer turns the Trainer's norm clip
    off for both). ``divergence_guard`` gives a :class:`DivergenceGuardCallback`. Plain
    ``TrainingArguments`` (without these fields) give no callbacks. ``guard``: the guard's config as the run's plan
    holds it (:class:`~hf_fasttrain.config.plan.RunPlan`); None reads it from ``args``.
    """
    callbacks: list[TrainerCallback] = []
    if fast_option(args, "divergence_guard"):
        config = guard if guard is not None else GuardConfig.from_training_args(FastOptions(args))
        callbacks.append(DivergenceGuardCallback(config))
    mode = fast_option(args, "clip_mode")
    if mode in ("value", "agc"):
        callbacks.append(GradientClippingCallback(
            mode=mode, clip_value=fast_option(args, "clip_value"), agc_lambda=fast_option(args, "agc_lambda")))
    return callbacks
