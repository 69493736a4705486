"""FastTrainer as a drop-in Trainer: any model, any TrainingArguments, and a neutral mode that is the Trainer.

Neutral mode (plain TrainingArguments, or run_record=False and save_on_signal=False with every other option at its
default) must give the
Trainer's callbacks, logs, checkpoints and output_dir exactly; with run_record on, a resumed run's logs equal a
straight run's except the documented wall-clock keys.
"""

import dataclasses
import logging
import json
import os
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from torch import nn
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

from hf_fasttrain import FastTrainer, FastTrainingArguments
from hf_fasttrain.config.args import FastOptions, fast_option
from hf_fasttrain.callbacks import RunRecorderCallback
from hf_fasttrain.callbacks.run_record import RECORD_FILE
from hf_fasttrain.throughput import BatchCount, ThroughputMeter, count_batch, count_tokens

from conftest import StopAt, make_tiny_gpt2, make_tiny_trainer

QUIET = dict(report_to="none", use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0)
TRAINER_WALL_CLOCK = ("train_runtime", "train_samples_per_second", "train_steps_per_second",
                      "eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


# --- counting any batch ----------------------------------------------------------------------------------
L = torch.long


@pytest.mark.parametrize("batch, expected", [
    ({"input_ids": torch.ones(2, 5, dtype=L)}, BatchCount(10, 10, 5, 0)),
    ({"input_ids": torch.ones(2, 4, dtype=L), "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])},
     BatchCount(4, 8, 4, 0)),
    ({"labels": torch.zeros(3, 6, dtype=L)}, BatchCount(18, 18, 6, 0)),  # per-token labels
    ({"attention_mask": torch.tensor([[1, 1, 0]]), "labels": torch.tensor([1])}, BatchCount(2, 3, 3, 0)),
    ({"inputs_embeds": torch.zeros(2, 7, 16), "labels": torch.tensor([0, 1])}, BatchCount(14, 14, 7, 0)),
    ({"pixel_values": torch.zeros(5, 3, 8, 8), "labels": torch.tensor([0, 1, 0, 1, 1])}, BatchCount(samples=5)),
    ({"features": torch.zeros(4, 3), "labels": torch.zeros(4)}, BatchCount(samples=4)),  # regression
    ({"x": torch.zeros(8), "labels": torch.zeros(8)}, BatchCount(samples=8)),  # one scalar feature per sample
    ({"features": torch.zeros(4, 3), "labels": torch.zeros(4, 2)}, BatchCount(samples=4)),  # multi-label floats
    ((torch.zeros(6, 2), torch.zeros(6)), BatchCount(samples=6)),  # a tuple batch
    ({"features": [1.0, 2.0]}, BatchCount()),  # no tensors: nothing counted, nothing raised
    ({}, BatchCount()),
])
def test_count_batch_any_model(batch, expected):
    assert count_batch(batch, pad_token_id=0) == expected
    assert count_tokens(batch, pad_token_id=0) == (expected.real, expected.total)


def test_meter_mixes_tokens_and_samples():
    m = ThroughputMeter(pad_token_id=0)
    m.add({"input_ids": torch.tensor([[3, 4, 0]])})
    m.add({"pixel_values": torch.zeros(2, 3, 4, 4)})
    assert m.flush() == {"real_tokens": 2, "total_tokens": 3, "padding_fraction": pytest.approx(1 / 3),
                         "seq_len": 3, "samples": 2}


# --- arguments of any class --------------------------------------------------------------------------------
@dataclass
class SFTLikeConfig(TrainingArguments):
    """Stands in for TRL's SFTConfig: a TrainingArguments subclass with fields of its own, one of them named
    like a package option with another meaning (SFTConfig.packing is a bool)."""

    max_length: int = field(default=32)
    packing: bool = field(default=True)
    dataset_text_field: str = field(default="text")


def test_fast_option_reads_defaults_from_other_classes(tmp_path):
    plain = TrainingArguments(output_dir=str(tmp_path), **QUIET)
    sft = SFTLikeConfig(output_dir=str(tmp_path), **QUIET)
    ours = FastTrainingArguments(output_dir=str(tmp_path), packing="rows", packing_row_length=16, max_steps=3,
                                 **QUIET)
    for args in (plain, sft):
        assert [fast_option(args, n) for n in ("lr_decay", "optimizer", "clip_mode", "packing", "divergence_guard",
                                               "run_record", "restart_stop_at_step")] == \
               [None, None, "norm", "none", False, False, None]
    assert fast_option(sft, "max_steps") == -1  # a Trainer field: read as is
    assert (fast_option(ours, "packing"), fast_option(ours, "run_record")) == ("rows", True)
    # the attribute view reads the same, and reading through a view of a view does not lose the class
    assert (FastOptions(ours).packing, fast_option(FastOptions(ours), "packing"), FastOptions(sft).packing) == \
           ("rows", "rows", "none")
    assert hasattr(FastOptions(plain), "guard_spike_window") and not hasattr(FastOptions(plain), "no_such_option")
    with pytest.raises(ValueError, match="'no_such_option'"):
        fast_option(plain, "no_such_option")


# --- models without input_ids ----------------------------------------------------------------------------
class RegressionHead(nn.Module):
    """y = w . x + b from `features`; returns {"loss", "logits"} like a Hugging Face model."""

    def __init__(self, n_features=4):
        super().__init__()
        torch.manual_seed(0)
        self.linear = nn.Linear(n_features, 1)

    def forward(self, features, labels=None):
        pred = self.linear(features).squeeze(-1)
        out = {"logits": pred}
        if labels is not None:
            out["loss"] = nn.functional.mse_loss(pred, labels)
        return out


def _regression_data(n=64, n_features=4):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, n_features, generator=g)
    y = x @ torch.tensor([1.5, -2.0, 0.5, 3.0]) + 1.0
    return Dataset.from_dict({"features": x.tolist(), "labels": y.tolist()}).with_format("torch")


def _train_losses(trainer):
    return [e["loss"] for e in trainer.state.log_history if "loss" in e]


@pytest.mark.parametrize("args_cls", [FastTrainingArguments, TrainingArguments, SFTLikeConfig])
def test_regression_head_trains_with_any_arguments(args_cls, tmp_path):
    model = RegressionHead()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    args = args_cls(output_dir=str(tmp_path), max_steps=24, per_device_train_batch_size=8, learning_rate=0.1,
                    logging_steps=6, save_strategy="no", **QUIET)
    trainer = FastTrainer(model=model, args=args, train_dataset=_regression_data())
    trainer.train()
    losses = _train_losses(trainer)
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    assert all(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())
    logs = [e for e in (trainer.recorder.records if trainer.recorder else trainer.state.log_history) if "loss" in e]
    if args_cls is FastTrainingArguments:  # run_record on: samples counted, no tokens, no MFU
        assert all(e["samples_per_second"] > 0 and "tokens_per_second" not in e and "mfu" not in e for e in logs)
        assert (tmp_path / "metrics.json").exists()
    else:  # the Trainer's logs and output_dir
        assert all(set(e) == {"loss", "grad_norm", "learning_rate", "epoch", "step"} for e in logs), logs[0]
        assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.slow
def test_tiny_vit_trains(tmp_path):
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    cfg = ViTConfig(image_size=8, patch_size=4, num_channels=3, hidden_size=16, num_hidden_layers=2,
                    num_attention_heads=2, intermediate_size=32, num_labels=2)
    model = ViTForImageClassification(cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(32) % 2
    pixels = torch.randn(32, 3, 8, 8, generator=g) * 0.1 + (labels.float() * 2 - 1).view(-1, 1, 1, 1)
    ds = Dataset.from_dict({"pixel_values": pixels.tolist(), "labels": labels.tolist()}).with_format("torch")
    # a peak is given, yet no MFU: the FLOPs of a sample are not known
    args = FastTrainingArguments(output_dir=str(tmp_path), max_steps=16, per_device_train_batch_size=8,
                                 learning_rate=3e-3, logging_steps=4, save_strategy="no", mfu_peak_tflops=1.0,
                                 **QUIET)
    trainer = FastTrainer(model=model, args=args, train_dataset=ds)
    trainer.train()
    losses = _train_losses(trainer)
    assert losses[-1] < losses[0] - 0.2, losses
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []
    logs = [e for e in trainer.recorder.records if "loss" in e]  # the logs as callbacks see them
    assert all(e["samples_per_second"] > 0 and "mfu" not in e and "tokens_per_second" not in e for e in logs)


class BagOfTokens(nn.Module):
    """A token model without a config: its FLOPs per token are not known, so no MFU."""

    def __init__(self, vocab=50):
        super().__init__()
        torch.manual_seed(0)
        self.emb = nn.EmbeddingBag(vocab, 1)

    def forward(self, input_ids, labels=None):
        pred = self.emb(input_ids).squeeze(-1)
        return {"loss": nn.functional.mse_loss(pred, labels.float()), "logits": pred}


def test_token_model_without_flop_count_logs_tokens_but_no_mfu(tmp_path):
    ds = Dataset.from_dict({"input_ids": [[i % 50] * 6 for i in range(32)], "labels": [i % 3 for i in range(32)]})
    args = FastTrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8,
                                 logging_steps=2, save_strategy="no", mfu_peak_tflops=1.0, **QUIET)
    recorder = RunRecorderCallback(write_files=False)
    trainer = FastTrainer(model=BagOfTokens(), args=args, train_dataset=ds.with_format("torch"), callbacks=[recorder])
    assert [c for c in trainer.callback_handler.callbacks if isinstance(c, RunRecorderCallback)] == [recorder]
    assert trainer.recorder is recorder  # the user's recorder is the run's, not doubled
    trainer.train()
    logs = [e for e in recorder.records if "loss" in e]
    assert len(logs) == 2
    assert all(e["tokens_per_second"] > 0 and e["padding_fraction"] == 0.0 and "mfu" not in e for e in logs)


def test_token_schedule_on_a_batch_without_tokens_says_so(tmp_path):
    args = FastTrainingArguments(output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=8,
                                 lr_decay="cosine", schedule_unit="tokens", schedule_total_tokens=100,
                                 save_strategy="no", **QUIET)
    trainer = FastTrainer(model=RegressionHead(), args=args, train_dataset=_regression_data())
    with pytest.raises(ValueError, match="schedule_unit='tokens'.*'features', 'labels'"):
        trainer.train()


@pytest.mark.slow
def test_fast_trainer_without_args_is_trainer_without_args(tiny_tokenizer, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # Trainer(model) writes into ./tmp_trainer
    ds = Dataset.from_dict({"input_ids": [[5 + i % 7] * 8 for i in range(16)]})
    plain = Trainer(make_tiny_gpt2(len(tiny_tokenizer), n_positions=8))
    fast = FastTrainer(make_tiny_gpt2(len(tiny_tokenizer), n_positions=8), train_dataset=ds,
                       data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False))
    assert type(fast.args) is TrainingArguments and fast.args.output_dir == plain.args.output_dir
    assert [type(c) for c in fast.callback_handler.callbacks] == [type(c) for c in plain.callback_handler.callbacks]
    fast.train()  # defaults: 3 epochs of 2 batches
    assert fast.state.global_step == 6
    assert sorted(os.listdir(tmp_path / plain.args.output_dir)) == ["checkpoint-6"]


# --- neutral mode == Trainer --------------------------------------------------------------------------
def _gpt2_trainer(cls, args, tok, lm, **kw):
    return make_tiny_trainer(tok, lm, args, cls=cls, eval_dataset=lm["validation"].select(range(16)), **kw)


def _neutral_args(cls, out, **kw):
    base = dict(output_dir=str(out), max_steps=6, per_device_train_batch_size=4, per_device_eval_batch_size=8,
                learning_rate=3e-3, logging_steps=2, save_strategy="steps", save_steps=3, eval_strategy="steps",
                eval_steps=3, **QUIET)
    if cls is FastTrainingArguments:
        base["run_record"] = False
        base["save_on_signal"] = False
    base.update(kw)
    return cls(**base)


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _without(entries, keys):
    return [{k: v for k, v in e.items() if k not in keys} for e in entries]


def _state(path: Path) -> dict:
    return json.loads((path / "trainer_state.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("args_cls", [TrainingArguments, FastTrainingArguments, SFTLikeConfig])
def test_neutral_mode_is_the_trainer(args_cls, tiny_lm, tiny_tokenizer, tmp_path):
    ref = _gpt2_trainer(Trainer, _neutral_args(TrainingArguments, tmp_path / "ref"), tiny_tokenizer, tiny_lm)
    fast = _gpt2_trainer(FastTrainer, _neutral_args(args_cls, tmp_path / "fast"), tiny_tokenizer, tiny_lm)
    assert [type(c) for c in fast.callback_handler.callbacks] == [type(c) for c in ref.callback_handler.callbacks]
    ref.train()
    fast.train()
    # same logs (values too: same seeds, CPU), apart from the Trainer's own wall-clock
    assert _without(fast.state.log_history, TRAINER_WALL_CLOCK) == _without(ref.state.log_history, TRAINER_WALL_CLOCK)
    assert any("eval_loss" in e for e in fast.state.log_history)
    # same output_dir and checkpoint files; same checkpointed state
    assert _files(tmp_path / "fast") == _files(tmp_path / "ref")
    for step in (3, 6):
        a, b = _state(tmp_path / "fast" / f"checkpoint-{step}"), _state(tmp_path / "ref" / f"checkpoint-{step}")
        a["log_history"] = _without(a["log_history"], TRAINER_WALL_CLOCK)
        b["log_history"] = _without(b["log_history"], TRAINER_WALL_CLOCK)
        assert {k: v for k, v in a.items() if k != "best_model_checkpoint"} == \
               {k: v for k, v in b.items() if k != "best_model_checkpoint"}


@pytest.mark.slow
@pytest.mark.parametrize("run_record", [False, True])
def test_resumed_logs_equal_straight_logs(run_record, tiny_lm, tiny_tokenizer, tmp_path):
    def args(out):
        return _neutral_args(FastTrainingArguments, out, run_record=run_record, logging_steps=1)

    straight = _gpt2_trainer(FastTrainer, args(tmp_path / "a"), tiny_tokenizer, tiny_lm)
    straight.train()
    first = _gpt2_trainer(FastTrainer, args(tmp_path / "b"), tiny_tokenizer, tiny_lm, callbacks=[StopAt(3)])
    first.train()
    resumed = _gpt2_trainer(FastTrainer, args(tmp_path / "b"), tiny_tokenizer, tiny_lm)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-3"))
    skip = TRAINER_WALL_CLOCK + ("train_loss",)  # the Trainer's train_loss averages over this train() call only
    if run_record:  # no wall-clock key to skip: the history holds none
        assert not any("train_seconds" in e for e in resumed.state.log_history)  # the run record has it
        assert all("train_seconds" in e for e in resumed.recorder.records)
    a, b = _without(straight.state.log_history, skip), _without(resumed.state.log_history, skip)
    assert [e["step"] for e in b] == [e["step"] for e in a] and len(a) >= 8
    assert b == a
    # the whole TrainerState, as transformers' own resume tests compare it (log_history apart, as they do)
    sa, sb = dataclasses.asdict(straight.state), dataclasses.asdict(resumed.state)
    sa.pop("log_history"), sb.pop("log_history")
    assert sa == sb
    # and the checkpointed one: nothing wall-clock in it but the Trainer's own *_runtime keys
    sa, sb = _state(tmp_path / "a" / "checkpoint-6"), _state(tmp_path / "b" / "checkpoint-6")
    for st in (sa, sb):
        st["log_history"] = _without(st["log_history"], skip)
    assert sa == sb
    # negative control: the run moved between the two checkpoints
    assert a[0]["loss"] != [e for e in a if "loss" in e][-1]["loss"]


# --- the recorder's clock across a resume, in a plain Trainer ------------------------
def _fake_clock(monkeypatch):
    from hf_fasttrain.callbacks import run_record

    ticks = iter(range(1, 10**6))
    monkeypatch.setattr(run_record, "time", types.SimpleNamespace(perf_counter=lambda: float(next(ticks))))


@pytest.mark.slow
def test_recorder_clock_continues_across_resume_in_a_plain_trainer(tiny_lm, tiny_tokenizer, tmp_path, monkeypatch):
    _fake_clock(monkeypatch)  # one second per reading: a clock that restarted would be far behind

    def trainer(callbacks):
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=4,
                                 logging_steps=1, save_strategy="steps", save_steps=3, **QUIET)
        return _gpt2_trainer(Trainer, args, tiny_tokenizer, tiny_lm, callbacks=callbacks)

    first = trainer([RunRecorderCallback(write_files=False), StopAt(3)])
    first.train()
    saved = _state(tmp_path / "checkpoint-3")
    assert "RunRecorderCallback" not in saved["stateful_callbacks"]  # the TrainerState holds no wall clock
    record = json.loads((tmp_path / "checkpoint-3" / RECORD_FILE).read_text())
    clock = record["train_seconds"]
    assert not any("train_seconds" in e for e in saved["log_history"])
    before = [c["train_seconds"] for c in record["wall_clock"]]  # the clock of each log, in the run record
    assert len(before) == 3 and before == sorted(before) and 0 < before[-1] <= clock

    recorder = RunRecorderCallback(write_files=False)
    resumed = trainer([recorder])
    resumed.train(resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    after = [e["train_seconds"] for e in recorder.records if "loss" in e]
    assert after[:3] == before  # restored records keep their clock
    assert clock < after[3] < after[4] < after[5]  # continues from the checkpoint's clock, not from 0
    assert [r["step"] for r in recorder.records] == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_recorder_added_on_resume_of_a_checkpoint_without_it(tiny_lm, tiny_tokenizer, tmp_path):
    def trainer(callbacks):
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                 logging_steps=1, save_strategy="steps", save_steps=1, **QUIET)
        return _gpt2_trainer(Trainer, args, tiny_tokenizer, tiny_lm, callbacks=callbacks)

    trainer([StopAt(1)]).train()
    assert "RunRecorderCallback" not in _state(tmp_path / "checkpoint-1")["stateful_callbacks"]
    trainer([RunRecorderCallback(write_files=False)]).train(resume_from_checkpoint=str(tmp_path / "checkpoint-1"))
    assert json.loads((tmp_path / "checkpoint-2" / RECORD_FILE).read_text())["train_seconds"] > 0


@pytest.mark.slow
def test_recorder_restarts_the_clock_of_a_checkpoint_without_a_run_record(tiny_lm, tiny_tokenizer, tmp_path,
                                                                          monkeypatch, caplog):
    """A checkpoint without run_record.json (written by 0.1.0, which kept the clock in trainer_state.json, or
    without the recorder): the clock restarts at 0 and the log says so; the old entry is not read."""
    _fake_clock(monkeypatch)

    def trainer(callbacks):
        args = TrainingArguments(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4,
                                 logging_steps=1, save_strategy="steps", save_steps=1, **QUIET)
        return _gpt2_trainer(Trainer, args, tiny_tokenizer, tiny_lm, callbacks=callbacks)

    trainer([RunRecorderCallback(write_files=False), StopAt(1)]).train()
    ckpt = tmp_path / "checkpoint-1"
    (ckpt / RECORD_FILE).unlink()
    state = _state(ckpt)
    state["stateful_callbacks"]["RunRecorderCallback"] = {"args": {}, "attributes": {"saved_seconds": 1000.0}}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    recorder = RunRecorderCallback(write_files=False)
    with caplog.at_level("WARNING", logger="hf_fasttrain.callbacks.run_record"):
        trainer([recorder]).train(resume_from_checkpoint=str(ckpt))
    assert recorder.saved_seconds == 0.0
    assert 0 < json.loads((tmp_path / "checkpoint-2" / RECORD_FILE).read_text())["train_seconds"] < 1000.0
    assert "the training clock restarts at 0" in caplog.text


@pytest.mark.slow
def test_stability_mixin_with_plain_arguments(tiny_lm, tiny_tokenizer, tmp_path):
    from hf_fasttrain.callbacks import GradientClippingCallback, StabilityTrainerMixin

    class MixedTrainer(StabilityTrainerMixin, Trainer):
        pass

    args = SFTLikeConfig(output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=4, logging_steps=1,
                         max_grad_norm=0.0, save_strategy="no", **QUIET)
    trainer = _gpt2_trainer(MixedTrainer, args, tiny_tokenizer, tiny_lm,
                            callbacks=[GradientClippingCallback(mode="value", clip_value=0.01)])
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert len(logs) == 2 and all("clip_fraction" in e for e in logs)


def test_data_holds_no_trainer_wiring():
    """data/ is a core: no import of callbacks, args, the wiring or the trainer, not even inside a function. The
    modules above it that it may import are the leaves validation (ConfigError, the one-line refusal) and
    _version (written into a pre-tokenized folder's manifest), which import nothing of the package."""
    import ast

    import hf_fasttrain.data as data
    from hf_fasttrain.callbacks import apply_batch_sampler, batch_sampler_dataloader  # noqa: F401 (moved here)
    from hf_fasttrain.wiring import SeqLenWiring  # noqa: F401 (moved here)

    for path in Path(data.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2 and node.module not in ("validation", "_version"):
                assert False, f"{path.name} imports {'.' * node.level}{node.module} from above data/"
    assert not hasattr(data, "batch_sampler_dataloader")


# --- a second train() into the same output_dir: what the Trainer does -------------------------------------------
def _train_twice(cls, args_cls, out, tok, lm, **kw):
    """Two trainers, one after the other, into the same output_dir (transformers' own tests do this): the second
    finds the first one's checkpoints there. Returns both, trained."""
    runs = []
    for _ in range(2):
        base = dict(output_dir=str(out), max_steps=6, per_device_train_batch_size=4, learning_rate=3e-3,
                    logging_steps=2, save_strategy="steps", save_steps=3, **QUIET)
        base.update(kw)
        trainer = _gpt2_trainer(cls, args_cls(**base), tok, lm)
        trainer.train()
        runs.append(trainer)
    return runs


def _losses(trainer):
    return [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]


@pytest.mark.slow
def test_a_second_train_into_a_used_output_dir_starts_fresh_as_the_trainer_does(tiny_lm, tiny_tokenizer, tmp_path):
    ref = _train_twice(Trainer, TrainingArguments, tmp_path / "ref", tiny_tokenizer, tiny_lm)
    # the second differs from the first where a resume would refuse it (transformers' tests change lr and length)
    fast = _train_twice(FastTrainer, FastTrainingArguments, tmp_path / "fast", tiny_tokenizer, tiny_lm)
    assert [t.state.global_step for t in fast] == [t.state.global_step for t in ref] == [6, 6]
    assert _losses(fast[1]) == _losses(ref[1]) == _losses(ref[0])  # a fresh run: the first's losses again
    assert len(_losses(fast[1])) == 3 and _losses(fast[1])[0][1] > _losses(fast[1])[-1][1]
    # with another lr the second run trains (the Trainer does), not a RunOptionsChanged refusal
    out = tmp_path / "other"
    _gpt2_trainer(FastTrainer, FastTrainingArguments(output_dir=str(out), max_steps=3, save_steps=3,
                                                     learning_rate=3e-3, **QUIET), tiny_tokenizer, tiny_lm).train()
    second = _gpt2_trainer(FastTrainer, FastTrainingArguments(output_dir=str(out), max_steps=4, learning_rate=0.1,
                                                              **QUIET), tiny_tokenizer, tiny_lm)
    assert second.train().global_step == 4


@pytest.mark.slow
def test_running_training_is_logged_by_every_train_as_the_trainer_does(tiny_lm, tiny_tokenizer, tmp_path):
    from transformers.testing_utils import CaptureLogger, LoggingLevel
    from transformers.utils import logging as hf_logging

    said = {}
    for name, cls, args_cls in (("trainer", Trainer, TrainingArguments),
                                ("fast", FastTrainer, FastTrainingArguments)):
        with LoggingLevel(logging.INFO), CaptureLogger(hf_logging.get_logger()) as cl:
            _train_twice(cls, args_cls, tmp_path / name, tiny_tokenizer, tiny_lm, max_steps=3, log_level="debug")
        said[name] = cl.out.count("***** Running training *****")
    assert said == {"trainer": 2, "fast": 2}


@pytest.mark.slow
def test_auto_resume_true_in_a_script_resumes_and_says_so_in_one_line(tiny_lm, tiny_tokenizer, tmp_path, capfd):
    out = tmp_path / "run"
    kw = dict(output_dir=str(out), max_steps=6, per_device_train_batch_size=4, learning_rate=3e-3, logging_steps=1,
              save_strategy="steps", save_steps=3, lr_scheduler_type="constant", auto_resume=True, **QUIET)
    _gpt2_trainer(FastTrainer, FastTrainingArguments(**kw), tiny_tokenizer, tiny_lm, callbacks=[StopAt(3)]).train()
    capfd.readouterr()
    steps = _StepsTaken()
    again = _gpt2_trainer(FastTrainer, FastTrainingArguments(**kw), tiny_tokenizer, tiny_lm, callbacks=[steps])
    again.train()  # no logging set up in this process: the line is printed, not logged
    lines = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[hf_fasttrain]")]
    assert lines == [f"[hf_fasttrain] resuming run from {out / 'checkpoint-3'}"]
    assert steps.taken == [4, 5, 6]  # it continued: steps 1-3 are the checkpoint's


class _StepsTaken(TrainerCallback):
    def __init__(self):
        self.taken = []

    def on_step_end(self, args, state, control, **kwargs):
        self.taken.append(state.global_step)


def test_gpt2_lm_head_model_gets_its_loss_named_and_the_same_loss(tmp_path, caplog):
    """GPT2LMHeadModel's class name names no loss, so transformers warns `loss_type=None` and uses ForCausalLM's;
    FastTrainer names that loss: the warning is gone, the loss is the Trainer's to the last bit."""
    from transformers.utils import logging as hf_logging

    batch = {"input_ids": torch.arange(32).reshape(2, 16) % 64}
    batch["labels"] = batch["input_ids"].clone()
    model, plain = make_tiny_gpt2(), make_tiny_gpt2()
    FastTrainer(model=model, args=TrainingArguments(str(tmp_path), **QUIET))
    assert (model.loss_type, plain.loss_type) == ("ForCausalLM", None)

    def warned(m):
        logging.Logger.warning_once.cache_clear()  # transformers warns once per process
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            loss = m(**batch).loss
        return loss, [r for r in caplog.records if "loss_type=None" in r.getMessage()]

    hf_logging.enable_propagation()
    try:
        (got, fast_warnings), (expected, plain_warnings) = warned(model), warned(plain)
    finally:
        hf_logging.disable_propagation()
    assert torch.equal(got, expected)
    assert fast_warnings == [] and len(plain_warnings) == 1
