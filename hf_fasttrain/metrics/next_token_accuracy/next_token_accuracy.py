"""Next-token accuracy: the share of target tokens that the model's arg-max prediction gets right.

An ``evaluate`` metric module shipped with hf_fasttrain, so ``evaluate.load`` reads it from disk
and never contacts the Hub. Inputs are flat sequences of token ids: predictions already shifted to
line up with their targets, and ignored positions (label -100) already removed.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Fraction of positions where the predicted next token equals the reference token."
_KWARGS_DESCRIPTION = """
Args:
    predictions (list of int): predicted token ids, one per scored position.
    references (list of int): target token ids, same length.
Returns:
    next_token_accuracy (float): mean of predictions == references, in [0, 1].
Example:
    >>> metric = evaluate.load("path/to/next_token_accuracy")
    >>> metric.compute(predictions=[1, 2, 3, 4], references=[1, 2, 0, 4])
    {'next_token_accuracy': 0.75}
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class NextTokenAccuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_KWARGS_DESCRIPTION,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references):
        if len(predictions) == 0:
            raise ValueError("next_token_accuracy needs at least one scored position, got none")
        correct = np.asarray(predictions) == np.asarray(references)
        return {"next_token_accuracy": float(correct.mean())}
