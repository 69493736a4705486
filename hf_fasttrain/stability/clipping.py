"""Gradient clipping as plain functions on lists of tensors: by value, by global L2 norm, adaptive (AGC).

Each ``clip_*_`` function edits the gradients it is given in place and returns a :class:`ClipStats`
with the global L2 norm before and after clipping and how much was clipped. The statistics stay
tensors on the gradients' device, so clipping never forces a host-device sync; call ``.item()`` (or
:meth:`ClipStats.as_floats`) when logging.

Non-finite gradients are left as they are: clipping cannot repair a NaN, and a divergence guard (or
the fp16 ``GradScaler``) must still see the NaN/inf to skip the step. Concretely, when the global
norm is not finite, no tensor is changed and ``num_clipped`` is 0. (``torch.nn.utils.clip_grad_value_``
would turn ``inf`` into ``clip_value`` and hide the overflow.)

References:
    - Clipping by global norm: Pascanu, Mikolov, Bengio, "On the difficulty of training recurrent
      neural networks", ICML 2013.
    - Adaptive gradient clipping (AGC): Brock, De, Smith, Simonyan, "High-Performance Large-Scale
      Image Recognition Without Normalization", ICML 2021 (arXiv:2102.06171), section 4.1.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..validation import ConfigError

__all__ = [
    "CLIP_MODES",
    "ClipStats",
    "global_grad_norm",
    "clip_by_value_",
    "clip_by_global_norm_",
    "norm_clip_stats",
    "clip_agc_",
    "default_unit_dims",
    "agc_unit_dims",
]

# clip_mode values: FastTrainingArguments.clip_mode and GradientClippingCallback(mode=...)
CLIP_MODES = ("norm", "value", "agc", "none")

# A gradient's units for AGC: the dims to reduce over to get one norm per unit, or None (leave unclipped).
UnitDims = tuple[int, ...] | None


@dataclass
class ClipStats:
    """What one clipping call did. Tensors are 0-dim, on the gradients' device.

    Attributes:
        pre_norm: global L2 norm of all given gradients before clipping (float32).
        post_norm: the same after clipping.
        num_clipped: how many elements (value), units (AGC) or steps (norm: 0 or 1) were clipped.
        num_total: how many elements / units / steps there were.
    """

    pre_norm: torch.Tensor
    post_norm: torch.Tensor
    num_clipped: torch.Tensor
    num_total: int

    @property
    def fraction(self) -> torch.Tensor:
        """``num_clipped / num_total`` (0 when there was nothing to clip)."""
        return self.num_clipped.float() / max(self.num_total, 1)

    def as_floats(self) -> dict[str, float]:
        """The statistics as Python numbers (one host sync)."""
        return {
            "pre_norm": float(self.pre_norm),
            "post_norm": float(self.post_norm),
            "num_clipped": int(self.num_clipped),
            "num_total": self.num_total,
            "fraction": float(self.fraction),
        }


def _check_positive(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0 or value != value:
        raise ConfigError(name, value, "must be a finite number > 0")
    if value == float("inf"):
        raise ConfigError(name, value, "must be a finite number > 0")


def global_grad_norm(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    """L2 norm of all tensors viewed as one vector, computed in float32 (0-dim tensor; 0.0 if empty)."""
    if len(grads) == 0:
        return torch.zeros((), dtype=torch.float32)
    device = grads[0].device
    norms = [torch.linalg.vector_norm(g, 2, dtype=torch.float32).to(device) for g in grads]
    return torch.linalg.vector_norm(torch.stack(norms), 2)


def _zero_count(grads: Sequence[torch.Tensor]) -> torch.Tensor:
    device = grads[0].device if grads else torch.device("cpu")
    return torch.zeros((), dtype=torch.int64, device=device)


def clip_by_value_(grads: Sequence[torch.Tensor], clip_value: float) -> ClipStats:
    """Clamp every gradient element to ``[-clip_value, clip_value]`` in place.

    ``num_clipped`` counts the elements whose magnitude was above ``clip_value``; ``num_total`` is the
    number of elements. Non-finite gradients are left unchanged (see the module docstring).

    Example:
        >>> g = torch.tensor([0.5, -3.0, 2.0])
        >>> stats = clip_by_value_([g], clip_value=1.0)
        >>> g.tolist(), int(stats.num_clipped), stats.num_total
        ([0.5, -1.0, 1.0], 2, 3)
    """
    _check_positive("clip_value", clip_value)
    grads = list(grads)
    pre = global_grad_norm(grads)
    if not grads:
        return ClipStats(pre, pre.clone(), _zero_count(grads), 0)
    finite = torch.isfinite(pre)
    # clip_value where the gradients are finite, +inf (a no-op clamp) where they are not: no host sync
    bound = torch.where(finite, torch.full_like(pre, float(clip_value)), torch.full_like(pre, float("inf")))
    count = _zero_count(grads)
    total = 0
    for g in grads:
        b = bound.to(device=g.device, dtype=g.dtype)
        count = count + (g.abs() > b).sum().to(count.device)
        total += g.numel()
        g.clamp_(-b, b)
    return ClipStats(pre, global_grad_norm(grads), count, total)


def clip_by_global_norm_(grads: Sequence[torch.Tensor], max_norm: float) -> ClipStats:
    """Scale all gradients by ``max_norm / norm`` when their global L2 norm is above ``max_norm``.

    Unlike ``torch.nn.utils.clip_grad_norm_`` (which always multiplies, by a coefficient clamped to 1),
    gradients at or below the threshold are untouched bit for bit. ``num_clipped`` is 1 if this step was
    clipped, else 0 (``num_total`` is 1). Non-finite gradients are left unchanged.

    Example:
        >>> g = torch.tensor([3.0, 4.0])                  # norm 5
        >>> stats = clip_by_global_norm_([g], max_norm=1.0)
        >>> [round(x, 4) for x in g.tolist()], float(stats.pre_norm), round(float(stats.post_norm), 4)
        ([0.6, 0.8], 5.0, 1.0)
    """
    _check_positive("max_norm", max_norm)
    grads = list(grads)
    pre = global_grad_norm(grads)
    if not grads:
        return ClipStats(pre, pre.clone(), _zero_count(grads), 1)
    clip = torch.isfinite(pre) & (pre > max_norm)
    coef = torch.where(clip, max_norm / pre.clamp_min(1e-12), torch.ones_like(pre))
    for g in grads:
        # multiplying by exactly 1.0 leaves values unchanged; skipping the multiply would need a host sync
        g.mul_(coef.to(device=g.device, dtype=g.dtype))
    return ClipStats(pre, global_grad_norm(grads), clip.to(torch.int64), 1)


def norm_clip_stats(pre_norm: torch.Tensor | float, max_norm: float) -> ClipStats:
    """The :class:`ClipStats` of a norm clip someone else did (``torch.nn.utils.clip_grad_norm_``, which
    the Trainer uses with ``max_grad_norm``), from the pre-clip norm it returned.

    torch multiplies by ``min(1, max_norm / (norm + 1e-6))``, so the post-clip norm follows exactly.

    Example:
        >>> s = norm_clip_stats(torch.tensor(4.0), max_norm=1.0)
        >>> round(float(s.post_norm), 5), int(s.num_clipped)
        (1.0, 1)
    """
    pre = torch.as_tensor(pre_norm, dtype=torch.float32).detach().reshape(())
    post = pre * torch.clamp(max_norm / (pre + 1e-6), max=1.0)
    return ClipStats(pre, post, (pre > max_norm).to(torch.int64), 1)


def default_unit_dims(tensor: torch.Tensor) -> UnitDims:
    """AGC units of a tensor in PyTorch layout ``(out, in, ...)``: one unit per row (reduce dims 1..n-1).

    Scalars and vectors (biases, norm gains) get ``None``: they are not clipped (see :func:`clip_agc_`).
    """
    if tensor.ndim <= 1:
        return None
    return tuple(range(1, tensor.ndim))


def clip_agc_(
    params: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    clip_lambda: float = 0.01,
    eps: float = 1e-3,
    unit_dims: Sequence[UnitDims] | None = None,
) -> ClipStats:
    """Adaptive gradient clipping (AGC), unit-wise, in place (Brock et al. 2021, eq. 3).

    For each unit ``i`` (a row of a weight matrix: the weights into one output unit)::

        if ||G_i|| / max(||W_i||, eps) > clip_lambda:
            G_i <- clip_lambda * max(||W_i||, eps) / ||G_i|| * G_i

    Args:
        params: the weights ``W``.
        grads: their gradients ``G`` (same order and shapes), edited in place.
        clip_lambda: the ratio threshold lambda. The paper uses 0.01 for its largest batches and larger
            values (up to 0.16) for smaller batches.
        eps: the floor on the weight norm, so zero-initialised units can still move (paper: 1e-3).
        unit_dims: per tensor, the dims to reduce over to get one norm per unit, or ``None`` to leave that
            tensor unclipped. Default: :func:`default_unit_dims` (rows; vectors unclipped). Use ``(0,)``
            for ``(in, out)`` layouts such as the HF ``Conv1D`` of GPT-2; :func:`agc_unit_dims` does this
            for a model.

    Returns:
        :class:`ClipStats` with ``num_clipped`` / ``num_total`` counting units; the norms cover all
        gradients given, clipped or not. Non-finite gradients are left unchanged.

    Note:
        Following the paper's convention ("it is beneficial not to clip the final linear layer"), the
        output layer should be excluded; :func:`agc_unit_dims` does so. Vectors are not clipped by
        default: they have no output units (the paper's reference code clips each vector as one unit;
        pass ``unit_dims`` with ``(0,)`` for them to get that).

    Example:
        >>> w = torch.tensor([[1.0, 0.0], [0.0, 1.0]])    # both rows have norm 1
        >>> g = torch.tensor([[0.5, 0.0], [0.0, 0.001]])  # ratios 0.5 and 0.001
        >>> stats = clip_agc_([w], [g], clip_lambda=0.01)
        >>> [[round(x, 6) for x in row] for row in g.tolist()], int(stats.num_clipped), stats.num_total
        ([[0.01, 0.0], [0.0, 0.001]], 1, 2)
    """
    _check_positive("clip_lambda", clip_lambda)
    _check_positive("eps", eps)
    params, grads = list(params), list(grads)
    if len(params) != len(grads):
        raise ValueError(f"params and grads must have the same length, got {len(params)} and {len(grads)}")
    if unit_dims is None:
        unit_dims = [default_unit_dims(p) for p in params]
    unit_dims = list(unit_dims)
    if len(unit_dims) != len(params):
        raise ValueError(f"unit_dims must have one entry per tensor ({len(params)}), got {len(unit_dims)}")
    pre = global_grad_norm(grads)
    if not grads:
        return ClipStats(pre, pre.clone(), _zero_count(grads), 0)
    finite = torch.isfinite(pre)
    count = _zero_count(grads)
    total = 0
    for p, g, dims in zip(params, grads, unit_dims):
        if p.shape != g.shape:
            raise ValueError(f"a parameter of shape {tuple(p.shape)} has a gradient of shape {tuple(g.shape)}")
        if dims is None:
            continue
        w_norm = torch.linalg.vector_norm(p.detach(), 2, dim=dims, keepdim=True, dtype=torch.float32).clamp_min(eps)
        g_norm = torch.linalg.vector_norm(g, 2, dim=dims, keepdim=True, dtype=torch.float32)
        max_norm = clip_lambda * w_norm
        clip = (g_norm > max_norm) & finite.to(g.device)
        scale = torch.where(clip, max_norm / g_norm.clamp_min(1e-12), torch.ones_like(g_norm))
        g.mul_(scale.to(g.dtype))
        count = count + clip.sum().to(count.device)
        total += clip.numel()
    return ClipStats(pre, global_grad_norm(grads), count, total)


def agc_unit_dims(
    model: nn.Module, clip_output_layer: bool = False, clip_vectors: bool = False
) -> list[tuple[nn.Parameter, UnitDims]]:
    """Each trainable parameter of ``model`` with its AGC unit dims (``None``: not clipped).

    Units are output units, whatever the layout:

    - ``nn.Linear``, ``nn.Embedding``, ``nn.ConvNd``: weight ``(out, in, ...)`` -> rows, dims ``(1, ...)``
      (for an embedding, one unit per token vector);
    - ``transformers.pytorch_utils.Conv1D`` (GPT-2): weight ``(in, out)`` -> columns, dims ``(0,)``;
    - any other parameter with 2+ dims -> rows;
    - vectors (biases, norm gains) -> not clipped unless ``clip_vectors`` (then one unit each);
    - the output layer (``model.get_output_embeddings()``) -> not clipped unless ``clip_output_layer``
      (Brock et al. 2021, section 4.1). With tied embeddings (GPT-2) this also leaves the input
      embedding unclipped, since it is the same tensor.

    Parameters shared between modules are listed once.
    """
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency
        Conv1D = ()

    output_ids: set[int] = set()
    if not clip_output_layer and hasattr(model, "get_output_embeddings"):
        out = model.get_output_embeddings()
        if out is not None and getattr(out, "weight", None) is not None:
            output_ids.add(id(out.weight))

    result: list[tuple[nn.Parameter, UnitDims]] = []
    seen: set[int] = set()
    for module in model.modules():
        for name, p in module.named_parameters(recurse=False):
            if id(p) in seen or not p.requires_grad:
                continue
            seen.add(id(p))
            if id(p) in output_ids:
                dims: UnitDims = None
            elif p.ndim <= 1:
                dims = tuple(range(p.ndim)) if clip_vectors else None
            elif isinstance(module, Conv1D) and name == "weight":
                dims = (0,)
            else:
                dims = tuple(range(1, p.ndim))
            result.append((p, dims))
    return result
