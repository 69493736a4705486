"""Optimizers by name for the Hugging Face Trainer: AdamW, Lion, AdEMAMix, SOAP and Muon (+AdamW).

All run on CPU and GPU without extra packages. Pick one by name and let the registry build the
param groups (no weight decay on biases and norms; Muon only on hidden matrices):

    from hf_fasttrain.optim import create_optimizer, optimizer_cls_and_kwargs_for

    # plain transformers.Trainer, one line (lr, weight decay and run length from `args`):
    trainer = Trainer(model, args, train_dataset=ds,
                      optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for("lion", args))
    # or built up front:
    trainer = Trainer(model, args, train_dataset=ds,
                      optimizers=(create_optimizer("muon", model, lr=1e-3), None))

The Trainer's scheduler (`lr_scheduler_type`, warmup) scales every param group of the optimizer.
With FastTrainer, set `FastTrainingArguments(optimizer="lion", optimizer_kwargs={...})` instead.
"""

from .ademamix import AdEMAMix, ademamix_alpha, ademamix_beta3, slow_momentum_half_life
from .adamw import AdamW, build_adamw
from .lion import Lion
from .muon import MuonWithAdamW, conv1d_lr_multiplier
from .routing import ROUTING_RULES, muon_route_table, muon_routing
from .orthogonalize import NS_COEFFICIENTS, newton_schulz, newton_schulz_batched, ns_coefficient_schedule
from .registry import (
    OPTIMIZERS,
    OptimizerFactory,
    create_optimizer,
    decay_param_groups,
    get_optimizer_factory,
    optimizer_option_names,
)
from .spec import OPTIMIZER_NAMES, OptimizerSpec, check_optimizer_options
from .options import optimizer_cls_and_kwargs_for, parse_optimizer_kwargs, trainer_optimizer_kwargs
from .sharding import (
    SHARDING_MODES,
    check_sharding_support,
    detect_sharding,
    muon_communication_bytes,
    sharding_support,
)
from .soap import SOAP, soap_preconditioned_dims

# The public API: pick by name, or use a class directly. The other names imported above (param-group
# routing, option parsing and checking, per-optimizer helpers) are plumbing for FastTrainer and the tests;
# import them from their modules (hf_fasttrain.optim.registry, .options, .routing, .muon, .orthogonalize, .soap, .ademamix).
__all__ = [
    "OPTIMIZERS",
    "create_optimizer",
    "optimizer_cls_and_kwargs_for",
    "build_adamw",
    "AdamW",
    "AdEMAMix",
    "Lion",
    "MuonWithAdamW",
    "SOAP",
    "sharding_support",
]
