"""Cautious updates (Liang et al. 2024) for adamw / lion / ademamix / muon's AdamW part, and Muon's
Newton-Schulz coefficient schedules ("jordan", "polar_express", explicit triples)."""

import copy
import math

import pytest
import torch
from torch import nn

from hf_fasttrain.optim import (
    AdEMAMix,
    AdamW,
    Lion,
    MuonWithAdamW,
    create_optimizer,
    newton_schulz,
    ns_coefficient_schedule,
    parse_optimizer_kwargs,
)
from hf_fasttrain.optim._common import cautious_

from conftest import make_tiny_gpt2


def _tiny_gpt2(seed=0):
    return make_tiny_gpt2(64, 32, seed=seed)


def _set_grads(params, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


# --- the mask ------------------------------------------------------------------------------------


def test_cautious_mask_and_rescale_by_hand():
    update = torch.tensor([1.0, -2.0, 3.0, 4.0, -0.5, 0.0])
    grad = torch.tensor([1.0, 1.0, -1.0, 2.0, -3.0, 1.0])
    # agree: [1, 0, 0, 1, 1, 0] (0 * g is not > 0): 3 kept of 6, scale 6 / (3 + 1) = 1.5
    assert cautious_(update, grad).tolist() == [1.5, 0.0, 0.0, 6.0, -0.75, 0.0]
    nothing = cautious_(torch.tensor([1.0, -1.0]), torch.tensor([-1.0, 1.0]))
    assert nothing.tolist() == [0.0, 0.0]  # all masked: finite thanks to the + 1


def test_cautious_lion_two_steps_by_hand():
    # lr 0.1, no decay, betas (0.9, 0.99), theta_0 = 0.
    # step 1: m = 0, c = 0.1 g1 -> sign(g1) = +1 everywhere, all kept, scale 4 / 5: theta_1 = -0.08.
    # step 2: m = 0.01 g1, c = 0.009 g1 + 0.1 g2 = [0.004, 0.014, -0.091, 0.109] -> sign [+, +, -, +];
    #         agrees with g2 = [-0.05, 0.05, -1, 1] at [0, 1, 1, 1]: scale 4 / 4 = 1.
    g1, g2 = torch.ones(4), torch.tensor([-0.05, 0.05, -1.0, 1.0])
    for cautious, expected in ((True, [-0.08, -0.18, 0.02, -0.18]), (False, [-0.2, -0.2, 0.0, -0.2])):
        w = nn.Parameter(torch.zeros(4, dtype=torch.float64))
        opt = Lion([w], lr=0.1, betas=(0.9, 0.99), weight_decay=0.0, cautious=cautious)
        for g in (g1, g2):
            w.grad = g.double()
            opt.step()
        assert w.detach().tolist() == pytest.approx(expected, abs=1e-12)


def _ref_cautious(update, grad):
    kept = [1.0 if u * g > 0 else 0.0 for u, g in zip(update, grad)]
    scale = len(kept) / (sum(kept) + 1)
    return [u * k * scale for u, k in zip(update, kept)]


GRADS = [[1.0, -1.0, 2.0, 0.5, -0.2], [-1.0, -1.0, 1.0, -3.0, 0.3], [0.5, 2.0, -1.0, -0.1, -0.4]]


def test_cautious_adamw_matches_float64_reference():
    lr, b1, b2, eps, wd = 0.01, 0.9, 0.999, 1e-8, 0.1
    theta = [0.3, -0.2, 0.1, 0.0, 0.5]
    w = nn.Parameter(torch.tensor(theta, dtype=torch.float64))
    opt = AdamW([w], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, cautious=True)
    m, v = [0.0] * 5, [0.0] * 5
    for t, g in enumerate(GRADS, start=1):
        w.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        m = [b1 * a + (1 - b1) * x for a, x in zip(m, g)]
        v = [b2 * a + (1 - b2) * x * x for a, x in zip(v, g)]
        u = [(a / (1 - b1**t)) / (math.sqrt(c / (1 - b2**t)) + eps) for a, c in zip(m, v)]
        theta = [th * (1 - lr * wd) - lr * x for th, x in zip(theta, _ref_cautious(u, g))]
    assert w.detach().tolist() == pytest.approx(theta, rel=1e-12, abs=1e-15)
    # negative control: step 2's momentum disagrees with the gradient in places, so plain AdamW differs
    plain = nn.Parameter(torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5], dtype=torch.float64))
    popt = AdamW([plain], lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for g in GRADS:
        plain.grad = torch.tensor(g, dtype=torch.float64)
        popt.step()
    assert not torch.allclose(plain, w)


def test_plain_adamw_class_matches_torch_adamw():
    a = nn.Parameter(torch.tensor([0.3, -0.2, 0.1, 0.0, 0.5], dtype=torch.float64))
    b = nn.Parameter(a.detach().clone())
    ours = AdamW([a], lr=0.01, weight_decay=0.1)
    ref = torch.optim.AdamW([b], lr=0.01, weight_decay=0.1)
    for g in GRADS:
        a.grad = torch.tensor(g, dtype=torch.float64)
        b.grad = a.grad.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)


def test_cautious_ademamix_matches_float64_reference():
    lr, b1, b2, b3, alpha, eps, wd = 0.01, 0.9, 0.999, 0.9999, 5.0, 1e-8, 0.1
    theta = [0.3, -0.2, 0.1, 0.0, 0.5]
    w = nn.Parameter(torch.tensor(theta, dtype=torch.float64))
    opt = AdEMAMix([w], lr=lr, betas=(b1, b2, b3), alpha=alpha, eps=eps, weight_decay=wd, cautious=True)
    m1, m2, nu = [0.0] * 5, [0.0] * 5, [0.0] * 5
    for t, g in enumerate(GRADS, start=1):
        w.grad = torch.tensor(g, dtype=torch.float64)
        opt.step()
        m1 = [b1 * a + (1 - b1) * x for a, x in zip(m1, g)]
        m2 = [b3 * a + (1 - b3) * x for a, x in zip(m2, g)]
        nu = [b2 * a + (1 - b2) * x * x for a, x in zip(nu, g)]
        u = [(a / (1 - b1**t) + alpha * c) / (math.sqrt(n / (1 - b2**t)) + eps) for a, c, n in zip(m1, m2, nu)]
        theta = [th * (1 - lr * wd) - lr * x for th, x in zip(theta, _ref_cautious(u, g))]
    assert w.detach().tolist() == pytest.approx(theta, rel=1e-10, abs=1e-14)


@pytest.mark.parametrize("name", ["adamw", "lion", "ademamix", "muon"])
def test_cautious_option_through_the_registry_changes_the_run(name):
    runs = {}
    for cautious in (False, True):
        model = _tiny_gpt2()
        opt = create_optimizer(name, model, cautious=cautious)
        for step in range(3):
            _set_grads(model.parameters(), step)
            opt.step()
        runs[cautious] = model
    wte = [m.transformer.wte.weight for m in (runs[False], runs[True])]
    assert not torch.equal(*wte)  # AdamW-routed in muon too
    if name == "muon":  # the Muon matrices do not see the option
        a, b = (m.transformer.h[0].mlp.c_fc.weight for m in (runs[False], runs[True]))
        assert torch.equal(a, b)
    assert parse_optimizer_kwargs(name, '{"cautious": "true"}') == {"cautious": True}


def test_cautious_muon_adamw_part_equals_cautious_adamw():
    model = _tiny_gpt2()
    twin = copy.deepcopy(model)
    opt = create_optimizer("muon", model, lr=2e-3, cautious=True)
    named = dict(twin.named_parameters())
    ref = AdamW([{"params": [named[n] for n in g["param_names"]], "weight_decay": g["weight_decay"]}
                 for g in opt.param_groups if not g["use_muon"]], lr=2e-3, betas=(0.9, 0.95), cautious=True)
    for step in range(3):
        _set_grads(model.parameters(), step)
        _set_grads(twin.parameters(), step)
        opt.step()
        ref.step()
    assert torch.equal(model.transformer.wte.weight, twin.transformer.wte.weight)
    assert torch.equal(model.transformer.ln_f.bias, twin.transformer.ln_f.bias)


def test_cautious_must_be_bool():
    with pytest.raises(ValueError, match="^cautious: got 'yes' for Lion; must be true or false$"):
        create_optimizer("lion", nn.Linear(2, 2), cautious="yes")
    with pytest.raises(ValueError, match="^fused: got True with cautious=True, which has no fused AdamW kernel; leave fused unset or false$"):
        create_optimizer("muon", nn.Linear(2, 2), cautious=True, fused=True)


# --- Newton-Schulz coefficients -------------------------------------------------------------------


def test_ns_coefficient_schedules():
    assert ns_coefficient_schedule("jordan", 3) == [(3.4445, -4.775, 2.0315)] * 3
    pe = ns_coefficient_schedule("polar_express", 7)
    assert pe[0] == pytest.approx((8.156554524902461, -22.48329292557795, 15.878769915207462))
    assert pe[5] == pe[6] == pe[4]  # the last one repeats
    explicit = ns_coefficient_schedule([[3, -3.2, 1.2], [2.0, -1.5, 0.5]], 3)
    assert explicit == [(3.0, -3.2, 1.2), (2.0, -1.5, 0.5), (2.0, -1.5, 0.5)]
    assert ns_coefficient_schedule((1.5, -0.5, 0.0), 2) == [(1.5, -0.5, 0.0)] * 2
    for bad in ("newton", [1.0, 2.0], [[1.0, 2.0, "x"]], []):
        with pytest.raises(ValueError, match=r"^ns_coefficients: got .* for Muon; allowed: jordan, polar_express, an \(a, b, c\) triple or a list of triples$"):
            ns_coefficient_schedule(bad, 5)
    with pytest.raises(ValueError, match="^ns_steps: got 0 for Muon; must be an integer in \\[1, 99\\]$"):
        create_optimizer("muon", nn.Linear(2, 2), ns_steps=0)
    with pytest.raises(ValueError, match="ns_coefficients"):
        create_optimizer("muon", nn.Linear(2, 2), ns_coefficients="fast")


def _singular_value_map(s, schedule, safety):
    """What the iteration does to each singular value: s -> a s + b s^3 + c s^5, in float64."""
    s = s / (math.sqrt(float((s**2).sum())) * safety)
    for a, b, c in schedule:
        s = a * s + b * s**3 + c * s**5
    return s


@pytest.mark.parametrize("name, safety", [("jordan", 1.0), ("polar_express", 1.02)])
def test_newton_schulz_acts_on_singular_values_as_its_polynomials(name, safety):
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    got = torch.linalg.svdvals(newton_schulz(x, name, 5).double())
    expected = _singular_value_map(torch.linalg.svdvals(x), ns_coefficient_schedule(name, 5), safety)
    # bf16 arithmetic: agreement to about 1%
    torch.testing.assert_close(got.sort().values, expected.sort().values, rtol=0.0, atol=0.02)


def test_polar_express_orthogonalises_a_random_matrix():
    # Stated tolerance: on a 64 x 128 Gaussian matrix, 5 steps put every singular value within 0.15
    # of 1 (measured [0.86, 1.14]); jordan's quintic leaves them in [0.68, 1.13] (docs: the optimizers card).
    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    for shape_x in (x, x.T):
        pe = torch.linalg.svdvals(newton_schulz(shape_x, "polar_express", 5).float())
        jd = torch.linalg.svdvals(newton_schulz(shape_x, "jordan", 5).float())
        assert float((pe - 1).abs().max()) < 0.15
        assert float((pe - 1).abs().max()) < float((jd - 1).abs().max()) - 0.1
        assert float(jd.min()) > 0.6 and float(jd.max()) < 1.2
    # one more step: within 0.14 and the smallest above 0.95
    pe6 = torch.linalg.svdvals(newton_schulz(x, "polar_express", 6).float())
    assert float(pe6.min()) > 0.95 and float(pe6.max()) < 1.14


@pytest.mark.usefixtures("bf16_native")
def test_default_muon_is_bit_identical_to_torch_muon_and_explicit_triple():
    w0 = torch.randn(24, 40, generator=torch.Generator().manual_seed(0))
    results = {}
    for key, make in {
        "torch": lambda w: torch.optim.Muon([w], lr=0.02, adjust_lr_fn="match_rms_adamw"),
        "default": lambda w: MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.02),
        "triple": lambda w: MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.02,
                                          ns_coefficients=[3.4445, -4.7750, 2.0315]),
        "polar": lambda w: MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.02,
                                         ns_coefficients="polar_express"),
    }.items():
        w = nn.Parameter(w0.clone())
        opt = make(w)
        for step in range(3):
            w.grad = torch.randn(24, 40, generator=torch.Generator().manual_seed(10 + step))
            opt.step()
        results[key] = w.detach()
    assert torch.equal(results["default"], results["torch"])
    assert torch.equal(results["triple"], results["torch"])
    assert not torch.allclose(results["polar"], results["torch"], atol=1e-5)
