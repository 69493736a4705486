"""Hyperparameter transfer: muP applied to a model from the outside (`hf_fasttrain.transfer.mup`) and the coordinate
check that tests it on a user's model (`hf_fasttrain.transfer.coord_check`).

The optimizer side is ``parameterization="mup"`` of every optimizer (`hf_fasttrain.optim.groups`); FastTrainer
applies the model side itself. See `hf_fasttrain.transfer.mup` for the rules and their sources.
"""

from .coord_check import DEFAULT_TOLERANCE, CoordCheckModel, CoordCheckResult, coord_check, log_log_slope
from .mup import (apply_depth_scaling, apply_mup, apply_transfer, check_config_mup, check_head_dim, model_head_dim,
                  mup_init_, remove_mup, restore_mup, transfer_options)

__all__ = ["apply_mup", "restore_mup", "mup_init_", "remove_mup", "apply_depth_scaling", "apply_transfer", "transfer_options",
           "check_config_mup", "check_head_dim", "model_head_dim", "coord_check", "CoordCheckModel",
           "CoordCheckResult", "DEFAULT_TOLERANCE", "log_log_slope"]
