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

References:
- Megabatch length grouping: `transformers.trainer_pt_utils.get_length_grouped_indices`.
- Token-budget batching from a length-sorted order with randomly broken ties: fairseq
  `batch_by_size` (Ott et al., "fairseq: A Fast, Extensible Toolkit for Sequence Modeling", 2019).
- Curriculum on example length with sampling from the admitted examples: Platanios et al.,
  "Competence-based Curriculum Learning for Neural Machine Translation", NAACL 2019.
- Batch-size warmup (fewer tokens per step early, when the gradient noise scale is small): GPT-3
  (Brown et al. 2020, appendix B) ramps its batch over the first tokens; McCandlish et al. 2018,
  "An Empirical Model of Large-Batch Training".
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from .seqlen import Pacing, check_pacing, length_limit_at

__all__ = [
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

Step = list[list[int]]  # one batch (list of dataset indices) per rank


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
        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4]]})
        >>> list(add_length_column(ds)["length"])
        [3, 1]
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


def _as_lengths(lengths: Sequence[int]) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence of integers; got shape {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must be integers; got dtype {arr.dtype}.")
    if arr.min() < 0:
        raise ValueError(f"lengths must be >= 0; got {int(arr.min())} at index {int(arr.argmin())}.")
    return arr.astype(np.int64)


def _check_int(field: str, value: Any, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{field}={value!r} must be an integer >= {minimum}.")


def _check_world(world_size: int, rank: int | None = None) -> None:
    _check_int("world_size", world_size, 1)
    if rank is not None and (not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size):
        raise ValueError(f"rank={rank!r} must be an integer in [0, world_size={world_size}).")


# ---- randomness ---------------------------------------------------------------------------------


def _generator(seed: int, epoch: int, stream: int = 0) -> torch.Generator:
    """A generator for (seed, epoch, stream): independent of the global RNG and of the rank."""
    g = torch.Generator()
    g.manual_seed(((int(seed) * 1_000_003 + int(epoch)) * 1_009 + int(stream)) % (2**63 - 1))
    return g


def _permutation(n: int, seed: int, epoch: int, stream: int = 0) -> np.ndarray:
    return torch.randperm(n, generator=_generator(seed, epoch, stream)).numpy()


def _shuffle_steps(steps: list[Step], seed: int, epoch: int) -> list[Step]:
    order = _permutation(len(steps), seed, epoch, stream=1)
    return [steps[i] for i in order]


# ---- helpers shared by the plans ----------------------------------------------------------------


def _deal(group: Sequence[int], world_size: int, fill: Sequence[int]) -> Step:
    """Split `group` into `world_size` contiguous batches as even as possible (sizes differ by <= 1).

    With fewer examples than ranks, examples from `fill` (the epoch's order) are repeated so every
    rank still gets a non-empty batch and steps with the others.
    """
    group = [int(i) for i in group]
    k = 0
    while len(group) < world_size:
        group.append(int(fill[k % len(fill)]))
        k += 1
    base, extra = divmod(len(group), world_size)
    out, start = [], 0
    for r in range(world_size):
        size = base + (1 if r < extra else 0)
        out.append(group[start : start + size])
        start += size
    return out


def _split_to_multiple(
    batches: list[Any], multiple: int, weight: Callable[[Any], int], split: Callable[[Any], tuple[Any, Any]]
) -> list[Any]:
    """Split the heaviest batches in half, in place, until ``len(batches) % multiple == 0``.

    A half of a batch that fits a budget fits it too, so no batch goes over. Ties go to the later
    batch (with a descending length order, the shortest examples). Deterministic.
    """
    batches = list(batches)
    while len(batches) % multiple:
        j = max(range(len(batches)), key=lambda b: (weight(batches[b]), b))
        if weight(batches[j]) < 2:
            raise ValueError(
                f"cannot make {multiple} (world_size * grad_accum) equal shares: only {len(batches)} "
                "batches of single examples; use fewer ranks, less gradient accumulation or more data."
            )
        batches[j : j + 1] = list(split(batches[j]))
    return batches


def _halves(batch: list[int]) -> tuple[list[int], list[int]]:
    mid = (len(batch) + 1) // 2
    return batch[:mid], batch[mid:]


# ---- pure plans ---------------------------------------------------------------------------------


def length_grouped_steps(
    lengths: Sequence[int],
    batch_size: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    megabatch_mult: int | None = None,
    drop_last: bool = False,
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
    arr = _as_lengths(lengths)
    _check_int("batch_size", batch_size, 1)
    _check_world(world_size)
    n, group = len(arr), batch_size * world_size
    if megabatch_mult is None:
        megabatch_mult = max(1, min(50, n // (4 * group)))
    _check_int("megabatch_mult", megabatch_mult, 1)
    perm = _permutation(n, seed, epoch)
    mega = megabatch_mult * group
    steps: list[Step] = []
    for start in range(0, n, mega):
        chunk = perm[start : start + mega]
        chunk = chunk[np.argsort(-arr[chunk], kind="stable")]
        for g in range(0, len(chunk), group):
            members = chunk[g : g + group]
            if len(members) < group and drop_last:
                continue
            steps.append(_deal(members, world_size, perm))
    return _shuffle_steps(steps, seed, epoch)


def token_budget_steps(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    grad_accum: int = 1,
    max_batch_size: int | None = None,
    pad_to_multiple_of: int = 1,
) -> list[Step]:
    """Plan one epoch of token-budget batches: each batch fits ``len(batch) * padded_max_len <= max_tokens``.

    1. Sort all indices by length, longest first; ties in a random order (seed, epoch) (fairseq's
       `batch_by_size`). Neighbours have near-equal lengths, so padding is small.
    2. Cut greedily: a batch starting with length ``m`` takes ``max_tokens // m`` examples (capped by
       `max_batch_size`). Lengths are rounded up to `pad_to_multiple_of` as the collator pads them.
    3. Split the largest batches in half until the count is a multiple of ``world_size * grad_accum``,
       so every rank gets the same number of batches and every optimizer step is full.
    4. Group consecutive batches into steps (one per rank, similar lengths) and shuffle the steps.
    The number of batches depends only on the multiset of lengths, so it is the same every epoch
    (the Trainer sizes epochs from the first). Every example appears exactly once per epoch.
    """
    arr = _as_lengths(lengths)
    _check_int("max_tokens", max_tokens, 1)
    _check_world(world_size)
    _check_int("grad_accum", grad_accum, 1)
    _check_int("pad_to_multiple_of", pad_to_multiple_of, 1)
    if max_batch_size is not None:
        _check_int("max_batch_size", max_batch_size, 1)
    padded = np.maximum(-(-arr // pad_to_multiple_of) * pad_to_multiple_of, 1)
    if int(padded.max()) > max_tokens:
        i = int(padded.argmax())
        raise ValueError(
            f"max_tokens={max_tokens} is below the longest example (index {i}, length {int(arr[i])}"
            f"{f', padded to {int(padded[i])}' if padded[i] != arr[i] else ''}); "
            f"it must be >= {int(padded.max())}, or truncate the examples."
        )
    perm = _permutation(len(arr), seed, epoch)
    order = perm[np.argsort(-padded[perm], kind="stable")]
    batches: list[list[int]] = []
    i = 0
    while i < len(order):
        take = max_tokens // int(padded[order[i]])
        if max_batch_size is not None:
            take = min(take, max_batch_size)
        batches.append(order[i : i + take].tolist())
        i += take
    batches = _split_to_multiple(batches, world_size * grad_accum, len, _halves)
    steps = [batches[k : k + world_size] for k in range(0, len(batches), world_size)]
    return _shuffle_steps(steps, seed, epoch)


def _fit(padded: np.ndarray, batch: list[int], budget: int) -> int:
    """How many examples from the front of `batch` fit `budget` padded tokens (at least one)."""
    longest = np.maximum.accumulate(padded[batch])
    counts = np.arange(1, len(batch) + 1)
    return max(1, int((counts * longest <= budget).sum()))


def batch_warmup_budget(step: int, min_tokens: int, max_tokens: int, warmup_steps: int,
                        pacing: Pacing = "linear", num_stages: int = 4) -> int:
    """Tokens per micro-batch at optimizer step ``step`` of a batch-size warmup:
    ``floor(min_tokens + (max_tokens - min_tokens) * pacing(step / warmup_steps))``, ``max_tokens`` from
    ``warmup_steps`` on (and always, when ``warmup_steps == 0``)."""
    _check_int("warmup_steps", warmup_steps, 0)
    progress = 1.0 if warmup_steps == 0 else step / warmup_steps
    return length_limit_at(progress, min_tokens, max_tokens, pacing, num_stages)


def batch_warmup_steps(
    lengths: Sequence[int],
    max_tokens: int,
    *,
    min_tokens: int,
    warmup_steps: int,
    pacing: Pacing = "linear",
    num_stages: int = 4,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    grad_accum: int = 1,
    max_batch_size: int | None = None,
    pad_to_multiple_of: int = 1,
) -> list[Step]:
    """Plan one epoch of token-budget batches whose budget grows from `min_tokens` to `max_tokens`.

    1. Plan the epoch at the full budget with `token_budget_steps` (same seed, same order).
    2. Epoch 0 only: walk that plan; at micro-batch position t (optimizer step ``t // grad_accum``) the
       budget is ``b = batch_warmup_budget(t // grad_accum, ...)``, and each rank takes from the front of
       its examples, in the plan's order, as many as fit ``b`` (``count * padded_longest <= b``, at least
       one). When a rank could use more than it has, every rank takes the plan's next step. Once the warmup is over,
       what was taken but not used goes out in full-budget batches, and the plan continues unchanged.
    3. Split the largest steps in half until the count is a multiple of `grad_accum`: every optimizer
       step is full.
    Every example still appears exactly once; the order of examples is the full-budget plan's. The
    warmup must end within epoch 0 (later epochs are the plain full-budget plan).

    Example (fixed-length rows of 4 tokens, full batch 4 rows, warmup from 1 row over 3 steps):
        >>> [len(s[0]) for s in batch_warmup_steps([4] * 12, 16, min_tokens=4, warmup_steps=3)]
        [1, 2, 1, 4, 4]
    """
    full = token_budget_steps(lengths, max_tokens, seed=seed, epoch=epoch, world_size=world_size,
                              grad_accum=grad_accum, max_batch_size=max_batch_size,
                              pad_to_multiple_of=pad_to_multiple_of)
    _check_int("min_tokens", min_tokens, 1)
    if min_tokens > max_tokens:
        raise ValueError(f"min_tokens={min_tokens} is above max_tokens={max_tokens}; it must be <= {max_tokens}.")
    check_pacing(pacing, num_stages, field="pacing", stages_field="num_stages")
    _check_int("warmup_steps", warmup_steps, 0)
    if epoch > 0 or warmup_steps == 0:
        return full
    arr = _as_lengths(lengths)
    padded = np.maximum(-(-arr // pad_to_multiple_of) * pad_to_multiple_of, 1)
    out: list[Step] = []
    rest: list[list[int]] = [[] for _ in range(world_size)]  # per rank: examples taken from the plan, not yet used
    k = 0
    while k < len(full) or any(rest):
        warm = len(out) // grad_accum < warmup_steps
        if not warm and not any(rest):  # the warmup is over: the rest of the plan as it is
            out.extend(full[k:])
            break
        budget = max_tokens if not warm else batch_warmup_budget(
            len(out) // grad_accum, min_tokens, max_tokens, warmup_steps, pacing, num_stages)
        if warm and k < len(full) and any(_fit(padded, r + list(b), budget) > len(r) for r, b in zip(rest, full[k])):
            rest = [r + list(b) for r, b in zip(rest, full[k])]  # a rank could use more: take the next step
            k += 1
            continue
        take = [_fit(padded, r, budget) if r else 0 for r in rest]
        piece = [r[:n] for r, n in zip(rest, take)]
        rest = [r[n:] for r, n in zip(rest, take)]
        if k >= len(full) and any(rest) and not all(rest):  # end of the plan: ranks finish together
            piece = [p + r for p, r in zip(piece, rest)]
            rest = [[] for _ in rest]
        out.append(piece)
    return _split_to_multiple(out, grad_accum, lambda s: min(len(b) for b in s),
                              lambda s: tuple(list(h) for h in zip(*(_halves(b) for b in s))))


def curriculum_steps(
    lengths: Sequence[int],
    batch_size: int,
    *,
    min_length: int,
    curriculum_batches: int,
    max_length: int | None = None,
    pacing: Pacing = "linear",
    num_stages: int = 4,
    seed: int = 0,
    epoch: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
) -> tuple[list[Step], list[int]]:
    """Plan one epoch of a short-to-long curriculum; returns ``(steps, limits)``.

    An epoch has ``S = ceil(N / (batch_size * world_size))`` steps (floor with `drop_last`). Step k of
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
    arr = _as_lengths(lengths)
    _check_int("batch_size", batch_size, 1)
    _check_world(world_size)
    _check_int("curriculum_batches", curriculum_batches, 0)
    _check_int("epoch", epoch, 0)
    check_pacing(pacing, num_stages, field="pacing", stages_field="num_stages")
    max_length = int(arr.max()) if max_length is None else max_length
    _check_int("min_length", min_length, 1)
    _check_int("max_length", max_length, 1)
    if min_length > max_length:
        raise ValueError(f"min_length={min_length} is above max_length={max_length}; it must be <= {max_length}.")
    n, group = len(arr), batch_size * world_size
    admitted_at_start = int((arr <= min_length).sum())
    if admitted_at_start < group:
        raise ValueError(
            f"min_length={min_length} admits {admitted_at_start} examples, fewer than one step needs "
            f"(batch_size * world_size = {group}); raise min_length to at least "
            f"{int(np.sort(arr)[min(group, n) - 1])}"
            + ("" if n >= group else f" and use more data ({n} examples)")
            + "."
        )
    steps_per_epoch = n // group if drop_last else -(-n // group)

    def limit(t: int) -> int:
        progress = 1.0 if curriculum_batches == 0 else t / curriculum_batches
        return length_limit_at(progress, min_length, max_length, pacing, num_stages)

    by_length = np.argsort(arr, kind="stable")
    rank_of = np.empty(n, dtype=np.int64)
    cycle = 0
    rank_of[_permutation(n, seed, epoch, stream=2)] = np.arange(n)
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
                rank_of[_permutation(n, seed, epoch, stream=2 + cycle)] = np.arange(n)
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


class _StepPlanBatchSampler(Sampler[list[int]]):
    """Base: yields ``plan(epoch)[k][rank]`` for k = resume position .. end; state is (epoch, position)."""

    def __init__(self, *, seed: int, world_size: int, rank: int):
        _check_int("seed", seed, 0)
        _check_world(world_size, rank)
        self.seed = int(seed)
        self.world_size = int(world_size)
        self.rank = int(rank)
        self.epoch = 0
        self.position = 0  # batches of the current epoch yielded so far (or restored)
        self._resume_at = 0
        self._cached: tuple[int, list[Step]] | None = None

    # subclasses implement the plan
    def _plan(self, epoch: int) -> list[Step]:
        raise NotImplementedError

    def steps(self, epoch: int | None = None) -> list[Step]:
        """The global plan of an epoch (default: the current one): ``steps[k][rank]``."""
        epoch = self.epoch if epoch is None else int(epoch)
        if self._cached is None or self._cached[0] != epoch:
            self._cached = (epoch, self._plan(epoch))
        return self._cached[1]

    def batches(self, epoch: int | None = None) -> list[list[int]]:
        """This rank's batches for an epoch, in order."""
        return [list(step[self.rank]) for step in self.steps(epoch)]

    def __len__(self) -> int:
        return len(self.steps(self.epoch))

    def __iter__(self):
        steps = self.steps(self.epoch)
        start, self._resume_at = self._resume_at, 0
        for k in range(start, len(steps)):
            self.position = k + 1
            yield list(steps[k][self.rank])

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next iteration yields (called by Trainer/accelerate)."""
        _check_int("epoch", epoch, 0)
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.position = 0
            self._resume_at = 0

    def state_dict(self) -> dict[str, int]:
        # NOTE: the plan is a pure function of (settings, seed, epoch), so (epoch, position) is all
        # that a resume needs; seed and world_size are saved to refuse a mismatched resume.
        return {"seed": self.seed, "world_size": self.world_size, "epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume: the next iteration starts at ``state['position']`` of ``state['epoch']``."""
        for key in ("seed", "world_size"):
            if int(state[key]) != getattr(self, key):
                raise ValueError(
                    f"cannot resume: checkpoint has {key}={state[key]}, this sampler has {key}={getattr(self, key)}; "
                    "the order would differ."
                )
        self.epoch = int(state["epoch"])
        self.position = self._resume_at = int(state["position"])


class LengthGroupedBatchSampler(_StepPlanBatchSampler):
    """Batches of similar length in random order, sharded across ranks; see `length_grouped_steps`.

    Args:
        lengths: length of each example (e.g. ``get_lengths(ds)``).
        batch_size: examples per batch per rank.
        seed, world_size, rank: the order is a function of (seed, epoch) only; each rank takes its slice.
        megabatch_mult: megabatch size in steps (default ``min(50, N // (4 * batch_size * world_size))``).
        drop_last: drop the last, short step.

    Example:
        >>> s = LengthGroupedBatchSampler([5, 1, 4, 2, 3, 6], batch_size=2, megabatch_mult=3)
        >>> sorted(sorted(b) for b in s)
        [[0, 5], [1, 3], [2, 4]]
    """

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
        super().__init__(seed=seed, world_size=world_size, rank=rank)
        self.lengths = _as_lengths(lengths)
        self.batch_size = batch_size
        self.megabatch_mult = megabatch_mult
        self.drop_last = drop_last
        self.steps(0)  # validate now, not at the first batch

    def _plan(self, epoch: int) -> list[Step]:
        return length_grouped_steps(
            self.lengths,
            self.batch_size,
            seed=self.seed,
            epoch=epoch,
            world_size=self.world_size,
            megabatch_mult=self.megabatch_mult,
            drop_last=self.drop_last,
        )


class TokenBudgetBatchSampler(_StepPlanBatchSampler):
    """Batches holding up to `max_tokens` padded tokens (short examples ride in large batches).

    See `token_budget_steps`. The batch count per rank is a multiple of `grad_accum` and equal on all
    ranks, so ranks step together and every optimizer step is full; with variable batch sizes the
    Trainer's per-token loss normalisation (``num_items_in_batch``) weights tokens equally.

    Example:
        >>> s = TokenBudgetBatchSampler([8, 2, 3, 4, 7, 1], max_tokens=8)
        >>> sorted(sorted(b) for b in s)
        [[0], [1, 5], [2, 3], [4]]
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        *,
        seed: int = 0,
        world_size: int = 1,
        rank: int = 0,
        grad_accum: int = 1,
        max_batch_size: int | None = None,
        pad_to_multiple_of: int = 1,
    ):
        super().__init__(seed=seed, world_size=world_size, rank=rank)
        self.lengths = _as_lengths(lengths)
        self.max_tokens = max_tokens
        self.grad_accum = grad_accum
        self.max_batch_size = max_batch_size
        self.pad_to_multiple_of = pad_to_multiple_of
        self.steps(0)

    def _plan(self, epoch: int) -> list[Step]:
        return token_budget_steps(
            self.lengths,
            self.max_tokens,
            seed=self.seed,
            epoch=epoch,
            world_size=self.world_size,
            grad_accum=self.grad_accum,
            max_batch_size=self.max_batch_size,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )


class BatchWarmupBatchSampler(TokenBudgetBatchSampler):
    """Token-budget batches that start small: `min_tokens` per micro-batch, growing to `max_tokens` over
    the first `warmup_steps` optimizer steps (see `batch_warmup_steps`; the warmup lies in epoch 0).

    For fixed-length rows give ``max_tokens = rows * row_length`` and ``max_batch_size = rows``. Fewer
    tokens per step means more steps for the same tokens: count the run in tokens (FastTrainer:
    ``schedule_unit='tokens'`` with ``schedule_total_tokens``, which also stops at the budget).

    Example:
        >>> s = BatchWarmupBatchSampler([4] * 12, max_tokens=16, min_tokens=4, warmup_steps=3)
        >>> [len(b) for b in s]
        [1, 2, 1, 4, 4]
        >>> [s.budget_at(t) for t in range(4)]
        [4, 8, 12, 16]
    """

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        *,
        min_tokens: int,
        warmup_steps: int,
        pacing: Pacing = "linear",
        num_stages: int = 4,
        seed: int = 0,
        world_size: int = 1,
        rank: int = 0,
        grad_accum: int = 1,
        max_batch_size: int | None = None,
        pad_to_multiple_of: int = 1,
    ):
        self.min_tokens = min_tokens
        self.warmup_steps = warmup_steps
        self.pacing = pacing
        self.num_stages = num_stages
        super().__init__(lengths, max_tokens, seed=seed, world_size=world_size, rank=rank, grad_accum=grad_accum,
                         max_batch_size=max_batch_size, pad_to_multiple_of=pad_to_multiple_of)

    def _plan(self, epoch: int) -> list[Step]:
        return batch_warmup_steps(
            self.lengths, self.max_tokens, min_tokens=self.min_tokens, warmup_steps=self.warmup_steps,
            pacing=self.pacing, num_stages=self.num_stages, seed=self.seed, epoch=epoch,
            world_size=self.world_size, grad_accum=self.grad_accum, max_batch_size=self.max_batch_size,
            pad_to_multiple_of=self.pad_to_multiple_of,
        )

    def budget_at(self, step: int) -> int:
        """Tokens per micro-batch allowed at optimizer step `step`."""
        return batch_warmup_budget(step, self.min_tokens, self.max_tokens, self.warmup_steps, self.pacing,
                                   self.num_stages)


class CurriculumBatchSampler(_StepPlanBatchSampler):
    """Short-to-long curriculum: batch t only holds examples with ``length <= length_limit(t)``.

    The limit grows from `min_length` to `max_length` (default: the longest example) along `pacing`
    over the first `curriculum_batches` batches of the run (per rank; with the Trainer
    ``fraction * max_steps * gradient_accumulation_steps``), then admits every length. Position t counts
    batches produced since the start of training (``epoch * len(self) + k``), so all ranks agree on
    the limit at every step and a resumed run reproduces it. See `curriculum_steps`.

    Example:
        >>> s = CurriculumBatchSampler([1, 2, 3, 4, 5, 6, 7, 8], batch_size=2, min_length=2,
        ...                            curriculum_batches=4)
        >>> [s.length_limit(t) for t in range(5)]
        [2, 3, 5, 6, 8]
    """

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
        super().__init__(seed=seed, world_size=world_size, rank=rank)
        self.lengths = _as_lengths(lengths)
        self.batch_size = batch_size
        self.min_length = min_length
        self.max_length = int(self.lengths.max()) if max_length is None else max_length
        self.curriculum_batches = curriculum_batches
        self.pacing = pacing
        self.num_stages = num_stages
        self.drop_last = drop_last
        self._limits: tuple[int, list[int]] | None = None
        self.steps(0)

    def _plan(self, epoch: int) -> list[Step]:
        steps, limits = curriculum_steps(
            self.lengths,
            self.batch_size,
            min_length=self.min_length,
            curriculum_batches=self.curriculum_batches,
            max_length=self.max_length,
            pacing=self.pacing,
            num_stages=self.num_stages,
            seed=self.seed,
            epoch=epoch,
            world_size=self.world_size,
            drop_last=self.drop_last,
        )
        self._limits = (epoch, limits)
        return steps

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
