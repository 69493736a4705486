"""How often ``torch.compile`` compiled: each compile is a cold start (tens of seconds on a GPU).

A compiled function recompiles whenever an input's shape or strides leave what its graphs cover. Under
sequence-length warmup the first length gives a static graph and the second a dynamic one that serves every
later length, so each compiled function should compile at most 2 times in a run (the data cut keeps strides
the same: :func:`hf_fasttrain.data.seqlen.set_batch_sequence_length`). Two numbers, both from dynamo's
per-process counters, taken since a :class:`CompileCounter` was made:

- ``compiles``: the most times any one function was compiled (2 under warmup; a third means a recompile);
- ``graphs``: graphs compiled in all, which also counts the pieces a graph break splits a function into.

FastTrainer logs both with every training log (``compiles``, ``compiled_graphs``) when ``torch_compile`` is on,
and writes them into ``run_info.json`` at the end of ``train()``.

Example:
    >>> import torch
    >>> counter = CompileCounter()
    >>> f = torch.compile(lambda x: x * 2, backend="eager")
    >>> for n in (3, 4, 5, 6):
    ...     _ = f(torch.ones(n))
    >>> counter.compiles(), counter.graphs()   # static at length 3, then one dynamic graph for 4, 5 and 6
    (2, 2)
"""

from __future__ import annotations

from collections import Counter

__all__ = ["compiled_graphs", "compiles_by_function", "CompileCounter"]


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (its ``unique_graphs`` counter; 0 without dynamo)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # a torch without dynamo
        return 0
    return int(counters["stats"]["unique_graphs"])


def compiles_by_function() -> Counter:
    """Compiles so far of each function dynamo compiled (by its frame id; empty when unknown)."""
    try:
        from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    except Exception:  # a torch without dynamo, or one that moved this counter
        return Counter()
    return Counter(dict(FRAME_COMPILE_COUNTER))


class CompileCounter:
    """Compiles since this counter was made (dynamo's counters are per process, not per run)."""

    def __init__(self) -> None:
        self._graphs = compiled_graphs()
        self._by_function = compiles_by_function()

    def graphs(self) -> int:
        return compiled_graphs() - self._graphs

    def compiles(self) -> int:
        """The most compiles of one function since then (0: nothing was compiled)."""
        now = compiles_by_function()
        return max((n - self._by_function.get(k, 0) for k, n in now.items()), default=0)

    def stats(self) -> dict[str, int]:
        return {"compiles": self.compiles(), "compiled_graphs": self.graphs()}
