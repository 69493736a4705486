"""Muon for hidden matrices plus AdamW for everything else, as one optimizer.

Muon (Jordan et al. 2024, "Muon: An optimizer for hidden layers in neural networks",
kellerjordan.github.io/posts/muon) replaces each 2-D weight's momentum by its orthogonalisation,
computed with 5 Newton-Schulz iterations:

    B_t     = mu B_{t-1} + g_t;   U_t = g_t + mu B_t (Nesterov)
    O_t     = NewtonSchulz5(U_t)                      # ~ U V^T of the SVD U S V^T of U_t
    theta_t = theta_{t-1} (1 - lr lambda) - lr * s(A, B) * O_t

It is meant for the hidden weight matrices only; embeddings, the LM head, biases and norms are
trained with AdamW. `torch.optim.Muon` (torch >= 2.9) does the Muon part here and
`torch.optim.AdamW` the rest; `MuonWithAdamW` holds both behind one `torch.optim.Optimizer` whose
`param_groups` are the union of theirs (so an LR scheduler scales every group) and whose state dict
is one ordinary optimizer state dict.

Scale s(A, B) of the update (torch's `adjust_lr_fn`):
- "match_rms_adamw" (default; Liu et al. 2025, "Muon is Scalable for LLM Training", arXiv:2502.16982):
  s = 0.2 sqrt(max(A, B)), which gives the update the RMS of a typical AdamW update, so Muon can use
  AdamW's lr and weight decay (0.1); here both parts share `lr` unless `muon_lr` is given.
- "original" (Jordan et al. 2024): s = sqrt(max(1, fan_out / fan_in)), with lr 0.02 for Muon.
  torch computes it from the first two dims of the stored weight, which for GPT-2's `Conv1D`
  (stored as in x out, the transpose of `nn.Linear`) gives fan_in / fan_out; `muon_routing` finds
  those weights and `create_muon` puts them in groups whose lr (and, inversely, weight decay) is
  multiplied to restore the intended scale. "match_rms_adamw" is symmetric and needs no correction.

Differences from Jordan et al.'s reference: torch's Muon keeps the momentum as an EMA
(lerp with 1 - mu); the Newton-Schulz normalisation makes the update identical up to eps.
torch keeps Muon's and AdamW's state in the parameter dtype (fp32 under the Trainer's mixed
precision, where the master weights are fp32).
"""

from __future__ import annotations

import math
import re
from typing import Any, Iterable, Optional, Sequence

import torch
from torch import nn
from torch.optim import Optimizer

from ._common import check_betas, check_nonnegative, check_positive_int, check_unit_interval

__all__ = ["MuonWithAdamW", "muon_routing", "conv1d_lr_multiplier", "ADJUST_LR_FNS"]

ADJUST_LR_FNS = ("match_rms_adamw", "original")


def _conv1d_type():
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # transformers is a dependency; this only keeps the module importable alone
        return ()
    return (Conv1D,)


def muon_routing(model: nn.Module, adamw_patterns: Sequence[str] = ()) -> dict[str, str]:
    """Route every trainable parameter of `model` to "muon" or "adamw".

    "muon": the 2-D weight of an `nn.Linear` or transformers `Conv1D` that is neither the input nor
    the output embedding (the LM head, tied or not) and whose name matches none of the regexes in
    `adamw_patterns`. "adamw": everything else (embeddings, LM head, biases, norms, other tensors).
    Tied weights appear once, under their first name (as in `model.named_parameters()`).

    Example:
        >>> import torch
        >>> from hf_fasttrain.optim import muon_routing
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4))
        >>> muon_routing(net)
        {'0.weight': 'muon', '0.bias': 'adamw', '1.weight': 'adamw', '1.bias': 'adamw'}
    """
    embeddings: set[int] = set()
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            embeddings.update(id(p) for p in module.parameters(recurse=False))
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        try:
            module = getattr(model, getter)() if hasattr(model, getter) else None
        except NotImplementedError:
            module = None
        if module is not None:
            embeddings.update(id(p) for p in module.parameters(recurse=False))

    hidden_types = (nn.Linear, *_conv1d_type())
    hidden = {id(m.weight) for m in model.modules() if isinstance(m, hidden_types)}
    patterns = [re.compile(p) for p in adamw_patterns]

    routing = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_hidden = id(p) in hidden and id(p) not in embeddings and p.ndim == 2
        forced = any(pat.search(name) for pat in patterns)
        routing[name] = "muon" if is_hidden and not forced else "adamw"
    return routing


def conv1d_lr_multiplier(shape: Sequence[int], adjust_lr_fn: str) -> float:
    """Factor that turns torch Muon's scale for a `Conv1D` weight (in x out) into the intended one.

    torch scales by sqrt(max(1, A / B)) from the stored shape (A, B); for a weight stored as
    (in, out) the intended "original" scale is sqrt(max(1, out / in)). "match_rms_adamw" is
    symmetric in A and B, so its factor is 1.
    """
    if adjust_lr_fn != "original":
        return 1.0
    fan_in, fan_out = shape[0], shape[1]
    return math.sqrt(max(1.0, fan_out / fan_in)) / math.sqrt(max(1.0, fan_in / fan_out))


class MuonWithAdamW(Optimizer):
    """`torch.optim.Muon` for groups with `use_muon=True`, `torch.optim.AdamW` for the others.

    One optimizer for the Trainer: `step`, `zero_grad`, `state_dict`, `load_state_dict` and
    `param_groups` cover both parts (the two inner optimizers share this object's group dicts and
    state). Every param group must carry `"use_muon": bool`; groups may override `lr` and
    `weight_decay`. Use `hf_fasttrain.optim.create_optimizer("muon", model)` to get the groups
    built from a model (`muon_routing`).

    Args:
        params: param-group dicts, each with a "use_muon" key.
        lr: learning rate of both parts unless a group sets its own.
        weight_decay: decoupled weight decay of both parts unless a group sets its own.
        momentum, nesterov, ns_steps, adjust_lr_fn: Muon's (see `torch.optim.Muon`).
        betas, eps: AdamW's.
        fused: AdamW's fused kernel; None: fused when every AdamW param is on CUDA, else foreach.

    Example:
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
    ):
        if not hasattr(torch.optim, "Muon"):
            raise ImportError(f"MuonWithAdamW needs torch.optim.Muon (torch >= 2.9), found torch {torch.__version__}")
        check_nonnegative("Muon", "lr", lr)
        check_nonnegative("Muon", "weight_decay", weight_decay)
        check_unit_interval("Muon", "momentum", momentum)
        check_positive_int("Muon", "ns_steps", ns_steps, maximum=99)
        if adjust_lr_fn not in ADJUST_LR_FNS:
            raise ValueError(f"Muon: adjust_lr_fn must be one of {list(ADJUST_LR_FNS)}, got {adjust_lr_fn!r}")
        betas = check_betas("Muon", betas, 2)
        check_nonnegative("Muon", "eps", eps)
        if not isinstance(nesterov, bool):
            raise ValueError(f"Muon: nesterov must be a bool, got {nesterov!r}")
        self._muon_defaults = {
            "lr": lr,
            "weight_decay": weight_decay,
            "momentum": momentum,
            "nesterov": nesterov,
            "ns_steps": ns_steps,
            "adjust_lr_fn": adjust_lr_fn,
        }
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
            for p in param_group["params"]:
                tensor = p[1] if isinstance(p, tuple) else p
                if tensor.ndim != 2:
                    name = f"{p[0]!r} " if isinstance(p, tuple) else ""
                    raise ValueError(
                        f"Muon: params in a use_muon group must be 2-D matrices, got {name}with shape "
                        f"{tuple(tensor.shape)}; route it to AdamW (use_muon=False)"
                    )
            if self._muon is None:
                self._muon = torch.optim.Muon([param_group], **self._muon_defaults)
            else:
                self._muon.add_param_group(param_group)
        else:
            if self._adamw is None:
                tensors = [p[1] if isinstance(p, tuple) else p for p in param_group["params"]]
                fused = self._fused if self._fused is not None else bool(tensors) and all(t.is_cuda for t in tensors)
                kernel = {"fused": True} if fused else {"foreach": True}
                self._adamw = torch.optim.AdamW([param_group], **self._adamw_defaults, **kernel)
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
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.inner_optimizers:
            opt.step()
        return loss
