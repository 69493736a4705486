"""AdamW (Loshchilov and Hutter 2019, "Decoupled Weight Decay Regularization", arXiv:1711.05101):
`torch.optim.AdamW`, with the fused kernel on CUDA and the foreach path elsewhere.

    m_t     = beta1 m + (1 - beta1) g,   v_t = beta2 v + (1 - beta2) g^2
    u_t     = m_t / (1 - beta1^t) / (sqrt(v_t / (1 - beta2^t)) + eps)
    theta_t = theta - lr * (u_t + lambda * theta)

Defaults: torch's lr 1e-3, betas (0.9, 0.999), eps 1e-8, and weight decay 0.1 (GPT-3, Brown et al.
2020), applied only to the decay group (`hf_fasttrain.optim.create_optimizer` builds the groups).

`cautious=True` (Liang et al. 2024, "Cautious Optimizers", arXiv:2411.16085) masks u_t where its
sign disagrees with g_t's and rescales the rest by numel / (kept + 1) (see `_common.cautious_`);
weight decay is not masked. torch's AdamW has no such option, so `AdamW` below does that step.
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
from torch.optim import Optimizer

from ._common import (OptionError, cautious_, check_betas, check_bool, check_nonnegative, evaluate_closure,
                      params_with_grad, zero_state)

__all__ = ["AdamW", "build_adamw", "check_adamw_options"]


def _check_settings(lr, betas, eps, weight_decay, cautious) -> tuple[float, float]:
    """AdamW's argument checks (the class and `build_adamw` share them); returns the betas as floats."""
    check_nonnegative("AdamW", "lr", lr)
    betas = check_betas("AdamW", betas, 2)
    check_nonnegative("AdamW", "eps", eps)
    check_nonnegative("AdamW", "weight_decay", weight_decay)
    check_bool("AdamW", "cautious", cautious)
    return betas


def check_adamw_options(lr, betas, eps, weight_decay, fused, cautious) -> tuple[float, float]:
    """`build_adamw`'s checks, in its order, on values alone (no parameters needed); returns the betas as floats."""
    betas = _check_settings(lr, betas, eps, weight_decay, cautious)
    if cautious and fused:
        raise OptionError("AdamW", "fused", fused, "leave fused unset or false",
                          problem=f"got {fused!r} with cautious=True, which has no fused kernel")
    return betas


class AdamW(Optimizer):
    """AdamW with an optional cautious mask (Liang et al. 2024); state as `torch.optim.AdamW`'s.

    With `cautious=False` it computes AdamW's update (use `build_adamw`, which returns torch's faster
    foreach/fused kernel then). Per-tensor arithmetic, so it also runs on FSDP2 DTensor shards.

    Args:
        params: parameters or param-group dicts.
        lr: as `torch.optim.AdamW`.
        betas: as `torch.optim.AdamW`.
        eps: as `torch.optim.AdamW`.
        weight_decay: as `torch.optim.AdamW`.
        cautious: zero the update where its sign disagrees with the gradient's, rescale the rest.

    State: `step`, `exp_avg`, `exp_avg_sq` (the keys of torch's AdamW).

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim import AdamW
        >>> layer = torch.nn.Linear(2, 4)
        >>> opt = AdamW(layer.parameters(), lr=1e-3, cautious=True)
        >>> layer(torch.ones(3, 2)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[layer.weight])
        ['exp_avg', 'exp_avg_sq', 'step']
        ```
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        cautious: bool = False,
    ):
        betas = _check_settings(lr, betas, eps, weight_decay, cautious)
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay, "cautious": cautious}
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """Perform one optimization step; `closure` re-evaluates the model and returns the loss."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, wd = group["lr"], group["weight_decay"]
            for p in params_with_grad("AdamW", group):
                grad = p.grad
                state = self.state[p]
                if "step" not in state:
                    zero_state(state, p, ("exp_avg", "exp_avg_sq"))
                state["step"] += 1
                step = float(state["step"])
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg.lerp_(grad, 1.0 - beta1)
                exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1.0 - beta2)
                bias_correction1 = 1.0 - beta1**step
                bias_correction2 = 1.0 - beta2**step
                denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(group["eps"])
                update = (exp_avg / bias_correction1).div_(denom)
                if group["cautious"]:
                    cautious_(update, grad)
                if wd != 0.0:
                    p.mul_(1.0 - lr * wd)
                p.add_(update, alpha=-lr)
        return loss


def build_adamw(
    params: Iterable,
    lr: float = 1e-3,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    weight_decay: float = 0.1,
    fused: Optional[bool] = None,
    cautious: bool = False,
) -> Optimizer:
    """`torch.optim.AdamW` over `params`, fused when every param is on CUDA (or `fused=True`), else foreach.

    `cautious=True` returns this module's `AdamW` instead (no fused kernel; `fused=True` is refused).

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim import build_adamw
        >>> opt = build_adamw(torch.nn.Linear(2, 4).parameters(), lr=1e-3)
        >>> opt.defaults["foreach"], opt.defaults["fused"]
        (True, None)
        ```
    """
    betas = check_adamw_options(lr, betas, eps, weight_decay, fused, cautious)
    groups = list(params)
    if cautious:
        return AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, cautious=True)
    if fused is None:
        tensors = [
            p[1] if isinstance(p, tuple) else p
            for g in groups
            for p in (g["params"] if isinstance(g, dict) else [g])
        ]
        fused = bool(tensors) and all(t.is_cuda for t in tensors)
    kernel = {"fused": True} if fused else {"foreach": True}
    return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **kernel)
