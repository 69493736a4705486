"""FastTrainer's sequence-length wiring: the parts of hf_fasttrain.data built from its arguments.

FastTrainer holds one `SeqLenWiring` (None when every sequence-length option is off) and calls it
from five small hooks; everything it builds is a plain part of hf_fasttrain.data, usable without
FastTrainer (see hf_fasttrain.callbacks.seqlen for the plain-Trainer one-liners).

Which option does what (fields of FastTrainingArguments):

- ``length_grouping``: `LengthGroupedBatchSampler` with ``per_device_train_batch_size`` examples.
- ``max_tokens_per_batch``: `TokenBudgetBatchSampler` (padded tokens per micro-batch).
- ``batch_warmup_min_tokens``: `BatchWarmupBatchSampler`, token budgets growing from it to
  ``max_tokens_per_batch`` (or ``per_device_train_batch_size`` rows) over ``batch_warmup_fraction`` of
  ``max_steps``; the run is counted in tokens (``schedule_unit='tokens'``) and stops at
  ``schedule_total_tokens`` or at ``max_steps``, whichever comes first.
- ``packing="flatten"``: `PackedBatchSampler` bins of ``max_tokens_per_batch`` tokens, one
  padding-free row each (`DataCollatorWithFlattening`).
- ``packing="rows"``: ``per_device_train_batch_size`` rows of ``packing_row_length`` tokens
  (`PackedBatchSampler` + `PackedRowsCollator`).
- ``curriculum_min_length``: `CurriculumBatchSampler`, growing over ``curriculum_fraction`` of training.
- ``seq_len_warmup_min``: `SeqLenWarmup` over ``seq_len_warmup_fraction`` of training, applied to
  each batch as the training loop takes it; with ``seq_len_warmup_count_tokens`` the LR schedule advances
  with tokens and reaches its floor at the run's last step (``max_steps``, or the step that completes
  ``max_tokens``).

Arguments without these fields (a plain ``TrainingArguments``) read them as their defaults: all off.
"""

from __future__ import annotations

from typing import Optional

from .validation import ConfigError
from .config.args import FastOptions
from .callbacks.seqlen import CurriculumCallback, SeqLenWarmupCallback, batch_sampler_dataloader
from .data.from_args import batching_options, seqlen_enabled
from .data.packing import PackedBatchSampler, PackedRowsCollator
from .data.samplers import CurriculumBatchSampler, LengthGroupedBatchSampler, get_lengths
from .data.seqlen import SeqLenWarmupCollator
from .data.token_budget import BatchWarmupBatchSampler, TokenBudgetBatchSampler

__all__ = ["SeqLenWiring"]


# why the batching options are refused on a stream (one line, exit 2 on the command line)
STREAM_REFUSAL = ("length grouping, token budgets, curriculum and packing='rows'/'flatten' plan batches from every "
                  "example's length, known up front; a stream is packed on the fly into rows of block_size: drop the "
                  "option or load the data map-style (streaming: false)")


def _row_length(dataset, column: str) -> int:
    """Tokens in a training row: a stream's ``row_length``, else the first row's (a map-style or other iterable set)."""
    length = getattr(dataset, "row_length", None)
    if isinstance(length, int):
        return length
    if hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__"):
        return len(dataset[0][column])
    return len(next(iter(dataset))[column])  # an IterableDataset: its first row


def _fail(name, value, allowed: str) -> None:
    from .validation import ConfigError

    raise ConfigError(name, value, allowed)


class SeqLenWiring:
    """The sequence-length parts of one FastTrainer, built from its args and training set.

    Everything laid out over the run (the curriculum's and the batch-size warmup's share of it, the
    sequence-length warmup, the tokens a schedule counted in tokens spans) reads the run's length from the
    trainer's plan (``trainer.plan.length``, :class:`~hf_fasttrain.config.plan.RunLength`).

    Args:
        trainer: the FastTrainer (its ``args``, ``plan``, ``train_dataset``, ``data_collator``,
            ``processing_class`` are read once, at construction).
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.length = trainer.plan.length
        args = self.args = FastOptions(trainer.args)
        self.grad_accum = args.gradient_accumulation_steps
        self.rows = args.per_device_train_batch_size
        self.seed = args.data_seed if args.data_seed is not None else args.seed
        tok = trainer.processing_class
        self.pad_token_id = getattr(tok, "pad_token_id", None)
        names = getattr(tok, "model_input_names", None) or ["input_ids"]
        self.input_name = names[0]
        self.sampler = None
        self.collator = None
        self.cutter: Optional[SeqLenWarmupCollator] = None
        callbacks = []
        if batching_options(args):
            self.sampler, self.collator = self._batching(args, trainer.train_dataset, trainer.data_collator)
        if args.seq_len_warmup_min is not None:
            self.cutter = self._warmup(args, trainer.train_dataset, trainer.data_collator)
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
        if not seqlen_enabled(FastOptions(trainer.args)) or trainer.train_dataset is None:
            return None
        return cls(trainer)

    # -- construction --------------------------------------------------------------------------
    def _batching(self, args, dataset, data_collator):
        """The batch sampler (and collator) of the options; a refusal of the sampler names the option."""
        if args.curriculum_min_length is not None:
            names = {"min_length": "curriculum_min_length", "max_length": "curriculum_max_length",
                     "pacing": "curriculum_pacing", "num_stages": "curriculum_stages"}
        elif args.packing == "rows":
            names = {"max_tokens": "packing_row_length"}
        else:
            names = {"max_tokens": "max_tokens_per_batch", "min_tokens": "batch_warmup_min_tokens"}
        try:
            return self._build_batching(args, dataset, data_collator)
        except ConfigError as err:
            if type(err) is not ConfigError:
                raise
            raise err.renamed(names) from None

    def _build_batching(self, args, dataset, data_collator):
        if dataset is None or not hasattr(dataset, "__len__"):
            name, value = batching_options(args)[0]
            raise ConfigError(name, value, STREAM_REFUSAL, problem=f"got {value!r} on a stream (an IterableDataset)")
        lengths = get_lengths(dataset, column=self.input_name, length_column=args.length_column_name)
        shard = dict(seed=self.seed, world_size=args.world_size, rank=args.process_index)
        if args.length_grouping:
            return LengthGroupedBatchSampler(lengths, self.rows, drop_last=args.dataloader_drop_last, **shard), None
        if args.curriculum_min_length is not None:
            sampler = CurriculumBatchSampler(
                lengths, self.rows, min_length=args.curriculum_min_length,
                curriculum_batches=round(args.curriculum_fraction * self.length.optimizer_steps * self.grad_accum),
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
        if args.batch_warmup_min_tokens is not None:
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
        warmup_steps = round(args.batch_warmup_fraction * self.length.optimizer_steps)
        warmup_tokens = warmup_steps * self.grad_accum * max_tokens * max(args.world_size, 1)
        if warmup_tokens > int(lengths.sum()):
            _fail("batch_warmup_fraction", args.batch_warmup_fraction,
                  f"the warmup ({warmup_steps} steps of up to {max_tokens} tokens per micro-batch) must end "
                  f"within the first epoch ({int(lengths.sum())} tokens); use a smaller fraction or more data")
        return BatchWarmupBatchSampler(
            lengths, max_tokens, min_tokens=args.batch_warmup_min_tokens, warmup_steps=warmup_steps,
            grad_accum=self.grad_accum, max_batch_size=max_rows, pad_to_multiple_of=multiple, **shard,
        )

    def _warmup(self, args, dataset, data_collator) -> SeqLenWarmupCollator:
        """The collator that cuts each batch to the plan's sequence-length warmup (``plan.length.seq_len_warmup``)."""
        warmup = self.length.seq_len_warmup
        if warmup is None:  # the plan found no token rows to lay a warmup over
            _fail("seq_len_warmup_min", args.seq_len_warmup_min,
                  f"needs training rows of {self.input_name!r} token ids (a length to warm up to); these rows have none")
        self.row_length = warmup.max_seq_len
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
        warmup, ga, run = self.cutter.warmup, self.grad_accum, self.length
        # progress in tokens, as full-length steps of the schedule: at the run's last step (its optimizer steps, or
        # the step that completes max_tokens) the schedule is at its end, the floor. Counted per row slot.
        length = run.schedule_steps
        slots = run.global_batch // ga  # rows per micro-batch over all processes
        total = (-(-run.max_tokens // slots) if run.max_tokens is not None
                 else warmup.cumulative_tokens(run.optimizer_steps * ga, 1))

        def in_tokens(fn):
            return lambda step: fn(length * min(warmup.cumulative_tokens(step * ga, 1) / total, 1.0))

        # lambda(0) is unchanged (no tokens yet), so the lr LambdaLR set at construction stays right
        scheduler.lr_lambdas = [in_tokens(fn) for fn in lambdas]

    def schedule_tokens(self) -> int:
        """Tokens (all processes) a schedule counted in tokens spans: the plan's ``max_tokens``, or the tokens of
        its optimizer steps with their short early rows."""
        return self.length.max_tokens if self.length.max_tokens is not None else self.length.tokens
