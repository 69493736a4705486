"""Newton-Schulz orthogonalisation for Muon: X -> ~ U V^T of the SVD U S V^T of a 2-D X, in bf16.

Newton-Schulz coefficients (`ns_coefficients`, `ns_steps`): each iteration maps
X -> a X + b (X X^T) X + c (X X^T)^2 X, i.e. every singular value s -> a s + b s^3 + c s^5.
- "jordan" (default): the fixed quintic (3.4445, -4.7750, 2.0315) of Jordan et al. 2024 and of
  `torch.optim.Muon`, 5 steps. It drives singular values into roughly [0.7, 1.2], not to 1.
- "polar_express" (Amsel, Persson, Musco and Gower 2025, "The Polar Express", arXiv:2505.16932):
  one minimax-optimal quintic per iteration (5 of them, computed for a safety factor 1.02 and
  cushion 2, the set modded-nanogpt uses); the input is divided by 1.02 ||X||_F. Iterations beyond
  the fifth repeat the last triple. On a 64 x 128 Gaussian matrix the singular values end in
  [0.86, 1.15] (jordan: [0.68, 1.14]); the last quintic peaks at 1.14 by design.
- an explicit list of (a, b, c) triples, one per iteration (the last repeated for `ns_steps` beyond
  the list), or one triple used for every iteration.

Both functions compute as `torch.optim.Muon` does (bf16, the input divided by max(||X||_F, eps), wide
orientation by transposing a tall matrix); with "jordan" they are bit-identical to it.

Precision (`ns_dtype`): "bfloat16" (these functions' default, torch's) or "float32", or "auto" (Muon's
default): bf16 where the hardware
multiplies bf16 matrices natively (CUDA; x86 CPUs with AVX512-BF16 or AMX, Arm CPUs with the BF16
extension), fp32 elsewhere. A CPU without native bf16 (an AVX2-only x86) emulates the bf16 matmuls, at
several times the fp32 cost, and the iteration is most of Muon's step there; fp32 is also the more
precise iteration.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional, Sequence

import torch

from ._common import OptionError, check_positive_int

__all__ = ["NS_COEFFICIENTS", "NS_DTYPES", "check_ns_dtype", "native_bf16_matmul", "newton_schulz",
           "newton_schulz_batched", "ns_coefficient_schedule", "ns_dtype_note", "resolve_ns_dtype", "NS_EPS"]

# Per-iteration (a, b, c) of X -> a X + b (X X^T) X + c (X X^T)^2 X, by name.
NS_COEFFICIENTS: dict[str, tuple[tuple[float, float, float], ...]] = {
    # Jordan et al. 2024 (and torch.optim.Muon's default): one quintic, repeated.
    "jordan": ((3.4445, -4.7750, 2.0315),),
    # Amsel et al. 2025, safety factor 1.02 (applied in the normalisation), cushion 2, 5 iterations.
    "polar_express": (
        (8.156554524902461, -22.48329292557795, 15.878769915207462),
        (4.042929935166739, -2.808917465908714, 0.5000178451051316),
        (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
        (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
        (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
    ),
}
# The input is divided by its Frobenius norm times this (an upper bound on the spectral norm).
_NS_SAFETY = {"polar_express": 1.02}
NS_EPS = 1e-7  # torch.optim.Muon's eps: floor of the norm the input is divided by


NS_DTYPES = ("bfloat16", "float32", "auto")


@functools.lru_cache(maxsize=None)
def _cpu_flags() -> frozenset:
    """The CPU's feature flags from /proc/cpuinfo (Linux), empty where it cannot be read."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "Features"):  # x86, Arm
                    return frozenset(value.split())
    except OSError:
        pass
    return frozenset()


def native_bf16_matmul(device: Any = "cpu") -> bool:
    """Whether ``device`` multiplies bf16 matrices in hardware: CUDA, or a CPU with AVX512-BF16, AMX (x86) or
    the BF16 extension (Arm), read from /proc/cpuinfo (False where it cannot be read)."""
    if torch.device(device).type == "cuda":
        return True
    return bool(_cpu_flags() & {"avx512_bf16", "amx_bf16", "bf16"})


def check_ns_dtype(ns_dtype: Any) -> None:
    """A one-line error unless ``ns_dtype`` is one of `NS_DTYPES` (the value alone; no device is asked)."""
    if ns_dtype not in NS_DTYPES:
        raise OptionError("Muon", "ns_dtype", ns_dtype, "allowed: " + ", ".join(NS_DTYPES))


def ns_dtype_note(ns_dtype: Any, device: Any) -> Optional[str]:
    """What to tell a user who asks for Newton-Schulz in bf16 on a CPU that would emulate it (slow), or None."""
    if ns_dtype != "bfloat16" or torch.device(device).type != "cpu" or native_bf16_matmul("cpu"):
        return None
    return ("muon: this CPU multiplies bf16 matrices without hardware support, so Newton-Schulz in bf16 "
            "(optimizer_kwargs ns_dtype: bfloat16) is emulated and slow; ns_dtype auto (the default) runs it in fp32 "
            "here (docs: techniques/optimizers)")


def resolve_ns_dtype(ns_dtype: str, device: Any = "cpu") -> torch.dtype:
    """The dtype Newton-Schulz runs in for ``ns_dtype`` on ``device`` ("auto": bf16 where it is native)."""
    check_ns_dtype(ns_dtype)
    if ns_dtype == "auto":
        return torch.bfloat16 if native_bf16_matmul(device) else torch.float32
    return torch.bfloat16 if ns_dtype == "bfloat16" else torch.float32


def ns_coefficient_schedule(ns_coefficients: Any = "jordan", ns_steps: int = 5) -> list[tuple[float, float, float]]:
    """The (a, b, c) used at each of the `ns_steps` Newton-Schulz iterations.

    `ns_coefficients` is a name of `NS_COEFFICIENTS`, one triple, or a list of triples; a list
    shorter than `ns_steps` has its last triple repeated. Raises ValueError naming the field.

    Example:
        >>> from hf_fasttrain.optim import ns_coefficient_schedule
        >>> ns_coefficient_schedule("jordan", 2)
        [(3.4445, -4.775, 2.0315), (3.4445, -4.775, 2.0315)]
        >>> len(ns_coefficient_schedule("polar_express", 7))
        7
    """
    check_positive_int("Muon", "ns_steps", ns_steps, maximum=99)
    allowed = f"allowed: {', '.join(sorted(NS_COEFFICIENTS))}, an (a, b, c) triple or a list of triples"
    if isinstance(ns_coefficients, str):
        if ns_coefficients not in NS_COEFFICIENTS:
            raise OptionError("Muon", "ns_coefficients", ns_coefficients, allowed)
        triples = list(NS_COEFFICIENTS[ns_coefficients])
    else:
        def _is_triple(x):
            return (
                isinstance(x, (list, tuple)) and len(x) == 3
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in x)
            )

        if _is_triple(ns_coefficients):
            triples = [ns_coefficients]
        elif isinstance(ns_coefficients, (list, tuple)) and ns_coefficients and all(map(_is_triple, ns_coefficients)):
            triples = list(ns_coefficients)
        else:
            raise OptionError("Muon", "ns_coefficients", ns_coefficients, allowed)
        triples = [tuple(float(v) for v in t) for t in triples]
    triples = [tuple(t) for t in triples]
    return [triples[min(i, len(triples) - 1)] for i in range(ns_steps)]


def newton_schulz(
    update: torch.Tensor, ns_coefficients: Any = "jordan", ns_steps: int = 5, eps: float = NS_EPS,
    ns_dtype: str = "bfloat16",
) -> torch.Tensor:
    """Orthogonalise a 2-D `update` (~ U V^T of its SVD U S V^T) in bf16, as `torch.optim.Muon`.

    With "jordan" the arithmetic is torch's op for op (bit-identical); a named schedule with a
    safety factor (polar_express: 1.02) divides by that factor times the Frobenius norm first.
    Returns a tensor of `update`'s shape in the dtype of `ns_dtype` (bf16 by default).

    Example:
        >>> import torch
        >>> from hf_fasttrain.optim import newton_schulz
        >>> x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
        >>> s = torch.linalg.svdvals(newton_schulz(x, "polar_express").float())
        >>> bool((s - 1).abs().max() < 0.15)
        True
    """
    if update.ndim != 2:
        raise ValueError(f"Muon: Newton-Schulz needs a 2-D matrix, got shape {tuple(update.shape)}")
    schedule = ns_coefficient_schedule(ns_coefficients, ns_steps)
    safety = _NS_SAFETY.get(ns_coefficients, 1.0) if isinstance(ns_coefficients, str) else 1.0
    x = update.to(resolve_ns_dtype(ns_dtype, update.device), copy=True)
    tall = update.size(0) > update.size(1)
    if tall:
        x = x.T
    norm = x.norm().clamp(min=eps)
    if safety != 1.0:
        norm = norm * safety
    x.div_(norm)
    for a, b, c in schedule:
        gram = x @ x.T
        poly = torch.addmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.addmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return x.T if tall else x


def newton_schulz_batched(
    updates: Sequence[torch.Tensor], ns_coefficients: Any = "jordan", ns_steps: int = 5, eps: float = NS_EPS,
    ns_dtype: str = "bfloat16",
) -> torch.Tensor:
    """:func:`newton_schulz` of several 2-D matrices of one shape at once (a sequence of them, or a tensor
    ``[N, A, B]``, e.g. the experts of a mixture-of-experts layer): stacked into ``[N, A, B]`` and
    iterated with batched matmuls (``baddbmm``), as modded-nanogpt does. Each step then launches 3 kernels
    for the whole stack instead of 3 per matrix (GPT-2 small: 48 matrices in 4 shapes, so 60 matmul
    launches per step instead of 720). Returns the ``[N, A, B]`` results (in `ns_dtype`'s dtype), in order.

    The arithmetic per matrix is :func:`newton_schulz`'s; on CPU the results are bit-identical to it.

    Example:
        >>> import torch
        >>> from hf_fasttrain.optim import newton_schulz, newton_schulz_batched
        >>> g = torch.Generator().manual_seed(0)
        >>> xs = [torch.randn(64, 32, generator=g) for _ in range(3)]
        >>> out = newton_schulz_batched(xs)
        >>> out.shape, all(torch.equal(o, newton_schulz(x)) for o, x in zip(out, xs))
        (torch.Size([3, 64, 32]), True)
    """
    if isinstance(updates, torch.Tensor):  # already a stack [N, A, B]
        if updates.ndim != 3:
            raise ValueError(f"Muon: batched Newton-Schulz needs a stack [N, A, B], got shape {tuple(updates.shape)}")
        stack = updates
    else:
        shapes = {tuple(u.shape) for u in updates}
        if len(shapes) != 1 or len(next(iter(shapes))) != 2:
            raise ValueError(f"Muon: batched Newton-Schulz needs 2-D matrices of one shape, got shapes {sorted(shapes)}")
        stack = torch.stack(list(updates))
    schedule = ns_coefficient_schedule(ns_coefficients, ns_steps)
    safety = _NS_SAFETY.get(ns_coefficients, 1.0) if isinstance(ns_coefficients, str) else 1.0
    # one conversion for the stack (element-wise: the same values); nothing below writes into it
    x = stack.to(resolve_ns_dtype(ns_dtype, stack.device))
    tall = x.size(1) > x.size(2)
    if tall:
        x = x.mT
    norm = torch.linalg.vector_norm(x, dim=(-2, -1), keepdim=True).clamp(min=eps)
    if safety != 1.0:
        norm = norm * safety
    x = x / norm
    for a, b, c in schedule:
        gram = x @ x.mT
        poly = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)  # b A + c A^2
        x = torch.baddbmm(x, poly, x, beta=a)  # a X + (b A + c A^2) X
    return x.mT if tall else x
