"""Random restart: train N seeds briefly, continue the best one to the end, report statistics over seeds.

A run can start from an unlucky initialisation or data order and converge slowly or not at all. Training
several seeds for a short exploration budget, keeping the best and finishing only that one buys a better
model for a small extra cost (the "random restarts" of Dodge et al., 2020, "Fine-Tuning Pretrained Language
Models: Weight Initializations, Data Orders, and Early Stopping", arXiv:2002.06305, who also show that
model initialisation and data order are separate sources of variance, hence two seeds per trial here).

Optionally the exploration is cut in rungs by successive halving (Jamieson & Talwalkar, 2016,
"Non-stochastic Best Arm Identification and Hyperparameter Optimization", arXiv:1502.07943; Li et al.,
2017, "Hyperband", arXiv:1603.06560): at each rung only the best ``keep_fraction`` of the seeds go on, and
the budget between rungs grows by ``1 / keep_fraction`` so each rung costs about the same compute.

Every exploration is an exact prefix of the full run: a trial is configured with the FULL run's
``max_steps`` (so the same LR schedule) and stopped at the rung step, where it saves a checkpoint; the next
rung, and finally the winner's continuation to ``max_steps``, resume from that checkpoint. The winner's
loss log therefore equals an uninterrupted run of that seed.

Trials are executed through a small :class:`TrialRunner` interface, so the selection and state logic here
knows nothing about the Trainer and is tested with a stub. The orchestrator's state is a JSON file in the
output directory, written atomically after every transition: killed at any moment and started again on the
same directory, it resumes without rerunning any trial recorded as finished.

Layout: ``config`` (settings), ``ranking`` (pure functions), ``state`` (typed resumable state),
``orchestrator`` (the search behind the :class:`TrialRunner` Protocol) and ``report`` form the core, which
imports nothing of the package but ``hf_fasttrain._files``. ``ray_backend`` runs each stage as a Ray task
(``restart_backend="ray"``; Ray is imported there only, when asked for). The recipe adapter (trials as recipe runs,
:func:`~hf_fasttrain.run.recipe_restarts.train_with_restarts`) is ``hf_fasttrain/run/recipe_restarts.py``, on the top floor.
"""

from .config import ARG_FIELDS, RestartConfig, restart_config_from_args
from .orchestrator import RestartOrchestrator, StageFailed, TrialResult, TrialRunner, TrialSpec, check_stage_current
from . import ranking
from .ranking import (compute_rung_steps, derive_seeds, divergence_reason, num_to_keep, planned_steps, rank_trials,
                      seed_statistics)
from .report import CURVES_PNG, SUMMARY_JSON, SUMMARY_MD, search_time_curve
from .state import STATE_FILE, StaleStageError

__all__ = [
    "RestartConfig",
    "TrialSpec",
    "TrialResult",
    "TrialRunner",
    "RestartOrchestrator",
    "StageFailed",
    "StaleStageError",
    "check_stage_current",
    *ranking.__all__,
    "search_time_curve",
    "restart_config_from_args",
    "ARG_FIELDS",
    "STATE_FILE",
    "SUMMARY_JSON",
    "SUMMARY_MD",
    "CURVES_PNG",
]
