"""NorMuon: Muon's orthogonalised update, normalised neuron by neuron with a second moment.

Li et al. 2025, "NorMuon: Making Muon more efficient and scalable" (arXiv:2510.05491). Muon's update
O = NewtonSchulz(momentum) has equal singular values, but its rows (one per output neuron) can have very
different norms. NorMuon keeps, per neuron, an exponential average of the mean square of that neuron's
row of O, divides the row by its root, and rescales the whole matrix back to O's Frobenius norm:

    v_t   = beta2 v_{t-1} + (1 - beta2) mean_j O_ij^2        # one value per output neuron i
    O'    = O / (sqrt(v_t) + 1e-10)
    O''   = O' * ||O||_F / (||O'||_F + 1e-10)                # the update keeps Muon's size

then Muon's scale and step follow unchanged (``theta -= lr * s(A, B) * O''``; decoupled weight decay as
Muon's). The paper reports 11.3% better training efficiency than Muon at 1.1B parameters (and 21.7% than
Adam). There is no bias correction: v starts at zero and the rescale to ||O||_F makes its size irrelevant.

The neuron axis is the output one: rows of an ``nn.Linear`` weight (out x in), columns of GPT-2's
``Conv1D`` weight (stored in x out), so the same layer gets the same update in either layout. The authors'
code averages over the stored last dim, which is the same for ``nn.Linear``.

Use it as Muon with ``normuon_beta2`` set, e.g. ``optimizer: muon`` and
``optimizer_kwargs: {normuon_beta2: 0.95}`` (the authors' default). Under FSDP2 it is refused: a
neuron's row is whole on one rank for ``nn.Linear`` but the Frobenius norms span ranks; use DDP.
"""

from __future__ import annotations

import torch

__all__ = ["NORMUON_STATE", "neuron_normalize"]

# the optimizer-state key of the per-neuron second moment
NORMUON_STATE = "neuron_second_moment"
_EPS = 1e-10  # the authors' epsilon, in both places


def neuron_normalize(ortho: torch.Tensor, second_moment: torch.Tensor, beta2: float, reduce_dim: int) -> torch.Tensor:
    """NorMuon's step on an orthogonalised update: update `second_moment` in place, return the new update.

    Args:
        ortho: Muon's orthogonalised update (any float dtype; computed in fp32), or a stack [N, out, in] of
            them (each matrix normalised on its own; `second_moment` then [N, out, 1] and ``reduce_dim`` 2).
        second_moment: fp32 buffer, one value per neuron: shape (rows, 1) when ``reduce_dim`` is 1,
            (1, cols) when it is 0.
        beta2: its EMA coefficient, in [0, 1).
        reduce_dim: the input axis of the stored weight, averaged over: 1 for ``nn.Linear``, 0 for ``Conv1D``.

    Returns:
        The normalised update in fp32, with the Frobenius norm of `ortho`.

    Example:
        ```python
        >>> import torch
        >>> o = torch.tensor([[3.0, 0.0], [0.0, 1.0]])
        >>> out = neuron_normalize(o, torch.zeros(2, 1), 0.0, reduce_dim=1)
        >>> [round(float(x), 4) for x in out.diagonal()], round(float(out.norm()), 4) == round(float(o.norm()), 4)
        ([2.2361, 2.2361], True)
        ```
    """
    o = ortho.float()
    if o.ndim == 3:  # a stack of matrices (the experts of a layer): each its own norm
        norm = torch.linalg.vector_norm(o, dim=(-2, -1), keepdim=True)
        second_moment.lerp_(o.square().mean(dim=reduce_dim, keepdim=True), 1 - beta2)
        o = o / (second_moment.sqrt() + _EPS)
        return o.mul_(norm / (torch.linalg.vector_norm(o, dim=(-2, -1), keepdim=True) + _EPS))
    norm = o.norm()
    second_moment.lerp_(o.square().mean(dim=reduce_dim, keepdim=True), 1 - beta2)
    o = o / (second_moment.sqrt() + _EPS)
    return o.mul_(norm / (o.norm() + _EPS))
