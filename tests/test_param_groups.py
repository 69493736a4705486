"""Per-group learning rates: each parameter's role, the groups every optimizer builds from the options, the
schedule keeping their ratios, and a resumed run equal to a straight one."""

import pytest
import torch
from datasets import Dataset
from transformers import (DataCollatorForLanguageModeling, GPTNeoXConfig, GPTNeoXForCausalLM, LlamaConfig,
                          LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments)

from conftest import make_tiny_gpt2, tiny_args
from hf_fasttrain import FastTrainer
from hf_fasttrain.validation import ConfigError
from hf_fasttrain.optim import create_optimizer, optimizer_cls_and_kwargs_for, parse_optimizer_kwargs
from hf_fasttrain.optim.groups import check_group_options, param_roles, regroup

_GPT2_LAYER = {"matrix": ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"],
               "bias": ["attn.c_attn.bias", "attn.c_proj.bias", "mlp.c_fc.bias", "mlp.c_proj.bias"],
               "norm": ["ln_1.weight", "ln_1.bias", "ln_2.weight", "ln_2.bias"]}
_LLAMA_LAYER = {"matrix": ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                           "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                           "mlp.down_proj.weight"],
                "norm": ["input_layernorm.weight", "post_attention_layernorm.weight"]}
_NEOX_LAYER = {"matrix": ["attention.query_key_value.weight", "attention.dense.weight", "mlp.dense_h_to_4h.weight",
                          "mlp.dense_4h_to_h.weight"],
               "bias": ["attention.query_key_value.bias", "attention.dense.bias", "mlp.dense_h_to_4h.bias",
                        "mlp.dense_4h_to_h.bias"],
               "norm": ["input_layernorm.weight", "input_layernorm.bias", "post_attention_layernorm.weight",
                        "post_attention_layernorm.bias"]}


def _llama(tied):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=16, num_attention_heads=2,
                                        num_key_value_heads=1, vocab_size=16, tie_word_embeddings=tied))


def _neox(tied):
    torch.manual_seed(0)
    return GPTNeoXForCausalLM(GPTNeoXConfig(num_hidden_layers=1, hidden_size=8, intermediate_size=16,
                                            num_attention_heads=2, vocab_size=16, tie_word_embeddings=tied))


def _expected(prefix, layer, head, embeddings, final_norm):
    out = {"embedding": list(embeddings), "head": [head] if head else [], "norm": [], "bias": [], "matrix": []}
    for role, names in layer.items():
        out[role] += [f"{prefix}{n}" for n in names]
    out["norm"] += final_norm
    return out


@pytest.mark.parametrize("make, expected", [
    (lambda: make_tiny_gpt2(16, n_layer=1),
     _expected("transformer.h.0.", _GPT2_LAYER, None, ["transformer.wte.weight", "transformer.wpe.weight"],
               ["transformer.ln_f.weight", "transformer.ln_f.bias"])),
    (lambda: make_tiny_gpt2(16, n_layer=1, tie_word_embeddings=False),
     _expected("transformer.h.0.", _GPT2_LAYER, "lm_head.weight", ["transformer.wte.weight", "transformer.wpe.weight"],
               ["transformer.ln_f.weight", "transformer.ln_f.bias"])),
    (lambda: _llama(tied=True),
     _expected("model.layers.0.", _LLAMA_LAYER, None, ["model.embed_tokens.weight"], ["model.norm.weight"])),
    (lambda: _llama(tied=False),
     _expected("model.layers.0.", _LLAMA_LAYER, "lm_head.weight", ["model.embed_tokens.weight"], ["model.norm.weight"])),
    (lambda: _neox(tied=False),
     _expected("gpt_neox.layers.0.", _NEOX_LAYER, "lm_head.weight", ["gpt_neox.embed_in.weight"],
               ["gpt_neox.final_layer_norm.weight", "gpt_neox.final_layer_norm.bias"])),
    (lambda: _neox(tied=True),
     _expected("gpt_neox.layers.0.", _NEOX_LAYER, None, ["gpt_neox.embed_in.weight"],
               ["gpt_neox.final_layer_norm.weight", "gpt_neox.final_layer_norm.bias"])),
], ids=["gpt2-tied", "gpt2-untied", "llama-tied", "llama-untied", "neox-untied", "neox-tied"])
def test_every_parameter_gets_its_role(make, expected):
    model = make()
    roles = param_roles(model)
    got = {role: sorted(n for n, r in roles.items() if r == role) for role in expected}
    assert got == {role: sorted(names) for role, names in expected.items()}
    assert set(roles) == {n for n, p in model.named_parameters()}  # every trainable parameter, each once


def test_frozen_parameters_have_no_role():
    model = make_tiny_gpt2(16, n_layer=1)
    model.transformer.wpe.weight.requires_grad_(False)
    assert "transformer.wpe.weight" not in param_roles(model)


_MULT = {"embedding": 16, "norm": 0.5, "bias": 2}


@pytest.mark.parametrize("name", ["adamw", "lion", "ademamix", "soap", "muon"])
def test_each_optimizer_builds_one_group_per_role_at_its_multiple_of_the_lr(name):
    model = make_tiny_gpt2(16, n_layer=1, tie_word_embeddings=False)
    opt = create_optimizer(name, model, lr=1e-3, weight_decay=0.1, lr_multipliers={**_MULT, "head": 4},
                           weight_decay_on="matrices")
    got = {g["lr_group"]: (g["lr"], g["weight_decay"], len(g["params"])) for g in opt.param_groups}
    assert got == {"embedding": (pytest.approx(1.6e-2), 0.0, 2), "head": (pytest.approx(4e-3), 0.0, 1),
                   "norm": (pytest.approx(5e-4), 0.0, 6), "bias": (pytest.approx(2e-3), 0.0, 4),
                   "matrix": (pytest.approx(1e-3), pytest.approx(0.1), 4)}
    assert len(opt.param_groups) == 5
    if name == "muon":  # the matrices on Muon, the rest on its AdamW part
        assert {g["lr_group"]: g["use_muon"] for g in opt.param_groups} == {
            "embedding": False, "head": False, "norm": False, "bias": False, "matrix": True}


def test_the_default_weight_decay_rule_and_muons_adamw_part_ratio_stay():
    model = make_tiny_gpt2(16, n_layer=1)
    opt = create_optimizer("adamw", model, lr=1e-3, weight_decay=0.1, lr_multipliers={"embedding": 8})
    got = {(g["lr_group"], g["weight_decay"]): g["lr"] for g in opt.param_groups}
    # the Trainer's rule: the embeddings decay, norms and biases do not
    assert got == {("embedding", 0.1): pytest.approx(8e-3), ("matrix", 0.1): 1e-3, ("norm", 0.0): 1e-3,
                   ("bias", 0.0): 1e-3}
    muon = create_optimizer("muon", model, lr=1e-2, weight_decay=0.1, adamw_lr_ratio=0.25,
                            lr_multipliers={"embedding": 2})
    lrs = {(g["lr_group"], g["use_muon"]): g["lr"] for g in muon.param_groups}
    assert lrs == {("matrix", True): 1e-2, ("embedding", False): pytest.approx(5e-3),
                   ("norm", False): pytest.approx(2.5e-3), ("bias", False): pytest.approx(2.5e-3)}


def test_without_the_options_the_groups_are_as_before():
    model = make_tiny_gpt2(16, n_layer=1)
    plain = create_optimizer("adamw", model, lr=1e-3, weight_decay=0.1)
    ones = create_optimizer("adamw", model, lr=1e-3, weight_decay=0.1, lr_multipliers={}, weight_decay_on="default")
    for opt in (plain, ones):
        assert [(g["lr"], g["weight_decay"], len(g["params"])) for g in opt.param_groups] == [(1e-3, 0.1, 6),
                                                                                            (1e-3, 0.0, 10)]
        assert all("lr_group" not in g for g in opt.param_groups)


@pytest.mark.parametrize("mult, wd_on, message", [
    ({"embed": 2}, "default",
     "lr_multipliers: unknown group 'embed'; groups: embedding, head, norm, bias, matrix, router"),
    ({"head": 0}, "default", "lr_multipliers.head: got 0; a finite number > 0"),
    ({"norm": -1.0}, "default", "lr_multipliers.norm: got -1.0; a finite number > 0"),
    ({"norm": True}, "default", "lr_multipliers.norm: got True; a finite number > 0"),
    ([2.0], "default", "lr_multipliers: got [2.0]; a mapping of group -> multiplier, groups: embedding, head, norm, "
                       "bias, matrix, router"),
    (None, "hidden", "weight_decay_on: got 'hidden'; one of default, matrices"),
])
def test_bad_options_are_refused_in_one_line(mult, wd_on, message):
    with pytest.raises(ConfigError) as err:
        check_group_options(mult, wd_on)
    assert str(err.value) == message
    with pytest.raises(ValueError, match="^" + message.split(":")[0]):  # and before training, in the arguments
        tiny_args("unused", optimizer="adamw", optimizer_kwargs={"lr_multipliers": mult, "weight_decay_on": wd_on})


def test_options_from_yaml_or_json_strings():
    assert parse_optimizer_kwargs("lion", '{"lr_multipliers": {"embedding": "16"}, "weight_decay_on": "matrices"}') == {
        "lr_multipliers": {"embedding": 16}, "weight_decay_on": "matrices"}


def test_regroup_keeps_each_groups_own_keys():
    net = torch.nn.Sequential(torch.nn.Embedding(4, 2), torch.nn.Linear(2, 2))
    named = list(net.named_parameters())
    groups = [{"params": named, "lr": 0.5, "weight_decay": 0.1, "use_muon": False}]
    out = regroup(groups, net, lr=1.0, lr_multipliers={"embedding": 4})
    assert [(g["lr_group"], g["lr"], g["weight_decay"], g["use_muon"], [n for n, _ in g["params"]]) for g in out] == [
        ("embedding", 2.0, 0.1, False, ["0.weight"]), ("bias", 0.5, 0.1, False, ["1.bias"]),
        ("matrix", 0.5, 0.1, False, ["1.weight"])]


class _Lrs(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.seen.append({g["lr_group"]: g["lr"] for g in optimizer.param_groups})


def _rows(n=32, vocab=64, length=16):
    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(0, vocab, (n, length), generator=gen).tolist()
    return Dataset.from_dict({"input_ids": rows, "labels": rows})


def test_a_plain_trainers_schedule_keeps_every_groups_ratio(tmp_path):
    args = TrainingArguments(str(tmp_path), learning_rate=2e-3, weight_decay=0.1, max_steps=4, warmup_steps=1,
                             lr_scheduler_type="cosine", per_device_train_batch_size=4, report_to=[], use_cpu=True,
                             save_strategy="no", disable_tqdm=True)
    lrs = _Lrs()
    factory = optimizer_cls_and_kwargs_for("adamw", args, lr_multipliers={"embedding": 16, "norm": 4})
    Trainer(make_tiny_gpt2(64, 16), args, train_dataset=_rows(), callbacks=[lrs], optimizer_cls_and_kwargs=factory).train()
    assert len(lrs.seen) == 4
    for seen in lrs.seen[:-1]:  # cosine ends at 0, where every ratio is 0/0
        assert seen["matrix"] > 0
        assert seen["embedding"] / seen["matrix"] == pytest.approx(16.0)
        assert seen["norm"] / seen["matrix"] == pytest.approx(4.0)
        assert seen["bias"] == pytest.approx(seen["matrix"])
    assert [s["matrix"] for s in lrs.seen[:3]] != [lrs.seen[0]["matrix"]] * 3  # the schedule moved


def _fast(tmp_path, tiny_lm, tiny_tokenizer, model_seed=0, **kw):
    args = tiny_args(tmp_path, max_steps=6, optimizer="muon", lr_decay="cosine", warmup_steps=2,
                     optimizer_kwargs={"lr_multipliers": {"embedding": 8, "norm": 2}, "weight_decay_on": "matrices"},
                     **kw)
    return FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer), seed=model_seed), args=args,
                       train_dataset=tiny_lm["train"], data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                       processing_class=tiny_tokenizer)


def test_fast_trainer_resumed_with_group_lrs_equals_a_straight_run(tiny_lm, tiny_tokenizer, tmp_path):
    save = dict(save_strategy="steps", save_steps=3)
    straight = _fast(tmp_path / "a", tiny_lm, tiny_tokenizer, **save)
    lrs = _Lrs()
    straight.add_callback(lrs)
    straight.train()
    for seen in lrs.seen[:-1]:  # FastTrainer's schedule multiplies each group's own peak
        assert seen["embedding"] / seen["matrix"] == pytest.approx(8.0)
        assert seen["norm"] / seen["matrix"] == pytest.approx(2.0)

    # the straight run's checkpoint-3 is what a run killed after step 3 leaves
    resumed = _fast(tmp_path / "b", tiny_lm, tiny_tokenizer, model_seed=123, **save)
    resumed.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))
    assert resumed.state.global_step == 6
    a, b = dict(straight.model.named_parameters()), dict(resumed.model.named_parameters())
    assert all(torch.allclose(a[n], b[n], rtol=1e-5, atol=1e-6) for n in a)
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [g["lr"] for g in straight.optimizer.param_groups]
    # negative controls: the checkpoint along the way differs from the end, and the multipliers change the result
    from safetensors.torch import load_file

    w3 = load_file(str(tmp_path / "a" / "checkpoint-3" / "model.safetensors"))
    assert not torch.equal(w3["transformer.wte.weight"], a["transformer.wte.weight"].detach())
    plain = FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), train_dataset=tiny_lm["train"],
                        args=tiny_args(tmp_path / "c", max_steps=6, optimizer="muon", lr_decay="cosine", warmup_steps=2),
                        data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                        processing_class=tiny_tokenizer)
    plain.train()
    assert not torch.allclose(dict(plain.model.named_parameters())["transformer.wte.weight"], a["transformer.wte.weight"])


def _train_logs(tmp_path, tiny_lm, tiny_tokenizer, optimizer, optimizer_kwargs):
    args = tiny_args(tmp_path, max_steps=4, learning_rate=1e-3, optimizer=optimizer, optimizer_kwargs=optimizer_kwargs,
                     lr_scheduler_type="linear")  # the Trainer's linear decay, no warmup: step s runs at (5 - s) / 4
    trainer = FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                          data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                          processing_class=tiny_tokenizer)
    trainer.train()
    return [h for h in trainer.state.log_history if "loss" in h]


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_each_groups_lr_is_logged_under_its_role_and_learning_rate_is_the_matrix_groups(
        optimizer, tiny_lm, tiny_tokenizer, tmp_path):
    mult = {"embedding": 16, "norm": 4, "bias": 0.5}
    logs = _train_logs(tmp_path, tiny_lm, tiny_tokenizer, optimizer, {"lr_multipliers": mult})
    assert [h["step"] for h in logs] == [1, 2, 3, 4]
    for h in logs:
        factor = (5 - h["step"]) / 4
        assert {k: v for k, v in h.items() if k.startswith("lr/")} == {
            "lr/embedding": pytest.approx(1e-3 * 16 * factor, rel=1e-12),
            "lr/norm": pytest.approx(1e-3 * 4 * factor, rel=1e-12),
            "lr/bias": pytest.approx(1e-3 * 0.5 * factor, rel=1e-12),
            "lr/matrix": pytest.approx(1e-3 * factor, rel=1e-12)}
        assert h["learning_rate"] == h["lr/matrix"]  # not the first group's (the embeddings')


def test_groups_without_roles_are_logged_by_the_roles_they_hold(tiny_lm, tiny_tokenizer, tmp_path):
    # Muon's AdamW part at a quarter of Muon's lr, no multipliers: the groups carry no role of their own
    logs = _train_logs(tmp_path, tiny_lm, tiny_tokenizer, "muon", {"adamw_lr_ratio": 0.25})
    first = logs[0]
    assert {k: v for k, v in first.items() if k.startswith("lr/")} == {
        "lr/embedding": pytest.approx(2.5e-4), "lr/norm": pytest.approx(2.5e-4), "lr/bias": pytest.approx(2.5e-4),
        "lr/matrix": pytest.approx(1e-3)}
    assert first["learning_rate"] == pytest.approx(1e-3)
    # one lr for every group: learning_rate says it all
    plain = _train_logs(tmp_path / "plain", tiny_lm, tiny_tokenizer, "adamw", {})
    assert not [k for k in plain[0] if k.startswith("lr/")] and plain[0]["learning_rate"] == pytest.approx(1e-3)
