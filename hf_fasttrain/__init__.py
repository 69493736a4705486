"""hf_fasttrain: drop-in speed-ups for language-model training with the Hugging Face Trainer.

The public API, by hand: the trainer and its config, then one entry point per technique for a plain
``transformers.Trainer``. Everything else lives in the subpackages (``hf_fasttrain.optim``,
``hf_fasttrain.callbacks``, ``hf_fasttrain.data``, ``hf_fasttrain.schedules``, ``hf_fasttrain.restarts``, ...).
"""

from ._version import __version__
from .args import DataArguments, FastTrainingArguments, ModelArguments
from .callbacks import (
    DivergenceError,
    DivergenceGuardCallback,
    GradientClippingCallback,
    LRScheduleCallback,
    RunRecorderCallback,
    apply_batch_sampler,
    apply_seq_len_warmup,
)
from .optim import optimizer_cls_and_kwargs_for
from .restarts import RestartConfig, RestartOrchestrator
from .restarts.recipe_runner import train_with_restarts
from .trainer import FastTrainer

__all__ = [
    "__version__",
    # the trainer and its config
    "FastTrainer",
    "FastTrainingArguments",
    "ModelArguments",
    "DataArguments",
    # one entry point per technique, for any transformers.Trainer
    "optimizer_cls_and_kwargs_for",  # optimizers: Trainer(..., optimizer_cls_and_kwargs=...)
    "LRScheduleCallback",  # lr schedules
    "apply_batch_sampler",  # length-grouped / token-budget / curriculum / packed batches
    "apply_seq_len_warmup",  # sequence-length warmup
    "GradientClippingCallback",  # clipping by norm, value or AGC
    "DivergenceGuardCallback",  # skip / roll back / stop on NaN and loss spikes
    "DivergenceError",
    "RunRecorderCallback",  # config, versions, loss curve and metrics in output_dir
    # random restart: a recipe (train_with_restarts) or any trainer behind a TrialRunner (RestartOrchestrator)
    "train_with_restarts",
    "RestartConfig",
    "RestartOrchestrator",
]
