"""Evaluation metrics shipped inside the package (loadable by ``evaluate.load`` without the Hub)."""

from .loader import load_next_token_accuracy, make_compute_metrics, preprocess_logits_for_metrics

__all__ = ["load_next_token_accuracy", "make_compute_metrics", "preprocess_logits_for_metrics"]
