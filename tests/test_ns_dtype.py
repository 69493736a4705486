"""Muon's Newton-Schulz precision (``ns_dtype``): fp32 is the more precise iteration, "auto" follows the
hardware's native bf16, the default stays torch's bf16, and an fp32 iteration never touches its input."""

import pytest
import torch

from hf_fasttrain.optim import MuonWithAdamW, create_optimizer, newton_schulz, newton_schulz_batched
from hf_fasttrain.optim import orthogonalize
from hf_fasttrain.optim.orthogonalize import native_bf16_matmul, resolve_ns_dtype
from test_optim import _batch, _roundtrip, _tiny_gpt2, _train


def _iteration_in_float64(x, steps=5):
    """The "jordan" quintic of `newton_schulz`, in float64: what the bf16 and fp32 iterations approximate."""
    a, b, c = 3.4445, -4.7750, 2.0315
    x = x.double()
    tall = x.size(0) > x.size(1)
    x = x.T if tall else x
    x = x / x.norm().clamp(min=1e-7)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


@pytest.mark.parametrize("shape", [(48, 96), (96, 48)])
def test_float32_iteration_is_closer_to_the_exact_one_than_bf16(shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    exact = _iteration_in_float64(x)
    bf16, fp32 = newton_schulz(x), newton_schulz(x, ns_dtype="float32")
    assert (bf16.dtype, fp32.dtype) == (torch.bfloat16, torch.float32)
    err16, err32 = (float((y.double() - exact).abs().max()) for y in (bf16, fp32))
    assert err32 < 1e-4 < err16 and err32 < err16 / 100, (err32, err16)
    batched = newton_schulz_batched([x, 2 * x], ns_dtype="float32")
    assert batched.dtype == torch.float32
    torch.testing.assert_close(batched[0], fp32, rtol=0, atol=1e-5)


def test_the_iteration_leaves_its_input_alone():
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    before = x.clone()
    newton_schulz(x, ns_dtype="float32")  # same dtype as the input: a copy is divided, not the input
    assert torch.equal(x, before)


def test_auto_is_bf16_where_the_hardware_multiplies_it_natively(monkeypatch):
    for flags, expected in (({"avx2", "fma"}, torch.float32), ({"avx2", "avx512_bf16"}, torch.bfloat16),
                            ({"amx_bf16"}, torch.bfloat16), ({"asimd", "bf16"}, torch.bfloat16), (set(), torch.float32)):
        monkeypatch.setattr(orthogonalize, "_cpu_flags", lambda flags=flags: frozenset(flags))
        assert native_bf16_matmul("cpu") is (expected == torch.bfloat16)
        assert resolve_ns_dtype("auto", "cpu") == expected
        assert resolve_ns_dtype("bfloat16", "cpu") == torch.bfloat16  # the named ones do not look
        assert resolve_ns_dtype("float32", "cpu") == torch.float32
    assert resolve_ns_dtype("auto", "cuda") == torch.bfloat16


def test_muon_steps_in_float32_train_keep_the_momentum_and_resume():
    batch = _batch()
    model = _tiny_gpt2()
    opt = create_optimizer("muon", model, lr=3e-3, ns_dtype="float32")
    assert {g["ns_dtype"] for g in opt.param_groups if g["use_muon"]} == {"float32"}
    losses = _train(model, opt, 20, batch)
    assert losses[-1] < losses[0] - 0.5, losses
    # without Nesterov the iteration's input is the momentum buffer itself: it must come out unchanged
    w = torch.nn.Parameter(torch.randn(6, 10, generator=torch.Generator().manual_seed(2)))
    plain = MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.02, nesterov=False, ns_dtype="float32")
    w.grad = torch.ones(6, 10)
    plain.step()
    torch.testing.assert_close(plain.state[w]["momentum_buffer"], torch.full((6, 10), 0.05), rtol=0, atol=1e-7)
    # the setting is saved with the groups; a checkpoint without it (older) steps in bf16 as before
    state = _roundtrip(opt.state_dict())
    again = create_optimizer("muon", _tiny_gpt2(), lr=3e-3, ns_dtype="float32")
    again.load_state_dict(state)
    assert {g["ns_dtype"] for g in again.param_groups if g["use_muon"]} == {"float32"}
    old = create_optimizer("muon", model, lr=3e-3)
    for g in old.param_groups:
        g.pop("ns_dtype", None)
    assert _train(model, old, 1, batch)


@pytest.mark.parametrize("native", [True, False])
def test_default_is_auto_torchs_bf16_where_native_and_a_bad_value_is_one_line(native, monkeypatch):
    """The default, "auto", steps exactly as "bfloat16" (torch's) where bf16 is native (CUDA, AVX512-BF16/AMX
    CPUs) and as "float32" on a CPU that would emulate it."""
    import hf_fasttrain.optim.orthogonalize as orth

    monkeypatch.setattr(orth, "native_bf16_matmul", lambda device="cpu": native)
    model = _tiny_gpt2()
    assert {g["ns_dtype"] for g in create_optimizer("muon", model).param_groups if g["use_muon"]} == {"auto"}
    batch = _batch()
    after = {}
    for ns_dtype in (None, "bfloat16", "float32"):
        m = _tiny_gpt2()
        _train(m, create_optimizer("muon", m, lr=3e-3, **({"ns_dtype": ns_dtype} if ns_dtype else {})), 2, batch)
        after[ns_dtype] = torch.cat([p.detach().flatten() for p in m.parameters()])
    assert torch.equal(after[None], after["bfloat16" if native else "float32"])
    assert not torch.equal(after["bfloat16"], after["float32"])  # the two precisions do differ
    model = _tiny_gpt2()
    with pytest.raises(ValueError) as err:
        create_optimizer("muon", model, ns_dtype="fp16")
    assert str(err.value) == "ns_dtype: got 'fp16' for Muon; allowed: bfloat16, float32, auto"


@pytest.mark.parametrize("native", [False, True])
def test_fasttrainer_says_when_muons_bf16_is_emulated(native, monkeypatch, caplog, tmp_path):
    import hf_fasttrain.optim.orthogonalize as orth
    from hf_fasttrain import FastTrainer, FastTrainingArguments

    monkeypatch.setattr(orth, "native_bf16_matmul", lambda device="cpu": native)
    data = [{"input_ids": torch.arange(16) % 64, "labels": torch.arange(16) % 64}] * 4
    said = {}
    for kwargs in (None, {"ns_dtype": "bfloat16"}):
        args = FastTrainingArguments(output_dir=str(tmp_path), max_steps=1, optimizer="muon", report_to="none",
                                     optimizer_kwargs=kwargs, run_record=False)
        caplog.clear()
        with caplog.at_level("WARNING", logger="hf_fasttrain.trainer"):
            FastTrainer(model=_tiny_gpt2(), args=args, train_dataset=data).create_optimizer()
        said[bool(kwargs)] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("muon:")]
    assert said[False] == []  # the default, auto, runs fp32 there: nothing to say
    assert len(said[True]) == (0 if native else 1)  # bf16 asked for on a CPU that emulates it
    if not native:
        assert "ns_dtype auto (the default) runs it in fp32 here" in said[True][0]
