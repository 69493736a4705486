"""Benchmarks: scripts that measure and write JSON + PNG (+ .md) into benchmarks/results/.

Run each one from the checkout root as a module, so this checkout's ``hf_fasttrain`` is the one measured
(no ``sys.path`` edits anywhere)::

    python -m benchmarks.padding --steps 16 --warmup 1 --repeats 3
    python -m benchmarks.lm_head_loss_memory --tokens 512

Shared pieces are in :mod:`benchmarks._harness`.
"""
