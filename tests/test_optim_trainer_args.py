"""The Trainer's adam_beta1 / adam_beta2 / adam_epsilon reach Muon's AdamW part, SOAP and AdEMAMix when set
away from the Trainer's defaults; at the defaults those keep their own betas; optimizer_kwargs overrides."""

import pytest
import torch
from torch import nn
from transformers import TrainingArguments

from hf_fasttrain import FastTrainingArguments
from hf_fasttrain.optim import create_optimizer, optimizer_cls_and_kwargs_for, trainer_optimizer_kwargs

BASE = {"lr": 1e-3, "weight_decay": 0.0}

# (optimizer, TrainingArguments fields, optimizer_kwargs) -> trainer_optimizer_kwargs
TABLE = [
    ("muon", {}, None, {**BASE}),  # Trainer defaults: Muon's AdamW keeps (0.9, 0.95)
    ("muon", {"adam_beta2": 0.99}, None, {**BASE, "betas": (0.9, 0.99)}),
    ("muon", {"adam_beta1": 0.8}, None, {**BASE, "betas": (0.8, 0.95)}),  # beta2 at the Trainer's default: Muon's
    ("muon", {"adam_beta1": 0.8, "adam_beta2": 0.98}, None, {**BASE, "betas": (0.8, 0.98)}),
    ("muon", {"adam_beta2": 0.95}, None, {**BASE}),  # what the recipes set: Muon's own value
    ("muon", {"adam_epsilon": 1e-6}, None, {**BASE, "eps": 1e-6}),
    ("muon", {"adam_beta2": 0.99}, {"betas": [0.85, 0.9]}, {**BASE, "betas": [0.85, 0.9]}),  # optimizer_kwargs wins
    ("muon", {"adam_epsilon": 1e-6}, {"eps": 1e-10}, {**BASE, "eps": 1e-10}),
    ("soap", {}, None, {**BASE}),  # SOAP keeps the paper's (0.95, 0.95)
    ("soap", {"adam_beta2": 0.99}, None, {**BASE, "betas": (0.95, 0.99)}),
    ("soap", {"adam_beta1": 0.9, "adam_beta2": 0.95}, None, {**BASE}),
    ("adamw", {}, None, {**BASE, "betas": (0.9, 0.999), "eps": 1e-8}),  # AdamW: always the Trainer's
    ("adamw", {"adam_beta2": 0.95}, None, {**BASE, "betas": (0.9, 0.95), "eps": 1e-8}),
    ("lion", {"adam_beta2": 0.99}, None, {**BASE}),  # Lion's betas are not Adam's
    ("ademamix", {}, None, {**BASE, "T_alpha_beta3": 10}),  # the paper's (0.9, 0.999, 0.9999) are the Trainer's
    ("ademamix", {"adam_beta2": 0.99}, None, {**BASE, "betas": (0.9, 0.99, 0.9999), "T_alpha_beta3": 10}),
    ("ademamix", {"adam_beta1": 0.8, "adam_epsilon": 1e-6}, None,
     {**BASE, "betas": (0.8, 0.999, 0.9999), "eps": 1e-6, "T_alpha_beta3": 10}),
    ("ademamix", {"adam_beta2": 0.99}, {"betas": [0.9, 0.95, 0.999]}, {**BASE, "betas": [0.9, 0.95, 0.999],
                                                                        "T_alpha_beta3": 10}),
]


@pytest.mark.parametrize("name, fields, optimizer_kwargs, expected", TABLE)
def test_trainer_adam_args_reach_the_optimizer(name, fields, optimizer_kwargs, expected):
    args = FastTrainingArguments(output_dir="x", optimizer=name, learning_rate=1e-3, optimizer_kwargs=optimizer_kwargs,
                                 report_to=[], **fields)
    assert trainer_optimizer_kwargs(args, 10) == expected
    # optimizer_cls_and_kwargs_for (a plain Trainer) takes them from TrainingArguments the same way
    plain = TrainingArguments(output_dir="x", learning_rate=1e-3, max_steps=10, report_to=[], **fields)
    assert optimizer_cls_and_kwargs_for(name, plain, **(optimizer_kwargs or {}))[1] == expected


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))  # Muon: 0.weight; AdamW: 0.bias, 1.weight, 1.bias


def _grads(params, step):
    gen = torch.Generator().manual_seed(step)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


@pytest.mark.parametrize("fields, betas", [({}, (0.9, 0.95)), ({"adam_beta2": 0.99}, (0.9, 0.99))])
def test_muon_adamw_part_steps_with_the_betas(fields, betas):
    args = FastTrainingArguments(output_dir="x", optimizer="muon", learning_rate=1e-2, report_to=[], **fields)
    net = _net()
    opt = create_optimizer("muon", net, **trainer_optimizer_kwargs(args))
    adamw_groups = [g for g in opt.param_groups if not g["use_muon"]]
    assert [g["betas"] for g in adamw_groups] == [betas]
    assert opt.inner_optimizers[1].param_groups == adamw_groups  # the AdamW that steps holds these very groups

    # the AdamW part's params move exactly as torch's AdamW with those betas (and not with the other pair)
    part = [p for g in adamw_groups for p in g["params"]]
    ref = {other: [nn.Parameter(p.detach().clone()) for p in part] for other in [(0.9, 0.95), (0.9, 0.99)]}
    refs = {b: torch.optim.AdamW(ps, lr=1e-2, betas=b, weight_decay=0.0) for b, ps in ref.items()}
    for step in range(4):
        _grads(list(net.parameters()), step)
        opt.step()
        for b, ps in ref.items():
            for p, q in zip(part, ps):
                q.grad = p.grad.clone()
            refs[b].step()
    for p, q in zip(part, ref[betas]):
        torch.testing.assert_close(p.detach(), q.detach(), rtol=1e-6, atol=1e-7)
    other = (0.9, 0.99) if betas == (0.9, 0.95) else (0.9, 0.95)
    assert not all(torch.allclose(p.detach(), q.detach(), rtol=1e-6, atol=1e-7) for p, q in zip(part, ref[other]))


def test_ademamix_half_life():
    from hf_fasttrain.optim import slow_momentum_half_life

    assert slow_momentum_half_life(0.9999) == pytest.approx(6931.1, abs=0.1)
    assert slow_momentum_half_life(0.999) == pytest.approx(692.8, abs=0.1)
    assert slow_momentum_half_life(0.5) == pytest.approx(1.0)


@pytest.mark.parametrize("max_steps, betas, warned", [
    (1200, None, True),                    # the paper's 0.9999: a half-life of 6,931 steps
    (10_000, None, False),
    (1200, [0.9, 0.999, 0.999], False),    # 693 steps
    (500, [0.9, 0.999, 0.999], True),
])
def test_fasttrainer_says_when_ademamixs_slow_momentum_outlasts_the_run(max_steps, betas, warned, caplog, tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_fasttrain import FastTrainer

    args = FastTrainingArguments(output_dir=str(tmp_path), max_steps=max_steps, optimizer="ademamix", report_to="none",
                                 optimizer_kwargs={"betas": betas} if betas else None, run_record=False)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    data = [{"input_ids": torch.arange(16) % 64, "labels": torch.arange(16) % 64}] * 4
    with caplog.at_level("WARNING", logger="hf_fasttrain.trainer"):
        FastTrainer(model=model, args=args, train_dataset=data).create_optimizer()
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ademamix:")]
    assert len(said) == int(warned)
    if warned:
        beta3 = (betas or [0.9, 0.999, 0.9999])[2]
        assert f"beta3 {beta3} gives the slow momentum a half-life of" in said[0]
        assert f"longer than this run ({max_steps:,} steps)" in said[0]
