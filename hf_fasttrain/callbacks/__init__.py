"""TrainerCallbacks: each a thin layer over a plain function, usable in any transformers.Trainer."""

from .run_record import RunRecorderCallback, plot_loss_curves
from .stability import DivergenceError, DivergenceGuardCallback, GradientClippingCallback, StabilityTrainerMixin

__all__ = [
    "RunRecorderCallback",
    "plot_loss_curves",
    "GradientClippingCallback",
    "DivergenceGuardCallback",
    "DivergenceError",
    "StabilityTrainerMixin",
]
