"""Glue between the Trainer's evaluation loop and the shipped ``evaluate`` metric."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

__all__ = ["METRIC_DIR", "load_next_token_accuracy", "preprocess_logits_for_metrics", "make_compute_metrics"]

METRIC_DIR = Path(__file__).parent / "next_token_accuracy"


def load_next_token_accuracy():
    """``evaluate.load`` on the module inside this package: a local path, so no network is used."""
    import evaluate

    return evaluate.load(str(METRIC_DIR))


def preprocess_logits_for_metrics(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Keep only the arg-max ids: the Trainer would otherwise hold every [B, L, vocab] logit in memory."""
    if isinstance(logits, tuple):
        logits = logits[0]
    return logits.argmax(dim=-1)


def make_compute_metrics():
    """``compute_metrics`` for causal LMs: next-token accuracy over positions whose label is not -100."""
    metric = load_next_token_accuracy()

    def compute_metrics(eval_pred):
        preds, labels = eval_pred.predictions, eval_pred.label_ids
        if isinstance(preds, tuple):
            preds = preds[0]
        # the model at position i predicts token i + 1
        preds = np.asarray(preds)[:, :-1].reshape(-1)
        labels = np.asarray(labels)[:, 1:].reshape(-1)
        keep = labels != -100
        return metric.compute(predictions=preds[keep], references=labels[keep])

    return compute_metrics
