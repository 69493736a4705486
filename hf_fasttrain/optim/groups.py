"""Per-group learning rates: each parameter named by its role, a learning-rate multiplier per role.

A language model's parameters play five roles (six with a mixture of experts), and the field tunes them apart (modded-nanogpt's AdamW
baseline: embeddings at 0.7, the head at 0.004, scalars at 0.015, matrices at 0.001, weight decay on
matrices only):

- ``embedding``: the weights of every ``nn.Embedding`` and of the input embeddings (token and position
  tables); a head tied to the input embeddings is this one tensor, so it is here too.
- ``head``: the output embeddings' weight when it is its own tensor (an untied LM head).
- ``norm``: the parameters of normalisation layers (LayerNorm, RMSNorm, ...) and any other scalar or
  vector that is not a bias.
- ``bias``: the bias vectors of linear layers (the head's included).
- ``matrix``: every other tensor of two or more dimensions (attention and MLP weights, LoRA's factors,
  mixture-of-experts expert tensors).
- ``router``: the weights of mixture-of-experts routers (`hf_fasttrain.optim.routing`: one row per expert);
  their biases are ``bias``. With ``weight_decay_on="matrices"`` they do not decay.

:func:`param_roles` names each trainable parameter's role; :func:`regroup` splits an optimizer's param
groups by role, multiplies each group's lr by its role's multiplier and, with ``weight_decay_on="matrices"``,
keeps weight decay on the hidden matrices only. Every factory of the registry takes these two options
(``lr_multipliers``, ``weight_decay_on``), so they reach AdamW, Lion, AdEMAMix, SOAP and Muon (a
multiplier scales Muon's matrices through ``matrix`` and its AdamW part through the others). A schedule
multiplies each group's own base lr, so the ratios hold for the whole run.

Example:
    >>> import torch
    >>> net = torch.nn.Sequential(torch.nn.Embedding(8, 4), torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    >>> param_roles(net)
    {'0.weight': 'embedding', '1.weight': 'matrix', '1.bias': 'bias', '2.weight': 'norm', '2.bias': 'norm'}
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from torch import nn

from .._validation import ConfigError
from .routing import _router_params, _wrapped_modules

__all__ = ["ROLES", "WEIGHT_DECAY_ON", "param_roles", "check_group_options", "regroup"]

ROLES = ("embedding", "head", "norm", "bias", "matrix", "router")
# "default": the Trainer's rule (every tensor but biases and norms decays, embeddings and head included);
# "matrices": only the hidden matrices decay (modded-nanogpt's AdamW baseline)
WEIGHT_DECAY_ON = ("default", "matrices")


def _module_of(model: nn.Module, getter: str) -> Optional[nn.Module]:
    try:
        return getattr(model, getter)() if hasattr(model, getter) else None
    except NotImplementedError:  # a PreTrainedModel without that table
        return None


def _is_norm(module: nn.Module) -> bool:
    # LayerNorm, GroupNorm, BatchNorm*, LlamaRMSNorm, Qwen2RMSNorm, ...: norm layers go by their class name
    return isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.modules.batchnorm._NormBase)) or (
        "norm" in type(module).__name__.lower())


def param_roles(model: nn.Module) -> dict[str, str]:
    """The role (one of `ROLES`) of each trainable parameter of `model`, by name, in `named_parameters` order.

    Tied weights appear once, under their first name, as in `model.named_parameters()`: a head tied to the
    input embeddings is an ``embedding``. With peft, a head in `modules_to_save` is a ``head`` through its
    trainable copy. Pure: reads the model, changes nothing.
    """
    embedding: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            embedding.update(id(p) for p in module.parameters(recurse=False))
    inputs = _module_of(model, "get_input_embeddings")
    for part in _wrapped_modules(inputs) if inputs is not None else ():
        embedding.update(id(p) for p in part.parameters(recurse=False))
    head: set[int] = set()
    outputs = _module_of(model, "get_output_embeddings")
    for part in _wrapped_modules(outputs) if outputs is not None else ():
        head.update(id(p) for p in part.parameters(recurse=False) if p.ndim >= 2)
    norm = {id(p) for m in model.modules() if _is_norm(m) for p in m.parameters(recurse=False)}
    router = _router_params(model)

    roles = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        if id(p) in embedding:
            roles[name] = "embedding"
        elif id(p) in head:
            roles[name] = "head"
        elif id(p) in norm or (p.ndim <= 1 and not name.endswith("bias")):
            roles[name] = "norm"
        elif p.ndim <= 1:
            roles[name] = "bias"
        elif id(p) in router:
            roles[name] = "router"
        else:
            roles[name] = "matrix"
    return roles


def check_group_options(lr_multipliers: Optional[Mapping[str, Any]], weight_decay_on: Any) -> dict[str, float]:
    """The multipliers as ``{role: float}`` (empty for None), or a one-line `ConfigError` naming the bad entry."""
    if weight_decay_on not in WEIGHT_DECAY_ON:
        raise ConfigError("weight_decay_on", weight_decay_on, f"one of {', '.join(WEIGHT_DECAY_ON)}")
    if lr_multipliers is None:
        return {}
    if not isinstance(lr_multipliers, Mapping):
        raise ConfigError("lr_multipliers", lr_multipliers, f"a mapping of group -> multiplier, groups: {', '.join(ROLES)}")
    out = {}
    for role, value in lr_multipliers.items():
        if role not in ROLES:
            raise ConfigError("lr_multipliers", role, f"groups: {', '.join(ROLES)}", problem=f"unknown group {role!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
            raise ConfigError(f"lr_multipliers.{role}", value, "a finite number > 0")
        out[role] = float(value)
    return out


def regroup(groups: list[dict], model: nn.Module, lr: float, lr_multipliers: Optional[Mapping[str, Any]] = None,
            weight_decay_on: str = "default") -> list[dict]:
    """`groups` (param groups whose ``params`` are ``(name, tensor)`` pairs) split by role where the options ask.

    With no multiplier and ``weight_decay_on="default"`` the groups are returned as they are. Otherwise each
    group is split into one group per role it holds (in `ROLES` order), each carrying ``lr_group`` (its role),
    ``lr`` = the group's lr (``lr`` where it has none) x the role's multiplier (1 where none is given) and, with
    ``weight_decay_on="matrices"``, a weight decay of 0 unless the role is ``matrix``. A group's other keys
    (``use_muon``, its weight decay) are kept.
    """
    multipliers = check_group_options(lr_multipliers, weight_decay_on)
    if not multipliers and weight_decay_on == "default":
        return groups
    roles = param_roles(model)
    out = []
    for group in groups:
        by_role: dict[str, list] = {}
        for name, p in group["params"]:
            by_role.setdefault(roles.get(name, "matrix"), []).append((name, p))
        for role in ROLES:
            if role not in by_role:
                continue
            new = {**group, "params": by_role[role], "lr_group": role,
                   "lr": group.get("lr", lr) * multipliers.get(role, 1.0)}
            if weight_decay_on == "matrices" and role != "matrix":
                new["weight_decay"] = 0.0
            out.append(new)
    return out
