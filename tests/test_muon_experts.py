"""Muon on mixture-of-experts models: routing of every parameter, the batched expert step against per-expert
2-D steps, the expert layouts, refusals and the unrecognised-parameter warning."""

import re
import warnings

import pytest
import torch
from torch import nn

from hf_fasttrain.optim import MuonWithAdamW, create_optimizer
from hf_fasttrain.optim.experts import ExpertLayout, expert_layouts, expert_matrices, expert_tensor
from hf_fasttrain.optim.muon import muon_route_table, muon_routing

LAYOUTS = [ExpertLayout(), ExpertLayout(gate_up="concatenated"), ExpertLayout(True), ExpertLayout(True, "interleaved"),
           ExpertLayout(False, "interleaved"), ExpertLayout(True, "concatenated")]


# --- the layouts ------------------------------------------------------------------------------------------


def test_expert_matrices_are_the_matrices_separate_linears_would_hold():
    w = torch.arange(3 * 4 * 6.0).reshape(3, 4, 6)  # 3 experts
    # experts x out x in: expert e's matrix is w[e]
    m = expert_matrices(w, ExpertLayout())
    assert m.shape == (3, 4, 6) and torch.equal(m[2], w[2])
    # [gate; up] along out: gate of expert 1 = rows 0..1, up = rows 2..3, at indices 2 and 3
    m = expert_matrices(w, ExpertLayout(gate_up="concatenated"))
    assert m.shape == (6, 2, 6) and torch.equal(m[2], w[1, :2]) and torch.equal(m[3], w[1, 2:])
    # GPT-OSS: experts x in x out, gate = [..., ::2], up = [..., 1::2]; matrices as (out, in)
    m = expert_matrices(w, ExpertLayout(True, "interleaved"))
    assert m.shape == (6, 3, 4) and torch.equal(m[2], w[1, :, ::2].T) and torch.equal(m[5], w[2, :, 1::2].T)
    m = expert_matrices(w, ExpertLayout(True))
    assert m.shape == (3, 6, 4) and torch.equal(m[1], w[1].T)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_expert_tensor_inverts_expert_matrices(layout):
    w = torch.randn(3, 4, 6)
    assert torch.equal(expert_tensor(expert_matrices(w, layout), w.shape, layout), w)


def test_bad_layouts_are_refused_naming_the_key():
    with pytest.raises(ValueError, match="expert_gate_up must be None or one of"):
        ExpertLayout(gate_up="fused")
    with pytest.raises(ValueError, match="even output size"):
        expert_matrices(torch.zeros(2, 3, 4), ExpertLayout(gate_up="concatenated"))


# --- the batched expert step equals per-expert 2-D steps -----------------------------------------------------


def _step_pair(layout, options, steps=3, shape=(4, 12, 8), ns_batched=True):
    """A 3-D expert tensor stepped by Muon, and its expert matrices as separate 2-D params stepped by Muon's 2-D
    path (`ns_batched`: pooled in one batched Newton-Schulz, or one `newton_schulz` per matrix); returns
    (3-D result, the 2-D results as a 3-D tensor)."""
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(shape, generator=gen)
    grads = [torch.randn(shape, generator=gen) for _ in range(steps)]
    p3 = nn.Parameter(w.clone())
    mats = [nn.Parameter(m.contiguous().clone()) for m in expert_matrices(w, layout)]  # as nn.Linear weights
    kw = dict(lr=0.05, weight_decay=0.1, ns_dtype="float32", **options)
    opt3 = MuonWithAdamW([{"params": [p3], "use_muon": True, **layout.group_keys()}], **kw)
    opt2 = MuonWithAdamW([{"params": mats, "use_muon": True}], ns_batched=ns_batched, **kw)
    for g in grads:
        p3.grad = g.clone()
        for m, gm in zip(mats, expert_matrices(g, layout)):
            m.grad = gm.contiguous()
        opt3.step()
        opt2.step()
    per_expert = expert_tensor(torch.stack([m.detach() for m in mats]), shape, layout)
    assert not torch.equal(p3.detach(), w)  # the steps moved the weights
    return p3.detach(), per_expert


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("options", [{}, {"cautious_wd": True}, {"ns_coefficients": "polar_express"},
                                     {"nesterov": False, "adjust_lr_fn": "original"}])
def test_batched_expert_step_equals_per_expert_steps_exactly(layout, options):
    # the same 2-D matrices as separate params, Muon's 2-D path: bit for bit
    batched, per_expert = _step_pair(layout, options)
    assert torch.equal(batched, per_expert)
    # against one `newton_schulz` per matrix: a batched matmul (bmm) and a plain one (mm) may take different
    # CPU kernels for small matrices (6 x 8 here: up to 2e-6 apart after Newton-Schulz in fp32), so 1e-5
    batched, per_expert = _step_pair(layout, options, ns_batched=False)
    torch.testing.assert_close(batched, per_expert, rtol=1e-5, atol=1e-5)


def test_batched_expert_step_equals_per_expert_steps_in_bf16():
    layout = ExpertLayout(gate_up="concatenated")
    gen = torch.Generator().manual_seed(1)
    w, g = torch.randn(4, 12, 8, generator=gen), torch.randn(4, 12, 8, generator=gen)
    p3, mats = nn.Parameter(w.clone()), [nn.Parameter(m.clone()) for m in expert_matrices(w, layout)]
    opt3 = MuonWithAdamW([{"params": [p3], "use_muon": True, **layout.group_keys()}], lr=0.05, ns_dtype="bfloat16")
    opt2 = MuonWithAdamW([{"params": mats, "use_muon": True}], lr=0.05, ns_dtype="bfloat16")
    p3.grad = g
    for m, gm in zip(mats, expert_matrices(g, layout)):
        m.grad = gm.contiguous()
    opt3.step()
    opt2.step()
    assert torch.equal(p3.detach(), expert_tensor(torch.stack([m.detach() for m in mats]), w.shape, layout))


@pytest.mark.parametrize("layout", [ExpertLayout(), ExpertLayout(True, "interleaved")])
def test_normuon_expert_step_equals_per_expert_steps(layout):
    # NorMuon's Frobenius norms: one reduction over a whole matrix (2-D) against one per matrix of a stack
    # (vector_norm over the last two dims); the summation order may differ in the last bit, so 1e-6 relative.
    batched, per_expert = _step_pair(layout, {"normuon_beta2": 0.95})
    torch.testing.assert_close(batched, per_expert, rtol=1e-6, atol=1e-7)


def test_the_scale_is_the_expert_matrix_own_shape():
    # one step from zero momentum, no decay: the change is lr * 0.2 sqrt(max(out, in)) * NS(g) per expert matrix;
    # gate and up halves of 2*6 x 20 are 6 x 20 each: scale 0.2 sqrt(20), not that of the fused 12 x 20
    layout = ExpertLayout(gate_up="concatenated")
    w = torch.zeros(2, 12, 20)
    p = nn.Parameter(w.clone())
    p.grad = torch.randn(2, 12, 20, generator=torch.Generator().manual_seed(0))
    opt = MuonWithAdamW([{"params": [p], "use_muon": True, **layout.group_keys()}], lr=0.1, weight_decay=0.0,
                        nesterov=False, ns_dtype="float32")
    opt.step()
    from hf_fasttrain.optim import newton_schulz

    ns = torch.stack([newton_schulz((1 - 0.95) * m, ns_dtype="float32") for m in expert_matrices(p.grad, layout)])
    expected = expert_tensor(-0.1 * 0.2 * 20 ** 0.5 * ns, w.shape, layout)
    torch.testing.assert_close(p.detach(), expected, rtol=1e-6, atol=1e-7)


def test_expert_groups_need_3d_and_2d_groups_refuse_3d():
    with pytest.raises(ValueError, match=r"must be 2-D matrices, got 'w' with shape \(2, 3, 4\).*'experts': True"):
        MuonWithAdamW([{"params": [("w", nn.Parameter(torch.zeros(2, 3, 4)))], "use_muon": True}])
    with pytest.raises(ValueError, match=r"must be 3-D expert tensors"):
        MuonWithAdamW([{"params": [nn.Parameter(torch.zeros(3, 4))], "use_muon": True, "experts": True}])
    with pytest.raises(ValueError, match="hyperball does not support mixture-of-experts tensors"):
        MuonWithAdamW([{"params": [nn.Parameter(torch.ones(2, 3, 4))], "use_muon": True, "experts": True}],
                      hyperball=True)


def test_expert_state_round_trip_resumes_exactly():
    layout = ExpertLayout(True, "interleaved")
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(3, 8, 10, generator=gen)
    grads = [torch.randn(3, 8, 10, generator=gen) for _ in range(2)]

    def make(data):
        p = nn.Parameter(data.clone())
        return p, MuonWithAdamW([{"params": [p], "use_muon": True, **layout.group_keys()}], lr=0.05,
                                normuon_beta2=0.9, ns_dtype="float32")

    p, opt = make(w)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    q, first = make(w)
    q.grad = grads[0].clone()
    first.step()
    r, resumed = make(q.detach())
    resumed.load_state_dict(first.state_dict())
    assert resumed.param_groups[0]["expert_gate_up"] == "interleaved"
    r.grad = grads[1].clone()
    resumed.step()
    assert torch.equal(r.detach(), p.detach()) and not torch.equal(q.detach(), p.detach())


# --- routing over the MoE families of transformers -------------------------------------------------------------


_TINY = dict(hidden_size=32, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=128, num_experts=4,
             num_local_experts=4, n_routed_experts=4, num_experts_per_tok=2, shared_expert_intermediate_size=16,
             max_position_embeddings=64, first_k_dense_replace=0, q_lora_rank=16, kv_lora_rank=16,
             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, n_group=1, topk_group=1, pad_token_id=0,
             bos_token_id=0, eos_token_id=1)


def _tiny(family: str):
    """A tiny model of `family` (hidden 32, 2 layers, 4 experts, top-2), built offline."""
    from transformers import CONFIG_MAPPING, AutoModel, AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    torch.manual_seed(0)
    auto = AutoModelForCausalLM if family in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModel  # (Mistral 4: base)
    return auto.from_config(CONFIG_MAPPING[family](**_TINY))


def _layer0(table):
    """Layer 0's routes plus the embeddings and head, with the layer prefix cut to `L0.` and norms left out."""
    out = {}
    for name, (route, rule) in table.items():
        if ".layers.1." in name or "norm" in name:
            continue
        out[re.sub(r"^.*\.layers\.0\.", "L0.", name)] = f"{route}:{rule}"
    return out


_EMBED_HEAD = {"model.embed_tokens.weight": "adamw:embedding", "lm_head.weight": "adamw:embedding"}
_ATTN = {f"L0.self_attn.{k}_proj.weight": "muon:matrix" for k in "qkvo"}
_ATTN_BIAS = {f"L0.self_attn.{k}_proj.bias": "adamw:vector" for k in "qkv"}
_EXPERTS = {"L0.mlp.experts.gate_up_proj": "muon_experts:experts", "L0.mlp.experts.down_proj": "muon_experts:experts"}

ROUTING = {
    "mixtral": {**_EMBED_HEAD, **_ATTN, **_EXPERTS, "L0.mlp.gate.weight": "adamw:router"},
    "qwen3_moe": {**_EMBED_HEAD, **_ATTN, **_EXPERTS, "L0.mlp.gate.weight": "adamw:router"},
    "olmoe": {**_EMBED_HEAD, **_ATTN, **_EXPERTS, "L0.mlp.gate.weight": "adamw:router"},
    "qwen2_moe": {
        **_EMBED_HEAD, **_ATTN, **_ATTN_BIAS, **_EXPERTS, "L0.mlp.gate.weight": "adamw:router",
        "L0.mlp.shared_expert.gate_proj.weight": "muon:matrix", "L0.mlp.shared_expert.up_proj.weight": "muon:matrix",
        "L0.mlp.shared_expert.down_proj.weight": "muon:matrix",
        "L0.mlp.shared_expert_gate.weight": "adamw:vector",  # 1 x hidden
    },
    "jetmoe": {  # tied head
        "model.embed_tokens.weight": "adamw:embedding", "L0.mlp.input_linear.weight": "muon_experts:experts",
        "L0.mlp.output_linear.weight": "muon_experts:experts", "L0.mlp.router.layer.weight": "adamw:router",
        "L0.mlp.bias": "adamw:vector", "L0.self_attention.kv_proj.weight": "muon:matrix",
        "L0.self_attention.experts.input_linear.weight": "muon_experts:experts",
        "L0.self_attention.experts.output_linear.weight": "muon_experts:experts",
        "L0.self_attention.experts.router.layer.weight": "adamw:router", "L0.self_attention.experts.bias": "adamw:vector",
    },
    "gpt_oss": {
        **_EMBED_HEAD, **_ATTN, **_ATTN_BIAS, **_EXPERTS, "L0.self_attn.o_proj.bias": "adamw:vector",
        "L0.self_attn.sinks": "adamw:vector", "L0.mlp.router.weight": "adamw:router",
        "L0.mlp.router.bias": "adamw:vector", "L0.mlp.experts.gate_up_proj_bias": "adamw:expert vector",
        "L0.mlp.experts.down_proj_bias": "adamw:expert vector",
    },
}


@pytest.mark.parametrize("family", sorted(ROUTING))
def test_routing_table_of_moe_families(family):
    model = _tiny(family)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no unrecognised parameter in these families
        routing = muon_routing(model)
    assert _layer0(muon_route_table(model)) == ROUTING[family]
    assert set(routing.values()) == {"muon", "muon_experts", "adamw"}


def test_gpt_oss_per_expert_biases_take_the_bias_role():
    from hf_fasttrain.optim.groups import param_roles, regroup

    model = _tiny("gpt_oss")
    roles = param_roles(model)
    names = [n for n in roles if n.startswith("model.layers.0.mlp.experts.")]
    assert {n: roles[n] for n in names} == {
        "model.layers.0.mlp.experts.gate_up_proj": "matrix", "model.layers.0.mlp.experts.gate_up_proj_bias": "bias",
        "model.layers.0.mlp.experts.down_proj": "matrix", "model.layers.0.mlp.experts.down_proj_bias": "bias"}
    params = dict(model.named_parameters())
    groups = regroup([{"params": list(params.items()), "weight_decay": 0.1}], model, lr=1e-3,
                     lr_multipliers={"bias": 0.5}, weight_decay_on="matrices")
    bias = params["model.layers.0.mlp.experts.gate_up_proj_bias"]
    group = next(g for g in groups if any(p is bias for _, p in g["params"]))
    assert (group["lr"], group["weight_decay"]) == (5e-4, 0.0)


def test_expert_layouts_of_the_families():
    # GPT-OSS stores experts x in x out with gate and up interleaved; the others experts x out x in, [gate; up]
    assert expert_layouts(_tiny("gpt_oss"))["model.layers.0.mlp.experts.gate_up_proj"] == ExpertLayout(True, "interleaved")
    assert expert_layouts(_tiny("gpt_oss"))["model.layers.0.mlp.experts.down_proj"] == ExpertLayout(True, None)
    layouts = expert_layouts(_tiny("mixtral"))
    assert layouts["model.layers.1.mlp.experts.gate_up_proj"] == ExpertLayout(False, "concatenated")
    assert layouts["model.layers.1.mlp.experts.down_proj"] == ExpertLayout(False, None)


def test_llama4_and_dbrx_experts_are_split_per_expert_and_their_routers_are_routers():
    llama4 = _tiny_family("llama4_text")
    layouts = expert_layouts(llama4)  # experts x in x out, [gate; up] along out (chunk(2, dim=-1))
    assert layouts["model.layers.0.feed_forward.experts.gate_up_proj"] == ExpertLayout(True, "concatenated")
    assert layouts["model.layers.0.feed_forward.experts.down_proj"] == ExpertLayout(True)
    table = _layer0(muon_route_table(llama4))
    assert table["L0.feed_forward.router.weight"] == "adamw:router"
    assert table["L0.feed_forward.shared_expert.gate_proj.weight"] == "muon:matrix"
    dbrx = _tiny_family("dbrx")
    layouts = expert_layouts(dbrx)  # (experts x inter) x hidden, w2 in x out per expert
    mlp = "transformer.blocks.0.ffn.experts.mlp"
    assert [layouts[f"{mlp}.{w}"] for w in ("w1", "v1", "w2")] == [ExpertLayout(flat=4), ExpertLayout(flat=4),
                                                                     ExpertLayout(True, flat=4)]
    table = muon_route_table(dbrx)
    assert table["transformer.blocks.0.ffn.router.layer.weight"] == ("adamw", "router")
    assert table[f"{mlp}.w2"] == ("muon_experts", "experts")
    # DBRX's expert e is rows e*16 ... e*16+15 of w1; w2's rows are that expert's (in x out) matrix
    w = dict(dbrx.named_parameters())[f"{mlp}.w2"]
    m = expert_matrices(w, layouts[f"{mlp}.w2"])
    assert m.shape == (4, 32, 16) and torch.equal(m[2], w[32:48].T)


def test_jetmoe_glu_input_is_split_like_every_fused_gate_up():
    layouts = expert_layouts(_tiny("jetmoe"))
    assert layouts["model.layers.0.mlp.input_linear.weight"] == ExpertLayout(gate_up="concatenated")
    assert layouts["model.layers.0.mlp.output_linear.weight"] == ExpertLayout()
    assert layouts["model.layers.0.self_attention.experts.input_linear.weight"] == ExpertLayout()  # no GLU there


@pytest.mark.parametrize("layout", [ExpertLayout(flat=3), ExpertLayout(True, flat=3)])
def test_flat_expert_step_equals_per_expert_steps(layout):
    batched, per_expert = _step_pair(layout, {}, shape=(3 * 6, 8))
    assert torch.equal(batched, per_expert)


def test_dbrx_trains_every_expert_with_muon():
    model = _tiny_family("dbrx")
    opt = create_optimizer("muon", model, lr=1e-2)
    flat = [g for g in opt.param_groups if g.get("expert_flat")]
    assert sorted(g["expert_transposed"] for g in flat) == [False, True]
    params = dict(model.named_parameters())
    before = {n: p.detach().clone() for n, p in params.items()}
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    w1 = "transformer.blocks.0.ffn.experts.mlp.w1"
    moved = [not torch.equal(before[w1][e * 16:(e + 1) * 16], params[w1][e * 16:(e + 1) * 16]) for e in range(4)]
    hit = [bool(params[w1].grad[e * 16:(e + 1) * 16].abs().sum() > 0) for e in range(4)]
    assert moved == hit and any(hit)


class _MadeUpExperts(nn.Module):  # fused experts in a layout no rule knows
    def __init__(self):
        super().__init__()
        self.w_in = nn.Parameter(torch.randn(4 * 16, 8))
        self.w_out = nn.Parameter(torch.randn(4, 8, 16))


class _MadeUpMoe(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.moe = nn.Module()
        self.moe.router = nn.Linear(8, 4, bias=False)
        self.moe.experts = _MadeUpExperts()
        self.proj = nn.Linear(8, 8)


def test_experts_in_an_unknown_layout_are_named_in_one_warning_never_routed_silently():
    model = _MadeUpMoe()
    with pytest.warns(UserWarning) as caught:
        routing = muon_routing(model)
    messages = [str(w.message) for w in caught if str(w.message).startswith("Muon:")]
    assert messages == ["Muon: _MadeUpExperts hold(s) mixture-of-experts weights in a layout no routing rule knows, "
                        "trained with AdamW: moe.experts.w_in (64, 8), moe.experts.w_out (4, 8, 16); the routers beside "
                        "them on AdamW: moe.router.weight; list them in adamw_patterns if AdamW is meant"]
    assert routing == {"embed.weight": "adamw", "moe.router.weight": "adamw", "moe.experts.w_in": "adamw",
                       "moe.experts.w_out": "adamw", "proj.weight": "muon", "proj.bias": "adamw"}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named in adamw_patterns: meant, so no warning
        muon_routing(model, adamw_patterns=["experts"])


def test_router_role_has_its_own_multiplier_and_does_not_decay_with_matrices():
    from hf_fasttrain.optim.groups import param_roles

    model = _tiny("qwen3_moe")
    assert [n for n, r in param_roles(model).items() if r == "router"] == [
        f"model.layers.{i}.mlp.gate.weight" for i in (0, 1)]
    for name in ("adamw", "muon"):
        opt = create_optimizer(name, model, lr=1e-3, weight_decay=0.1, lr_multipliers={"router": 0.25, "matrix": 2},
                               weight_decay_on="matrices")
        got = {(g["lr_group"], g.get("use_muon", False)): (g["lr"], g["weight_decay"]) for g in opt.param_groups
               if g["lr_group"] in ("router", "matrix")}
        assert got[("router", False)] == (pytest.approx(2.5e-4), 0.0), name
        assert got[("matrix", name == "muon")] == (pytest.approx(2e-3), 0.1), name


def test_deepseek_v3_routes_experts_shared_experts_and_router():
    table = _layer0(muon_route_table(_tiny("deepseek_v3")))
    assert table["L0.mlp.gate.weight"] == "adamw:router"
    assert table["L0.mlp.experts.gate_up_proj"] == table["L0.mlp.experts.down_proj"] == "muon_experts:experts"
    assert table["L0.mlp.shared_experts.gate_proj.weight"] == "muon:matrix"


class _OldExpert(nn.Module):  # one nn.Linear per expert (Mixtral's layout before transformers 5)
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(8, 16, bias=False), nn.Linear(16, 8, bias=False), nn.Linear(8, 16, bias=False)


class _OldMoe(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 8)
        self.block_sparse_moe = nn.Module()
        self.block_sparse_moe.gate = nn.Linear(8, 4, bias=False)
        self.block_sparse_moe.experts = nn.ModuleList(_OldExpert() for _ in range(4))
        self.out = nn.Linear(8, 4)  # 4 outputs like the router, but not in a block: a matrix


def test_per_expert_linear_layout_routes_router_to_adamw_and_each_expert_to_muon():
    routing = muon_routing(_OldMoe())
    assert routing["block_sparse_moe.gate.weight"] == "adamw"
    assert [routing[f"block_sparse_moe.experts.{e}.w{i}.weight"] for e in range(4) for i in (1, 2, 3)] == ["muon"] * 12
    assert routing["out.weight"] == "muon" and routing["embed.weight"] == "adamw"


def test_unrecognised_parameters_are_named_in_one_warning_line():
    model = _OldMoe()
    model.scales = nn.Parameter(torch.ones(3, 5))
    model.conv = nn.Conv1d(2, 3, 4)
    with pytest.warns(UserWarning) as caught:
        routing = muon_routing(model)
    messages = [str(w.message) for w in caught if "routing rule" in str(w.message)]
    assert len(messages) == 1 and "\n" not in messages[0]
    assert messages[0].startswith("Muon: no routing rule recognises 2 parameter(s), trained with AdamW: "
                                  "scales (3, 5), conv.weight (3, 2, 4);")
    assert routing["scales"] == routing["conv.weight"] == "adamw" and routing["conv.bias"] == "adamw"
    with warnings.catch_warnings():  # named in adamw_patterns: meant, so no warning
        warnings.simplefilter("error")
        assert muon_route_table(model, adamw_patterns=["scales", "conv"])["scales"] == ("adamw", "pattern")
        muon_routing(model, adamw_patterns=["scales", "conv"])


def test_create_optimizer_trains_every_expert_of_a_moe_model():
    model = _tiny("qwen2_moe")
    opt = create_optimizer("muon", model, lr=1e-2)
    expert_groups = [g for g in opt.param_groups if g.get("experts")]
    assert len(expert_groups) == 2  # [gate; up] tensors and down tensors
    assert {g["expert_gate_up"] for g in expert_groups} == {"concatenated", None}
    names = {n for g in expert_groups for n in g["param_names"]}
    assert names == {f"model.layers.{i}.mlp.experts.{k}" for i in (0, 1) for k in ("gate_up_proj", "down_proj")}
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    params = dict(model.named_parameters())
    for name in names:  # every expert that got tokens moved
        moved = [not torch.equal(before[name][e], params[name][e]) for e in range(4)]
        hit = [bool(params[name].grad[e].abs().sum() > 0) for e in range(4)]
        assert moved == hit and any(hit), name
    assert opt.inner_optimizers[0].state[params["model.layers.0.mlp.experts.down_proj"]]["momentum_buffer"].shape == (4, 32, 16)


def test_hyperball_with_experts_is_refused_in_one_line():
    with pytest.raises(ValueError, match=r"^Muon: hyperball does not support mixture-of-experts tensors; use "
                                         r"hyperball=False, or adamw_patterns=\['experts'\]"):
        create_optimizer("muon", _tiny("qwen3_moe"), hyperball=True)
    opt = create_optimizer("muon", _tiny("qwen3_moe"), hyperball=True, adamw_patterns=["experts"])
    assert not any(g.get("experts") for g in opt.param_groups)


# --- every mixture-of-experts family of the installed transformers -------------------------------------------

_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
# field names or layer patterns of their own, on top of `_TINY`
_OWN = {"dbrx": dict(d_model=32, n_heads=4, n_layers=2, max_seq_len=64,
                     ffn_config={"ffn_hidden_size": 16, "moe_num_experts": 4, "moe_top_k": 2},
                     attn_config={"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}),
        "doge": dict(is_moe=True), "flint": dict(mlp_only_layers=[]),
        "beam": dict(mlp_layer_types=["sparse", "sparse"]), "step3p5": dict(mlp_layer_types=["sparse", "sparse"]),
        "deepseek_ocr2_text": dict(mlp_layer_types=["sparse", "sparse"]),
        "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=0),
        "ernie4_5_vl_moe_text": dict(moe_intermediate_size=[16, 16], moe_num_experts=4,
                                     rope_parameters={"rope_theta": 1e4, "rope_type": "default", "mrope_section": [1, 1, 2]}),
        "glm5_next_text": dict(num_key_value_heads=4, qk_rope_head_dim=0, mlp_layer_types=["sparse", "sparse"]),
        "granitemoehybrid": dict(mamba_n_heads=8, mamba_d_head=8),
        "hy_v4_vl_text": dict(rope_parameters={"rope_theta": 1e4, "rope_type": "default", "mrope_section": [2, 1, 1]}),
        "kolibri1_1": dict(head_dim=16, index_num_heads=1, mlp_only_layers=[]),
        "dots3_note_vision_encoder": dict(per_layer_config={}, adapter_in_dim=32, mlp_layer_types=["sparse", "sparse"])}
# validators some families add, tried in turn
_RETRIES = ({}, {"num_key_value_heads": 4}, {"num_experts_per_tok": 1},
            {"head_dim": 16, "num_attention_heads": 2, "num_key_value_heads": 2})


def _declares_experts(cls) -> bool:
    return any(type(getattr(cls, k, None)) is int and getattr(cls, k) > 1 for k in _EXPERT_FIELDS)


def moe_families() -> dict:
    """{model_type: config class} of every config of the installed transformers that declares experts (a count
    field above 1), itself or in a sub-config of its own (DBRX's ffn_config). A composite (vision, audio) whose
    experts are in a text config of another model_type is that text family's."""
    from transformers import CONFIG_MAPPING

    out = {}
    for name in CONFIG_MAPPING.keys():
        cls = CONFIG_MAPPING[name]
        subs = [c for c in (getattr(cls, "sub_configs", None) or {}).values() if isinstance(c, type)]
        if _declares_experts(cls) or any(_declares_experts(c) and getattr(c, "model_type", "") not in CONFIG_MAPPING
                                         for c in subs):
            out[name] = cls
    return out


def _model_class(family: str, cls):
    import importlib
    import inspect

    import transformers
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES

    for mapping in (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES):
        if family in mapping:
            return getattr(transformers, mapping[family])
    module = importlib.import_module(cls.__module__.replace(".configuration_", ".modeling_"))
    own = [c for _, c in inspect.getmembers(module, inspect.isclass) if getattr(c, "config_class", None) is cls]
    own.sort(key=lambda c: (not c.__name__.endswith("ForCausalLM"), not c.__name__.endswith("Model"), c.__name__))
    if not own:
        raise LookupError(f"no model class for {cls.__name__}")
    return own[0]


def _tiny_family(family: str, cls=None):
    """A tiny model of `family` from its config class (`_TINY` sizes), or RuntimeError with the first reason."""
    from transformers import CONFIG_MAPPING

    cls = cls or CONFIG_MAPPING[family]
    klass = _model_class(family, cls)
    errors = []
    for extra in _RETRIES:
        try:
            config = cls(**{**_TINY, **_OWN.get(family, {}), **extra})
            torch.manual_seed(0)
            return klass._from_config(config)
        except Exception as exc:  # noqa: BLE001 - the reason is what the test reports
            errors.append(f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    raise RuntimeError(errors[0])


# what no rule knows in these families (convolution kernels, Mamba / linear-attention state matrices, DeepSeek-V4 and
# Hunyuan-V4 hyper-connections, Inkling's relative-position, norm and message-query tables, a vision patch kernel):
# not expert weights
_NOT_EXPERTS = re.compile(r"conv|patch_embed\.proj\.weight$|A_log$|hc[._]fn$|position_bias|relative_position_bias\.proj$|rel_logits_proj\.proj$|"
                          r"norm\.scale$|message_input\.query$")
_ROUTER = re.compile(r"\.(gate|router)(\.[a-z_]+)*\.weight$|\.router_gate\.weight$")


def _check_family(family, model) -> list[str]:
    """What is wrong with the routing of `model`: a router not on the router rule and role, an expert tensor not on
    Muon per expert, an unrecognised tensor that is not one of `_NOT_EXPERTS`."""
    from hf_fasttrain.optim.groups import param_roles

    table, roles = muon_route_table(model), param_roles(model)
    shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    config = getattr(model.config, "get_text_config", lambda: model.config)()
    count = next((getattr(config, k) for k in _EXPERT_FIELDS if isinstance(getattr(config, k, None), int)), 4)
    wrong = []
    for name, (route, rule) in table.items():
        if _ROUTER.search(name) and "shared" not in name and len(shapes[name]) == 2 and shapes[name][0] >= 2 and (
                "router" in name or shapes[name][0] >= count):
            if (route, rule, roles[name]) != ("adamw", "router", "router"):
                wrong.append(f"router {name} {shapes[name]}: {route}/{rule}/{roles[name]}")
        elif re.search(r"(^|\.)experts?(\.|_)", name) and len(shapes[name]) >= 2 and not name.endswith("bias") \
                and "embed" not in name and "norm" not in name:  # per-expert biases and norms: AdamW
            per_expert = rule == "experts" or (rule == "matrix" and re.search(r"experts\.\w*\d+\.", name))
            if not per_expert:
                wrong.append(f"expert tensor {name} {shapes[name]}: {route}/{rule}")
        if rule == "expert vector" and roles[name] != ("bias" if name.endswith("bias") else "norm"):
            # a per-expert bias or norm stored 2-D: AdamW, and the bias / norm role for lr_multipliers, weight
            # decay and muP (never the matrix role's lr / m)
            wrong.append(f"expert vector {name} {shapes[name]}: role {roles[name]}")
        if rule == "unrecognised" and not _NOT_EXPERTS.search(name):
            wrong.append(f"unrecognised {name} {shapes[name]}")
    if not any(rule == "router" for _, rule in table.values()):
        wrong.append("no router found")
    return wrong


# Families checked by the fast tier (one of each kind of layout); `test_routing_of_every_moe_family` runs them all.
FAST_FAMILIES = ("dbrx", "llama4_text", "jetmoe", "gpt_oss", "qwen2_moe", "switch_transformers", "longcat_flash",
                 "zaya", "doge", "inkling_text")


@pytest.mark.parametrize("family", FAST_FAMILIES)
def test_routing_of_moe_families_of_each_layout(family):
    assert _check_family(family, _tiny_family(family)) == []


@pytest.mark.slow
def test_routing_of_every_moe_family_transformers_ships(capsys):
    """Every family the installed transformers declares experts in (79 in 5.25, all built), tiny, from its config
    class: routers on the router rule and role, experts on Muon per expert; a family that does not build (or builds
    no experts) is listed with the reason. About 15 s on a 2-core CPU, most of it importing every config: slow."""
    families = moe_families()
    assert {"mixtral", "dbrx", "llama4_text", "jetmoe", "gpt_oss", "deepseek_v3"} <= set(families)
    built, unbuilt, wrong = [], {}, {}
    for family, cls in sorted(families.items()):
        try:
            model = _tiny_family(family, cls)
        except (RuntimeError, LookupError) as exc:
            unbuilt[family] = str(exc)
            continue
        if not any(re.search(r"expert|router", n) for n, _ in model.named_parameters()):
            unbuilt[family] = "the tiny config builds no experts (dense layers only)"
            continue
        built.append(family)
        problems = _check_family(family, model)
        if problems:
            wrong[family] = problems
    with capsys.disabled():
        print(f"\n{len(built)} of {len(families)} mixture-of-experts families built and checked"
              + ("; not built:" if unbuilt else ""))
        for family, reason in unbuilt.items():
            print(f"  {family}: {reason}")
    assert wrong == {}
    assert len(built) >= 0.8 * len(families), unbuilt  # a builder that stops building fails here


@pytest.mark.slow
def test_expert_tensors_under_fsdp2_equal_the_single_process_step(tmp_path):
    """3-D expert tensors as DTensors sharded on dim 0 (the experts) or dim 1, on 2 CPU processes: the expert
    tensor is gathered for its batched Newton-Schulz (also with ns_sharding="round_robin", which handles 2-D
    matrices only) and each rank keeps its shard of the update; NorMuon is refused in one line."""
    import json
    import socket

    import torch.multiprocessing as mp

    import _experts_sharded_worker as worker

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker.run, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        report = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert "error" not in report, report["error"]
        for key in ("dim0-all_gather", "dim0-round_robin", "dim1-all_gather", "dim1-round_robin"):
            assert report[key]["diff"] <= 1e-6 and report[key]["moved"] > 1e-2, (key, report[key])
        assert report["dim0-all_gather"]["local_rows"] == (3, 2)[rank]  # 5 experts: 3 + 2
        assert report["dim1-all_gather"]["local_rows"] == 7
        assert report["normuon_refusal"] == ("Muon: normuon_beta2 does not work on sharded (FSDP2) parameters; "
                                             "use DDP, or normuon_beta2=None")
