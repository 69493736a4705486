"""The sequence-length options of FastTrainingArguments: which are on, their validation, and what they and the
data arguments say of a run's length (:class:`DataPlan`, worked out once).

Pure: no Trainer here. `hf_fasttrain.wiring.SeqLenWiring` builds the parts from these options for
FastTrainer (see hf_fasttrain.callbacks.seqlen for the plain-Trainer one-liners). The functions take
any object with the option fields; FastTrainer hands them a view that reads absent options as their
defaults (`hf_fasttrain.config.args.fast_option`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple, Optional

from ..validation import ConfigError
from .seqlen import PACINGS, SEQ_LEN_MODES, SeqLenWarmup

__all__ = ["PACKING_MODES", "check_seqlen_args", "seqlen_enabled", "batching_options", "seq_len_warmup_from_args",
           "planned_optimizer_steps", "planned_tokens", "schedule_length", "budget_row_tokens", "resolve_max_steps",
           "DataPlan"]

PACKING_MODES = ("none", "flatten", "rows")


def _fail(name: str, value: Any, allowed: str) -> None:
    from ..validation import ConfigError

    raise ConfigError(name, value, allowed)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def batching_options(args) -> list[tuple[str, Any]]:
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
    return bool(batching_options(args)) or args.seq_len_warmup_min is not None


def _world(args) -> int:
    return max(int(getattr(args, "world_size", 1) or 1), 1)


def budget_row_tokens(args) -> Optional[int]:
    """``max_tokens`` as the tokens each row slot of a micro-batch trains on over the run (the budget over
    ``per_device_train_batch_size x world size`` rows); None without a token budget."""
    budget = getattr(args, "max_tokens", None)
    if budget is None:
        return None
    return -(-budget // (args.per_device_train_batch_size * _world(args)))


def schedule_length(args, row_length: Optional[int]) -> Optional[int]:
    """The run's length in full-length optimizer steps: what the schedules laid out over the run (the lr schedule,
    the sequence-length warmup's fraction) span. ``max_steps``; with a token budget (``max_tokens``), the
    full-length steps that hold it (rows of ``row_length`` tokens).

    >>> from types import SimpleNamespace
    >>> a = SimpleNamespace(max_steps=-1, max_tokens=614_400, per_device_train_batch_size=16, gradient_accumulation_steps=1)
    >>> schedule_length(a, 128)   # 614,400 tokens = 300 steps of 16 rows x 128 tokens
    300
    """
    row_tokens = budget_row_tokens(args)
    if row_tokens is None:
        return _fixed_steps(args)
    if row_length is None:
        return None
    return max(1, round(row_tokens / (args.gradient_accumulation_steps * row_length)))


def seq_len_warmup_from_args(args, row_length: int, length: Optional[int] = None) -> SeqLenWarmup:
    """The `SeqLenWarmup` that ``seq_len_warmup_*`` describe for rows of ``row_length`` tokens (per rank): the
    length grows over ``seq_len_warmup_fraction`` of the run's :func:`schedule_length` (``length``, when the caller
    has it already). A shortest length above the rows' is refused, naming ``seq_len_warmup_min``."""
    if args.seq_len_warmup_min > row_length:
        _fail("seq_len_warmup_min", args.seq_len_warmup_min,
              f"is above the training length {row_length} (the length of the training rows)")
    length = schedule_length(args, row_length) if length is None else length
    return SeqLenWarmup(
        min_seq_len=args.seq_len_warmup_min, max_seq_len=row_length,
        warmup_batches=round(args.seq_len_warmup_fraction * length * args.gradient_accumulation_steps),
        multiple=args.seq_len_warmup_multiple, pacing=args.seq_len_warmup_pacing,
        num_stages=args.seq_len_warmup_stages, mode=args.seq_len_warmup_mode,
    )


def _warmup(args, row_length: Optional[int], length: Optional[int]) -> Optional[SeqLenWarmup]:
    """The run's sequence-length warmup over a schedule of ``length`` full-length steps; None when it is off or
    the run's length is not known before it starts."""
    if args.seq_len_warmup_min is None or row_length is None or length is None:
        return None
    return seq_len_warmup_from_args(args, row_length, length)


def counts_warmup_tokens(args) -> bool:
    """True when the lr schedule of a sequence-length warmup advances with tokens (``truncate`` mode with token
    counting): its short early steps are not charged as full ones."""
    return (args.seq_len_warmup_min is not None and bool(args.seq_len_warmup_count_tokens)
            and args.seq_len_warmup_mode == "truncate")


def planned_optimizer_steps(args, row_length: Optional[int]) -> Optional[int]:
    """The optimizer steps a run with these options takes, known before it starts; None when it is not.

    ``max_steps``: the Trainer's meaning, whatever else is on. With a token budget (``max_tokens``) instead, the
    steps that hold it, rows of ``row_length`` tokens (a sequence-length warmup's short early steps hold fewer
    tokens, so it takes more steps than full-length ones would). An epoch-based run (``max_steps <= 0``, no
    ``max_tokens``): None (the Trainer counts it).

    Example:
        >>> from types import SimpleNamespace
        >>> a = SimpleNamespace(max_steps=6, max_tokens=None, gradient_accumulation_steps=1, seq_len_warmup_min=16,
        ...     seq_len_warmup_fraction=0.3, seq_len_warmup_multiple=8, seq_len_warmup_pacing="linear",
        ...     seq_len_warmup_stages=4, seq_len_warmup_mode="truncate", seq_len_warmup_count_tokens=True,
        ...     per_device_train_batch_size=1)
        >>> planned_optimizer_steps(a, 32)   # max_steps is the number of steps
        6
        >>> a.max_steps, a.max_tokens = -1, 6 * 32   # the tokens of 6 full-length rows
        >>> planned_optimizer_steps(a, 32)   # 2 short steps (16 and 24 tokens a row) make up one more
        7
    """
    if budget_row_tokens(args) is None:  # max_steps is the number: no warmup to build
        return _fixed_steps(args)
    return _run_length(args, row_length).optimizer_steps


def _fixed_steps(args) -> Optional[int]:
    """``max_steps`` when it is set (> 0); None for an epoch-based run."""
    return args.max_steps if args.max_steps is not None and args.max_steps > 0 else None


def planned_tokens(args, row_length: Optional[int]) -> Optional[int]:
    """Tokens (all processes) the run's :func:`planned_optimizer_steps` hold with rows of ``row_length`` tokens
    (a sequence-length warmup's short rows counted as cut); None when either is unknown."""
    return _run_length(args, row_length).tokens


class _RunLength(NamedTuple):  # the fields of DataPlan that the run's length decides
    schedule_steps: Optional[int]
    seq_len_warmup: Optional[SeqLenWarmup]
    optimizer_steps: Optional[int]
    tokens: Optional[int]


def _run_length(args, row_length: Optional[int]) -> _RunLength:
    """:func:`schedule_length`, the sequence-length warmup (None when it is off), :func:`planned_optimizer_steps`
    and :func:`planned_tokens`: the one computation behind them and :class:`DataPlan`, the warmup built once."""
    length = schedule_length(args, row_length)
    warmup = _warmup(args, row_length, length)
    row_tokens = budget_row_tokens(args)
    ga = args.gradient_accumulation_steps
    if row_tokens is None:
        steps = _fixed_steps(args)
    elif row_length is None:
        steps = None
    elif warmup is None:
        steps = -(-row_tokens // (ga * row_length))
    else:  # short early rows hold fewer tokens: more steps than full-length ones would take
        steps = -(-warmup.batches_for_tokens(row_tokens, 1) // ga)
    if steps is None or row_length is None:
        return _RunLength(length, warmup, steps, None)
    rows, batches = args.per_device_train_batch_size * _world(args), steps * ga
    tokens = rows * batches * row_length if warmup is None else warmup.cumulative_tokens(batches, rows)
    return _RunLength(length, warmup, steps, tokens)


def resolve_max_steps(args, row_length: Optional[int]) -> None:
    """With a token budget (``max_tokens``): set ``args.max_steps`` to the optimizer steps it takes. A
    ``max_steps`` given beside it must be that number (a saved ``config.yaml`` holds both); any other is refused
    in one line. Nothing to do without ``max_tokens``."""
    if getattr(args, "max_tokens", None) is None or row_length is None:
        return
    _settle_max_steps(args, planned_optimizer_steps(args, row_length), schedule_length(args, row_length))


def _settle_max_steps(args, steps: int, length: int) -> None:
    """:func:`resolve_max_steps` with the budget's optimizer ``steps`` and full-length steps (``length``) worked
    out."""
    if args.max_steps is not None and args.max_steps > 0 and args.max_steps != steps:
        raise ConfigError("max_steps", args.max_steps, problem=(
            f"{args.max_steps} disagrees with max_tokens {args.max_tokens:,}, which takes {steps:,} optimizer steps "
            f"here ({length:,} full-length steps' tokens"
            + (", shorter rows first)" if args.seq_len_warmup_min is not None else ")")),
            allowed="give one of them: max_steps counts optimizer steps, max_tokens tokens (max_tokens null to train "
                    "max_steps steps)")
    args.max_steps = steps


@dataclass(frozen=True)
class DataPlan:
    """A run's rows and length, read once from its data and training arguments before any data is read, and
    handed down whole (resume checks, run facts, start line) instead of being worked out again from the arguments.

    Made by :meth:`from_args`. Each field is what the pure function of this module named beside it gives for the
    arguments: the values agree with them by construction, and the sequence-length warmup is built once.

    Example:
        >>> from types import SimpleNamespace
        >>> data = SimpleNamespace(block_size=32, streaming=False)
        >>> training = SimpleNamespace(max_steps=-1, max_tokens=6 * 32, gradient_accumulation_steps=1,
        ...     per_device_train_batch_size=1, seq_len_warmup_min=16, seq_len_warmup_fraction=0.3,
        ...     seq_len_warmup_multiple=8, seq_len_warmup_pacing="linear", seq_len_warmup_stages=4,
        ...     seq_len_warmup_mode="truncate")
        >>> plan = DataPlan.from_args(data, training)
        >>> plan.optimizer_steps, plan.schedule_steps, plan.tokens, training.max_steps
        (7, 6, 200, 7)
    """

    row_length: Optional[int]
    """Tokens per training row (``block_size``)."""
    streaming: bool = False
    """Rows come from a stream (its position is part of every checkpoint)."""
    max_tokens: Optional[int] = None
    """The run's token budget, all processes (``max_tokens``); None when it is counted in steps."""
    optimizer_steps: Optional[int] = None
    """:func:`planned_optimizer_steps`: the optimizer steps the run takes; None for an epoch-based run."""
    schedule_steps: Optional[int] = None
    """:func:`schedule_length`: the full-length steps the run's schedules span."""
    tokens: Optional[int] = None
    """:func:`planned_tokens`: the tokens (all processes) its optimizer steps hold."""
    seq_len_warmup: Optional[SeqLenWarmup] = field(default=None, compare=False)
    """:func:`seq_len_warmup_from_args` for these rows; None when the warmup is off (two plans compare by their
    numbers: a warmup object compares by identity)."""

    @classmethod
    def from_args(cls, data_args, training_args) -> "DataPlan":
        """The plan of a run with these arguments (any objects with the fields of ``DataArguments`` and
        ``FastTrainingArguments``). With a token budget it also sets ``training_args.max_steps`` to the optimizer
        steps that hold it, refusing another given beside it (:func:`resolve_max_steps`)."""
        row = data_args.block_size
        counts = _run_length(training_args, row)
        budget = getattr(training_args, "max_tokens", None)
        if budget is not None and row is not None:
            _settle_max_steps(training_args, counts.optimizer_steps, counts.schedule_steps)
        return cls(row_length=row, streaming=bool(getattr(data_args, "streaming", False)), max_tokens=budget,
                   **counts._asdict())


def check_seqlen_args(args) -> None:
    """Validate the sequence-length fields of FastTrainingArguments (called from ``__post_init__``)."""
    # names and shares are checked whether or not their technique is on: a typo is refused now, not on the day
    # the technique is switched on
    for prefix in ("curriculum", "seq_len_warmup"):
        if getattr(args, f"{prefix}_pacing") not in PACINGS:
            _fail(f"{prefix}_pacing", getattr(args, f"{prefix}_pacing"), f"allowed: {', '.join(PACINGS)}")
        fraction = getattr(args, f"{prefix}_fraction")
        if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 <= fraction <= 1.0):
            _fail(f"{prefix}_fraction", fraction, "must be in [0, 1] (the share of max_steps over which lengths grow)")
    if args.seq_len_warmup_mode not in SEQ_LEN_MODES:
        _fail("seq_len_warmup_mode", args.seq_len_warmup_mode, f"allowed: {', '.join(SEQ_LEN_MODES)}")
    fraction = getattr(args, "batch_warmup_fraction", 0.2)
    if not (isinstance(fraction, (int, float)) and not isinstance(fraction, bool) and 0.0 <= fraction <= 1.0):
        _fail("batch_warmup_fraction", fraction, "must be in [0, 1] (the share of max_steps over which the batch grows)")
    if not isinstance(args.length_grouping, bool):
        _fail("length_grouping", args.length_grouping, "must be true or false")
    if args.max_tokens_per_batch is not None and not (_is_int(args.max_tokens_per_batch) and args.max_tokens_per_batch >= 1):
        _fail("max_tokens_per_batch", args.max_tokens_per_batch, "must be a positive integer or null")
    if args.packing not in PACKING_MODES:
        _fail("packing", args.packing, f"allowed: {', '.join(PACKING_MODES)}")
    if args.packing == "flatten" and args.max_tokens_per_batch is None:
        _fail("max_tokens_per_batch", None, "packing='flatten' needs it: the tokens of each packed row")
    if args.packing == "rows":
        if not (_is_int(args.packing_row_length) and args.packing_row_length >= 1):
            _fail("packing_row_length", args.packing_row_length, "packing='rows' needs a positive integer (tokens per row)")
    elif args.packing_row_length is not None:
        _fail("packing_row_length", args.packing_row_length, f"only used with packing='rows' (packing={args.packing!r})")
    on = batching_options(args)
    if len(on) > 1:
        _fail(on[1][0], on[1][1], f"choose one batching option; {on[0][0]}={on[0][1]!r} is also set")
    if on and args.train_sampling_strategy != "random":
        _fail("train_sampling_strategy", args.train_sampling_strategy,
              f"must stay 'random' with {on[0][0]}={on[0][1]!r}: hf_fasttrain's sampler replaces the Trainer's")

    _check_max_tokens(args, on)
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
            _fail("seq_len_warmup_mode", args.seq_len_warmup_mode, f"allowed: {', '.join(SEQ_LEN_MODES)}")
        if args.packing != "none":
            _fail("packing", args.packing, "sequence-length warmup is for fixed-length rows; use packing='none'")
        _check_schedule(args, "seq_len_warmup")


def _check_max_tokens(args, on: list) -> None:
    budget = getattr(args, "max_tokens", None)
    if budget is None:
        return
    if not (_is_int(budget) and budget >= 1):
        _fail("max_tokens", budget, "must be a positive integer (the run's tokens, all processes) or null")
    if on:
        _fail("max_tokens", budget, f"counts fixed-length rows; with {on[0][0]}={on[0][1]!r} use lr_decay with "
              "schedule_unit='tokens' and schedule_total_tokens")


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
        _fail(f"{prefix}_pacing", pacing, f"allowed: {', '.join(PACINGS)}")
    if not (_is_int(stages) and stages >= 1):
        _fail(f"{prefix}_stages", stages, "must be a positive integer")
    if args.max_steps <= 0 and getattr(args, "max_tokens", None) is None:
        _fail("max_steps", args.max_steps, f"{prefix} is scheduled over the run's length; set max_steps > 0 (or "
              "max_tokens)")
