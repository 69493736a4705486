"""hf_fasttrain: drop-in speed-ups for language-model training with the Hugging Face Trainer."""

__version__ = "0.1.0"

from .args import DataArguments, FastTrainingArguments, ModelArguments  # noqa: E402
from .callbacks import RunRecorderCallback  # noqa: E402
from .restarts import RestartConfig, RestartOrchestrator, train_with_restarts  # noqa: E402
from .trainer import FastTrainer  # noqa: E402

__all__ = [
    "__version__",
    "FastTrainer",
    "FastTrainingArguments",
    "ModelArguments",
    "DataArguments",
    "RunRecorderCallback",
    "RestartConfig",
    "RestartOrchestrator",
    "train_with_restarts",
]
