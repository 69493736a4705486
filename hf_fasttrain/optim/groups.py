"""Per-group learning rates: each parameter named by its role, a learning-rate multiplier per role.

A language model's parameters play five roles (six with a mixture of experts), and the field tunes them apart (modded-nanogpt's AdamW
baseline: embeddings at 0.7, the head at 0.004, scalars at 0.015, matrices at 0.001, weight decay on
matrices only):

- ``embedding``: the weights of every ``nn.Embedding`` and of the input embeddings (token and position
  tables); a head tied to the input embeddings is this one tensor, so it is here too.
- ``head``: the output embeddings' weight when it is its own tensor (an untied LM head).
- ``norm``: the parameters of normalisation layers (LayerNorm, RMSNorm, ...) and any other scalar or
  vector that is not a bias.
- ``bias``: the bias vectors of linear layers (the head's included), and per-expert biases stored as one 2-D
  tensor (GPT-OSS's ``gate_up_proj_bias``: one row per expert).
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

The same split carries a width parameterization (``parameterization="mup"`` with a ``base_width``; every factory
takes it): with m = the model's width / ``base_width`` (:func:`width_multiplier`), the ``matrix`` groups of an
Adam-like optimizer (AdamW, Lion, AdEMAMix, SOAP and Muon's AdamW part) get lr / m, weight decay x m (so lr x wd,
the decay's timescale, stays) and Adam's eps / m; embeddings, the head, norms and biases keep theirs. That is
muP's rule for Adam (Yang et al. 2022, "Tensor Programs V", arXiv:2203.03466: hidden weights' lr 1/fan_in,
input and output weights' lr constant once the output is multiplied by 1/m); eps must shrink with the gradients
it is added to, or it swamps them at width (Everett et al. 2024, arXiv:2407.05872). Muon's own matrices keep their lr: their scale is the
spectral one instead (``adjust_lr_fn="spectral"``, `hf_fasttrain.optim.muon`). The output multiplier 1/m is a
forward hook on the head, installed by `hf_fasttrain.transfer.apply_mup`; a factory refuses to build muP
groups for a model without it. Lr multipliers multiply on top.

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

from ..validation import ConfigError
from .experts import expert_layouts, moe_blocks
from .routing import router_params, wrapped_modules

__all__ = ["ROLES", "WEIGHT_DECAY_ON", "PARAMETERIZATIONS", "WIDTH_FIELDS", "param_roles", "check_group_options",
           "check_parameterization", "model_width", "model_depth", "width_multiplier", "output_multiplier",
           "regroup"]

ROLES = ("embedding", "head", "norm", "bias", "matrix", "router")
# "default": the Trainer's rule (every tensor but biases and norms decays, embeddings and head included);
# "matrices": only the hidden matrices decay (modded-nanogpt's AdamW baseline)
WEIGHT_DECAY_ON = ("default", "matrices")
# "standard": the model as built, every group at its lr; "mup": muP by width (see the module's docstring)
PARAMETERIZATIONS = ("standard", "mup")
# where a model's width is read from its config, in this order (GPT-2's n_embd, T5's d_model)
WIDTH_FIELDS = ("hidden_size", "n_embd", "d_model")
DEPTH_FIELDS = ("num_hidden_layers", "n_layer", "num_layers")
# the attribute of an output head that carries its output multiplier's width multiplier m (set by
# hf_fasttrain.transfer.apply_mup, read here so the optimizer side and the model side agree)
OUTPUT_MULTIPLIER_ATTR = "_hf_fasttrain_mup_width_multiplier"


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
    for part in wrapped_modules(inputs) if inputs is not None else ():
        embedding.update(id(p) for p in part.parameters(recurse=False))
    head: set[int] = set()
    outputs = _module_of(model, "get_output_embeddings")
    for part in wrapped_modules(outputs) if outputs is not None else ():
        head.update(id(p) for p in part.parameters(recurse=False) if p.ndim >= 2)
    norm = {id(p) for m in model.modules() if _is_norm(m) for p in m.parameters(recurse=False)}
    router = router_params(model)
    # per-expert vectors stored as one 2-D tensor (GPT-OSS's gate_up_proj_bias: experts x width): a bias or a
    # norm per expert, not a matrix (Muon's routing sends them to AdamW by the same rule)
    layouts = expert_layouts(model)
    expert_vectors = {id(p) for _, _, m, _ in moe_blocks(model) if not isinstance(m, (nn.ModuleList, nn.ModuleDict))
                      for n, p in m.named_parameters() if p.ndim == 2}
    expert_vectors -= {id(p) for name, p in model.named_parameters() if name in layouts}

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
        elif p.ndim <= 1 or (id(p) in expert_vectors and name.endswith("bias")):
            roles[name] = "bias"
        elif id(p) in expert_vectors:
            roles[name] = "norm"
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


def _positive(field: str, value: Any, integer: bool = False) -> None:
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not math.isfinite(value) or value <= 0:
        raise ConfigError(field, value, "an integer > 0" if integer else "a finite number > 0")


def check_parameterization(parameterization: Any, base_width: Any = None, width: Any = None, base_depth: Any = None,
                           base_head_dim: Any = None) -> None:
    """A one-line `ConfigError` for a bad parameterization option, on the values alone (no model).

    ``parameterization`` is one of `PARAMETERIZATIONS`; ``"mup"`` needs ``base_width`` (a number > 0, the width
    whose settings are the base ones); ``width`` (> 0) replaces the width read from the model's config;
    ``base_depth`` (an integer > 0) turns on the depth rule, ``base_head_dim`` (an integer > 0) has the model's head
    size checked (`hf_fasttrain.transfer`). Under ``"standard"`` none of them may be set: they would do nothing.
    """
    if parameterization not in PARAMETERIZATIONS:
        raise ConfigError("parameterization", parameterization, f"one of {', '.join(PARAMETERIZATIONS)}")
    given = {"base_width": base_width, "width": width, "base_depth": base_depth, "base_head_dim": base_head_dim}
    if parameterization == "standard":
        for field, value in given.items():
            if value is not None:
                raise ConfigError(field, value, "only with parameterization 'mup' (leave it unset for 'standard')")
        return
    if base_width is None:
        raise ConfigError("base_width", allowed="the width the settings were tuned at, e.g. 64, with parameterization "
                                                "'mup'")
    _positive("base_width", base_width)
    if width is not None:
        _positive("width", width)
    if base_depth is not None:
        _positive("base_depth", base_depth, integer=True)
    if base_head_dim is not None:
        _positive("base_head_dim", base_head_dim, integer=True)


def _text_config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None and isinstance(getattr(model, "module", None), nn.Module):  # DDP / FSDP1 wrappers
        config = getattr(model.module, "config", None)
    getter = getattr(config, "get_text_config", None)
    if callable(getter):
        try:
            return getter()
        except (AttributeError, ValueError):
            return config
    return config


def _config_int(model: nn.Module, fields: tuple[str, ...]) -> Optional[int]:
    config = _text_config(model)
    for field in fields:
        value = getattr(config, field, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def model_width(model: nn.Module) -> Optional[int]:
    """The model's width: the first of `WIDTH_FIELDS` its config (the text config of a multimodal one) holds, or
    None. Works through a peft wrapper, whose ``config`` is the base's."""
    return _config_int(model, WIDTH_FIELDS)


def model_depth(model: nn.Module) -> Optional[int]:
    """The model's number of blocks (``num_hidden_layers``, ``n_layer`` or ``num_layers`` of its config), or None."""
    return _config_int(model, DEPTH_FIELDS)


def width_multiplier(model: nn.Module, base_width: float, width: Optional[float] = None) -> float:
    """m = the model's width (``width`` if given, else `model_width`) / ``base_width``; a one-line `ConfigError`
    when the width cannot be read.

    Example:
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> width_multiplier(GPT2LMHeadModel(GPT2Config(n_embd=128, n_head=4, n_layer=1)), base_width=64)
        2.0
    """
    _positive("base_width", base_width)
    if width is None:
        width = model_width(model)
        if width is None:
            raise ConfigError("width", type(model).__name__, f"give width=<the model's width>: its config holds none "
                              f"of {', '.join(WIDTH_FIELDS)}", problem=f"cannot read the width of {type(model).__name__}")
    _positive("width", width)
    return float(width) / float(base_width)


def output_multiplier(model: nn.Module) -> Optional[float]:
    """The width multiplier m whose 1/m the model's output head applies (`hf_fasttrain.transfer.apply_mup`), or
    None when no output multiplier is installed."""
    head = _module_of(model, "get_output_embeddings")
    if head is not None:
        return getattr(head, OUTPUT_MULTIPLIER_ATTR, None)
    for module in model.modules():  # a wrapper (DDP, FSDP1) without get_output_embeddings: the head inside it
        if hasattr(module, OUTPUT_MULTIPLIER_ATTR):
            return getattr(module, OUTPUT_MULTIPLIER_ATTR)
    return None


def _check_output_multiplier(model: nn.Module, m: float, base_width: float) -> None:
    have = output_multiplier(model)
    if have is None or not math.isclose(have, m, rel_tol=1e-9):
        got = "none" if have is None else f"1/{have:g}"
        raise ConfigError("parameterization", "mup", f"call hf_fasttrain.apply_mup(model, base_width={base_width:g}) "
                          "before building the optimizer (FastTrainer does it for you)",
                          problem=f"the model's output head has {got} output multiplier, muP with width multiplier "
                                  f"{m:g} needs 1/{m:g}")


def regroup(groups: list[dict], model: nn.Module, lr: float, lr_multipliers: Optional[Mapping[str, Any]] = None,
            weight_decay_on: str = "default", parameterization: str = "standard", base_width: Optional[float] = None,
            width: Optional[float] = None, eps: Optional[float] = None) -> list[dict]:
    """`groups` (param groups whose ``params`` are ``(name, tensor)`` pairs) split by role where the options ask.

    With no multiplier and ``weight_decay_on="default"`` the groups are returned as they are. Otherwise each
    group is split into one group per role it holds (in `ROLES` order), each carrying ``lr_group`` (its role),
    ``lr`` = the group's lr (``lr`` where it has none) x the role's multiplier (1 where none is given) and, with
    ``weight_decay_on="matrices"``, a weight decay of 0 unless the role is ``matrix``. A group's other keys
    (``use_muon``, its weight decay) are kept.

    With ``parameterization="mup"`` (m = `width_multiplier`): each ``matrix`` group not on Muon (``use_muon`` not
    True) gets lr / m, weight decay x m and, where `eps` (the optimizer's Adam eps) is given, ``eps`` = eps / m;
    every group records ``width_multiplier`` = m. The model's head must carry the output multiplier 1/m
    (`hf_fasttrain.transfer.apply_mup`), else a one-line `ConfigError`.
    """
    multipliers = check_group_options(lr_multipliers, weight_decay_on)
    check_parameterization(parameterization, base_width, width)
    mup = parameterization == "mup"
    if not multipliers and weight_decay_on == "default" and not mup:
        return groups
    m = 1.0
    if mup:
        m = width_multiplier(model, base_width, width)
        _check_output_multiplier(model, m, base_width)
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
            if mup:
                new["width_multiplier"] = m
                if role == "matrix" and group.get("use_muon") is not True:  # muP's Adam rule for hidden matrices
                    new["lr"] /= m
                    if "weight_decay" in new:
                        new["weight_decay"] *= m
                    if eps is not None:
                        new["eps"] = eps / m
            out.append(new)
    return out
