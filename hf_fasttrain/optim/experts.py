"""Mixture-of-experts weights for Muon: which tensors hold experts, and each expert's matrices.

transformers (5.x) stores the experts of a mixture-of-experts layer as 3-D parameters of one module,
decorated with `transformers.integrations.use_experts_implementation`, which records the layout on the
module (`is_transposed`, `is_concatenated`, `has_gate`):

| layout | stored shape | families (transformers 5.25) |
|---|---|---|
| `gate_up_proj`, [gate; up] | experts x 2*inter x hidden | Mixtral, Qwen2/3-MoE, OLMoE, DeepSeek-V2/V3, ... |
| `down_proj` | experts x hidden x inter | the same |
| transposed, gate and up interleaved | experts x hidden x 2*inter (gate = [..., ::2]) | GPT-OSS |
| `ParallelExperts.weight` (not decorated) | experts x out x in; a GLU's input is [gate; up] | JetMoE |
| `gate_up_proj` / `down_proj` (not decorated) | experts x in x out, [gate; up] along out | Llama-4 |
| `w1`, `v1`, `w2` (not decorated, 2-D) | (experts x inter) x hidden; `w2` per expert in x out | DBRX |
| shared `gate_proj`, `up_proj`, `down_proj` (not decorated) | shared experts x out x in | Inkling |

Older checkpoints (and custom models) keep one `nn.Linear` per expert (`experts.0.w1`), which Muon
handles as any hidden matrix. A module that looks like experts (its class or name says "expert" and it holds
matrices of its own) but matches none of these layouts is reported by :func:`unknown_expert_modules`.

Each expert's matrix is one Muon matrix. :func:`expert_matrices` turns a stored tensor into a stack
``[N, out, in]`` of the matrices that separate `nn.Linear` layers would hold, and :func:`expert_tensor`
turns the stack back, so one batched Newton-Schulz covers every expert of a tensor.

Every fused gate/up tensor (``gate_up_proj``, Llama-4's, JetMoE's GLU input) is split into its gate and up
halves (N = 2 x experts): a model that stores gate and up as two `nn.Linear` per expert (the older
layout) or as `gate_proj` / `up_proj` (every dense transformers model) gets each half orthogonalised on its
own, with the scale of its own (inter, hidden) shape, so the fused layout gets the same update as the unfused one. Orthogonalising the fused
2*inter x hidden matrix instead would couple the two halves (their singular vectors mixed) and scale
the step by sqrt(max(2*inter, hidden)).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional, Sequence

import torch
from torch import nn

__all__ = ["EXPERT_GATE_UP", "ExpertLayout", "expert_layouts", "expert_matrices", "expert_tensor", "expert_matrix_shape",
           "moe_blocks", "unknown_expert_modules", "block_of"]

# how a fused gate/up tensor holds its two halves along the output axis
EXPERT_GATE_UP = ("concatenated", "interleaved")


@dataclass(frozen=True)
class ExpertLayout:
    """How a 3-D expert tensor holds its matrices (dim 0 always indexes the experts).

    Args:
        transposed: stored as experts x in x out (GPT-OSS); False: experts x out x in (as `nn.Linear`).
        gate_up: None, or how the output axis holds gate and up: "concatenated" ([gate; up]) or
            "interleaved" (gate0, up0, gate1, ...); each half is then its own matrix.
        flat: 0 for a 3-D tensor; else the number of experts stacked along dim 0 of a 2-D tensor
            (DBRX: (experts x out) x in, expert e's rows at e x out ... (e + 1) x out - 1).
    """

    transposed: bool = False
    gate_up: Optional[str] = None
    flat: int = 0

    def __post_init__(self):
        if not isinstance(self.transposed, bool):
            raise ValueError(f"Muon: expert_transposed must be True or False, got {self.transposed!r}")
        if self.gate_up is not None and self.gate_up not in EXPERT_GATE_UP:
            raise ValueError(f"Muon: expert_gate_up must be None or one of {list(EXPERT_GATE_UP)}, got {self.gate_up!r}")
        if isinstance(self.flat, bool) or not isinstance(self.flat, int) or self.flat < 0:
            raise ValueError(f"Muon: expert_flat must be 0 (3-D experts) or the number of experts, got {self.flat!r}")

    @property
    def ndim(self) -> int:
        """The stored tensor's dimensions: 3, or 2 for a flat layout."""
        return 2 if self.flat else 3

    def group_keys(self) -> dict:
        """The param-group keys that carry this layout to the optimizer."""
        return {"experts": True, "expert_transposed": self.transposed, "expert_gate_up": self.gate_up,
                "expert_flat": self.flat}

    @classmethod
    def from_group(cls, group: dict) -> "ExpertLayout":
        return cls(bool(group.get("expert_transposed", False)), group.get("expert_gate_up"), group.get("expert_flat", 0))


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
    if layout.flat:
        if x.ndim != 2 or x.shape[0] % layout.flat:
            raise ValueError(f"Muon: a flat expert tensor must be 2-D with rows a multiple of its {layout.flat} "
                             f"experts, got shape {tuple(x.shape)}")
        x = x.reshape(layout.flat, x.shape[0] // layout.flat, x.shape[1])
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
    if layout.flat:
        x = x.reshape(-1, x.shape[-1])
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"Muon: expert matrices of shape {tuple(matrices.shape)} do not make a tensor of shape "
                         f"{tuple(shape)}")
    return x


def expert_matrix_shape(shape: Sequence[int], layout: ExpertLayout) -> tuple[int, int, int]:
    """``(N, out, in)`` of the stack :func:`expert_matrices` makes of a tensor of the stored `shape`."""
    if layout.flat:
        shape = (layout.flat, shape[0] // layout.flat, shape[1])
    experts, a, b = shape
    out, inn = (b, a) if layout.transposed else (a, b)
    return (2 * experts, out // 2, inn) if layout.gate_up else (experts, out, inn)


def _is_parallel_experts(module: nn.Module) -> bool:
    """JetMoE's `JetMoeParallelExperts` (and its kind): one `weight` of experts x out x in, not decorated."""
    weight = getattr(module, "weight", None)
    return (type(module).__name__.endswith("ParallelExperts") and isinstance(weight, nn.Parameter)
            and weight.ndim == 3 and getattr(module, "num_experts", None) == weight.shape[0])


def _parallel_layout(module: nn.Module, parent: Optional[nn.Module]) -> ExpertLayout:
    """JetMoE: the MoE's `input_linear` of a GLU holds [gate; up] (its output is chunked in two), which shows as an
    output twice the input of its `output_linear`; the attention experts' `input_linear` is one matrix per expert."""
    down = getattr(parent, "output_linear", None)
    fused = (parent is not None and getattr(parent, "input_linear", None) is module and _is_parallel_experts(down)
             and module.weight.shape[1] == 2 * down.weight.shape[2])
    return ExpertLayout(gate_up="concatenated" if fused else None)


def _llama4_layouts(module: nn.Module) -> dict[str, ExpertLayout]:
    # experts x in x out; the output of gate_up_proj is [gate; up] (chunk(2, dim=-1))
    return {"gate_up_proj": ExpertLayout(True, "concatenated"), "down_proj": ExpertLayout(True)}


def _dbrx_layouts(module: nn.Module) -> dict[str, ExpertLayout]:
    # (experts x inter) x hidden: w1 (gate) and v1 (up) are out x in per expert, w2 is in x out (x @ w2)
    n = getattr(module, "moe_num_experts", 0)
    if not isinstance(n, int) or n < 1:
        return {}
    return {"w1": ExpertLayout(flat=n), "v1": ExpertLayout(flat=n), "w2": ExpertLayout(True, flat=n)}


def _stacked_layouts(module: nn.Module) -> dict[str, ExpertLayout]:
    # shared experts x out x in, one matrix each (gate_proj and up_proj apart)
    return {"gate_proj": ExpertLayout(), "up_proj": ExpertLayout(), "down_proj": ExpertLayout()}


# experts modules that transformers ships without `use_experts_implementation`, by class name
_UNDECORATED = {"Llama4TextExperts": _llama4_layouts, "DbrxExpertGLU": _dbrx_layouts,
                "InklingSharedExperts": _stacked_layouts}


def _layouts_of(module: nn.Module, parent: Optional[nn.Module] = None) -> dict[str, ExpertLayout]:
    """{name of an expert tensor owned by `module`: its layout}; empty when `module` is not an experts module.

    One rule for fused gate/up tensors: wherever the layout says a tensor is [gate; up] (or interleaved), it is
    split in halves: a decorated module's `gate_up_proj` (with a gate), Llama-4's `gate_up_proj`, JetMoE's GLU
    input. Every other expert tensor is one matrix per expert.
    """
    own = dict(module.named_parameters(recurse=False))
    if _is_parallel_experts(module):
        return {"weight": _parallel_layout(module, parent)}
    known = _UNDECORATED.get(type(module).__name__)
    if known is not None:
        layouts = known(module)
        ok = layouts and all(n in own and own[n].ndim == layout.ndim for n, layout in layouts.items())
        return layouts if ok else {}
    if not isinstance(getattr(module, "is_transposed", None), bool):
        return {}
    layouts = {}
    for name, p in own.items():
        if p.ndim != 3:
            continue
        gate_up = None
        if name == "gate_up_proj" and getattr(module, "has_gate", True):
            gate_up = "concatenated" if getattr(module, "is_concatenated", True) else "interleaved"
        layouts[name] = ExpertLayout(module.is_transposed, gate_up)
    return layouts


def _expert_count(module: nn.Module, layouts: dict[str, ExpertLayout]) -> int:
    name, layout = next(iter(layouts.items()))
    return layout.flat or getattr(module, name).shape[0]


def expert_layouts(model: nn.Module) -> dict[str, ExpertLayout]:
    """{parameter name: layout} of every expert tensor of `model` (the experts modules of the table above).

    A fused gate/up tensor is split in halves (concatenated or interleaved, as the module records); every other
    expert tensor (`down_proj`, `up_proj`) is one matrix per expert. Tied or shared parameters appear once, under
    their first name.
    """
    layouts: dict[str, ExpertLayout] = {}
    seen: set[int] = set()
    modules = dict(model.named_modules())
    for mod_name, module in modules.items():
        found = _layouts_of(module, modules.get(mod_name.rpartition(".")[0]) if mod_name else None)
        for name, layout in found.items():
            p = getattr(module, name)
            if id(p) in seen:
                continue
            seen.add(id(p))
            layouts[f"{mod_name}.{name}" if mod_name else name] = layout
    return layouts


def block_of(modules: dict[str, nn.Module], name: str) -> str:
    """The block around the container at `name`: its parent, or further up while a parent holds nothing else
    (DBRX keeps its tensors in `ffn.experts.mlp`, its router in `ffn.router`)."""
    block = name.rpartition(".")[0]
    while block and len(list(modules[block].children())) == 1 and not list(modules[block].parameters(recurse=False)):
        block = block.rpartition(".")[0]
    return block


def moe_blocks(model: nn.Module) -> Iterator[tuple[str, nn.Module, nn.Module, int]]:
    """(block name, block, experts container, number of experts) for every mixture-of-experts block.

    A container is an experts module (the table above), or an `nn.ModuleList` / `nn.ModuleDict` named
    ``experts`` (one module per expert, the older layout). Its block is its parent, or the first module above
    that holds more than the container (where the router is).
    """
    modules = dict(model.named_modules())
    for name, container in modules.items():
        if not name:
            continue
        layouts = _layouts_of(container, modules[name.rpartition(".")[0]])
        if layouts:
            count = _expert_count(container, layouts)
        elif (name.rpartition(".")[2] == "experts" and isinstance(container, (nn.ModuleList, nn.ModuleDict))
              and len(container)):
            count = getattr(container, "num_experts", None)  # NLLB-MoE's ModuleDict holds a dropout too
            count = count if isinstance(count, int) and not isinstance(count, bool) else len(container)
        else:
            continue
        block = block_of(modules, name)
        yield block, modules[block], container, count


def unknown_expert_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, module) of every module that looks like experts but matches no layout of the table above.

    It looks like experts when its class name or its own name says "expert" and it holds tensors of two or more
    dimensions itself, other than an `nn.Linear`'s or `nn.Embedding`'s weight.
    """
    out = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        words = (type(module).__name__.lower(), name.rpartition(".")[2].lower())
        if not any("expert" in w for w in words) or isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        if type(module).__name__ == "Conv1D":  # transformers' Conv1D: a linear layer
            continue
        if any(p.ndim >= 2 for p in module.parameters(recurse=False)) and not _layouts_of(
                module, modules.get(name.rpartition(".")[0]) if name else None):
            out.append((name, module))
    return out
