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
    """``compute_metrics`` for causal LMs: next-token accuracy over positions whose label is not -100.

    Works on the arg-max ids that :func:`preprocess_logits_for_metrics` keeps and on the full logits the Trainer
    gathers without it (their arg-max is taken here). Pass ``preprocess_logits_for_metrics`` beside it all the
    same: without it the Trainer holds every [batch, length, vocab] logit of the evaluation in memory.

    Example:
        >>> from hf_fasttrain.metrics import make_compute_metrics, preprocess_logits_for_metrics
        >>> # Trainer(..., compute_metrics=make_compute_metrics(),
        >>> #         preprocess_logits_for_metrics=preprocess_logits_for_metrics)
    """
    metric = load_next_token_accuracy()

    def compute_metrics(eval_pred):
        preds, labels = eval_pred.predictions, eval_pred.label_ids
        if isinstance(preds, tuple):
            preds = preds[0]
        preds, labels = np.asarray(preds), np.asarray(labels)
        if preds.ndim == labels.ndim + 1:  # logits (no preprocess_logits_for_metrics): their arg-max ids
            preds = preds.argmax(axis=-1)
        if preds.shape != labels.shape:
            raise ValueError(f"next_token_accuracy: predictions of shape {preds.shape} do not line up with labels of "
                             f"shape {labels.shape}; it needs the model's logits or their arg-max ids per position "
                             "(pass preprocess_logits_for_metrics=hf_fasttrain.metrics.preprocess_logits_for_metrics)")
        # the model at position i predicts token i + 1
        preds = preds[:, :-1].reshape(-1)
        labels = labels[:, 1:].reshape(-1)
        keep = labels != -100
        return metric.compute(predictions=preds[keep], references=labels[keep])

    return compute_metrics
