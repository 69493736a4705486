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

import os

from transformers import TrainerCallback

from ..validation import ConfigError
from ..restarts.state import check_generation

__all__ = ["StopAtStepCallback", "TokenBudgetStopCallback", "StageFenceCallback"]


class StopAtStepCallback(TrainerCallback):
    """At the end of optimizer step ``stop_at_step``: save a checkpoint and stop training.

    The flags are set in ``on_step_end``, after the Trainer's ``DefaultFlowCallback`` set its own for the
    step, so a regular evaluation or save at that step still happens (in the Trainer's usual order:
    evaluate, then save).
    """

    def __init__(self, stop_at_step: int):
        if isinstance(stop_at_step, bool) or not isinstance(stop_at_step, int) or stop_at_step < 1:
            raise ConfigError("stop_at_step", stop_at_step, "must be an integer >= 1")
        self.stop_at_step = stop_at_step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.stop_at_step:
            control.should_save = True
            control.should_training_stop = True
        return control


class TokenBudgetStopCallback(TrainerCallback):
    """Stop at the end of the first optimizer step by which ``total_tokens`` have been trained on.

    For schedules counted in tokens (``schedule_unit='tokens'``): the lr reaches its floor at the token
    budget, so training on to ``max_steps`` would only add steps at the floor. At the stopping step the
    Trainer also evaluates and saves (when its strategies are not "no"), so the run ends as a run that
    reached ``max_steps`` does.

    Args:
        total_tokens (`int`):
            The budget, in tokens summed over all processes.
        tokens_seen (`Callable[[], int]`, *optional*, defaults to `None`):
            A function returning the tokens trained on so far (FastTrainer passes its ``TokenProgress``);
            `None` reads ``TrainerState.num_input_tokens_seen``, which a plain Trainer counts with
            ``include_num_input_tokens_seen="all"`` or ``"non_padding"``.

    Example:
        ```python
        >>> from hf_fasttrain.callbacks import TokenBudgetStopCallback
        >>> cb = TokenBudgetStopCallback(total_tokens=2_000_000)
        >>> # Trainer(..., args=TrainingArguments(..., include_num_input_tokens_seen="non_padding"), callbacks=[cb])
        ```
    """

    def __init__(self, total_tokens: int, tokens_seen=None):
        if isinstance(total_tokens, bool) or not isinstance(total_tokens, int) or total_tokens < 1:
            raise ConfigError("total_tokens", total_tokens, "must be an integer >= 1")
        self.total_tokens = total_tokens
        self.tokens_seen = tokens_seen
        self.stopped_at_step = None

    def on_step_end(self, args, state, control, **kwargs):
        seen = self.tokens_seen() if self.tokens_seen is not None else state.num_input_tokens_seen
        if seen is not None and seen >= self.total_tokens and self.stopped_at_step is None:
            self.stopped_at_step = state.global_step
            control.should_training_stop = True
            if getattr(args.save_strategy, "value", args.save_strategy) != "no":
                control.should_save = True
            if getattr(args.eval_strategy, "value", args.eval_strategy) != "no":
                control.should_evaluate = True
            control.should_log = True
        return control


class StageFenceCallback(TrainerCallback):
    """Stops a random-restart stage launched by a driver that is no longer the search's.

    A stage running away from its driver (a Ray task) carries the generation of the driver that launched it.
    When that driver is killed and started again, the new one raises the generation in the state file and runs
    the stage itself; the old task, still training, must not write a checkpoint into the trial. This callback
    reads the state file's generation (only when the file changed) at the start and at the end of every
    optimizer step, before the Trainer saves, and raises
    :class:`~hf_fasttrain.restarts.state.StaleStageError` once it is newer.

    Args:
        state_path (`str`): the search's ``restarts_state.json``.
        generation (`int`): the generation that launched this stage.
    """

    def __init__(self, state_path: str, generation: int):
        self.state_path = state_path
        self.generation = generation
        self._seen = None  # (mtime_ns, size) of the state file when last read

    def check(self) -> None:
        st = os.stat(self.state_path)
        key = (st.st_mtime_ns, st.st_size)
        if key != self._seen:
            check_generation(self.state_path, self.generation)
            self._seen = key

    def on_train_begin(self, args, state, control, **kwargs):
        self.check()

    def on_step_end(self, args, state, control, **kwargs):
        self.check()  # the Trainer saves right after this event
