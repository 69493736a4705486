"""Training stability for the Hugging Face Trainer (kept for imports of earlier versions).

The parts live in :mod:`hf_fasttrain.callbacks.clipping` (gradient clipping callback),
:mod:`hf_fasttrain.callbacks.guard` (divergence guard callback), :mod:`hf_fasttrain.callbacks.mixin`
(the Trainer mixin and shared helpers), :mod:`hf_fasttrain.stability.guard` (the pure decision) and
:mod:`hf_fasttrain.stability.snapshots` (snapshots, checkpoint reading, disk space).
"""

from ..stability.clipping import CLIP_MODES
from ..stability.guard import ROLLBACK_MODES, GuardConfig, detect_spike, guard_decision
from ..stability.snapshots import TrainingSnapshot, load_checkpoint_state, restore_snapshot, take_snapshot
from .clipping import ClipStatsWindow, GradientClippingCallback
from .guard import DivergenceError, DivergenceGuardCallback, stability_callbacks
from .mixin import StabilityTrainerMixin, ensure_unscaled, merge_log_stats, report_grad_norm, report_loss

__all__ = [
    "GradientClippingCallback",
    "DivergenceGuardCallback",
    "DivergenceError",
    "StabilityTrainerMixin",
    "ClipStatsWindow",
    "stability_callbacks",
    "GuardConfig",
    "guard_decision",
    "TrainingSnapshot",
    "take_snapshot",
    "restore_snapshot",
    "load_checkpoint_state",
    "detect_spike",
    "ensure_unscaled",
    "report_loss",
    "report_grad_norm",
    "merge_log_stats",
    "CLIP_MODES",
    "ROLLBACK_MODES",
]
