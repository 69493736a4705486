"""Stop a run at a given optimizer step and save a checkpoint there, keeping the full run's schedule.

Random restart's trials (see :mod:`hf_fasttrain.restarts`) are configured with the full run's ``max_steps``,
so the LR schedule is the full run's, and stopped early with this callback: the exploration is an exact
prefix of the full run, and ``checkpoint-<step>`` lets the winner continue from there.

Example:
    >>> from hf_fasttrain.callbacks.stop_at_step import StopAtStepCallback
    >>> cb = StopAtStepCallback(50)
    >>> # trainer.add_callback(cb); trainer.train()  # -> stops after step 50 with output_dir/checkpoint-50
"""

from __future__ import annotations

from transformers import TrainerCallback

__all__ = ["StopAtStepCallback"]


class StopAtStepCallback(TrainerCallback):
    """At the end of optimizer step ``stop_at_step``: save a checkpoint and stop training.

    The flags are set in ``on_step_end``, after the Trainer's ``DefaultFlowCallback`` set its own for the
    step, so a regular evaluation or save at that step still happens (in the Trainer's usual order:
    evaluate, then save).
    """

    def __init__(self, stop_at_step: int):
        if isinstance(stop_at_step, bool) or not isinstance(stop_at_step, int) or stop_at_step < 1:
            raise ValueError(f"stop_at_step={stop_at_step!r} is invalid: it must be an integer >= 1.")
        self.stop_at_step = stop_at_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.stop_at_step:
            control.should_save = True
            control.should_training_stop = True
        return control
