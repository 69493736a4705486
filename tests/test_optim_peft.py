"""Muon's routing under peft: a head or embedding in `modules_to_save` is trained by AdamW through its
trainable copy (peft's `ModulesToSaveWrapper`), LoRA's lora_A / lora_B by Muon; a few steps move them all."""

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from hf_fasttrain.optim import create_optimizer, muon_routing

from conftest import make_tiny_gpt2

peft = pytest.importorskip("peft")

GPT2_LORA = ["attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"]
LLAMA_LORA = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
              "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"]


def _tiny_gpt2_lora(modules_to_save):
    model = make_tiny_gpt2(64, 16)
    lora = peft.LoraConfig(r=4, target_modules=["c_attn", "c_proj", "c_fc"], modules_to_save=modules_to_save,
                           fan_in_fan_out=True)  # GPT-2's Conv1D stores weights as in x out
    return peft.get_peft_model(model, lora)


def _tiny_llama_lora(modules_to_save):
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16,
                         bos_token_id=0, eos_token_id=0, pad_token_id=0)
    lora = peft.LoraConfig(r=4, target_modules=[n.split(".")[1] for n in LLAMA_LORA],
                           modules_to_save=modules_to_save)
    return peft.get_peft_model(LlamaForCausalLM(config), lora)


def _lora_routes(prefix, layers):
    return {f"base_model.model.{prefix}.{i}.{m}.lora_{ab}.default.weight": "muon"
            for i in range(2) for m in layers for ab in "AB"}


def _copy(path):
    return {f"base_model.model.{path}.modules_to_save.default.weight": "adamw"}


# (model, modules_to_save) -> the route of every trainable parameter
CASES = [
    ("gpt2", ["lm_head"], {**_lora_routes("transformer.h", GPT2_LORA), **_copy("lm_head")}),
    ("gpt2", ["wte"], {**_copy("transformer.wte"), **_lora_routes("transformer.h", GPT2_LORA)}),
    ("gpt2", ["lm_head", "wte"],
     {**_copy("transformer.wte"), **_lora_routes("transformer.h", GPT2_LORA), **_copy("lm_head")}),
    ("llama", ["lm_head"], {**_lora_routes("model.layers", LLAMA_LORA), **_copy("lm_head")}),
    ("llama", ["lm_head", "embed_tokens"],
     {**_copy("model.embed_tokens"), **_lora_routes("model.layers", LLAMA_LORA), **_copy("lm_head")}),
]
BUILD = {"gpt2": _tiny_gpt2_lora, "llama": _tiny_llama_lora}


@pytest.mark.parametrize("arch, modules_to_save, expected", CASES, ids=[f"{a}-{'+'.join(m)}" for a, m, _ in CASES])
def test_muon_routes_modules_to_save_copies_to_adamw_and_lora_to_muon(arch, modules_to_save, expected):
    model = BUILD[arch](modules_to_save)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert sorted(trainable) == sorted(expected)
    assert muon_routing(model) == expected
    # create_optimizer builds its groups from the same routing
    opt = create_optimizer("muon", model, lr=1e-2, weight_decay=0.0)
    by_route = {n: ("muon" if g["use_muon"] else "adamw") for g in opt.param_groups for n in g["param_names"]}
    assert by_route == expected


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_muon_steps_move_lora_and_the_head_copy_only(arch):
    model = BUILD[arch](["lm_head"])
    opt = create_optimizer("muon", model, lr=1e-2, weight_decay=0.0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.tensor([[1, 5, 9, 13, 2, 6, 10, 14], [3, 7, 11, 15, 4, 8, 12, 16]])
    for _ in range(3):  # lora_B starts at zero, so lora_A has no gradient before the first step
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    changed = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert changed == trainable  # every LoRA matrix and the head copy moved; the frozen base did not
    head = "base_model.model.lm_head.modules_to_save.default.weight"
    assert any(n.endswith("lora_B.default.weight") for n in changed) and head in changed
    adamw = [g for g in opt.param_groups if not g["use_muon"]]
    assert [n for g in adamw for n in g["param_names"]] == [head]
    assert [type(o).__name__ for o in opt.inner_optimizers] == ["Muon", "AdamW"]
    assert "exp_avg_sq" in opt.state[dict(model.named_parameters())[head]]  # AdamW state, not Muon's momentum


class _Wrapper(nn.Module):
    """The two attributes peft's ModulesToSaveWrapper has, without peft."""

    def __init__(self, module):
        super().__init__()
        self.original_module = module
        self.modules_to_save = nn.ModuleDict({"default": nn.Linear(module.in_features, module.out_features, bias=False)})
        self.original_module.weight.requires_grad_(False)

    def forward(self, x):
        return self.modules_to_save["default"](x)


class _TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(8, 4)
        self.hidden = nn.Linear(4, 4)
        self.head = _Wrapper(nn.Linear(4, 8, bias=False))

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.head


def test_wrapper_is_detected_by_its_attributes():
    assert muon_routing(_TinyLM()) == {
        "embed.weight": "adamw", "hidden.weight": "muon", "hidden.bias": "adamw",
        "head.modules_to_save.default.weight": "adamw",
    }


def test_hyperball_refuses_lora_b_before_a_step_and_takes_lora_a_alone():
    """LoRA's lora_B starts at zero: Hyperball would hold it there, so it is refused by name before training;
    with lora_B routed to AdamW, Hyperball holds lora_A's vectors at their norms while the adapter trains."""
    model = _tiny_gpt2_lora(None)
    with pytest.raises(ValueError) as err:
        create_optimizer("muon", model, lr=1e-2, hyperball=True)
    assert "\n" not in str(err.value) and "lora_B" in str(err.value) and "hyperball: false" in str(err.value)
    opt = create_optimizer("muon", model, lr=1e-2, hyperball=True, adamw_patterns=(r"lora_B",))
    a = dict(model.named_parameters())["base_model.model.transformer.h.0.attn.c_attn.lora_A.default.weight"]
    b = dict(model.named_parameters())["base_model.model.transformer.h.0.attn.c_attn.lora_B.default.weight"]
    norms, b0 = a.detach().norm(dim=0), b.detach().clone()
    batch = torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        model(input_ids=batch, labels=batch).loss.backward()
        opt.step()
        opt.zero_grad()
    torch.testing.assert_close(a.detach().norm(dim=0), norms, rtol=1e-5, atol=0)  # nn.Linear: columns
    assert float((b.detach() - b0).abs().max()) > 0  # lora_B trains (AdamW)
