"""Evaluation metrics in every log: each evaluation FastTrainer logs carries eval_perplexity (and the accuracy that
compute_metrics gives) in the logs callbacks see, state.log_history and metrics.json, the same numbers evaluate()
returns; make_compute_metrics works without preprocess_logits_for_metrics."""

import json
import math

import numpy as np
import pytest
from transformers import EvalPrediction, TrainerCallback

from hf_fasttrain.metrics import make_compute_metrics, preprocess_logits_for_metrics

from conftest import make_tiny_trainer, tiny_args


class _Logs(TrainerCallback):
    """The logs as every callback (a reporter such as TensorBoard or W&B) receives them."""

    def __init__(self):
        self.logs = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.logs.append(dict(logs))


def _trainer(lm, tok, out, run_record=True, **kw):
    args = tiny_args(out, max_steps=4, logging_steps=2, eval_strategy="steps", eval_steps=2, run_record=run_record)
    return make_tiny_trainer(tok, lm, args, eval_dataset=lm["validation"].select(range(16)), **kw)


def test_every_logged_evaluation_has_perplexity_and_accuracy(tiny_lm, tiny_tokenizer, tmp_path):
    logs = _Logs()
    trainer = _trainer(tiny_lm, tiny_tokenizer, tmp_path, callbacks=[logs], compute_metrics=make_compute_metrics(),
                       preprocess_logits_for_metrics=preprocess_logits_for_metrics)
    trainer.train()
    final = trainer.evaluate()
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert [e["step"] for e in evals] == [2, 4, 4]  # two during training, then the final evaluate()
    for e in evals:
        assert e["eval_perplexity"] == math.exp(e["eval_loss"])
        assert 0.0 < e["eval_next_token_accuracy"] < 1.0
    assert evals[0]["eval_loss"] != evals[1]["eval_loss"]  # two evaluations of different weights
    seen = [e for e in logs.logs if "eval_loss" in e]  # the logs every callback (a reporter) receives
    assert len(seen) == 3
    for key in ("eval_loss", "eval_perplexity", "eval_next_token_accuracy"):
        assert [e[key] for e in seen] == [e[key] for e in evals]
        assert final[key] == evals[-1][key] == evals[1][key]  # evaluate() returns what it logged; same weights
    # metrics.json, written at the end of train(): the training-time evaluations with their perplexity
    history = json.loads((tmp_path / "metrics.json").read_text())["history"]
    written = [e for e in history if "eval_loss" in e]
    assert [(e["step"], e["eval_perplexity"], e["eval_next_token_accuracy"]) for e in written] == [
        (e["step"], e["eval_perplexity"], e["eval_next_token_accuracy"]) for e in evals[:2]]


def test_without_run_record_the_logs_are_the_trainers(tiny_lm, tiny_tokenizer, tmp_path):
    trainer = _trainer(tiny_lm, tiny_tokenizer, tmp_path, run_record=False)
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    assert len(evals) == 2 and not any("eval_perplexity" in e for e in evals)


def test_compute_metrics_alone_equals_with_preprocessing(tiny_lm, tiny_tokenizer, tmp_path):
    alone = _trainer(tiny_lm, tiny_tokenizer, tmp_path / "a", compute_metrics=make_compute_metrics())
    paired = _trainer(tiny_lm, tiny_tokenizer, tmp_path / "b", compute_metrics=make_compute_metrics(),
                      preprocess_logits_for_metrics=preprocess_logits_for_metrics)
    a, b = alone.evaluate(), paired.evaluate()
    assert a["eval_next_token_accuracy"] == b["eval_next_token_accuracy"]
    assert a["eval_perplexity"] == b["eval_perplexity"] == math.exp(a["eval_loss"])


def test_compute_metrics_on_logits_and_on_ids():
    compute = make_compute_metrics()
    labels = np.array([[5, 1, 2, -100], [5, 3, 3, 0]])
    ids = np.array([[1, 2, 9, 9], [3, 0, 0, 7]])  # position i predicts token i + 1: 2 of 2 and 2 of 3 scored right
    logits = np.eye(10)[ids]  # one-hot: arg-max gives ids back
    assert compute(EvalPrediction(predictions=ids, label_ids=labels)) == {"next_token_accuracy": 4 / 5}
    assert compute(EvalPrediction(predictions=(logits,), label_ids=labels)) == {"next_token_accuracy": 4 / 5}


def test_compute_metrics_refuses_predictions_that_do_not_line_up():
    compute = make_compute_metrics()
    with pytest.raises(ValueError) as err:  # e.g. one value per sequence, not per position
        compute(EvalPrediction(predictions=np.zeros((2,)), label_ids=np.zeros((2, 4), dtype=int)))
    message = str(err.value)
    assert "\n" not in message and "preprocess_logits_for_metrics" in message and "(2,)" in message
