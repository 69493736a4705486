"""TrainerCallbacks: each a thin layer over a plain function, usable in any transformers.Trainer."""

from .averaging import WeightAveragingCallback
from .run_record import RunRecorderCallback, plot_loss_curves
from .schedule import LRScheduleCallback
from .seqlen import (
    CurriculumCallback,
    SeqLenWarmupCallback,
    apply_batch_sampler,
    apply_seq_len_warmup,
    batch_sampler_dataloader,
)
from .clipping import GradientClippingCallback
from .guard import DivergenceError, DivergenceGuardCallback
from .mixin import StabilityTrainerMixin
from .graceful_stop import GracefulStopCallback, TrainingStopped
from .stop_at_step import StopAtStepCallback, TokenBudgetStopCallback

__all__ = [
    "RunRecorderCallback",
    "plot_loss_curves",
    "LRScheduleCallback",
    "GradientClippingCallback",
    "DivergenceGuardCallback",
    "DivergenceError",
    "StabilityTrainerMixin",
    "SeqLenWarmupCallback",
    "CurriculumCallback",
    "apply_batch_sampler",
    "apply_seq_len_warmup",
    "batch_sampler_dataloader",
    "StopAtStepCallback",
    "TokenBudgetStopCallback",
    "WeightAveragingCallback",
    "GracefulStopCallback",
    "TrainingStopped",
]
