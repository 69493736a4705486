"""RunRecorderCallback in a plain transformers.Trainer and in TRL's SFTTrainer: the training clock continues
across train(resume_from_checkpoint=...), from the run_record.json the callback wrote into the checkpoint.

Each test trains 4 steps straight with a save at step 2, then resumes from checkpoint-2 in a new Trainer. The
recorder's clock is a fake one that advances 1 s at every reading, so the figures are exact and a clock that
restarted at 0 reads less at step 3 than the straight run at step 2.
"""

import json
import logging
import shutil
import types

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainingArguments

from hf_fasttrain.callbacks import RunRecorderCallback
from hf_fasttrain.callbacks import run_record
from hf_fasttrain.callbacks.run_record import RECORD_FILE, read_saved_seconds

from conftest import make_tiny_gpt2

STEPS, SAVE_AT, BS, T = 4, 2, 4, 16


@pytest.fixture(autouse=True)
def fake_clock(monkeypatch):
    """The recorder's time.perf_counter: 1.0, 2.0, 3.0, ... (one second per reading)."""
    ticks = iter(range(1, 10**6))
    monkeypatch.setattr(run_record, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))


def tiny_model():
    return make_tiny_gpt2(64, T)


def rows(labels: bool) -> Dataset:
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(STEPS * BS):
        ids = torch.randint(1, 64, (T,), generator=g).tolist()
        out.append({"input_ids": ids, "labels": ids} if labels else {"input_ids": ids})
    return Dataset.from_list(out)


COMMON = dict(max_steps=STEPS, save_strategy="steps", save_steps=SAVE_AT, logging_steps=1,
              per_device_train_batch_size=BS, learning_rate=1e-3, report_to="none", use_cpu=True,
              disable_tqdm=True, seed=0)


def plain_trainer(output_dir, recorder):
    args = TrainingArguments(str(output_dir), **COMMON)
    return Trainer(model=tiny_model(), args=args, train_dataset=rows(labels=True), callbacks=[recorder])


def sft_trainer(output_dir, recorder):
    trl = pytest.importorskip("trl")
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(64)}  # a word-level tokenizer built offline
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0")),
                                        pad_token="t0", eos_token="t1")
    args = trl.SFTConfig(str(output_dir), max_length=T, **COMMON)
    return trl.SFTTrainer(model=tiny_model(), args=args, train_dataset=rows(labels=False),
                          processing_class=tokenizer, callbacks=[recorder])


def clock_by_step(recorder) -> dict[int, float]:
    return {r["step"]: r["train_seconds"] for r in recorder.records if "loss" in r and "train_seconds" in r}


@pytest.mark.parametrize("make", [plain_trainer, sft_trainer], ids=["Trainer", "SFTTrainer"])
@pytest.mark.slow
def test_clock_continues_across_a_resume(make, tmp_path):
    straight = RunRecorderCallback()
    make(tmp_path, straight).train()
    before = clock_by_step(straight)
    saved = read_saved_seconds(str(tmp_path / f"checkpoint-{SAVE_AT}"))
    assert saved == before[SAVE_AT] > 0  # the checkpoint holds the clock at its step

    resumed = RunRecorderCallback()
    make(tmp_path, resumed).train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{SAVE_AT}"))
    after = clock_by_step(resumed)
    assert resumed.saved_seconds == saved
    assert after[SAVE_AT + 1] >= before[SAVE_AT]  # continues, does not restart near 0
    assert after[SAVE_AT + 1] - saved == before[SAVE_AT + 1] - before[SAVE_AT]  # by one step's time
    # the records before the resume keep their clock (from the checkpoint's run record), and metrics.json too
    assert {s: after[s] for s in range(1, SAVE_AT + 1)} == {s: before[s] for s in range(1, SAVE_AT + 1)}
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["train_seconds"] == resumed.train_seconds() > after[SAVE_AT + 1]


@pytest.mark.slow
def test_checkpoint_outside_output_dir_is_read_from_resume_dir(tmp_path):
    """A plain Trainer cannot tell the callback what it resumed from: a checkpoint elsewhere is named by
    resume_dir, or by args.resume_from_checkpoint (what scripts pass to train())."""
    first = RunRecorderCallback()
    plain_trainer(tmp_path / "first", first).train()
    before = clock_by_step(first)
    checkpoint = tmp_path / "kept" / f"checkpoint-{SAVE_AT}"
    shutil.copytree(tmp_path / "first" / f"checkpoint-{SAVE_AT}", checkpoint)

    by_attribute = RunRecorderCallback(resume_dir=str(checkpoint))
    plain_trainer(tmp_path / "second", by_attribute).train(resume_from_checkpoint=str(checkpoint))
    assert clock_by_step(by_attribute)[SAVE_AT + 1] >= before[SAVE_AT]

    by_args = RunRecorderCallback()
    trainer = plain_trainer(tmp_path / "third", by_args)
    trainer.args.resume_from_checkpoint = str(checkpoint)
    trainer.train(resume_from_checkpoint=trainer.args.resume_from_checkpoint)
    assert clock_by_step(by_args)[SAVE_AT + 1] >= before[SAVE_AT]


@pytest.mark.slow
def test_without_the_record_the_clock_restarts_and_says_so(tmp_path, caplog):
    """The negative control: the same resume with the checkpoint's run_record.json removed restarts the clock
    near 0 (what the tests above rule out), with a warning naming where it looked."""
    straight = RunRecorderCallback()
    plain_trainer(tmp_path, straight).train()
    before = clock_by_step(straight)
    (tmp_path / f"checkpoint-{SAVE_AT}" / RECORD_FILE).unlink()

    resumed = RunRecorderCallback()
    with caplog.at_level(logging.WARNING, logger="hf_fasttrain.callbacks.run_record"):
        plain_trainer(tmp_path, resumed).train(resume_from_checkpoint=str(tmp_path / f"checkpoint-{SAVE_AT}"))
    after = clock_by_step(resumed)
    assert after[SAVE_AT + 1] < before[SAVE_AT]
    assert resumed.saved_seconds == 0.0
    assert any(f"resumed at step {SAVE_AT} without {RECORD_FILE}" in r.getMessage() and "resume_dir" in r.getMessage()
               for r in caplog.records)
