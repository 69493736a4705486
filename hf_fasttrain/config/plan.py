"""The run's plan: every technique's spec and the run's length, worked out once from the arguments.

A :class:`RunPlan` is built once per run (``FastTrainer`` builds it from its arguments, the recipe hands it its data
plan); each spec in it is the one the arguments' own checks built (:func:`~hf_fasttrain.config.args.built_spec`).
``budget_aware`` is a step from plan to plan (:meth:`RunPlan.with_budget`): the optimizer and schedule specs of
the measured settings replace the given ones, and the arguments stay as given. Every part then takes its spec from
the plan: the optimizer (``plan.optimizer.build``), the lr schedule (``plan.schedule.build(...,
plan.length.schedule_steps)``), the weight average, the divergence guard. Everything that spans the run reads
:attr:`RunPlan.length`. A checkpoint stores :meth:`RunPlan.as_dict` beside the run's options (:data:`PLAN_FILE`).

Example:
    >>> from hf_fasttrain import FastTrainingArguments
    >>> args = FastTrainingArguments(output_dir="runs/x", max_steps=200, optimizer="adamw", lr_decay="cosine",
    ...                              weight_averaging="ema", report_to="none", use_cpu=True)
    >>> plan = RunPlan.from_args(args, row_length=128)
    >>> plan.optimizer.name, plan.schedule.decay, plan.averaging.mode, plan.guard
    ('adamw', 'cosine', 'ema', None)
    >>> plan.length.optimizer_steps, plan.length.schedule_steps, plan.length.global_batch, plan.length.tokens
    (200, 200, 8, 204800)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, Callable, Optional, Union

from ..resume_identity import PLAN_FILE  # {"plan": RunPlan.as_dict()} in every checkpoint (with the run record on)
from ..data.from_args import DataPlan
from ..data.seqlen import SeqLenWarmup
from ..optim.spec import OptimizerSpec
from ..schedules import ScheduleSpec
from ..stability.averaging import AveragingSpec
from ..stability.guard import GuardConfig
from .args import FastOptions, built_spec, fast_option

__all__ = ["PLAN_FILE", "RunLength", "RunPlan"]



@dataclass(frozen=True)
class RunLength:
    """How long the run is and how its work is cut: the one place that says it.

    The counts come from :class:`~hf_fasttrain.data.from_args.DataPlan` (rows, optimizer steps, schedule steps,
    tokens, the sequence-length warmup), the rest from the arguments as the Trainer reads them."""

    row_length: Optional[int]
    """Tokens per training row (None: rows without a fixed length, or no token rows)."""
    global_batch: int
    """Rows per optimizer step over all processes: per-device batch x gradient accumulation x processes."""
    optimizer_steps: Optional[int]
    """The optimizer steps the run takes (``max_steps``; a token budget's steps); None for an epoch-based run."""
    schedule_steps: Optional[int]
    """The steps the lr schedule and the warmups span (the full-length steps of the run's tokens under a
    sequence-length warmup counted in tokens); None for an epoch-based run."""
    tokens: Optional[int]
    """The tokens (all processes) the run's optimizer steps hold; None when unknown before training."""
    max_tokens: Optional[int] = None
    """The run's token budget, when its length was given in tokens."""
    logging_steps: float = 500
    eval_steps: Optional[float] = None
    save_steps: float = 500
    """The cadences, as the Trainer reads them (a number < 1 is a fraction of the run)."""
    seq_len_warmup: Optional[SeqLenWarmup] = field(default=None, compare=False)
    """The sequence-length warmup over these rows (None: off)."""

    def as_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "seq_len_warmup"}
        out["seq_len_warmup"] = None if self.seq_len_warmup is None else {
            "min_seq_len": self.seq_len_warmup.min_seq_len, "max_seq_len": self.seq_len_warmup.max_seq_len}
        return out


@dataclass(frozen=True)
class RunPlan:
    """Every technique's spec and the run's length, read once from the arguments (see the module).

    Each field is None when its technique is off (``optimizer``: the Trainer's ``optim``; ``schedule``: the
    Trainer's ``lr_scheduler_type``)."""

    length: RunLength
    optimizer: Optional[OptimizerSpec] = None
    schedule: Optional[ScheduleSpec] = None
    averaging: Optional[AveragingSpec] = None
    guard: Optional[GuardConfig] = None
    budget: Optional[dict] = field(default=None, compare=False)
    """What ``budget_aware`` chose (:func:`hf_fasttrain.config.budget.choose_budget_settings`), when it is on
    (:meth:`with_budget`)."""

    @classmethod
    def from_args(cls, args: Any, data: Optional[DataPlan] = None, row_length: Optional[int] = None,
                  streaming: bool = False, budget: Optional[dict] = None) -> "RunPlan":
        """The plan of a run with these arguments (a ``FastTrainingArguments``, or any Trainer arguments, whose
        package options read as their defaults). ``data``: the run's data plan (the recipe's); without it one is
        made for rows of ``row_length`` tokens (with a token budget it sets ``args.max_steps`` to its steps, as
        :meth:`~hf_fasttrain.data.from_args.DataPlan.from_args` does). Each spec is the one the arguments' checks
        built (:func:`~hf_fasttrain.config.args.built_spec`), else built here, once."""
        options = FastOptions(args)
        if data is None:
            data = DataPlan.from_args(SimpleNamespace(block_size=row_length, streaming=streaming),
                                      args if fast_option(args, "max_tokens") is not None else options)
        steps = args.max_steps if args.max_steps is not None and args.max_steps > 0 else None
        warmup = data.seq_len_warmup
        # counting tokens, the schedule spans the full-length steps of the run's tokens; else its optimizer steps
        in_tokens = warmup is not None and fast_option(args, "seq_len_warmup_count_tokens") and warmup.mode == "truncate"
        length = RunLength(
            row_length=data.row_length,
            global_batch=args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1),
            optimizer_steps=steps,
            schedule_steps=data.schedule_steps if in_tokens and steps is not None else steps,
            tokens=data.tokens,
            max_tokens=data.max_tokens,
            logging_steps=args.logging_steps, eval_steps=args.eval_steps, save_steps=args.save_steps,
            seq_len_warmup=warmup,
        )
        name = fast_option(args, "optimizer")
        averaging: AveragingSpec = built_spec(options, "averaging")
        schedule: Optional[ScheduleSpec] = built_spec(options, "schedule")
        optimizer: Optional[OptimizerSpec] = built_spec(args, "optimizer", steps) if name is not None else None
        guard: Optional[GuardConfig] = built_spec(options, "guard") if fast_option(args, "divergence_guard") else None
        return cls(length=length, optimizer=optimizer, schedule=schedule,
                   averaging=None if averaging.mode == "none" else averaging, guard=guard, budget=budget)

    def with_budget(self, args: Any, non_embedding_params: Union[int, Callable[[], int]]) -> "RunPlan":
        """``budget_aware``: this plan with the settings measured best for its length (``plan.length``: the
        schedule's token total, the token budget, else its optimizer steps x global batch x row length) over
        ``non_embedding_params`` (a count, or a function counting them: called once the length is known to be
        enough). The optimizer and schedule specs are those of the measured settings; ``budget`` says what was
        chosen (:func:`~hf_fasttrain.config.budget.choose_budget_settings`). ``args`` stay as given; a bad fit
        (a warmup longer than the chosen schedule allows) is refused in one line."""
        from .budget import budget_arguments, choose_budget_settings, length_tokens

        n = self.length
        tokens = length_tokens(fast_option(args, "schedule_total_tokens"), n.max_tokens, n.optimizer_steps,
                               n.global_batch, n.row_length)
        count = non_embedding_params() if callable(non_embedding_params) else non_embedding_params
        chosen = choose_budget_settings(args, tokens, count)
        view = budget_arguments(args, chosen["values"])
        view._check_lr_schedule()  # the chosen schedule must fit this run (warmup, cooldown); builds its spec
        optimizer = (built_spec(view, "optimizer", n.optimizer_steps) if self.optimizer is not None else None)
        return dataclasses.replace(self, optimizer=optimizer, schedule=built_spec(view, "schedule"), budget=chosen)

    def arguments(self, args: Any) -> Any:
        """``args`` as this plan trains with them: a copy holding ``budget_aware``'s values when it chose any
        (what ``config.yaml`` records, what the Trainer's own optimizer reads), else ``args`` themselves."""
        if not self.budget:
            return args
        from .budget import budget_arguments

        return budget_arguments(args, self.budget["values"])

    def with_optimizer_steps(self, args: Any, steps: int) -> "RunPlan":
        """This plan for an epoch-based run once the Trainer knows its optimizer steps (AdEMAMix's warmup spans
        them); the plan itself when it knew them already."""
        if self.length.optimizer_steps is not None or self.optimizer is None or not steps or steps <= 0:
            return self
        return dataclasses.replace(self, optimizer=built_spec(self.arguments(args), "optimizer", steps))

    def as_dict(self) -> dict[str, Any]:
        """The plan as JSON-ready values: what a checkpoint stores (:data:`PLAN_FILE`)."""
        def spec(value):
            return None if value is None else dataclasses.asdict(value)

        return {"length": self.length.as_dict(), "optimizer": spec(self.optimizer), "schedule": spec(self.schedule),
                "averaging": spec(self.averaging), "guard": spec(self.guard),
                "budget": None if self.budget is None else self.budget.get("settings")}
