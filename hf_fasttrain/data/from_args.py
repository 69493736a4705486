"""FastTrainingArguments -> the sequence-length parts: validation, samplers, collators, warmup.

FastTrainer holds one `SeqLenWiring` (None when every sequence-length option is off) and calls it
from five small hooks; everything it builds is a plain part of hf_fasttrain.data, usable without
FastTrainer (see hf_fasttrain.callbacks.seqlen for the plain-Trainer one-liners).

Which option does what (fields of FastTrainingArguments):

- ``length_grouping``: `LengthGroupedBatchSampler` with ``per_device_train_batch_size`` examples.
- ``max_tokens_per_batch``: `TokenBudgetBatchSampler` (padded tokens per micro-batch).
- ``batch_warmup_min_tokens``: `BatchWarmupBatchSampler`, token budgets growing from it to
  ``max_tokens_per_batch`` (or ``per_device_train_batch_size`` rows) over ``batch_warmup_fraction`` of
  ``max_steps``; the run is counted in tokens (``schedule_unit='tokens'``) and may take up to that many
  more, smaller steps to reach ``schedule_total_tokens``.
- ``packing="flatten"``: `PackedBatchSampler` bins of ``max_tokens_per_batch`` tokens, one
  padding-free row each (`DataCollatorWithFlattening`).
- ``packing="rows"``: ``per_device_train_batch_size`` rows of ``packing_row_length`` tokens
  (`PackedBatchSampler` + `PackedRowsCollator`).
- ``curriculum_min_length``: `CurriculumBatchSampler`, growing over ``curriculum_fraction`` of training.
- ``seq_len_warmup_min``: `SeqLenWarmup` over ``seq_len_warmup_fraction`` of training, applied to
  each batch as the training loop takes it; with ``seq_len_warmup_count_tokens`` the run stops after
  the tokens of ``max_steps`` full-length steps and the LR schedule advances with tokens.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from .packing import PackedBatchSampler, PackedRowsCollator
from .samplers import (
    BatchWarmupBatchSampler,
    CurriculumBatchSampler,
    LengthGroupedBatchSampler,
    TokenBudgetBatchSampler,
    batch_sampler_dataloader,
    get_lengths,
)
from .seqlen import PACINGS, SEQ_LEN_MODES, SeqLenWarmup, SeqLenWarmupCollator

__all__ = ["PACKING_MODES", "check_seqlen_args", "seqlen_enabled", "SeqLenWiring"]

PACKING_MODES = ("none", "flatten", "rows")


def _fail(name: str, value: Any, allowed: str) -> None:
    raise ValueError(f"{name}={value!r} is invalid: {allowed}")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _batching_options(args) -> list[tuple[str, Any]]:
    """The batching options that are on, as (field, value) (at most one may be)."""
    on = []
    if args.length_grouping:
        on.append(("length_grouping", True))
    if args.max_tokens_per_batch is not None and args.packing == "none":
        on.append(("max_tokens_per_batch", args.max_tokens_per_batch))
    elif getattr(args, "batch_warmup_min_tokens", None) is not None:  # batch-size warmup over fixed row counts
        on.append(("batch_warmup_min_tokens", args.batch_warmup_min_tokens))
    if args.packing != "none":
        on.append(("packing", args.packing))
    if args.curriculum_min_length is not None:
        on.append(("curriculum_min_length", args.curriculum_min_length))
    return on


def seqlen_enabled(args) -> bool:
    return bool(_batching_options(args)) or args.seq_len_warmup_min is not None


def check_seqlen_args(args) -> None:
    """Validate the sequence-length fields of FastTrainingArguments (called from ``__post_init__``)."""
    if not isinstance(args.length_grouping, bool):
        _fail("length_grouping", args.length_grouping, "must be true or false")
    if args.max_tokens_per_batch is not None and not (_is_int(args.max_tokens_per_batch) and args.max_tokens_per_batch >= 1):
        _fail("max_tokens_per_batch", args.max_tokens_per_batch, "must be a positive integer or null")
    if args.packing not in PACKING_MODES:
        _fail("packing", args.packing, f"allowed: {list(PACKING_MODES)}")
    if args.packing == "flatten" and args.max_tokens_per_batch is None:
        _fail("max_tokens_per_batch", None, "packing='flatten' needs it: the tokens of each packed row")
    if args.packing == "rows":
        if not (_is_int(args.packing_row_length) and args.packing_row_length >= 1):
            _fail("packing_row_length", args.packing_row_length, "packing='rows' needs a positive integer (tokens per row)")
    elif args.packing_row_length is not None:
        _fail("packing_row_length", args.packing_row_length, f"only used with packing='rows' (packing={args.packing!r})")
    on = _batching_options(args)
    if len(on) > 1:
        _fail(on[1][0], on[1][1], f"choose one batching option; {on[0][0]}={on[0][1]!r} is also set")
    if on and args.train_sampling_strategy != "random":
        _fail("train_sampling_strategy", args.train_sampling_strategy,
              f"must stay 'random' with {on[0][0]}={on[0][1]!r}: hf_fasttrain's sampler replaces the Trainer's")

    _check_batch_warmup(args)
    if args.curriculum_min_length is not None:
        if not (_is_int(args.curriculum_min_length) and args.curriculum_min_length >= 1):
            _fail("curriculum_min_length", args.curriculum_min_length, "must be a positive integer or null")
        if args.curriculum_max_length is not None:
            if not _is_int(args.curriculum_max_length):
                _fail("curriculum_max_length", args.curriculum_max_length, "must be an integer or null")
            if args.curriculum_min_length > args.curriculum_max_length:
                _fail("curriculum_min_length", args.curriculum_min_length,
                      f"is above curriculum_max_length={args.curriculum_max_length}; it must be <= it")
        _check_schedule(args, "curriculum")
    if args.seq_len_warmup_min is not None:
        if not (_is_int(args.seq_len_warmup_min) and args.seq_len_warmup_min >= 1):
            _fail("seq_len_warmup_min", args.seq_len_warmup_min, "must be a positive integer or null")
        if not (_is_int(args.seq_len_warmup_multiple) and args.seq_len_warmup_multiple >= 1):
            _fail("seq_len_warmup_multiple", args.seq_len_warmup_multiple, "must be a positive integer")
        if args.seq_len_warmup_mode not in SEQ_LEN_MODES:
            _fail("seq_len_warmup_mode", args.seq_len_warmup_mode, f"allowed: {list(SEQ_LEN_MODES)}")
        if args.packing != "none":
            _fail("packing", args.packing, "sequence-length warmup is for fixed-length rows; use packing='none'")
        _check_schedule(args, "seq_len_warmup")


def _check_batch_warmup(args) -> None:
    min_tokens = getattr(args, "batch_warmup_min_tokens", None)
    if min_tokens is None:
        return
    if not (_is_int(min_tokens) and min_tokens >= 1):
        _fail("batch_warmup_min_tokens", min_tokens, "must be a positive integer (tokens per micro-batch at the start) or null")
    if args.max_tokens_per_batch is not None and min_tokens > args.max_tokens_per_batch:
        _fail("batch_warmup_min_tokens", min_tokens, f"must be <= max_tokens_per_batch={args.max_tokens_per_batch}")
    if args.packing != "none":
        _fail("packing", args.packing, "batch-size warmup works on token-budget or fixed-count batches; use packing='none'")
    fraction = args.batch_warmup_fraction
    if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 <= fraction <= 1.0):
        _fail("batch_warmup_fraction", fraction, "must be in [0, 1] (the share of max_steps over which the batch grows)")
    if args.max_steps <= 0:
        _fail("max_steps", args.max_steps, "batch-size warmup is scheduled over max_steps; set max_steps > 0")
    if args.lr_decay is None or args.schedule_unit != "tokens" or args.schedule_total_tokens is None:
        _fail("batch_warmup_min_tokens", min_tokens,
              "batch-size warmup changes the tokens per step, so the run is counted in tokens: set lr_decay "
              "(e.g. 'cosine'), schedule_unit='tokens' and schedule_total_tokens (the run's token budget, "
              f"e.g. max_steps x global batch x row length); got lr_decay={args.lr_decay!r}, "
              f"schedule_unit={args.schedule_unit!r}, schedule_total_tokens={args.schedule_total_tokens!r}")


def _check_schedule(args, prefix: str) -> None:
    fraction, pacing, stages = (getattr(args, f"{prefix}_{k}") for k in ("fraction", "pacing", "stages"))
    if not (isinstance(fraction, (int, float)) and 0.0 <= fraction <= 1.0):
        _fail(f"{prefix}_fraction", fraction, "must be in [0, 1] (the share of max_steps over which lengths grow)")
    if pacing not in PACINGS:
        _fail(f"{prefix}_pacing", pacing, f"allowed: {list(PACINGS)}")
    if not (_is_int(stages) and stages >= 1):
        _fail(f"{prefix}_stages", stages, "must be a positive integer")
    if args.max_steps <= 0:
        _fail("max_steps", args.max_steps, f"{prefix} is scheduled over max_steps; set max_steps > 0")


class SeqLenWiring:
    """The sequence-length parts of one FastTrainer, built from its args and training set.

    Args:
        trainer: the FastTrainer (its ``args``, ``train_dataset``, ``data_collator``,
            ``processing_class`` are read once, at construction).
    """

    def __init__(self, trainer):
        self.trainer = trainer
        args = trainer.args
        self.grad_accum = args.gradient_accumulation_steps
        self.rows = args.per_device_train_batch_size
        self.base_max_steps = args.max_steps
        self.seed = args.data_seed if args.data_seed is not None else args.seed
        tok = trainer.processing_class
        self.pad_token_id = getattr(tok, "pad_token_id", None)
        names = getattr(tok, "model_input_names", None) or ["input_ids"]
        self.input_name = names[0]
        self.sampler = None
        self.collator = None
        self.batch_warmup_steps = 0  # optimizer steps of a batch-size warmup (smaller steps: the run needs more)
        self.cutter: Optional[SeqLenWarmupCollator] = None
        callbacks = []
        if _batching_options(args):
            self.sampler, self.collator = self._batching(args, trainer.train_dataset, trainer.data_collator)
        if args.seq_len_warmup_min is not None:
            self.cutter = self._warmup(args, trainer.train_dataset, trainer.data_collator)
        from ..callbacks.seqlen import CurriculumCallback, SeqLenWarmupCallback

        if isinstance(self.sampler, CurriculumBatchSampler):
            callbacks.append(CurriculumCallback(self.sampler))
        if self.cutter is not None:
            callbacks.append(SeqLenWarmupCallback(self.cutter))
        for cb in callbacks:  # first, so every reporter sees the values they add to the logs
            trainer.callback_handler.callbacks.insert(0, cb)
        self.count_tokens = (
            self.cutter is not None and args.seq_len_warmup_count_tokens and self.cutter.warmup.mode == "truncate"
        )

    @classmethod
    def from_trainer(cls, trainer) -> Optional["SeqLenWiring"]:
        """None when every sequence-length option is off (or there is no training set: evaluation only)."""
        if not seqlen_enabled(trainer.args) or trainer.train_dataset is None:
            return None
        return cls(trainer)

    # -- construction --------------------------------------------------------------------------
    def _batching(self, args, dataset, data_collator):
        if dataset is None or not hasattr(dataset, "__len__"):
            name, value = _batching_options(args)[0]
            raise ValueError(f"{name}={value!r} needs a training set with a length (not an IterableDataset)")
        lengths = get_lengths(dataset, column=self.input_name, length_column=args.length_column_name)
        shard = dict(seed=self.seed, world_size=args.world_size, rank=args.process_index)
        if args.length_grouping:
            return LengthGroupedBatchSampler(lengths, self.rows, drop_last=args.dataloader_drop_last, **shard), None
        if args.curriculum_min_length is not None:
            sampler = CurriculumBatchSampler(
                lengths, self.rows, min_length=args.curriculum_min_length,
                curriculum_batches=round(args.curriculum_fraction * args.max_steps * self.grad_accum),
                max_length=args.curriculum_max_length, pacing=args.curriculum_pacing,
                num_stages=args.curriculum_stages, drop_last=args.dataloader_drop_last, **shard,
            )
            return sampler, None
        if args.packing == "flatten":
            from transformers import DataCollatorWithFlattening

            sampler = PackedBatchSampler(lengths, args.max_tokens_per_batch, grad_accum=self.grad_accum, **shard)
            return sampler, DataCollatorWithFlattening()
        if args.packing == "rows":
            sampler = PackedBatchSampler(
                lengths, args.packing_row_length, rows_per_batch=self.rows, grad_accum=self.grad_accum, **shard
            )
            pad = self.pad_token_id if self.pad_token_id is not None else 0
            return sampler, PackedRowsCollator(row_len=args.packing_row_length, num_rows=self.rows, pad_token_id=pad)
        multiple = getattr(data_collator, "pad_to_multiple_of", None) or 1
        if getattr(args, "batch_warmup_min_tokens", None) is not None:
            return self._batch_warmup(args, lengths, multiple, shard), None
        sampler = TokenBudgetBatchSampler(
            lengths, args.max_tokens_per_batch, grad_accum=self.grad_accum, pad_to_multiple_of=multiple, **shard
        )
        return sampler, None

    def _batch_warmup(self, args, lengths, multiple: int, shard: dict) -> BatchWarmupBatchSampler:
        if args.max_tokens_per_batch is not None:  # token budgets
            max_tokens, max_rows = args.max_tokens_per_batch, None
        else:  # fixed row counts: the full batch is per_device_train_batch_size rows of the longest length
            longest = -(-int(lengths.max()) // multiple) * multiple
            max_tokens, max_rows = self.rows * longest, self.rows
            if args.batch_warmup_min_tokens > max_tokens:
                _fail("batch_warmup_min_tokens", args.batch_warmup_min_tokens,
                      f"must be <= the full micro-batch's {max_tokens} tokens ({self.rows} rows x {longest})")
        self.batch_warmup_steps = round(args.batch_warmup_fraction * args.max_steps)
        warmup_tokens = self.batch_warmup_steps * self.grad_accum * max_tokens * max(args.world_size, 1)
        if warmup_tokens > int(lengths.sum()):
            _fail("batch_warmup_fraction", args.batch_warmup_fraction,
                  f"the warmup ({self.batch_warmup_steps} steps of up to {max_tokens} tokens per micro-batch) must end "
                  f"within the first epoch ({int(lengths.sum())} tokens); use a smaller fraction or more data")
        return BatchWarmupBatchSampler(
            lengths, max_tokens, min_tokens=args.batch_warmup_min_tokens, warmup_steps=self.batch_warmup_steps,
            grad_accum=self.grad_accum, max_batch_size=max_rows, pad_to_multiple_of=multiple, **shard,
        )

    def _warmup(self, args, dataset, data_collator) -> SeqLenWarmupCollator:
        full = len(dataset[0][self.input_name])
        if args.seq_len_warmup_min > full:
            _fail("seq_len_warmup_min", args.seq_len_warmup_min,
                  f"is above the training length {full} (the length of the training rows)")
        warmup = SeqLenWarmup(
            min_seq_len=args.seq_len_warmup_min, max_seq_len=full,
            warmup_batches=round(args.seq_len_warmup_fraction * args.max_steps * self.grad_accum),
            multiple=args.seq_len_warmup_multiple, pacing=args.seq_len_warmup_pacing,
            num_stages=args.seq_len_warmup_stages, mode=args.seq_len_warmup_mode,
        )
        pad = self.pad_token_id if self.pad_token_id is not None else 0
        return SeqLenWarmupCollator(data_collator, warmup, pad_token_id=pad)

    # -- hooks ---------------------------------------------------------------------------------
    def train_dataloader(self):
        """The training DataLoader driven by this run's batch sampler, or None for the Trainer's own."""
        if self.sampler is None:
            return None
        return batch_sampler_dataloader(self.trainer, self.sampler, self.collator)

    def cut(self, batches: list) -> list:
        """Sequence-length warmup on the micro-batches the training loop just took (main process)."""
        return [self.cutter.cut(b) for b in batches]

    def max_steps(self, max_steps: int) -> int:
        """Optimizer steps of the run: with token counting, enough for ``base max_steps`` full-length steps' tokens."""
        if self.batch_warmup_steps:  # each warmup step holds less than a full one: at most this many more steps;
            return max_steps + self.batch_warmup_steps  # the token budget (schedule_total_tokens) stops the run
        if not self.count_tokens:
            return max_steps
        warmup = self.cutter.warmup
        tokens = self.base_max_steps * self.grad_accum * warmup.max_seq_len
        return math.ceil(warmup.batches_for_tokens(tokens, 1) / self.grad_accum)

    def adjust_training_values(self, values: tuple) -> tuple:
        """Rewrite `Trainer.set_initial_training_values` for a token-counted stop."""
        epochs, per_epoch, examples, samples, total_batch, steps_in_epoch, max_steps = values
        new = self.max_steps(max_steps)
        if new == max_steps:
            return values
        return (math.ceil(new / per_epoch), per_epoch, examples, new * total_batch, total_batch, steps_in_epoch, new)

    def count_schedule_in_tokens(self, scheduler) -> None:
        """Evaluate each LambdaLR multiplier at the full-length steps whose tokens were seen."""
        if not self.count_tokens:
            return
        lambdas = getattr(scheduler, "lr_lambdas", None)
        if lambdas is None:
            raise ValueError(
                f"seq_len_warmup_count_tokens=True needs a LambdaLR schedule; lr_scheduler_type="
                f"{self.trainer.args.lr_scheduler_type!r} gives {type(scheduler).__name__} (set it to false)"
            )
        warmup, ga = self.cutter.warmup, self.grad_accum

        def in_tokens(fn):
            return lambda step: fn(warmup.full_length_batches(step * ga) / ga)

        # lambda(0) is unchanged (no tokens yet), so the lr LambdaLR set at construction stays right
        scheduler.lr_lambdas = [in_tokens(fn) for fn in lambdas]

    def schedule_steps(self, num_training_steps: int) -> int:
        """The steps the LR schedule is built for: the user's max_steps when counting tokens."""
        return self.base_max_steps if self.count_tokens or self.batch_warmup_steps else num_training_steps
