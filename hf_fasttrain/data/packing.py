"""Packing variable-length examples into rows without padding and without attention across them.

Two collators, one sampler:

- ``transformers.DataCollatorWithFlattening`` (reused as is): a batch becomes one row ``[1, total]``
  with ``position_ids`` restarting at 0 for each example and -100 as the first label of each.
- `PackedRowsCollator`: the same, but into a fixed number of rows of a fixed length (fixed shapes
  for torch.compile / CUDA graphs and a bounded attention cost), padding only each row's tail.
- `PackedBatchSampler`: best-fit-decreasing bins of at most `max_tokens` tokens (`pack_bins`),
  `rows_per_batch` bins per batch, sharded across ranks like the other samplers (a pure function of
  seed, epoch, position, world_size, rank).

Why no attention leaks across packed examples: with ``attention_mask=None`` and ``position_ids`` given
(and no cache), `transformers`' mask builder (`masking_utils.find_packed_sequence_indices`) starts a
new sequence wherever position ids do not increase by 1, and builds a block-diagonal causal mask.
So do not pass an ``attention_mask`` with packed batches; `tests/test_packing.py` checks GPT-2's
packed logits against separate runs. Models that ignore ``position_ids`` for masking will leak.

References: Krell et al., "Efficient Sequence Packing without Cross-contamination" (2021,
arXiv:2107.02027) for packing with restarting positions and block-diagonal masks; best-fit
decreasing bin packing (Johnson 1973).
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..validation import ConfigError
from .step_plan import Step, StepPlanSettings, as_lengths, check_int, permutation, shuffle_steps, split_to_multiple
from .step_plan import StepPlanBatchSampler

__all__ = ["pack_bins", "packed_steps", "PackedBatchSampler", "PackedRowsCollator"]


def pack_bins(lengths: Sequence[int], max_tokens: int, order: Sequence[int] | None = None) -> list[list[int]]:
    """Best-fit-decreasing bin packing: lists of indices whose lengths sum to at most `max_tokens`.

    Items are placed in `order` (default: longest first, ties by index) into the open bin with the
    least room that still fits them, else into a new bin. ``O(N log N)`` lookups.

    Example:
        ```python
        >>> pack_bins([5, 3, 4, 2, 6], max_tokens=8)
        [[4, 3], [0, 1], [2]]
        ```
    """
    arr = as_lengths(lengths)
    check_int("max_tokens", max_tokens, 1)
    if int(arr.max()) > max_tokens:
        i = int(arr.argmax())
        raise ConfigError(
            "max_tokens", max_tokens, f"must be >= {int(arr.max())}, or truncate the examples",
            problem=f"got {max_tokens}, below the longest example (index {i}, length {int(arr[i])})",
        )
    if order is None:
        order = np.argsort(-arr, kind="stable")
    bins: list[list[int]] = []
    room: list[tuple[int, int]] = []  # sorted (free tokens, bin id) of open bins
    for i in order:
        size = int(arr[i])
        j = bisect.bisect_left(room, (size, -1))
        if j < len(room):
            free, b = room.pop(j)
        else:
            free, b = max_tokens, len(bins)
            bins.append([])
        bins[b].append(int(i))
        if free - size > 0:
            bisect.insort(room, (free - size, b))
    return bins


def _split_packed(batch: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    """Halve a batch of bins: by bins if it has several, else the single bin's examples."""
    if len(batch) >= 2:
        mid = (len(batch) + 1) // 2
        return batch[:mid], batch[mid:]
    only = batch[0]
    mid = (len(only) + 1) // 2
    return [only[:mid]], [only[mid:]]


def packed_steps(
    lengths: Sequence[int],
    max_tokens: int,
    settings: StepPlanSettings = StepPlanSettings(),
    *,
    epoch: int = 0,
    rows_per_batch: int = 1,
) -> list[Step]:
    """Plan one epoch of packed batches: ``steps[k][rank]`` lists the examples of rank's k-th batch.

    1. Order by length, longest first, ties in a random order (seed, epoch); pack with `pack_bins`
       into bins of at most `max_tokens` tokens (one bin = one row).
    2. Group `rows_per_batch` consecutive bins per batch; the examples of a batch are listed bin by
       bin, so `PackedRowsCollator`'s next-fit rebuilds at most `rows_per_batch` rows.
    3. Split the largest batches until the count is a multiple of ``world_size * grad_accum``.
    4. Deal consecutive batches to ranks, one step at a time, and shuffle the steps (seed, epoch).
    The bin count depends only on the multiset of lengths: the same every epoch.
    """
    arr = as_lengths(lengths)
    check_int("rows_per_batch", rows_per_batch, 1)
    seed, world_size = settings.seed, settings.world_size
    perm = permutation(len(arr), seed, epoch)
    order = perm[np.argsort(-arr[perm], kind="stable")]
    bins = pack_bins(arr, max_tokens, order=order)
    batches = [bins[k : k + rows_per_batch] for k in range(0, len(bins), rows_per_batch)]
    batches = split_to_multiple(
        batches, world_size * settings.grad_accum, weight=lambda b: max(len(b), len(b[0])), split=_split_packed
    )
    flat = [[i for b in batch for i in b] for batch in batches]
    steps = [flat[k : k + world_size] for k in range(0, len(flat), world_size)]
    return shuffle_steps(steps, seed, epoch)


class PackedBatchSampler(StepPlanBatchSampler):
    """Batches of `rows_per_batch` packed rows of at most `max_tokens` tokens each; see `packed_steps`.

    Pair it with ``DataCollatorWithFlattening()`` when ``rows_per_batch=1`` (one padding-free row), or
    with ``PackedRowsCollator(row_len=max_tokens, num_rows=rows_per_batch)`` for fixed shapes.

    Example:
        ```python
        >>> s = PackedBatchSampler([5, 3, 4, 2, 6], max_tokens=8)
        >>> sorted(sorted(b) for b in s)
        [[0, 1], [2], [3, 4]]
        ```
    """

    _plan_steps = staticmethod(packed_steps)

    def __init__(
        self,
        lengths: Sequence[int],
        max_tokens: int,
        *,
        rows_per_batch: int = 1,
        seed: int = 0,
        world_size: int = 1,
        rank: int = 0,
        grad_accum: int = 1,
    ):
        settings = StepPlanSettings(seed=seed, world_size=world_size, rank=rank, grad_accum=grad_accum)
        super().__init__(lengths, settings, max_tokens=max_tokens, rows_per_batch=rows_per_batch)


class PackedRowsCollator:
    """Pack examples into rows with restarting ``position_ids`` and no attention mask.

    Examples are placed in the given order into rows of at most `row_len` tokens (next fit: a new row
    starts when the next example does not fit). Each row is padded at its tail to `row_len`
    (``input_ids`` with `pad_token_id`, ``labels`` with -100, ``position_ids`` restarting at 0, so the
    padding is a separate sequence that nothing attends to). Each example's first label is -100 so no
    token is predicted across a boundary (as `DataCollatorWithFlattening` does). With `num_rows`, the
    batch always has exactly that many rows (empty rows are all padding), for fixed shapes.

    Args:
        row_len: tokens per row (the packing budget); ``None`` packs everything into one row.
        num_rows: fixed number of rows (``None``: as many as needed).
        pad_token_id: id used for padding (never attended to by real tokens).
        return_seq_idx: also return ``seq_idx`` (example number per token, -1 on padding).

    Example:
        ```python
        >>> c = PackedRowsCollator(row_len=4, pad_token_id=0)
        >>> b = c([{"input_ids": [5, 6]}, {"input_ids": [7]}, {"input_ids": [8, 9, 10]}])
        >>> b["input_ids"].tolist(), b["position_ids"].tolist()
        ([[5, 6, 7, 0], [8, 9, 10, 0]], [[0, 1, 0, 0], [0, 1, 2, 0]])
        ```
    """

    def __init__(
        self,
        row_len: int | None = None,
        num_rows: int | None = None,
        pad_token_id: int = 0,
        return_seq_idx: bool = False,
    ):
        if row_len is not None:
            check_int("row_len", row_len, 1)
        if num_rows is not None:
            check_int("num_rows", num_rows, 1)
        self.row_len = row_len
        self.num_rows = num_rows
        self.pad_token_id = pad_token_id
        self.return_seq_idx = return_seq_idx

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        rows: list[list[tuple[int, list[int], list[int]]]] = [[]]
        used = 0
        for k, feature in enumerate(features):
            ids = feature["input_ids"]
            ids = ids.tolist() if hasattr(ids, "tolist") else list(ids)
            if not ids:
                continue
            labels = feature.get("labels", ids)
            labels = labels.tolist() if hasattr(labels, "tolist") else list(labels)
            if self.row_len is not None and len(ids) > self.row_len:
                raise ValueError(f"example {k} has {len(ids)} tokens, more than row_len={self.row_len}.")
            if self.row_len is not None and used + len(ids) > self.row_len:
                rows.append([])
                used = 0
            rows[-1].append((k, ids, [-100] + labels[1:]))
            used += len(ids)
        if self.num_rows is not None:
            if len(rows) > self.num_rows:
                raise ValueError(
                    f"the examples need {len(rows)} rows of row_len={self.row_len}, more than num_rows={self.num_rows}; "
                    "batch them with PackedBatchSampler(max_tokens=row_len, rows_per_batch=num_rows)."
                )
            rows += [[] for _ in range(self.num_rows - len(rows))]
        width = self.row_len if self.row_len is not None else max(sum(len(d[1]) for d in row) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full((len(rows), width), -100, dtype=torch.long)
        position_ids = torch.zeros((len(rows), width), dtype=torch.long)
        seq_idx = torch.full((len(rows), width), -1, dtype=torch.long)
        for r, row in enumerate(rows):
            pos = 0
            for k, ids, labs in row:
                n = len(ids)
                input_ids[r, pos : pos + n] = torch.tensor(ids)
                labels[r, pos : pos + n] = torch.tensor(labs)
                position_ids[r, pos : pos + n] = torch.arange(n)
                seq_idx[r, pos : pos + n] = k
                pos += n
            position_ids[r, pos:] = torch.arange(width - pos)
        out = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
        if self.return_seq_idx:
            out["seq_idx"] = seq_idx
        return out
