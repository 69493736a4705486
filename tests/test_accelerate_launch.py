"""The tiny recipe under `accelerate launch` with 2 CPU processes (DDP over gloo), and in bf16 on CPU.

Why `--multi_gpu` and not `--cpu --num_processes 2`: in accelerate 1.15, `--cpu` always goes through
the simple launcher, which starts ONE process (several CPU processes need an mpirun hostfile). The
multi-GPU launcher is torchrun; with ACCELERATE_USE_CPU=true (and the tiny recipe's use_cpu) every
process trains on the CPU and accelerate joins them with gloo. Checked: with `--cpu` only rank 0 ran.

The recipe runs unchanged through tests/_recipe_probe.py, which records per process the sha1 of each
training row it ran forward on, the steps it ended, autocast state and the output-writing calls.
"""

import collections
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
PROBE = str(ROOT / "tests" / "_recipe_probe.py")
SMALL = ["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300", "--block_size", "32",
         "--n_layer", "2", "--n_embd", "32", "--n_head", "2", "--per_device_train_batch_size", "8",
         "--max_eval_samples", "32", "--logging_steps", "5", "--disable_tqdm", "true", "--warmup_steps", "2",
         # exact step counts below: the recipe's token-counted sequence-length warmup (more, shorter steps) is off;
         # its step count is tested in tests/test_seqlen.py and tests/test_cli.py
         "--seq_len_warmup_min", "null"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(probe_dir, args, n_proc=2):
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(n_proc),
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), PROBE, str(probe_dir), *SMALL, *args]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    return p.stdout + p.stderr, [json.loads((Path(probe_dir) / f"rank{r}.json").read_text()) for r in range(n_proc)]


def _unique_rows(rank):
    """Rows this rank trained on, minus rows that occur more than once in the dataset itself."""
    dup = {h for h, n in collections.Counter(rank["dataset_rows"]).items() if n > 1}
    return [h for h in rank["rows"] if h not in dup]


@pytest.mark.e2e
def test_two_process_ddp_disjoint_data_rank0_outputs_and_resume(tmp_path):
    out = tmp_path / "run"
    # a constant lr after its warmup: nothing spans max_steps, so the second command below may train longer
    log, (r0, r1) = _launch(tmp_path / "probe1", ["--output_dir", str(out), "--max_steps", "20", "--lr_decay", "constant",
                                                   "--save_steps", "10", "--eval_steps", "10"])
    # both processes ran, as one world of 2, every step
    assert (r0["rank"], r1["rank"], r0["world_size"], r1["world_size"]) == (0, 1, 2, 2)
    # the process group's gloo threads ended with the run, not in the interpreter's teardown (where one can abort
    # a rank that finished)
    assert r0["collective_threads_at_exit"] == r1["collective_threads_at_exit"] == []
    assert r0["steps"] == r1["steps"] == list(range(1, 21))
    assert len(r0["rows"]) == len(r1["rows"]) == 20 * 8
    # disjoint data: no row seen by both (rows duplicated in the corpus itself set aside)
    u0, u1 = _unique_rows(r0), _unique_rows(r1)
    assert len(u0) >= 150 and len(u1) >= 150
    assert set(u0).isdisjoint(u1)
    # outputs written once, by rank 0
    assert r1["writes"] == []
    assert r0["writes"].count("write_run_record") == 1
    assert r0["writes"].count("save_pretrained") == 3  # checkpoint-10, checkpoint-20, final model
    assert sorted(p.name for p in out.glob("checkpoint-*")) == ["checkpoint-10", "checkpoint-20"]
    for f in ("config.yaml", "run_info.json", "metrics.json", "model.safetensors", "loss_curve.png"):
        assert (out / f).exists(), f
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["precision"] == "auto" and cfg["bf16"] is False  # auto on CPU: fp32
    assert "precision: auto on CPU" in log
    # the loss falls
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"] - 0.3
    state = json.loads((out / "checkpoint-20" / "trainer_state.json").read_text())
    assert state["global_step"] == 20

    # the same command with more steps resumes from checkpoint-20, on both ranks, on new data
    log2, (s0, s1) = _launch(tmp_path / "probe2", ["--output_dir", str(out), "--max_steps", "30", "--lr_decay",
                                                    "constant", "--save_steps", "10", "--eval_steps", "10"])
    assert "resuming run from" in log2 and "checkpoint-20; applying max_steps 20 -> 30" in log2
    assert s0["start_step"] == s1["start_step"] == 20
    assert s0["steps"] == s1["steps"] == list(range(21, 31))
    v0, v1 = _unique_rows(s0), _unique_rows(s1)
    assert set(v0).isdisjoint(v1)
    assert set(v0 + v1).isdisjoint(u0 + u1)  # the consumed batches were skipped, not repeated
    assert s1["writes"] == []
    metrics2 = json.loads((out / "metrics.json").read_text())
    steps = [h["step"] for h in metrics2["history"] if "loss" in h]
    assert steps == [5, 10, 15, 20, 25, 30]
    assert metrics2["final_eval_loss"] < metrics["final_eval_loss"]


@pytest.mark.e2e
def test_bf16_autocast_on_cpu_runs_the_tiny_recipe_and_lowers_the_loss(tmp_path):
    """precision=bf16 with use_cpu=false: the precision choice turns use_cpu on (the Trainer would raise)."""
    out = tmp_path / "run"
    cmd = [sys.executable, PROBE, str(tmp_path / "probe"), *SMALL, "--output_dir", str(out), "--max_steps", "30",
           "--eval_steps", "15", "--save_strategy", "no", "--precision", "bf16", "--use_cpu", "false"]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ}, timeout=900, cwd=ROOT)
    assert p.returncode == 0, (p.stdout + p.stderr)[-4000:]
    log = p.stdout + p.stderr
    assert "precision: bf16 autocast on CPU" in log and "use_cpu=True set" in log
    rec = json.loads((tmp_path / "probe" / "rank0.json").read_text())
    assert len(rec["autocast"]) == 30 and all(rec["autocast"])  # every training forward under autocast
    assert set(rec["head_dtype"]) == {"torch.bfloat16"}  # the LM head's matmul ran in bf16
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert (cfg["precision"], cfg["bf16"], cfg["use_cpu"]) == ("bf16", True, True)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"] - 0.3
