"""The recipe script end to end, as a user runs it (subprocesses, the tiny corpus)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "recipes" / "gpt2_small.py")
INJECT = str(ROOT / "tests" / "_inject.py")  # the recipe with a fault injected at a chosen step
SMALL = ["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300", "--block_size", "32",
         "--n_layer", "2", "--n_embd", "32", "--n_head", "2", "--per_device_train_batch_size", "8",
         "--max_eval_samples", "32", "--logging_steps", "5", "--disable_tqdm", "true", "--warmup_steps", "2"]


def _run(args, **kw):
    return subprocess.Popen([sys.executable, SCRIPT, *SMALL, *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env={**os.environ}, **kw)


@pytest.mark.e2e
def test_recipe_writes_its_record_and_lowers_eval_loss(tmp_path):
    out = tmp_path / "run"
    p = _run(["--output_dir", str(out), "--max_steps", "30", "--eval_steps", "15", "--save_steps", "15"])
    log, _ = p.communicate(timeout=600)
    assert p.returncode == 0, log[-3000:]
    for f in ("config.yaml", "run_info.json", "metrics.json", "loss_curve.png", "model.safetensors"):
        assert (out / f).exists(), f
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final_eval_loss"] < metrics["initial_eval_loss"] - 0.3
    assert "eval_next_token_accuracy" in metrics["final_metrics"]
    cfg = yaml.safe_load((out / "config.yaml").read_text())
    assert cfg["model"]["n_embd"] == 32 and cfg["data"]["block_size"] == 32 and cfg["max_steps"] == 30
    info = json.loads((out / "run_info.json").read_text())
    assert info["hf_fasttrain"] and info["torch"] and "git_revision" in info
    assert any("tokens_per_second" in h for h in metrics["history"])


def _train_losses(out):
    hist = json.loads((out / "metrics.json").read_text())["history"]
    return {h["step"]: h["loss"] for h in hist if "loss" in h}


@pytest.mark.e2e
def test_killed_recipe_resumes_with_the_same_command(tmp_path):
    common = ["--max_steps", "30", "--save_steps", "10", "--eval_steps", "15"]
    straight = _run(["--output_dir", str(tmp_path / "a"), *common])
    log, _ = straight.communicate(timeout=600)
    assert straight.returncode == 0, log[-3000:]

    # SIGKILL at a chosen point, not a chosen time: the process kills itself as step 11 begins, after step 10's
    # checkpoint is complete (the Trainer's files and every callback's on_save) and before anything of step 11
    out = tmp_path / "b"
    victim = subprocess.run([sys.executable, INJECT, "kill", "10", "--", *SMALL, "--output_dir", str(out), *common],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert victim.returncode == -signal.SIGKILL, victim.stderr[-3000:]
    assert (out / "checkpoint-10").is_dir() and not (out / "checkpoint-20").exists()
    assert not (out / "metrics.json").exists()  # killed before the end

    again = _run(["--output_dir", str(out), *common])  # the same command again
    log, _ = again.communicate(timeout=600)
    assert again.returncode == 0, log[-3000:]
    assert f"resuming b from {out / 'checkpoint-10'}" in log
    a, b = _train_losses(tmp_path / "a"), _train_losses(out)
    assert sorted(a) == sorted(b) == list(range(5, 31, 5))
    for step in a:
        assert abs(a[step] - b[step]) < 1e-5, (step, a[step], b[step])
