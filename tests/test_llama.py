"""Any decoder from the model: section, checked on a tiny Llama with grouped-query attention (4 query
heads, 2 key/value heads): the config and its size keys, Muon's routing, packing, sequence-length
warmup, the divergence guard and the FLOP count."""

import math

import pytest
import torch
from transformers import DataCollatorWithFlattening

from hf_fasttrain import FastTrainer, ModelArguments
from hf_fasttrain.callbacks.stability import DivergenceGuardCallback
from hf_fasttrain.data import PackedRowsCollator
from hf_fasttrain.modeling import build_model, decoder_config, default_intermediate_size
from hf_fasttrain.optim import create_optimizer
from hf_fasttrain.optim.muon import muon_routing
from hf_fasttrain.config.recipes import bundled_recipes, load_recipe, parse_config, validate_recipe
from hf_fasttrain.throughput import flops_per_token
from hf_fasttrain.throughput import model_dims as _model_dims

from conftest import TINY_BLOCK, make_tiny_trainer, tiny_args

LLAMA = dict(model_type="llama", n_layer=2, n_head=4, n_embd=32, num_key_value_heads=2)


class _Tok:
    """What build_model reads from a tokenizer."""

    def __init__(self, n=300):
        self.n, self.bos_token_id, self.eos_token_id, self.pad_token_id = n, 1, 1, 0

    def __len__(self):
        return self.n


def tiny_llama(vocab_size=300, seed=0, **kw):
    torch.manual_seed(seed)
    return build_model(ModelArguments(**{**LLAMA, **kw}), _Tok(vocab_size), TINY_BLOCK)


# ------------------------------------------------------------------------------------------ the config


@pytest.mark.parametrize("kwargs, expected", [
    ({}, (12, 12, 768)),  # GPT-2 small by default
    (dict(n_layer=3, n_head=2, n_embd=64), (3, 2, 64)),
    (dict(num_hidden_layers=3, num_attention_heads=2, hidden_size=64), (3, 2, 64)),
    (dict(n_layer=3, num_attention_heads=2, hidden_size=64, num_hidden_layers=3), (3, 2, 64)),  # agreeing: fine
])
def test_size_keys_have_two_spellings(kwargs, expected):
    m = ModelArguments(**kwargs)
    assert (m.n_layer, m.n_head, m.n_embd) == expected
    assert (m.num_hidden_layers, m.num_attention_heads, m.hidden_size) == expected


@pytest.mark.parametrize("model_type, hidden, expected", [
    ("gpt2", 128, 512), ("llama", 32, 128), ("llama", 128, 384), ("llama", 192, 512), ("llama", 768, 2048),
    ("qwen2", 768, 2048), ("mistral", 320, 896),
])
def test_default_mlp_width(model_type, hidden, expected):
    assert default_intermediate_size(model_type, hidden) == expected


@pytest.mark.parametrize("model_type, cls_name", [
    ("llama", "LlamaForCausalLM"), ("qwen2", "Qwen2ForCausalLM"), ("mistral", "MistralForCausalLM"),
])
def test_gqa_families_build_with_the_sizes_asked(model_type, cls_name):
    model = tiny_llama(model_type=model_type, intermediate_size=48)
    cfg = model.config
    assert type(model).__name__ == cls_name
    assert (cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads, cfg.hidden_size,
            cfg.intermediate_size, cfg.vocab_size, cfg.max_position_embeddings) == (2, 4, 2, 32, 48, 300, TINY_BLOCK)
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.weight.shape == (32, 32) and attn.k_proj.weight.shape == (16, 32)  # 2 kv heads of 8
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (48, 32)


def test_gpt2_sizes_through_either_spelling_and_extra_attributes():
    model = build_model(ModelArguments(num_hidden_layers=1, hidden_size=48, num_attention_heads=3,
                                       model_config={"activation_function": "relu"}), _Tok(), TINY_BLOCK)
    assert type(model).__name__ == "GPT2LMHeadModel"
    assert (model.config.n_layer, model.config.n_embd, model.config.n_head, model.config.n_inner) == (1, 48, 3, 192)
    assert model.config.activation_function == "relu"


def test_model_config_reaches_the_family_config():
    cfg = decoder_config("llama", vocab_size=64, num_hidden_layers=1, num_attention_heads=2, hidden_size=16,
                         max_position_embeddings=8, extra={"tie_word_embeddings": True, "rms_norm_eps": 1e-5, "rope_theta": 5e3})
    assert cfg.tie_word_embeddings is True and cfg.rms_norm_eps == 1e-5 and cfg.num_key_value_heads == 2
    assert cfg.rope_parameters["rope_theta"] == 5e3  # the older spelling, converted by transformers


@pytest.mark.parametrize("kwargs, names", [
    (dict(model_type="lama"), ["model_type: got 'lama'", "'llama'"]),
    (dict(model_type="llama", model_config={"rms_norm_ep": 1.0}), ["model_config.rms_norm_ep", "'rms_norm_eps'", "known:"]),
    (dict(model_type="llama", model_config={"hidden_size": 8}), ["model_config.hidden_size", "n_embd/hidden_size"]),
    (dict(n_layer=2, num_hidden_layers=3), ["n_layer: got 2, but num_hidden_layers got 3;"]),
    (dict(model_type="llama", n_head=4, n_embd=32, num_key_value_heads=3), ["num_key_value_heads: got 3", "n_head=4"]),
])
def test_bad_model_settings_name_the_field(kwargs, names):
    with pytest.raises(ValueError) as e:
        ModelArguments(**kwargs)
    for n in names:
        assert n in str(e.value)


def test_gqa_on_a_family_without_it_is_refused():
    with pytest.raises(ValueError, match="num_key_value_heads: got 2, but model_type='gpt2' has no grouped-query attention"):
        build_model(ModelArguments(n_layer=1, n_head=4, n_embd=32, num_key_value_heads=2), _Tok(), TINY_BLOCK)


def test_unknown_model_key_in_a_recipe_is_refused_with_the_known_ones():
    with pytest.raises(ValueError) as e:
        validate_recipe({"model": {"model_type": "llama", "num_layers": 2}})
    msg = str(e.value)
    assert msg.startswith("num_layers: unknown recipe key") and "known:" in msg
    assert "num_hidden_layers" in msg and "num_key_value_heads" in msg and "model_config" in msg


def test_command_line_size_under_the_other_spelling_overrides_the_recipe(tmp_path):
    m, _, _ = parse_config(["--config", "gpt2_tiny", "--output_dir", str(tmp_path), "--hidden_size", "64"])
    assert (m.n_embd, m.hidden_size, m.n_layer) == (64, 64, 2)
    m, _, _ = parse_config(["--config", "llama_tiny", "--output_dir", str(tmp_path), "--n_layer", "3",
                            "--model_config", '{"rope_theta": 5000, "tie_word_embeddings": false}'])
    assert (m.num_hidden_layers, m.model_config) == (3, {"rope_theta": 5000, "tie_word_embeddings": False})
    with pytest.raises(ValueError) as err:
        parse_config(["--config", "gpt2_tiny", "--output_dir", str(tmp_path), "--n_layer", "3",
                      "--num_hidden_layers", "4"])
    assert str(err.value) == ("n_layer: got 3, but num_hidden_layers got 4; they are the same setting: give one of "
                              "n_layer, num_hidden_layers")


def test_bundled_llama_recipes_parse(tmp_path):
    assert {"llama_tiny", "llama_small"} <= set(bundled_recipes())
    m, d, t = parse_config(["--config", "llama_tiny", "--output_dir", str(tmp_path)])
    assert (m.model_type, m.n_layer, m.n_head, m.num_key_value_heads) == ("llama", 2, 4, 2)
    small = validate_recipe(load_recipe("llama_small"))["model"]
    assert small["model_type"] == "llama" and small["num_hidden_layers"] == 12 and small["hidden_size"] == 768


# ------------------------------------------------------------------------------- Muon, FLOPs, packing


def test_muon_routes_llama_hidden_matrices_only():
    model = tiny_llama()
    routing = muon_routing(model)
    muon = sorted(n for n, r in routing.items() if r == "muon")
    expected = sorted(f"model.layers.{i}.{m}.weight" for i in range(2) for m in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"))
    assert muon == expected
    adamw = sorted(n for n, r in routing.items() if r == "adamw")
    assert adamw == sorted(["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
                           + [f"model.layers.{i}.{n}.weight" for i in range(2)
                              for n in ("input_layernorm", "post_attention_layernorm")])
    opt = create_optimizer("muon", model, lr=1e-2)
    in_muon = {n for g in opt.param_groups if g["use_muon"] for n in g["param_names"]}
    assert in_muon == set(expected)


@pytest.mark.parametrize("tied", [False, True])
def test_flop_count_for_llama(tied):
    model = tiny_llama(model_config={"tie_word_embeddings": tied})
    n_params, n_layer, width = _model_dims(model)
    per_layer = 32 * 32 * 2 + 32 * 16 * 2 + 3 * 32 * 128 + 2 * 32  # q,o + k,v (GQA) + gated MLP + 2 norms
    expected = 2 * per_layer + 32 + 300 * 32  # + final norm + the head (the untied input table is a lookup)
    assert (n_params, n_layer, width) == (expected, 2, 32)
    total = sum(p.numel() for p in model.parameters())
    assert total == expected + (0 if tied else 300 * 32)
    assert flops_per_token(n_params, n_layer, width, 32) == 6 * expected + 12 * 2 * 32 * 32


DOCS = [[5, 6, 7, 8, 9], [11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33, 34, 35, 36]]


def _separate(model, docs):
    with torch.no_grad():
        return [model(torch.tensor([d]), use_cache=False).logits[0] for d in docs]


@pytest.mark.slow
def test_packed_llama_logits_equal_separate_runs():
    model = tiny_llama().eval()
    separate = _separate(model, DOCS)
    flat = DataCollatorWithFlattening()([{"input_ids": d} for d in DOCS])
    rows = PackedRowsCollator(row_len=12, num_rows=2, pad_token_id=0, return_seq_idx=True)(
        [{"input_ids": d} for d in DOCS])
    with torch.no_grad():
        out = model(input_ids=flat["input_ids"], position_ids=flat["position_ids"], use_cache=False).logits
        packed = model(input_ids=rows["input_ids"], position_ids=rows["position_ids"], use_cache=False).logits
    start = 0
    for d, ref in zip(DOCS, separate):
        torch.testing.assert_close(out[0, start : start + len(d)], ref, atol=1e-5, rtol=1e-5)
        start += len(d)
    seen = set()
    for row in range(2):
        for k in range(len(DOCS)):
            where = (rows["seq_idx"][row] == k).nonzero().flatten()
            if len(where):
                torch.testing.assert_close(packed[row, where], separate[k], atol=1e-5, rtol=1e-5)
                seen.add(k)
    assert seen == set(range(len(DOCS)))
    # negative control: without the restarting positions the documents attend to each other
    with torch.no_grad():
        leaky = model(input_ids=flat["input_ids"], use_cache=False).logits
    assert not torch.allclose(leaky[0, 5:8], separate[1], atol=1e-3)


# ------------------------------------------------------------------------------ FastTrainer on Llama


def _trainer(tiny_tokenizer, tiny_lm, args, cls=FastTrainer):
    return make_tiny_trainer(tiny_tokenizer, tiny_lm, args, model=tiny_llama(len(tiny_tokenizer)), cls=cls)


@pytest.mark.slow
def test_seq_len_warmup_and_muon_train_a_llama(tiny_lm, tiny_tokenizer, tmp_path):
    # as tests/test_seqlen_trainer.py: 32-token rows, 4 per step, warmup 8 -> 32 over 3 batches
    # a token budget of 6 full-length steps (768 tokens), which the shorter early rows spread over 8 steps
    args = tiny_args(tmp_path, max_steps=-1, max_tokens=6 * 4 * 32, per_device_train_batch_size=4, seq_len_warmup_min=8,
                     seq_len_warmup_fraction=0.5, include_num_input_tokens_seen="all", optimizer="muon",
                     learning_rate=1e-2)
    trainer = _trainer(tiny_tokenizer, tiny_lm, args)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    assert [e["seq_len"] for e in logs] == [8, 16, 24, 32, 32, 32, 32, 32]
    assert [e["num_input_tokens_seen"] for e in logs] == [32, 96, 192, 320, 448, 576, 704, 832]
    assert all(not torch.equal(before[n], p) for n, p in trainer.model.named_parameters())
    assert logs[-1]["loss"] < logs[0]["loss"] - 0.5


class _NaNAt(FastTrainer):
    """Makes the loss (and so every gradient) NaN on the given optimizer steps."""

    nan_steps: tuple = ()

    def compute_loss(self, model, inputs, *args, **kwargs):
        out = super().compute_loss(model, inputs, *args, **kwargs)
        if self.state.global_step + 1 in self.nan_steps:
            out = out * float("nan") if not isinstance(out, tuple) else (out[0] * float("nan"), *out[1:])
        return out


@pytest.mark.slow
def test_divergence_guard_skips_a_nan_step_on_llama(tiny_lm, tiny_tokenizer, tmp_path):
    kw = dict(max_steps=8, learning_rate=3e-3, divergence_guard=True, guard_snapshot_every=2)

    def run(name, guard):
        cls = type("T", (_NaNAt,), {"nan_steps": (5,)})
        trainer = _trainer(tiny_tokenizer, tiny_lm, tiny_args(tmp_path / name, **{**kw, "divergence_guard": guard}), cls)
        trainer.train()
        return trainer

    guarded = run("guarded", True)
    g = next(c for c in guarded.callback_handler.callbacks if isinstance(c, DivergenceGuardCallback))
    assert [(e["step"], e["kind"]) for e in g.events] == [(5, "skip")]
    assert all(torch.isfinite(p).all() for p in guarded.model.parameters())
    # negative control: the same NaN without the guard ruins the weights
    plain = run("plain", False)
    assert not all(torch.isfinite(p).all() for p in plain.model.parameters())
    assert math.isfinite(guarded.state.log_history[-2]["loss"])
