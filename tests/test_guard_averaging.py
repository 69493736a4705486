"""The divergence guard and a weight average in one Trainer, on full models and on LoRA adapters.

The fault: the update of step 6 leaves inf in one trainable weight. The weight average folds it in at that
step's ``on_step_end``; the guard sees the non-finite loss at step 7 and rolls back to step 4. The average
must come back with the weights (memory snapshots and checkpoints alike), and the model saved at the end
(the average) must be finite. Also here: every copy of the model (average, snapshot, checkpoint size)
counts the trainable parameters only.
"""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import safetensors.torch
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from hf_fasttrain.stability.averaging import ema_update_
from hf_fasttrain.callbacks import DivergenceGuardCallback, StabilityTrainerMixin, WeightAveragingCallback
from hf_fasttrain.stability.snapshots import checkpoint_bytes, load_checkpoint_state, take_snapshot
from hf_fasttrain.stability.trainables import trainable_bytes, trainable_parameters

from conftest import make_tiny_gpt2

peft = pytest.importorskip("peft")

V, T, BS, STEPS, BAD, GOOD = 64, 16, 8, 10, 6, 4
DECAY = 0.8


@pytest.fixture(autouse=True)
def _one_thread_quiet():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    yield
    torch.set_num_threads(n)
    hf_logging.set_verbosity(verbosity)


def tiny_model(lora: bool, width: int = 32):
    model = make_tiny_gpt2(V, T, n_embd=width)
    if lora:
        config = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn", "c_fc"], fan_in_fan_out=True,
                                 lora_dropout=0.0)
        model = peft.get_peft_model(model, config)
        with torch.no_grad():  # LoRA's B starts at zero: move it so the adapters matter from step 1
            for n, p in trainable_parameters(model).items():
                if "lora_B" in n:
                    p.normal_(0, 0.02)
    return model


def rows(n=STEPS * BS, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = (torch.randint(0, V, (n, 1), generator=g) + torch.randint(1, 4, (n, 1), generator=g) * torch.arange(T)) % V
    return [{"input_ids": r, "labels": r.clone()} for r in ids]


class GuardedTrainer(StabilityTrainerMixin, Trainer):
    pass


class Corrupt(TrainerCallback):
    """inf in the first trainable matrix after the update of step ``BAD``."""

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == BAD:
            name, p = next((n, p) for n, p in trainable_parameters(model).items() if p.dim() == 2)
            with torch.no_grad():
                p[0, 0] = float("inf")


class AverageRecorder(TrainerCallback):
    """The average and the weights after each step's ``on_step_end`` (added after the averaging callback)."""

    def __init__(self, averaging):
        self.averaging, self.average, self.weights = averaging, {}, {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        self.average[state.global_step] = {n: t.clone() for n, t in self.averaging.average.average().items()}
        self.weights[state.global_step] = {n: p.detach().clone() for n, p in trainable_parameters(model).items()}


def run(tmp_path, lora, mode, rollback):
    model = tiny_model(lora)
    averaging = WeightAveragingCallback(mode=mode, decay=DECAY, warmup=False, lawa_k=3, lawa_interval=2,
                                        swap_for_eval=False)
    guard = DivergenceGuardCallback(snapshot_every=GOOD, rollback=rollback)
    recorder = AverageRecorder(averaging)
    args = TrainingArguments(str(tmp_path), max_steps=STEPS, per_device_train_batch_size=BS, learning_rate=1e-2,
                             max_grad_norm=0.0, logging_steps=1, save_strategy="steps", save_steps=GOOD,
                             report_to="none", use_cpu=True, train_sampling_strategy="sequential", disable_tqdm=True,
                             seed=0)
    trainer = GuardedTrainer(model=model, args=args, train_dataset=rows(),
                             callbacks=[Corrupt(), guard, averaging, recorder])
    trainer.train()
    return trainer, guard, averaging, recorder


def all_finite(tensors):
    return all(bool(torch.isfinite(t).all()) for t in tensors)


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("mode", ["ema", "lawa"])
@pytest.mark.parametrize("rollback", ["memory", "checkpoint"])
def test_a_rollback_takes_the_average_back_and_the_saved_model_is_finite(tmp_path, lora, mode, rollback):
    trainer, guard, averaging, rec = run(tmp_path, lora, mode, rollback)
    assert [(e["step"], e["kind"]) for e in guard.events] == [(BAD + 1, "rollback")]
    assert f"restored step {GOOD}" in guard.events[0]["reason"]
    # the fault reached the average (LAWA copies every 2nd step: step 6 is one)
    assert not all_finite(rec.average[BAD].values())
    # after the rollback at step 7, the average is the one of step 4 (with step 7's restored weights folded in)
    after = rec.average[BAD + 1]
    if mode == "ema":
        expected = [t.clone() for t in rec.average[GOOD].values()]
        ema_update_(expected, [rec.weights[GOOD][n] for n in rec.average[GOOD]], DECAY)
        for (n, got), want in zip(after.items(), expected):
            torch.testing.assert_close(got, want, msg=n)
    else:  # step 7 adds no copy: the window of step 4 (copies of steps 2 and 4)
        for n, got in after.items():
            torch.testing.assert_close(got, rec.average[GOOD][n], msg=n)
    assert all(all_finite(rec.average[s].values()) for s in range(BAD + 1, STEPS + 1))
    # the model saved at the end is the average, and finite
    trainer.save_model(str(tmp_path / "final"))
    name = "adapter_model.safetensors" if lora else "model.safetensors"
    saved = safetensors.torch.load_file(str(tmp_path / "final" / name))
    assert saved and all_finite(saved.values())
    final = trainable_parameters(trainer.model)
    for n, t in rec.average[STEPS].items():
        torch.testing.assert_close(final[n].detach(), t.to(final[n].dtype), msg=n)


@pytest.mark.parametrize("mode", ["ema", "lawa"])
def test_without_a_guard_a_non_finite_average_is_not_shipped(tmp_path, mode, caplog):
    model = tiny_model(False)
    averaging = WeightAveragingCallback(mode=mode, decay=DECAY, warmup=False, lawa_k=3, lawa_interval=2,
                                        swap_for_eval=False)
    args = TrainingArguments(str(tmp_path), max_steps=BAD, per_device_train_batch_size=BS, learning_rate=1e-2,
                             max_grad_norm=0.0, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows(), callbacks=[Corrupt(), averaging])
    before = None

    class Last(TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kwargs):
            nonlocal before
            before = {n: p.detach().clone() for n, p in model.named_parameters()}

    trainer.add_callback(Last())
    with caplog.at_level("ERROR"):
        trainer.train()
    assert not averaging.average.finite()
    assert "keeps its last weights instead of the average" in caplog.text
    for n, p in trainer.model.named_parameters():  # the iterate, not the average
        assert torch.equal(p.detach(), before[n]) or not bool(torch.isfinite(p).all())


def test_average_snapshot_and_checkpoint_size_count_only_what_trains(tmp_path):
    model = tiny_model(True)
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    assert frozen > 10 * trainable_bytes(model)  # the base dominates
    averaging = WeightAveragingCallback(mode="ema")
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=BS, save_strategy="no",
                             report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows(2 * BS), callbacks=[averaging])
    trainer.train()
    assert averaging.average.nbytes() == trainable_bytes(model)  # fp32 adapters: the same bytes
    assert set(averaging.average.names) == set(trainable_parameters(model))
    snap = take_snapshot(model, trainer.optimizer, trainer.lr_scheduler, 2)
    buffers = dict(model.named_buffers())
    param_bytes = sum(t.numel() * t.element_size() for n, t in snap.model.items() if n not in buffers)
    assert param_bytes == trainable_bytes(model)
    state_bytes = sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values()
                      if torch.is_tensor(t) and t.dim() > 0)
    state_bytes += sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values()
                       if torch.is_tensor(t) and t.dim() == 0)
    assert checkpoint_bytes(model, trainer.optimizer) == int((trainable_bytes(model) + state_bytes) * 1.05) + 2**20


def test_the_free_space_check_passes_where_the_adapter_checkpoint_fits(tmp_path, monkeypatch):
    """Plain TrainingArguments in the mixin's Trainer: the check asks for the adapter's size, not the base's."""
    import shutil
    from collections import namedtuple

    model = tiny_model(True, width=256)  # a base of 6 MiB, adapters of 0.1 MiB
    full = checkpoint_bytes(model.get_base_model())
    Usage = namedtuple("Usage", "total used free")
    free = 2**20 + 4 * trainable_bytes(model) + 200_000  # fits the adapter checkpoint, not the whole model
    assert free < full / 2
    real = shutil.disk_usage
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(10 * full, 0, free) if str(tmp_path) in str(p) else real(p))
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=BS, save_strategy="steps",
                             save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True)
    GuardedTrainer(model=model, args=args, train_dataset=rows(2 * BS)).train()
    assert (tmp_path / "checkpoint-2" / "adapter_model.safetensors").is_file()


def test_load_checkpoint_state_restores_an_adapter_checkpoint_in_place(tmp_path):
    model = tiny_model(True)
    args = TrainingArguments(str(tmp_path), max_steps=2, per_device_train_batch_size=BS, save_strategy="steps",
                             save_steps=2, report_to="none", use_cpu=True, disable_tqdm=True)
    trainer = Trainer(model=model, args=args, train_dataset=rows(2 * BS))
    trainer.train()
    saved = {n: p.detach().clone() for n, p in trainable_parameters(model).items()}
    opt_state = {k: v["exp_avg"].clone() for k, v in trainer.optimizer.state.items()}
    ids = {n: id(p) for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in trainable_parameters(model).values():
            p.fill_(float("nan"))
    for v in trainer.optimizer.state.values():
        v["exp_avg"].zero_()
    load_checkpoint_state(str(tmp_path / "checkpoint-2"), model, trainer.optimizer, trainer.lr_scheduler)
    for n, p in trainable_parameters(model).items():
        assert torch.equal(p.detach(), saved[n]), n
    assert {n: id(p) for n, p in model.named_parameters()} == ids  # in place: the optimizer still owns them
    for k, v in trainer.optimizer.state.items():
        assert torch.equal(v["exp_avg"], opt_state[k])


def test_trl_sft_trainer_with_a_peft_config_recovers_and_saves_a_finite_adapter(tmp_path, tiny_tokenizer):
    """TRL's SFTTrainer wraps the model in LoRA itself (peft_config=...); the package's callbacks do the rest."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    g = torch.Generator().manual_seed(0)
    data = Dataset.from_list([{"input_ids": torch.randint(3, len(tiny_tokenizer), (T,), generator=g).tolist()}
                              for _ in range(STEPS * BS)])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tiny_tokenizer), n_positions=T, n_embd=32, n_layer=2, n_head=2))
    lora = peft.LoraConfig(r=4, lora_alpha=8, target_modules=["c_attn"], fan_in_fan_out=True, task_type="CAUSAL_LM")
    averaging = WeightAveragingCallback(mode="ema", decay=DECAY, swap_for_eval=False)
    guard = DivergenceGuardCallback(snapshot_every=GOOD, rollback="memory")
    args = trl.SFTConfig(str(tmp_path), max_steps=STEPS, per_device_train_batch_size=BS, learning_rate=1e-2,
                         logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                         max_length=T, gradient_checkpointing=False, seed=0)
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data, processing_class=tiny_tokenizer,
                             peft_config=lora, callbacks=[Corrupt(), guard, averaging])
    trainer.train()
    assert [e["kind"] for e in guard.events] == ["rollback"]
    assert set(averaging.average.names) == set(trainable_parameters(trainer.model))
    assert all(".lora_" in n for n in averaging.average.names)
    trainer.save_model(str(tmp_path / "final"))
    saved = safetensors.torch.load_file(str(tmp_path / "final" / "adapter_model.safetensors"))
    assert saved and all_finite(saved.values())


@pytest.mark.parametrize("rollback", ["memory", "checkpoint"])
def test_fasttrainer_lora_with_muon_guard_and_ema_recovers_and_saves_a_finite_adapter(tmp_path, rollback):
    from hf_fasttrain import FastTrainer, FastTrainingArguments

    model = tiny_model(True)
    args = FastTrainingArguments(str(tmp_path), max_steps=STEPS, per_device_train_batch_size=BS, learning_rate=1e-2,
                                 optimizer="muon", divergence_guard=True, guard_snapshot_every=GOOD,
                                 guard_rollback=rollback, weight_averaging="ema", ema_decay=DECAY,
                                 save_strategy="steps", save_steps=GOOD, logging_steps=1, report_to="none",
                                 use_cpu=True, train_sampling_strategy="sequential", disable_tqdm=True, seed=0,
                                 auto_resume=False)
    trainer = FastTrainer(model=model, args=args, train_dataset=rows(), callbacks=[Corrupt()])
    trainer.recorder.write_files = False
    trainer.train()
    guard = next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, DivergenceGuardCallback))
    assert [(e["step"], e["kind"]) for e in guard.events] == [(BAD + 1, "rollback")]
    assert any(g["use_muon"] for g in trainer.optimizer.param_groups)  # Muon trained the adapters
    trainer.save_model(str(tmp_path / "final"))
    saved = safetensors.torch.load_file(str(tmp_path / "final" / "adapter_model.safetensors"))
    assert saved and all_finite(saved.values())
    assert (tmp_path / f"checkpoint-{STEPS}" / "weight_average.pt").is_file()
