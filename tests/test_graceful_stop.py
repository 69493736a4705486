"""A signal stops a run at the end of the step in flight, with a complete checkpoint; the rerun is bit-exact.

Signals are sent by the process to itself from a callback at a chosen step (no timing): SIGTERM in the middle
of step k must give checkpoint-k, exit code 143 and a resumed run equal to a straight one, step for step.
"""

import concurrent.futures
import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

from hf_fasttrain import GracefulStopCallback
from hf_fasttrain.callbacks.graceful_stop import (
    SignalStopManager,
    TrainingStopped,
    resume_hint,
    stop_exit_code,
    stop_message,
)
from hf_fasttrain.callbacks.averaging import AVERAGE_FILE
from hf_fasttrain.callbacks.run_record import RECORD_FILE

from conftest import make_tiny_gpt2, make_tiny_trainer, tiny_args

ROOT = Path(__file__).resolve().parent.parent
INJECT = str(ROOT / "tests" / "_inject.py")
SMALL = ["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300", "--block_size", "32",
         "--n_layer", "2", "--n_embd", "32", "--n_head", "2", "--per_device_train_batch_size", "8",
         "--max_eval_samples", "32", "--logging_steps", "1", "--disable_tqdm", "true", "--warmup_steps", "2",
         "--seq_len_warmup_min", "null", "--eval_on_start", "false"]
# the steps a signal lands in: drawn once from a seeded generator, so they vary across the run but not across runs
STEPS = sorted(random.Random(26).sample(range(1, 8), 2))


def test_exit_codes_and_message():
    assert [stop_exit_code(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)] == [143, 130, 138]
    assert stop_message(178) == "stopped at step 178: saved checkpoint-178; rerun the same command to resume"
    stopped = TrainingStopped(signal.SIGTERM, 7)
    assert isinstance(stopped, SystemExit) and stopped.code == 143 and stopped.step == 7


@pytest.mark.e2e
def test_a_stop_in_a_worker_process_reaches_the_caller_whole():
    # a pool worker sends its exception back pickled: before, unpickling raised TypeError (SystemExit's one argument)
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        with pytest.raises(TrainingStopped) as stopped:
            pool.submit(_stop_in_worker, 12).result()
    assert (stopped.value.signum, stopped.value.step, stopped.value.code) == (signal.SIGTERM, 12, 143)
    assert stopped.value.checkpoint == "out/checkpoint-12"
    assert str(stopped.value) == stop_message(12)


def _stop_in_worker(step: int):
    raise TrainingStopped(signal.SIGTERM, step, f"out/checkpoint-{step}")


def test_manager_restores_the_handlers_it_replaced():
    before = signal.getsignal(signal.SIGTERM)
    manager = SignalStopManager()
    assert manager.setup_signal_handler()
    assert signal.getsignal(signal.SIGTERM) == manager._handler
    manager.request(signal.SIGUSR1)
    assert manager.signum == signal.SIGUSR1 and manager.is_checkpoint_requested
    manager.request(signal.SIGTERM)  # a second SIGTERM/SIGUSR1 changes nothing (only Ctrl-C exits at once)
    assert manager.signum == signal.SIGUSR1
    manager.restore()
    assert signal.getsignal(signal.SIGTERM) == before


class _SignalDuringStep(TrainerCallback):
    """Sends `signum` to this process in the middle of optimizer step `step` (before its update)."""

    def __init__(self, step, signum=signal.SIGTERM):
        self.step, self.signum = step, signum

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if state.global_step == self.step - 1:
            os.kill(os.getpid(), self.signum)


def _trainer(out, tok, lm, callbacks=(), **overrides):
    kw = dict(max_steps=8, save_strategy="steps", save_steps=3, eval_strategy="steps", eval_steps=4,
              weight_averaging="ema", ema_decay=0.9, divergence_guard=True, guard_snapshot_every=3, auto_resume=True)
    kw.update(overrides)
    return make_tiny_trainer(tok, lm, tiny_args(out, **kw), eval_dataset=lm["validation"].select(range(16)),
                             callbacks=list(callbacks))


def _losses(history):
    return {e["step"]: e["loss"] for e in history if "loss" in e}


def _evals(history):
    return {e["step"]: e["eval_loss"] for e in history if "eval_loss" in e}


@pytest.fixture(scope="module")
def straight(tiny_lm, tiny_tokenizer, tmp_path_factory):
    trainer = _trainer(tmp_path_factory.mktemp("straight"), tiny_tokenizer, tiny_lm)
    trainer.train()
    return trainer


@pytest.mark.slow
@pytest.mark.parametrize("step", STEPS)
def test_sigterm_mid_step_saves_that_step_and_the_rerun_is_bit_exact(step, straight, tiny_lm, tiny_tokenizer, tmp_path,
                                                                      capsys):
    first = _trainer(tmp_path / "b", tiny_tokenizer, tiny_lm, callbacks=[_SignalDuringStep(step)])
    handler_before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(TrainingStopped) as stopped:
        first.train()
    assert stopped.value.code == 143 and stopped.value.step == step
    assert signal.getsignal(signal.SIGTERM) == handler_before  # the run's handlers are gone with it
    assert capsys.readouterr().err.strip().splitlines()[-1] == stop_message(step)
    ckpt = tmp_path / "b" / f"checkpoint-{step}"
    files = set(os.listdir(ckpt))
    # complete: the Trainer's files, the weight average, and the run record's clock
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json",
            RECORD_FILE, AVERAGE_FILE} <= files, files
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert state["global_step"] == step
    assert "DivergenceGuardCallback" in state["stateful_callbacks"]  # the guard's counters
    assert "RunRecorderCallback" not in state["stateful_callbacks"]  # no wall clock in the TrainerState
    assert not state["stateful_callbacks"]["TrainerControl"]["args"]["should_training_stop"] or step == 8
    assert max(_losses(first.state.log_history)) == step  # stopped right there: no step after it

    resumed = _trainer(tmp_path / "b", tiny_tokenizer, tiny_lm)
    resumed.train()  # the script run again unchanged: FastTrainer resumes checkpoint-<step> by itself
    a, b = _losses(straight.state.log_history), _losses(resumed.state.log_history)
    assert sorted(b) == sorted(a) == list(range(1, 9))  # no step lost or repeated
    assert b == a  # bit-exact, step by step
    assert _evals(resumed.state.log_history) == _evals(straight.state.log_history)
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(p, q), name
    ema_a = straight.weight_averaging.average.state_dict()["ema"]
    ema_b = resumed.weight_averaging.average.state_dict()["ema"]
    assert ema_a and ema_a.keys() == ema_b.keys() and all(torch.equal(ema_a[k], ema_b[k]) for k in ema_a)


@pytest.mark.slow
def test_the_stop_line_of_a_script_at_the_defaults_names_the_checkpoint_to_resume(tiny_lm, tiny_tokenizer, tmp_path,
                                                                                   capsys):
    """FastTrainingArguments' defaults start fresh on a rerun (the Trainer's way): the line says how to resume."""
    trainer = _trainer(tmp_path, tiny_tokenizer, tiny_lm, max_steps=4, eval_strategy="no", weight_averaging="none",
                       divergence_guard=False, auto_resume=False, callbacks=[_SignalDuringStep(2)])
    with pytest.raises(TrainingStopped):
        trainer.train()
    ckpt = str(tmp_path / "checkpoint-2")
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"stopped at step 2: saved checkpoint-2; resume with train(resume_from_checkpoint={ckpt!r}) "
        f"(or --resume_from_checkpoint {ckpt})")


@pytest.mark.slow
def test_no_signal_changes_nothing_and_leaves_no_handler(tiny_lm, tiny_tokenizer, tmp_path):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    trainer = _trainer(tmp_path, tiny_tokenizer, tiny_lm, max_steps=3, save_strategy="no", eval_strategy="no",
                       weight_averaging="none", divergence_guard=False)
    trainer.train()
    assert not trainer.graceful_stop.stopped
    assert {s: signal.getsignal(s) for s in before} == before


@pytest.mark.slow
def test_plain_trainer_with_the_callback_stops_and_exits(tiny_lm, tiny_tokenizer, tmp_path, capsys):
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=8, per_device_train_batch_size=8, logging_steps=1,
                             save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                      data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                      callbacks=[_SignalDuringStep(3, signal.SIGUSR1)])
    trainer.add_callback(GracefulStopCallback(trainer))
    with pytest.raises(TrainingStopped) as stopped:
        trainer.train()
    assert stopped.value.code == 138 and trainer.state.global_step == 3
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-3"]  # saved although save_strategy is "no"
    # a plain Trainer does not resume by itself: the line names the checkpoint to pass
    ckpt = str(tmp_path / "checkpoint-3")
    assert capsys.readouterr().err.strip().splitlines()[-1] == stop_message(3, resume_hint(ckpt, auto_resume=False)) \
        == (f"stopped at step 3: saved checkpoint-3; resume with train(resume_from_checkpoint={ckpt!r}) "
            f"(or --resume_from_checkpoint {ckpt})")


def test_a_user_who_enabled_jit_checkpoint_gets_one_handler(tiny_lm, tiny_tokenizer, tmp_path):
    from transformers.trainer_jit_checkpoint import JITCheckpointCallback

    before = signal.getsignal(signal.SIGTERM)
    trainer = _trainer(tmp_path, tiny_tokenizer, tiny_lm, enable_jit_checkpoint=True)
    kinds = [type(c) for c in trainer.callback_handler.callbacks]
    assert JITCheckpointCallback not in kinds and GracefulStopCallback in kinds
    assert signal.getsignal(signal.SIGTERM) == before  # the Trainer's handler (installed at init) is undone


# --- the recipe, as a user runs it ------------------------------------------------------------------------------
def _recipe(action, step, args, **kw):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, INJECT, action, str(step), "--", *SMALL, *args], capture_output=True,
                          text=True, env=env, timeout=600, cwd=ROOT, **kw)


def _metrics(out):
    return json.loads((out / "metrics.json").read_text())


@pytest.mark.e2e
@pytest.mark.parametrize("action, code", [("term", 143), ("int", 130)])
def test_recipe_stopped_by_a_signal_says_so_and_the_same_command_resumes(action, code, tmp_path):
    common = ["--max_steps", "12", "--save_steps", "5", "--eval_steps", "6"]
    straight = _recipe("none", 0, ["--output_dir", str(tmp_path / "a"), *common])
    assert straight.returncode == 0, straight.stderr[-3000:]

    out = tmp_path / "b"
    first = _recipe(action, 8, ["--output_dir", str(out), *common])
    assert first.returncode == code, first.stderr[-3000:]
    err = first.stderr.strip().splitlines()
    assert err[-1] == stop_message(8) and "Traceback" not in first.stderr
    assert (out / "checkpoint-8" / "trainer_state.json").exists()
    assert not (out / "model.safetensors").exists()  # not finished: no final model, no "done"
    assert not any(line.startswith("done") for line in err)

    again = _recipe("none", 0, ["--output_dir", str(out), *common])  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"resuming b from {out / 'checkpoint-8'}" in again.stderr
    a, b = _metrics(tmp_path / "a"), _metrics(out)
    la = {h["step"]: h["loss"] for h in a["history"] if "loss" in h}
    lb = {h["step"]: h["loss"] for h in b["history"] if "loss" in h}
    assert sorted(lb) == sorted(la) == list(range(1, 13)) and lb == la
    assert a["final_eval_loss"] == b["final_eval_loss"]


@pytest.mark.e2e
def test_ctrl_c_in_a_terminal_reaches_the_dataloader_workers_too_and_the_run_resumes(tmp_path):
    # a terminal's Ctrl-C signals the whole foreground process group: the main process and its DataLoader workers
    common = ["--max_steps", "12", "--save_steps", "5", "--eval_steps", "6", "--dataloader_num_workers", "2"]
    straight = _recipe("none", 0, ["--output_dir", str(tmp_path / "a"), *common])
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = tmp_path / "b"
    first = _recipe("intpg", 8, ["--output_dir", str(out), *common], start_new_session=True)
    assert first.returncode == 130, first.stderr[-3000:]
    assert first.stderr.strip().splitlines()[-1] == stop_message(8) and "Traceback" not in first.stderr
    assert (out / "checkpoint-8" / "trainer_state.json").exists() and not (out / "model.safetensors").exists()
    again = _recipe("none", 0, ["--output_dir", str(out), *common])
    assert again.returncode == 0, again.stderr[-3000:]
    a, b = _metrics(tmp_path / "a"), _metrics(out)
    assert [h["loss"] for h in a["history"] if "loss" in h] == [h["loss"] for h in b["history"] if "loss" in h]
    assert a["final_eval_loss"] == b["final_eval_loss"]


@pytest.mark.e2e
def test_second_ctrl_c_exits_at_once_without_a_traceback(tmp_path):
    out = tmp_path / "run"
    p = _recipe("int2", 3, ["--output_dir", str(out), "--max_steps", "12", "--save_steps", "100"])
    assert p.returncode == 130, p.stderr[-3000:]
    assert p.stderr.strip().splitlines()[-1] == "interrupted again: exiting now, without saving"
    assert "Traceback" not in p.stderr and not (out / "checkpoint-3").exists()


# --- two processes (DDP over gloo): the signal reaches one, both stop at the same step -------------------------
def _launch(action, step, rank, args, steps_file):
    from test_accelerate_launch import _free_port

    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()), INJECT, action, str(step), str(rank), "--", *SMALL, *args]
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT),
           "INJECT_STEPS_FILE": str(steps_file)}
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, cwd=ROOT)


def _steps(steps_file, rank):
    return [int(s) for s in Path(f"{steps_file}.rank{rank}").read_text().split()]


@pytest.mark.e2e
def test_two_processes_stop_at_the_same_step_when_one_gets_sigterm(tmp_path):
    common = ["--max_steps", "10", "--save_steps", "100", "--eval_steps", "5"]
    straight = _launch("none", 0, 0, ["--output_dir", str(tmp_path / "a"), *common], tmp_path / "sa")
    assert straight.returncode == 0, straight.stderr[-3000:]

    out = tmp_path / "b"
    first = _launch("term", 4, 0, ["--output_dir", str(out), *common], tmp_path / "sb")  # rank 0 only
    assert first.returncode != 0, first.stderr[-3000:]
    assert _steps(tmp_path / "sb", 0) == _steps(tmp_path / "sb", 1) == [1, 2, 3, 4]  # rank 1 stopped there too
    assert stop_message(4) in first.stderr.splitlines()
    assert "exitcode  : 143" in first.stderr or "exit code 143" in first.stderr or "143" in first.stderr
    assert (out / "checkpoint-4" / "trainer_state.json").exists() and not (out / "model.safetensors").exists()

    again = _launch("none", 0, 0, ["--output_dir", str(out), *common], tmp_path / "sc")  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    assert _steps(tmp_path / "sc", 0) == _steps(tmp_path / "sc", 1) == list(range(5, 11))
    a, b = _metrics(tmp_path / "a"), _metrics(out)
    la = {h["step"]: h["loss"] for h in a["history"] if "loss" in h}
    lb = {h["step"]: h["loss"] for h in b["history"] if "loss" in h}
    assert sorted(lb) == sorted(la) == list(range(1, 11)) and lb == la
    assert a["final_eval_loss"] == b["final_eval_loss"]
