"""The search: explores seeds (optionally in successive-halving rungs), drops diverged ones, continues the best
from its checkpoint to ``max_steps``. Trials run through the :class:`TrialRunner` Protocol, so nothing here
knows the Trainer; the state is a :class:`~.state.SearchState` saved atomically after every transition."""

from __future__ import annotations

import concurrent.futures
import os
import queue
import threading
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Protocol, runtime_checkable

from ..validation import ConfigError
from .config import RestartConfig
from .ranking import compute_rung_steps, derive_seeds, divergence_reason, num_to_keep, rank_trials
from .report import CURVES_PNG, SUMMARY_MD, build_summary, plot_curves, summary_markdown, write_summary
from .state import (
    STATE_FILE,
    Continuation,
    RungState,
    SearchState,
    StageResult,
    TrialState,
    check_generation,
    relative_to,
)

__all__ = ["TrialSpec", "TrialResult", "TrialRunner", "RestartOrchestrator", "StageFailed", "check_stage_current"]


class StageFailed(RuntimeError):
    """Raised by a runner when one stage of a trial failed on its own (a worker lost, its process killed, an
    error inside the task), as opposed to the driver itself dying. The orchestrator retries the stage once
    (the runner resumes it from the trial's last complete checkpoint), then marks the trial ``failed``: it is
    reported in the summary and never chosen, and the search goes on with the others."""


@dataclass(frozen=True)
class TrialSpec:
    """One seed of the search, as handed to the runner.

    ``max_steps`` is the FULL run's step count: the runner must build its LR schedule from it and stop at the
    ``until_step`` it is given, so every exploration is an exact prefix of the full run. ``output_dir`` is
    this trial's own directory; ``device`` is set under ``parallel="per_gpu"`` (e.g. for
    ``CUDA_VISIBLE_DEVICES``). ``state_path`` and ``generation`` name the search's state file and the
    generation of the driver that launched this stage: a runner that trains away from the driver (a Ray task)
    calls :func:`check_stage_current` before it writes, so a stage left running by a killed driver stops.

    Example:
        ```python
        >>> spec = TrialSpec("seed-0", 0, model_seed=42, data_seed=42, max_steps=100, output_dir="out/trials/seed-0")
        >>> spec.model_seed, spec.data_seed, spec.max_steps, spec.device
        (42, 42, 100, None)
        ```
    """

    trial_id: str
    index: int
    model_seed: int
    data_seed: int
    max_steps: int
    output_dir: str
    device: Optional[str] = None
    state_path: Optional[str] = None
    generation: Optional[int] = None


def check_stage_current(trial: TrialSpec) -> None:
    """Raises :class:`~hf_fasttrain.restarts.state.StaleStageError` when the driver that launched this stage
    is no longer the search's (the state file holds a newer generation); nothing when the spec carries none."""
    check_generation(trial.state_path, trial.generation)


@dataclass
class TrialResult:
    """What a runner returns after training a trial up to ``until_step``.

    Args:
        eval_history: evaluations made in this call, as dicts with ``"step"`` and metric keys (the shape of
            the Trainer's ``log_history`` eval entries). Entries from earlier calls may be repeated.
        final_eval: the metrics of the evaluation at ``until_step``.
        checkpoint_dir: checkpoint saved at ``until_step`` (resumed by the next rung or the continuation).
        diverged: the runner saw the run blow up (e.g. a NaN training loss) whatever the eval says.

    Example:
        ```python
        >>> r = TrialResult([{"step": 5, "eval_loss": 3.2}], {"eval_loss": 3.2}, "out/checkpoint-5")
        >>> r.diverged
        False
        ```
    """

    eval_history: List[Dict[str, float]]
    final_eval: Dict[str, float]
    checkpoint_dir: Optional[str]
    diverged: bool = False


@runtime_checkable
class TrialRunner(Protocol):
    """Trains one trial. ``run`` trains ``trial`` (with ``trial.max_steps`` as the schedule length) from
    ``resume_from`` (a checkpoint from an earlier call, or ``None`` for a fresh start) up to ``until_step``,
    evaluates there, saves a checkpoint there and returns a :class:`TrialResult`.

    A runner may also define ``available_metrics() -> Iterable[str]``; the orchestrator then checks the
    configured metric against it before any trial starts. A runner whose stage failed on its own (a worker
    lost) raises :class:`StageFailed`: the stage is retried once, then the trial is marked failed; any other
    exception stops the search (as a killed driver would), which resumes when run again.

    Example:
        ```python
        >>> class ConstantRunner:
        ...     def run(self, trial, until_step, resume_from):
        ...         m = {"eval_loss": 1.0 + trial.index}
        ...         return TrialResult([{"step": until_step, **m}], m, f"{trial.output_dir}/checkpoint-{until_step}")
        >>> isinstance(ConstantRunner(), TrialRunner)
        True
        ```
    """

    def run(self, trial: TrialSpec, until_step: int, resume_from: Optional[str]) -> TrialResult: ...


def _out(t: TrialState) -> bool:
    """Out of the search for good: diverged, or failed twice."""
    return t.status in ("diverged", "failed")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _visible_gpus() -> List[str]:
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())]
    except Exception:  # torch missing or CUDA unusable: no GPU
        return []


class RestartOrchestrator:
    """Runs a random-restart search: explores ``num_seeds`` seeds (with optional successive halving), drops
    diverged ones, continues the best from its checkpoint to ``max_steps``, and writes a summary.

    Files in ``output_dir``: ``restarts_state.json`` (the resumable state, rewritten atomically after every
    transition), ``restarts_summary.json``, ``restarts_summary.md`` and ``restarts_curves.png``; trial ``t``
    gets ``output_dir/trials/t`` as its own output directory.

    Args:
        config (`RestartConfig`):
            The search settings.
        runner (`TrialRunner`):
            Trains the trials: ``runner.run(trial, until_step, resume_from)`` returns a ``TrialResult``.
        output_dir (`str`):
            Where state, summary and trial directories live. A state file already there is resumed; it must
            have been made with the same search settings and ``max_steps``.
        max_steps (`int`):
            The full run's optimizer steps (the LR schedule's length for every trial).

    Example:
        ```python
        >>> import tempfile
        >>> class TableRunner:  # eval loss = 1 + model_seed % 3, whatever the step
        ...     def run(self, trial, until_step, resume_from):
        ...         m = {"eval_loss": 1.0 + trial.model_seed % 3}
        ...         return TrialResult([{"step": until_step, **m}], m, f"{trial.output_dir}/checkpoint-{until_step}")
        >>> out = tempfile.mkdtemp()
        >>> cfg = RestartConfig(num_seeds=3, explore_fraction=0.5, seed=1)
        >>> summary = RestartOrchestrator(cfg, TableRunner(), out, max_steps=10).run()
        >>> summary["winner"], summary["winner_model_seed"], summary["winner_final_metric"]
        ('seed-2', 3, 1.0)
        ```
    """

    def __init__(self, config: RestartConfig, runner: TrialRunner, output_dir: str, max_steps: int):
        if not isinstance(config, RestartConfig):
            raise ValueError(f"config={config!r} is invalid: it must be a RestartConfig.")
        if not callable(getattr(runner, "run", None)):
            raise ValueError(
                f"runner={runner!r} is invalid: it must have a run(trial, until_step, resume_from) method."
            )
        self.config = config
        self.runner = runner
        self.output_dir = os.fspath(output_dir)
        self.max_steps = max_steps
        # Everything below is checked now, so bad settings fail before any trial starts.
        self.rung_steps = compute_rung_steps(max_steps, config.explore_fraction, config.rungs, config.keep_fraction)
        available = getattr(runner, "available_metrics", None)
        if callable(available):
            names = sorted(available())
            if config.metric not in names:
                raise ConfigError("RestartConfig.metric", config.metric,
                                  f"allowed: {', '.join(names)} (what this runner reports)")
        self.devices: List[str] = []
        if config.parallel == "per_gpu":
            self.devices = list(config.devices) if config.devices is not None else _visible_gpus()
            if not self.devices:
                raise ConfigError("RestartConfig.parallel", "per_gpu", "use parallel=False or give devices",
                                  problem="got 'per_gpu', but no GPU is visible")
        self.state_path = os.path.join(self.output_dir, STATE_FILE)
        self._lock = threading.RLock()
        self.state: Optional[SearchState] = None

    # -- state -------------------------------------------------------------------------------------------

    def _load_or_init(self) -> None:
        os.makedirs(self.output_dir, exist_ok=True)
        if not os.path.exists(self.state_path):
            self.state = SearchState(self.config.search_dict(), self.max_steps, list(self.rung_steps))
            for i in range(self.config.num_seeds):
                self._add_trial(i, replaces=None)
            self._save()
            return
        state = SearchState.load(self.state_path)
        old = dict(state.search, max_steps=state.max_steps)
        new = dict(self.config.search_dict(), max_steps=self.max_steps)
        changed = [k for k in new if old.get(k) != new[k]]
        if changed:
            diffs = ", ".join(f"{k}: {old.get(k)!r} in the state, {new[k]!r} now" for k in changed)
            raise ValueError(
                f"{self.state_path} was made with other settings ({diffs}); resume with the same settings "
                "or use a new output_dir."
            )
        state.upgrade(self.output_dir)  # a version-1 file: paths relative to output_dir from now on
        self.state = state

    def _path(self, rel: Optional[str]) -> Optional[str]:
        """A path of the state (relative to ``output_dir``) as this driver sees it."""
        return None if rel is None else os.path.join(self.output_dir, rel)

    def _save(self) -> None:
        with self._lock:
            self.state.save(self.state_path)

    def _add_trial(self, index: int, replaces: Optional[str]) -> str:
        model_seed, data_seed = derive_seeds(index, self.config.seed, self.config.data_seed, self.config.vary)
        tid = f"seed-{index}"
        out = os.path.join("trials", tid)  # relative to output_dir: the search directory can move
        self.state.trials[tid] = TrialState(index, model_seed, data_seed, out, replaces=replaces)
        self.state.order.append(tid)
        return tid

    def _spec(self, tid: str, device: Optional[str] = None) -> TrialSpec:
        t = self.state.trials[tid]
        return TrialSpec(tid, t.index, t.model_seed, t.data_seed, self.max_steps, self._path(t.output_dir), device,
                         os.path.abspath(self.state_path), self.state.generation)

    # -- running trials ----------------------------------------------------------------------------------

    def _execute(self, tid: str, until_step: int, device: Optional[str]) -> None:
        """Runs one trial stage and records it; the only place that calls the runner. A :class:`StageFailed`
        is retried once (a stage that had failed before a driver restart counts), then marks the trial failed."""
        t = self.state.trials[tid]
        while True:
            resume_from = self._path(t.last_checkpoint(until_step))
            with self._lock:
                t.status = "running"
                t.starts += 1
                self._save()
            try:
                result = self.runner.run(self._spec(tid, device), until_step, resume_from)
                break
            except StageFailed as e:
                with self._lock:
                    t.failures += 1
                    if t.failures >= 2:
                        t.status = "failed"
                        t.failed_reason = f"stage to step {until_step} failed twice: {e}"
                    self._save()
                if t.status == "failed":
                    return
        metric = self.config.metric
        if metric not in result.final_eval:
            raise ValueError(
                f"RestartConfig.metric={metric!r} is not in the eval results of {tid} "
                f"(they have {sorted(result.final_eval)})."
            )
        value = float(result.final_eval[metric])
        with self._lock:
            for entry in result.eval_history:
                if metric in entry and "step" in entry:
                    t.history[int(entry["step"])] = float(entry[metric])
            t.history[until_step] = value
            final = {k: float(v) for k, v in result.final_eval.items() if _is_number(v)}
            ckpt = relative_to(result.checkpoint_dir, self.output_dir)
            t.results[until_step] = StageResult(value, final, ckpt, bool(result.diverged))
            t.status = "alive"
            t.failures = 0
            self._save()

    def _slots(self, n: int) -> List[Optional[str]]:
        """Stages that may run at once: one per device under ``per_gpu``; with the Ray backend
        ``max_concurrent`` (or all ``n``); else one."""
        if self.devices:
            return list(self.devices)
        if self.config.backend == "ray":
            return [None] * max(1, min(n, self.config.max_concurrent or n))
        return [None]

    def _execute_many(self, tids: List[str], until_step: int) -> None:
        if not tids:
            return
        slots = self._slots(len(tids))
        if len(slots) == 1 or len(tids) == 1:
            for tid in tids:
                self._execute(tid, until_step, slots[0])
            return
        free: "queue.Queue[Optional[str]]" = queue.Queue()
        for d in slots:
            free.put(d)

        def work(tid):
            device = free.get()
            try:
                self._execute(tid, until_step, device)
            finally:
                free.put(device)

        errors = []
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(slots)) as pool:
            for fut in [pool.submit(work, tid) for tid in tids]:
                try:
                    fut.result()
                except BaseException as e:  # the others finish and are recorded; then re-raise
                    errors.append(e)
        if errors:
            raise errors[0]

    def _check_divergence(self, tid: str, step: int) -> bool:
        t = self.state.trials[tid]
        if t.status in ("diverged", "failed"):
            return True
        res = t.results[step]
        reason = "the runner reported divergence" if res.diverged else None
        if reason is None:
            hist = sorted((s, v) for s, v in t.history.items() if s <= step)
            reason = divergence_reason(
                hist, self.config.metric, self.config.direction, self.config.divergence_threshold, res.value, step
            )
        if reason is None:
            return False
        t.status = "diverged"
        t.diverged_reason = reason
        self._save()
        return True

    # -- the search --------------------------------------------------------------------------------------

    def _run_rung(self, r: int) -> None:
        step = self.rung_steps[r]
        rung = self.state.rungs[r]
        trials = self.state.trials
        while True:
            # Check before running too: a kill may have come between a recorded result and its check.
            for tid in list(rung.entrants):
                if step in trials[tid].results and self._check_divergence(tid, step):
                    self._maybe_replace(tid, rung)
            todo = [t for t in rung.entrants if step not in trials[t].results and not _out(trials[t])]
            if not todo:
                break
            self._execute_many(todo, step)
        alive = [t for t in rung.entrants if not _out(trials[t])]
        values = {t: trials[t].results[step].value for t in alive}
        ranking = rank_trials(values, self.config.direction, self.state.order)
        last = r == len(self.rung_steps) - 1
        kept = ranking if last else ranking[: num_to_keep(len(ranking), self.config.keep_fraction)]
        for tid in alive:
            if tid not in kept:
                trials[tid].status = "dropped"
                trials[tid].dropped_at_rung = r
        rung.ranking = ranking
        rung.kept = kept
        rung.done = True
        self._save()

    def _maybe_replace(self, tid: str, rung: RungState) -> None:
        t = self.state.trials[tid]
        if not self.config.replace_diverged or t.replaced_by is not None:
            return
        if self.state.replacements_used >= self.config.max_replacements:
            return
        new = self._add_trial(len(self.state.order), replaces=tid)
        t.replaced_by = new
        self.state.replacements_used += 1
        rung.entrants.append(new)
        self._save()

    def _continue_winner(self) -> None:
        explore_step = self.rung_steps[-1]
        trials = self.state.trials
        cont = self.state.continuation
        if cont is None:
            cont = self.state.continuation = Continuation(list(self.state.rungs[-1].ranking))
            self._save()
        for tid in cont.candidates:
            if _out(trials[tid]):
                continue
            if explore_step < self.max_steps and self.max_steps not in trials[tid].results:
                if tid not in cont.tried:
                    cont.tried.append(tid)
                    self._save()
                self._execute_many([tid], self.max_steps)
            if _out(trials[tid]):
                continue  # its continuation failed twice: fall back to the next best explored seed
            if explore_step < self.max_steps and self._check_divergence(tid, self.max_steps):
                continue  # a diverged seed is never chosen: fall back to the next best explored seed
            self.state.winner = tid
            trials[tid].status = "chosen"
            break
        for tid in cont.candidates:
            if tid != self.state.winner and trials[tid].status == "alive":
                trials[tid].status = "dropped"
                trials[tid].dropped_at_rung = len(self.rung_steps) - 1
        self.state.done = True
        self._save()

    def run(self) -> Dict[str, Any]:
        """Runs (or resumes) the search to the end; writes and returns the summary.

        Raises ``RuntimeError`` (after writing the summary) when every seed diverged.
        """
        self._load_or_init()
        state = self.state
        if not state.done:
            # this driver's generation: stages that a killed driver left running see it and stop (fencing)
            state.generation += 1
            self._save()
            for r in range(len(self.rung_steps)):
                if r == len(state.rungs):
                    if r == 0:
                        entrants = [t for t in state.order if state.trials[t].replaces is None]
                    else:
                        entrants = list(state.rungs[r - 1].kept)
                    state.rungs.append(RungState(self.rung_steps[r], entrants))
                    self._save()
                if not state.rungs[r].done:
                    self._run_rung(r)
            self._continue_winner()
        summary = self.summary()
        self.write_summary(summary)
        if summary["winner"] is None:
            raise RuntimeError(
                f"all {len(state.trials)} trials diverged or failed; see {os.path.join(self.output_dir, SUMMARY_MD)}"
            )
        return summary

    # -- reporting (see report.py) -------------------------------------------------------------------------

    def summary(self) -> Dict[str, Any]:
        """Per-seed table, statistics over seeds at each rung, and the winner (a JSON-ready dict)."""
        return build_summary(self.state, self.config, root=self.output_dir)

    def markdown(self, summary: Dict[str, Any]) -> str:
        return summary_markdown(summary)

    def plot(self, summary: Dict[str, Any], path: str) -> None:
        plot_curves(summary, path)

    def write_summary(self, summary: Dict[str, Any]) -> None:
        """Writes ``restarts_summary.json``, ``restarts_summary.md`` and ``restarts_curves.png``."""
        write_summary(summary, self.output_dir, plot=False)
        self.plot(summary, os.path.join(self.output_dir, CURVES_PNG))
