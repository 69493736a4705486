"""The orchestrator's resumable state as typed dataclasses, and its JSON file (``restarts_state.json``).

In memory, steps are ``int`` keys and metric values are ``float``. On disk step keys are strings and
non-finite floats are the strings ``"nan"``, ``"inf"`` and ``"-inf"`` (valid JSON that ``float()`` reads back).

Version 2 (written now) adds to version 1's layout:

- trial and checkpoint paths relative to the search's ``output_dir``, so a search directory can move (to
  another machine, or a shared filesystem mounted elsewhere) and still resume;
- ``generation``: raised by one each time a driver (re)starts the search; a stage carries the generation
  that launched it and must not write once the file holds a newer one (:func:`check_generation`), which
  fences off tasks left running by a killed driver;
- per trial, ``failures`` (failed attempts of its current stage) and ``failed_reason``; status ``failed``.

A version-1 file (paths as its writer gave them, relative to its working directory or absolute) is read by
:meth:`SearchState.from_json` and written back unchanged by :meth:`SearchState.to_json`; the orchestrator
upgrades it to version 2 (:meth:`SearchState.upgrade`) when it resumes it.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

from .._files import atomic_write_text

__all__ = [
    "STATE_FILE",
    "STATE_VERSION",
    "TrialStatus",
    "StageResult",
    "TrialState",
    "RungState",
    "Continuation",
    "SearchState",
    "jsonable",
    "StaleStageError",
    "read_generation",
    "check_generation",
    "relative_to",
]

STATE_FILE = "restarts_state.json"
STATE_VERSION = 2
READABLE_VERSIONS = (1, 2)

# pending: not started; running: a stage is in progress; alive: its last stage finished; dropped: ranked out;
# diverged: never chosen; failed: a stage failed twice (the second try resumed from its last checkpoint),
# never chosen; chosen: the winner.
TrialStatus = Literal["pending", "running", "alive", "dropped", "diverged", "failed", "chosen"]


class StaleStageError(RuntimeError):
    """A stage launched by an older generation of the search (a driver since killed and restarted) tried to go
    on: it must not write into the trial, whose current stage belongs to the newer driver."""


def read_generation(state_path: str) -> int:
    """The ``generation`` in a state file (0 for a version-1 file, which has none)."""
    with open(state_path, encoding="utf-8") as f:
        return int(json.load(f).get("generation", 0))


def check_generation(state_path: Optional[str], generation: Optional[int]) -> None:
    """Raises :class:`StaleStageError` when the state file holds a newer generation than ``generation`` (the
    one that launched the stage). ``None`` for either: no fencing (a stage run in the driver's own process).

    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "restarts_state.json")
    >>> with open(path, "w") as f:
    ...     json.dump({"version": 2, "generation": 3}, f)
    >>> check_generation(path, 3)
    >>> check_generation(path, 2)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    hf_fasttrain.restarts.state.StaleStageError: this stage was launched by generation 2 of the search, but ...
    """
    if state_path is None or generation is None:
        return
    current = read_generation(state_path)
    if current != generation:
        raise StaleStageError(
            f"this stage was launched by generation {generation} of the search, but the state file now holds "
            f"generation {current} (a newer driver runs it): stopping without writing"
        )


def jsonable(obj):
    """Non-finite floats become the strings 'nan', 'inf', '-inf'; keys become strings."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


@dataclass
class StageResult:
    """One finished stage of a trial: the metric at its stop step, the eval there, its checkpoint."""

    value: float
    final_eval: Dict[str, float]
    checkpoint_dir: Optional[str]
    diverged: bool = False

    def to_json(self) -> Dict[str, Any]:
        return {"value": self.value, "final_eval": dict(self.final_eval), "checkpoint_dir": self.checkpoint_dir,
                "diverged": self.diverged}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "StageResult":
        return cls(float(d["value"]), {k: float(v) for k, v in d["final_eval"].items()}, d["checkpoint_dir"],
                   bool(d["diverged"]))


@dataclass
class TrialState:
    """One seed of the search: its seeds, status, finished stages (by stop step) and every eval seen."""

    index: int
    model_seed: int
    data_seed: int
    output_dir: str
    status: TrialStatus = "pending"
    results: Dict[int, StageResult] = field(default_factory=dict)
    history: Dict[int, float] = field(default_factory=dict)  # step -> metric value
    starts: int = 0
    diverged_reason: Optional[str] = None
    dropped_at_rung: Optional[int] = None
    replaces: Optional[str] = None
    replaced_by: Optional[str] = None
    failures: int = 0  # failed attempts of the current stage (version 2)
    failed_reason: Optional[str] = None  # version 2

    def last_checkpoint(self, before_step: int) -> Optional[str]:
        """The checkpoint of the latest finished stage before ``before_step`` (``None``: start fresh)."""
        steps = [s for s in self.results if s < before_step]
        return self.results[max(steps)].checkpoint_dir if steps else None

    @property
    def steps_trained(self) -> int:
        return max(self.results, default=0)

    def to_json(self, version: int = STATE_VERSION) -> Dict[str, Any]:
        d = {
            "index": self.index,
            "model_seed": self.model_seed,
            "data_seed": self.data_seed,
            "output_dir": self.output_dir,
            "status": self.status,
            "results": {str(s): r.to_json() for s, r in self.results.items()},
            "history": {str(s): v for s, v in self.history.items()},
            "starts": self.starts,
            "diverged_reason": self.diverged_reason,
            "dropped_at_rung": self.dropped_at_rung,
            "replaces": self.replaces,
            "replaced_by": self.replaced_by,
        }
        if version >= 2:
            d.update(failures=self.failures, failed_reason=self.failed_reason)
        return d

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "TrialState":
        return cls(
            index=int(d["index"]),
            model_seed=int(d["model_seed"]),
            data_seed=int(d["data_seed"]),
            output_dir=d["output_dir"],
            status=d["status"],
            results={int(s): StageResult.from_json(r) for s, r in d["results"].items()},
            history={int(s): float(v) for s, v in d["history"].items()},
            starts=int(d["starts"]),
            diverged_reason=d["diverged_reason"],
            dropped_at_rung=d["dropped_at_rung"],
            replaces=d["replaces"],
            replaced_by=d["replaced_by"],
            failures=int(d.get("failures", 0)),
            failed_reason=d.get("failed_reason"),
        )


@dataclass
class RungState:
    """A rung: who entered it, and once done, their ranking and who was kept."""

    step: int
    entrants: List[str]
    ranking: Optional[List[str]] = None
    kept: Optional[List[str]] = None
    done: bool = False

    def to_json(self) -> Dict[str, Any]:
        return {"step": self.step, "entrants": list(self.entrants), "ranking": self.ranking, "kept": self.kept,
                "done": self.done}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "RungState":
        return cls(int(d["step"]), list(d["entrants"]), d["ranking"], d["kept"], bool(d["done"]))


@dataclass
class Continuation:
    """The winner's continuation to ``max_steps``: candidates best first, and those already started."""

    candidates: List[str]
    tried: List[str] = field(default_factory=list)

    def to_json(self) -> Dict[str, Any]:
        return {"candidates": list(self.candidates), "tried": list(self.tried)}

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "Continuation":
        return cls(list(d["candidates"]), list(d["tried"]))


@dataclass
class SearchState:
    """Everything a killed search needs to go on: trials (in creation order), rungs, continuation, winner.

    Example:

    >>> s = SearchState(search={"num_seeds": 1}, max_steps=10, rung_steps=[5])
    >>> s.trials["seed-0"] = TrialState(0, 42, 42, "out/trials/seed-0")
    >>> s.order.append("seed-0")
    >>> SearchState.from_json(s.to_json()) == s
    True
    """

    search: Dict[str, Any]
    max_steps: int
    rung_steps: List[int]
    trials: Dict[str, TrialState] = field(default_factory=dict)
    order: List[str] = field(default_factory=list)
    rungs: List[RungState] = field(default_factory=list)
    replacements_used: int = 0
    continuation: Optional[Continuation] = None
    winner: Optional[str] = None
    done: bool = False
    version: int = STATE_VERSION
    generation: int = 0

    def to_json(self) -> Dict[str, Any]:
        """The JSON layout of ``self.version`` (non-finite floats as strings)."""
        d = {
            "version": self.version,
            "search": dict(self.search),
            "max_steps": self.max_steps,
            "rung_steps": list(self.rung_steps),
            "trials": {tid: t.to_json(self.version) for tid, t in self.trials.items()},
            "order": list(self.order),
            "rungs": [r.to_json() for r in self.rungs],
            "replacements_used": self.replacements_used,
            "continuation": self.continuation.to_json() if self.continuation else None,
            "winner": self.winner,
            "done": self.done,
        }
        if self.version >= 2:
            d["generation"] = self.generation
        return jsonable(d)

    @classmethod
    def from_json(cls, d: Dict[str, Any], source: str = "state") -> "SearchState":
        if d.get("version") not in READABLE_VERSIONS:
            raise ValueError(f"{source} has state version {d.get('version')!r}; expected one of "
                             f"{list(READABLE_VERSIONS)}.")
        return cls(
            search=dict(d["search"]),
            max_steps=int(d["max_steps"]),
            rung_steps=[int(s) for s in d["rung_steps"]],
            trials={tid: TrialState.from_json(t) for tid, t in d["trials"].items()},
            order=list(d["order"]),
            rungs=[RungState.from_json(r) for r in d["rungs"]],
            replacements_used=int(d["replacements_used"]),
            continuation=Continuation.from_json(d["continuation"]) if d["continuation"] else None,
            winner=d["winner"],
            done=bool(d["done"]),
            version=int(d["version"]),
            generation=int(d.get("generation", 0)),
        )

    def upgrade(self, output_dir: str) -> None:
        """A version-1 state becomes version 2: its paths (as written, relative to the working directory or
        absolute) become relative to ``output_dir``. A version-2 state is left as it is."""
        if self.version >= 2:
            return
        for t in self.trials.values():
            t.output_dir = relative_to(t.output_dir, output_dir)
            for r in t.results.values():
                r.checkpoint_dir = relative_to(r.checkpoint_dir, output_dir)
        self.version = 2

    def save(self, path: str) -> None:
        """Rewrites ``path`` atomically (a kill leaves the old file or the new one)."""
        atomic_write_text(path, json.dumps(self.to_json(), indent=1, sort_keys=True))

    @classmethod
    def load(cls, path: str) -> "SearchState":
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f), source=path)


def relative_to(path: Optional[str], root: str) -> Optional[str]:
    """``path`` relative to ``root`` (``None`` stays ``None``).

    >>> relative_to("/runs/search/trials/seed-0", "/runs/search"), relative_to(None, "/runs")
    ('trials/seed-0', None)
    """
    if path is None:
        return None
    return os.path.relpath(os.path.abspath(path), os.path.abspath(root))
