"""Length schedules: pacing functions, the curriculum length limit and sequence-length warmup.

Everything here is a pure function of a position (a count of batches produced) or a plain object
over such functions, so that all ranks agree and a resumed run computes the same values.

- `pacing_value(progress, pacing)`: how far along (0..1) a short-to-long schedule is.
- `length_limit_at(...)`: the curriculum's longest admitted example at a progress.
- `seq_len_at(...)`: the warmup's training length at a progress, in multiples of `multiple`.
- `set_batch_sequence_length(batch, seq_len, mode)`: cut a `[B, L]` batch to length `seq_len`.
- `SeqLenWarmup`: the schedule object (validation, token accounting); `SeqLenWarmupCollator` applies
  it to every batch a collator produces.

References:
- Li, Zhang, He, "The Stability-Efficiency Dilemma: Investigating Sequence Length Warmup for
  Training GPT Models", NeurIPS 2022 (arXiv:2108.06084): the training length grows linearly from
  a short start to the full length, in multiples of 8, over the first part of training.
- MosaicML Composer `SeqLengthWarmup` (composer/algorithms/seq_length_warmup): `duration=0.3` of
  training, `step_size=8`, truncation by default; our default `warmup_fraction` follows it.
- Platanios et al., "Competence-based Curriculum Learning for Neural Machine Translation",
  NAACL 2019 (arXiv:1903.09848): linear and square-root pacing of a short-to-long curriculum.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import numpy as np
import torch

from ..validation import ConfigError

__all__ = [
    "PACINGS",
    "SEQ_LEN_MODES",
    "pacing_value",
    "length_limit_at",
    "seq_len_at",
    "set_batch_sequence_length",
    "batches_consumed",
    "SeqLenWarmup",
    "SeqLenWarmupCollator",
]

PACINGS = ("linear", "sqrt", "steps")
SEQ_LEN_MODES = ("truncate", "rechunk")

Pacing = Literal["linear", "sqrt", "steps"]
Mode = Literal["truncate", "rechunk"]


# ---- validation helpers -------------------------------------------------------------------------


def check_pacing(pacing: str, num_stages: int, field: str = "pacing", stages_field: str = "num_stages") -> None:
    """Raise a ValueError naming `field` if `pacing` is not one of `PACINGS` (or stages < 1)."""
    if pacing not in PACINGS:
        raise ConfigError(field, pacing, "allowed: " + ", ".join(PACINGS))
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ConfigError(stages_field, num_stages, "must be an integer >= 1")


def _check_int(field: str, value: Any, minimum: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ConfigError(field, value, f"must be an integer >= {minimum}")


def _check_range(min_field: str, min_value: int, max_field: str, max_value: int) -> None:
    _check_int(min_field, min_value, 1)
    _check_int(max_field, max_value, 1)
    if min_value > max_value:
        raise ConfigError(min_field, min_value, f"must be <= {max_field} ({max_value})")


# ---- pure schedule functions --------------------------------------------------------------------


def pacing_value(progress: float, pacing: Pacing = "linear", num_stages: int = 4) -> float:
    """Fraction (0..1) of the way from the short start to the full length at `progress` (0..1).

    - ``linear``: ``x`` (Li et al. 2022; Platanios et al. 2019).
    - ``sqrt``: ``sqrt(x)``, fast growth early (Platanios et al. 2019 square-root competence).
    - ``steps``: ``floor(x * num_stages) / num_stages``: `num_stages` plateaus, the first at the start.
    ``x`` is `progress` clipped to [0, 1]; at ``x >= 1`` the value is 1 for every pacing.
    """
    check_pacing(pacing, num_stages)
    x = min(max(float(progress), 0.0), 1.0)
    if x >= 1.0:
        return 1.0
    if pacing == "linear":
        return x
    if pacing == "sqrt":
        return math.sqrt(x)
    return math.floor(x * num_stages) / num_stages


def length_limit_at(
    progress: float, min_length: int, max_length: int, pacing: Pacing = "linear", num_stages: int = 4
) -> int:
    """Curriculum length limit: the longest example admitted at `progress` (fraction of the curriculum).

    ``L = floor(min_length + (max_length - min_length) * pacing_value(progress))``, so ``L(0) = min_length``
    and ``L(p >= 1) = max_length``.
    """
    _check_range("min_length", min_length, "max_length", max_length)
    return int(math.floor(min_length + (max_length - min_length) * pacing_value(progress, pacing, num_stages)))


def seq_len_at(
    progress: float,
    min_seq_len: int,
    max_seq_len: int,
    multiple: int = 8,
    pacing: Pacing = "linear",
    num_stages: int = 4,
) -> int:
    """Sequence-length warmup: the training length at `progress` (fraction of the warmup, 0..1).

    The length follows the pacing from `min_seq_len` to `max_seq_len`, rounded down to a multiple of
    `multiple` (8 in Li et al. 2022 for tensor cores; a larger bucket limits torch.compile recompiles),
    never below `min_seq_len`, and equal to `max_seq_len` once ``progress >= 1``.

    Example: ``seq_len_at(0.5, 64, 1024) == 544``; ``seq_len_at(1.0, 64, 1000) == 1000``.
    """
    _check_range("min_seq_len", min_seq_len, "max_seq_len", max_seq_len)
    _check_int("multiple", multiple, 1)
    if progress >= 1.0:
        return max_seq_len
    raw = min_seq_len + (max_seq_len - min_seq_len) * pacing_value(progress, pacing, num_stages)
    length = (int(math.floor(raw)) // multiple) * multiple
    return int(min(max(length, min_seq_len), max_seq_len))


# ---- batch surgery --------------------------------------------------------------------------------

# Fill values used when `rechunk` has to pad the last piece of a row.
_PAD_VALUES = {"labels": -100, "attention_mask": 0, "token_type_ids": 0}


def set_batch_sequence_length(
    batch: Mapping[str, Any],
    seq_len: int,
    mode: Mode = "truncate",
    pad_token_id: int = 0,
) -> dict[str, Any]:
    """Return `batch` with its sequence tensors (shape ``[B, L, ...]``) cut to length `seq_len`.

    - ``truncate``: keep the first `seq_len` tokens of each row (the tail is dropped), as in
      Composer's `set_batch_sequence_length(..., truncate=True)`.
    - ``rechunk``: cut each row into ``ceil(L / seq_len)`` rows of `seq_len`, so no token is dropped:
      ``[B, L] -> [B * L / seq_len, seq_len]``. When `seq_len` does not divide `L`, the last piece of
      each row is padded (``input_ids`` with `pad_token_id`, ``labels`` with -100, ``attention_mask``
      with 0; an ``attention_mask`` is added if the batch had none). ``position_ids``, if present,
      restart at 0 in every new row.
    Tensors whose first two dims are not ``[B, L]`` (of ``input_ids``) pass through unchanged.
    A `seq_len` at or above `L` returns the batch unchanged (as a new dict).

    Example:
        ```python
        >>> b = {"input_ids": torch.arange(8).view(2, 4)}
        >>> set_batch_sequence_length(b, 2, "rechunk")["input_ids"].tolist()
        [[0, 1], [2, 3], [4, 5], [6, 7]]
        ```
    """
    if mode not in SEQ_LEN_MODES:
        raise ConfigError("mode", mode, "allowed: " + ", ".join(SEQ_LEN_MODES))
    _check_int("seq_len", seq_len, 1)
    if "input_ids" not in batch:
        raise ValueError(f"set_batch_sequence_length needs an 'input_ids' tensor; batch keys are {list(batch)}.")
    out = dict(batch)
    input_ids = batch["input_ids"]
    bsz, length = int(input_ids.shape[0]), int(input_ids.shape[1])
    if seq_len >= length:
        return out
    seq_keys = [
        k for k, v in batch.items() if isinstance(v, torch.Tensor) and v.dim() >= 2 and tuple(v.shape[:2]) == (bsz, length)
    ]
    if mode == "truncate":
        for k in seq_keys:
            # contiguous: a compiled model then sees the same strides at every length (a sliced [B, L] row
            # is strided by L, a full-length batch by its own length), so one dynamic graph serves them all
            out[k] = batch[k][:, :seq_len].contiguous()
        return out

    pieces = -(-length // seq_len)
    pad = pieces * seq_len - length
    if pad and "attention_mask" not in out:
        out["attention_mask"] = torch.ones_like(input_ids)
        seq_keys.append("attention_mask")
    for k in seq_keys:
        v = out[k]
        if k == "position_ids":
            continue
        if pad:
            fill = pad_token_id if k == "input_ids" else _PAD_VALUES.get(k, 0)
            v = torch.cat([v, v.new_full((bsz, pad, *v.shape[2:]), fill)], dim=1)
        out[k] = v.reshape(bsz * pieces, seq_len, *v.shape[2:])
    if "position_ids" in out and "position_ids" in seq_keys:
        pos = out["position_ids"]
        out["position_ids"] = torch.arange(seq_len, dtype=pos.dtype, device=pos.device).repeat(bsz * pieces, 1)
    return out


def batches_consumed(global_step: int, grad_accum: int, batches_per_epoch: int) -> int:
    """Micro-batches the Trainer has trained after `global_step` optimizer steps.

    An epoch of `batches_per_epoch` micro-batches makes ``ceil(batches_per_epoch / grad_accum)``
    optimizer steps (the last one may be short), so ``global_step * grad_accum`` is only right
    within the first epoch or when `grad_accum` divides the epoch.
    """
    _check_int("global_step", global_step, 0)
    _check_int("grad_accum", grad_accum, 1)
    _check_int("batches_per_epoch", batches_per_epoch, 1)
    updates_per_epoch = -(-batches_per_epoch // grad_accum)
    epochs, rest = divmod(global_step, updates_per_epoch)
    return epochs * batches_per_epoch + rest * grad_accum


# ---- schedule object ----------------------------------------------------------------------------


class SeqLenWarmup:
    """Sequence-length warmup for fixed-length pretraining chunks (Li et al. 2022).

    Batch number `position` (0-based count of batches produced, per rank) trains at length
    ``seq_len(position)``, growing from `min_seq_len` to `max_seq_len` over `warmup_batches` batches.
    In ``truncate`` mode a short batch holds fewer tokens, so the LR schedule and the stopping point
    can be counted in tokens: `cumulative_tokens`, `batches_for_tokens`, `token_progress`.

    Args:
        min_seq_len: starting length (Li et al. start at 8 or 64; Composer at 8).
        max_seq_len: the model's full training length (the chunk length).
        warmup_batches: batches over which the length grows (0 = no warmup).
        multiple: lengths are multiples of this (8 for tensor cores; larger to limit recompiles).
        pacing: ``linear`` (default, Li et al.), ``sqrt`` or ``steps``.
        num_stages: plateaus for ``steps`` pacing.
        mode: ``truncate`` (drop each row's tail) or ``rechunk`` (cut rows into more, shorter rows).

    Example:
        ```python
        >>> w = SeqLenWarmup(min_seq_len=8, max_seq_len=32, warmup_batches=4)
        >>> [w.seq_len(p) for p in range(6)]
        [8, 8, 16, 24, 32, 32]
        >>> w.cumulative_tokens(6, rows_per_batch=2)
        240
        ```
    """

    def __init__(
        self,
        min_seq_len: int,
        max_seq_len: int,
        warmup_batches: int,
        multiple: int = 8,
        pacing: Pacing = "linear",
        num_stages: int = 4,
        mode: Mode = "truncate",
    ):
        _check_range("min_seq_len", min_seq_len, "max_seq_len", max_seq_len)
        _check_int("warmup_batches", warmup_batches, 0)
        _check_int("multiple", multiple, 1)
        check_pacing(pacing, num_stages)
        if mode not in SEQ_LEN_MODES:
            raise ConfigError("mode", mode, "allowed: " + ", ".join(SEQ_LEN_MODES))
        self.min_seq_len = min_seq_len
        self.max_seq_len = max_seq_len
        self.warmup_batches = warmup_batches
        self.multiple = multiple
        self.pacing = pacing
        self.num_stages = num_stages
        self.mode = mode
        self._prefix: np.ndarray | None = None  # prefix sums of seq_len over the warmup

    def __repr__(self) -> str:
        return (
            f"SeqLenWarmup(min_seq_len={self.min_seq_len}, max_seq_len={self.max_seq_len}, "
            f"warmup_batches={self.warmup_batches}, multiple={self.multiple}, pacing={self.pacing!r}, "
            f"num_stages={self.num_stages}, mode={self.mode!r})"
        )

    def progress(self, position: int) -> float:
        """Fraction of the warmup done before batch `position` (1.0 once it is over)."""
        return 1.0 if self.warmup_batches == 0 else min(1.0, position / self.warmup_batches)

    def seq_len(self, position: int) -> int:
        """Training length of batch number `position`."""
        return seq_len_at(
            self.progress(position), self.min_seq_len, self.max_seq_len, self.multiple, self.pacing, self.num_stages
        )

    def tokens_in_batch(self, position: int, rows_per_batch: int) -> int:
        """Token slots in batch `position` when the collator yields `rows_per_batch` rows of `max_seq_len`."""
        if self.mode == "rechunk":
            # rechunk keeps every token (plus at most seq_len - 1 pads per row, not counted here)
            return rows_per_batch * self.max_seq_len
        return rows_per_batch * self.seq_len(position)

    def _row_prefix(self) -> np.ndarray:
        """``prefix[n]`` = tokens per row in batches ``0 .. n - 1`` of the warmup (computed once)."""
        if self._prefix is None:
            per_row = [self.tokens_in_batch(p, 1) for p in range(self.warmup_batches)]
            self._prefix = np.concatenate([[0], np.cumsum(per_row, dtype=np.int64)]).astype(np.int64)
        return self._prefix

    def cumulative_tokens(self, num_batches: int, rows_per_batch: int) -> int:
        """Tokens in batches ``0 .. num_batches - 1`` (a pure function: no counting state needed)."""
        _check_int("num_batches", num_batches, 0)
        in_warmup = min(num_batches, self.warmup_batches)
        per_row = int(self._row_prefix()[in_warmup]) + (num_batches - in_warmup) * self.max_seq_len
        return rows_per_batch * per_row

    def batches_for_tokens(self, tokens: int, rows_per_batch: int) -> int:
        """Smallest number of batches whose `cumulative_tokens` reaches `tokens` (a token-counted stop)."""
        _check_int("tokens", tokens, 0)
        _check_int("rows_per_batch", rows_per_batch, 1)
        prefix = self._row_prefix() * rows_per_batch
        if tokens <= prefix[-1]:
            return int(np.searchsorted(prefix, tokens, side="left"))
        per_batch = rows_per_batch * self.max_seq_len
        return self.warmup_batches + -(-(tokens - int(prefix[-1])) // per_batch)

    def full_length_batches(self, num_batches: int) -> float:
        """How many full-length batches hold as many tokens as the first `num_batches` of this warmup.

        The LR schedule evaluated at this count (instead of at `num_batches`) advances with tokens
        seen, so a short-sequence phase is not charged full steps.
        """
        return self.cumulative_tokens(num_batches, 1) / self.max_seq_len

    def token_progress(self, position: int, total_batches: int, rows_per_batch: int) -> float:
        """Training progress counted in tokens: ``cumulative_tokens(position) / cumulative_tokens(total)``."""
        total = self.cumulative_tokens(total_batches, rows_per_batch)
        return 0.0 if total == 0 else min(1.0, self.cumulative_tokens(position, rows_per_batch) / total)

    def apply(self, batch: Mapping[str, Any], position: int, pad_token_id: int = 0) -> dict[str, Any]:
        """Cut `batch` (batch number `position`) to its scheduled length."""
        return set_batch_sequence_length(batch, self.seq_len(position), self.mode, pad_token_id)


class SeqLenWarmupCollator:
    """Wraps a collator so each batch it produces is cut to the warmup's length for that batch.

    The batch number is a count of batches this collator has produced (not ``global_step``, which lags
    behind the prefetching dataloader), so batch ``t`` always gets ``warmup.seq_len(t)``. Use it for the
    training dataloader only, with ``dataloader_num_workers=0`` (a worker process would count its own
    share of batches; this raises instead). On resume set `position` to the number of batches
    already trained (`batches_consumed`; `SeqLenWarmupCallback` does it) or restore `state_dict`.
    `cut(batch)` applies the schedule to a batch collated elsewhere (FastTrainer cuts batches in the
    main process as the training loop takes them, so dataloader workers are fine there).

    Example:
        ```python
        >>> from transformers import default_data_collator
        >>> w = SeqLenWarmup(min_seq_len=2, max_seq_len=4, warmup_batches=2, multiple=2)
        >>> c = SeqLenWarmupCollator(default_data_collator, w)
        >>> feats = [{"input_ids": [1, 2, 3, 4]}]
        >>> [c(feats)["input_ids"].shape[1] for _ in range(3)]
        [2, 2, 4]
        ```
    """

    def __init__(self, collator: Callable, warmup: SeqLenWarmup, pad_token_id: int = 0, position: int = 0):
        if not isinstance(warmup, SeqLenWarmup):
            raise ValueError(f"warmup={warmup!r} must be a SeqLenWarmup.")
        _check_int("position", position, 0)
        self.collator = collator
        self.warmup = warmup
        self.pad_token_id = pad_token_id
        self.position = position
        self.last_seq_len: int | None = None

    def __call__(self, features):
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(
                "SeqLenWarmupCollator counts batches in the main process; set dataloader_num_workers=0 "
                "(a worker would only count its own share of batches)."
            )
        return self.cut(self.collator(features))

    def cut(self, batch: Mapping[str, Any]) -> dict[str, Any]:
        """Cut an already collated batch as the next batch of the schedule (and count it)."""
        self.last_seq_len = self.warmup.seq_len(self.position)
        out = self.warmup.apply(batch, self.position, self.pad_token_id)
        self.position += 1
        return out

    def state_dict(self) -> dict[str, int]:
        # NOTE: the schedule is a pure function of the position, so the position is all the state.
        return {"position": self.position}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        _check_int("position", state["position"], 0)
        self.position = int(state["position"])
