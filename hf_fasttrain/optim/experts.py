"""Mixture-of-experts weights for Muon: which tensors hold experts, and each expert's matrices.

transformers (5.x) stores the experts of a mixture-of-experts layer as 3-D parameters of one module,
decorated with `transformers.integrations.use_experts_implementation`, which records the layout on the
module (`is_transposed`, `is_concatenated`, `has_gate`):

| layout | stored shape | families (transformers 5.25) |
|---|---|---|
| `gate_up_proj`, [gate; up] | experts x 2*inter x hidden | Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, ... |
| `down_proj` | experts x hidden x inter | the same |
| transposed, gate and up interleaved | experts x hidden x 2*inter (gate = [..., ::2]) | GPT-OSS |
| `ParallelExperts.weight` (not decorated) | experts x out x in, one matrix each | JetMoE |

Older checkpoints (and custom models) keep one `nn.Linear` per expert (`experts.0.w1`), which Muon
handles as any hidden matrix.

Each expert's matrix is one Muon matrix. :func:`expert_matrices` turns a stored tensor into a stack
``[N, out, in]`` of the matrices that separate `nn.Linear` layers would hold, and :func:`expert_tensor`
turns the stack back, so one batched Newton-Schulz covers every expert of a tensor.

A fused ``gate_up_proj`` is split into its gate and up halves (N = 2 x experts): a model that stores
gate and up as two `nn.Linear` per expert (the older layout) or as `gate_proj` / `up_proj` (every dense
transformers model) gets each half orthogonalised on its own, with the scale of its own (inter, hidden)
shape, so the fused layout gets the same update as the unfused one. Orthogonalising the fused
2*inter x hidden matrix instead would couple the two halves (their singular vectors mixed) and scale
the step by sqrt(max(2*inter, hidden)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import torch
from torch import nn

__all__ = ["EXPERT_GATE_UP", "ExpertLayout", "expert_layouts", "expert_matrices", "expert_tensor", "moe_blocks"]

# how a fused gate/up tensor holds its two halves along the output axis
EXPERT_GATE_UP = ("concatenated", "interleaved")


@dataclass(frozen=True)
class ExpertLayout:
    """How a 3-D expert tensor holds its matrices (dim 0 always indexes the experts).

    Args:
        transposed: stored as experts x in x out (GPT-OSS); False: experts x out x in (as `nn.Linear`).
        gate_up: None, or how the output axis holds gate and up: "concatenated" ([gate; up]) or
            "interleaved" (gate0, up0, gate1, ...); each half is then its own matrix.
    """

    transposed: bool = False
    gate_up: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.transposed, bool):
            raise ValueError(f"Muon: expert_transposed must be True or False, got {self.transposed!r}")
        if self.gate_up is not None and self.gate_up not in EXPERT_GATE_UP:
            raise ValueError(f"Muon: expert_gate_up must be None or one of {list(EXPERT_GATE_UP)}, got {self.gate_up!r}")

    def group_keys(self) -> dict:
        """The param-group keys that carry this layout to the optimizer."""
        return {"experts": True, "expert_transposed": self.transposed, "expert_gate_up": self.gate_up}

    @classmethod
    def from_group(cls, group: dict) -> "ExpertLayout":
        return cls(bool(group.get("expert_transposed", False)), group.get("expert_gate_up"))


def expert_matrices(x: torch.Tensor, layout: ExpertLayout) -> torch.Tensor:
    """The stored 3-D tensor `x` as a stack ``[N, out, in]`` of its expert matrices (a view where possible).

    N is the number of experts, or twice it for a gate/up tensor (expert e's gate at 2e, its up at 2e + 1).

    Example:
        >>> import torch
        >>> x = torch.arange(2 * 4 * 3.0).reshape(2, 4, 3)  # 2 experts, [gate; up] of 2 rows each, 3 inputs
        >>> m = expert_matrices(x, ExpertLayout(gate_up="concatenated"))
        >>> m.shape, torch.equal(m[1], x[0, 2:]), torch.equal(expert_tensor(m, x.shape, ExpertLayout(gate_up="concatenated")), x)
        (torch.Size([4, 2, 3]), True, True)
    """
    if x.ndim != 3:
        raise ValueError(f"Muon: an expert tensor must be 3-D (experts x out x in), got shape {tuple(x.shape)}")
    if layout.transposed:
        x = x.mT  # experts x out x in
    if layout.gate_up is None:
        return x
    e, out2, inn = x.shape
    if out2 % 2:
        raise ValueError(f"Muon: a gate/up expert tensor needs an even output size, got shape {tuple(x.shape)}")
    if layout.gate_up == "concatenated":
        x = x.reshape(e, 2, out2 // 2, inn)
    else:
        x = x.reshape(e, out2 // 2, 2, inn).transpose(1, 2)
    return x.reshape(e * 2, out2 // 2, inn)


def expert_tensor(matrices: torch.Tensor, shape: torch.Size, layout: ExpertLayout) -> torch.Tensor:
    """The inverse of :func:`expert_matrices`: a stack ``[N, out, in]`` back in the stored `shape`."""
    x = matrices
    if layout.gate_up is not None:
        n, half, inn = x.shape
        x = x.reshape(n // 2, 2, half, inn)
        if layout.gate_up == "interleaved":
            x = x.transpose(1, 2)
        x = x.reshape(n // 2, 2 * half, inn)
    if layout.transposed:
        x = x.mT
    x = x.contiguous()
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"Muon: expert matrices of shape {tuple(matrices.shape)} do not make a tensor of shape "
                         f"{tuple(shape)}")
    return x


def _is_parallel_experts(module: nn.Module) -> bool:
    """JetMoE's `JetMoeParallelExperts` (and its kind): one `weight` of experts x out x in, not decorated."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("ParallelExperts") and isinstance(weight, nn.Parameter)
            and weight.ndim == 3 and getattr(module, "num_experts", None) == weight.shape[0])


def _is_experts_module(module: nn.Module) -> bool:
    """transformers' experts modules (decorated with `use_experts_implementation`) record their layout;
    JetMoE's parallel experts hold one experts x out x in `weight`."""
    if _is_parallel_experts(module):
        return True
    return isinstance(getattr(module, "is_transposed", None), bool) and any(
        p.ndim == 3 for p in module.parameters(recurse=False))


def expert_layouts(model: nn.Module) -> dict[str, ExpertLayout]:
    """{parameter name: layout} of every 3-D expert tensor of `model` (transformers' experts modules).

    `gate_up_proj` of a module with a gate is split in halves (concatenated or interleaved, as the
    module records); every other 3-D tensor of the module (`down_proj`, `up_proj`) is one matrix per
    expert. Tied or shared parameters appear once, under their first name.
    """
    layouts: dict[str, ExpertLayout] = {}
    seen: set[int] = set()
    for mod_name, module in model.named_modules():
        if not _is_experts_module(module):
            continue
        for name, p in module.named_parameters(recurse=False):
            if p.ndim != 3 or id(p) in seen:
                continue
            seen.add(id(p))
            if _is_parallel_experts(module):  # one matrix per expert (a GLU input keeps gate and up together)
                layouts[f"{mod_name}.{name}" if mod_name else name] = ExpertLayout()
                continue
            fused = name == "gate_up_proj" and getattr(module, "has_gate", True)
            gate_up = None
            if fused:
                gate_up = "concatenated" if getattr(module, "is_concatenated", True) else "interleaved"
            layouts[f"{mod_name}.{name}" if mod_name else name] = ExpertLayout(module.is_transposed, gate_up)
    return layouts


def moe_blocks(model: nn.Module) -> Iterator[tuple[str, nn.Module, nn.Module, int]]:
    """(block name, block, experts container, number of experts) for every mixture-of-experts block.

    A block is the parent of an experts container: a transformers experts module (3-D tensors, the
    experts on dim 0), or an `nn.ModuleList` named ``experts`` (one module per expert, the older layout).
    """
    for name, block in model.named_modules():
        for child_name, child in block.named_children():
            if _is_experts_module(child):
                count = next(p.shape[0] for p in child.parameters(recurse=False) if p.ndim == 3)
            elif child_name == "experts" and isinstance(child, nn.ModuleList) and len(child):
                count = len(child)
            else:
                continue
            yield name, block, child, count
