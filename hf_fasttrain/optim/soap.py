"""SOAP: ShampoO with Adam in the Preconditioner's eigenbasis (Vyas et al. 2024, "SOAP: Improving
and Stabilizing Shampoo using Adam", arXiv:2409.11321), Algorithm 3, with decoupled weight decay.

For an m x n weight W with gradient G, SOAP keeps Shampoo's factors L (m x m) and R (n x n), their
eigenbases Q_L, Q_R, and runs Adam in the rotated space:

    G'  = Q_L^T G Q_R                                   # gradient in the eigenbasis
    M   = beta1 M + (1 - beta1) G                       # first moment, in the original space
    V   = beta2 V + (1 - beta2) G' * G'                 # second moment, in the eigenbasis
    N   = Q_L [ (Q_L^T M Q_R) / (sqrt(V) + eps) ] Q_R^T
    W   = W - lr * lambda * W - lr * sqrt(1 - beta2^t) / (1 - beta1^t) * N
    L   = s L + (1 - s) G G^T,   R = s R + (1 - s) G^T G        # s = shampoo_beta (default beta2)
    every f = precondition_frequency steps: Q_L, Q_R refreshed from L, R.

As in the paper's reference implementation (github.com/nikhilvyas/SOAP):
- the first gradient only initialises L, R and Q = eigh(L), eigh(R) (eigenvalues in descending
  order) and makes no update, so the current gradient is never used in its own projection;
- a refresh is one step of power iteration then QR: Q <- qr(L Q), after sorting Q's columns by the
  estimated eigenvalues diag(Q^T L Q) (descending) and permuting V's rows the same way;
- a dimension larger than `max_precond_dim` (e.g. a 50k vocabulary) gets no rotation, and 1-D
  params (biases, norms) get plain Adam unless `precondition_1d`; tensors of any rank get one
  factor per dimension.
Differences from that implementation: weight decay is applied before the update (as AdamW) rather
than after; M is kept in the original space and projected each step (the same numbers, one
projection fewer); no `merge_dims`, `normalize_grads` or optional bias correction; and by default
the long side of a skinny tensor is not rotated either (`skinny_ratio`, below).

Skinny tensors (`skinny_ratio`, default 16; None turns it off): a dimension of size s is also left
unrotated, exactly as one over `max_precond_dim`, when s > skinny_ratio x (the product of the other
dims), i.e. when its s x s factor would hold more than skinny_ratio times the tensor's own numbers.
A LoRA matrix (r x d_in or d_out x r) then keeps only its r x r factor and costs about AdamW's state;
with both sides, Llama-2-7B's r=8 LoRA on every linear layer would hold about 44 GiB of fp32 factors
(GG and Q of every 4096-long side; the 11008-long ones exceed max_precond_dim) against AdamW's 0.15 GiB. Hidden layers of transformers have ratios up to about 8 (MLP 4,
Llama's 11008 / 4096, grouped-query k/v projections 4 or 8), so 16 leaves them as the paper has them.

Defaults from the paper: lr 3e-3, betas (0.95, 0.95), precondition_frequency 10, weight decay 0.01,
eps 1e-8, max_precond_dim 10000. State for an m x n matrix: 2mn + 2(m^2 + n^2) numbers, less 2n^2
for each side n left unrotated (a 4 x 512 LoRA matrix: 2 * 2048 + 32, AdamW's 2 * 2048).
"""

from __future__ import annotations

import math
from typing import Iterable, Optional

import torch

from ._common import (FP32StateOptimizer, OptionError, bucket, check_betas, check_bool, check_nonnegative,
                      check_positive_int, check_unit_interval, evaluate_closure, is_dtensor, params_with_grad,
                      state_dtype, zero_state)

_SHARDED = (
    "SOAP does not work under FSDP2 (DTensor parameters sharded over processes): its preconditioners would "
    "be built per shard; use DDP (recipes/accelerate/multi_gpu_ddp.yaml), or under FSDP2 adamw, lion, "
    "ademamix or muon"
)

__all__ = ["DEFAULT_SKINNY_RATIO", "SOAP", "check_soap_options", "soap_preconditioned_dims"]

# A side longer than this times the rest of the tensor gets no factor (see the module docstring).
DEFAULT_SKINNY_RATIO = 16.0


def check_soap_options(lr, betas, shampoo_beta, eps, weight_decay, precondition_frequency, max_precond_dim,
                       precondition_1d, skinny_ratio) -> tuple[float, float]:
    """`SOAP`'s argument checks on values alone (no parameters needed); returns the betas as floats."""
    check_nonnegative("SOAP", "lr", lr)
    betas = check_betas("SOAP", betas, 2)
    if shampoo_beta is not None:
        check_unit_interval("SOAP", "shampoo_beta", shampoo_beta)
    check_nonnegative("SOAP", "eps", eps)
    check_nonnegative("SOAP", "weight_decay", weight_decay)
    check_positive_int("SOAP", "precondition_frequency", precondition_frequency)
    check_positive_int("SOAP", "max_precond_dim", max_precond_dim)
    check_bool("SOAP", "precondition_1d", precondition_1d)
    if skinny_ratio is not None and (
        not isinstance(skinny_ratio, (int, float)) or isinstance(skinny_ratio, bool)
        or not math.isfinite(skinny_ratio) or skinny_ratio < 1
    ):
        raise OptionError("SOAP", "skinny_ratio", skinny_ratio, "must be a finite number >= 1 or null (off)")
    return betas


def soap_preconditioned_dims(
    shape: tuple[int, ...],
    max_precond_dim: int,
    precondition_1d: bool,
    skinny_ratio: Optional[float] = DEFAULT_SKINNY_RATIO,
) -> list[int]:
    """The dimensions of a tensor of `shape` that SOAP rotates (gets an L/R factor for).

    A dim of size s is skipped when s > `max_precond_dim`, or (2+ dims, `skinny_ratio` not None) when
    s > skinny_ratio x the product of the other dims. A 1-D tensor is rotated only with `precondition_1d`.

    Example:
        >>> from hf_fasttrain.optim import soap_preconditioned_dims
        >>> soap_preconditioned_dims((4, 512), 10000, False)  # LoRA's lora_A: only the 4 x 4 factor
        [0]
        >>> soap_preconditioned_dims((4, 512), 10000, False, skinny_ratio=None)
        [0, 1]
        >>> soap_preconditioned_dims((768, 3072), 10000, False)  # an MLP matrix keeps both
        [0, 1]
    """
    if len(shape) == 1:
        return [0] if precondition_1d and shape[0] <= max_precond_dim else []
    numel = math.prod(shape)
    return [
        d for d, size in enumerate(shape)
        if size <= max_precond_dim and (skinny_ratio is None or size * size <= skinny_ratio * numel)
    ]


def _rotate(x: torch.Tensor, qs: list[Optional[torch.Tensor]], back: bool = False) -> torch.Tensor:
    """x -> x x_0 Q_0 x_1 Q_1 ... : Q_d^T applied along each dim d (Q_d applied when `back`).

    Each contraction consumes dim 0 and appends the result as the last dim, so after all dims the
    original order is restored; a dim without Q is only moved to the end. Always a new tensor.
    """
    if all(q is None for q in qs):
        return x.clone()
    for q in qs:
        if q is None:
            x = x.permute(*range(1, x.dim()), 0)
        else:
            x = torch.tensordot(x, q, dims=([0], [1 if back else 0]))
    return x


def _gram(g: torch.Tensor, dim: int) -> torch.Tensor:
    """The Shampoo statistic along `dim`: G G^T for dim 0 of a matrix, G^T G for dim 1."""
    others = [d for d in range(g.dim()) if d != dim]
    return torch.tensordot(g, g, dims=(others, others))


def _eigenbasis(mat: torch.Tensor) -> torch.Tensor:
    """Eigenvectors of a symmetric PSD matrix, columns ordered by descending eigenvalue."""
    try:
        _, vecs = torch.linalg.eigh(mat)
    except RuntimeError:  # fp32 eigh can fail to converge on ill-conditioned input; retry in fp64
        _, vecs = torch.linalg.eigh(mat.double())
        vecs = vecs.to(mat.dtype)
    return vecs.flip(1)


class SOAP(FP32StateOptimizer):
    """SOAP optimizer (Vyas et al. 2024): Adam in the eigenbasis of Shampoo's preconditioner.

    Args:
        params: parameters or param-group dicts.
        lr: learning rate.
        betas: (beta1, beta2) of the Adam part.
        shampoo_beta: EMA rate of the L and R factors; None uses beta2 (the paper's choice).
        eps: added to sqrt(V).
        weight_decay: decoupled weight decay (as AdamW).
        precondition_frequency: refresh the eigenbases every this many steps.
        max_precond_dim: dimensions larger than this are not rotated.
        precondition_1d: also rotate 1-D params (off: plain Adam for them, as the paper).
        skinny_ratio: a dimension longer than this times the product of the others is not rotated
            either (default 16): a LoRA matrix keeps only its r x r factor, so its state is about
            AdamW's instead of a d x d factor per side. None: every dimension up to
            `max_precond_dim` is rotated, as the paper's code does.

    State per param: `step`, `exp_avg` (M), `exp_avg_sq` (V, rotated basis) and for each rotated
    dim d `GG_d` (L or R) and `Q_d` (its eigenbasis); fp32 when the param is fp16/bf16.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim import SOAP
        >>> layer = torch.nn.Linear(2, 4)
        >>> opt = SOAP(layer.parameters(), lr=3e-3, precondition_frequency=10)
        >>> for _ in range(2):
        ...     layer(torch.ones(3, 2)).sum().backward()
        ...     opt.step()
        >>> sorted(opt.state[layer.weight])
        ['GG_0', 'GG_1', 'Q_0', 'Q_1', 'exp_avg', 'exp_avg_sq', 'step']
        ```
    """

    def __init__(
        self,
        params: Iterable,
        lr: float = 3e-3,
        betas: tuple[float, float] = (0.95, 0.95),
        shampoo_beta: Optional[float] = None,
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        precondition_frequency: int = 10,
        max_precond_dim: int = 10000,
        precondition_1d: bool = False,
        skinny_ratio: Optional[float] = DEFAULT_SKINNY_RATIO,
    ):
        betas = check_soap_options(lr, betas, shampoo_beta, eps, weight_decay, precondition_frequency,
                                   max_precond_dim, precondition_1d, skinny_ratio)
        defaults = {
            "lr": lr,
            "betas": betas,
            "shampoo_beta": shampoo_beta,
            "eps": eps,
            "weight_decay": weight_decay,
            "precondition_frequency": precondition_frequency,
            "max_precond_dim": max_precond_dim,
            "precondition_1d": precondition_1d,
            "skinny_ratio": skinny_ratio,
        }
        super().__init__(params, defaults)
        if any(is_dtensor(p) for g in self.param_groups for p in g["params"]):
            raise ValueError(_SHARDED)

    @staticmethod
    def _qs(state: dict, ndim: int) -> list[Optional[torch.Tensor]]:
        return [state.get(f"Q_{d}") for d in range(ndim)]

    @torch.no_grad()
    def step(self, closure=None):
        """Perform one optimization step; `closure` re-evaluates the model and returns the loss."""
        loss = evaluate_closure(closure)
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            shampoo_beta = beta2 if group["shampoo_beta"] is None else group["shampoo_beta"]
            params, grads, states = [], [], []
            for p in params_with_grad("SOAP", group):
                if is_dtensor(p):  # sharded after creation (accelerate swaps in FSDP2 parameters)
                    raise RuntimeError(_SHARDED)
                state = self.state[p]
                grad = p.grad.to(state_dtype(p))
                if "step" not in state:
                    # First gradient: build L, R and their eigenbases only; no update.
                    zero_state(state, grad, ("exp_avg", "exp_avg_sq"))
                    # A group saved before skinny_ratio existed has no such key: off, as it was then.
                    dims = soap_preconditioned_dims(tuple(p.shape), group["max_precond_dim"],
                                                    group["precondition_1d"], group.get("skinny_ratio"))
                    for d in dims:
                        state[f"GG_{d}"] = _gram(grad, d).mul_(1.0 - shampoo_beta)
                        state[f"Q_{d}"] = _eigenbasis(state[f"GG_{d}"])
                    continue
                state["step"] += 1
                params.append(p)
                grads.append(grad)
                states.append(state)
            if not params:
                continue

            exp_avgs = [s["exp_avg"] for s in states]
            exp_avg_sqs = [s["exp_avg_sq"] for s in states]
            by_dtype = bucket(range(len(params)), lambda i: (params[i].device, params[i].dtype))
            for idx in by_dtype.values():
                torch._foreach_lerp_([exp_avgs[i] for i in idx], [grads[i] for i in idx], 1.0 - beta1)

            # Rotate G and M into the eigenbasis (matmuls, one param at a time).
            grads_rot = [_rotate(g, self._qs(s, g.dim())) for g, s in zip(grads, states)]
            direction = [_rotate(m, self._qs(s, m.dim())) for m, s in zip(exp_avgs, states)]
            for idx in by_dtype.values():
                sq = [exp_avg_sqs[i] for i in idx]
                g_rot = [grads_rot[i] for i in idx]
                torch._foreach_mul_(sq, beta2)
                torch._foreach_addcmul_(sq, g_rot, g_rot, 1.0 - beta2)
                denom = torch._foreach_sqrt(sq)
                torch._foreach_add_(denom, group["eps"])
                torch._foreach_div_([direction[i] for i in idx], denom)
            del grads_rot
            direction = [_rotate(n, self._qs(s, n.dim()), back=True) for n, s in zip(direction, states)]

            steps = [int(s["step"].item()) for s in states]
            lr, wd = group["lr"], group["weight_decay"]
            for (_, _, step), idx in bucket(
                range(len(params)), lambda i: (params[i].device, params[i].dtype, steps[i])
            ).items():
                sub_params = [params[i] for i in idx]
                work, _ = self._fp32_views(sub_params, [])
                if wd != 0.0:
                    torch._foreach_mul_(work, 1.0 - lr * wd)
                step_size = lr * math.sqrt(1.0 - beta2**step) / (1.0 - beta1**step)
                torch._foreach_add_(work, [direction[i] for i in idx], alpha=-step_size)
                self._write_back(sub_params, work)
            del direction

            # Update L, R with this step's gradient; refresh the eigenbases every f steps.
            for grad, state, step in zip(grads, states, steps):
                refresh = step % group["precondition_frequency"] == 0
                for d in range(grad.dim()):
                    if f"GG_{d}" not in state:
                        continue
                    gg = state[f"GG_{d}"]
                    gg.lerp_(_gram(grad, d), 1.0 - shampoo_beta)
                    if refresh:
                        self._refresh(state, d)
        return loss

    @staticmethod
    def _refresh(state: dict, d: int) -> None:
        """One power-iteration step and QR for dim d, keeping V aligned with the reordered basis."""
        gg, q = state[f"GG_{d}"], state[f"Q_{d}"]
        gg_q = gg @ q
        estimated_eigenvalues = (q * gg_q).sum(0)  # diag(Q^T GG Q)
        order = torch.argsort(estimated_eigenvalues, descending=True)
        state["exp_avg_sq"] = state["exp_avg_sq"].index_select(d, order)
        state[f"Q_{d}"] = torch.linalg.qr(gg_q[:, order]).Q
