"""`optimizer_cls_and_kwargs_for` takes lr, weight decay and the run length from the Trainer's args,
or refuses; it never falls back to an optimizer's own defaults silently."""

from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import Trainer, TrainerCallback, TrainingArguments

from conftest import make_tiny_gpt2
from hf_fasttrain.optim import OptimizerFactory, optimizer_cls_and_kwargs_for


def _args(tmp_path, **kw):
    base = dict(output_dir=str(tmp_path), report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
                disable_tqdm=True, per_device_train_batch_size=4)
    base.update(kw)
    return TrainingArguments(**base)


@pytest.mark.parametrize("name", ["adamw", "lion", "ademamix", "soap", "muon"])
def test_without_args_lr_and_weight_decay_are_required(name):
    message = rf"optimizer_cls_and_kwargs_for\('{name}'\): lr, weight_decay.* not set.*args="
    with pytest.raises(ValueError, match=message):
        optimizer_cls_and_kwargs_for(name)
    with pytest.raises(ValueError, match="weight_decay"):
        optimizer_cls_and_kwargs_for(name, lr=1e-3)  # weight decay would silently be the paper's


def test_ademamix_without_args_needs_its_warmup_length_or_an_explicit_none():
    with pytest.raises(ValueError, match="T_alpha_beta3 not set"):
        optimizer_cls_and_kwargs_for("ademamix", lr=1e-3, weight_decay=0.1)
    assert optimizer_cls_and_kwargs_for("ademamix", lr=1e-3, weight_decay=0.1, T_alpha_beta3=None)[1] == {
        "lr": 1e-3, "weight_decay": 0.1, "T_alpha_beta3": None}


def test_values_come_from_the_training_args(tmp_path):
    args = _args(tmp_path, learning_rate=5e-4, weight_decay=0.05, max_steps=300, adam_beta2=0.95, adam_epsilon=1e-6)
    factory, kwargs = optimizer_cls_and_kwargs_for("lion", args)
    assert isinstance(factory, OptimizerFactory) and factory.name == "lion"
    assert kwargs == {"lr": 5e-4, "weight_decay": 0.05}
    assert optimizer_cls_and_kwargs_for("adamw", args)[1] == {
        "lr": 5e-4, "weight_decay": 0.05, "betas": (0.9, 0.95), "eps": 1e-6}
    # AdEMAMix: Adam's two betas and eps from the args (set away from the defaults), its own beta3
    assert optimizer_cls_and_kwargs_for("ademamix", args)[1] == {"lr": 5e-4, "weight_decay": 0.05, "T_alpha_beta3": 300,
                                                                 "betas": (0.9, 0.95, 0.9999), "eps": 1e-6}
    # explicit kwargs win
    assert optimizer_cls_and_kwargs_for("lion", args, lr=1e-4)[1] == {"lr": 1e-4, "weight_decay": 0.05}


def test_ademamix_by_epochs_refuses_without_a_run_length(tmp_path):
    args = _args(tmp_path, num_train_epochs=2)  # max_steps -1: the length is not known to the factory
    with pytest.raises(ValueError, match=r"needs the run length, and args.max_steps is -1; set max_steps"):
        optimizer_cls_and_kwargs_for("ademamix", args)
    assert optimizer_cls_and_kwargs_for("ademamix", args, T_alpha_beta3=1000)[1]["T_alpha_beta3"] == 1000


def test_sharding_in_args_is_refused_up_front():
    args = SimpleNamespace(learning_rate=1e-3, weight_decay=0.1, max_steps=10, deepspeed="ds_zero2.json")
    with pytest.raises(ValueError, match="'muon' does not work under DeepSpeed ZeRO"):
        optimizer_cls_and_kwargs_for("muon", args)
    assert optimizer_cls_and_kwargs_for("lion", args)[1] == {"lr": 1e-3, "weight_decay": 0.1}
    fsdp = SimpleNamespace(learning_rate=1e-3, weight_decay=0.1, fsdp=["full_shard"], fsdp_config={"version": 2})
    with pytest.raises(ValueError, match="'soap' does not work under FSDP2"):
        optimizer_cls_and_kwargs_for("soap", fsdp)


def test_plain_trainer_trains_at_its_own_lr_and_ademamix_warms_up(tmp_path):
    class Record(TrainerCallback):
        def __init__(self):
            self.groups = []

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            self.groups.append([(g["lr"], g["weight_decay"], g.get("T_alpha_beta3")) for g in optimizer.param_groups])

    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, 64, (16, 16), generator=gen).tolist()
    data = Dataset.from_dict({"input_ids": rows, "labels": rows})
    args = _args(tmp_path, learning_rate=5e-4, weight_decay=0.02, max_steps=3, lr_scheduler_type="constant")
    record = Record()
    trainer = Trainer(make_tiny_gpt2(64, 16), args, train_dataset=data, callbacks=[record],
                      optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for("ademamix", args))
    trainer.train()
    # the SFTConfig-style lr 5e-4 and weight decay 0.02, not AdEMAMix's 1e-3 / 0.1; warmup over the 3 steps
    assert record.groups[-1] == [(5e-4, 0.02, 3), (5e-4, 0.0, 3)]
