"""Optimizers under sharding: every optimizer gives the single-process update under FSDP2 (2 CPU
processes over gloo, one spawn for all of them), or is refused before training with one line."""

import json
import socket
from types import SimpleNamespace

import pytest
from torch import nn

from hf_fasttrain.optim import (
    OPTIMIZERS,
    muon_communication_bytes,
    check_optimizer_options,
    check_sharding_support,
    create_optimizer,
    detect_sharding,
    sharding_support,
)

# --- detection from args / accelerator / environment / model (deepspeed itself is not installed) ----


@pytest.mark.parametrize(
    "kw, expected",
    [
        ({}, "single"),
        ({"environ": {"WORLD_SIZE": "4"}}, "ddp"),
        ({"accelerator": SimpleNamespace(num_processes=2, state=SimpleNamespace())}, "ddp"),
        ({"args": SimpleNamespace(deepspeed="ds_config_zero2.json")}, "deepspeed"),
        ({"args": SimpleNamespace(deepspeed={"zero_optimization": {"stage": 3}})}, "deepspeed"),
        ({"accelerator": SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=object()))}, "deepspeed"),
        ({"environ": {"ACCELERATE_USE_DEEPSPEED": "true", "WORLD_SIZE": "8"}}, "deepspeed"),
        ({"args": SimpleNamespace(fsdp=["full_shard", "auto_wrap"], fsdp_config={"version": 2})}, "fsdp2"),
        ({"args": SimpleNamespace(fsdp=["full_shard"], fsdp_config={})}, "fsdp2"),  # transformers' default
        ({"args": SimpleNamespace(fsdp=["full_shard"], fsdp_config={"version": 1})}, "fsdp1"),
        ({"args": SimpleNamespace(fsdp=[], fsdp_config=None), "environ": {"WORLD_SIZE": "2"}}, "ddp"),
        ({"accelerator": SimpleNamespace(state=SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=2)))},
         "fsdp2"),
        ({"accelerator": SimpleNamespace(state=SimpleNamespace(fsdp_plugin=SimpleNamespace(fsdp_version=1)))},
         "fsdp1"),
        ({"environ": {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}}, "fsdp2"),
        ({"environ": {"ACCELERATE_USE_FSDP": "true"}}, "fsdp1"),  # accelerate's default version
        # on CPU accelerate ignores FSDP / DeepSpeed configs and runs plain data parallel (MULTI_CPU)
        ({"environ": {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "ACCELERATE_USE_CPU": "true",
                      "WORLD_SIZE": "2"}}, "ddp"),
        ({"environ": {"ACCELERATE_USE_DEEPSPEED": "true", "ACCELERATE_USE_CPU": "true"}}, "single"),
        ({"accelerator": SimpleNamespace(num_processes=2, state=SimpleNamespace(
            distributed_type="DistributedType.MULTI_CPU", fsdp_plugin=None)),
          "environ": {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}}, "ddp"),
        ({"accelerator": SimpleNamespace(num_processes=2, state=SimpleNamespace(
            distributed_type="FSDP", fsdp_plugin=SimpleNamespace(fsdp_version=2)))}, "fsdp2"),
        ({"accelerator": SimpleNamespace(num_processes=8, state=SimpleNamespace(
            distributed_type="DEEPSPEED", deepspeed_plugin=object()))}, "deepspeed"),
    ],
)
def test_detect_sharding(kw, expected):
    kw.setdefault("environ", {})
    assert detect_sharding(**kw) == expected


def test_detect_fsdp1_flat_parameters_from_the_model():
    model = nn.Linear(2, 2)
    assert detect_sharding(model=model, environ={}) == "single"
    model.weight._is_flat_param = True  # what FSDP1's FlatParameter carries (isinstance checks it)
    assert detect_sharding(model=model, environ={}) == "fsdp1"


SUPPORTED = {  # the support matrix of docs/_incoming/sharded.md
    "adamw": {"single", "ddp", "fsdp2", "fsdp1", "deepspeed"},
    "lion": {"single", "ddp", "fsdp2", "fsdp1", "deepspeed"},
    "ademamix": {"single", "ddp", "fsdp2", "fsdp1", "deepspeed"},
    "muon": {"single", "ddp", "fsdp2"},
    "soap": {"single", "ddp"},
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_support_matrix(name):
    for mode in ("single", "ddp", "fsdp2", "fsdp1", "deepspeed"):
        assert (sharding_support(name, mode) is None) == (mode in SUPPORTED[name]), (name, mode)
    for mode in ("fsdp1", "deepspeed"):  # cautious counts per tensor: not on flattened partitions
        if name in ("adamw", "lion", "ademamix", "muon"):
            assert sharding_support(name, mode, cautious=True) is not None


@pytest.mark.parametrize(
    "name, mode, words",
    [
        ("muon", "deepspeed", ["optimizer: 'muon'", "DeepSpeed ZeRO", "flattened partitions", "DDP", "FSDP2"]),
        ("soap", "deepspeed", ["'soap'", "DeepSpeed ZeRO", "DDP"]),
        ("muon", "fsdp1", ["'muon'", "FSDP1", "flattened parameters", "FSDP2"]),
        ("soap", "fsdp2", ["'soap'", "FSDP2", "per shard", "DDP"]),
    ],
)
def test_refusal_is_one_line_naming_optimizer_mode_and_alternative(name, mode, words):
    with pytest.raises(ValueError) as err:
        check_sharding_support(name, mode)
    text = str(err.value)
    assert "\n" not in text and all(w in text for w in words), text


def test_refused_at_creation_from_args_and_launcher_environment(monkeypatch):
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
    with pytest.raises(ValueError, match="'muon' does not work under DeepSpeed ZeRO"):
        create_optimizer("muon", model, sharding=detect_sharding(args=SimpleNamespace(deepspeed="z2.json")))
    create_optimizer("lion", model, sharding="deepspeed")  # element-wise: fine
    with pytest.raises(ValueError, match="optimizer_kwargs: cautious=True with 'lion' does not work under DeepSpeed"):
        create_optimizer("lion", model, sharding="deepspeed", cautious=True)
    # `accelerate launch --config_file recipes/accelerate/deepspeed_zero2.yaml` sets this variable: the
    # config check that FastTrainingArguments runs up front (nothing built) already refuses.
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(ValueError, match="'soap' does not work under DeepSpeed ZeRO"):
        check_optimizer_options("soap", lr=1e-3)
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    check_optimizer_options("muon", lr=1e-3)  # FSDP2: supported
    with pytest.raises(ValueError, match="'soap' does not work under FSDP2"):
        check_optimizer_options("soap", lr=1e-3)


def test_fast_trainer_refuses_muon_under_deepspeed_before_training(tmp_path, monkeypatch):
    from conftest import make_tiny_gpt2, tiny_args

    from hf_fasttrain import FastTrainer

    args = tiny_args(tmp_path, optimizer="muon", max_steps=2)
    trainer = FastTrainer(model=make_tiny_gpt2(64), args=args)
    # what a DeepSpeed run looks like to the optimizer factory (deepspeed is not installed here)
    monkeypatch.setattr(trainer, "accelerator", SimpleNamespace(state=SimpleNamespace(deepspeed_plugin=object())))
    with pytest.raises(ValueError, match="'muon' does not work under DeepSpeed ZeRO"):
        trainer.create_optimizer()
    assert trainer.state.global_step == 0


# --- FSDP2 on 2 CPU processes: one spawn for every optimizer ---------------------------------------


@pytest.mark.e2e
def test_every_optimizer_under_fsdp2_equals_single_process(tmp_path):
    import torch.multiprocessing as mp

    import _sharded_worker as worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    keys = [*worker.KW, "controls"]
    mp.spawn(worker.run, args=(2, port, str(tmp_path), keys), nprocs=2, join=True)
    reports = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for report in reports:
        assert "error" not in report, report["error"]
        for key in worker.KW:  # adamw, lion, ademamix (plain and cautious), muon (jordan; polar + cautious)
            r = report[key]
            assert r["diff_1"] <= 1e-6 and r["diff_5"] <= 1e-6, (key, r)
            assert r["moved"] > 1e-3, (key, r)  # the steps changed the weights
        for key in ("adamw", "lion", "ademamix", "muon"):  # sharded checkpoint, resume continues exactly
            assert report[key]["resume_diff"] == 0.0 and report[key]["resume_moved"] > 1e-4, (key, report[key])
        assert "'soap' does not work under FSDP2" in report["soap_refusal"]
        # one all-gather per Muon matrix per step, nothing else (the slicing and AdamW part are local)
        comm = report["muon_step_comm"]
        assert comm["counts"] == {"c10d_functional.all_gather_into_tensor": comm["matrices"]} and comm["matrices"] == 8
        # control: torch.optim.Muon per shard (what happened before) is off by far more than the tolerance
        assert report["torch_muon_per_shard_diff"] > 1e-4


def test_muon_communication_estimate():
    # GPT-2 small: 48 Muon matrices, 84,934,656 elements (fp32): per rank and step
    n = 84_934_656
    for world, gather_mb, rr_mb in ((2, 169.9, 169.9), (8, 297.3, 74.3), (64, 334.4, 10.5)):
        est = muon_communication_bytes(n, world)
        assert est["gather"] / 1e6 == pytest.approx(gather_mb, abs=0.05)
        assert est["round_robin"] / 1e6 == pytest.approx(rr_mb, abs=0.05)
    assert muon_communication_bytes(n, 1) == {"gather": 0.0, "round_robin": 0.0}
