"""muP from the outside: the optimizer's groups by width, the head's output multiplier, muP's init, the refusals,
and a FastTrainer run with muP that resumes to the straight run."""

import math

import pytest
import torch
from torch import nn

from hf_fasttrain.validation import ConfigError
from hf_fasttrain.optim import create_optimizer
from hf_fasttrain.optim.groups import output_multiplier, param_roles
from hf_fasttrain.optim.muon import _adjust_lr
from hf_fasttrain.optim.spec import OptimizerSpec
from hf_fasttrain.transfer import apply_depth_scaling, apply_mup, check_config_mup, mup_init_, remove_mup

from conftest import StopAt, make_tiny_gpt2

BASE = 32
HEAD_DIM = 16  # fixed head size: widths 32, 64, 128 have 2, 4, 8 heads
LR, WD, EPS = 1e-3, 0.1, 1e-8


def gpt2(width: int, tied: bool = True, seed: int = 0, **config):
    return make_tiny_gpt2(vocab_size=64, n_positions=16, seed=seed, n_embd=width, n_head=width // HEAD_DIM,
                          tie_word_embeddings=tied, **config)


def _groups(opt):
    """{param name: (role, lr, weight decay, eps, use_muon)} of every param of `opt`."""
    out = {}
    for g in opt.param_groups:
        for name in g["param_names"]:
            out[name] = (g.get("lr_group"), g["lr"], g["weight_decay"], g.get("eps"), g.get("use_muon"))
    return out


# --- the optimizer side: a table by role, at m = 1, 2, 4 ---------------------------------------------------------
@pytest.mark.parametrize("width, m", [(32, 1), (64, 2), (128, 4)])
@pytest.mark.parametrize("tied", [True, False])
def test_adamw_groups_by_role_follow_mup(width, m, tied):
    model = gpt2(width, tied=tied)
    assert apply_mup(model, base_width=BASE) == m
    opt = create_optimizer("adamw", model, lr=LR, weight_decay=WD, eps=EPS, parameterization="mup", base_width=BASE)
    expected = {  # role -> (lr, weight decay, eps)
        "embedding": (LR, WD, EPS),
        "head": (LR, WD, EPS),  # muP's readout: the lr stays, the output is multiplied by 1/m instead
        "matrix": (LR / m, WD * m, EPS / m),
        "norm": (LR, 0.0, EPS),
        "bias": (LR, 0.0, EPS),
    }
    got = _groups(opt)
    roles = param_roles(model)
    assert set(got) == set(roles)
    for name, (role, lr, wd, eps, _) in got.items():
        assert role == roles[name]
        assert (lr, wd, eps) == pytest.approx(expected[role], rel=1e-12), name
        assert lr * wd == pytest.approx(LR * (WD if role in ("embedding", "head", "matrix") else 0.0), rel=1e-12)
    assert ("head" in set(roles.values())) is (not tied)  # a tied head is the embedding, counted once
    assert {g["width_multiplier"] for g in opt.param_groups} == {m}


def _fans(model, name, p):
    """(fan_out, fan_in) of a hidden matrix: GPT-2's Conv1D stores (in, out), nn.Linear (out, in)."""
    from transformers.pytorch_utils import Conv1D

    module = model.get_submodule(name.rsplit(".", 1)[0])
    return (p.shape[1], p.shape[0]) if isinstance(module, Conv1D) else (p.shape[0], p.shape[1])


@pytest.mark.parametrize("width, m", [(32, 1), (64, 2), (128, 4)])
def test_muon_matrices_get_the_spectral_scale_and_no_lr_over_m(width, m):
    model = gpt2(width)
    apply_mup(model, base_width=BASE)
    opt = create_optimizer("muon", model, lr=LR, weight_decay=WD, eps=EPS, parameterization="mup", base_width=BASE)
    named = dict(model.named_parameters())
    steps = {}
    for g in opt.param_groups:
        for name in g["param_names"]:
            p = named[name]
            if g["use_muon"]:
                assert g["adjust_lr_fn"] == "spectral"
                fan_out, fan_in = _fans(model, name, p)
                # the step's scale, as the optimizer applies it: lr sqrt(fan_out / fan_in), nothing over m
                assert _adjust_lr(g["lr"], g["adjust_lr_fn"], p.shape) == pytest.approx(LR * math.sqrt(fan_out / fan_in))
                assert g["lr"] * g["weight_decay"] == pytest.approx(LR * WD)  # the decay's timescale stays
                assert "eps" not in g or g["eps"] != EPS / m or m == 1  # Muon's own eps is Newton-Schulz's
                steps[name.split(".", 3)[-1]] = math.sqrt(fan_out / fan_in)
            else:  # the AdamW part: embeddings, norms, biases keep lr, weight decay and eps
                assert (g["lr"], g["eps"]) == (LR, EPS)
                assert g["weight_decay"] == (WD if g["lr_group"] == "embedding" else 0.0)
    # GPT-2's fused qkv (d -> 3d), MLP up (d -> 4d) and down (4d -> d): sqrt(3), 2 and 1/2 at every width
    assert steps == pytest.approx({"attn.c_attn.weight": math.sqrt(3), "attn.c_proj.weight": 1.0,
                                   "mlp.c_fc.weight": 2.0, "mlp.c_proj.weight": 0.5})


def test_spectral_scale_of_an_nn_linear_and_a_conv1d_agree():
    """The same (out, in) map stored both ways gets the same step."""
    from transformers.pytorch_utils import Conv1D

    lin, conv = nn.Linear(8, 32), Conv1D(32, 8)  # both 8 -> 32
    for module in (lin, conv):
        net = nn.Sequential(nn.Embedding(4, 8), module)
        opt = create_optimizer("muon", net, lr=0.1, adjust_lr_fn="spectral")
        (g,) = [g for g in opt.param_groups if g["use_muon"]]
        assert _adjust_lr(g["lr"], "spectral", module.weight.shape) == pytest.approx(0.1 * 2.0)


def test_muons_adamw_part_matrices_take_the_adam_rule():
    model = gpt2(128)
    apply_mup(model, base_width=BASE)
    opt = create_optimizer("muon", model, lr=LR, weight_decay=WD, eps=EPS, parameterization="mup", base_width=BASE,
                           adamw_patterns=["mlp.c_proj"])
    got = _groups(opt)
    name = "transformer.h.0.mlp.c_proj.weight"
    assert got[name] == ("matrix", pytest.approx(LR / 4), pytest.approx(WD * 4), pytest.approx(EPS / 4), False)


@pytest.mark.parametrize("name, has_eps", [("adamw", True), ("lion", False), ("ademamix", True), ("soap", True)])
def test_every_adam_like_optimizer_scales_its_matrices(name, has_eps):
    model = gpt2(64)
    apply_mup(model, base_width=BASE)
    opt = create_optimizer(name, model, lr=LR, weight_decay=WD, parameterization="mup", base_width=BASE,
                           lr_multipliers={"matrix": 3.0, "embedding": 2.0})
    for g in opt.param_groups:
        if g["lr_group"] == "matrix":
            assert (g["lr"], g["weight_decay"]) == pytest.approx((LR * 3.0 / 2, WD * 2))  # composes: x3, then / m
            assert ("eps" in g and g["eps"] == pytest.approx(1e-8 / 2)) is has_eps
        elif g["lr_group"] == "embedding":
            assert g["lr"] == pytest.approx(LR * 2.0)


def test_standard_parameterization_leaves_the_groups_as_they_were():
    model = gpt2(64)
    a = create_optimizer("adamw", model, lr=LR, weight_decay=WD)
    b = create_optimizer("adamw", model, lr=LR, weight_decay=WD, parameterization="standard")
    assert [(g["param_names"], g["lr"], g["weight_decay"]) for g in a.param_groups] == \
           [(g["param_names"], g["lr"], g["weight_decay"]) for g in b.param_groups]
    assert not any("width_multiplier" in g for g in b.param_groups)
    opt = create_optimizer("muon", model, lr=LR)
    assert {g["adjust_lr_fn"] for g in opt.param_groups if g["use_muon"]} == {"match_rms_adamw"}


def test_width_override_replaces_the_config():
    model = gpt2(64)
    assert apply_mup(model, base_width=BASE, width=256) == 8
    opt = create_optimizer("adamw", model, lr=LR, parameterization="mup", base_width=BASE, width=256)
    assert [g["lr"] for g in opt.param_groups if g["lr_group"] == "matrix"] == [pytest.approx(LR / 8)]


# --- the head's output multiplier ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tied", [True, False])
def test_head_multiplier_scales_the_logits_exactly_and_only_them(tied):
    model = gpt2(128, tied=tied).eval()
    ids = torch.randint(0, 64, (2, 12))
    with torch.no_grad():
        plain = model(ids, output_hidden_states=True)
        assert apply_mup(model, base_width=BASE) == 4
        apply_mup(model, base_width=BASE)  # idempotent: still one hook
        head = model.get_output_embeddings()
        assert len(head._forward_hooks) == 1 and output_multiplier(model) == 4
        hooked = model(ids, output_hidden_states=True)
    assert torch.equal(hooked.logits, plain.logits * 0.25)
    for a, b in zip(hooked.hidden_states, plain.hidden_states):  # the tied weight's input use is untouched
        assert torch.equal(a, b)
    assert (model.get_output_embeddings().weight is model.get_input_embeddings().weight) is tied
    # another base width replaces the hook; removing it restores the logits
    with torch.no_grad():
        assert apply_mup(model, base_width=64) == 2
        assert len(head._forward_hooks) == 1
        assert torch.equal(model(ids).logits, plain.logits * 0.5)
        remove_mup(model)
        assert not head._forward_hooks and output_multiplier(model) is None
        assert torch.equal(model(ids).logits, plain.logits)


def test_the_loss_sees_the_scaled_logits():
    model = gpt2(64).eval()
    ids = torch.randint(0, 64, (2, 12))
    apply_mup(model, base_width=BASE)
    with torch.no_grad():
        out = model(ids, labels=ids)
    expected = nn.functional.cross_entropy(out.logits[:, :-1].reshape(-1, 64), ids[:, 1:].reshape(-1))
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-6)


# --- muP's initialisation -----------------------------------------------------------------------------------------
def test_mup_init_draws_hidden_matrices_at_sigma_over_sqrt_m():
    model = gpt2(128, tied=False, n_layer=2)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    assert mup_init_(model, base_width=BASE) == 4
    roles = param_roles(model)
    sigma = 0.02 / math.sqrt(4)
    for name, p in model.named_parameters():
        if roles[name] != "matrix":
            assert torch.equal(p, before[name]), name  # embeddings, head, norms, biases keep their values
            continue
        assert not torch.equal(p, before[name]), name
        # GPT-2's residual projections keep their own 1 / sqrt(2 n_layer) on top
        want = sigma / math.sqrt(2 * 2) if name.endswith("c_proj.weight") else sigma
        assert p.std().item() == pytest.approx(want, rel=0.05), name
        assert abs(p.mean().item()) < 0.1 * want
    # an explicit std: every hidden matrix at std / sqrt(m)
    mup_init_(model, base_width=BASE, std=0.05)
    for name, p in model.named_parameters():
        if roles[name] == "matrix":
            assert p.std().item() == pytest.approx(0.05 / 2, rel=0.05), name


def test_mup_init_is_a_redraw_not_a_rescale():
    a = gpt2(64)
    mup_init_(a, base_width=BASE)
    first = a.transformer.h[0].mlp.c_fc.weight.std().item()
    mup_init_(a, base_width=BASE)
    assert a.transformer.h[0].mlp.c_fc.weight.std().item() == pytest.approx(first, rel=0.05)


def test_the_package_built_model_gets_mup_init():
    from hf_fasttrain.config.model_data_args import ModelArguments
    from hf_fasttrain.modeling import build_model

    class Vocab:
        bos_token_id = eos_token_id = 0
        pad_token_id = None

        def __len__(self):
            return 64

    args = ModelArguments(model_type="gpt2", n_layer=2, n_head=8, n_embd=128)
    torch.manual_seed(0)
    plain = build_model(args, Vocab(), 16)
    torch.manual_seed(0)
    mup = build_model(args, Vocab(), 16, {"parameterization": "mup", "base_width": 32})
    a, b = plain.transformer.h[0].mlp.c_fc.weight, mup.transformer.h[0].mlp.c_fc.weight
    assert b.std().item() == pytest.approx(a.std().item() / 2, rel=0.05)
    assert torch.equal(plain.transformer.wte.weight, mup.transformer.wte.weight)


# --- refusals, in one line --------------------------------------------------------------------------------------------
def _one_line(excinfo) -> str:
    text = str(excinfo.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize("kwargs, message", [
    ({"parameterization": "mu-p", "base_width": 32}, "parameterization: got 'mu-p'; one of standard, mup"),
    ({"parameterization": "mup"}, "base_width: is required; the width the settings were tuned at"),
    ({"parameterization": "mup", "base_width": 0}, "base_width: got 0; a finite number > 0"),
    ({"parameterization": "mup", "base_width": -64}, "base_width: got -64; a finite number > 0"),
    ({"parameterization": "mup", "base_width": 32, "width": 0}, "width: got 0; a finite number > 0"),
    ({"parameterization": "mup", "base_width": 32, "base_depth": 1.5}, "base_depth: got 1.5; an integer > 0"),
    ({"base_width": 64}, "base_width: got 64; only with parameterization 'mup'"),
])
@pytest.mark.parametrize("name", ["adamw", "muon"])
def test_bad_parameterization_options_are_refused_before_any_model(name, kwargs, message):
    with pytest.raises(ConfigError) as built:
        create_optimizer(name, gpt2(64), lr=LR, **kwargs)
    assert _one_line(built).startswith(message)
    with pytest.raises(ConfigError) as checked:  # the same message from the values alone (FastTrainingArguments)
        OptimizerSpec.of(name, lr=LR, **kwargs).validate(sharding="single")
    assert str(checked.value) == str(built.value)


def test_a_model_whose_width_cannot_be_read_is_refused():
    net = nn.Sequential(nn.Embedding(8, 16), nn.Linear(16, 16))
    with pytest.raises(ConfigError) as e:
        create_optimizer("adamw", net, lr=LR, parameterization="mup", base_width=8)
    assert _one_line(e) == ("width: cannot read the width of Sequential; give width=<the model's width>: its config "
                            "holds none of hidden_size, n_embd, d_model")
    with pytest.raises(ConfigError, match="has no output head"):
        apply_mup(net, base_width=8, width=16)


def test_building_mup_groups_without_the_output_multiplier_is_refused():
    model = gpt2(64)
    with pytest.raises(ConfigError) as e:
        create_optimizer("adamw", model, lr=LR, parameterization="mup", base_width=BASE)
    assert _one_line(e) == ("parameterization: the model's output head has none output multiplier, muP with width "
                            "multiplier 2 needs 1/2; call hf_fasttrain.apply_mup(model, base_width=32) before building "
                            "the optimizer (FastTrainer does it for you)")
    apply_mup(model, base_width=64)  # the wrong base width: 1/1 where 1/2 is needed
    with pytest.raises(ConfigError, match="has 1/1 output multiplier"):
        create_optimizer("adamw", model, lr=LR, parameterization="mup", base_width=BASE)


@pytest.mark.parametrize("fn", ["match_rms_adamw", "original"])
def test_muon_under_mup_refuses_another_scale(fn):
    with pytest.raises(ConfigError) as e:
        OptimizerSpec.of("muon", lr=LR, parameterization="mup", base_width=BASE, adjust_lr_fn=fn).validate("single")
    assert _one_line(e) == (f"adjust_lr_fn: got {fn!r} with parameterization 'mup', which puts Muon's matrices on the "
                            "spectral scale sqrt(fan_out / fan_in); leave it unset or give 'spectral'")


# --- a config's own muP setting (transformers' config.mup) ----------------------------------------------------------
def test_transformers_has_no_config_mup_here():
    from transformers import GPT2Config

    assert not hasattr(GPT2Config(), "mup")  # the check below is for a transformers that adds it


def test_a_config_mup_is_refused_in_one_line_not_dropped(tmp_path):
    from hf_fasttrain import FastTrainer

    from conftest import tiny_args

    model = gpt2(64)
    model.config.mup = {"base_width": 32}
    check_config_mup(gpt2(64))  # none: nothing to say
    with pytest.raises(ConfigError) as e:
        FastTrainer(model=model, args=tiny_args(tmp_path, optimizer="adamw"), train_dataset=_rows(8))
    assert _one_line(e).startswith("config.mup: got {'base_width': 32} with `optimizer` set, whose param groups would "
                                   "replace the ones config.mup asks for; set config.mup to None")
    # without `optimizer`, the Trainer builds its own optimizer and reads config.mup itself: nothing to refuse
    FastTrainer(model=model, args=tiny_args(tmp_path), train_dataset=_rows(8))


# --- FastTrainer: installs the multiplier; a resumed muP run equals the straight one -------------------------------
def _rows(n: int, length: int = 16, seed: int = 0):
    from datasets import Dataset

    g = torch.Generator().manual_seed(seed)  # counting sequences from random starts: something to learn
    ids = ((torch.randint(0, 64, (n, 1), generator=g) + torch.arange(length)) % 64).tolist()
    return Dataset.from_dict({"input_ids": ids, "labels": ids})


def _mup_args(out, optimizer="adamw", **kw):
    from conftest import tiny_args

    return tiny_args(out, optimizer=optimizer, optimizer_kwargs={"parameterization": "mup", "base_width": BASE},
                     max_steps=6, per_device_train_batch_size=4, learning_rate=1e-2, **kw)


def test_fast_trainer_installs_the_output_multiplier(tmp_path):
    from hf_fasttrain import FastTrainer

    model = gpt2(128)
    trainer = FastTrainer(model=model, args=_mup_args(tmp_path, "muon"), train_dataset=_rows(8))
    assert output_multiplier(model) == 4
    opt = trainer.create_optimizer()
    assert {g["adjust_lr_fn"] for g in opt.param_groups if g["use_muon"]} == {"spectral"}
    assert len(model.get_output_embeddings()._forward_hooks) == 1  # create_optimizer did not add a second


def test_plain_trainer_with_apply_mup(tmp_path):
    from transformers import Trainer, TrainingArguments

    from hf_fasttrain import apply_mup as top_level_apply_mup, optimizer_cls_and_kwargs_for

    model = gpt2(64)
    top_level_apply_mup(model, base_width=BASE)
    args = TrainingArguments(str(tmp_path), max_steps=2, learning_rate=1e-3, weight_decay=0.1, report_to=[],
                             use_cpu=True, per_device_train_batch_size=4)
    trainer = Trainer(model=model, args=args, train_dataset=_rows(8), optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for(
        "adamw", args, parameterization="mup", base_width=BASE))
    trainer.create_optimizer()
    assert [g["lr"] for g in trainer.optimizer.param_groups if g["lr_group"] == "matrix"] == [pytest.approx(5e-4)]


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_resumed_mup_run_equals_the_straight_run(optimizer, tmp_path):
    from hf_fasttrain import FastTrainer

    def trainer(out, **kw):
        return FastTrainer(model=gpt2(64, seed=1), args=_mup_args(out, optimizer, save_strategy="steps", save_steps=3),
                           train_dataset=_rows(24), **kw)

    straight = trainer(tmp_path / "a")
    straight.train()
    first = trainer(tmp_path / "b", callbacks=[StopAt(3)])
    first.train()
    at_stop = {n: p.detach().clone() for n, p in first.model.named_parameters()}
    resumed = trainer(tmp_path / "b")
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-3"))
    assert len(resumed.model.get_output_embeddings()._forward_hooks) == 1
    moved = False
    for (name, a), b in zip(straight.model.named_parameters(), resumed.model.parameters()):
        assert torch.equal(a, b), name
        moved |= not torch.equal(a, at_stop[name])
    assert moved  # negative control: training went on after the checkpoint
    assert {g["width_multiplier"] for g in resumed.optimizer.param_groups} == {2}
    losses = [e["loss"] for e in straight.state.log_history if "loss" in e]
    assert losses[-1] < losses[0] - 0.1


# --- depth (CompleteP, alpha = 1) and the head size --------------------------------------------------------------
def _llama(layers: int, width: int = 32, heads: int = 2):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=layers,
                                        num_attention_heads=heads, num_key_value_heads=heads, vocab_size=64,
                                        max_position_embeddings=16))


def _branches(model):
    blocks = model.transformer.h if hasattr(model, "transformer") else model.model.layers
    return [b.attn if hasattr(b, "attn") else b.self_attn for b in blocks] + [b.mlp for b in blocks]


@pytest.mark.parametrize("make, layers, base, multiplier", [
    (lambda n: gpt2(64, n_layer=n), 4, 2, 0.5), (lambda n: gpt2(64, n_layer=n), 2, 2, 1.0),
    (lambda n: _llama(n, width=64, heads=4), 4, 1, 0.25)])
def test_depth_rule_scales_every_residual_branch_by_base_over_depth(make, layers, base, multiplier):
    model = make(layers).eval()
    seen = []

    def record(module, args, kwargs, output):  # after the depth hook: what the residual stream receives
        seen.append((module, args, kwargs, output))

    assert apply_mup(model, base_width=32, base_depth=base) == 2
    apply_depth_scaling(model, base)  # idempotent: the hooks are replaced, not doubled
    for branch in _branches(model):
        branch.register_forward_hook(record, with_kwargs=True)
    with torch.no_grad():
        model(torch.randint(0, 64, (2, 8)))
        assert len(seen) == 2 * layers
        for module, args, kwargs, output in seen:
            plain = module.forward(*args, **kwargs)  # the branch itself, without hooks
            got, want = (output[0], plain[0]) if isinstance(output, tuple) else (output, plain)
            assert torch.equal(got, want * multiplier)
            assert multiplier == 1.0 or not torch.equal(got, want)


def test_depth_rule_is_refused_in_one_line_where_blocks_are_not_recognised():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    gemma = Gemma2ForCausalLM(Gemma2Config(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                           num_attention_heads=2, num_key_value_heads=2, head_dim=16, vocab_size=64))
    with pytest.raises(ConfigError) as e:
        apply_mup(gemma, base_width=32, base_depth=1)
    assert _one_line(e).startswith("base_depth: the depth rule scales residual branches by hooks on GPT-2 blocks")
    assert "Gemma2ForCausalLM has neither" in str(e.value)
    assert output_multiplier(gemma) is None  # refused before anything was installed


def test_a_head_size_other_than_the_base_one_is_refused():
    with pytest.raises(ConfigError) as e:
        apply_mup(make_tiny_gpt2(vocab_size=64, n_embd=64, n_head=2), base_width=32, base_head_dim=16)
    assert _one_line(e) == ("base_head_dim: the model's heads are 32 wide, the base's 16: the attention scale would "
                            "not transfer; widen by heads at a fixed head size (more heads, the same head_dim)")
    assert apply_mup(gpt2(64), base_width=32, base_head_dim=16) == 2  # 4 heads of 16
    assert apply_mup(_llama(2, width=64, heads=4), base_width=32, base_head_dim=16) == 2


def test_fast_trainer_applies_the_depth_rule_from_optimizer_kwargs(tmp_path):
    from hf_fasttrain import FastTrainer
    from conftest import tiny_args

    model = gpt2(64, n_layer=4)
    args = tiny_args(tmp_path, optimizer="adamw", optimizer_kwargs={
        "parameterization": "mup", "base_width": 32, "base_depth": 2, "base_head_dim": 16})
    FastTrainer(model=model, args=args, train_dataset=_rows(8))
    assert output_multiplier(model) == 2
    assert all(len(b._forward_hooks) == 1 for b in _branches(model))
    with pytest.raises(ConfigError, match="^base_head_dim: the model's heads are 16 wide, the base's 32"):
        FastTrainer(model=gpt2(64), args=tiny_args(tmp_path, optimizer="adamw", optimizer_kwargs={
            "parameterization": "mup", "base_width": 32, "base_head_dim": 32}), train_dataset=_rows(8))


def test_a_saved_mup_model_gets_its_multipliers_back(tmp_path):
    from transformers import AutoModelForCausalLM

    from hf_fasttrain.transfer import restore_mup

    model = gpt2(128, n_layer=4).eval()
    apply_mup(model, base_width=BASE, base_depth=2)
    ids = torch.randint(0, 64, (2, 8))
    with torch.no_grad():
        trained = model(ids).logits
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    with torch.no_grad():
        assert not torch.allclose(loaded(ids).logits, trained)  # the hooks are not in the weights
        assert restore_mup(loaded) == 4
        torch.testing.assert_close(loaded(ids).logits, trained, rtol=0, atol=1e-6)
    assert restore_mup(gpt2(64)) is None  # trained without muP: nothing to restore
    remove_mup(loaded)
    assert not hasattr(loaded.config, "hf_fasttrain_mup")
    assert not any(m._forward_hooks for m in loaded.modules())  # the head's and the branches' hooks are gone


def test_muon_experts_get_the_spectral_scale_of_each_expert_matrix():
    from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

    from hf_fasttrain.optim.muon import _matrix_shape

    torch.manual_seed(0)
    model = Qwen2MoeForCausalLM(Qwen2MoeConfig(
        hidden_size=64, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=64, num_experts=4, num_experts_per_tok=2,
        shared_expert_intermediate_size=16, max_position_embeddings=16))
    apply_mup(model, base_width=BASE)
    opt = create_optimizer("muon", model, lr=LR, parameterization="mup", base_width=BASE)
    named = dict(model.named_parameters())
    experts = [g for g in opt.param_groups if g.get("experts")]
    assert len(experts) == 2  # [gate; up] and down
    for g in experts:
        assert g["adjust_lr_fn"] == "spectral" and g["lr"] == LR  # nothing over m
        for name in g["param_names"]:
            out, inn = _matrix_shape(named[name], g)  # each expert's (out, in): gate/up 64 -> 16, down 16 -> 64
            assert {(out, inn)} <= {(16, 64), (64, 16)}
            assert _adjust_lr(g["lr"], "spectral", (out, inn)) == pytest.approx(LR * math.sqrt(out / inn))
