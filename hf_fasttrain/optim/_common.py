"""Shared pieces of the optimizers in this package: argument checks, the start of every ``step`` (closure,
params with a gradient, fresh state), fp32 state, tensor bucketing.

Nothing here is public API; the optimizers import it.
"""

from __future__ import annotations

import math
from collections import defaultdict
from itertools import chain
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch
from torch.optim import Optimizer

from ..validation import ConfigError

__all__ = [
    "LOW_PRECISION",
    "FP32StateOptimizer",
    "OptionError",
    "check_betas",
    "check_bool",
    "check_nonnegative",
    "check_positive_int",
    "check_unit_interval",
    "cautious_",
    "evaluate_closure",
    "is_dtensor",
    "params_with_grad",
    "state_dtype",
    "zero_state",
    "is_real_number",
]

# Parameters stored in these dtypes get their optimizer state (and the update arithmetic) in fp32.
LOW_PRECISION = (torch.float16, torch.bfloat16)


class OptionError(ConfigError):
    """A refused optimizer option: ``<field>: got <value> for <Owner>; <what is allowed>``.

    A ``ValueError`` (a :class:`~hf_fasttrain.validation.ConfigError`); ``owner`` is the optimizer's name.
    The command line names the field as a user gives it there, ``optimizer_kwargs.<field>``.

    Example:
        >>> str(OptionError("Muon", "ns_steps", 0, "must be an integer in [1, 99]"))
        'ns_steps: got 0 for Muon; must be an integer in [1, 99]'
    """

    def __init__(self, owner: str, field: str, value: Any, allowed: str, problem: Optional[str] = None):
        self.owner = owner
        super().__init__(field, value, allowed, problem if problem is not None else f"got {value!r} for {owner}")


def is_real_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_nonnegative(owner: str, field: str, value: Any) -> float:
    """Raise ValueError unless `value` is a finite number >= 0; return it as float."""
    if not is_real_number(value) or value < 0:
        raise OptionError(owner, field, value, "must be a finite number >= 0")
    return float(value)


def check_unit_interval(owner: str, field: str, value: Any) -> float:
    """Raise ValueError unless `value` is a number in [0, 1) (a decay rate such as a beta)."""
    if not is_real_number(value) or not 0.0 <= value < 1.0:
        raise OptionError(owner, field, value, "must be a number in [0, 1)")
    return float(value)


def check_betas(owner: str, betas: Any, n: int, field: str = "betas") -> tuple[float, ...]:
    """Raise ValueError unless `betas` is a sequence of `n` numbers, each in [0, 1)."""
    if isinstance(betas, (str, bytes)) or not isinstance(betas, Sequence) or len(betas) != n:
        shown = list(betas) if isinstance(betas, (list, tuple)) else betas
        raise OptionError(owner, field, shown, f"must be a list of {n} numbers in [0, 1)")
    if not all(is_real_number(b) and 0.0 <= b < 1.0 for b in betas):
        raise OptionError(owner, field, list(betas), f"must be a list of {n} numbers in [0, 1)")
    return tuple(float(b) for b in betas)


def check_positive_int(owner: str, field: str, value: Any, maximum: int | None = None) -> int:
    """Raise ValueError unless `value` is an int >= 1 (and <= maximum when given)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 1 or (maximum is not None and value > maximum):
        allowed = f"an integer in [1, {maximum}]" if maximum is not None else "an integer >= 1"
        raise OptionError(owner, field, value, f"must be {allowed}")
    return value


def check_bool(owner: str, field: str, value: Any) -> bool:
    """Raise ValueError unless `value` is a bool (a switch such as ``cautious``)."""
    if not isinstance(value, bool):
        raise OptionError(owner, field, value, "must be true or false")
    return value


# ---- the start of every step ---------------------------------------------------------------------


def evaluate_closure(closure) -> Optional[torch.Tensor]:
    """The loss ``step(closure)`` returns: `closure` re-evaluated with gradients on, or None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def params_with_grad(owner: str, group: dict[str, Any]) -> Iterator[torch.Tensor]:
    """The params of a param group that have a gradient, in order; a sparse gradient raises (`owner` names
    the optimizer in the message)."""
    for p in group["params"]:
        if p.grad is None:
            continue
        if p.grad.is_sparse:
            raise RuntimeError(f"{owner} does not support sparse gradients")
        yield p


def zero_state(state: dict[str, Any], like: torch.Tensor, names: Sequence[str], dtype: Optional[torch.dtype] = None,
               step: bool = True) -> None:
    """Fill a param's state at its first step: ``step`` = 0 (a float tensor, as torch's optimizers keep it;
    left out with ``step=False``), then a zero buffer shaped like `like` under each of `names`, in `dtype`
    (default: `like`'s)."""
    if step:
        state["step"] = torch.tensor(0.0)
    for name in names:
        state[name] = torch.zeros_like(like, dtype=dtype, memory_format=torch.preserve_format)


def is_dtensor(x: Any) -> bool:
    """True for a `torch.distributed.tensor.DTensor` (an FSDP2 / tensor-parallel shard)."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # torch built without distributed
        return False
    return isinstance(x, DTensor)


def cautious_(update: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """Cautious update (Liang et al. 2024, "Cautious Optimizers", arXiv:2411.16085), in place.

    The components whose sign disagrees with the gradient's are zeroed, and the rest rescaled so
    the update keeps its size: with the mask m = 1[update * grad > 0],

        update <- update * m * numel / (sum(m) + 1)

    which is the rescale of the authors' reference code (github.com/kyleliang919/C-Optim; the +1
    keeps an all-zero mask finite). Per tensor. For a DTensor shard the count sum(m) and numel are
    the whole tensor's, so a sharded step equals the single-process one.

    Example:
        >>> import torch
        >>> u, g = torch.tensor([1.0, -2.0, 3.0, 4.0]), torch.tensor([1.0, 1.0, -1.0, 2.0])
        >>> cautious_(u, g)  # mask [1, 0, 0, 1]: scale 4 / (2 + 1)
        tensor([1.3333, -0.0000, 0.0000, 5.3333])
    """
    mask = (update * grad > 0).to(update.dtype)
    kept = mask.sum()
    update.mul_(mask)
    if is_dtensor(kept):
        # The shard-local sums add up to the whole tensor's count; scale each shard by it.
        scale = update.numel() / (kept.full_tensor() + 1)
        update.to_local().mul_(scale)
    else:
        update.mul_(mask.numel() / (kept + 1))
    return update


def state_dtype(param: torch.Tensor) -> torch.dtype:
    """The dtype optimizer state is kept in: fp32 for fp16/bf16 params, the param's own dtype otherwise."""
    return torch.float32 if param.dtype in LOW_PRECISION else param.dtype


def bucket(indices: Iterable[int], key_fn) -> dict[Any, list[int]]:
    """Group positions by `key_fn(i)` (device, dtype, step...) so each bucket is one foreach call."""
    buckets: dict[Any, list[int]] = defaultdict(list)
    for i in indices:
        buckets[key_fn(i)].append(i)
    return buckets


def _keep_dtype(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device=device)
    if isinstance(value, dict):
        return {k: _keep_dtype(v, device) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_keep_dtype(v, device) for v in value)
    return value


class FP32StateOptimizer(Optimizer):
    """Base class whose state for fp16/bf16 params stays fp32 across `load_state_dict`.

    `torch.optim.Optimizer.load_state_dict` casts every floating state tensor to its param's dtype,
    which would round fp32 moments of a bf16 param to bf16 on resume. This class reloads the saved
    tensors of low-precision params with their saved dtype, so a resumed run equals a straight one.

    Subclasses use `state_dtype(p)` when they create state and `_fp32_views` / `_write_back` to do
    their arithmetic in fp32 for low-precision params.
    """

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        saved_groups = state_dict["param_groups"]
        saved_state = state_dict["state"]
        super().load_state_dict(state_dict)
        id_to_param = dict(
            zip(
                chain.from_iterable(g["params"] for g in saved_groups),
                chain.from_iterable(g["params"] for g in self.param_groups),
            )
        )
        for saved_id, value in saved_state.items():
            param = id_to_param.get(saved_id)
            if param is not None and param.dtype in LOW_PRECISION:
                self.state[param] = _keep_dtype(value, param.device)

    @staticmethod
    def _fp32_views(params: list[torch.Tensor], grads: list[torch.Tensor]):
        """(params, grads) to compute with: fp32 copies for low-precision tensors, else the tensors."""
        if params and params[0].dtype in LOW_PRECISION:
            return [p.float() for p in params], [g.float() for g in grads]
        return params, grads

    @staticmethod
    def _write_back(params: list[torch.Tensor], computed: list[torch.Tensor]) -> None:
        """Copy fp32 results back into low-precision params (a no-op when they are the same tensors)."""
        if params and params[0] is not computed[0]:
            torch._foreach_copy_(params, computed)
