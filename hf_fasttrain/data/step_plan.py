"""Step plans: the machinery every batch sampler of :mod:`hf_fasttrain.data` shares.

A *plan* is one epoch as a list of steps, a step one batch per rank (``plan[step][rank]``). This module
holds the checks, the seeded randomness (its own `torch.Generator` per (seed, epoch, stream), never the
global RNG), the helpers that deal and split batches, `StepPlanSettings` (what every plan shares: seed, ranks,
gradient accumulation, drop_last), and `StepPlanBatchSampler`, the base class that yields a rank's batches
of a plan and saves (epoch, position) for a resume. The plans themselves live in
`samplers` (length grouping, curriculum), `token_budget` (token budgets, batch-size warmup) and `packing`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

from ..validation import ConfigError

__all__ = [
    "Step",
    "StepPlanSettings",
    "StepPlanBatchSampler",
    "as_lengths",
    "check_int",
    "check_world",
    "permutation",
    "shuffle_steps",
    "deal",
    "split_to_multiple",
    "halves",
]

Step = list[list[int]]  # one batch (list of dataset indices) per rank


# ---- checks -------------------------------------------------------------------------------------


def as_lengths(lengths: Sequence[int]) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"lengths must be a non-empty 1-D sequence of integers; got shape {arr.shape}.")
    if not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"lengths must be integers; got dtype {arr.dtype}.")
    if arr.min() < 0:
        raise ValueError(f"lengths must be >= 0; got {int(arr.min())} at index {int(arr.argmin())}.")
    return arr.astype(np.int64)


def check_int(field: str, value: Any, minimum: int) -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise ConfigError(field, value, f"must be an integer >= {minimum}")


def check_world(world_size: int, rank: int | None = None) -> None:
    check_int("world_size", world_size, 1)
    if rank is not None and (not isinstance(rank, (int, np.integer)) or not 0 <= rank < world_size):
        raise ConfigError("rank", rank, f"must be an integer in [0, world_size={world_size})")


@dataclass(frozen=True)
class StepPlanSettings:
    """What every step plan shares: the order's seed, the ranks that share each step, and how batches make up
    an optimizer step. Checks itself on creation; passed whole to the plan functions and the samplers, whose
    own arguments (batch size, token budget, curriculum, ...) come beside it.

    Args:
        seed: the order is a function of (seed, epoch) only.
        world_size: the number of ranks that share each step.
        rank: this process's rank; a sampler yields its slice of each step (a plan holds every rank's).
        grad_accum: micro-batches per optimizer step; the plans whose batch count varies (token budgets,
            packing) make it a multiple of ``world_size * grad_accum``, so every optimizer step is full.
        drop_last: the plans of fixed-size batches (length grouping, curriculum) drop the last, short step.

    Example:
        ```python
        >>> from hf_fasttrain.data.samplers import StepPlanSettings, length_grouped_steps
        >>> settings = StepPlanSettings(world_size=2, drop_last=True)
        >>> length_grouped_steps([5, 1, 4, 2, 3, 6, 7], 1, settings)  # 3 steps of one example per rank; 1 left out
        [[[5], [3]], [[6], [2]], [[0], [4]]]
        ```
    """

    seed: int = 0
    world_size: int = 1
    rank: int = 0
    grad_accum: int = 1
    drop_last: bool = False

    def __post_init__(self) -> None:
        check_int("seed", self.seed, 0)
        check_world(self.world_size, self.rank)
        check_int("grad_accum", self.grad_accum, 1)
        if not isinstance(self.drop_last, (bool, np.bool_)):
            raise ConfigError("drop_last", self.drop_last, "must be true or false")
        for name in ("seed", "world_size", "rank", "grad_accum"):  # numpy integers in, plain ints kept
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "drop_last", bool(self.drop_last))


# ---- randomness ---------------------------------------------------------------------------------


def _generator(seed: int, epoch: int, stream: int = 0) -> torch.Generator:
    """A generator for (seed, epoch, stream): independent of the global RNG and of the rank."""
    g = torch.Generator()
    g.manual_seed(((int(seed) * 1_000_003 + int(epoch)) * 1_009 + int(stream)) % (2**63 - 1))
    return g


def permutation(n: int, seed: int, epoch: int, stream: int = 0) -> np.ndarray:
    return torch.randperm(n, generator=_generator(seed, epoch, stream)).numpy()


def shuffle_steps(steps: list[Step], seed: int, epoch: int) -> list[Step]:
    order = permutation(len(steps), seed, epoch, stream=1)
    return [steps[i] for i in order]


# ---- helpers shared by the plans ----------------------------------------------------------------


def deal(group: Sequence[int], world_size: int, fill: Sequence[int]) -> Step:
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


def split_to_multiple(
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


def halves(batch: list[int]) -> tuple[list[int], list[int]]:
    mid = (len(batch) + 1) // 2
    return batch[:mid], batch[mid:]


class StepPlanBatchSampler(Sampler[list[int]]):
    """Base: yields ``plan(epoch)[k][rank]`` for k = resume position .. end; state is (epoch, position).

    A subclass names its pure plan function in `_plan_steps` and passes the shared `StepPlanSettings` whole and
    that function's own settings by keyword; each own setting becomes an attribute, and every plan is
    ``_plan_steps(lengths, settings=settings, epoch=..., **own)``.
    """

    _plan_steps: Callable[..., Any]

    def __init__(self, lengths: Sequence[int], settings: StepPlanSettings, **own: Any):
        self.settings = settings
        self.lengths = as_lengths(lengths)
        self._own = tuple(own)
        for name, value in own.items():
            setattr(self, name, value)
        self.epoch = 0
        self.position = 0  # batches of the current epoch yielded so far (or restored)
        self._resume_at = 0
        self._cached: tuple[int, list[Step]] | None = None
        self.steps(0)  # validate now, not at the first batch

    # Passthroughs: the shared settings read as the sampler's own attributes
    seed = property(lambda self: self.settings.seed, doc="The seed of the order.")
    world_size = property(lambda self: self.settings.world_size, doc="The ranks that share each step.")
    rank = property(lambda self: self.settings.rank, doc="This process's rank.")

    def _plan(self, epoch: int) -> Any:
        own = {name: getattr(self, name) for name in self._own}
        return self._plan_steps(self.lengths, settings=self.settings, epoch=epoch, **own)

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
        check_int("epoch", epoch, 0)
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
