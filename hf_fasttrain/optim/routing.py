"""Which optimizer trains each parameter of a model under Muon: the hidden matrices on Muon, the rest on AdamW.

`muon_route_table` gives every parameter's route and the rule of `ROUTING_RULES` that decided it;
`muon_routing` gives the routes, with one warning for parameters no rule recognises; `expert_param_groups`
and `conv1d_lr_multiplier` turn routes into Muon's param groups and their lr. The mixture-of-experts
layouts the rules read are in `hf_fasttrain.optim.experts`.

Example:
    >>> import torch
    >>> muon_route_table(torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4)))["0.bias"]
    ('adamw', 'vector')
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Optional, Sequence

from torch import nn

from .experts import ExpertLayout, block_of, expert_layouts, moe_blocks, unknown_expert_modules

__all__ = ["ROUTING_RULES", "conv1d_lr_multiplier", "expert_param_groups", "muon_route_table", "muon_routing",
           "router_params", "wrapped_modules", "HYPERBALL_EXPERTS", "conv1d_type"]


def conv1d_type():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers is a dependency; this only keeps the module importable alone
        return ()
    return (Conv1D,)


def wrapped_modules(module: nn.Module) -> list[nn.Module]:
    """`module`, and for a peft `ModulesToSaveWrapper` also the module it wraps and its trainable copies.

    Detected by duck typing (a `modules_to_save` ModuleDict and an `original_module`), so peft is not
    imported here: `get_output_embeddings()` of a model with `modules_to_save=["lm_head"]` returns the
    wrapper, which holds no parameter itself; the head being trained is `modules_to_save["default"]`.
    """
    copies = getattr(module, "modules_to_save", None)
    original = getattr(module, "original_module", None)
    if isinstance(copies, nn.ModuleDict) and isinstance(original, nn.Module):
        return [module, original, *copies.values()]
    return [module]


# The rules of `muon_route_table`, in the order they are tried.
ROUTING_RULES = {
    "frozen": "requires_grad is False: not trained",
    "embedding": "input embedding or output head (tied or not): AdamW",
    "pattern": "matches one of adamw_patterns: AdamW",
    "vector": "1-D, or a matrix with one row or column (biases, norms, scalar gates): AdamW",
    "experts": "expert tensor of a mixture-of-experts module (3-D, or DBRX's 2-D): each expert's matrix on Muon",
    "expert vector": "2-D tensor in a mixture-of-experts module (per-expert biases or norms): AdamW",
    "router": "router of a mixture-of-experts block (one row per expert): AdamW",
    "unknown experts": "tensor of a module that looks like experts in a layout no rule knows: AdamW, its class "
                       "named in a warning",
    "matrix": "2-D weight of nn.Linear or transformers Conv1D: Muon",
    "unrecognised": "no rule recognises it: AdamW, named in a warning",
}


def router_params(model: nn.Module) -> set[int]:
    """ids of the router weights of every mixture-of-experts block (`hf_fasttrain.optim.experts.moe_blocks`).

    A router is a module of the block outside its experts, on a path named "gate" or "router" (or of a class
    so named), whose weight has a row per expert (at least): Mixtral's `gate` (a `TopKRouter` or, in older layouts,
    an `nn.Linear`), GPT-OSS's `router`, Hunyuan's `gate.wg`. A shared expert's `gate_proj` is not one.
    """
    routers: set[int] = set()
    for _, block, experts, count in moe_blocks(model):
        routers.update(_routers_in(block, experts, count))
    for module in model.modules():  # Doge's CDMoE: experts as embedding tables, scored by its `router_gate`
        if type(module).__name__.lower().endswith("cdmoe"):
            routers.update(id(p) for name, child in module.named_children() if "router" in name
                           for p in child.parameters() if p.ndim == 2)
    return routers


def _routers_in(block: nn.Module, experts: nn.Module, count: Optional[int]) -> set[int]:
    """ids of the 2-D weights of `block` outside `experts` on a path named "gate" or "router" (or of a class so
    named), not in a shared expert, with at least `count` rows (any number for None): one row per expert, and
    more with null experts (LongCat-Flash, Zaya) or shared ones scored too (Inkling); a router that is an MLP
    (Zaya) is a router in all its layers."""
    inside = {id(p) for p in experts.parameters()}
    found = set()
    for path, module in block.named_modules():
        names = path.split(".") if path else []
        kind = type(module).__name__.lower()
        if not (set(names) & {"gate", "router"} or "router" in kind or kind.endswith("gate")):
            continue
        if any("shared" in n for n in names):
            continue
        for p in module.parameters(recurse=False):
            if id(p) not in inside and p.ndim == 2 and (count is None or p.shape[0] >= count):
                found.add(id(p))
    return found


def _unknown_experts(model: nn.Module) -> tuple[dict[int, str], set[int]]:
    """({id: class name} of the >= 2-D tensors of modules that look like experts in a layout no rule knows
    (`hf_fasttrain.optim.experts.unknown_expert_modules`), ids of the routers beside them)."""
    tensors: dict[int, str] = {}
    routers: set[int] = set()
    modules = dict(model.named_modules())
    for name, module in unknown_expert_modules(model):
        tensors.update({id(p): type(module).__name__ for p in module.parameters(recurse=False) if p.ndim >= 2})
        if name:
            routers.update(_routers_in(modules[block_of(modules, name)], module, None))
    return tensors, routers


def muon_route_table(model: nn.Module, adamw_patterns: Sequence[str] = ()) -> dict[str, tuple[str, str]]:
    """{name: (route, rule)} for every parameter of `model`: route "muon", "muon_experts" or "adamw"
    (None for a frozen one), and the rule of `ROUTING_RULES` that decided it (the first that applies).
    `muon_routing` is this table's routes, with a warning for the unrecognised parameters."""
    embeddings: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            embeddings.update(id(p) for p in module.parameters(recurse=False))
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        try:
            module = getattr(model, getter)() if hasattr(model, getter) else None
        except NotImplementedError:
            module = None
        for part in wrapped_modules(module) if module is not None else ():
            embeddings.update(id(p) for p in part.parameters(recurse=False))

    hidden_types = (nn.Linear, *conv1d_type())
    hidden = {id(m.weight) for m in model.modules() if isinstance(m, hidden_types)}
    layouts = expert_layouts(model)
    expert_modules = [m for _, _, m, _ in moe_blocks(model) if not isinstance(m, (nn.ModuleList, nn.ModuleDict))]
    expert_params = {id(p) for m in expert_modules for p in m.parameters()}  # with per-expert norms (Ergo)
    routers = router_params(model)
    unknown, unknown_routers = _unknown_experts(model)
    routers |= unknown_routers
    patterns = [re.compile(p) for p in adamw_patterns]

    table = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            table[name] = (None, "frozen")
        elif id(p) in embeddings:
            table[name] = ("adamw", "embedding")
        elif any(pat.search(name) for pat in patterns):
            table[name] = ("adamw", "pattern")
        elif p.ndim <= 1 or (p.ndim == 2 and min(p.shape) == 1):
            table[name] = ("adamw", "vector")
        elif name in layouts:
            table[name] = ("muon_experts", "experts")
        elif id(p) in expert_params and p.ndim == 2:
            table[name] = ("adamw", "expert vector")
        elif id(p) in routers:
            table[name] = ("adamw", "router")
        elif id(p) in unknown:
            table[name] = ("adamw", "unknown experts")
        elif id(p) in hidden and p.ndim == 2:
            table[name] = ("muon", "matrix")
        else:
            table[name] = ("adamw", "unrecognised")
    return table


def muon_routing(model: nn.Module, adamw_patterns: Sequence[str] = ()) -> dict[str, str]:
    """Route every trainable parameter of `model` to "muon", "muon_experts" or "adamw".

    "muon": the 2-D weight of an `nn.Linear` or transformers `Conv1D` (at least 2 rows and 2 columns)
    that is neither the input nor the output embedding (the LM head, tied or not), nor a mixture-of-experts
    router, and whose name matches none of the regexes in `adamw_patterns`. "muon_experts": an expert
    tensor of a mixture-of-experts module (`hf_fasttrain.optim.experts`), each expert's matrix on Muon.
    "adamw": embeddings, LM head, routers, biases, norms, 1-row matrices (Qwen2-MoE's `shared_expert_gate`),
    per-expert biases. Any other tensor (no rule recognises it) goes to AdamW and is named in one warning
    line; list it in `adamw_patterns` to say AdamW is meant. A module that looks like experts in a layout no
    rule knows (`hf_fasttrain.optim.experts.unknown_expert_modules`) is named by its class in one warning line:
    its tensors and the routers beside it go to AdamW. `muon_route_table` gives the rule of each.
    Tied weights appear once, under their first name (as in `model.named_parameters()`).

    With peft, an embedding or head listed in `modules_to_save` is routed by what it wraps: its
    trainable copy (`...lm_head.modules_to_save.default.weight`) goes to AdamW like the head itself.
    LoRA's `lora_A` / `lora_B` are `nn.Linear` weights of the hidden layers and go to Muon.

    Example:
        >>> import torch
        >>> from hf_fasttrain.optim import muon_routing
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4))
        >>> muon_routing(net)
        {'0.weight': 'muon', '0.bias': 'adamw', '1.weight': 'adamw', '1.bias': 'adamw'}
    """
    table = muon_route_table(model, adamw_patterns)
    named = dict(model.named_parameters())
    unknown_experts, unknown_routers = _unknown_experts(model)
    odd = [name for name, (_, rule) in table.items() if rule == "unknown experts"]
    if odd:
        kinds = sorted({unknown_experts[id(named[name])] for name in odd})
        experts = [f"{name} {tuple(named[name].shape)}" for name in odd]
        routers = [name for name, (_, rule) in table.items() if rule == "router" and id(named[name]) in unknown_routers]
        beside = f"; the routers beside them on AdamW: {', '.join(routers)}" if routers else ""
        warnings.warn(f"Muon: {', '.join(kinds)} hold(s) mixture-of-experts weights in a layout no routing rule knows, "
                      f"trained with AdamW: {', '.join(experts)}{beside}; list them in adamw_patterns if AdamW is "
                      "meant", UserWarning, stacklevel=2)
    unknown = [f"{name} {tuple(named[name].shape)}" for name, (_, rule) in table.items() if rule == "unrecognised"]
    if unknown:
        warnings.warn(f"Muon: no routing rule recognises {len(unknown)} parameter(s), trained with AdamW: "
                      f"{', '.join(unknown)}; list them in adamw_patterns if AdamW is meant", UserWarning, stacklevel=2)
    return {name: route for name, (route, _) in table.items() if route is not None}


HYPERBALL_EXPERTS = ("Muon: hyperball does not support mixture-of-experts tensors; use hyperball=False, or "
                      "adamw_patterns=['experts'] to train the experts with AdamW")

def expert_param_groups(model: nn.Module, routing: dict[str, str], lr: float, weight_decay: float,
                        hyperball: bool = False) -> list[dict]:
    """Muon param groups for the "muon_experts" tensors of `routing`, one group per expert layout
    (`hf_fasttrain.optim.experts.ExpertLayout`, carried as the group keys "experts", "expert_transposed",
    "expert_gate_up" and "expert_flat"). The scale is each expert matrix's own, from its (out, in) shape, so no lr
    multiplier is needed in either layout. Hyperball is refused in one line."""
    named = dict(model.named_parameters())
    layouts = expert_layouts(model)
    by_layout: dict[ExpertLayout, list] = {}
    for name, route in routing.items():
        if route == "muon_experts":
            if hyperball:
                raise ValueError(HYPERBALL_EXPERTS)
            by_layout.setdefault(layouts[name], []).append((name, named[name]))
    return [{"params": params, "use_muon": True, "lr": lr, "weight_decay": weight_decay, **layout.group_keys()}
            for layout, params in by_layout.items()]


def conv1d_lr_multiplier(shape: Sequence[int], adjust_lr_fn: str) -> float:
    """Factor that turns torch Muon's scale for a `Conv1D` weight (in x out) into the intended one.

    torch scales by sqrt(max(1, A / B)) from the stored shape (A, B); for a weight stored as
    (in, out) the intended "original" scale is sqrt(max(1, out / in)). "spectral" computes sqrt(A / B), which
    for (in, out) is sqrt(in / out) where sqrt(out / in) is meant: the factor is out / in. "match_rms_adamw" is
    symmetric in A and B, so its factor is 1.
    """
    fan_in, fan_out = shape[0], shape[1]
    if adjust_lr_fn == "spectral":
        return fan_out / fan_in
    if adjust_lr_fn != "original":
        return 1.0
    return math.sqrt(max(1.0, fan_out / fan_in)) / math.sqrt(max(1.0, fan_in / fan_out))
