"""WeightAveragingCallback: an EMA or LAWA average of the weights (hf_fasttrain.stability.averaging) in any Trainer.

- after each optimizer step the average is updated (``on_step_end``);
- every evaluation during training runs on the average (swapped in when the Trainer is about to evaluate,
  swapped out after it, bit for bit);
- each checkpoint holds the iterate as the model (so a resume continues the same run) and the average in
  ``weight_average.pt``; a resume loads it, so a resumed run's average equals an uninterrupted one's;
- at the end of training the average is written into the model: ``trainer.save_model()``, a final
  ``trainer.evaluate()`` and a push use it;
- only the trainable parameters are averaged (a LoRA model's average holds its adapters, not the frozen
  base), and with a :class:`~hf_fasttrain.callbacks.guard.DivergenceGuardCallback` in the same Trainer the
  average rolls back with the weights: after a rollback it holds no update the guard undid.

Example:
    ```python
    >>> from hf_fasttrain.callbacks import WeightAveragingCallback
    >>> cb = WeightAveragingCallback(mode="ema", decay=0.99)
    >>> # Trainer(model=model, args=args, ..., callbacks=[cb]).train()
    ```
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Optional

import torch
from transformers import TrainerCallback

from ..validation import ConfigError

from ..stability.averaging import AveragingSpec, WeightAverage, load_average_file, save_average_file
from ..stability.trainables import trainable_parameters
from ._rollback import register_participant

__all__ = ["WeightAveragingCallback", "AVERAGE_FILE"]

logger = logging.getLogger(__name__)

AVERAGE_FILE = "weight_average.pt"


class WeightAveragingCallback(TrainerCallback):
    """Evaluate, checkpoint and finally save an average of the weights instead of the last iterate.

    Args:
        mode: ``"ema"`` or ``"lawa"``.
        decay: the EMA's decay (see :class:`~hf_fasttrain.stability.averaging.WeightAverage`).
        warmup: when on, the decay at step t is ``min(decay, (1 + t) / (10 + t))``, so the start is forgotten early.
        update_every: update the EMA every this many optimizer steps.
        lawa_k: LAWA: the number of copies kept.
        lawa_interval: LAWA: optimizer steps between copies.
        swap_for_eval: swap the average in for the Trainer's evaluations during training.
        spec: the settings as one :class:`~hf_fasttrain.stability.averaging.AveragingSpec` (a run plan's), in place
            of the five above.

    Attributes:
        resume_dir: the checkpoint a resume starts from, when it is not ``output_dir/checkpoint-<step>``
            (FastTrainer sets it from ``train(resume_from_checkpoint=...)``; set it by hand otherwise).
        average: the :class:`~hf_fasttrain.stability.averaging.WeightAverage` (built at ``on_train_begin``).

    The callback must come after the Trainer's ``DefaultFlowCallback`` (any ``callbacks=[...]`` or
    ``add_callback`` does), since it reads the flags that one sets to know an evaluation is coming.
    """

    def __init__(self, mode: str = "ema", decay: float = 0.99, warmup: bool = True, update_every: int = 1,
                 lawa_k: int = 5, lawa_interval: int = 10, swap_for_eval: bool = True,
                 spec: Optional[AveragingSpec] = None):
        if spec is None:  # else the run plan's, checked when it was made
            spec = AveragingSpec(mode, decay, warmup, update_every, lawa_k, lawa_interval)
            spec.validate()
        mode = spec.mode
        if mode == "none":
            raise ConfigError("mode", "none", "allowed: ema, lawa", problem="got 'none', which has no average to keep")
        self.settings = dataclasses.asdict(spec)
        self.swap_for_eval = swap_for_eval
        self.resume_dir: Optional[str] = None
        self.average: Optional[WeightAverage] = None
        self._backup: Optional[dict[str, torch.Tensor]] = None
        self._updated_step: Optional[int] = None  # the optimizer step last folded in
        self.finalized = False

    @classmethod
    def from_args(cls, args, **kwargs) -> Optional["WeightAveragingCallback"]:
        """The callback FastTrainingArguments ask for (None when ``weight_averaging='none'``)."""
        spec = AveragingSpec.from_args(args)
        return None if spec.mode == "none" else cls(**dataclasses.asdict(spec), **kwargs)

    # -- events --------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.finalized = False
        self._updated_step = state.global_step  # the average at the start already holds this step
        self.average = self._new_average(model)
        register_participant(state, self)
        if state.global_step > 0:  # a resume: the average comes from the checkpoint
            ckpt = self.resume_dir or os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            path = os.path.join(ckpt, AVERAGE_FILE)
            if os.path.isfile(path):
                self.average.load_state_dict(load_average_file(path))
            else:
                logger.warning("resumed at step %d without %s in %s: the weight average restarts from the "
                               "current weights", state.global_step, AVERAGE_FILE, ckpt)
        return control

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self._fold_in(model, state.global_step)
        if self.swap_for_eval and control.should_evaluate:  # the Trainer evaluates right after this event
            self.swap_in(model)
        return control

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        self.swap_out(model)
        return control

    def on_save(self, args, state, control, **kwargs):
        if state.is_world_process_zero and self.average is not None:
            ckpt = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            if os.path.isdir(ckpt):
                save_average_file(self.average.state_dict(), os.path.join(ckpt, AVERAGE_FILE))
        return control

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.swap_out(model)
        if self.average is not None and not self.finalized:
            if self.average.finite():
                self.average.copy_to(model)  # the average is the model from here on
            else:  # never ship NaN: keep the iterate (a guard in the same Trainer rolls the average back first)
                logger.error("the weight average holds non-finite values at the end of training: the model keeps its "
                             "last weights instead of the average (add divergence_guard to roll both back)")
            self.finalized = True
        return control

    # -- rolling back with the divergence guard (callbacks/_rollback.py) -------------------------
    def rollback_state(self, model, step: int):
        """The average after optimizer step ``step``, copied to CPU (folded in first if not yet)."""
        if self.average is None:
            return None
        self._fold_in(model, step)
        return _cpu_copy(self.average.state_dict())

    def rollback_restore(self, model, saved=None, checkpoint: Optional[str] = None) -> None:
        """Go back to ``saved`` (from :meth:`rollback_state`), else to the average in ``checkpoint``, else
        start the average again from the (just restored) weights."""
        if self.average is None:
            return
        path = os.path.join(checkpoint, AVERAGE_FILE) if checkpoint else None
        if self._backup is not None:  # the average was swapped in for an evaluation: the restored weights are the iterate
            params = dict(model.named_parameters())
            self._backup = {n: params[n].detach().clone() for n in self.average.names}
        fresh = self._new_average(model)
        if saved is not None:
            fresh.load_state_dict(saved)
            how = "the guard's snapshot"
        elif path and os.path.isfile(path):
            fresh.load_state_dict(load_average_file(path))
            how = path
        else:
            how = "the restored weights (no saved average)"
        self.average = fresh
        self._updated_step = None
        if self._backup is not None:
            self.average.copy_to(model)
        logger.warning("the weight average rolled back with the weights: from %s", how)

    def _new_average(self, model) -> WeightAverage:
        return WeightAverage(trainable_parameters(model), **self.settings)

    def _fold_in(self, model, step: int) -> None:
        if self.average is not None and self._updated_step != step:
            weights = self._backup if self._backup is not None else trainable_parameters(model)
            self.average.update(weights, step)
            self._updated_step = step

    def finish_from(self, checkpoint: str, model) -> bool:
        """Make ``model`` the average saved in ``checkpoint`` (a finished run whose final save was lost: the
        checkpoint's model is the iterate). Returns False, leaving the model alone, when it holds none."""
        path = os.path.join(checkpoint, AVERAGE_FILE)
        if not os.path.isfile(path):
            return False
        self.average = self._new_average(model)
        self.average.load_state_dict(load_average_file(path))
        self.average.copy_to(model)
        self.finalized = True
        return True

    # -- swapping ------------------------------------------------------------------------------
    def swap_in(self, model) -> None:
        """Put the average into ``model``, keeping its own weights to put back (no-op once finalized)."""
        if self._backup is not None or self.average is None or self.finalized:
            return
        params = dict(model.named_parameters())
        self._backup = {n: params[n].detach().clone() for n in self.average.names}
        self.average.copy_to(model)

    def swap_out(self, model) -> None:
        """Put the model's own weights back after :meth:`swap_in`."""
        if self._backup is None:
            return
        params = dict(model.named_parameters())
        with torch.no_grad():
            for n, t in self._backup.items():
                params[n].copy_(t)
        self._backup = None


def _cpu_copy(obj):
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True)
    if isinstance(obj, dict):
        return {k: _cpu_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_cpu_copy(v) for v in obj]
    return obj
