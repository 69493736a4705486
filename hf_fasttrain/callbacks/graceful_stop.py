"""Stop on SIGTERM, Ctrl-C or SIGUSR1 at the end of the optimizer step in flight, with a complete checkpoint.

Preemption on shared clusters (SLURM, Kubernetes, spot instances) arrives as SIGTERM with a grace period;
a person stops a run with Ctrl-C. Either way the run finishes the step it is in, the Trainer's own save
writes ``checkpoint-<step>`` (weights, optimizer, scheduler, RNG, and every callback's ``on_save``: the
weight average, the guard, the run record), one line says where it stopped, and the process exits with
``128 + signal number`` (143 for SIGTERM, 130 for SIGINT, 138 for SIGUSR1). The line names the way on: with
``auto_resume`` (the recipe, ``FastTrainer``) rerunning the same command or script resumes there; a plain
``Trainer`` resumes with ``train(resume_from_checkpoint=...)``. Nothing is lost or repeated. A second Ctrl-C
exits at once, without a traceback or a save.

Built on transformers' ``enable_jit_checkpoint`` (``transformers.trainer_jit_checkpoint``): the manager
and the callback below extend its ``CheckpointManager`` and ``JITCheckpointCallback``. The differences:
three signals instead of SIGTERM alone, no 3-second wait, the save goes through the Trainer's usual path
(``control.should_save``: every callback's ``on_save`` runs), the step in flight always finishes (the
Trainer's callback may save mid-step, from ``on_step_begin`` or ``on_pre_optimizer_step``), every process
of a distributed run stops at the same step (the highest signal number is all-reduced at each step end),
and the caller learns that the run stopped (:class:`TrainingStopped`, a ``SystemExit``).

Example:
    >>> from hf_fasttrain.callbacks import GracefulStopCallback
    >>> stop = GracefulStopCallback()
    >>> # trainer.add_callback(stop); trainer.train()
    >>> # kill -TERM <pid>  ->  "stopped at step 178: saved checkpoint-178; rerun the same command to resume", exit 143
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from typing import Optional, Sequence

from transformers.trainer_jit_checkpoint import CheckpointManager, JITCheckpointCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

__all__ = ["GracefulStopCallback", "SignalStopManager", "TrainingStopped", "STOP_SIGNALS", "stop_exit_code",
           "stop_message", "resume_hint"]

logger = logging.getLogger(__name__)

STOP_SIGNALS: tuple[int, ...] = tuple(
    s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGINT", None), getattr(signal, "SIGUSR1", None))
    if s is not None)


def stop_exit_code(signum: int) -> int:
    """The shell's code for a process ended by ``signum``: 128 + its number (SIGTERM 143, SIGINT 130)."""
    return 128 + int(signum)


RERUN = "rerun the same command to resume"


def resume_hint(checkpoint: Optional[str], auto_resume: bool) -> str:
    """How the run at hand resumes: its command again when it resumes by itself (``auto_resume``: the recipe,
    ``FastTrainer``), else by naming the checkpoint (a plain ``Trainer``, ``auto_resume`` off)."""
    if auto_resume:
        return RERUN
    if not checkpoint:
        return "resume with train(resume_from_checkpoint=<that checkpoint>)"
    return f"resume with train(resume_from_checkpoint={checkpoint!r}) (or --resume_from_checkpoint {checkpoint})"


def stop_message(step: int, hint: str = RERUN) -> str:
    """The one line a stopped run prints."""
    return f"stopped at step {step}: saved {PREFIX_CHECKPOINT_DIR}-{step}; {hint}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class TrainingStopped(SystemExit):
    """Raised out of ``train()`` by a run that stopped on a signal, after its checkpoint was written.

    A ``SystemExit`` whose ``code`` is :func:`stop_exit_code` of the signal: left uncaught, the process
    exits with it and prints no traceback. ``step``, ``signum`` and ``checkpoint`` (the folder written)
    are attributes, for a caller that wants to go on.
    """

    def __init__(self, signum: int, step: int, checkpoint: Optional[str] = None):
        super().__init__(stop_exit_code(signum))
        self.signum = signum
        self.step = step
        self.checkpoint = checkpoint

    def __str__(self) -> str:
        return stop_message(self.step)

    def __reduce__(self):
        # rebuilt from its own fields: a run stopped in a worker process (``concurrent.futures``, Ray) reaches
        # the caller as this exception, not as a TypeError from unpickling SystemExit's single argument
        return (type(self), (self.signum, self.step, self.checkpoint))


class SignalStopManager(CheckpointManager):
    """transformers' JIT ``CheckpointManager`` for several signals, with no wait before the request.

    The first signal sets ``signum`` and ``is_checkpoint_requested``; a second SIGINT (Ctrl-C pressed
    again) ends the process at once with exit code 130, printing one line and no traceback. Handlers are
    installed only from the main thread (Python allows no other) and put back by :meth:`restore`.
    """

    def __init__(self, trainer=None, signals: Sequence[int] = STOP_SIGNALS):
        super().__init__(trainer, kill_wait=0)
        self.signals = tuple(signals)
        self.signum: Optional[int] = None
        self._previous: dict[int, object] = {}

    def setup_signal_handler(self) -> bool:
        """Install the handlers; False (nothing installed) outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            logger.debug("not in the main thread: no signal handlers for a graceful stop")
            return False
        for s in self.signals:
            if s not in self._previous:
                self._previous[s] = signal.signal(s, self._handler)
        self._original_sigterm_handler = self._previous.get(signal.SIGTERM)
        return True

    def restore(self) -> None:
        """Put the handlers found at :meth:`setup_signal_handler` back."""
        for s, previous in self._previous.items():
            signal.signal(s, previous if previous is not None else signal.SIG_DFL)
        self._previous.clear()
        self._original_sigterm_handler = None

    def reset(self) -> None:
        self.signum = None
        self.is_checkpoint_requested = False

    def _handler(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == getattr(signal, "SIGINT", None):  # Ctrl-C again: the user wants out now
                try:
                    sys.stdout.flush()
                    sys.stderr.write("interrupted again: exiting now, without saving\n")
                    sys.stderr.flush()
                finally:
                    os._exit(stop_exit_code(signum))
            return  # a repeated SIGTERM (some launchers send one per process group member): already stopping
        self.signum = signum
        self.is_checkpoint_requested = True
        hint = " (Ctrl-C again exits at once, without saving)" if signum == getattr(signal, "SIGINT", None) else ""
        logger.info("%s: finishing the current optimizer step, then saving a checkpoint%s", _signal_name(signum), hint)

    def request(self, signum: int) -> None:
        """Ask for a stop as a signal would (for code that learns of a preemption another way)."""
        self._handler(signum, None)


class GracefulStopCallback(JITCheckpointCallback):
    """On SIGTERM, SIGINT (the first Ctrl-C) or SIGUSR1: finish the optimizer step, save, stop.

    At the end of the step in flight, ``control.should_save`` makes the Trainer write ``checkpoint-<step>``
    by its usual path (every callback's ``on_save`` runs, so the checkpoint is complete); the run then
    stops. Under DDP the signal may reach any process: the processes all-reduce the signal number at
    every step end (one integer) and all stop at the same step. When training has stopped,
    ``stopped_at`` and ``signum`` say where and why; with ``exit_process`` (the default) the callback
    prints :func:`stop_message` on the main process and raises :class:`TrainingStopped` from
    ``on_train_end``, so the process exits with 143 / 130 / 138 and the script's final save and
    evaluation do not run: a stopped run is not a finished one. Add it last (``add_callback``) so that the
    other callbacks' ``on_train_end`` run first. ``FastTrainer`` (``save_on_signal``, on by default in
    ``FastTrainingArguments``) adds one with ``exit_process=False`` and raises after ``train()`` itself.

    Signal handlers are installed at ``on_train_begin`` and put back at ``on_train_end``; outside the
    main thread (where Python allows none) the callback does nothing. A signal that comes after the last
    step is handled the same way: the last step is saved (when the callback was given the trainer) and
    the run reports that it stopped there.

    Args:
        trainer (`transformers.Trainer`, *optional*):
            Lets the callback save by itself where the Trainer's path would not: with
            ``save_strategy="best"`` (a save happens only on a new best) and after the last step.
        signals (`Sequence[int]`, *optional*, defaults to SIGTERM, SIGINT and SIGUSR1):
            The signals that stop the run.
        exit_process (`bool`, *optional*, defaults to `True`):
            Print the line and raise :class:`TrainingStopped` at ``on_train_end`` of a stopped run.

    Example:
        ```python
        >>> from transformers import Trainer
        >>> from hf_fasttrain.callbacks import GracefulStopCallback
        >>> # trainer = Trainer(model=model, args=args, train_dataset=ds)
        >>> # trainer.add_callback(GracefulStopCallback(trainer))
        >>> # trainer.train()   # kill -TERM <pid>: checkpoint at the step reached, exit 143
        ```
    """

    def __init__(self, trainer=None, signals: Sequence[int] = STOP_SIGNALS, exit_process: bool = True):
        super().__init__()
        self.jit_manager = SignalStopManager(trainer, signals)
        self.exit_process = exit_process
        self.stopped_at: Optional[int] = None
        self.signum: Optional[int] = None
        self._saved_at: Optional[int] = None
        if trainer is not None:
            self.trainer = trainer

    def set_trainer(self, trainer):
        """As ``JITCheckpointCallback.set_trainer``, without installing handlers yet (that is on_train_begin)."""
        self.trainer = trainer
        self.jit_manager.trainer = trainer

    @property
    def stopped(self) -> bool:
        return self.stopped_at is not None

    # -- the decision ------------------------------------------------------------------------------
    def _agreed_signal(self, args) -> int:
        """This process's pending signal (0 if none), raised to the highest over the processes."""
        local = self.jit_manager.signum or 0
        if getattr(args, "world_size", 1) <= 1:
            return local
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return local
        t = torch.tensor([local], dtype=torch.int64, device=args.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return int(t.item())

    def _save_now(self, state, control) -> None:
        """A save outside the Trainer's path (JIT-style): only with a trainer, and once per step."""
        if self.trainer is None or self._saved_at == state.global_step:
            return
        self.jit_manager.execute_jit_checkpoint()
        self.trainer.control = self.trainer.callback_handler.on_save(self.trainer.args, state, control)

    # -- events ------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        self.jit_manager.reset()
        self.stopped_at = self.signum = self._saved_at = None
        self.jit_manager.setup_signal_handler()

    def on_step_begin(self, args, state, control, **kwargs):
        pass  # the step in flight always finishes: the decision is taken at its end

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        pass

    def on_step_end(self, args, state, control, **kwargs):
        signum = self._agreed_signal(args)
        if signum and self.stopped_at is None:
            self.signum, self.stopped_at = signum, state.global_step
            self.jit_manager.is_checkpoint_requested = False
            control.should_save = True  # the Trainer saves right after on_step_end, then on_save stops it
            if getattr(args.save_strategy, "value", args.save_strategy) == "best":
                control.should_training_stop = True  # the Trainer may skip the save: on_epoch_end saves
        return control

    def on_save(self, args, state, control, **kwargs):
        self._saved_at = state.global_step
        if self.stopped_at == state.global_step:
            # set after the save, so that the checkpoint's TrainerControl is a straight run's at this step
            control.should_training_stop = True
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if self.stopped_at is not None and self._saved_at != self.stopped_at:
            control.should_save = False
            self._save_now(state, control)
        return control

    def on_train_end(self, args, state, control, **kwargs):
        pending = self.jit_manager.signum
        if self.stopped_at is None and pending is not None and getattr(args, "world_size", 1) <= 1:
            # the signal came after the last step's end: stop there, once that step is saved (the rerun then
            # finishes from its checkpoint)
            if self._saved_at != state.global_step:
                self._save_now(state, control)
            if self._saved_at == state.global_step:
                self.signum, self.stopped_at = pending, state.global_step
        self.jit_manager.restore()
        if self.stopped_at is None and pending is not None:
            os.kill(os.getpid(), pending)  # nothing saved for it: the signal has its usual effect
        if self.exit_process and self.stopped_at is not None:
            raise self.stop(state.is_world_process_zero)
        return control

    def stop(self, is_main_process: bool = True) -> TrainingStopped:
        """Print the stop line (main process) and return the :class:`TrainingStopped` to raise."""
        checkpoint, auto_resume = None, False
        if self.trainer is not None:
            from ..config.args import fast_option

            checkpoint = os.path.join(self.trainer._get_output_dir(trial=None), f"{PREFIX_CHECKPOINT_DIR}-{self.stopped_at}")
            args = self.trainer.args  # FastTrainer resumes by itself with auto_resume and its run record on
            auto_resume = bool(fast_option(args, "auto_resume") and fast_option(args, "run_record"))
        if is_main_process:
            sys.stdout.flush()
            print(stop_message(self.stopped_at, resume_hint(checkpoint, auto_resume)), file=sys.stderr, flush=True)
        return TrainingStopped(self.signum, self.stopped_at, checkpoint)
