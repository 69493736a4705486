"""TrainerCallbacks: each a thin layer over a plain function, usable in any transformers.Trainer."""

from .run_record import RunRecorderCallback, plot_loss_curves
from .stop_at_step import StopAtStepCallback

__all__ = ["RunRecorderCallback", "plot_loss_curves", "StopAtStepCallback"]
