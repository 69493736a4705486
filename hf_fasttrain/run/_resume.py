"""The resume decisions of a recipe run, taken before any data is read: the checkpoint it resumes from, whether it
has already finished, and the files that make a checkpoint of it complete.

The comparisons themselves (a checkpoint's recorded options against the run's) are
:mod:`hf_fasttrain.resume_identity`'s; here they meet the run's arguments and its
:class:`~hf_fasttrain.data.from_args.DataPlan`.
"""

from __future__ import annotations

import logging
import os
from functools import partial
from typing import Any, Callable, Optional

from .._files import last_complete_checkpoint, read_json_dict as _read_json
from ..resume_identity import ResumePlan, discard_previous_run, finished_step, plan_resume, read_recorded_options
from ..callbacks.averaging import AVERAGE_FILE
from ..callbacks.data_position import STREAM_POSITION_FILE
from ..config.args import DataArguments, FastTrainingArguments, fast_option
from ..data.from_args import DataPlan, planned_optimizer_steps

__all__ = ["find_resume_checkpoint", "checkpoint_extras", "finished_checkpoint", "resume_plan",
           "final_outputs_present"]

logger = logging.getLogger(__name__)


def find_resume_checkpoint(training_args: FastTrainingArguments, data_args: Optional[DataArguments] = None) -> Optional[str]:
    """The checkpoint to resume from: the one asked for, else (auto_resume) the last complete one."""
    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    if training_args.auto_resume:
        return last_complete_checkpoint(training_args.output_dir, required=checkpoint_extras(training_args, data_args))
    return None


def checkpoint_extras(training_args, data: Optional[Any] = None) -> tuple[str, ...]:
    """Files this run's callbacks add to every checkpoint after the Trainer's (a checkpoint lacks them when
    a kill came in between): the weight average, a stream's position (``data``: the run's ``DataArguments``
    or its :class:`~hf_fasttrain.data.from_args.DataPlan`)."""
    extras = (AVERAGE_FILE,) if fast_option(training_args, "weight_averaging") != "none" else ()
    if data is not None and data.streaming:
        extras += (STREAM_POSITION_FILE.format(rank=training_args.process_index),)
    return extras


def finished_checkpoint(training_args: FastTrainingArguments, checkpoint: Optional[str],
                        row_length: Optional[int] = None) -> Optional[int]:
    """The step at which this run already ended, or None when there is training left to do.

    The run is over when ``checkpoint`` (the one it would resume from) is at the run's optimizer steps
    (:func:`~hf_fasttrain.data.from_args.planned_optimizer_steps` over rows of ``row_length`` tokens; the Trainer's
    own total for an epoch-based run), or when the run ended earlier by its own rule (a token budget) and wrote its
    final ``metrics.json`` after that checkpoint, with the same ``max_steps``. Resuming such a checkpoint would make
    the Trainer take one more step.
    """
    return _finished_step(training_args, checkpoint, partial(planned_optimizer_steps, training_args, row_length))


def _finished_step(training_args: FastTrainingArguments, checkpoint: Optional[str],
                   planned_steps: Callable[[], Optional[int]]) -> Optional[int]:
    if getattr(training_args, "restart_stop_at_step", None):  # a random-restart trial: the search decides
        return None
    recorded = read_recorded_options(None, training_args.output_dir) or {}
    return finished_step(checkpoint, training_args.output_dir, training_args.max_steps, planned_steps,
                         recorded.get("max_steps"))


def resume_plan(training_args: FastTrainingArguments, options: dict, plan: DataPlan) -> ResumePlan:
    """The run's resume plan, decided before any data work: the checkpoint asked for (``resume_from_checkpoint``),
    else the one ``auto_resume`` finds, its options compared with this run's (the same decision
    ``FastTrainer.train()`` takes on its own: :func:`hf_fasttrain.resume_identity.plan_resume`); the run's
    optimizer steps and a stream's position file come from its data ``plan``."""
    out = training_args.output_dir
    required = checkpoint_extras(training_args, plan)  # what makes a checkpoint of this run complete

    def planned_steps() -> Optional[int]:
        return plan.optimizer_steps

    if training_args.resume_from_checkpoint:
        checkpoint = training_args.resume_from_checkpoint
        return ResumePlan(checkpoint=checkpoint, finished_at=_finished_step(training_args, checkpoint, planned_steps))
    if training_args.overwrite_output_dir:
        if training_args.process_index == 0:
            gone = discard_previous_run(out)
            if gone:
                logger.info("overwrite_output_dir: deleted %s from %s", ", ".join(gone), out)
        return ResumePlan()
    if not training_args.auto_resume:
        return ResumePlan()
    return plan_resume(out, options, max_steps=training_args.max_steps, planned_steps=planned_steps,
                       required=required, stop_at_step=training_args.restart_stop_at_step)


def final_outputs_present(output_dir: str) -> Optional[dict]:
    """metrics.json's final metrics when the run's final model and metrics are both in ``output_dir``."""
    metrics = _read_json(os.path.join(output_dir, "metrics.json"))
    from ..stability.trainables import ADAPTER_WEIGHT_FILES

    has_model = any(os.path.exists(os.path.join(output_dir, f))
                    for f in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                              *ADAPTER_WEIGHT_FILES))
    if metrics and metrics.get("final_metrics") and has_model:
        return dict(metrics["final_metrics"])
    return None
