"""A stub trial runner for the Ray backend's tests, importable by Ray workers and by a driver subprocess.

Eval values come from a table (eval_loss of trial i at step s = a_i + b_i / s); each stage sleeps ``delay``
seconds, checks the fence, then writes ``checkpoint-<step>/marker.json`` (trial, seed, step, generation) and
appends a line to ``stages.log`` in the trial's directory. Faults are files in the search directory:
``crash-<trial>-<step>`` makes that stage's next run raise (the file is removed: once),
``crash-always-<trial>-<step>`` makes it raise every time, and ``kill-<trial>-<step>`` makes the process
running that stage kill itself with SIGKILL once (a worker lost).

Run as a driver: ``python tests/_restart_stub.py OUT --backend ray --address HOST:PORT [--delay S]``.
"""

import argparse
import json
import os
import signal
import sys
import time

from hf_fasttrain.restarts import RestartConfig, RestartOrchestrator, TrialResult
from hf_fasttrain.restarts.orchestrator import check_stage_current

# 8 seeds; by hand: step 4 -> [4.0, 4.25, 3.5, 3.6, 5.5, 4.4, 5.0, 4.7], step 8 -> seed-1 overtakes.
COEFFS = [(2.0, 8), (1.0, 13), (3.0, 2), (2.6, 4), (1.5, 16), (3.4, 4), (4.0, 4), (2.2, 10)]
MAX_STEPS = 40
CONFIG = dict(num_seeds=8, explore_fraction=0.4, rungs=3, seed=42)  # rungs at 4, 8, 16; winner to 40


class InjectedCrash(RuntimeError):
    pass


class TableRunner:
    def __init__(self, search_dir, delay=0.0):
        self.search_dir = os.path.abspath(search_dir)
        self.delay = delay

    def available_metrics(self):
        return ["eval_loss"]

    def _crash(self, trial, until_step):
        kill = os.path.join(self.search_dir, f"kill-{trial.trial_id}-{until_step}")
        if os.path.exists(kill):
            os.remove(kill)
            os.kill(os.getpid(), signal.SIGKILL)
        once = os.path.join(self.search_dir, f"crash-{trial.trial_id}-{until_step}")
        if os.path.exists(os.path.join(self.search_dir, f"crash-always-{trial.trial_id}-{until_step}")):
            raise InjectedCrash(f"{trial.trial_id} crashed on its way to step {until_step}")
        if os.path.exists(once):
            os.remove(once)
            raise InjectedCrash(f"{trial.trial_id} crashed once on its way to step {until_step}")

    def run(self, trial, until_step, resume_from):
        start = 0
        if resume_from is not None:
            with open(os.path.join(resume_from, "marker.json")) as f:
                marker = json.load(f)
            assert marker["trial_id"] == trial.trial_id and marker["step"] < until_step
            start = marker["step"]
        time.sleep(self.delay)
        self._crash(trial, until_step)
        check_stage_current(trial)  # as a recipe trial does before each save
        a, b = COEFFS[trial.index]
        hist = [{"step": s, "eval_loss": a + b / s} for s in range(start + 1, until_step + 1) if s % 2 == 0]
        ckpt = os.path.join(trial.output_dir, f"checkpoint-{until_step}")
        os.makedirs(ckpt, exist_ok=True)
        with open(os.path.join(ckpt, "marker.json"), "w") as f:
            json.dump({"trial_id": trial.trial_id, "step": until_step, "generation": trial.generation,
                       "pid": os.getpid()}, f)
        with open(os.path.join(trial.output_dir, "stages.log"), "a") as f:
            f.write(f"{until_step} {trial.generation} {os.getpid()}\n")
        final = {"eval_loss": a + b / until_step}
        return TrialResult(hist, final, ckpt)


def search(out, backend="local", address=None, delay=0.0, max_concurrent=None, resources=None):
    """The stub search on ``backend``; returns its summary."""
    cfg = RestartConfig(**CONFIG, backend=backend, ray_address=address if backend == "ray" else None,
                        max_concurrent=max_concurrent, trial_resources=resources)
    runner = TableRunner(out, delay)
    if backend == "local":
        return RestartOrchestrator(cfg, runner, out, MAX_STEPS).run()
    from hf_fasttrain.restarts.ray_backend import RayTrialRunner

    ray_runner = RayTrialRunner(runner, address=address, resources=resources)
    orch = RestartOrchestrator(cfg, ray_runner, out, MAX_STEPS)
    with ray_runner.started(out):
        return orch.run()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("out")
    p.add_argument("--backend", default="ray")
    p.add_argument("--address", default=None)
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--max-concurrent", type=int, default=None)
    a = p.parse_args()
    summary = search(a.out, a.backend, a.address, a.delay, a.max_concurrent)
    print(json.dumps({"winner": summary["winner"]}))
    sys.stdout.flush()
