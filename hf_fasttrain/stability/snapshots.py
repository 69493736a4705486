"""Copies of the training state: in-memory snapshots, reading a Trainer checkpoint back in place, and
the free-space check before one is written.

Plain functions on a model, an optimizer and a scheduler; no Trainer inside. The divergence guard
rolls back with them; :class:`~hf_fasttrain.callbacks.mixin.StabilityTrainerMixin` checks disk space
with them.
"""

from __future__ import annotations

import copy
import errno
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

import torch

from .trainables import ADAPTER_WEIGHT_FILES, saves_adapter_only, trainable_parameters

__all__ = [
    "TrainingSnapshot",
    "take_snapshot",
    "restore_snapshot",
    "restore_scheduler",
    "load_checkpoint_state",
    "params_finite",
    "NoSpaceError",
    "checkpoint_bytes",
    "check_free_space",
    "no_space_message",
    "is_no_space_error",
]


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

    ``model`` holds the trainable parameters and the buffers only: frozen parameters (a LoRA model's base)
    never change, so they are neither copied nor restored.

    ``step`` is also the data position: the Trainer had consumed ``step`` optimizer steps of batches.
    A rollback restores model, optimizer, scheduler and learning rates; the data position then moves
    on past the batches that led to the spike (they are skipped, not replayed).
    """

    step: int
    model: dict[str, torch.Tensor]
    optimizer: dict
    scheduler: dict | None
    lrs: list[float]
    # other parts' state at the same step (e.g. a weight average), by the id of the part that owns it
    extra: dict = field(default_factory=dict)


def take_snapshot(model: torch.nn.Module, optimizer: Any, scheduler: Any, step: int) -> TrainingSnapshot:
    """Copy the trainable parameters and the buffers, optimizer state, scheduler state and param-group lrs
    to CPU."""
    weights = {**trainable_parameters(model), **dict(model.named_buffers())}
    return TrainingSnapshot(
        step=step,
        model=_clone_tensors(weights, "cpu"),
        optimizer=_clone_tensors(optimizer.state_dict(), "cpu"),
        scheduler=copy.deepcopy(scheduler.state_dict()) if scheduler is not None else None,
        lrs=[g["lr"] for g in optimizer.param_groups],
    )


def restore_scheduler(scheduler: Any, optimizer: Any, sched_state: dict | None, lrs: list[float]) -> None:
    """Put a scheduler state and the param groups' lrs back (a scheduler's state_dict lacks the lrs)."""
    if scheduler is not None and sched_state is not None:
        scheduler.load_state_dict(copy.deepcopy(sched_state))
    for group, lr in zip(optimizer.param_groups, lrs):
        group["lr"] = lr


def restore_snapshot(snapshot: TrainingSnapshot, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    """Copy a snapshot back in place (parameters keep their identity, so the optimizer still owns them)."""
    current = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    missing = sorted(set(snapshot.model) - set(current))
    if missing:
        raise ValueError(f"the snapshot of step {snapshot.step} does not match the model: it has no {missing[:5]}")
    with torch.no_grad():
        for name, saved in snapshot.model.items():
            current[name].copy_(saved)
    # Optimizer.load_state_dict keeps tensors that are already on the right device: clone so that the
    # next optimizer steps cannot write into the snapshot.
    optimizer.load_state_dict(_clone_tensors(snapshot.optimizer))
    restore_scheduler(scheduler, optimizer, snapshot.scheduler, snapshot.lrs)


def load_checkpoint_state(checkpoint_dir: str, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    """Load model weights, optimizer and scheduler in place from a Trainer checkpoint directory.

    Reads what ``Trainer._save_checkpoint`` writes for one process or DDP: ``model.safetensors``, or a
    sharded ``model.safetensors.index.json`` (through transformers' ``load_sharded_checkpoint``), or for a
    peft model ``adapter_model.safetensors`` (its trainable tensors: adapters and ``modules_to_save``),
    then ``optimizer.pt`` and ``scheduler.pt``. Weights tied to a loaded one (GPT-2's ``lm_head`` = ``wte``)
    may be absent from the files; any other mismatch is an error.
    """
    import json

    import safetensors.torch
    from transformers.trainer_utils import load_sharded_checkpoint

    if saves_adapter_only(model):
        _load_adapter_weights(checkpoint_dir, model)
        _load_optimizer_scheduler(checkpoint_dir, model, optimizer, scheduler)
        return
    single = os.path.join(checkpoint_dir, "model.safetensors")
    index = os.path.join(checkpoint_dir, "model.safetensors.index.json")
    if os.path.isfile(single):
        state_dict = safetensors.torch.load_file(single, device="cpu")
        loaded_keys = list(state_dict)
        result = model.load_state_dict(state_dict, strict=False)
        missing, unexpected = result.missing_keys, result.unexpected_keys
        del state_dict
    elif os.path.isfile(index):
        with open(index) as f:
            loaded_keys = list(json.load(f)["weight_map"])
        result = load_sharded_checkpoint(model, checkpoint_dir, strict=False)
        missing, unexpected = result.missing_keys, result.unexpected_keys
    else:
        raise FileNotFoundError(f"no model.safetensors(.index.json) in checkpoint {checkpoint_dir!r}")
    current = model.state_dict()
    loaded = {current[k].data_ptr() for k in loaded_keys if k in current}
    missing = [k for k in missing if current[k].data_ptr() not in loaded]
    if missing or unexpected:
        raise ValueError(f"checkpoint {checkpoint_dir!r} does not match the model: missing {missing}, unexpected {unexpected}")
    _load_optimizer_scheduler(checkpoint_dir, model, optimizer, scheduler)


def _load_adapter_weights(checkpoint_dir: str, model: torch.nn.Module) -> None:
    """Copy a peft checkpoint's adapter weights into ``model`` in place; every trainable tensor must be there."""
    import safetensors.torch

    path = next((os.path.join(checkpoint_dir, f) for f in ADAPTER_WEIGHT_FILES
                 if os.path.isfile(os.path.join(checkpoint_dir, f))), None)
    if path is None:
        raise FileNotFoundError(f"no {' or '.join(ADAPTER_WEIGHT_FILES)} in checkpoint {checkpoint_dir!r}")
    state = (safetensors.torch.load_file(path, device="cpu") if path.endswith(".safetensors")
             else torch.load(path, map_location="cpu", weights_only=True))
    from peft.utils import set_peft_model_state_dict

    peft_model = getattr(model, "module", model)
    adapter = getattr(peft_model, "active_adapter", "default")
    adapter = adapter[0] if isinstance(adapter, (list, tuple)) else adapter
    result = set_peft_model_state_dict(peft_model, state, adapter_name=adapter)
    unexpected = list(getattr(result, "unexpected_keys", []))
    # a trainable tensor the file did not hold would keep its bad values: refuse rather than half-restore
    missing = sorted(set(getattr(result, "missing_keys", [])) & set(trainable_parameters(peft_model)))
    if unexpected or missing:
        raise ValueError(f"adapter checkpoint {checkpoint_dir!r} does not match the model: unexpected {unexpected[:5]}, "
                         f"trainable tensors missing {missing[:5]}")


def _load_optimizer_scheduler(checkpoint_dir: str, model: torch.nn.Module, optimizer: Any, scheduler: Any) -> None:
    device = next(model.parameters()).device
    optimizer.load_state_dict(torch.load(os.path.join(checkpoint_dir, "optimizer.pt"), map_location=device, weights_only=True))
    sched_file = os.path.join(checkpoint_dir, "scheduler.pt")
    if scheduler is not None and os.path.isfile(sched_file):
        scheduler.load_state_dict(torch.load(sched_file, weights_only=True))
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr()):
            group["lr"] = lr


def params_finite(model: torch.nn.Module) -> bool:
    """Whether every trainable parameter of ``model`` is finite (one host sync); frozen ones never change,
    so a model with none trainable is judged on all of them."""
    params = list(trainable_parameters(model).values()) or list(model.parameters())
    flags = [torch.isfinite(p.detach()).all() for p in params]
    return bool(torch.stack([f.to(flags[0].device) for f in flags]).all()) if flags else True


# --------------------------------------------------------------------------------------------------
# Disk space
# --------------------------------------------------------------------------------------------------


class NoSpaceError(OSError):
    """A checkpoint could not be written (or would not fit): the disk is full.

    ``errno`` is ``ENOSPC``. The message says where and which checkpoint, and what to do.
    """

    def __str__(self) -> str:
        return str(self.strerror)


def no_space_message(path: str, checkpoint: str, need: int | None = None, free: int | None = None) -> str:
    """``no space left on <path> while saving <checkpoint>; free space and rerun the same command``."""
    detail = ""
    if need is not None and free is not None:
        detail = f" (needs about {need / 2**20:.1f} MiB, {free / 2**20:.1f} MiB free)"
    return f"no space left on {path} while saving {checkpoint}{detail}; free space and rerun the same command"


def _tensor_bytes(obj: Any, seen: set[int]) -> int:
    if isinstance(obj, torch.Tensor):
        if obj.numel() == 0:
            return 0
        key = obj.untyped_storage().data_ptr() if obj.device.type != "meta" else id(obj)
        if key in seen:
            return 0
        seen.add(key)
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(_tensor_bytes(v, seen) for v in obj)
    return 0


def checkpoint_bytes(model: torch.nn.Module, optimizer: Any = None, model_only: bool = False) -> int:
    """An estimate of a checkpoint's size: the model's tensors (shared ones once; for a peft model only its
    trainable tensors, which are what the Trainer writes) plus the optimizer's state tensors, with 5% and
    1 MiB for headers, scheduler, RNG and trainer state.

    Example:
        >>> m = torch.nn.Linear(256, 256)                   # 65,792 float32 values
        >>> checkpoint_bytes(m) == int(65792 * 4 * 1.05) + 2**20
        True
    """
    weights = trainable_parameters(model) if saves_adapter_only(model) else model.state_dict()
    total = _tensor_bytes(weights, set())
    if optimizer is not None and not model_only:
        state = getattr(optimizer, "state", {})
        total += _tensor_bytes(list(state.values()) if isinstance(state, dict) else [], set())
    return int(total * 1.05) + 2**20


def check_free_space(path: str, need: int, checkpoint: str) -> None:
    """Raise :class:`NoSpaceError` when the file system holding ``path`` has less than ``need`` bytes free.

    ``path`` may not exist yet: its nearest existing parent is asked.
    """
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return
        probe = parent
    free = shutil.disk_usage(probe).free
    if free < need:
        raise NoSpaceError(errno.ENOSPC, no_space_message(path, checkpoint, need, free))


def is_no_space_error(exc: BaseException) -> bool:
    """Whether an exception raised while writing a file means the disk was full.

    ``OSError`` with ``ENOSPC``/``EDQUOT``; torch's writer reports it as a ``RuntimeError`` ("file write
    failed", "unexpected pos ..."), safetensors as an ``OSError`` or a ``SafetensorError``.
    """
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
        return True
    text = str(exc).lower()
    return any(s in text for s in ("no space left", "unexpected pos", "file write failed", "disk quota"))
