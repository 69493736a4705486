"""Lion: EvoLved Sign Momentum (Chen et al. 2023, "Symbolic Discovery of Optimization Algorithms",
arXiv:2302.06675), Algorithm 2, with decoupled weight decay.

For each parameter theta with gradient g and momentum m (m_0 = 0):

    c_t     = beta1 * m_{t-1} + (1 - beta1) * g_t          # interpolation used for the update
    theta_t = theta_{t-1} - lr * (sign(c_t) + lambda * theta_{t-1})
    m_t     = beta2 * m_{t-1} + (1 - beta2) * g_t          # momentum tracked with beta2

Every element moves by exactly lr (before decay), so the update has a larger norm than Adam's; the
paper therefore recommends an lr 3-10x smaller than AdamW's and a weight decay 3-10x larger, so that
the effective decay lr * lambda stays the same. Defaults here: lr 1e-4, betas (0.9, 0.99),
weight_decay 1.0 (10x AdamW's 1e-3 / 0.1). One state tensor per parameter (half of AdamW's).

`cautious=True` (Liang et al. 2024, "Cautious Optimizers", C-Lion) zeroes sign(c_t) where it
disagrees with g_t's sign and rescales the rest by numel / (kept + 1); weight decay is not masked.
"""

from __future__ import annotations

from typing import Iterable

import torch

from ._common import (FP32StateOptimizer, bucket, cautious_, check_betas, check_bool, check_nonnegative,
                      evaluate_closure, params_with_grad, state_dtype, zero_state)

__all__ = ["Lion", "check_lion_options"]


def check_lion_options(lr, betas, weight_decay, cautious) -> tuple[float, float]:
    """`Lion`'s argument checks on values alone (no parameters needed); returns the betas as floats."""
    check_nonnegative("Lion", "lr", lr)
    betas = check_betas("Lion", betas, 2)
    check_nonnegative("Lion", "weight_decay", weight_decay)
    check_bool("Lion", "cautious", cautious)
    return betas


class Lion(FP32StateOptimizer):
    """Lion optimizer (Chen et al. 2023) with decoupled weight decay, vectorised with `torch._foreach_*`.

    Args:
        params: parameters or param-group dicts.
        lr: step size; every element moves by exactly `lr` per step before weight decay.
        betas: (beta1, beta2): beta1 interpolates the update direction, beta2 tracks the momentum.
        weight_decay: decoupled decay lambda; the parameter is multiplied by (1 - lr * lambda).
        cautious: zero the update where its sign disagrees with the gradient's (Liang et al. 2024).

    State: `exp_avg` (the momentum m), fp32 when the param is fp16/bf16.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim import Lion
        >>> layer = torch.nn.Linear(2, 4)
        >>> opt = Lion(layer.parameters(), lr=1e-4, weight_decay=1.0)
        >>> layer(torch.ones(3, 2)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[layer.weight])
        ['exp_avg']
        ```
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-4,
        betas: tuple[float, float] = (0.9, 0.99),
        weight_decay: float = 1.0,
        cautious: bool = False,
    ):
        betas = check_lion_options(lr, betas, weight_decay, cautious)
        super().__init__(params, {"lr": lr, "betas": betas, "weight_decay": weight_decay, "cautious": cautious})

    @torch.no_grad()
    def step(self, closure=None):
        """Perform one optimization step; `closure` re-evaluates the model and returns the loss."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            params, grads, exp_avgs = [], [], []
            for p in params_with_grad("Lion", group):
                state = self.state[p]
                if "exp_avg" not in state:
                    zero_state(state, p, ("exp_avg",), dtype=state_dtype(p), step=False)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])

            buckets = bucket(range(len(params)), lambda i: (params[i].device, params[i].dtype))
            for idx in buckets.values():
                _lion_update(
                    [params[i] for i in idx],
                    [grads[i] for i in idx],
                    [exp_avgs[i] for i in idx],
                    lr=group["lr"],
                    beta1=group["betas"][0],
                    beta2=group["betas"][1],
                    weight_decay=group["weight_decay"],
                    cautious=group.get("cautious", False),
                )
        return loss


def _lion_update(params, grads, exp_avgs, *, lr, beta1, beta2, weight_decay, cautious=False):
    """One Lion step on same-device, same-dtype lists; fp32 arithmetic for fp16/bf16 params."""
    work, grads = FP32StateOptimizer._fp32_views(params, grads)
    # c = beta1 * m + (1 - beta1) * g, then its sign: the whole update direction.
    direction = torch._foreach_lerp(exp_avgs, grads, 1.0 - beta1)
    torch._foreach_sign_(direction)
    if cautious:
        for d, g in zip(direction, grads):
            cautious_(d, g)
    if weight_decay != 0.0:
        torch._foreach_mul_(work, 1.0 - lr * weight_decay)
    torch._foreach_add_(work, direction, alpha=-lr)
    # The momentum is updated after the step, with the slower beta2.
    torch._foreach_lerp_(exp_avgs, grads, 1.0 - beta2)
    FP32StateOptimizer._write_back(params, work)
