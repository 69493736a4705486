"""How many graphs ``torch.compile`` has compiled: each one is a cold compile (tens of seconds on a GPU).

A compiled model recompiles whenever an input's shape or strides leave what its graphs cover. Under
sequence-length warmup the first length gives a static graph and the second a dynamic one that serves every
later length, so a run should compile at most 2 graphs per model (the data cut keeps strides the same:
:func:`hf_fasttrain.data.seqlen.set_batch_sequence_length`). FastTrainer logs the count with every training
log (``compiled_graphs``) and writes it into ``run_info.json`` at the end of ``train()``.

Example:
    >>> import torch
    >>> counter = CompileCounter()
    >>> f = torch.compile(lambda x: x * 2, backend="eager")
    >>> for n in (3, 4, 5, 6):
    ...     _ = f(torch.ones(n))
    >>> counter.graphs()   # a static graph at length 3, then one dynamic graph for 4, 5 and 6
    2
"""

from __future__ import annotations

__all__ = ["compiled_graphs", "CompileCounter"]


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (its ``unique_graphs`` counter; 0 without dynamo)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # a torch without dynamo
        return 0
    return int(counters["stats"]["unique_graphs"])


class CompileCounter:
    """Graphs compiled since this counter was made (dynamo's counters are per process, not per run)."""

    def __init__(self) -> None:
        self.start = compiled_graphs()

    def graphs(self) -> int:
        return compiled_graphs() - self.start
