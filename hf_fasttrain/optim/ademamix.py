"""AdEMAMix (Pagliardini, Ablin and Grangier 2024, "The AdEMAMix Optimizer: Better, Faster, Older",
arXiv:2409.03137), Algorithm 1: Adam whose numerator mixes a fast and a slow EMA of the gradient.

For each parameter theta with gradient g (m1 = m2 = nu = 0 at t = 0):

    m1_t    = beta1 * m1 + (1 - beta1) * g                  # fast EMA, bias-corrected
    m2_t    = beta3(t) * m2 + (1 - beta3(t)) * g            # slow EMA, not bias-corrected
    nu_t    = beta2 * nu + (1 - beta2) * g^2
    theta_t = theta - lr * ((m1_t / (1 - beta1^t) + alpha(t) * m2_t)
                            / (sqrt(nu_t / (1 - beta2^t)) + eps) + lambda * theta)

Warmup schedules over T = T_alpha_beta3 steps (the paper sets T to the whole run):

    alpha(t) = min(t * alpha / T, alpha)
    beta3(t) = min(exp(ln(beta1) ln(beta3) / ((1 - t/T) ln(beta3) + (t/T) ln(beta1))), beta3)

beta3(t) interpolates the EMA's half-life linearly from beta1's to beta3's. Without warmup
(T_alpha_beta3=None) alpha and beta3 are constant. With alpha = 0 the update is AdamW's.

`cautious=True` (Liang et al. 2024, "Cautious Optimizers") zeroes the update where its sign
disagrees with g_t's and rescales the rest by numel / (kept + 1); weight decay is not masked.

Defaults: betas (0.9, 0.999, 0.9999) and alpha 5.0 from the paper (its LM runs use alpha 5 to 8 with
beta3 0.9999); lr 1e-3 and weight decay 0.1 as AdamW. Three state tensors per parameter (AdamW: two).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional

import torch

from ._common import (
    FP32StateOptimizer,
    OptionError,
    bucket,
    cautious_,
    check_betas,
    check_bool,
    check_nonnegative,
    check_positive_int,
    evaluate_closure,
    params_with_grad,
    state_dtype,
    zero_state,
)

__all__ = ["AdEMAMix", "ademamix_alpha", "ademamix_beta3", "check_ademamix_options", "half_life_note",
           "slow_momentum_half_life"]


def check_ademamix_options(lr, betas, alpha, T_alpha_beta3, eps, weight_decay, cautious) -> tuple[float, ...]:
    """`AdEMAMix`'s argument checks on values alone (no parameters needed); returns the betas as floats."""
    check_nonnegative("AdEMAMix", "lr", lr)
    check_bool("AdEMAMix", "cautious", cautious)
    betas = check_betas("AdEMAMix", betas, 3)
    check_nonnegative("AdEMAMix", "alpha", alpha)
    if T_alpha_beta3 is not None:
        check_positive_int("AdEMAMix", "T_alpha_beta3", T_alpha_beta3)
        if betas[0] <= 0.0 or betas[2] <= 0.0:
            raise OptionError(
                "AdEMAMix", "betas", list(betas), "betas[0] and betas[2] must be > 0 when T_alpha_beta3 is set "
                "(the beta3 warmup interpolates their logarithms)",
            )
    check_nonnegative("AdEMAMix", "eps", eps)
    check_nonnegative("AdEMAMix", "weight_decay", weight_decay)
    return betas


def slow_momentum_half_life(beta3: float) -> float:
    """Steps after which the slow EMA's weight on a gradient has halved: ln(1/2) / ln(beta3) (0.9999: about
    6,931 steps; 0.999: about 693). Longer than the run, the slow momentum still carries the first steps'
    gradients at its end.

    Example:
        ```python
        >>> round(slow_momentum_half_life(0.999))
        693
        ```
    """
    if not 0.0 < beta3 < 1.0:
        return math.inf if beta3 >= 1.0 else 0.0
    return math.log(0.5) / math.log(beta3)


def half_life_note(betas: Any, steps: Optional[int]) -> Optional[str]:
    """What to tell a user whose run (`steps` long) is shorter than the slow momentum's half-life (such a run
    stalls), or None; `betas` as given to `AdEMAMix` (beta3 last)."""
    beta3 = check_betas("AdEMAMix", betas, 3)[2]
    half_life = slow_momentum_half_life(beta3)
    if not steps or steps <= 0 or half_life <= steps:
        return None
    return (f"ademamix: beta3 {beta3} gives the slow momentum a half-life of {half_life:,.0f} steps, longer than "
            f"this run ({steps:,} steps), so it barely moves in this run (the optimizers page shows a run where "
            "it stalled): set optimizer_kwargs betas [0.9, 0.999, <beta3>] with a half-life inside the run "
            "(docs: techniques/optimizers)")


def ademamix_alpha(step: int, alpha: float, warmup: Optional[int]) -> float:
    """alpha(t) = min(t * alpha / T, alpha); constant alpha when `warmup` is None."""
    if warmup is None:
        return alpha
    return alpha * min(step / warmup, 1.0)


def ademamix_beta3(step: int, beta_start: float, beta_end: float, warmup: Optional[int]) -> float:
    """beta3(t) of AdEMAMix: from beta_start (beta1) at t = 0 to beta_end (beta3) at t = T.

    Interpolates 1 / ln(beta), i.e. the EMA's time scale, linearly in t; constant when `warmup`
    is None or t >= T.
    """
    if warmup is None or step >= warmup:
        return beta_end
    frac = step / warmup
    log_start, log_end = math.log(beta_start), math.log(beta_end)
    return min(math.exp(log_start * log_end / ((1.0 - frac) * log_end + frac * log_start)), beta_end)


class AdEMAMix(FP32StateOptimizer):
    """AdEMAMix optimizer (Pagliardini et al. 2024), vectorised with `torch._foreach_*`.

    Args:
        params: parameters or param-group dicts.
        lr: learning rate (as AdamW's).
        betas: (beta1, beta2, beta3): fast EMA, second moment, slow EMA.
        alpha: weight of the slow EMA in the numerator.
        T_alpha_beta3: warmup length in steps for alpha and beta3 (None: no warmup). The paper sets
            it to the total number of training steps; without it a large alpha early on can diverge.
        eps: added to the denominator.
        weight_decay: decoupled weight decay lambda (as AdamW).
        cautious: zero the update where its sign disagrees with the gradient's (Liang et al. 2024).

    State: `step`, `exp_avg_fast` (m1), `exp_avg_slow` (m2), `exp_avg_sq` (nu); fp32 when the
    param is fp16/bf16.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim import AdEMAMix
        >>> layer = torch.nn.Linear(2, 4)
        >>> opt = AdEMAMix(layer.parameters(), lr=1e-3, alpha=5.0, T_alpha_beta3=1000)
        >>> layer(torch.ones(3, 2)).sum().backward()
        >>> opt.step()
        >>> sorted(opt.state[layer.weight])
        ['exp_avg_fast', 'exp_avg_slow', 'exp_avg_sq', 'step']
        ```
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 1e-3,
        betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
        alpha: float = 5.0,
        T_alpha_beta3: Optional[int] = None,
        eps: float = 1e-8,
        weight_decay: float = 0.1,
        cautious: bool = False,
    ):
        betas = check_ademamix_options(lr, betas, alpha, T_alpha_beta3, eps, weight_decay, cautious)
        defaults = {
            "lr": lr,
            "betas": betas,
            "alpha": alpha,
            "T_alpha_beta3": T_alpha_beta3,
            "eps": eps,
            "weight_decay": weight_decay,
            "cautious": cautious,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """Perform one optimization step; `closure` re-evaluates the model and returns the loss."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            params, grads, fast, slow, sq, steps = [], [], [], [], [], []
            for p in params_with_grad("AdEMAMix", group):
                state = self.state[p]
                if "step" not in state:
                    zero_state(state, p, ("exp_avg_fast", "exp_avg_slow", "exp_avg_sq"), dtype=state_dtype(p))
                state["step"] += 1
                params.append(p)
                grads.append(p.grad)
                fast.append(state["exp_avg_fast"])
                slow.append(state["exp_avg_slow"])
                sq.append(state["exp_avg_sq"])
                steps.append(int(state["step"].item()))

            # One foreach call per (device, dtype, step): the step sets the bias corrections and warmups.
            buckets = bucket(range(len(params)), lambda i: (params[i].device, params[i].dtype, steps[i]))
            for (_, _, step), idx in buckets.items():
                _ademamix_update(
                    [params[i] for i in idx],
                    [grads[i] for i in idx],
                    [fast[i] for i in idx],
                    [slow[i] for i in idx],
                    [sq[i] for i in idx],
                    step=step,
                    lr=group["lr"],
                    betas=group["betas"],
                    alpha=group["alpha"],
                    warmup=group["T_alpha_beta3"],
                    eps=group["eps"],
                    weight_decay=group["weight_decay"],
                    cautious=group.get("cautious", False),
                )
        return loss


def _ademamix_update(
    params, grads, fast, slow, sq, *, step, lr, betas, alpha, warmup, eps, weight_decay, cautious=False
):
    """One AdEMAMix step on same-device, same-dtype, same-step lists."""
    beta1, beta2, beta3_final = betas
    alpha_t = ademamix_alpha(step, alpha, warmup)
    beta3_t = ademamix_beta3(step, beta1, beta3_final, warmup)
    bias_correction1 = 1.0 - beta1**step
    bias_correction2 = 1.0 - beta2**step

    work, grads = FP32StateOptimizer._fp32_views(params, grads)
    torch._foreach_lerp_(fast, grads, 1.0 - beta1)
    torch._foreach_lerp_(slow, grads, 1.0 - beta3_t)
    torch._foreach_mul_(sq, beta2)
    torch._foreach_addcmul_(sq, grads, grads, 1.0 - beta2)

    # (m1 / bc1 + alpha m2) / (sqrt(nu / bc2) + eps)
    #   = (sqrt(bc2) / bc1 * m1 + sqrt(bc2) alpha m2) / (sqrt(nu) + eps sqrt(bc2)):
    # the bias corrections become scalars, and two addcdiv_ avoid a temporary for the numerator
    # (on a CPU that temporary made the step 1.7x AdamW's; this way it is about 1.2x).
    denom = torch._foreach_sqrt(sq)
    torch._foreach_add_(denom, eps * math.sqrt(bias_correction2))
    if weight_decay != 0.0:
        torch._foreach_mul_(work, 1.0 - lr * weight_decay)
    if cautious:
        # The numerator's sign is the update's (denom > 0): mask and rescale it, then one addcdiv_.
        numer = torch._foreach_mul(fast, math.sqrt(bias_correction2) / bias_correction1)
        if alpha_t != 0.0:
            torch._foreach_add_(numer, slow, alpha=math.sqrt(bias_correction2) * alpha_t)
        for n, g in zip(numer, grads):
            cautious_(n, g)
        torch._foreach_addcdiv_(work, numer, denom, -lr)
        FP32StateOptimizer._write_back(params, work)
        return
    torch._foreach_addcdiv_(work, fast, denom, -lr * math.sqrt(bias_correction2) / bias_correction1)
    if alpha_t != 0.0:
        torch._foreach_addcdiv_(work, slow, denom, -lr * math.sqrt(bias_correction2) * alpha_t)
    FP32StateOptimizer._write_back(params, work)
