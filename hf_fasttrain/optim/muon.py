"""Muon for hidden matrices plus AdamW for everything else, as one optimizer.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
kellerjordan.github.io/posts/muon) replaces each 2-D weight's momentum by its orthogonalisation,
computed with 5 Newton-Schulz iterations:

    B_t     = mu B_{t-1} + g_t;   U_t = g_t + mu B_t (Nesterov)
    O_t     = NewtonSchulz5(U_t)                      # ~ U V^T of the SVD U S V^T of U_t
    theta_t = theta_{t-1} (1 - lr lambda) - lr * s(A, B) * O_t
    (with `cautious_wd`, Chen et al. 2025: the decay only where O_t theta_{t-1} >= 0;
    with `hyperball`, Wen et al. 2025: no decay, each weight vector kept at its initial norm instead,
    `hf_fasttrain.optim.hyperball`)

It is meant for the hidden weight matrices only; embeddings, the LM head, biases and norms are
trained with AdamW. The Muon part is computed here (any torch >= 2.4) and `torch.optim.AdamW` does the
rest; `MuonWithAdamW` holds both behind one `torch.optim.Optimizer` whose
`param_groups` are the union of theirs (so an LR scheduler scales every group) and whose state dict
is one ordinary optimizer state dict.

Scale s(A, B) of the update (torch's `adjust_lr_fn`):
- "match_rms_adamw" (default; Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv:2502.16982):
  s = 0.2 sqrt(max(A, B)), which gives the update the RMS of a typical AdamW update, so Muon can use
  AdamW's lr and weight decay (0.1); here both parts share `lr` unless `muon_lr` is given.
- "spectral": s = sqrt(fan_out / fan_in), unclamped: the orthogonalised update has spectral norm 1, so the step's
  spectral norm is lr sqrt(fan_out / fan_in), the size the spectral condition asks for at every width (Yang, Simon
  & Bernstein 2023, "A Spectral Condition for Feature Learning", arXiv:2310.17813); torch 2.15's
  `adjust_lr_fn="spectral_unclamped"`. It is the scale of ``parameterization="mup"`` (`hf_fasttrain.transfer`),
  with no Adam-style lr / m on top; "match_rms_adamw"'s 0.2 sqrt(max(A, B)) grows with sqrt(width) instead.
- "original" (Jordan et al. 2024): s = sqrt(max(1, fan_out / fan_in)), with lr 0.02 for Muon.
  torch computes it from the first two dims of the stored weight, which for GPT-2's `Conv1D`
  (stored as in x out, the transpose of `nn.Linear`) gives fan_in / fan_out; `muon_routing` finds
  those weights and `create_muon` puts them in groups whose lr (and, inversely, weight decay) is
  multiplied to restore the intended scale ("spectral" too). "match_rms_adamw" is symmetric and needs no correction.

Newton-Schulz coefficients (`ns_coefficients`, `ns_steps`): "jordan" (default, torch's quintic),
"polar_express" or explicit (a, b, c) triples; the iteration and its schedules are in
`hf_fasttrain.optim.orthogonalize` (re-exported here).

The Muon part is computed here, op for op as `torch.optim.Muon` (bf16 Newton-Schulz, the momentum
kept as an EMA, lerp with 1 - mu; Jordan et al.'s reference differs only up to eps since the
iteration normalises its input), so the default settings give bit-identical results to torch's.
Doing it here adds the coefficient schedules and FSDP2: for a DTensor parameter (FSDP2's
`fully_shard`, sharded on dim 0) the Nesterov input is gathered to the full matrix
(`full_tensor()`, an all-gather), orthogonalised on every rank, and each rank applies its own rows,
so the update equals the single-process one. State is kept in the parameter dtype (fp32 under the
Trainer's mixed precision, where the master weights are fp32).
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Optional, Sequence

import torch
from torch.optim import Optimizer

from ._common import (
    OptionError,
    check_betas,
    check_bool,
    check_nonnegative,
    check_positive_int,
    check_unit_interval,
    evaluate_closure,
    is_dtensor,
    params_with_grad,
    zero_state,
)
from .adamw import build_adamw
from .experts import ExpertLayout, expert_matrices, expert_matrix_shape, expert_tensor
from .hyperball import HYPERBALL_STATE, hyperball_step, initial_radius
from .normuon import NORMUON_STATE, neuron_normalize
from .routing import (HYPERBALL_EXPERTS, ROUTING_RULES, conv1d_lr_multiplier, expert_param_groups, muon_route_table,
                      muon_routing)
from .orthogonalize import (
    NS_EPS,
    NS_COEFFICIENTS,
    check_ns_dtype,
    newton_schulz,
    newton_schulz_batched,
    ns_coefficient_schedule,
    resolve_ns_dtype,
)

__all__ = [
    "ADJUST_LR_FNS",
    "NS_COEFFICIENTS",
    "NS_SHARDING",
    "MuonWithAdamW",
    "check_muon_options",
    "conv1d_lr_multiplier",
    "expert_param_groups",
    "ROUTING_RULES",
    "muon_route_table",
    "muon_routing",
    "newton_schulz",
    "newton_schulz_batched",
    "ns_coefficient_schedule",
]

ADJUST_LR_FNS = ("match_rms_adamw", "original", "spectral")

def _ns_key(update: torch.Tensor, group: dict) -> tuple:
    """Matrices that can share one batched Newton-Schulz: same shape, dtype, device and settings."""
    coeffs = group["ns_coefficients"]
    return (tuple(update.shape), update.dtype, str(update.device), coeffs if isinstance(coeffs, str) else repr(coeffs),
            group["ns_steps"], group["eps"], _ns_dtype(group))


def _ns_dtype(group: dict) -> str:
    """The group's Newton-Schulz precision (a group loaded from an older checkpoint lacks the key: bf16)."""
    return group.get("ns_dtype", "bfloat16")


def _adjust_lr(lr: float, adjust_lr_fn: Optional[str], shape: Sequence[int]) -> float:
    """torch.optim.Muon's update scale for a stored shape (A, B, ...)."""
    a, b = shape[0], shape[1]
    if adjust_lr_fn is None or adjust_lr_fn == "original":
        return lr * math.sqrt(max(1, a / b))
    if adjust_lr_fn == "match_rms_adamw":
        return lr * 0.2 * math.sqrt(max(a, b))
    if adjust_lr_fn == "spectral":  # sqrt(fan_out / fan_in) for a stored (out, in); Conv1D is corrected by its group
        return lr * math.sqrt(a / b)
    return lr


def _full(x: torch.Tensor) -> torch.Tensor:
    """The whole matrix: a DTensor is gathered (all-gather over its mesh), a tensor is returned."""
    return x.full_tensor() if is_dtensor(x) else x


def _like(local_full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """`local_full` (the same on every rank) laid out as `param`: this rank's shard, no communication."""
    if not is_dtensor(param):
        return local_full
    from torch.distributed.tensor import distribute_tensor

    return distribute_tensor(local_full, param.device_mesh, param.placements, src_data_rank=None)


NS_SHARDING = ("all_gather", "round_robin")


def _round_robin_ok(p: torch.Tensor) -> bool:
    """Round-robin handles a DTensor on a 1-D mesh sharded on dim 0 (FSDP2's layout)."""
    if not is_dtensor(p) or p.device_mesh.ndim != 1 or p.ndim != 2:
        return False
    from torch.distributed.tensor import Shard

    return tuple(p.placements) == (Shard(0),)


def _shard_rows(rows: int, world: int) -> list[int]:
    """Rows per rank of a dim-0 shard (torch.chunk's split, as DTensor's Shard(0); trailing ranks may get 0)."""
    chunk = -(-rows // world)
    return [max(0, min(chunk, rows - r * chunk)) for r in range(world)]


def _round_robin_newton_schulz(items: list) -> dict:
    """Orthogonalise each (param, group, update) on one owner rank (matrix i -> rank i mod W).

    Phase 1 gathers every matrix's rows to its owner, phase 2 has each rank orthogonalise the
    matrices it owns (in parallel across ranks), phase 3 scatters the rows back. Returns
    {param: this rank's rows of the result, as a DTensor laid out like the param}.
    """
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    jobs, handles = [], []
    for i, (p, group, update) in enumerate(items):
        mesh = p.device_mesh
        pg, world, me = mesh.get_group(), mesh.size(), mesh.get_local_rank()
        owner = i % world
        rows, cols = update.shape
        sizes = _shard_rows(rows, world)
        chunk = max(sizes)
        local = update.to_local()
        send = local.new_zeros(chunk, cols)
        send[: local.shape[0]] = local
        recv = [torch.empty_like(send) for _ in range(world)] if me == owner else None
        handles.append(dist.gather(send, recv, dst=dist.get_global_rank(pg, owner), group=pg, async_op=True))
        jobs.append((p, group, pg, me, owner, sizes, chunk, cols, recv, local))
    for h in handles:
        h.wait()

    handles, outs = [], []
    for p, group, pg, me, owner, sizes, chunk, cols, recv, local in jobs:
        pieces = None
        if me == owner:
            full = torch.cat([piece[:n] for piece, n in zip(recv, sizes)])
            # bf16 values carried in fp32 (exact), so any backend can send them
            ortho = newton_schulz(full, group["ns_coefficients"], group["ns_steps"], group["eps"],
                                  _ns_dtype(group)).float()
            pieces, start = [], 0
            for n in sizes:
                piece = ortho.new_zeros(chunk, cols)
                piece[:n] = ortho[start : start + n]
                pieces.append(piece)
                start += n
        out = local.new_empty(chunk, cols, dtype=torch.float32)
        handles.append(dist.scatter(out, pieces, src=dist.get_global_rank(pg, owner), group=pg, async_op=True))
        outs.append(out)
    for h in handles:
        h.wait()
    result = {}
    for (p, group, *_rest), out in zip(jobs, outs):
        local_rows = p.to_local().shape[0]
        mine = out[:local_rows].to(resolve_ns_dtype(_ns_dtype(group), out.device))
        result[p] = DTensor.from_local(mine, p.device_mesh, p.placements, run_check=False, shape=p.shape,
                                       stride=p.stride())
    return result


class Muon(Optimizer):
    """Muon (Jordan et al. 2024) on 2-D params: torch.optim.Muon's step with coefficient schedules
    and FSDP2 (DTensor) support. Use it through `MuonWithAdamW` / `create_optimizer("muon", ...)`.

    `ns_sharding` (FSDP2 only): "all_gather" (default) gathers every matrix to every rank, which
    orthogonalises all of them; "round_robin" gathers each matrix to one owner rank and scatters
    the result's rows back: per rank 2/W of the bytes and 1/W of the Newton-Schulz work (see
    `hf_fasttrain.optim.muon_communication_bytes`). Both give the single-process update.

    `ns_batched` (default True): matrices of one shape are orthogonalised together
    (:func:`newton_schulz_batched`, a few batched matmuls instead of many small ones); False runs
    :func:`newton_schulz` matrix by matrix. The results are the same (bit-identical on CPU).

    Every option is given, and checked, by `MuonWithAdamW`, whose signature holds Muon's defaults.
    """

    def __init__(
        self,
        params: Iterable,
        *,
        lr: float,
        weight_decay: float,
        momentum: float,
        nesterov: bool,
        ns_coefficients: Any,
        ns_steps: int,
        adjust_lr_fn: Optional[str],
        ns_sharding: str,
        ns_batched: bool,
        normuon_beta2: Optional[float],
        cautious_wd: bool,
        hyperball: bool,
        ns_dtype: str,
        eps: float = NS_EPS,
    ):
        # the values are checked by MuonWithAdamW (check_muon_options), which makes this optimizer
        self._ns_sharding = ns_sharding
        self._ns_batched = ns_batched
        defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_coefficients": ns_coefficients,
            "eps": eps,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "normuon_beta2": normuon_beta2,
            "cautious_wd": cautious_wd,
            "hyperball": hyperball,
            "ns_dtype": ns_dtype,
        }
        super().__init__(params, defaults)

    @torch.no_grad()
    def step(self, closure=None):
        """One Muon step on every param with a gradient."""
        loss = evaluate_closure(closure)
        work = []
        for group in self.param_groups:
            mu = group["momentum"]
            for p in params_with_grad("Muon", group):
                grad = p.grad
                state = self.state[p]
                if "momentum_buffer" not in state:
                    zero_state(state, grad, ("momentum_buffer",), step=False)
                buf = state["momentum_buffer"]
                buf.lerp_(grad, 1 - mu)
                # Element-wise so far (works shard by shard); Newton-Schulz needs the whole matrix.
                work.append((p, group, grad.lerp(buf, mu) if group["nesterov"] else buf))
        done = {}
        if self._ns_sharding == "round_robin":
            shared = [w for w in work if not w[1].get("experts") and _round_robin_ok(w[0])]
            if shared:
                done = _round_robin_newton_schulz(shared)
        # expert tensors always (one batched Newton-Schulz over their experts), matrices when ns_batched
        batched = [w for w in work if w[0] not in done and (self._ns_batched or w[1].get("experts"))]
        done.update(self._batched_newton_schulz(batched))
        for p, group, update in work:
            ortho = done.get(p)
            if ortho is None:
                full = newton_schulz(_full(update), group["ns_coefficients"], group["ns_steps"], group["eps"],
                                     _ns_dtype(group))
                ortho = _like(full, p)
            beta2 = group.get("normuon_beta2")  # (a group loaded from an older checkpoint may lack the key)
            if group.get("experts"):  # a stack [N, out, in] of the expert matrices, back to the stored layout
                if beta2 is not None:
                    ortho = self._neuron_normalize(p, group, ortho, beta2)
                ortho = _like(expert_tensor(ortho, p.shape, ExpertLayout.from_group(group)), p)
            elif beta2 is not None:
                ortho = self._neuron_normalize(p, group, ortho, beta2)
            lr = group["lr"]
            scale = _adjust_lr(lr, group["adjust_lr_fn"], _matrix_shape(p, group))
            if group.get("hyperball"):  # no decay: the vectors stay at their initial norms
                self._hyperball(p, group, ortho, scale)
                continue
            if group.get("cautious_wd"):  # decay only where it pulls the way the update goes
                p.sub_(p * (ortho * p >= 0), alpha=lr * group["weight_decay"])
            else:
                p.mul_(1 - lr * group["weight_decay"])
            p.add_(ortho, alpha=-scale)
        return loss

    def _neuron_normalize(self, p: torch.Tensor, group: dict, ortho: torch.Tensor, beta2: float) -> torch.Tensor:
        """NorMuon (`hf_fasttrain.optim.normuon`): the update normalised per output neuron (of each expert's
        matrix for an expert tensor, whose `ortho` is the stack [N, out, in])."""
        _refuse_sharded(p, "normuon_beta2", "normuon_beta2=None")
        state = self.state[p]
        if group.get("experts"):
            if NORMUON_STATE not in state:
                state[NORMUON_STATE] = torch.zeros((*ortho.shape[:2], 1), dtype=torch.float32, device=p.device)
            return neuron_normalize(ortho, state[NORMUON_STATE], beta2, 2)
        dim = group.get("normuon_dim", 1)
        if NORMUON_STATE not in state:
            shape = (p.shape[0], 1) if dim == 1 else (1, p.shape[1])
            state[NORMUON_STATE] = torch.zeros(shape, dtype=torch.float32, device=p.device)
        return neuron_normalize(ortho, state[NORMUON_STATE], beta2, dim)

    def _hyperball(self, p: torch.Tensor, group: dict, ortho: torch.Tensor, step: float) -> None:
        """Hyperball (`hf_fasttrain.optim.hyperball`): the step at a fixed fraction of each vector's norm."""
        _refuse_sharded(p, "hyperball", "hyperball=False")
        if group.get("experts"):
            raise ValueError(HYPERBALL_EXPERTS)
        dim = group.get("hyperball_dim", 0)
        state = self.state[p]
        if HYPERBALL_STATE not in state:
            names = group.get("param_names") or []
            at = next(i for i, q in enumerate(group["params"]) if q is p)
            name = repr(names[at]) if at < len(names) else "a Muon matrix"
            state[HYPERBALL_STATE] = initial_radius(p, dim, group["eps"], name)
        hyperball_step(p, ortho, state[HYPERBALL_STATE], step, dim, group["eps"])

    @staticmethod
    def _batched_newton_schulz(items: list) -> dict:
        """Orthogonalised updates for (param, group, update) items, one batched Newton-Schulz per matrix shape.

        A matrix's result is laid out as its param (a shape held by one matrix only is left to
        :func:`newton_schulz`); an expert tensor's is the stack [N, out, in] of its expert matrices
        (`hf_fasttrain.optim.experts.expert_matrices`), whole (gathered under FSDP2), pooled with the
        matrices and other experts of that shape."""
        by_key: dict[tuple, list] = {}
        for p, group, update in items:
            full = _full(update)
            if group.get("experts"):  # contiguous, so each matrix meets the kernels a 2-D param would
                stack = expert_matrices(full, ExpertLayout.from_group(group)).contiguous()
            else:
                stack = full.unsqueeze(0)
            by_key.setdefault(_ns_key(stack[0], group), []).append((p, group, stack))
        done = {}
        for batch in by_key.values():
            if len(batch) < 2 and not batch[0][1].get("experts"):
                continue
            group = batch[0][1]
            stacks = [stack for _, _, stack in batch]
            out = newton_schulz_batched(stacks[0] if len(stacks) == 1 else torch.cat(stacks), group["ns_coefficients"],
                                        group["ns_steps"], group["eps"], _ns_dtype(group))
            for (p, g, _), ortho in zip(batch, out.split([len(s) for s in stacks])):
                done[p] = ortho if g.get("experts") else _like(ortho[0], p)
        return done


def _matrix_shape(p: torch.Tensor, group: dict) -> tuple[int, int]:
    """The stored (A, B) of a matrix; for an expert tensor, (out, in) of each of its expert matrices."""
    if not group.get("experts"):
        return tuple(p.shape)
    return expert_matrix_shape(p.shape, ExpertLayout.from_group(group))[1:]



def _refuse_sharded(p: torch.Tensor, option: str, off: str) -> None:
    """One line for an option whose per-vector statistics span the shards of an FSDP2 (DTensor) parameter."""
    if is_dtensor(p):
        raise ValueError(f"Muon: {option} does not work on sharded (FSDP2) parameters; use DDP, or {off}")


def _check_hyperball(value: Any, normuon_beta2: Optional[float], cautious_wd: bool) -> None:
    check_bool("Muon", "hyperball", value)
    if value and normuon_beta2 is not None:
        raise OptionError("Muon", "hyperball", value, "use one of them",
                          problem="got True with normuon_beta2 set, and both normalise the update")
    if value and cautious_wd:
        raise OptionError("Muon", "hyperball", value, "use one of them",
                          problem="got True with cautious_wd=True, which would do nothing "
                          "(hyperball replaces weight decay on the Muon matrices)")


def _check_normuon_beta2(value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1):
        raise OptionError("Muon", "normuon_beta2", value, "must be null (plain Muon) or a number in [0, 1)")


def check_muon_options(*, lr, weight_decay, momentum, nesterov, ns_steps, adjust_lr_fn, betas, eps, fused,
                       ns_coefficients, cautious, ns_sharding, ns_batched, normuon_beta2, cautious_wd, hyperball,
                       ns_dtype) -> tuple[float, float]:
    """`MuonWithAdamW`'s argument checks, in its order, on values alone (no parameters, no device asked);
    returns the AdamW part's betas as floats."""
    check_nonnegative("Muon", "lr", lr)
    check_nonnegative("Muon", "weight_decay", weight_decay)
    check_unit_interval("Muon", "momentum", momentum)
    check_positive_int("Muon", "ns_steps", ns_steps, maximum=99)
    if adjust_lr_fn not in ADJUST_LR_FNS:
        raise OptionError("Muon", "adjust_lr_fn", adjust_lr_fn, "allowed: " + ", ".join(ADJUST_LR_FNS))
    betas = check_betas("Muon", betas, 2)
    check_nonnegative("Muon", "eps", eps)
    check_bool("Muon", "nesterov", nesterov)
    check_bool("Muon", "cautious", cautious)
    if cautious and fused:
        raise OptionError("Muon", "fused", fused, "leave fused unset or false",
                          problem=f"got {fused!r} with cautious=True, which has no fused AdamW kernel")
    ns_coefficient_schedule(ns_coefficients, ns_steps)  # raises naming the field
    if ns_sharding not in NS_SHARDING:
        raise OptionError("Muon", "ns_sharding", ns_sharding, "allowed: " + ", ".join(NS_SHARDING))
    check_ns_dtype(ns_dtype)
    _check_normuon_beta2(normuon_beta2)
    check_bool("Muon", "cautious_wd", cautious_wd)
    _check_hyperball(hyperball, normuon_beta2, cautious_wd)
    check_bool("Muon", "ns_batched", ns_batched)
    return betas


class MuonWithAdamW(Optimizer):
    """Muon (as `torch.optim.Muon`) for groups with `use_muon=True`, AdamW for the others.

    One optimizer for the Trainer: `step`, `zero_grad`, `state_dict`, `load_state_dict` and
    `param_groups` cover both parts (the two inner optimizers share this object's group dicts and
    state). Every param group must carry `"use_muon": bool`; groups may override `lr` and
    `weight_decay`. Use `hf_fasttrain.optim.create_optimizer("muon", model)` to get the groups
    built from a model (`muon_routing`).

    Args:
        params: param-group dicts, each with a "use_muon" key.
        lr: learning rate of both parts unless a group sets its own.
        weight_decay: decoupled weight decay of both parts unless a group sets its own.
        momentum: Muon's (see `torch.optim.Muon`).
        nesterov: Muon's (see `torch.optim.Muon`).
        ns_steps: Muon's (see `torch.optim.Muon`).
        adjust_lr_fn: Muon's (see `torch.optim.Muon`).
        ns_coefficients: Newton-Schulz coefficients: "jordan" (default, torch's quintic),
            "polar_express", or explicit (a, b, c) triples (see `ns_coefficient_schedule`).
        betas: AdamW's.
        eps: AdamW's.
        cautious: cautious AdamW part (Liang et al. 2024, see `hf_fasttrain.optim.AdamW`).
        ns_sharding: under FSDP2, "all_gather" (default) or "round_robin" (see `Muon`).
        ns_batched: orthogonalise matrices of one shape together (default True; see `Muon`).
        ns_dtype: the Newton-Schulz precision: "auto" (default: bf16, as torch's, where the device multiplies
            bf16 natively, so on CUDA; fp32 on a CPU that would emulate it), "bfloat16" or "float32"
            (`hf_fasttrain.optim.orthogonalize`).
        normuon_beta2: None (default) for Muon; a number in [0, 1) (the authors use 0.95) for NorMuon
            (`hf_fasttrain.optim.normuon`): each update normalised per output neuron by a second moment
            with this EMA coefficient. A group's ``normuon_dim`` (1, or 0 for `Conv1D` weights) names the
            input axis. Not under FSDP2.
        hyperball: Hyperball (Wen et al. 2025, `hf_fasttrain.optim.hyperball`): each Muon matrix's vectors
            (columns of `nn.Linear`; a group's ``hyperball_dim`` 1 for `Conv1D`) stay at their norms of the
            first step, and every step moves them by ``lr * s(A, B)`` of that norm; no weight decay on those
            matrices (the AdamW part keeps its own). Not under FSDP2; not with `normuon_beta2` or `cautious_wd`.
        cautious_wd: cautious weight decay on the Muon matrices (Chen et al. 2025, arXiv:2510.12402):
            an element decays only where the update and the weight have the same sign, i.e. where the
            decay moves it the way the update does: theta -= lr (s O + wd 1[O theta >= 0] theta).
            Element-wise, so FSDP2 gives the single-process step. The AdamW part decays as AdamW.
        fused: AdamW's fused kernel; None: fused when every AdamW param is on CUDA, else foreach.
            Not with `cautious` (that AdamW has no fused kernel).

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim import MuonWithAdamW
        >>> net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
        >>> opt = MuonWithAdamW([
        ...     {"params": [net[0].weight], "use_muon": True},
        ...     {"params": [net[0].bias, *net[1].parameters()], "use_muon": False, "weight_decay": 0.0},
        ... ], lr=1e-3)
        >>> net(torch.ones(2, 4)).sum().backward()
        >>> opt.step()
        >>> [type(o).__name__ for o in opt.inner_optimizers]
        ['Muon', 'AdamW']
        ```
    """

    def __init__(
        self,
        params: Iterable[dict[str, Any]],
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_steps: int = 5,
        adjust_lr_fn: str = "match_rms_adamw",
        betas: tuple[float, float] = (0.9, 0.95),
        eps: float = 1e-8,
        fused: Optional[bool] = None,
        ns_coefficients: Any = "jordan",
        cautious: bool = False,
        ns_sharding: str = "all_gather",
        ns_batched: bool = True,
        normuon_beta2: Optional[float] = None,
        cautious_wd: bool = False,
        hyperball: bool = False,
        ns_dtype: str = "auto",
    ):
        betas = check_muon_options(lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
                                   ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn, betas=betas, eps=eps, fused=fused,
                                   ns_coefficients=ns_coefficients, cautious=cautious, ns_sharding=ns_sharding,
                                   ns_batched=ns_batched, normuon_beta2=normuon_beta2, cautious_wd=cautious_wd,
                                   hyperball=hyperball, ns_dtype=ns_dtype)
        self._muon_defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
            "ns_coefficients": ns_coefficients,
            "normuon_beta2": normuon_beta2,
            "cautious_wd": cautious_wd,
            "hyperball": hyperball,
            "ns_dtype": ns_dtype,
        }
        self._cautious = cautious
        self._ns_sharding = ns_sharding
        self._ns_batched = ns_batched
        self._adamw_defaults = {"lr": lr, "weight_decay": weight_decay, "betas": betas, "eps": eps}
        self._fused = fused
        self._muon: Optional[Optimizer] = None
        self._adamw: Optional[Optimizer] = None
        super().__init__(params, {"lr": lr, "weight_decay": weight_decay})

    @property
    def inner_optimizers(self) -> list[Optimizer]:
        """The torch optimizers doing the work: [Muon, AdamW], either absent when it has no groups."""
        return [opt for opt in (self._muon, self._adamw) if opt is not None]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        """Add a group to Muon (`use_muon=True`) or AdamW (`use_muon=False`) and to this optimizer."""
        if not isinstance(param_group, dict) or not isinstance(param_group.get("use_muon"), bool):
            raise ValueError(
                "MuonWithAdamW: every param group must be a dict with 'use_muon': True or False, got "
                f"{param_group if not isinstance(param_group, dict) else sorted(param_group)!r}"
            )
        if param_group["use_muon"]:
            experts = param_group.get("experts", False)
            ndim = 2
            if experts:
                ndim = ExpertLayout.from_group(param_group).ndim  # raises naming a bad key
                if param_group.get("hyperball", self._muon_defaults["hyperball"]):
                    raise ValueError(HYPERBALL_EXPERTS)
            for p in param_group["params"]:
                tensor = p[1] if isinstance(p, tuple) else p
                if tensor.ndim != ndim:
                    name = f"{p[0]!r} " if isinstance(p, tuple) else ""
                    want = ("2-D matrices" if not experts else "3-D expert tensors (experts x out x in)" if ndim == 3
                            else "2-D flat expert tensors ((experts x out) x in)")
                    tail = "" if experts or tensor.ndim != 3 else " or mark expert tensors with 'experts': True"
                    raise ValueError(
                        f"Muon: params in a use_muon group must be {want}, got {name}with shape "
                        f"{tuple(tensor.shape)}; route it to AdamW (use_muon=False){tail}"
                    )
            if self._muon is None:
                self._muon = Muon([param_group], **self._muon_defaults, ns_sharding=self._ns_sharding,
                                  ns_batched=self._ns_batched)
            else:
                self._muon.add_param_group(param_group)
        else:
            if self._adamw is None:  # torch's AdamW (fused on CUDA, else foreach), or the cautious one
                self._adamw = build_adamw([param_group], **self._adamw_defaults, fused=self._fused,
                                          cautious=self._cautious)
            else:
                self._adamw.add_param_group(param_group)
        # The inner optimizer filled in its defaults in place; register the same dict here.
        super().add_param_group(param_group)
        self._link()

    def _link(self) -> None:
        """Point the inner optimizers at this optimizer's group dicts and state (after a load too)."""
        for opt, use_muon in ((self._muon, True), (self._adamw, False)):
            if opt is not None:
                opt.param_groups = [g for g in self.param_groups if g["use_muon"] is use_muon]
                opt.state = self.state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load a state dict saved by `state_dict()`; the inner optimizers follow."""
        super().load_state_dict(state_dict)
        self._link()

    def step(self, closure=None):
        """One step of Muon on the hidden matrices and of AdamW on the rest."""
        loss = evaluate_closure(closure)
        for opt in self.inner_optimizers:
            opt.step()
        return loss
