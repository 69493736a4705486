"""Training wall-clock, loss history, ``metrics.json`` and the loss-curve PNG of a run.

Works with a plain ``transformers.Trainer`` (``trainer.add_callback(RunRecorderCallback())``) and is
built into FastTrainer (``run_record=True``, the FastTrainingArguments default). Wall-clock here is
*training* time: the time spent in evaluation and in writing checkpoints is excluded, so runs that
evaluate at different rates compare fairly. The clock is saved with every checkpoint, in the checkpoint's
own ``run_record.json`` (not in ``trainer_state.json``, which stays free of wall-clock values: a resumed
run's TrainerState equals a straight run's), and continues from there on a resume.

Example:
    >>> from hf_fasttrain.callbacks import RunRecorderCallback
    >>> recorder = RunRecorderCallback()
    >>> # trainer.add_callback(recorder); trainer.train()
    >>> # -> output_dir/metrics.json and output_dir/loss_curve.png
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Optional

from transformers import TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..runinfo import atomic_write_text
from ._logs import add_to_log

__all__ = ["RunRecorderCallback", "plot_loss_curves", "RECORD_FILE", "read_saved_seconds"]

RECORD_FILE = "run_record.json"  # in each checkpoint: {"train_seconds": <the clock at that step>}


def read_saved_seconds(checkpoint_dir: Optional[str]) -> Optional[float]:
    """The training clock a checkpoint's ``run_record.json`` holds, or None (no file, or not readable)."""
    if not checkpoint_dir:
        return None
    try:
        data = json.loads((Path(checkpoint_dir) / RECORD_FILE).read_text(encoding="utf-8"))
        seconds = data.get("train_seconds") if isinstance(data, dict) else None
        return float(seconds) if isinstance(seconds, (int, float)) else None
    except (OSError, ValueError):
        return None


class RunRecorderCallback(TrainerCallback):
    """Tracks training seconds (excluding eval and checkpointing) and the train/eval loss history.

    Every log gains ``train_seconds`` (in ``state.log_history`` too) unless it has one. The clock is
    resumable in any Trainer: each checkpoint gets a ``run_record.json`` holding it (written atomically
    by the main process in ``on_save``), and a resumed run continues from the checkpoint's value. The
    checkpoint resumed from is ``resume_dir`` when set (FastTrainer sets it from ``train(resume_from_checkpoint=...)``),
    else ``output_dir/checkpoint-<step>``. Older checkpoints, which kept the clock in
    ``trainer_state.json``'s ``stateful_callbacks``, are read too; without either, the last ``train_seconds``
    in ``log_history`` is used. Nothing of the recorder goes into ``trainer_state.json``, so the
    TrainerState of a resumed run equals a straight run's.

    Args:
        write_files: write ``metrics.json`` and ``loss_curve.png`` into ``output_dir`` at the end.
    """

    def __init__(self, write_files: bool = True):
        self.write_files = write_files
        self.resume_dir: Optional[str] = None  # the checkpoint a resume starts from, if not output_dir/checkpoint-<step>
        self.saved_seconds: Optional[float] = None  # the clock at the checkpoint this run resumed from
        self._t0: Optional[float] = None
        self._offset = 0.0
        self._excluded = 0.0
        self._pause_start: Optional[float] = None
        self.records: list[dict[str, Any]] = []

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
    def _clock_at_resume(self, args, state) -> float:
        if state.global_step == 0:  # a fresh run (train() without a checkpoint starts at step 0)
            return 0.0
        default = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        for checkpoint in (self.resume_dir, default):
            seconds = read_saved_seconds(checkpoint)
            if seconds is not None:
                return seconds
        saved = (state.stateful_callbacks or {}).get(type(self).__name__)  # written by earlier versions
        if isinstance(saved, list):  # several recorders: the Trainer keeps a list; they share one clock
            saved = saved[0] if saved else None
        seconds = saved.get("attributes", {}).get("saved_seconds") if isinstance(saved, dict) else None
        if seconds is not None:
            return float(seconds)
        for entry in reversed(state.log_history):  # a checkpoint written without the recorder
            if "train_seconds" in entry:
                return float(entry["train_seconds"])
        return 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._offset = self._clock_at_resume(args, state)
        self.saved_seconds = self._offset if state.global_step else None
        if state.stateful_callbacks is not None:  # an earlier version's entry: the clock now lives in RECORD_FILE
            state.stateful_callbacks.pop(type(self).__name__, None)
        self.records = [dict(e) for e in state.log_history if "loss" in e or "eval_loss" in e]
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
            atomic_write_text(checkpoint / RECORD_FILE, json.dumps({"train_seconds": self.train_seconds()}))
        self._resume_pause()

    # -- history -----------------------------------------------------------------------------
    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is None:
            return
        if "train_seconds" not in logs:  # a plain Trainer's log (FastTrainer's carry it already)
            # into log_history too, so a resumed run's records keep the clock
            add_to_log(state, logs, {"train_seconds": self.train_seconds()})
        if "loss" in logs or "eval_loss" in logs:
            rec = {k: v for k, v in logs.items() if isinstance(v, (int, float))}
            rec["step"] = state.global_step
            self.records.append(rec)

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


def _json_default(x):
    if isinstance(x, float) and not math.isfinite(x):
        return str(x)
    return str(x)


def plot_loss_curves(records: list[dict[str, Any]], path: Path, title: Optional[str] = None) -> None:
    """Train and eval loss against optimizer steps and against training seconds, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_loss" in r]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, x in zip(axes, ("step", "train_seconds")):
        tr = [r for r in train if x in r]  # a plain Trainer's pre-resume logs carry no clock
        ev = [r for r in evals if x in r]
        if tr:
            ax.plot([r[x] for r in tr], [r["loss"] for r in tr], label="train loss", lw=1)
        if ev:
            ax.plot([r[x] for r in ev], [r["eval_loss"] for r in ev], "o-", label="eval loss", ms=3)
        ax.set_xlabel("optimizer step" if x == "step" else "training wall-clock (s, excl. eval)")
        ax.set_ylabel("loss")
        ax.grid(alpha=0.3)
        ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
