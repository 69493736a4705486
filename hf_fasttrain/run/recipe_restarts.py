"""Random restart for a recipe (the top floor): each trial is a normal recipe run, in this process through
:func:`hf_fasttrain.run.train.train` or as a ``hf-fasttrain train`` subprocess; :func:`train_with_restarts` runs the
search described by a ``FastTrainingArguments``' ``restart_*`` fields."""

from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Sequence

from .._files import atomic_write_text, last_complete_checkpoint
from ..callbacks.stop_at_step import StageFenceCallback
from ..data.from_args import DataPlan
from ..config.recipes import resolved_config
from ..validation import ConfigError
from ..restarts import RestartOrchestrator, TrialResult, TrialRunner, TrialSpec, restart_config_from_args
from ..restarts.config import in_option_words
from ..callbacks.run_record import checkpoint_log_history
from ._resume import checkpoint_extras
from .train import train

__all__ = ["RecipeTrialRunner", "train_with_restarts"]


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class RecipeTrialRunner:
    """Runs each trial as a normal recipe run: :func:`hf_fasttrain.run.train.train` in this process, or the recipe's
    command line in a subprocess (one per GPU under ``parallel="per_gpu"``, with ``CUDA_VISIBLE_DEVICES``).

    A trial's arguments are the recipe's with ``seed = model_seed``, ``data_seed = data_seed``, the trial's
    ``output_dir``, the full run's ``max_steps`` and ``restart_stop_at_step = until_step`` (the run stops and
    saves ``checkpoint-<until_step>`` there, see :class:`~hf_fasttrain.callbacks.stop_at_step.StopAtStepCallback`).
    The eval history is read from that checkpoint's ``trainer_state.json``; the run's final evaluation (at
    ``until_step``) is the rung value. A non-finite training loss in the log marks the trial diverged.

    Args:
        model_args, data_args, training_args: the recipe's resolved arguments.
        subprocess: run trials as subprocesses (always so under ``per_gpu``).
        launcher: command prefix for subprocess trials; the trial's config file follows as ``--config PATH``.
            Default: ``python -m hf_fasttrain.cli train``; e.g. ``["accelerate", "launch", "-m",
            "hf_fasttrain.cli", "train"]``.
        trial_overrides: ``{trial index: {field: value}}`` applied to that trial's training arguments (for
            experiments, e.g. forcing one seed to diverge with a huge ``learning_rate``).
        callbacks: extra Trainer callbacks for in-process trials.

    Example:
        >>> # model_args, data_args, training_args = parse_config(["--config", "gpt2_tiny"])
        >>> # runner = RecipeTrialRunner(model_args, data_args, training_args)
        >>> # RestartOrchestrator(restart_config_from_args(training_args), runner, "runs/r", 300).run()
    """

    def __init__(self, model_args, data_args, training_args, subprocess: bool = False,
                 launcher: Optional[Sequence[str]] = None, trial_overrides: Optional[Dict[int, Dict[str, Any]]] = None,
                 callbacks: Optional[Sequence[Any]] = None):
        self.model_args = model_args
        self.data_args = data_args
        self.training_args = training_args
        self.subprocess = subprocess
        self.launcher = list(launcher) if launcher else None
        self.trial_overrides = dict(trial_overrides or {})
        self.callbacks = list(callbacks or [])

    def available_metrics(self) -> List[str]:
        """Metrics every recipe evaluation reports (FastTrainer's eval loss, perplexity, next-token accuracy)."""
        return ["eval_loss", "eval_perplexity", "eval_next_token_accuracy"]

    def trial_args(self, trial: TrialSpec, until_step: int, resume_from: Optional[str]):
        """The trial's training arguments: a copy of the recipe's with the seeds, directory and stop step."""
        import copy

        args = copy.deepcopy(self.training_args)
        changes = {
            "seed": trial.model_seed,
            "data_seed": trial.data_seed,
            "output_dir": trial.output_dir,
            "max_steps": self.training_args.max_steps,  # the recipe's: trial.max_steps counts the optimizer steps
            "restart_num_seeds": 1,
            "restart_stop_at_step": until_step,
            "resume_from_checkpoint": last_complete_checkpoint(trial.output_dir, before_step=until_step, extra=[resume_from],
                                                              required=checkpoint_extras(self.training_args, self.data_args)),
            "auto_resume": False,
        }
        changes.update(self.trial_overrides.get(trial.index, {}))
        for k, v in changes.items():
            setattr(args, k, v)
        return args

    def run(self, trial: TrialSpec, until_step: int, resume_from: Optional[str]) -> TrialResult:
        args = self.trial_args(trial, until_step, resume_from)
        os.makedirs(trial.output_dir, exist_ok=True)
        if self.subprocess:
            metrics = self._run_subprocess(trial, args)
        else:
            callbacks = list(self.callbacks)
            if trial.state_path is not None and trial.generation is not None:
                # a stage left running by a killed driver stops before it writes (see StageFenceCallback)
                callbacks.append(StageFenceCallback(trial.state_path, trial.generation))
            metrics = train(self.model_args, self.data_args, args, callbacks=callbacks)
        ckpt = os.path.join(trial.output_dir, f"checkpoint-{until_step}")
        log_history = checkpoint_log_history(ckpt)  # with the run record's clock (train_seconds) put back
        history = [dict(e) for e in log_history if "step" in e and any(k.startswith("eval_") for k in e)]
        final = {k: float(v) for k, v in metrics.items() if _is_number(v)}
        history.append({"step": until_step, **final})
        losses = [float(e["loss"]) for e in log_history if _is_number(e.get("loss"))]
        diverged = any(not math.isfinite(v) for v in losses)
        return TrialResult(history, final, ckpt, diverged)

    def _run_subprocess(self, trial: TrialSpec, args) -> Dict[str, Any]:
        import subprocess
        import sys

        import yaml

        config = resolved_config(self.model_args, self.data_args, args)
        path = os.path.join(trial.output_dir, f"trial_config_{args.restart_stop_at_step}.yaml")
        atomic_write_text(path, yaml.safe_dump(config, sort_keys=False))
        cmd = (self.launcher or [sys.executable, "-m", "hf_fasttrain.cli", "train"]) + ["--config", path]
        env = dict(os.environ)
        # the trial imports the same hf_fasttrain as this process (a checkout may shadow an installed copy)
        pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pkg_root, env.get("PYTHONPATH")) if p)
        if trial.device is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(trial.device)
        log_path = os.path.join(trial.output_dir, f"trial_{args.restart_stop_at_step}.log")
        with open(log_path, "a", encoding="utf-8") as log:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            raise RuntimeError(f"trial {trial.trial_id} failed (exit {proc.returncode}); see {log_path}")
        with open(os.path.join(trial.output_dir, "metrics.json"), encoding="utf-8") as f:
            record = json.load(f)
        if "final_metrics" not in record:
            raise RuntimeError(f"trial {trial.trial_id}: {trial.output_dir}/metrics.json has no final_metrics")
        return record["final_metrics"]


def train_with_restarts(model_args, data_args, training_args, callbacks: Optional[Sequence[Any]] = None,
                        runner: Optional[TrialRunner] = None, **config_overrides) -> Dict[str, Any]:
    """The random-restart search for a recipe: explores ``restart_num_seeds`` seeds, continues the best to
    ``max_steps``; state, summary and trials live in ``training_args.output_dir``.

    This is what ``recipes/gpt2_small.py`` runs when ``restart_num_seeds > 1``. Killed, the same call resumes
    from ``restarts_state.json`` without rerunning a finished trial.

    Args:
        model_args (`ModelArguments`):
            The recipe's ``model:`` section.
        data_args (`DataArguments`):
            The recipe's ``data:`` section.
        training_args (`FastTrainingArguments`):
            The run; its ``restart_*`` fields are the search settings and ``max_steps`` (> 0) the full run.
        callbacks (`Sequence[TrainerCallback]`, *optional*, defaults to `None`):
            Extra callbacks for every trial's Trainer.
        runner (`TrialRunner`, *optional*, defaults to `None`):
            Trains the trials; ``None`` builds a ``RecipeTrialRunner`` (in this process, or one subprocess
            per GPU with ``restart_parallel="per_gpu"``). With ``restart_backend="ray"`` the runner (given or
            built) is wrapped in a :class:`~hf_fasttrain.restarts.ray_backend.RayTrialRunner`: each stage
            is a Ray task on ``restart_ray_address`` asking for ``restart_trial_resources``, at most
            ``restart_max_concurrent`` at once.
        **config_overrides:
            ``RestartConfig`` fields that replace those read from ``training_args``.

    Returns:
        `dict`: the summary (also in ``restarts_summary.json``): per seed its metrics and fate, the winner
        and its final metric.

    Example:
        ```python
        >>> from hf_fasttrain import train_with_restarts
        >>> from hf_fasttrain.config.recipes import parse_config
        >>> model_args, data_args, training_args = parse_config(
        ...     ["--config", "gpt2_tiny", "--restart_num_seeds", "4", "--restart_explore_fraction", "0.1"])
        >>> # summary = train_with_restarts(model_args, data_args, training_args)
        ```
    """
    config = restart_config_from_args(training_args, **config_overrides)
    # the run's length, read once (a run given in tokens, max_tokens: the search splits the optimizer steps that
    # hold them, set as max_steps)
    plan = DataPlan.from_args(data_args, training_args)
    if training_args.max_steps is None or training_args.max_steps <= 0:
        raise ValueError(
            f"max_steps: got {training_args.max_steps!r}, which random restart cannot split; set max_steps > 0 (the "
            "exploration budget is a fraction of it)"
        )
    if training_args.batch_warmup_min_tokens is not None:
        raise ValueError(
            f"batch_warmup_min_tokens: got {training_args.batch_warmup_min_tokens!r} with random restart, whose "
            "search needs the run's step count up front (a batch-size warmup ends by its token budget); set it "
            "to null or restart_num_seeds to 1"
        )
    # rungs and the winner's continuation are counted in the optimizer steps the run really takes (a token budget
    # with a sequence-length warmup: more, shorter ones than full-length rows would need)
    total_steps = plan.optimizer_steps
    if runner is None:
        runner = RecipeTrialRunner(model_args, data_args, training_args, subprocess=config.parallel == "per_gpu",
                                   callbacks=callbacks)
    if config.backend == "local":
        return _orchestrator(config, runner, training_args.output_dir, total_steps).run()
    from ..restarts.ray_backend import RayTrialRunner

    runner = RayTrialRunner(runner, address=config.ray_address, resources=config.trial_resources)
    search = _orchestrator(config, runner, training_args.output_dir, total_steps)  # checks settings first
    with runner.started(training_args.output_dir):
        return search.run()


def _orchestrator(config, runner, output_dir, total_steps) -> RestartOrchestrator:
    """The search, its settings checked; a refusal names the ``restart_*`` option (``restart_metric``)."""
    try:
        return RestartOrchestrator(config, runner, output_dir, total_steps)
    except ConfigError as err:
        raise in_option_words(err) from None
