"""Batch samplers for variable-length data: length grouping, token budgets and a short-to-long curriculum.

Every sampler here is a pure function of (seed, epoch, position, world_size, rank):

- an epoch's *plan* is a list of steps; a step holds one batch per rank (``plan[step][rank]``), so
  all ranks step together and never run out at different times;
- the plan depends only on the lengths, the settings, the seed and the epoch (its own
  `torch.Generator`, never the global RNG), so every rank computes the same plan without talking
  to the others, and a resumed run re-creates it and skips the consumed steps;
- anything that changes with training progress (the curriculum's length limit) is a function of the
  step's position in the run, i.e. of batches actually produced, not of ``global_step``.

Lengths come from a column computed once (`add_length_column`, a batched `datasets.map`), not by
reading every example as `transformers`' `LengthGroupedSampler` does when the column is missing.

The samplers are *batch samplers*: pass them as ``DataLoader(ds, batch_sampler=...)`` and call
``set_epoch(epoch)`` before each epoch. With `accelerate`/the Trainer use
`hf_fasttrain.callbacks.batch_sampler_dataloader`, which keeps ``accelerator.prepare`` from sharding them a
second time (they are already rank-aware); FastTrainer does this from its arguments, and
`hf_fasttrain.callbacks.apply_batch_sampler` is the one-liner for a plain `transformers.Trainer`.

The sampler's ``state_dict`` position counts batches it has yielded; a DataLoader draws ahead of
training, so the Trainer resumes by skipping the batches it trained (re-iterating the same plan),
not from this position.

Layout: this module holds the lengths, length grouping and the curriculum; `token_budget` the
token-budget batching and the batch-size warmup (its names are importable from here too); `step_plan` the
machinery they and `packing` share (checks, seeded permutations, the base sampler, and `StepPlanSettings`:
the seed, ranks, gradient accumulation and drop_last every plan takes whole).

References:
- Megabatch length grouping: `transformers.trainer_pt_utils.get_length_grouped_indices`.
- Curriculum on example length with sampling from the admitted examples: Platanios et al.,
  "Competence-based Curriculum Learning for Neural Machine Translation", NAACL 2019.
- Token budgets and the batch-size warmup: see `token_budget`.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from ..validation import ConfigError
from .step_plan import Step, StepPlanSettings, as_lengths, check_int, deal, permutation, shuffle_steps
from .step_plan import StepPlanBatchSampler
from .seqlen import Pacing, check_pacing, length_limit_at

# token-budget batching and the batch-size warmup live in token_budget.py; imported here as before
from .token_budget import (
    BatchWarmupBatchSampler,
    TokenBudgetBatchSampler,
    batch_warmup_budget,
    batch_warmup_steps,
    token_budget_steps,
)

__all__ = [
    "StepPlanSettings",
    "add_length_column",
    "get_lengths",
    "length_grouped_steps",
    "token_budget_steps",
    "curriculum_steps",
    "batch_warmup_budget",
    "batch_warmup_steps",
    "LengthGroupedBatchSampler",
    "TokenBudgetBatchSampler",
    "BatchWarmupBatchSampler",
    "CurriculumBatchSampler",
]


# ---- lengths ------------------------------------------------------------------------------------


def add_length_column(
    dataset,
    column: str = "input_ids",
    length_column: str = "length",
    num_proc: int | None = None,
    overwrite: bool = False,
):
    """Add ``length_column`` = ``len(example[column])`` to a `datasets.Dataset`, in one batched map.

    The map shows a progress bar and is cached by `datasets`, so large sets pay once. If the column
    already exists it is kept (``overwrite=False``).

    Example:
        ```python
        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]]})
        >>> list(add_length_column(ds)["length"])
        [3, 1]
        ```
    """
    if column not in dataset.column_names:
        raise ValueError(f"column={column!r} is not a column of the dataset; columns are {dataset.column_names}.")
    if length_column in dataset.column_names:
        if not overwrite:
            return dataset
        dataset = dataset.remove_columns(length_column)
    return dataset.map(
        lambda batch: {length_column: [len(x) for x in batch[column]]},
        batched=True,
        num_proc=num_proc,
        desc=f"Computing {length_column!r} from {column!r}",
    )


def get_lengths(dataset, column: str = "input_ids", length_column: str = "length") -> np.ndarray:
    """Lengths of all examples (int64 array): the `length_column` if the dataset has it, else computed once.

    Works on a `datasets.Dataset` (batched map, see `add_length_column`; the column is read as one
    numpy array, not item by item) and on any sequence of mappings (a list of dicts).
    """
    names = getattr(dataset, "column_names", None)
    if names is not None:
        if length_column not in names:
            dataset = add_length_column(dataset, column=column, length_column=length_column)
        column_only = dataset.select_columns([length_column]).with_format("numpy")
        return np.asarray(column_only[:][length_column], dtype=np.int64)
    return np.asarray([len(example[column]) for example in dataset], dtype=np.int64)


# ---- pure plans ---------------------------------------------------------------------------------


def length_grouped_steps(
    lengths: Sequence[int],
    batch_size: int,
    settings: StepPlanSettings = StepPlanSettings(),
    *,
    epoch: int = 0,
    megabatch_mult: int | None = None,
) -> list[Step]:
    """Plan one epoch of length-grouped batches: ``steps[k][rank]`` is rank's k-th batch.

    1. Randomly permute the indices (seed, epoch).
    2. Cut into megabatches of ``megabatch_mult * batch_size * world_size`` and sort each by length,
       longest first (`transformers`' `get_length_grouped_indices`; default multiplier
       ``min(50, N // (4 * batch_size * world_size))``, at least 1).
    3. Cut each megabatch into steps of ``batch_size * world_size`` similar-length examples; a step's
       examples are dealt to the ranks in contiguous slices, so ranks step on similar lengths.
    4. Shuffle the order of the steps (seed, epoch), so lengths do not trend within an epoch.
    The last step may be short; it is dealt evenly across ranks (``drop_last=True`` drops it). Every
    example appears exactly once per epoch (if ``N >= world_size``).
    """
    arr = as_lengths(lengths)
    check_int("batch_size", batch_size, 1)
    seed, world_size = settings.seed, settings.world_size
    n, group = len(arr), batch_size * world_size
    if megabatch_mult is None:
        megabatch_mult = max(1, min(50, n // (4 * group)))
    check_int("megabatch_mult", megabatch_mult, 1)
    perm = permutation(n, seed, epoch)
    mega = megabatch_mult * group
    steps: list[Step] = []
    for start in range(0, n, mega):
        chunk = perm[start : start + mega]
        chunk = chunk[np.argsort(-arr[chunk], kind="stable")]
        for g in range(0, len(chunk), group):
            members = chunk[g : g + group]
            if len(members) < group and settings.drop_last:
                continue
            steps.append(deal(members, world_size, perm))
    return shuffle_steps(steps, seed, epoch)


def curriculum_steps(
    lengths: Sequence[int],
    batch_size: int,
    settings: StepPlanSettings = StepPlanSettings(),
    *,
    epoch: int = 0,
    min_length: int,
    curriculum_batches: int,
    max_length: int | None = None,
    pacing: Pacing = "linear",
    num_stages: int = 4,
) -> tuple[list[Step], list[int]]:
    """Plan one epoch of a short-to-long curriculum; returns ``(steps, limits)``.

    An epoch has ``S = ceil(N / (batch_size * world_size))`` steps (floor with `settings.drop_last`). Step k of
    epoch e is position ``t = e * S + k`` of the run; it only draws examples with
    ``length <= limits[k] = length_limit_at(t / curriculum_batches, min_length, max_length, pacing)``.
    Within an epoch, admitted examples are drawn without replacement in a random order (seed, epoch);
    when all admitted examples have been drawn, drawing restarts over them in a new random order
    (so short examples repeat during the curriculum, as in Platanios et al. 2019, who sample
    uniformly from the admitted set). The examples of a step are sorted by length and dealt to
    the ranks in contiguous slices. Once the limit admits everything at an epoch's start, the epoch
    is a plain random pass (each example once; the last step is topped up from a new order).
    Examples longer than `max_length` are never drawn.
    """
    arr = as_lengths(lengths)
    check_int("batch_size", batch_size, 1)
    seed, world_size = settings.seed, settings.world_size
    check_int("curriculum_batches", curriculum_batches, 0)
    check_int("epoch", epoch, 0)
    check_pacing(pacing, num_stages, field="pacing", stages_field="num_stages")
    max_length = int(arr.max()) if max_length is None else max_length
    check_int("min_length", min_length, 1)
    check_int("max_length", max_length, 1)
    if min_length > max_length:
        raise ConfigError("min_length", min_length, f"must be <= max_length ({max_length})")
    n, group = len(arr), batch_size * world_size
    admitted_at_start = int((arr <= min_length).sum())
    if admitted_at_start < group:
        raise ConfigError(
            "min_length", min_length,
            f"must be at least {int(np.sort(arr)[min(group, n) - 1])}"
            + ("" if n >= group else f", with more data ({n} examples)"),
            problem=f"got {min_length}, which admits {admitted_at_start} examples, fewer than one step needs "
            f"(batch_size * world_size = {group})",
        )
    steps_per_epoch = n // group if settings.drop_last else -(-n // group)

    def limit(t: int) -> int:
        progress = 1.0 if curriculum_batches == 0 else t / curriculum_batches
        return length_limit_at(progress, min_length, max_length, pacing, num_stages)

    by_length = np.argsort(arr, kind="stable")
    rank_of = np.empty(n, dtype=np.int64)
    cycle = 0
    rank_of[permutation(n, seed, epoch, stream=2)] = np.arange(n)
    heap: list[tuple[int, int]] = []
    admitted = 0  # by_length[:admitted] are admitted
    steps: list[Step] = []
    limits: list[int] = []
    for k in range(steps_per_epoch):
        lim = limit(epoch * steps_per_epoch + k)
        while admitted < n and arr[by_length[admitted]] <= lim:
            i = int(by_length[admitted])
            heapq.heappush(heap, (int(rank_of[i]), i))
            admitted += 1
        chosen: list[int] = []
        taken: set[int] = set()
        while len(chosen) < group:
            if not heap:  # every admitted example was drawn: start a new random order over them
                cycle += 1
                rank_of[permutation(n, seed, epoch, stream=2 + cycle)] = np.arange(n)
                heap = [(int(rank_of[i]), int(i)) for i in by_length[:admitted] if int(i) not in taken]
                heapq.heapify(heap)
            _, i = heapq.heappop(heap)
            chosen.append(i)
            taken.add(i)
        chosen.sort(key=lambda i: -arr[i])
        steps.append([chosen[r * batch_size : (r + 1) * batch_size] for r in range(world_size)])
        limits.append(lim)
    return steps, limits


# ---- samplers -----------------------------------------------------------------------------------


class LengthGroupedBatchSampler(StepPlanBatchSampler):
    """Batches of similar length in random order, sharded across ranks; see `length_grouped_steps`.

    Args:
        lengths: length of each example (e.g. ``get_lengths(ds)``).
        batch_size: examples per batch per rank.
        seed: the order is a function of (seed, epoch) only.
        world_size: the number of ranks that share the steps.
        rank: this process's rank; it takes its slice of each step.
        megabatch_mult: megabatch size in steps (default ``min(50, N // (4 * batch_size * world_size))``).
        drop_last: drop the last, short step.

    Example:
        ```python
        >>> s = LengthGroupedBatchSampler([5, 1, 4, 2, 3, 6], batch_size=2, megabatch_mult=3)
        >>> sorted(sorted(b) for b in s)
        [[0, 5], [1, 3], [2, 4]]
        ```
    """

    _plan_steps = staticmethod(length_grouped_steps)

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        seed: int = 0,
        world_size: int = 1,
        rank: int = 0,
        megabatch_mult: int | None = None,
        drop_last: bool = False,
    ):
        settings = StepPlanSettings(seed=seed, world_size=world_size, rank=rank, drop_last=drop_last)
        super().__init__(lengths, settings, batch_size=batch_size, megabatch_mult=megabatch_mult)


class CurriculumBatchSampler(StepPlanBatchSampler):
    """Short-to-long curriculum: batch t only holds examples with ``length <= length_limit(t)``.

    The limit grows from `min_length` to `max_length` (default: the longest example) along `pacing`
    over the first `curriculum_batches` batches of the run (per rank; with the Trainer
    ``fraction * max_steps * gradient_accumulation_steps``), then admits every length. Position t counts
    batches produced since the start of training (``epoch * len(self) + k``), so all ranks agree on
    the limit at every step and a resumed run reproduces it. See `curriculum_steps`.

    Example:
        ```python
        >>> s = CurriculumBatchSampler([1, 2, 3, 4, 5, 6, 7, 8], batch_size=2, min_length=2,
        ...                            curriculum_batches=4)
        >>> [s.length_limit(t) for t in range(5)]
        [2, 3, 5, 6, 8]
        ```
    """

    _plan_steps = staticmethod(curriculum_steps)

    def __init__(
        self,
        lengths: Sequence[int],
        batch_size: int,
        *,
        min_length: int,
        curriculum_batches: int,
        max_length: int | None = None,
        pacing: Pacing = "linear",
        num_stages: int = 4,
        seed: int = 0,
        world_size: int = 1,
        rank: int = 0,
        drop_last: bool = False,
    ):
        settings = StepPlanSettings(seed=seed, world_size=world_size, rank=rank, drop_last=drop_last)
        super().__init__(lengths, settings, batch_size=batch_size, min_length=min_length,
                         curriculum_batches=curriculum_batches, max_length=max_length, pacing=pacing,
                         num_stages=num_stages)
        if self.max_length is None:
            self.max_length = int(self.lengths.max())

    def _plan(self, epoch: int) -> list[Step]:
        return super()._plan(epoch)[0]  # (steps, limits): `length_limit` gives any position's limit

    def length_limit(self, position: int) -> int:
        """The limit at run position `position` (batches produced since the start of training)."""
        progress = 1.0 if self.curriculum_batches == 0 else position / self.curriculum_batches
        return length_limit_at(progress, self.min_length, self.max_length, self.pacing, self.num_stages)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.steps(0))

    @property
    def run_position(self) -> int:
        """Batches produced since the start of training: ``epoch * steps_per_epoch + position``."""
        return self.epoch * self.steps_per_epoch + self.position

    @property
    def current_length_limit(self) -> int:
        """The limit of the most recently yielded batch (of the next one before any was yielded)."""
        return self.length_limit(max(self.run_position - 1, 0))
