"""Hyperball: Muon's matrices kept at their initial norms, in place of weight decay.

Wen, Dang, Lyu, Ma and Liang 2025, "Fantastic Pretraining Optimizers and Where to Find Them 2.1: Hyperball
Optimization" (MuonH). In a network with normalisation layers, weight decay mostly sets the weights' norm, and
through it the size of each step relative to the weights. Hyperball fixes both directly. For each weight
vector w (a column of an ``nn.Linear`` weight: the weights leaving one input feature) with norm r at
initialisation, and Muon's orthogonalised update o of the same vector:

    w' = w - lr * s(A, B) * r * o / ||o||         # the step: its size is r * lr * s, whatever o's size
    w  = r * w' / ||w'||                          # back onto the sphere of radius r

so every step moves each vector by the same fraction ``lr * s(A, B)`` of its norm (``s`` is Muon's scale,
``hf_fasttrain.optim.muon``), and the norm never drifts. Muon's weight decay is not applied to these
matrices (the projection makes it meaningless); the AdamW part (embeddings, head, norms, biases) keeps its own.
The authors report MuonH and AdamH ahead of their weight-decay baselines on long runs.

The vector axis follows the layer, not the storage: columns of an ``nn.Linear`` weight (out x in), rows of
GPT-2's ``Conv1D`` weight (stored in x out), so both layouts of one layer get the same update. A group's
``hyperball_dim`` names the stored axis that is reduced (0 for ``nn.Linear``, 1 for ``Conv1D``).

A vector whose norm is 0 at the first step would stay 0 forever (LoRA's ``lora_B`` starts at zero), so
:func:`initial_radius` refuses it. Under FSDP2 Hyperball is refused: a column of a dim-0 shard spans ranks.

Use it as Muon with ``hyperball`` set: ``optimizer: muon`` and ``optimizer_kwargs: {hyperball: true}``.
"""

from __future__ import annotations

import torch

__all__ = ["HYPERBALL_STATE", "hyperball_step", "initial_radius"]

# the optimizer-state key of each matrix's per-vector radius (its norms at the first step)
HYPERBALL_STATE = "hyperball_radius"


def initial_radius(weight: torch.Tensor, reduce_dim: int, eps: float, name: str = "a Muon matrix") -> torch.Tensor:
    """The norm of each vector of ``weight`` along ``reduce_dim`` (fp32, kept as a broadcastable shape).

    Raises a one-line ``ValueError`` if a vector's norm is not above ``eps``: Hyperball keeps each norm as it
    was at the start, so such a vector could never move.

    Example:
        ```python
        >>> import torch
        >>> initial_radius(torch.tensor([[3.0, 0.0], [4.0, 2.0]]), 0, 1e-7).tolist()
        [[5.0, 2.0]]
        ```
    """
    radius = weight.detach().float().norm(dim=reduce_dim, keepdim=True)
    bad = int((radius <= eps).sum())
    if bad:
        raise ValueError(f"optimizer_kwargs: hyperball: {name} has {bad} vector(s) of norm 0 at the start (LoRA's "
                         "lora_B starts at zero), which Hyperball would keep at 0; route it to AdamW (adamw_patterns) "
                         "or set hyperball: false")
    return radius


def hyperball_step(param: torch.Tensor, update: torch.Tensor, radius: torch.Tensor, step: float, reduce_dim: int,
                   eps: float) -> None:
    """One Hyperball step on ``param`` in place: each vector moved by ``step`` times its radius along the
    update's direction, then put back at its radius.

    Args:
        param: the weight (any float dtype; computed in fp32 and written back).
        update: Muon's orthogonalised update, the shape of ``param``.
        radius: :func:`initial_radius` of the weight.
        step: the step as a fraction of the radius (Muon's lr times its scale s(A, B)).
        reduce_dim: the stored axis the vectors run along (0 for ``nn.Linear``, 1 for ``Conv1D``).
        eps: floor of the norms divided by (the authors clamp with Muon's eps).

    Example:
        ```python
        >>> import torch
        >>> w = torch.tensor([[1.0], [0.0]])
        >>> hyperball_step(w, torch.tensor([[0.0], [-5.0]]), torch.ones(1, 1), 1.0, 0, 1e-7)
        >>> [round(float(x), 4) for x in w.flatten()], round(float(w.norm()), 4)
        ([0.7071, 0.7071], 1.0)
        ```
    """
    u = update.float()
    u = u / u.norm(dim=reduce_dim, keepdim=True).clamp_min(eps) * radius
    w = param.float() - step * u
    w = w / w.norm(dim=reduce_dim, keepdim=True).clamp_min(eps) * radius
    param.copy_(w)
