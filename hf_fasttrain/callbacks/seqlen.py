"""Callbacks that keep sequence-length schedules in step with a `transformers.Trainer` and log them.

The schedules themselves are pure functions of a batch position (hf_fasttrain.data.seqlen /
samplers); the only state is that position, and it follows from ``global_step`` (saved in every
checkpoint) through `batches_consumed`. So these callbacks need no state of their own: at
``on_train_begin`` (after a resume has restored ``global_step``, before any batch is drawn) they set
the position, and at ``on_log`` they add the current value to the logs.

Also the Trainer glue for the batch samplers of hf_fasttrain.data: `batch_sampler_dataloader` (the
Trainer's train DataLoader driven by one of them) and the one-liners `apply_batch_sampler` /
`apply_seq_len_warmup`.
"""

from __future__ import annotations

from collections.abc import Callable

from torch.utils.data import Sampler
from transformers import TrainerCallback

from ..data.samplers import CurriculumBatchSampler
from ..data.seqlen import SeqLenWarmup, SeqLenWarmupCollator, batches_consumed
from ._logs import add_to_log

__all__ = [
    "SeqLenWarmupCallback",
    "CurriculumCallback",
    "apply_batch_sampler",
    "apply_seq_len_warmup",
    "batch_sampler_dataloader",
]


def _consumed(args, state, batches_per_epoch: int | None) -> int:
    if not batches_per_epoch:
        return state.global_step * args.gradient_accumulation_steps
    return batches_consumed(state.global_step, args.gradient_accumulation_steps, batches_per_epoch)


class SeqLenWarmupCallback(TrainerCallback):
    """Syncs a `SeqLenWarmupCollator` with the Trainer's progress and logs ``seq_len``.

    Use the wrapped collator for the training dataloader only (evaluation keeps full length):

        collator = SeqLenWarmupCollator(data_collator, SeqLenWarmup(64, 1024, warmup_batches=3000))
        trainer.get_train_dataloader = lambda: batch_sampler_dataloader(trainer, sampler, collator)  # or
        trainer.add_callback(SeqLenWarmupCallback(collator))

    Example:
        ```python
        >>> from transformers import default_data_collator
        >>> from hf_fasttrain.data.seqlen import SeqLenWarmup, SeqLenWarmupCollator
        >>> cb = SeqLenWarmupCallback(SeqLenWarmupCollator(default_data_collator, SeqLenWarmup(8, 64, 100)))
        ```
    """

    def __init__(self, collator: SeqLenWarmupCollator):
        if not isinstance(collator, SeqLenWarmupCollator):
            raise ValueError(f"collator={collator!r} must be a SeqLenWarmupCollator.")
        self.collator = collator
        self._batches_per_epoch: int | None = None

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        try:
            self._batches_per_epoch = len(train_dataloader) if train_dataloader is not None else None
        except TypeError:  # an iterable dataset has no length
            self._batches_per_epoch = None
        self.collator.position = _consumed(args, state, self._batches_per_epoch)

    def on_log(self, args, state, control, logs=None, **kwargs):
        last = max(_consumed(args, state, self._batches_per_epoch) - 1, 0)
        add_to_log(state, logs, {"seq_len": self.collator.warmup.seq_len(last)})


class CurriculumCallback(TrainerCallback):
    """Logs the `CurriculumBatchSampler`'s ``length_limit`` of the last trained batch.

    The limit is a function of the batch position, which all ranks share; nothing else to sync
    (on resume the Trainer re-iterates the sampler and skips the consumed batches).

    Example:
        ```python
        >>> from hf_fasttrain.data.samplers import CurriculumBatchSampler
        >>> cb = CurriculumCallback(CurriculumBatchSampler([1, 2, 3, 4], 1, min_length=1, curriculum_batches=2))
        ```
    """

    def __init__(self, sampler: CurriculumBatchSampler):
        if not isinstance(sampler, CurriculumBatchSampler):
            raise ValueError(f"sampler={sampler!r} must be a CurriculumBatchSampler.")
        self.sampler = sampler

    def on_log(self, args, state, control, logs=None, **kwargs):
        per_epoch = self.sampler.steps_per_epoch
        last = max(_consumed(args, state, per_epoch) - 1, 0)
        add_to_log(state, logs, {"length_limit": self.sampler.length_limit(last)})


# ---- one-liners for a plain transformers.Trainer -------------------------------------------------


def apply_batch_sampler(trainer, batch_sampler) -> None:
    """Make `trainer` draw its training batches from `batch_sampler` (any sampler of hf_fasttrain.data).

    Replaces the instance's `get_train_dataloader` with `batch_sampler_dataloader`; with a
    `CurriculumBatchSampler`, also adds a `CurriculumCallback` that logs ``length_limit``.

        apply_batch_sampler(trainer, TokenBudgetBatchSampler(get_lengths(ds), 8192, seed=args.seed,
            world_size=args.world_size, rank=args.process_index, grad_accum=args.gradient_accumulation_steps))
    """
    trainer.get_train_dataloader = lambda: batch_sampler_dataloader(trainer, batch_sampler)
    if isinstance(batch_sampler, CurriculumBatchSampler):
        trainer.add_callback(CurriculumCallback(batch_sampler))


def apply_seq_len_warmup(trainer, warmup: SeqLenWarmup, pad_token_id: int | None = None) -> SeqLenWarmupCollator:
    """Apply sequence-length warmup to `trainer`'s training batches (evaluation keeps full length).

    Wraps the Trainer's collator in a `SeqLenWarmupCollator` for the training dataloader only (also
    after `apply_batch_sampler`) and adds a `SeqLenWarmupCallback`. Returns the collator.

        apply_seq_len_warmup(trainer, SeqLenWarmup(64, 1024, warmup_batches=3000))
    """
    if pad_token_id is None:
        pad_token_id = getattr(trainer.processing_class, "pad_token_id", None) or 0
    collator = SeqLenWarmupCollator(trainer.data_collator, warmup, pad_token_id)
    build = trainer.get_train_dataloader  # bound method, or an earlier one-liner's replacement

    def get_train_dataloader():
        original, trainer.data_collator = trainer.data_collator, collator
        try:
            return build()
        finally:
            trainer.data_collator = original

    trainer.get_train_dataloader = get_train_dataloader
    trainer.add_callback(SeqLenWarmupCallback(collator))
    return collator


def batch_sampler_dataloader(trainer, batch_sampler: Sampler, data_collator: Callable | None = None):
    """The Trainer's train DataLoader, but driven by a rank-aware batch sampler of hf_fasttrain.data.

    Builds the DataLoader as `Trainer._get_dataloader` does (unused columns removed, the Trainer's
    worker settings and seeding), prepares it with the Trainer's accelerator, and turns the
    `BatchSamplerShard` that accelerate wraps around it into a passthrough: the sampler already
    yields only this rank's batches (the Trainer does the same for its `BatchRebalanceSampler`).
    Skipping on resume (accelerate's `skip_first_batches`, which `Trainer.get_resumed_dataloader` calls from
    transformers 5.25 on) and `set_epoch` keep working.

    One line for a plain `transformers.Trainer`:

        trainer.get_train_dataloader = lambda: batch_sampler_dataloader(trainer, sampler)

    with ``sampler = TokenBudgetBatchSampler(lengths, 8192, seed=args.seed, world_size=args.world_size,
    rank=args.process_index, grad_accum=args.gradient_accumulation_steps)`` (any sampler here).
    """
    from functools import partial

    from torch.utils.data import DataLoader
    from transformers.trainer_utils import seed_worker

    args = trainer.args
    dataset = trainer.train_dataset
    if dataset is None:
        raise ValueError("Trainer: training requires a train_dataset.")
    collator = trainer.data_collator if data_collator is None else data_collator
    try:
        import datasets

        is_hf_dataset = isinstance(dataset, datasets.Dataset)
    except ImportError:  # pragma: no cover - datasets is a dependency
        is_hf_dataset = False
    if is_hf_dataset:
        dataset = trainer._remove_unused_columns(dataset, description="Training")
    else:
        collator = trainer._get_collator_with_removed_columns(collator, description="Training")
    params = {
        "batch_sampler": batch_sampler,
        "collate_fn": collator,
        "num_workers": args.dataloader_num_workers,
        "pin_memory": args.dataloader_pin_memory,
        "persistent_workers": args.dataloader_persistent_workers,
        "worker_init_fn": partial(seed_worker, num_workers=args.dataloader_num_workers, rank=args.process_index),
    }
    if args.dataloader_num_workers > 0:
        params["prefetch_factor"] = args.dataloader_prefetch_factor
        params["multiprocessing_context"] = args.dataloader_multiprocessing_context
    loader = trainer.accelerator.prepare(DataLoader(dataset, **params))
    shard = getattr(loader, "batch_sampler", None)
    if shard is not None and getattr(shard, "batch_sampler", None) is batch_sampler:
        shard.num_processes = 1  # the sampler is already sharded by rank
        shard.process_index = 0
    return loader
