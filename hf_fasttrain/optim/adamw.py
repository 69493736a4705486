"""AdamW (Loshchilov and Hutter 2019, "Decoupled Weight Decay Regularization", arXiv:1711.05101):
`torch.optim.AdamW`, with the fused kernel on CUDA and the foreach path elsewhere.

    m_t     = beta1 m + (1 - beta1) g,   v_t = beta2 v + (1 - beta2) g^2
    theta_t = theta - lr * (m_t / (1 - beta1^t) / (sqrt(v_t / (1 - beta2^t)) + eps) + lambda * theta)

Defaults: torch's lr 1e-3, betas (0.9, 0.999), eps 1e-8, and weight decay 0.1 (GPT-3, Brown et al.
2020), applied only to the decay group (`hf_fasttrain.optim.create_optimizer` builds the groups).
"""

from __future__ import annotations

from typing import Iterable, Optional

import torch

from ._common import check_betas, check_nonnegative

__all__ = ["build_adamw"]


def build_adamw(
    params: Iterable,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    fused: Optional[bool] = None,
) -> torch.optim.AdamW:
    """`torch.optim.AdamW` over `params`, fused when every param is on CUDA (or `fused=True`), else foreach.

    Example:
        >>> import torch
        >>> from hf_fasttrain.optim import build_adamw
        >>> opt = build_adamw(torch.nn.Linear(2, 4).parameters(), lr=1e-3)
        >>> opt.defaults["foreach"], opt.defaults["fused"]
        (True, None)
    """
    check_nonnegative("AdamW", "lr", lr)
    betas = check_betas("AdamW", betas, 2)
    check_nonnegative("AdamW", "eps", eps)
    check_nonnegative("AdamW", "weight_decay", weight_decay)
    groups = list(params)
    if fused is None:
        tensors = [
            p[1] if isinstance(p, tuple) else p
            for g in groups
            for p in (g["params"] if isinstance(g, dict) else [g])
        ]
        fused = bool(tensors) and all(t.is_cuda for t in tensors)
    kernel = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kernel)
