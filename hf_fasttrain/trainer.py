"""FastTrainer: ``transformers.Trainer`` wired to hf_fasttrain's parts. No algorithms live here.

Example:
    >>> from hf_fasttrain import FastTrainer, FastTrainingArguments
    >>> args = FastTrainingArguments(output_dir="runs/x", max_steps=200, logging_steps=10)
    >>> # trainer = FastTrainer(model=model, args=args, train_dataset=ds, data_collator=collator)
    >>> # trainer.train()   # logs gain tokens_per_second, padding_fraction, train_seconds (+ mfu on GPU)
"""

from __future__ import annotations

import math
import time
from typing import Any, Optional

import torch
from transformers import Trainer

from .args import FastTrainingArguments
from .callbacks.run_record import RunRecorderCallback
from .optim import create_optimizer, trainer_optimizer_kwargs
from .runinfo import training_config, write_run_record
from .throughput import ThroughputMeter, device_peak_flops, flops_per_token, mfu

__all__ = ["FastTrainer"]


def _model_dims(model) -> tuple[int, int, int]:
    """(parameters excluding position embeddings, layers, hidden size) for the FLOP estimate."""
    cfg = getattr(model, "config", None)
    n_layer = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 0) or 0
    d_model = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 0) or 0
    n_params = sum(p.numel() for p in model.parameters())
    for name, p in model.named_parameters():
        if name.endswith(("wpe.weight", "position_embeddings.weight", "embed_positions.weight")):
            n_params -= p.numel()  # a table lookup, not matmul FLOPs (as nanoGPT counts)
    return n_params, int(n_layer), int(d_model)


class FastTrainer(Trainer):
    """A ``Trainer`` that adds hf_fasttrain's techniques according to ``FastTrainingArguments``.

    On top of the Trainer it logs, with every training log: ``tokens_per_second`` (real tokens,
    all processes), ``padding_fraction`` (share of pad tokens in the batches it trained on since the
    last log), ``train_seconds`` (training wall-clock excluding evaluation and checkpointing) and, on
    a GPU with a known peak, ``mfu``. Evaluation adds ``eval_perplexity``. Each run writes
    ``config.yaml`` and ``run_info.json`` into ``output_dir`` at the start, and ``metrics.json`` and
    ``loss_curve.png`` at the end.

    Args:
        run_config: extra sections (e.g. ``{"model": {...}, "data": {...}}``) saved into
            ``config.yaml`` beside the training arguments.
        Everything else is passed to ``transformers.Trainer``.
    """

    def __init__(self, *args, run_config: Optional[dict[str, Any]] = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.run_config = dict(run_config or {})
        pad_id = getattr(self.processing_class, "pad_token_id", None)
        self.throughput = ThroughputMeter(pad_token_id=pad_id)
        self.recorder = RunRecorderCallback()
        self.add_callback(self.recorder)
        self._last_log_seconds = 0.0
        self._dims: Optional[tuple[int, int, int]] = None

    # -- hooks ---------------------------------------------------------------------------------
    def training_step(self, model, inputs, num_items_in_batch=None):
        self.throughput.add(inputs)
        return super().training_step(model, inputs, num_items_in_batch)

    def log(self, logs: dict[str, float], start_time: Optional[float] = None) -> None:
        if "loss" in logs:  # a training log: every process calls this together
            logs.update(self._throughput_logs())
        else:  # evaluation and end-of-training logs carry the clock too (it survives a resume)
            logs.setdefault("train_seconds", self.recorder.train_seconds())
        super().log(logs, start_time)

    def create_optimizer(self, model=None):
        """``args.optimizer`` set: build it by name from hf_fasttrain.optim; else the Trainer's ``optim``."""
        if getattr(self.args, "optimizer", None) is None or self.optimizer is not None:
            return super().create_optimizer(model)
        kwargs = trainer_optimizer_kwargs(self.args, num_training_steps=self.state.max_steps)
        self.optimizer = create_optimizer(self.args.optimizer, self.model if model is None else model, **kwargs)
        return self.optimizer

    def evaluate(self, eval_dataset=None, ignore_keys=None, metric_key_prefix: str = "eval"):
        metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        loss = metrics.get(f"{metric_key_prefix}_loss")
        if loss is not None:
            metrics[f"{metric_key_prefix}_perplexity"] = math.exp(min(loss, 50.0))
        return metrics

    def train(self, resume_from_checkpoint=None, trial=None, ignore_keys_for_eval=None, **kwargs):
        if self.is_world_process_zero():
            config = {**self.run_config, **training_config(self.args)}
            write_run_record(self.args.output_dir, config)
        self._last_log_seconds = None
        return super().train(resume_from_checkpoint, trial, ignore_keys_for_eval, **kwargs)

    # -- helpers -------------------------------------------------------------------------------
    def _throughput_logs(self) -> dict[str, float]:
        stats = self.throughput.flush()
        real, total = stats["real_tokens"], stats["total_tokens"]
        if self.args.world_size > 1:  # sum over processes; all of them are in this call
            t = torch.tensor([real, total], dtype=torch.float64, device=self.args.device)
            t = self.accelerator.reduce(t, reduction="sum")
            real, total = int(t[0].item()), int(t[1].item())
        now = self.recorder.train_seconds()
        if self._last_log_seconds is None:  # first log of this train() call (maybe a resume)
            self._last_log_seconds = self.recorder._offset
        dt = max(now - self._last_log_seconds, 1e-9)
        self._last_log_seconds = now
        out = {
            "tokens_per_second": real / dt,
            "padding_fraction": (1.0 - real / total) if total else 0.0,
            "train_seconds": now,
        }
        peak = self.args.mfu_peak_tflops * 1e12 if self.args.mfu_peak_tflops else device_peak_flops(self.args.device)
        if peak:
            if self._dims is None:
                self._dims = _model_dims(self.model)
            n_params, n_layer, d_model = self._dims
            fpt = flops_per_token(n_params, n_layer, d_model, stats["seq_len"])
            # padded tokens cost compute too: utilisation counts every token the model ran on
            value = mfu(total / dt, fpt, peak, n_devices=self.args.world_size)
            if value is not None:
                out["mfu"] = value
        return out
