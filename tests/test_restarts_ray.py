"""Random restart on the Ray backend, on a local Ray cluster (2 CPUs, 127.0.0.1 only, a private temp dir).

The cluster is started once for the module (starting Ray takes 6-25 s on a 2-core machine) and stopped by
``ray.shutdown``; the test then checks that every process it started is gone (by pid). Stub trials
(tests/_restart_stub.py) run the same 8-seed, 3-rung search as the local backend; the recipe test runs the
tiny GPT-2 recipe through ``hf-fasttrain restarts --backend ray``. Skipped when Ray is not installed
(``pip install "hf_fasttrain[ray]"``).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hf_fasttrain.restarts.ray_backend import LOOPBACK_ENV

os.environ.setdefault(LOOPBACK_ENV, "0")  # before `import ray`: a local cluster stays on loopback
ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

import _restart_stub as stub  # noqa: E402  (tests/ is on sys.path under pytest)
from hf_fasttrain.restarts import STATE_FILE, SUMMARY_JSON, RestartConfig, RestartOrchestrator  # noqa: E402
from hf_fasttrain.restarts.orchestrator import StageFailed, TrialSpec  # noqa: E402
from hf_fasttrain.restarts.ray_backend import RayTrialRunner  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster for this module: its GCS address and the pids of the processes it started."""
    if ray.is_initialized():
        pytest.skip("Ray is already initialised in this process")
    # the workers import this checkout's hf_fasttrain and the stub module
    old_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), str(ROOT / "tests"), old_path) if p)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    temp_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    ctx = ray.init(num_cpus=2, _temp_dir=temp_dir, include_dashboard=False, _node_ip_address="127.0.0.1",
                   log_to_driver=False)
    pids = {p.pid for p in psutil.Process().children(recursive=True)} - before
    try:
        yield {"address": ctx.address_info["gcs_address"], "pids": pids}
    finally:
        ray.shutdown()
        deadline = time.time() + 30
        while time.time() < deadline and any(psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"
                                             for p in pids):
            time.sleep(0.5)
        left = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != "zombie"]
        for p in left:  # only ours, by pid
            os.kill(p, signal.SIGKILL)
        shutil.rmtree(temp_dir, ignore_errors=True)
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
        assert not left, f"ray.shutdown left processes {left}"


def _comparable(summary):
    return {k: summary[k] for k in ("winner", "rung_steps", "total_steps", "winner_final_metric")}, [
        (r["trial_id"], r["rung_metrics"], r["final_metric"], r["status"]) for r in summary["trials"]]


@pytest.fixture(scope="module")
def local_summary(tmp_path_factory):
    return stub.search(str(tmp_path_factory.mktemp("local")), "local")


def test_cluster_listens_on_loopback_only(cluster):
    out = subprocess.run(["ss", "-tlnpH"], capture_output=True, text=True, check=True).stdout
    ours = [line for line in out.splitlines() if any(f"pid={p}," in line for p in cluster["pids"])]
    assert ours, "no listening socket of the cluster's processes found"
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in ours}
    # an IPv6 socket bound to the IPv4-mapped loopback address is loopback too
    assert addresses <= {"127.0.0.1", "[::ffff:127.0.0.1]"} and "127.0.0.1" in addresses, ours


def test_stub_search_on_ray_equals_the_local_search(cluster, local_summary, tmp_path):
    summary = stub.search(str(tmp_path), "ray", max_concurrent=2)
    assert _comparable(summary) == _comparable(local_summary)
    assert summary["winner"] == "seed-1" and summary["rung_steps"] == [4, 8, 16] and summary["total_steps"] == 88
    # every stage ran in a Ray worker, not in this process
    pids = {int(line.split()[2]) for d in (tmp_path / "trials").iterdir() for line in (d / "stages.log").open()}
    assert os.getpid() not in pids
    # the state holds paths relative to output_dir; the summary resolves them
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["trials"]["seed-1"]["output_dir"] == "trials/seed-1"
    assert state["trials"]["seed-1"]["results"]["40"]["checkpoint_dir"] == "trials/seed-1/checkpoint-40"
    assert summary["winner_checkpoint"] == os.path.join(str(tmp_path), "trials/seed-1/checkpoint-40")


def test_a_crashed_stage_is_retried_from_its_checkpoint(cluster, local_summary, tmp_path):
    (tmp_path / "crash-seed-3-8").touch()  # seed-3's stage 4 -> 8 raises once in its worker
    (tmp_path / "kill-seed-2-8").touch()  # the worker running seed-2's stage 4 -> 8 is killed (SIGKILL) once
    summary = stub.search(str(tmp_path), "ray")
    assert _comparable(summary) == _comparable(local_summary)
    assert not (tmp_path / "crash-seed-3-8").exists() and not (tmp_path / "kill-seed-2-8").exists()
    killed = {r["trial_id"]: r for r in summary["trials"]}["seed-2"]
    assert killed["starts"] == 3 and not killed["failed"]
    assert [line.split()[0] for line in (tmp_path / "trials/seed-2/stages.log").open()] == ["4", "8"]
    row = {r["trial_id"]: r for r in summary["trials"]}["seed-3"]
    assert row["starts"] == 3 and row["status"] == "dropped" and not row["failed"]  # 0 -> 4, 4 -> 8 twice
    # the retry resumed from checkpoint-4 (the stub asserts it), so it ran the stage to 8 once, after the crash
    assert [line.split()[0] for line in (tmp_path / "trials/seed-3/stages.log").open()] == ["4", "8"]


def test_a_stage_that_fails_twice_marks_its_trial_failed(cluster, tmp_path):
    (tmp_path / "crash-always-seed-1-16").touch()  # the leader at rung 1 crashes at every try of rung 2
    summary = stub.search(str(tmp_path), "ray")
    row = {r["trial_id"]: r for r in summary["trials"]}["seed-1"]
    assert row["failed"] and row["status"] == "failed" and row["starts"] == 4 and not row["chosen"]
    assert "InjectedCrash" in row["failed_reason"] and "stage to step 16 failed twice" in row["failed_reason"]
    # the search goes on without it: seed-0 is the only one left at rung 2
    assert summary["winner"] == "seed-0" and summary["num_failed"] == 1
    assert "failed (stage to step 16 failed twice" in (tmp_path / "restarts_summary.md").read_text()


def test_a_stale_stage_from_an_older_driver_writes_nothing(cluster, tmp_path):
    cfg = RestartConfig(**stub.CONFIG, backend="ray")
    orch = RestartOrchestrator(cfg, stub.TableRunner(tmp_path), str(tmp_path), stub.MAX_STEPS)
    orch._load_or_init()
    orch.state.generation = 1
    orch._save()
    runner = RayTrialRunner(stub.TableRunner(tmp_path, delay=3.0))
    runner.start(str(tmp_path))
    spec = orch._spec("seed-0")
    assert spec.generation == 1 and spec.state_path == str(tmp_path / STATE_FILE)
    import threading

    caught = []
    worker = threading.Thread(target=lambda: caught.append(_run_expecting_failure(runner, spec)))
    worker.start()
    time.sleep(1.0)
    orch.state.generation = 2  # a new driver took over while the stage slept
    orch._save()
    worker.join(60)
    assert caught and "StaleStageError" in caught[0] and "generation 2" in caught[0]
    assert not (tmp_path / "trials" / "seed-0" / "checkpoint-4").exists()


def _run_expecting_failure(runner, spec: TrialSpec) -> str:
    try:
        runner.run(spec, 4, None)
    except StageFailed as e:
        return str(e)
    return "no failure"


def test_killed_driver_resumes_with_the_same_command(cluster, local_summary, tmp_path):
    out = tmp_path / "search"
    cmd = [sys.executable, str(ROOT / "tests" / "_restart_stub.py"), str(out), "--backend", "ray",
           "--address", cluster["address"], "--delay", "1.0", "--max-concurrent", "2"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]))
    driver = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 240
        state = {}
        while time.time() < deadline:  # kill once rung 0 is done and rung 1 is under way
            try:
                state = json.loads((out / STATE_FILE).read_text())
            except (OSError, ValueError):
                state = {}
            if len(state.get("rungs", [])) >= 2 and any(t["status"] == "running" for t in state["trials"].values()):
                break
            assert driver.poll() is None, driver.stdout.read().decode()
            time.sleep(0.2)
        else:
            pytest.fail("the driver did not reach rung 1")
        driver.send_signal(signal.SIGKILL)
        driver.wait(30)
    finally:
        if driver.poll() is None:
            driver.kill()
    at_kill = json.loads((out / STATE_FILE).read_text())
    done_at_kill = {(tid, s) for tid, t in at_kill["trials"].items() for s in t["results"]}
    assert at_kill["generation"] == 1 and not at_kill["done"]
    rerun = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    summary = json.loads((out / SUMMARY_JSON).read_text())
    assert _comparable(summary) == _comparable(local_summary)
    final = json.loads((out / STATE_FILE).read_text())
    assert final["generation"] == 2 and final["done"]
    # no stage recorded before the kill ran again; every stage recorded after it was run by generation 2
    for tid in final["trials"]:
        log = (out / "trials" / tid / "stages.log").read_text().split("\n")
        runs = [tuple(map(int, line.split()[:2])) for line in log if line]
        for step in final["trials"][tid]["results"]:
            gens = [g for s, g in runs if s == int(step)]
            if (tid, step) in done_at_kill:
                assert gens == [1], (tid, step, runs)
            else:
                assert gens[-1] == 2, (tid, step, runs)


# ----------------------------------------------------------------------------------------------------------
# the tiny recipe, end to end
# ----------------------------------------------------------------------------------------------------------

TINY = ["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300", "--block_size", "32",
        "--n_layer", "2", "--n_embd", "32", "--n_head", "2", "--per_device_train_batch_size", "8",
        "--max_eval_samples", "32", "--per_device_eval_batch_size", "32", "--logging_steps", "1",
        "--disable_tqdm", "true", "--warmup_steps", "2", "--eval_steps", "2", "--eval_on_start", "false",
        "--save_strategy", "no", "--max_steps", "6", "--seed", "42", "--num-seeds", "4",
        "--explore-fraction", str(1 / 3)]


def test_cli_restarts_backend_ray_gives_the_local_winner_and_summary(cluster, tmp_path, capsys):
    from hf_fasttrain.cli import main as cli_main

    assert cli_main(["restarts", *TINY, "--output_dir", str(tmp_path / "local")]) == 0
    assert cli_main(["restarts", *TINY, "--output_dir", str(tmp_path / "ray"), "--backend", "ray",
                     "--trial-resources", '{"num_cpus": 1}', "--max-concurrent", "2"]) == 0
    assert "**chosen**" in capsys.readouterr().out
    local = json.loads((tmp_path / "local" / SUMMARY_JSON).read_text())
    on_ray = json.loads((tmp_path / "ray" / SUMMARY_JSON).read_text())
    assert on_ray["winner"] == local["winner"] and on_ray["rung_steps"] == local["rung_steps"]
    assert on_ray["config"]["backend"] == "ray" and local["config"]["backend"] == "local"
    for a, b in zip(local["trials"], on_ray["trials"]):
        assert (a["trial_id"], a["status"], a["steps_trained"]) == (b["trial_id"], b["status"], b["steps_trained"])
        assert b["rung_metrics"] == pytest.approx(a["rung_metrics"], rel=1e-5)
    assert on_ray["winner_final_metric"] == pytest.approx(local["winner_final_metric"], rel=1e-5)
