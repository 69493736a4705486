"""hf_fasttrain: drop-in speed-ups for language-model training with the Hugging Face Trainer.

The public names below load on first use (PEP 562), so ``import hf_fasttrain`` and the command line's
``--help`` and refusals do not pay for importing torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> submodule that defines it
_LAZY = {
    # the trainer and its config
    "FastTrainer": ".trainer",
    "FastTrainingArguments": ".args",
    "ModelArguments": ".args",
    "DataArguments": ".args",
    # parts for any transformers.Trainer
    "RunRecorderCallback": ".callbacks",
    "LRScheduleCallback": ".callbacks",
    "make_scheduler": ".schedules",
    "TokenProgress": ".schedules",
    "OPTIMIZERS": ".optim",
    "create_optimizer": ".optim",
    "optimizer_cls_and_kwargs_for": ".optim",
    "GradientClippingCallback": ".callbacks",
    "DivergenceGuardCallback": ".callbacks",
    "DivergenceError": ".callbacks",
    "StabilityTrainerMixin": ".callbacks",
    "SeqLenWarmupCallback": ".callbacks",
    "CurriculumCallback": ".callbacks",
    # random restart
    "RestartConfig": ".restarts",
    "RestartOrchestrator": ".restarts",
    "train_with_restarts": ".restarts",
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
    from .args import DataArguments, FastTrainingArguments, ModelArguments  # noqa: F401
    from .callbacks import (  # noqa: F401
        CurriculumCallback,
        DivergenceError,
        DivergenceGuardCallback,
        GradientClippingCallback,
        LRScheduleCallback,
        RunRecorderCallback,
        SeqLenWarmupCallback,
        StabilityTrainerMixin,
    )
    from .optim import OPTIMIZERS, create_optimizer, optimizer_cls_and_kwargs_for  # noqa: F401
    from .restarts import RestartConfig, RestartOrchestrator, train_with_restarts  # noqa: F401
    from .schedules import TokenProgress, make_scheduler  # noqa: F401
    from .trainer import FastTrainer  # noqa: F401
