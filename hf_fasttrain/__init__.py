"""hf_fasttrain: drop-in speed-ups for language-model training with the Hugging Face Trainer.

The public API, by hand: the trainer and its config, then one entry point per technique for a plain
``transformers.Trainer``. Everything else lives in the subpackages (``hf_fasttrain.optim``,
``hf_fasttrain.callbacks``, ``hf_fasttrain.data``, ``hf_fasttrain.schedules``, ``hf_fasttrain.restarts``, ...).

The public names load on first use (PEP 562), so ``import hf_fasttrain`` and the command line's ``--help``
and refusals do not pay for importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

# public name -> submodule that defines it
_LAZY = {
    # the trainer and its config
    "FastTrainer": ".trainer",
    "FastTrainingArguments": ".config.args",
    "ModelArguments": ".config.model_data_args",
    "DataArguments": ".config.model_data_args",
    # one entry point per technique, for any transformers.Trainer
    "optimizer_cls_and_kwargs_for": ".optim",  # optimizers: Trainer(..., optimizer_cls_and_kwargs=...)
    "LRScheduleCallback": ".callbacks",  # lr schedules
    "apply_batch_sampler": ".callbacks",  # length-grouped / token-budget / curriculum / packed batches
    "apply_seq_len_warmup": ".callbacks",  # sequence-length warmup
    "GradientClippingCallback": ".callbacks",  # clipping by norm, value or AGC
    "DivergenceGuardCallback": ".callbacks",  # skip / roll back / stop on NaN and loss spikes
    "DivergenceError": ".callbacks",
    "StabilityTrainerMixin": ".callbacks",  # judges the pre-clip gradient norm in any Trainer subclass
    "RunRecorderCallback": ".callbacks",  # config, versions, loss curve and metrics in output_dir
    "WeightAveragingCallback": ".callbacks",  # EMA or LAWA of the weights, evaluated and saved as the model
    "GracefulStopCallback": ".callbacks",  # SIGTERM / Ctrl-C: finish the step, save, exit 143 / 130
    # hyperparameter transfer (muP): the model side of optimizer_kwargs parameterization 'mup'
    "apply_mup": ".transfer",  # the head's 1/m output multiplier
    "mup_init_": ".transfer",  # hidden matrices re-drawn at sigma / sqrt(m)
    # random restart: a recipe (train_with_restarts) or any trainer behind a TrialRunner (RestartOrchestrator)
    "train_with_restarts": ".run.recipe_restarts",
    "RestartConfig": ".restarts",
    "RestartOrchestrator": ".restarts",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_fasttrain' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


if TYPE_CHECKING:  # for type checkers and IDEs: the eager imports
    from .config.args import FastTrainingArguments  # noqa: F401
    from .callbacks import (  # noqa: F401
        DivergenceError,
        DivergenceGuardCallback,
        GracefulStopCallback,
        GradientClippingCallback,
        LRScheduleCallback,
        RunRecorderCallback,
        StabilityTrainerMixin,
        WeightAveragingCallback,
        apply_batch_sampler,
        apply_seq_len_warmup,
    )
    from .config.model_data_args import DataArguments, ModelArguments  # noqa: F401
    from .optim import optimizer_cls_and_kwargs_for  # noqa: F401
    from .restarts import RestartConfig, RestartOrchestrator  # noqa: F401
    from .run.recipe_restarts import train_with_restarts  # noqa: F401
    from .trainer import FastTrainer  # noqa: F401
    from .transfer import apply_mup, mup_init_  # noqa: F401
