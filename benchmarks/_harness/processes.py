"""The one process pool of the studies: forked workers that stop with their study, and stop signals forwarded to them.

A study opens it with :func:`worker_pool` (``None`` for one job: every run in this process) and hands it its runs
with :func:`as_finished` (each result as it ends) or :func:`in_order`; a search that asks for runs as earlier ones
finish submits to it and reads :func:`finished_results`. SIGTERM or Ctrl-C to the study reaches each worker as
SIGTERM (:func:`stops_forwarded`); its running run saves its step and raises ``TrainingStopped``; :data:`STOP`
records the first signal so no queued run starts after it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import multiprocessing
import os
import signal
import sys
from typing import Any, Callable, Generator, Iterable, Iterator, Optional

from hf_fasttrain.callbacks.graceful_stop import TrainingStopped

__all__ = ["STOP", "stopping", "term_when_parent_dies", "stops_forwarded", "finished_results", "worker_pool",
           "set_threads", "as_finished", "in_order", "first_finished"]

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


def first_finished(futures) -> set:
    """Waits until at least one of ``futures`` (submitted to the pool) has finished; returns those that have."""
    done, _ = concurrent.futures.wait(list(futures), return_when=concurrent.futures.FIRST_COMPLETED)
    return done


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


def set_threads(threads: Optional[int]) -> None:
    """torch's CPU threads for this process's runs (``None``: torch's own choice; on a GPU the CPU threads stay)."""
    import torch

    if threads and not torch.cuda.is_available():
        torch.set_num_threads(threads)


def _start_worker(threads: Optional[int], initializer: Optional[Callable[..., None]], initargs: tuple) -> None:
    """A pool worker's start: its threads; the default signal handlers, not the study's forwarding one it inherited
    (a trainer installs its own stop handler); SIGTERM when the study dies; then the study's ``initializer``."""
    set_threads(threads)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    term_when_parent_dies()
    if initializer is not None:
        initializer(*initargs)


@contextlib.contextmanager
def worker_pool(jobs: int, threads: Optional[int] = 1, initializer: Optional[Callable[..., None]] = None,
                initargs: tuple = ()) -> Generator[Optional[concurrent.futures.ProcessPoolExecutor], None, None]:
    """``jobs`` forked worker processes, each with ``threads`` torch CPU threads, for as long as the block runs;
    ``None`` for one job (each run then runs in this process, at ``threads`` threads). Workers fork from this
    process, so what it holds when the pool opens (prepared data, a work folder) is theirs without pickling.
    On leaving, the queued runs are cancelled and the running ones awaited.

    >>> with worker_pool(1) as pool:
    ...     [result for _, result in as_finished(pool, abs, [-1, 2])]
    [1, 2]
    """
    if jobs <= 1:
        set_threads(threads)
        yield None
        return
    pool = concurrent.futures.ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork"),
                                                  initializer=_start_worker, initargs=(threads, initializer, initargs))
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def as_finished(pool, run: Callable[[Any], Any], jobs: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """(job, result) of each of ``jobs`` run by ``run`` as it finishes: in ``pool``'s workers, or here one after
    another without a pool. In a worker, a run stopped by a signal (its checkpoint saved) yields nothing and records
    the stop (:func:`finished_results`); here, its ``TrainingStopped`` reaches the caller as from any call."""
    jobs = list(jobs)
    if pool is None:
        for job in jobs:
            yield job, run(job)
        return
    futures = {pool.submit(run, job): job for job in jobs}
    for fut in concurrent.futures.as_completed(list(futures)):
        yield from finished_results(futures, [fut])


def in_order(pool, run: Callable[[Any], Any], jobs: Iterable[Any]) -> list[Any]:
    """The results of ``jobs`` run by ``run`` (in ``pool``'s workers, or here), in the order of ``jobs``."""
    jobs = list(jobs)
    done = dict((i, result) for (i, _), result in as_finished(pool, _Indexed(run), list(enumerate(jobs))))
    return [done[i] for i in range(len(jobs)) if i in done]


class _Indexed:
    """``run`` of a job's second part, for a job ``(index, job)``: picklable, so a pool worker can call it."""

    def __init__(self, run: Callable[[Any], Any]):
        self.run = run

    def __call__(self, indexed: tuple[int, Any]) -> Any:
        return self.run(indexed[1])
