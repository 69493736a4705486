"""Token-budget batching: batches of up to ``max_tokens`` padded tokens, and the batch-size warmup that
grows that budget from ``min_tokens`` over the first optimizer steps.

Short examples ride in large batches and long ones in small batches, so the tokens per batch stay near
the budget (fairseq's `batch_by_size`: Ott et al., "fairseq: A Fast, Extensible Toolkit for Sequence
Modeling", 2019). The batch-size warmup takes fewer tokens per step early, when the gradient noise
scale is small: GPT-3 (Brown et al. 2020, appendix B) ramps its batch over the first tokens; McCandlish
et al. 2018, "An Empirical Model of Large-Batch Training". Like every sampler of :mod:`hf_fasttrain.data`
these are pure plans of (seed, epoch, position, world_size, rank) (see `samplers` for the contract).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..validation import ConfigError
from .step_plan import Step, StepPlanSettings, as_lengths, check_int, halves, permutation, shuffle_steps
from .step_plan import split_to_multiple, StepPlanBatchSampler
from .seqlen import Pacing, check_pacing, length_limit_at

__all__ = [
    "token_budget_steps",
    "batch_warmup_budget",
    "batch_warmup_steps",
    "TokenBudgetBatchSampler",
    "BatchWarmupBatchSampler",
]


# ---- pure plans ---------------------------------------------------------------------------------


def token_budget_steps(
    lengths: Sequence[int],
    max_tokens: int,
    settings: StepPlanSettings = StepPlanSettings(),
    *,
    epoch: int = 0,
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
    arr = as_lengths(lengths)
    check_int("max_tokens", max_tokens, 1)
    check_int("pad_to_multiple_of", pad_to_multiple_of, 1)
    if max_batch_size is not None:
        check_int("max_batch_size", max_batch_size, 1)
    padded = np.maximum(-(-arr // pad_to_multiple_of) * pad_to_multiple_of, 1)
    if int(padded.max()) > max_tokens:
        i = int(padded.argmax())
        raise ConfigError(
            "max_tokens", max_tokens, f"must be >= {int(padded.max())}, or truncate the examples",
            problem=f"got {max_tokens}, below the longest example (index {i}, length {int(arr[i])}"
            f"{f', padded to {int(padded[i])}' if padded[i] != arr[i] else ''})",
        )
    seed, world_size = settings.seed, settings.world_size
    perm = permutation(len(arr), seed, epoch)
    order = perm[np.argsort(-padded[perm], kind="stable")]
    batches: list[list[int]] = []
    i = 0
    while i < len(order):
        take = max_tokens // int(padded[order[i]])
        if max_batch_size is not None:
            take = min(take, max_batch_size)
        batches.append(order[i : i + take].tolist())
        i += take
    batches = split_to_multiple(batches, world_size * settings.grad_accum, len, halves)
    steps = [batches[k : k + world_size] for k in range(0, len(batches), world_size)]
    return shuffle_steps(steps, seed, epoch)


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
    check_int("warmup_steps", warmup_steps, 0)
    progress = 1.0 if warmup_steps == 0 else step / warmup_steps
    return length_limit_at(progress, min_tokens, max_tokens, pacing, num_stages)


def batch_warmup_steps(
    lengths: Sequence[int],
    max_tokens: int,
    settings: StepPlanSettings = StepPlanSettings(),
    *,
    epoch: int = 0,
    min_tokens: int,
    warmup_steps: int,
    pacing: Pacing = "linear",
    num_stages: int = 4,
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
        [1, 2, 3, 2, 4]
    """
    full = token_budget_steps(lengths, max_tokens, settings, epoch=epoch, max_batch_size=max_batch_size,
                              pad_to_multiple_of=pad_to_multiple_of)
    check_int("min_tokens", min_tokens, 1)
    if min_tokens > max_tokens:
        raise ConfigError("min_tokens", min_tokens, f"must be <= max_tokens ({max_tokens})")
    check_pacing(pacing, num_stages, field="pacing", stages_field="num_stages")
    check_int("warmup_steps", warmup_steps, 0)
    if epoch > 0 or warmup_steps == 0:
        return full
    world_size, grad_accum = settings.world_size, settings.grad_accum
    arr = as_lengths(lengths)
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
    return split_to_multiple(out, grad_accum, lambda s: min(len(b) for b in s),
                              lambda s: tuple(list(h) for h in zip(*(halves(b) for b in s))))


# ---- samplers -----------------------------------------------------------------------------------


class TokenBudgetBatchSampler(StepPlanBatchSampler):
    """Batches holding up to `max_tokens` padded tokens (short examples ride in large batches).

    See `token_budget_steps`. The batch count per rank is a multiple of `grad_accum` and equal on all
    ranks, so ranks step together and every optimizer step is full; with variable batch sizes the
    Trainer's per-token loss normalisation (``num_items_in_batch``) weights tokens equally.

    Example:
        ```python
        >>> s = TokenBudgetBatchSampler([8, 2, 3, 4, 7, 1], max_tokens=8)
        >>> sorted(sorted(b) for b in s)
        [[0], [1, 5], [2, 3], [4]]
        ```
    """

    _plan_steps = staticmethod(token_budget_steps)

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
        settings = StepPlanSettings(seed=seed, world_size=world_size, rank=rank, grad_accum=grad_accum)
        super().__init__(lengths, settings, max_tokens=max_tokens, max_batch_size=max_batch_size,
                         pad_to_multiple_of=pad_to_multiple_of)


class BatchWarmupBatchSampler(TokenBudgetBatchSampler):
    """Token-budget batches that start small: `min_tokens` per micro-batch, growing to `max_tokens` over
    the first `warmup_steps` optimizer steps (see `batch_warmup_steps`; the warmup lies in epoch 0).

    For fixed-length rows give ``max_tokens = rows * row_length`` and ``max_batch_size = rows``. Fewer
    tokens per step means more steps for the same tokens: count the run in tokens (FastTrainer:
    ``schedule_unit='tokens'`` with ``schedule_total_tokens``, which also stops at the budget).

    Example:
        ```python
        >>> s = BatchWarmupBatchSampler([4] * 12, max_tokens=16, min_tokens=4, warmup_steps=3)
        >>> [len(b) for b in s]
        [1, 2, 3, 2, 4]
        >>> [s.budget_at(t) for t in range(4)]
        [4, 8, 12, 16]
        ```
    """

    _plan_steps = staticmethod(batch_warmup_steps)

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
        settings = StepPlanSettings(seed=seed, world_size=world_size, rank=rank, grad_accum=grad_accum)
        StepPlanBatchSampler.__init__(
            self, lengths, settings, max_tokens=max_tokens, min_tokens=min_tokens, warmup_steps=warmup_steps,
            pacing=pacing, num_stages=num_stages, max_batch_size=max_batch_size, pad_to_multiple_of=pad_to_multiple_of)

    def budget_at(self, step: int) -> int:
        """Tokens per micro-batch allowed at optimizer step `step`."""
        return batch_warmup_budget(step, self.min_tokens, self.max_tokens, self.warmup_steps, self.pacing,
                                   self.num_stages)
