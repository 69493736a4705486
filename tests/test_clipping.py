"""Exact tests of the clipping functions on hand-made gradients."""

import math

import pytest
import torch

from hf_fasttrain.stability.clipping import (
    ClipStats,
    agc_unit_dims,
    clip_agc_,
    clip_by_global_norm_,
    clip_by_value_,
    default_unit_dims,
    global_grad_norm,
)

# ---------------------------------------------------------------- global norm


def test_global_grad_norm_is_the_l2_norm_of_all_tensors_as_one_vector():
    grads = [torch.tensor([3.0, 0.0]), torch.tensor([[0.0, 4.0], [12.0, 0.0]])]
    assert global_grad_norm(grads).item() == pytest.approx(13.0)
    assert global_grad_norm([]).item() == 0.0
    # fp16 gradients are accumulated in float32: 300^2 * 4 overflows fp16 but not the result
    half = [torch.full((4,), 300.0, dtype=torch.float16)]
    assert global_grad_norm(half).dtype == torch.float32
    assert global_grad_norm(half).item() == pytest.approx(600.0)


# ---------------------------------------------------------------- by value


def test_clip_by_value_clamps_elements_and_counts_them():
    a = torch.tensor([0.5, -3.0, 2.0, -1.0])
    b = torch.tensor([[1.5, 0.0]])
    stats = clip_by_value_([a, b], clip_value=1.0)
    assert a.tolist() == [0.5, -1.0, 1.0, -1.0]  # exactly 1.0 is not "above" the bound: not counted
    assert b.tolist() == [[1.0, 0.0]]
    assert int(stats.num_clipped) == 3
    assert stats.num_total == 6
    assert stats.fraction.item() == pytest.approx(0.5)
    assert stats.pre_norm.item() == pytest.approx(math.sqrt(0.25 + 9 + 4 + 1 + 2.25))
    assert stats.post_norm.item() == pytest.approx(math.sqrt(0.25 + 1 + 1 + 1 + 1))


def test_clip_by_value_below_the_bound_changes_nothing():
    g = torch.tensor([0.1, -0.2, 0.3])
    before = g.clone()
    stats = clip_by_value_([g], clip_value=0.5)
    assert torch.equal(g, before)
    assert int(stats.num_clipped) == 0
    assert stats.post_norm.item() == pytest.approx(stats.pre_norm.item())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_clip_by_value_low_precision_grads(dtype):
    g = torch.tensor([4.0, -0.25, -8.0], dtype=dtype)
    stats = clip_by_value_([g], clip_value=2.0)
    assert g.dtype == dtype
    assert g.tolist() == [2.0, -0.25, -2.0]
    assert int(stats.num_clipped) == 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_clip_by_value_leaves_non_finite_gradients_for_the_guard(bad):
    g = torch.tensor([5.0, bad])
    h = torch.tensor([7.0])
    stats = clip_by_value_([g, h], clip_value=1.0)
    # torch.nn.utils.clip_grad_value_ would turn inf into 1.0 and hide the overflow
    assert g[0].item() == 5.0 and not math.isfinite(g[1].item())
    assert h.item() == 7.0
    assert int(stats.num_clipped) == 0
    assert not math.isfinite(stats.pre_norm.item())


# ---------------------------------------------------------------- by global norm


def test_clip_by_global_norm_scales_above_threshold_to_exactly_max_norm():
    a, b = torch.tensor([3.0, 0.0]), torch.tensor([0.0, 4.0])  # global norm 5
    stats = clip_by_global_norm_([a, b], max_norm=2.0)
    assert a.tolist() == pytest.approx([1.2, 0.0])
    assert b.tolist() == pytest.approx([0.0, 1.6])
    assert stats.pre_norm.item() == pytest.approx(5.0)
    assert stats.post_norm.item() == pytest.approx(2.0)
    assert int(stats.num_clipped) == 1 and stats.num_total == 1


@pytest.mark.parametrize("max_norm", [5.0, 5.5, 100.0])
def test_clip_by_global_norm_at_or_below_threshold_is_bit_for_bit_untouched(max_norm):
    g = torch.tensor([3.0, 4.0])
    before = g.clone()
    stats = clip_by_global_norm_([g], max_norm=max_norm)
    assert torch.equal(g, before)
    assert int(stats.num_clipped) == 0
    assert stats.post_norm.item() == stats.pre_norm.item() == pytest.approx(5.0)


def test_clip_by_global_norm_leaves_non_finite_gradients_for_the_guard():
    g = torch.tensor([float("nan"), 1.0])
    h = torch.tensor([100.0])
    stats = clip_by_global_norm_([g, h], max_norm=1.0)
    assert h.item() == 100.0 and g[1].item() == 1.0
    assert int(stats.num_clipped) == 0


# ---------------------------------------------------------------- AGC


def test_agc_clips_each_row_whose_ratio_is_above_lambda():
    w = torch.tensor([[3.0, 4.0], [1.0, 0.0], [0.0, 0.0]])  # row norms 5, 1, 0 (-> eps)
    g = torch.tensor([[0.3, 0.4], [0.001, 0.0], [0.0, 0.01]])  # row norms 0.5, 0.001, 0.01
    lam, eps = 0.02, 1e-3
    stats = clip_agc_([w], [g], clip_lambda=lam, eps=eps)
    # row 0: ratio 0.5/5 = 0.1 > 0.02 -> scaled to norm 0.02*5 = 0.1, same direction
    assert g[0].tolist() == pytest.approx([0.06, 0.08])
    # row 1: ratio 0.001/1 = 0.001 <= 0.02 -> untouched
    assert g[1].tolist() == pytest.approx([0.001, 0.0])
    # row 2: zero weights: the floor eps gives a max norm lam*eps = 2e-5
    assert g[2].tolist() == pytest.approx([0.0, 2e-5])
    assert int(stats.num_clipped) == 2 and stats.num_total == 3
    assert stats.pre_norm.item() == pytest.approx(math.sqrt(0.25 + 1e-6 + 1e-4))
    assert stats.post_norm.item() == pytest.approx(math.sqrt(0.01 + 1e-6 + 4e-10))


def test_agc_leaves_vectors_unclipped_by_default_but_counts_them_in_the_norms():
    w, g = torch.tensor([1.0, 1.0]), torch.tensor([10.0, 0.0])
    stats = clip_agc_([w], [g], clip_lambda=0.01)
    assert g.tolist() == [10.0, 0.0]
    assert stats.num_total == 0
    assert stats.pre_norm.item() == stats.post_norm.item() == 10.0
    assert default_unit_dims(w) is None
    assert default_unit_dims(torch.zeros(2, 3, 4)) == (1, 2)


def test_agc_columns_for_in_out_layouts():
    # Conv1D layout (in, out): the unit of output j is column j
    w = torch.tensor([[1.0, 10.0], [0.0, 0.0]])  # column norms 1 and 10
    g = torch.tensor([[0.5, 0.5], [0.0, 0.0]])  # column norms 0.5 and 0.5
    stats = clip_agc_([w], [g], clip_lambda=0.1, unit_dims=[(0,)])
    # column 0: ratio 0.5 > 0.1 -> norm 0.1; column 1: ratio 0.05 -> untouched
    torch.testing.assert_close(g, torch.tensor([[0.1, 0.5], [0.0, 0.0]]))
    assert int(stats.num_clipped) == 1 and stats.num_total == 2


def test_agc_leaves_non_finite_gradients_alone():
    w = torch.ones(2, 2)
    g = torch.tensor([[float("inf"), 0.0], [5.0, 5.0]])
    clip_agc_([w], [g], clip_lambda=0.01)
    assert g[1].tolist() == [5.0, 5.0] and g[0, 0].item() == float("inf")


def test_agc_unit_dims_on_gpt2_follow_layout_and_skip_the_output_layer():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=16, n_embd=32, n_layer=1, n_head=2))
    names = {id(p): n for n, p in model.named_parameters()}
    dims = {names[id(p)]: d for p, d in agc_unit_dims(model)}
    assert dims["transformer.wte.weight"] is None  # tied to lm_head: the output layer
    assert dims["transformer.wpe.weight"] == (1,)  # one unit per position vector
    assert dims["transformer.h.0.attn.c_attn.weight"] == (0,)  # Conv1D (in, out): columns
    assert dims["transformer.h.0.mlp.c_proj.weight"] == (0,)
    assert dims["transformer.h.0.ln_1.weight"] is None and dims["transformer.h.0.attn.c_attn.bias"] is None
    assert len(dims) == len(list(model.parameters()))  # the tied weight is listed once
    dims_all = {names[id(p)]: d for p, d in agc_unit_dims(model, clip_output_layer=True, clip_vectors=True)}
    assert dims_all["transformer.wte.weight"] == (1,)
    assert dims_all["transformer.h.0.ln_1.weight"] == (0,)
    lin = torch.nn.Linear(3, 2)
    assert [d for _, d in agc_unit_dims(lin)] == [(1,), None]


# ---------------------------------------------------------------- validation and stats


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda g: clip_by_value_(g, 0.0), "clip_value"),
        (lambda g: clip_by_value_(g, -1.0), "clip_value"),
        (lambda g: clip_by_value_(g, float("nan")), "clip_value"),
        (lambda g: clip_by_global_norm_(g, float("inf")), "max_norm"),
        (lambda g: clip_agc_(g, g, clip_lambda=0), "clip_lambda"),
        (lambda g: clip_agc_(g, g, eps=-1e-3), "eps"),
    ],
)
def test_invalid_thresholds_name_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call([torch.ones(2, 2)])


def test_agc_shape_and_length_mismatches_fail():
    with pytest.raises(ValueError, match="same length"):
        clip_agc_([torch.ones(2, 2)], [], clip_lambda=0.1)
    with pytest.raises(ValueError, match="shape"):
        clip_agc_([torch.ones(2, 2)], [torch.ones(2, 3)], clip_lambda=0.1)
    with pytest.raises(ValueError, match="unit_dims"):
        clip_agc_([torch.ones(2, 2)], [torch.ones(2, 2)], unit_dims=[None, None])


def test_clip_stats_as_floats():
    stats = ClipStats(torch.tensor(2.0), torch.tensor(1.0), torch.tensor(3), 4)
    assert stats.as_floats() == {"pre_norm": 2.0, "post_norm": 1.0, "num_clipped": 3, "num_total": 4, "fraction": 0.75}
