"""Use hf_fasttrain's lr schedules in a plain `transformers.Trainer` (or TRL's trainers): one callback.

    args = TrainingArguments(..., lr_scheduler_type="constant")           # the callback shapes the lr
    trainer = Trainer(model, args, ..., callbacks=[LRScheduleCallback("sqrt", warmup_steps=0.01, min_lr_ratio=0.1)])

How: with `lr_scheduler_type="constant"` the Trainer builds a `LambdaLR` whose multiplier is always 1. At
`on_train_begin` (after the Trainer has built that scheduler and, on resume, loaded its checkpoint) the
callback replaces its lambdas by the multipliers of `hf_fasttrain.schedules`, one per param group, and
sets the lrs for the current step. The Trainer saves `last_epoch` with every checkpoint and the
multiplier is a pure function of it, so resuming continues the schedule exactly.

Conflict rule, explicit: the callback refuses any `lr_scheduler_type` but "constant" (any other would be
silently overridden), and takes its warmup from `TrainingArguments.warmup_steps` unless given its own;
giving both (non-zero) is an error.

Token-based progress (`total_tokens=...`) reads `TrainerState.num_input_tokens_seen`, which the Trainer
counts over all processes when `include_num_input_tokens_seen` is "all" or "non_padding", and restores
on resume from trainer_state.json.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch
from transformers import TrainerCallback

from ..schedules import DecayName, ScheduleSpec, TokenProgress

__all__ = ["LRScheduleCallback"]


class LRScheduleCallback(TrainerCallback):
    """Replace the constant lr of a `transformers.Trainer` by warmup + decay to a floor (see `hf_fasttrain.schedules`).

    Give the Trainer `lr_scheduler_type="constant"`; at the start of training the callback swaps the
    multipliers of the Trainer's `LambdaLR` (one per param group), so checkpoints and resumes work as usual.

    Args:
        lr_decay (`str`, *optional*, defaults to `"cosine"`):
            `"cosine"`, `"sqrt"`, `"linear"`, `"1-sqrt"` or `"constant"` (`hf_fasttrain.schedules.DECAY_SHAPES`).
        warmup_steps (`float`, *optional*, defaults to `None`):
            Steps (int) or fraction of training (< 1); `None` takes `TrainingArguments.warmup_steps`
            (giving both, non-zero, is an error).
        warmup_start_factor (`float`, *optional*, defaults to `0.0`):
            Lr multiplier at step 0, rising linearly to 1 over the warmup.
        min_lr (`float` or `Sequence[float]`, *optional*, defaults to `None`):
            Absolute floor (one, or one per param group).
        min_lr_ratio (`float`, *optional*, defaults to `None`):
            Floor as a fraction of each group's peak. At most one of `min_lr` / `min_lr_ratio`.
        decay_fraction (`float`, *optional*, defaults to `None`):
            Decay only over the last fraction of training (WSD); `None`: 0.2 for `"1-sqrt"`, else the whole
            post-warmup span.
        total_tokens (`int`, *optional*, defaults to `None`):
            Follow tokens seen (`TrainerState.num_input_tokens_seen`, counted with
            `include_num_input_tokens_seen="all"` or `"non_padding"`) up to this budget instead of steps.

    Example:
        ```python
        >>> from transformers import Trainer, TrainingArguments
        >>> from hf_fasttrain import LRScheduleCallback
        >>> callback = LRScheduleCallback("cosine", warmup_steps=0.02, min_lr_ratio=0.1)
        >>> args = TrainingArguments("out", learning_rate=1e-3, lr_scheduler_type="constant", max_steps=100)
        >>> # trainer = Trainer(model, args, train_dataset=ds, callbacks=[callback]); trainer.train()
        ```
    """

    def __init__(
        self,
        lr_decay: DecayName = "cosine",
        warmup_steps: float | None = None,
        warmup_start_factor: float = 0.0,
        min_lr: float | Sequence[float] | None = None,
        min_lr_ratio: float | None = None,
        decay_fraction: float | None = None,
        total_tokens: int | None = None,
    ):
        # the warmup is the Trainer's (set at on_train_begin) unless given here; the token total is the progress's
        self.spec = ScheduleSpec(lr_decay, warmup_steps or 0, warmup_start_factor, min_lr, min_lr_ratio, decay_fraction,
                                 unit="steps" if total_tokens is None else "tokens")
        if warmup_steps is not None and (isinstance(warmup_steps, bool) or not isinstance(warmup_steps, (int, float)) or warmup_steps < 0):
            raise ValueError(f"warmup_steps: got {warmup_steps!r}; must be an integer >= 0 or a fraction in (0, 1)")
        self.warmup_steps = warmup_steps
        self.progress = None if total_tokens is None else TokenProgress(total_tokens)

    def _check_args(self, args) -> None:
        scheduler_type = getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)
        if scheduler_type != "constant":
            raise ValueError(
                f"lr_scheduler_type={scheduler_type!r} is not allowed with LRScheduleCallback, which would override it; "
                f"set lr_scheduler_type='constant' and choose the schedule in the callback"
            )
        if self.warmup_steps is not None and args.warmup_steps:
            raise ValueError(
                f"warmup_steps is set twice: TrainingArguments.warmup_steps={args.warmup_steps!r} and "
                f"LRScheduleCallback(warmup_steps={self.warmup_steps!r}); set it in one place"
            )
        if self.progress is not None and args.include_num_input_tokens_seen in ("no", False):
            raise ValueError(
                f"include_num_input_tokens_seen={args.include_num_input_tokens_seen!r} is not allowed with "
                f"LRScheduleCallback(total_tokens=...); set it to 'all' or 'non_padding' so the Trainer counts tokens"
            )

    def on_init_end(self, args, state, control, **kwargs):
        self._check_args(args)

    def on_train_begin(self, args, state, control, lr_scheduler=None, **kwargs):
        self._check_args(args)
        if not isinstance(lr_scheduler, torch.optim.lr_scheduler.LambdaLR):
            raise ValueError(
                f"LRScheduleCallback needs the Trainer's LambdaLR scheduler, got {type(lr_scheduler).__name__}; "
                f"do not pass a scheduler through Trainer(optimizers=...)"
            )
        if self.progress is not None:
            self.progress.tokens_seen = int(state.num_input_tokens_seen)
        spec = self.spec if self.warmup_steps is not None else dataclasses.replace(self.spec, warmup_steps=args.warmup_steps)
        lr_scheduler.lr_lambdas = spec.lr_lambdas(lr_scheduler.base_lrs, state.max_steps, self.progress)
        # The constant scheduler already set every group to its peak lr; set the lr for the current step
        # (0, or the step resumed from) as LambdaLR would have.
        step = lr_scheduler.last_epoch
        for group, base_lr, fn in zip(lr_scheduler.optimizer.param_groups, lr_scheduler.base_lrs, lr_scheduler.lr_lambdas):
            lr = base_lr * fn(step)
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr
        lr_scheduler._last_lr = [group["lr"] for group in lr_scheduler.optimizer.param_groups]

    def on_optimizer_step(self, args, state, control, **kwargs):
        # Runs after optimizer.step() and before lr_scheduler.step(): the next lr follows the tokens trained on so far.
        if self.progress is not None:
            self.progress.tokens_seen = int(state.num_input_tokens_seen)
