"""TrainerCallbacks: each a thin layer over a plain function, usable in any transformers.Trainer."""

from .run_record import RunRecorderCallback, plot_loss_curves
from .seqlen import CurriculumCallback, SeqLenWarmupCallback, apply_batch_sampler, apply_seq_len_warmup

__all__ = [
    "RunRecorderCallback",
    "plot_loss_curves",
    "SeqLenWarmupCallback",
    "CurriculumCallback",
    "apply_batch_sampler",
    "apply_seq_len_warmup",
]
