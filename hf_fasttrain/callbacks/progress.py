"""The recipe's progress display: the Trainer's tqdm bar, with logs shown as numbers.

``transformers.ProgressCallback`` prints each log as a dict of quoted strings
(``{'loss': '5.008', ...}``) above its bar. :class:`ReadableProgressCallback` keeps one display: the bar
(on stderr) with the last loss, lr and tokens/s beside it (tqdm gives the ETA), and a line per evaluation
(on stdout). With ``disable_tqdm`` (no bar), :class:`ReadablePrinterCallback` prints a line per log::

    step 40/300  loss 5.012  lr 0.0158  grad_norm 0.91  tokens/s 9,870  train 8.2 s
    eval at step 100: loss 4.213  perplexity 67.6  next_token_accuracy 0.231

Pure formatting lives in :func:`format_log` (tested with tables); the callback is a few lines.

Example:
    >>> from hf_fasttrain.callbacks.progress import format_log
    >>> format_log({"loss": 5.0123, "learning_rate": 0.016, "tokens_per_second": 9870.4}, step=40, max_steps=300)
    'step 40/300  loss 5.012  lr 0.016  tokens/s 9,870'
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from transformers.trainer_callback import PrinterCallback, ProgressCallback

__all__ = ["ReadableProgressCallback", "ReadablePrinterCallback", "format_log", "format_number", "bar_postfix"]

# key -> (label, format); keys not listed are printed with format_number under their own name
_TRAIN_KEYS = {
    "loss": ("loss", "{:.4g}"),
    "learning_rate": ("lr", "{:.3g}"),
    "grad_norm": ("grad_norm", "{:.3g}"),
    "tokens_per_second": ("tokens/s", "{:,.0f}"),
    "mfu": ("mfu", "{:.1%}"),
    "train_seconds": ("train", "{:.1f} s"),
}
# shown in metrics.json and the logs, not on the console line
_QUIET = {"epoch", "total_flos", "padding_fraction", "clip_pre_norm", "clip_post_norm", "clip_pre_norm_max",
          "clip_fraction", "eval_runtime", "eval_samples_per_second", "eval_steps_per_second",
          "train_samples_per_second", "train_steps_per_second", "train_runtime", "train_loss"}


def format_number(v: Any) -> str:
    """4 significant digits, thousands separators for large numbers; ints as ints; non-numbers as str."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    if not math.isfinite(v):
        return str(v)
    if v != 0 and abs(v) >= 1e4:
        return f"{v:,.0f}"
    return f"{v:.4g}"


def format_log(logs: Mapping[str, Any], step: int, max_steps: Optional[int] = None) -> Optional[str]:
    """One console line for a Trainer log; None for logs with nothing to show (the end-of-training one)."""
    where = f"{step}/{max_steps}" if max_steps and max_steps > 0 else str(step)
    if any(k.startswith("eval_") for k in logs):
        parts = [f"eval at step {step}:"]
        for k, v in logs.items():
            if k.startswith("eval_") and k not in _QUIET:
                parts.append(f"{k[5:]} {format_number(v)}")
        return "  ".join(parts)
    if "loss" not in logs:
        return None
    parts = [f"step {where}"]
    for k, (label, fmt) in _TRAIN_KEYS.items():
        v = logs.get(k)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            parts.append(f"{label} {fmt.format(v) if math.isfinite(v) else v}")
    for k, v in logs.items():
        if k not in _TRAIN_KEYS and k not in _QUIET and not (k.startswith("guard_") and v == 0):
            parts.append(f"{k} {format_number(v)}")
    return "  ".join(parts)


def bar_postfix(logs: Mapping[str, Any]) -> Optional[dict[str, str]]:
    """What a training log shows beside the progress bar (loss, lr, tokens/s); None for other logs.

    >>> bar_postfix({"loss": 5.0123, "learning_rate": 0.016, "grad_norm": 0.9, "tokens_per_second": 9870.4})
    {'loss': '5.012', 'lr': '0.016', 'tokens/s': '9,870'}
    >>> bar_postfix({"eval_loss": 4.2}) is None
    True
    """
    if not isinstance(logs.get("loss"), (int, float)):
        return None
    postfix = {"loss": f"{logs['loss']:.4g}"}
    if isinstance(logs.get("learning_rate"), (int, float)):
        postfix["lr"] = f"{logs['learning_rate']:.3g}"
    if isinstance(logs.get("tokens_per_second"), (int, float)):
        postfix["tokens/s"] = f"{logs['tokens_per_second']:,.0f}"
    return postfix


class ReadableProgressCallback(ProgressCallback):
    """``ProgressCallback`` with one display: the bar, the last loss, lr and tokens/s beside it (tqdm gives
    the ETA). A training log updates the bar only (a line per log would make the bar redraw around it);
    an evaluation writes its line above the bar. With ``disable_tqdm`` the step lines come from
    :class:`ReadablePrinterCallback` instead."""

    def __init__(self, max_str_len: int = 100, bar_after_training: bool = True):
        super().__init__(max_str_len)
        self.bar_after_training = bar_after_training  # the recipe's final evaluate goes without one
        self._trained = False

    def on_train_end(self, args, state, control, **kwargs):
        super().on_train_end(args, state, control, **kwargs)
        self._trained = True

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        # a bar of its own only for an evaluation outside training (not nested under the training bar)
        if self.training_bar is None and (self.bar_after_training or not self._trained):
            super().on_prediction_step(args, state, control, eval_dataloader=eval_dataloader, **kwargs)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or self.training_bar is None or not logs:
            return
        postfix = bar_postfix(logs)
        if postfix is not None:
            self.training_bar.set_postfix(postfix, refresh=False)
            return
        if any(k.startswith("eval_") for k in logs):
            line = format_log(logs, state.global_step, state.max_steps)
            if line:
                self.training_bar.write(line)


class ReadablePrinterCallback(PrinterCallback):
    """``PrinterCallback`` (used with ``disable_tqdm``) printing :func:`format_log` lines instead of dicts."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_local_process_zero and logs:
            line = format_log(logs, state.global_step, state.max_steps)
            if line:
                print(line)
