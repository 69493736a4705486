"""Training wall-clock, loss history, ``metrics.json`` and the loss-curve PNG of a run.

Works with a plain ``transformers.Trainer`` (``trainer.add_callback(RunRecorderCallback())``) and is
built into FastTrainer (``run_record=True``, the FastTrainingArguments default). Wall-clock here is
*training* time: the time spent in evaluation and in writing checkpoints is excluded, so runs that
evaluate at different rates compare fairly. The clock is saved with every checkpoint, in the checkpoint's
own ``run_record.json`` (not in ``trainer_state.json``, which stays free of wall-clock values: a resumed
run's TrainerState equals a straight run's), and continues from there on a resume.

Example:
    ```python
    >>> from hf_fasttrain.callbacks import RunRecorderCallback
    >>> recorder = RunRecorderCallback()
    >>> # trainer.add_callback(recorder); trainer.train()
    >>> # -> output_dir/metrics.json and output_dir/loss_curve.png
    ```
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..runinfo import atomic_write_text

logger = logging.getLogger(__name__)

__all__ = ["RunRecorderCallback", "plot_loss_curves", "RECORD_FILE", "WALL_CLOCK_LOG_KEYS", "read_run_record",
           "read_saved_seconds", "with_wall_clock", "checkpoint_log_history"]

# In each checkpoint: {"train_seconds": <the clock at that step>, "wall_clock": [{"step", "eval", <keys below>}]}
RECORD_FILE = "run_record.json"
# Log keys of the run record that measure wall-clock. Training and evaluation logs carry them (printed, in
# metrics.json, seen by every callback's on_log) but TrainerState.log_history does not: trainer_state.json holds
# no wall clock, so a resumed run's TrainerState equals a straight run's. RECORD_FILE keeps them instead.
WALL_CLOCK_LOG_KEYS = ("train_seconds", "tokens_per_second", "samples_per_second", "mfu")


def read_run_record(checkpoint_dir: Optional[str]) -> Optional[dict]:
    """A checkpoint's ``run_record.json`` as a dict, or None (no file, or not readable)."""
    if not checkpoint_dir:
        return None
    try:
        data = json.loads((Path(checkpoint_dir) / RECORD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_saved_seconds(checkpoint_dir: Optional[str]) -> Optional[float]:
    """The training clock a checkpoint's ``run_record.json`` holds, or None."""
    seconds = (read_run_record(checkpoint_dir) or {}).get("train_seconds")
    return float(seconds) if isinstance(seconds, (int, float)) else None


def _checkpoint_step(checkpoint_dir: str) -> Optional[int]:
    """The ``global_step`` of a checkpoint's ``trainer_state.json``, or None."""
    try:
        step = json.loads((Path(checkpoint_dir) / "trainer_state.json").read_text(encoding="utf-8")).get("global_step")
    except (OSError, ValueError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _clock_key(entry: dict) -> tuple:
    return entry.get("step"), "eval_loss" in entry or bool(entry.get("eval"))


def with_wall_clock(entries: list[dict], wall_clock: Optional[list]) -> list[dict]:
    """Copies of log ``entries`` with the wall-clock keys of ``wall_clock`` (a run record's) put back, by step and
    kind (training or evaluation log).

    Example:
        >>> with_wall_clock([{"loss": 2.0, "step": 5}], [{"step": 5, "eval": False, "train_seconds": 1.5}])
        [{'loss': 2.0, 'step': 5, 'train_seconds': 1.5}]
    """
    clock = {}
    for c in wall_clock or ():
        if isinstance(c, dict):
            clock[_clock_key(c)] = {k: v for k, v in c.items() if k in WALL_CLOCK_LOG_KEYS}
    out = []
    for e in entries:
        extra = clock.get(_clock_key(e)) if ("loss" in e or "eval_loss" in e) else None
        out.append({**e, **extra} if extra else dict(e))
    return out


def checkpoint_log_history(checkpoint_dir: str) -> list[dict]:
    """A checkpoint's ``log_history`` (trainer_state.json) with the run record's wall-clock keys put back."""
    with open(os.path.join(checkpoint_dir, "trainer_state.json"), encoding="utf-8") as f:
        history = json.load(f)["log_history"]
    return with_wall_clock(history, (read_run_record(checkpoint_dir) or {}).get("wall_clock"))


class RunRecorderCallback(TrainerCallback):
    """Tracks training seconds (excluding eval and checkpointing) and the train/eval loss history.

    Every log gains ``train_seconds`` unless it has one (the logs that callbacks and reporting see; not
    ``state.log_history``, which keeps no wall clock, see :data:`WALL_CLOCK_LOG_KEYS`). The clock is
    resumable in any Trainer, TRL's included: each checkpoint gets a ``run_record.json`` holding it (written
    atomically by the main process in ``on_save``), and a resumed run (``on_train_begin`` at a step above 0)
    continues from the value in the checkpoint it resumed from, with the logs' wall-clock values before it.
    That checkpoint is the first of these that holds a ``run_record.json``:

    1. ``resume_dir``, when set (FastTrainer sets it from ``train(resume_from_checkpoint=...)``);
    2. ``args.resume_from_checkpoint``, when it names a checkpoint of the step resumed at;
    3. ``output_dir/checkpoint-<step>``, where ``train(resume_from_checkpoint=True)`` resumes from.

    A plain Trainer that resumes from a checkpoint outside ``output_dir`` passes it as ``resume_dir``
    (the callback cannot see the argument of ``train()``); without a record the clock restarts at 0 with a
    warning that says so. A checkpoint that keeps the clock in ``trainer_state.json``'s
    ``stateful_callbacks`` is read too. Nothing of the recorder goes into ``trainer_state.json``, so the
    TrainerState of a resumed run equals a straight run's.

    Args:
        write_files: write ``metrics.json`` and ``loss_curve.png`` into ``output_dir`` at the end.
        resume_dir: the checkpoint a resume starts from, when it is not ``output_dir/checkpoint-<step>``.

    Example:
        ```python
        >>> from hf_fasttrain.callbacks import RunRecorderCallback
        >>> recorder = RunRecorderCallback(resume_dir="runs/first/checkpoint-20")
        >>> # trainer.add_callback(recorder); trainer.train(resume_from_checkpoint="runs/first/checkpoint-20")
        >>> recorder.resume_dir
        'runs/first/checkpoint-20'
        ```
    """

    def __init__(self, write_files: bool = True, resume_dir: Optional[str] = None):
        self.write_files = write_files
        self.resume_dir = resume_dir  # the checkpoint a resume starts from, if not output_dir/checkpoint-<step>
        self.saved_seconds: Optional[float] = None  # the clock at the checkpoint this run resumed from
        self._t0: Optional[float] = None
        self._offset = 0.0
        self._excluded = 0.0
        self._pause_start: Optional[float] = None
        self.records: list[dict[str, Any]] = []
        self.wall_clock: list[dict[str, Any]] = []  # the wall-clock keys of each log, by step and kind

    # -- clock -------------------------------------------------------------------------------
    def train_seconds(self) -> float:
        if self._t0 is None:
            return self._offset
        now = self._pause_start if self._pause_start is not None else time.perf_counter()
        return self._offset + (now - self._t0) - self._excluded

    def _resume_pause(self) -> None:
        if self._pause_start is not None and self._t0 is not None:
            self._excluded += time.perf_counter() - self._pause_start
            self._pause_start = None

    # -- checkpointed state ----------------------------------------------------------------------
    def _resume_candidates(self, args, state) -> list[str]:
        """The checkpoints a resume at ``state.global_step`` may have started from, in the order they are read."""
        out = [self.resume_dir] if self.resume_dir else []
        given = getattr(args, "resume_from_checkpoint", None)  # what a script passes to train(), by convention
        if isinstance(given, str) and given and _checkpoint_step(given) == state.global_step:
            out.append(given)
        out.append(os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"))
        return list(dict.fromkeys(out))

    def _resume_record(self, args, state) -> Optional[dict]:
        candidates = self._resume_candidates(args, state)
        for checkpoint in candidates:
            record = read_run_record(checkpoint)
            if record is not None:
                return record
        logger.warning("resumed at step %d without %s in %s: the training clock restarts at 0 (a checkpoint "
                       "outside output_dir: RunRecorderCallback(resume_dir=<checkpoint>))",
                       state.global_step, RECORD_FILE, " or ".join(candidates))
        return None

    def _clock_at_resume(self, state, record: Optional[dict]) -> float:
        if state.global_step == 0:  # a fresh run (train() without a checkpoint starts at step 0)
            return 0.0
        seconds = (record or {}).get("train_seconds")
        if isinstance(seconds, (int, float)):
            return float(seconds)
        return 0.0  # a checkpoint without a run record: the clock restarts (the warning above says so)

    def on_train_begin(self, args, state, control, **kwargs):
        record = self._resume_record(args, state) if state.global_step else None
        self._offset = self._clock_at_resume(state, record)
        self.saved_seconds = self._offset if state.global_step else None
        self.wall_clock = [dict(c) for c in (record or {}).get("wall_clock", []) if isinstance(c, dict)]
        history = [e for e in state.log_history if _is_record(e, state.log_history)]
        self.records = with_wall_clock(history, self.wall_clock)
        self._t0 = None  # the clock starts with the first step (an eval_on_start is not training)
        self._excluded = 0.0
        self._pause_start = None

    def on_step_begin(self, args, state, control, **kwargs):
        if self._t0 is None:
            self._t0 = time.perf_counter()
        self._resume_pause()  # safety net: a pause whose save was cancelled ends here

    def on_step_end(self, args, state, control, **kwargs):
        # DefaultFlowCallback runs first and has already set these flags for this step: the
        # Trainer evaluates and saves right after on_step_end, so the clock pauses now.
        if (control.should_evaluate or control.should_save) and self._t0 is not None:
            self._pause_start = time.perf_counter()

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self._resume_pause()
        if control.should_save and self._t0 is not None:  # a save follows: stay paused for it
            self._pause_start = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        # the clock is still paused for the save (on_step_end): its value is the one at the step's end
        checkpoint = Path(args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            record = {"train_seconds": self.train_seconds(),
                      "wall_clock": [c for c in self.wall_clock if (c.get("step") or 0) <= state.global_step]}
            atomic_write_text(checkpoint / RECORD_FILE, json.dumps(record, default=_json_default))
        self._resume_pause()

    # -- history -----------------------------------------------------------------------------
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        if "train_seconds" not in logs:  # a plain Trainer's log (FastTrainer's carry it already)
            logs["train_seconds"] = self.train_seconds()
        # the history keeps no wall clock (FastTrainer leaves it out; a plain Trainer's copy never had this key)
        last = state.log_history[-1] if state.log_history else None
        if last is not None and last.get("step") == state.global_step:
            for k in WALL_CLOCK_LOG_KEYS:
                last.pop(k, None)
        if _is_record(logs, self.records):
            rec = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
            rec["step"] = state.global_step
            self.records.append(rec)
            clock = {k: rec[k] for k in WALL_CLOCK_LOG_KEYS if k in rec}
            if clock:
                self.wall_clock.append({"step": state.global_step, "eval": "eval_loss" in rec, **clock})

    def on_train_end(self, args, state, control, **kwargs):
        self._resume_pause()
        # training is over: freeze the clock, so a final evaluate() or save_model() after train() does not
        # count as training time (their logs and metrics.json carry the training time proper)
        self._offset, self._t0 = self.train_seconds(), None
        if self.write_files and state.is_world_process_zero:
            self.save(args.output_dir)

    # -- outputs -----------------------------------------------------------------------------
    def summary(self, final_metrics: Optional[dict] = None) -> dict[str, Any]:
        train = [r for r in self.records if "loss" in r]
        evals = [r for r in self.records if "eval_loss" in r]
        out: dict[str, Any] = {
            "train_seconds": self.train_seconds(),
            "final_train_loss": train[-1]["loss"] if train else None,
            "initial_eval_loss": evals[0]["eval_loss"] if evals else None,
            "final_eval_loss": evals[-1]["eval_loss"] if evals else None,
            "history": self.records,
        }
        if final_metrics:
            out["final_metrics"] = dict(final_metrics)
            if "eval_loss" in final_metrics:
                out["final_eval_loss"] = final_metrics["eval_loss"]
        return out

    def save(self, output_dir: str, final_metrics: Optional[dict] = None, title: Optional[str] = None
             ) -> dict[str, Any]:
        summary = self.summary(final_metrics)
        out = Path(output_dir)
        atomic_write_text(out / "metrics.json", json.dumps(summary, indent=2, default=_json_default))
        plot_loss_curves(self.records, out / "loss_curve.png", title=title)
        return summary


def _is_record(entry: dict[str, Any], others: list[dict[str, Any]]) -> bool:
    """A log the recorder keeps: a training or eval loss; the end-of-training mean ``train_loss`` only in a
    run too short to have logged any training loss (so its curve still has a point)."""
    if "loss" in entry or "eval_loss" in entry:
        return True
    return "train_loss" in entry and not any("loss" in e for e in others)


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return str(x)


def plot_loss_curves(records: list[dict[str, Any]], path: Path, title: Optional[str] = None) -> None:
    """Train and eval loss against optimizer steps and against training seconds, side by side.

    A run too short for a logged loss still shows the Trainer's mean training loss of the run (its
    end-of-training ``train_loss``) as one point; with nothing at all to plot the image says so.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    means = [r for r in records if "train_loss" in r and "loss" not in r] if not train else []
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x in zip(axes, ("step", "train_seconds")):
        tr = [r for r in train if x in r]  # a plain Trainer's pre-resume logs carry no clock
        ev = [r for r in evals if x in r]
        mean = [r for r in means if x in r]
        if tr:
            ax.plot([r[x] for r in tr], [r["loss"] for r in tr], "o-" if len(tr) < 3 else "-", label="train loss",
                    lw=1, ms=3)
        if mean:
            ax.plot([r[x] for r in mean], [r["train_loss"] for r in mean], "s", label="train loss (mean of the run)")
        if ev:
            ax.plot([r[x] for r in ev], [r["eval_loss"] for r in ev], "o-", label="eval loss", ms=3)
        ax.set_xlabel("optimizer step" if x == "step" else "training wall-clock (s, excl. eval)")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        if tr or ev or mean:
            ax.legend()
        else:
            ax.text(0.5, 0.5, "nothing to plot: no loss was logged\n(logging_steps and eval_steps longer than the run?)",
                    ha="center", va="center", transform=ax.transAxes, color="0.4")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
