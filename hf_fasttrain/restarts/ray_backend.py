"""The Ray backend of random restart: every stage of a trial is one Ray task; the search stays here.

The orchestrator (synchronous successive halving, its state file) runs in the driver, exactly as with the
local backend; :class:`RayTrialRunner` is a :class:`~.orchestrator.TrialRunner` that ships each
``run(trial, until_step, resume_from)`` to a Ray worker and waits for it. Only Ray's stable core API is used:
``ray.init``, ``ray.remote``, ``ray.put``, ``ray.get``, ``ray.nodes``, ``ray.shutdown``.

- **Shared storage.** Trials write their checkpoints into the search's ``output_dir``, which every node must
  see at the same path: :meth:`RayTrialRunner.start` has one task per node write and read a file there and
  refuses the search (one line) when a node cannot (:func:`check_shared_storage`).
- **Faults.** A task that fails (its worker or node lost, its process killed, an error inside) comes back as
  :class:`~.orchestrator.StageFailed`: the orchestrator runs the stage once more, resumed from the trial's
  last complete checkpoint, then marks the trial failed. Ray's own task retries are off (``max_retries=0``):
  a blind rerun from scratch would not resume from the checkpoint.
- **Fencing.** Each task carries the generation of the driver that launched it and checks it against the
  state file before it starts and before it returns (:func:`~.orchestrator.check_stage_current`; recipe
  trials also check before every save). A driver killed and started again raises the generation, so a task
  the dead driver left running stops instead of writing into the new driver's stage.

Ray is imported only here, and only when a search asks for ``backend="ray"`` (``pip install
"hf_fasttrain[ray]"``). Standard library otherwise; nothing of the package above the restart core.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import uuid
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from .orchestrator import StageFailed, TrialResult, TrialSpec, check_stage_current

__all__ = ["RayTrialRunner", "import_ray", "check_shared_storage", "task_options", "LOOPBACK_ENV"]

# Set before `import ray`: with it, a local cluster started by ray.init keeps every socket on 127.0.0.1
# (Ray 2.60 otherwise binds its services to the machine's network address; checked with `ss -tlnp`).
LOOPBACK_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
PROBE_DIR = ".ray_storage_check"


def import_ray():
    """``import ray``, after setting :data:`LOOPBACK_ENV` (unless the user set it); a one-line error without Ray."""
    os.environ.setdefault(LOOPBACK_ENV, "0")
    try:
        import ray
    except ImportError:
        raise ValueError(
            "restart_backend='ray' needs Ray, which is not installed; pip install 'hf_fasttrain[ray]' "
            "(or use restart_backend='local')"
        ) from None
    return ray


def task_options(resources: Optional[Dict[str, float]]) -> Dict[str, Any]:
    """``trial_resources`` as ``ray.remote`` options: ``num_cpus``/``num_gpus``/``memory`` by name, any other
    key as a custom resource; one CPU when nothing is given.

    >>> task_options(None)
    {'num_cpus': 1, 'num_gpus': 0, 'max_retries': 0}
    >>> task_options({"num_gpus": 1, "num_cpus": 8, "A100": 1})
    {'num_cpus': 8, 'num_gpus': 1, 'max_retries': 0, 'resources': {'A100': 1}}
    """
    r = dict(resources or {})
    opts: Dict[str, Any] = {"num_cpus": r.pop("num_cpus", 1), "num_gpus": r.pop("num_gpus", 0), "max_retries": 0}
    if "memory" in r:
        opts["memory"] = r.pop("memory")
    if r:
        opts["resources"] = r
    return opts


def _run_stage(runner, trial: TrialSpec, until_step: int, resume_from: Optional[str]) -> TrialResult:
    """The task: one stage of one trial on a Ray worker, fenced by the launching driver's generation."""
    check_stage_current(trial)  # a newer driver owns the search: do not start
    result = runner.run(trial, until_step, resume_from)
    check_stage_current(trial)  # nor hand back a result as if current
    return result


def _probe(directory: str, driver_file: str, token: str) -> Tuple[str, Optional[str], Optional[str]]:
    """On a node: read the driver's file and write one back. Returns (host, problem or None, file written)."""
    host = socket.gethostname()
    try:
        with open(os.path.join(directory, driver_file), encoding="utf-8") as f:
            if f.read() != token:
                return host, f"read other contents from {driver_file}", None
    except OSError as e:
        return host, f"cannot read the driver's file ({e.strerror or e})", None
    name = f"node-{uuid.uuid4().hex}"
    try:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, name), "w", encoding="utf-8") as f:
            f.write(token)
    except OSError as e:
        return host, f"cannot write there ({e.strerror or e})", None
    return host, None, name


def check_shared_storage(output_dir: str, run_probes: Callable[[str, str, str], Sequence[Tuple[str, Optional[str],
                                                                                                 Optional[str]]]]
                         ) -> None:
    """Refuses (``ValueError``, one line) unless every node can read and write ``output_dir``, and the driver
    reads what they wrote. ``run_probes(directory, driver_file, token)`` runs :func:`_probe` on every node
    and returns their answers (Ray tasks in :meth:`RayTrialRunner.start`; a plain function in tests)."""
    output_dir = os.path.abspath(output_dir)
    directory = os.path.join(output_dir, PROBE_DIR)
    os.makedirs(directory, exist_ok=True)
    token = uuid.uuid4().hex
    driver_file = f"driver-{token}"
    with open(os.path.join(directory, driver_file), "w", encoding="utf-8") as f:
        f.write(token)
    problems: List[str] = []
    written: List[str] = [driver_file]
    try:
        for host, problem, name in run_probes(directory, driver_file, token):
            if problem is None:
                written.append(name)
                try:
                    with open(os.path.join(directory, name), encoding="utf-8") as f:
                        ok = f.read() == token
                except OSError:
                    ok = False
                if not ok:
                    problem = "wrote a file that the driver cannot read"
            if problem is not None:
                problems.append(f"node {host} {problem}")
    finally:
        for name in written:
            try:
                os.remove(os.path.join(directory, name))
            except OSError:
                pass
        try:
            os.rmdir(directory)
        except OSError:
            pass
    if problems:
        raise ValueError(
            f"output_dir={output_dir!r} is not shared with the Ray workers: {'; '.join(problems)}; "
            "restart_backend='ray' needs an output_dir on a filesystem that every node mounts at the same path"
        )


class RayTrialRunner:
    """Runs each stage of a trial as a Ray task; wraps the runner that trains (e.g. ``RecipeTrialRunner``).

    The wrapped runner is sent to the cluster once (``ray.put``) and must be picklable; each stage is one task
    with ``trial_resources`` (``num_gpus``, ``num_cpus``, ``memory`` or custom resources). Paths handed to the
    workers are absolute: ``output_dir`` must be on storage every node mounts at the same path.

    Args:
        runner (`TrialRunner`):
            Trains one stage on the worker (``run(trial, until_step, resume_from)``).
        address (`str`, *optional*, defaults to `None`):
            ``ray.init``'s address: ``"auto"``, ``"ray://host:port"``, ``"host:port"``; ``None`` starts a local
            cluster (on 127.0.0.1 only). A Ray already initialised in this process is used as it is.
        resources (`dict`, *optional*, defaults to `None`):
            What one stage asks for (:func:`task_options`).
        init_kwargs (`dict`, *optional*, defaults to `None`):
            More ``ray.init`` arguments for a local cluster (e.g. ``num_cpus``).

    Example:
        ```python
        >>> # runner = RayTrialRunner(RecipeTrialRunner(m, d, t), address="auto", resources={"num_gpus": 1})
        >>> # orch = RestartOrchestrator(config, runner, "/shared/search", max_steps)
        >>> # with runner.started("/shared/search"):
        >>> #     summary = orch.run()
        ```
    """

    def __init__(self, runner, address: Optional[str] = None, resources: Optional[Dict[str, float]] = None,
                 init_kwargs: Optional[Dict[str, Any]] = None):
        self.runner = runner
        self.address = address
        self.resources = dict(resources or {})
        self.init_kwargs = dict(init_kwargs or {})
        self._ray = None
        self._owns_ray = False
        self._runner_ref = None
        self._task = None

    # Passthroughs
    def available_metrics(self):
        available = getattr(self.runner, "available_metrics", None)
        return available() if callable(available) else None

    # -- cluster -------------------------------------------------------------------------------
    def start(self, output_dir: str) -> None:
        """Connects to (or starts) the cluster, checks that every node shares ``output_dir``, ships the runner."""
        ray = self._ray = import_ray()
        if not ray.is_initialized():
            kwargs: Dict[str, Any] = {"address": self.address, "include_dashboard": False, "log_to_driver": False}
            if self.address is None:  # a local cluster: loopback only
                kwargs["_node_ip_address"] = "127.0.0.1"
                kwargs.update(self.init_kwargs)
            ray.init(**kwargs)
            self._owns_ray = True
        probe = ray.remote(num_cpus=0, max_retries=0)(_probe)

        def run_probes(directory, driver_file, token):
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            refs = [probe.options(resources={f"node:{n['NodeManagerAddress']}": 0.001}).remote(
                directory, driver_file, token) for n in nodes]
            return ray.get(refs)

        check_shared_storage(output_dir, run_probes)
        self._runner_ref = ray.put(self.runner)
        self._task = ray.remote(_run_stage)

    def close(self) -> None:
        """Stops the local cluster this runner started (a cluster it only joined keeps running)."""
        if self._owns_ray and self._ray is not None and self._ray.is_initialized():
            self._ray.shutdown()
        self._owns_ray = False
        self._task = self._runner_ref = None

    @contextlib.contextmanager
    def started(self, output_dir: str) -> Iterator["RayTrialRunner"]:
        """``with runner.started(output_dir):`` :meth:`start`, then :meth:`close` on the way out."""
        self.start(output_dir)
        try:
            yield self
        finally:
            self.close()

    # -- stages --------------------------------------------------------------------------------
    def run(self, trial: TrialSpec, until_step: int, resume_from: Optional[str]) -> TrialResult:
        if self._task is None:
            raise RuntimeError("RayTrialRunner.run before start(output_dir)")
        ray = self._ray
        trial = dataclasses.replace(trial, output_dir=os.path.abspath(trial.output_dir))
        resume_from = os.path.abspath(resume_from) if resume_from else None
        ref = self._task.options(**task_options(self.resources)).remote(self._runner_ref, trial, until_step,
                                                                        resume_from)
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as e:  # the task raised, or its worker / node / object was lost
            first = str(e).strip().splitlines()
            raise StageFailed(f"{type(e).__name__}: {first[-1] if first else ''}".strip()) from e
