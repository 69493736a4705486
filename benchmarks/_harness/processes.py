"""The process pool of a long study: workers that stop with their search, and stop signals forwarded to them.

SIGTERM or Ctrl-C to the study reaches each worker as SIGTERM; its running run saves its step and raises
``TrainingStopped``; :data:`STOP` records the first signal so no queued run starts after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from typing import Any, Generator

from hf_fasttrain.callbacks.graceful_stop import TrainingStopped

__all__ = ["STOP", "stopping", "term_when_parent_dies", "stops_forwarded", "finished_results"]

STOP: list[int] = []  # the signal that stopped this study: no run starts after it


def term_when_parent_dies() -> None:
    """On Linux, SIGTERM this worker when the search's process dies (SIGKILL, a crash): its running run saves
    its step and stops, rather than training on as an orphan whose result nobody reads (and racing the
    rerun's worker for the same checkpoint folder). Elsewhere a no-op."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    parent = os.getppid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the request: act on it now
        os.kill(os.getpid(), signal.SIGTERM)


def stopping(signum: int) -> None:
    if not STOP:
        STOP.append(signum)


@contextlib.contextmanager
def stops_forwarded(pool) -> Generator[None, None, None]:
    """While the pool runs: SIGTERM or Ctrl-C to this process reaches each worker as SIGTERM, so its running run
    finishes the step in flight, saves a checkpoint and raises TrainingStopped; no queued run starts after it.
    (Ctrl-C in a terminal reaches the workers too; a second signal to a stopping trainer is ignored.)"""
    def forward(signum, frame):
        stopping(signum)
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def finished_results(futures: dict[Any, tuple], done) -> Generator[tuple[tuple, dict[str, Any]], None, None]:
    """(job, result) of each finished future in ``done`` (removed from ``futures``); a run stopped by a signal
    (its checkpoint saved) yields nothing and stops the search from starting another."""
    for fut in done:
        job = futures.pop(fut)
        try:
            result = fut.result()
        except TrainingStopped as exc:
            stopping(exc.signum)
            continue
        yield job, result
