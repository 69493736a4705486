"""The learning rate of each parameter group by its role, for the logs.

An optimizer built with per-group lrs (`hf_fasttrain.optim.groups`: ``lr_multipliers``, ``weight_decay_on``) carries
each group's role as ``lr_group``; one built with several lrs and no roles (Muon's ``adamw_lr_ratio``, an explicit
``muon_lr``) is named by the roles of the parameters each group holds (`param_roles`). :func:`lr_logs` gives
``{"lr/<role>": lr}``, the lr of the first group of each role, in `ROLES` order; :func:`logged_learning_rate` is the
one lr the Trainer logs as ``learning_rate``: the ``matrix`` group's (the hidden matrices, what an lr sweep tunes),
else the first group's.

Example:
    >>> groups = [{"lr": 0.02, "lr_group": "embedding"}, {"lr": 0.001, "lr_group": "matrix"}]
    >>> lr_logs(groups), logged_learning_rate(groups)
    ({'lr/embedding': 0.02, 'lr/matrix': 0.001}, 0.001)
"""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

from .groups import ROLES

__all__ = ["LEARNING_RATE_ROLE", "group_roles", "logged_learning_rate", "lr_logs"]

# the role whose lr is logged as `learning_rate`
LEARNING_RATE_ROLE = "matrix"


def _lr(group: Mapping) -> float:
    lr = group["lr"]
    return float(lr.item() if hasattr(lr, "item") else lr)


def group_roles(groups: Sequence[Mapping], roles: Optional[Mapping[str, str]] = None) -> list[tuple[str, ...]]:
    """The roles of each group: its ``lr_group``; else the roles (of `roles`, by name) of the parameters it names
    in ``param_names``, in `ROLES` order; empty where neither says."""
    out = []
    for group in groups:
        if group.get("lr_group") is not None:
            out.append((group["lr_group"],))
            continue
        held = {roles[n] for n in group.get("param_names") or () if roles and n in roles}
        out.append(tuple(r for r in ROLES if r in held))
    return out


def lr_logs(groups: Sequence[Mapping], roles: Optional[Mapping[str, str]] = None) -> dict[str, float]:
    """``{"lr/<role>": lr}`` of the first group of each role (`group_roles`), in `ROLES` order; empty when the groups
    carry no ``lr_group`` and share one lr (one lr says it all: ``learning_rate``)."""
    if not any(g.get("lr_group") is not None for g in groups) and len({_lr(g) for g in groups}) < 2:
        return {}
    first: dict[str, float] = {}
    for group, held in zip(groups, group_roles(groups, roles)):
        for role in held:
            first.setdefault(role, _lr(group))
    return {f"lr/{role}": first[role] for role in ROLES if role in first}


def logged_learning_rate(groups: Sequence[Mapping], roles: Optional[Mapping[str, str]] = None) -> float:
    """The lr logged as ``learning_rate``: the first ``matrix`` group's, else the first group's."""
    for group, held in zip(groups, group_roles(groups, roles)):
        if LEARNING_RATE_ROLE in held:
            return _lr(group)
    return _lr(groups[0])
