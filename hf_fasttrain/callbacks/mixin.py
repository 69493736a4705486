"""What the stability callbacks share, and the Trainer mixin that feeds them.

Where they run. The Trainer's optimizer step is ``pre-clip grad norm (clip when max_grad_norm > 0)
-> on_pre_optimizer_step -> optimizer.step() -> on_optimizer_step -> lr_scheduler.step() -> zero_grad
-> on_step_end``. The callbacks act at ``on_pre_optimizer_step``: once per optimizer step whatever the
gradient accumulation, after DDP has averaged the gradients, and after fp16 gradients were unscaled
(:func:`ensure_unscaled` makes sure of it, without unscaling twice), but after the Trainer's own norm
clip.

What a callback is not given: the loss and the pre-clip gradient norm. :class:`StabilityTrainerMixin`
(FastTrainer uses it) hands both to the callbacks that ask (``observe_loss``, ``observe_grad_norm``),
merges their statistics into the logs, and turns a full disk during a checkpoint save into one clear
error.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
from collections.abc import Iterable
from typing import Any

import torch

from ..stability.snapshots import NoSpaceError, check_free_space, checkpoint_bytes, is_no_space_error, no_space_message
from ._logs import add_to_log

__all__ = [
    "StabilityTrainerMixin",
    "ensure_unscaled",
    "report_loss",
    "report_grad_norm",
    "merge_log_stats",
]

logger = logging.getLogger(__name__)


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


def optimizer_params(optimizer: Any) -> list[torch.nn.Parameter]:
    return [p for group in optimizer.param_groups for p in group["params"]]


def unsupported_parallelism(args: Any) -> str | None:
    """'DeepSpeed' or 'FSDP' when gradients are sharded (the callbacks need whole gradients), else None."""
    if getattr(args, "deepspeed", None) or os.environ.get("ACCELERATE_USE_DEEPSPEED", "").lower() == "true":
        return "DeepSpeed"
    if getattr(args, "fsdp", None) or os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true":
        return "FSDP"
    return None


def world_size() -> int:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size()
    return 1


def all_reduce(t: torch.Tensor, op: str) -> torch.Tensor:
    """Sum or max over ranks (identity in a single process); decisions must agree on every rank."""
    if world_size() > 1:
        torch.distributed.all_reduce(t, op=torch.distributed.ReduceOp.SUM if op == "sum" else torch.distributed.ReduceOp.MAX)
    return t


def report_loss(callbacks: Iterable[Any], loss: torch.Tensor) -> None:
    """Hand a micro-batch loss (as returned by ``Trainer.training_step``) to callbacks that want it."""
    for cb in callbacks:
        if hasattr(cb, "observe_loss"):
            cb.observe_loss(loss)


def report_grad_norm(callbacks: Iterable[Any], grad_norm: Any) -> None:
    """Hand the step's pre-clip global gradient norm (as the Trainer measured it) to callbacks that want it."""
    if grad_norm is None:
        return
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    norm = torch.as_tensor(grad_norm).detach().float().reshape(())
    for cb in callbacks:
        if hasattr(cb, "observe_grad_norm"):
            cb.observe_grad_norm(norm)


def merge_log_stats(callbacks: Iterable[Any], logs: dict[str, float]) -> None:
    """Merge each callback's pending statistics into a training log (one that has ``loss``)."""
    if "loss" not in logs:
        return
    for cb in callbacks:
        if hasattr(cb, "pop_log_stats"):
            logs.update(cb.pop_log_stats())


def merge_in_on_log(cb: Any, state: Any, logs: dict[str, float] | None) -> None:
    """The fallback without the mixin: add stats to ``logs`` and to the entry ``Trainer.log`` just stored."""
    if logs is None or "loss" not in logs:
        return
    stats = cb.pop_log_stats()
    if stats:
        add_to_log(state, logs, stats)


def _disk_was_full(exc: BaseException, path: str, need: int) -> bool:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return True
    if not is_no_space_error(exc):
        return False
    if "no space left" in str(exc).lower():
        return True
    try:  # "unexpected pos" / "file write failed" can have other causes: ask the disk
        check_free_space(path, need, "")
    except NoSpaceError:
        return True
    return False


class StabilityTrainerMixin:
    """Trainer mixin: gives the stability callbacks every loss and the pre-clip gradient norm, puts
    their statistics in the logs, and reports a full disk while saving a checkpoint in one line.

    Overrides ``training_step`` (hands the returned loss to callbacks with ``observe_loss``), ``log``
    (merges ``pop_log_stats()`` of callbacks into training logs before they are written), and two
    private hooks of ``transformers.Trainer`` that have no public counterpart: ``_get_grad_norm`` (the
    norm the Trainer measures before it clips, handed to callbacks with ``observe_grad_norm``) and
    ``_save_checkpoint`` (checks free space first; a full disk raises
    :class:`~hf_fasttrain.stability.snapshots.NoSpaceError` saying "no space left on <path> while saving
    checkpoint-N; free space and rerun the same command", and removes the unfinished checkpoint
    folder). All call ``super()``. Callbacks are looked up on each call, so callbacks the Trainer
    re-creates when it restores their state from a checkpoint are found too.

    Example:
        ```python
        from transformers import Trainer
        from hf_fasttrain import DivergenceGuardCallback
        from hf_fasttrain.callbacks import StabilityTrainerMixin

        class MyTrainer(StabilityTrainerMixin, Trainer):
            pass

        trainer = MyTrainer(model=model, args=args, train_dataset=ds, callbacks=[DivergenceGuardCallback()])
        ```
    """

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        report_loss(self.callback_handler.callbacks, loss)
        return loss

    def _get_grad_norm(self, model, grad_norm=None):
        # the Trainer passes the pre-clip norm its clip returned, or measures it without clipping
        grad_norm = super()._get_grad_norm(model, grad_norm=grad_norm)
        report_grad_norm(self.callback_handler.callbacks, grad_norm)
        return grad_norm

    def log(self, logs, start_time=None):
        merge_log_stats(self.callback_handler.callbacks, logs)
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

        name = f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        path = os.path.join(self._get_output_dir(trial=trial), name)
        need = checkpoint_bytes(self.model, self.optimizer, model_only=bool(getattr(self.args, "save_only_model", False)))
        existed = os.path.exists(path)
        check_free_space(path, need, name)
        try:
            super()._save_checkpoint(model, trial)
        except (OSError, RuntimeError) as exc:
            if not _disk_was_full(exc, path, need):
                raise
            if not existed and self.args.should_save:
                shutil.rmtree(path, ignore_errors=True)  # unfinished: resuming skips it anyway
            raise NoSpaceError(errno.ENOSPC, no_space_message(path, name)) from exc
