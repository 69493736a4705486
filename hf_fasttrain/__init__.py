"""hf_fasttrain: drop-in speed-ups for language-model training with the Hugging Face Trainer."""

__version__ = "0.1.0"

from .args import DataArguments, FastTrainingArguments, ModelArguments  # noqa: E402
from .callbacks import (  # noqa: E402
    CurriculumCallback,
    DivergenceError,
    DivergenceGuardCallback,
    GradientClippingCallback,
    LRScheduleCallback,
    RunRecorderCallback,
    SeqLenWarmupCallback,
    StabilityTrainerMixin,
)
from .optim import OPTIMIZERS, create_optimizer, optimizer_cls_and_kwargs_for  # noqa: E402
from .restarts import RestartConfig, RestartOrchestrator, train_with_restarts  # noqa: E402
from .schedules import TokenProgress, make_scheduler  # noqa: E402
from .trainer import FastTrainer  # noqa: E402

__all__ = [
    "__version__",
    # the trainer and its config
    "FastTrainer",
    "FastTrainingArguments",
    "ModelArguments",
    "DataArguments",
    # parts for any transformers.Trainer
    "RunRecorderCallback",
    "LRScheduleCallback",
    "make_scheduler",
    "TokenProgress",
    "OPTIMIZERS",
    "create_optimizer",
    "optimizer_cls_and_kwargs_for",
    "GradientClippingCallback",
    "DivergenceGuardCallback",
    "DivergenceError",
    "StabilityTrainerMixin",
    "SeqLenWarmupCallback",
    "CurriculumCallback",
    # random restart
    "RestartConfig",
    "RestartOrchestrator",
    "train_with_restarts",
]
