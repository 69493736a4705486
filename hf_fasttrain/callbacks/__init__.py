"""TrainerCallbacks: each a thin layer over a plain function, usable in any transformers.Trainer."""

from .run_record import RunRecorderCallback, plot_loss_curves
from .schedule import LRScheduleCallback
from .stability import DivergenceError, DivergenceGuardCallback, GradientClippingCallback, StabilityTrainerMixin

__all__ = [
    "RunRecorderCallback",
    "plot_loss_curves",
    "LRScheduleCallback",
    "GradientClippingCallback",
    "DivergenceGuardCallback",
    "DivergenceError",
    "StabilityTrainerMixin",
]
