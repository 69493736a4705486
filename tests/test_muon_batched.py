"""Batched Newton-Schulz: matrices of one shape orthogonalised together give the per-matrix results, bit for bit
on CPU, and Muon's step with it equals the step matrix by matrix."""

import pytest
import torch

from hf_fasttrain.optim import create_optimizer, newton_schulz, newton_schulz_batched
from hf_fasttrain.optim.muon import NS_COEFFICIENTS

from conftest import make_tiny_gpt2


@pytest.mark.parametrize("shape", [(24, 8), (8, 24), (16, 16)])
@pytest.mark.parametrize("coefficients", sorted(NS_COEFFICIENTS))
def test_batched_equals_per_matrix_bitwise(shape, coefficients):
    g = torch.Generator().manual_seed(1)
    xs = [torch.randn(*shape, generator=g) * (i + 1) for i in range(3)]
    out = newton_schulz_batched(xs, coefficients, ns_steps=5)
    assert out.shape == (3, *shape) and out.dtype == torch.bfloat16
    for o, x in zip(out, xs):
        assert torch.equal(o, newton_schulz(x, coefficients, ns_steps=5))


def test_batched_refuses_mixed_shapes():
    with pytest.raises(ValueError, match=r"one shape, got shapes \[\(2, 3\), \(3, 2\)\]"):
        newton_schulz_batched([torch.ones(2, 3), torch.ones(3, 2)])


def _two_steps(ns_batched: bool):
    model = make_tiny_gpt2(64, n_embd=16, n_layer=2)
    opt = create_optimizer("muon", model, lr=1e-2, ns_batched=ns_batched)
    ids = torch.arange(32).remainder(50).view(2, 16)
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    return model


@pytest.mark.slow  # (the quick suite has it too: test_optim's torch.optim.Muon twin runs the batched default)
def test_muon_step_batched_equals_per_matrix():
    batched, per_matrix = _two_steps(True), _two_steps(False)
    start = make_tiny_gpt2(64, n_embd=16, n_layer=2)
    for (name, a), b, s in zip(batched.named_parameters(), per_matrix.parameters(), start.parameters()):
        assert torch.equal(a, b), name
    # the matrices moved (the test would pass trivially if Muon did nothing)
    moved = [n for (n, a), s in zip(batched.named_parameters(), start.parameters()) if not torch.equal(a, s)]
    assert "transformer.h.0.attn.c_attn.weight" in moved and "transformer.h.1.mlp.c_proj.weight" in moved


def test_muon_groups_matrices_by_shape():
    model = make_tiny_gpt2(64, n_embd=32, n_layer=2)
    opt = create_optimizer("muon", model)
    muon = opt.inner_optimizers[0]
    assert muon._ns_batched is True
    shapes = sorted({tuple(p.shape) for g in muon.param_groups for p in g["params"]})
    # GPT-2's Conv1D weights: c_attn 32x96, c_proj 32x32, c_fc 32x128, mlp c_proj 128x32, 2 layers each
    assert shapes == [(32, 32), (32, 96), (32, 128), (128, 32)]
    with pytest.raises(ValueError, match="ns_batched"):
        create_optimizer("muon", model, ns_batched="yes")


@pytest.mark.bench
def test_precision_benchmark_writes_its_table_json_and_png(tmp_path):
    from benchmarks import muon_step

    out = tmp_path / "prec"
    result = muon_step.main(["--compare", "precision", "--models", "1x64", "--repeats", "1", "--threads", "1",
                             "--out", str(out)])
    rows = result["rows"]
    assert [r["optimizer"] for r in rows] == ["adamw", "muon-bf16", "muon-fp32"]
    assert rows[0]["train_step_vs_adamw"] == 1 and all(r["train_step_ms_median"] > 0 for r in rows)
    assert all(r["fwd_bwd_ms_median"] > 0 and r["optimizer_step_ms_median"] > 0 for r in rows)
    for suffix in (".json", ".md", ".png"):
        assert out.with_suffix(suffix).stat().st_size > 0
    assert "| gpt2-1x64 | muon-fp32 |" in out.with_suffix(".md").read_text()
