"""Tests of hf_fasttrain.optim: each update against a plain float64 reference of the paper's
pseudo-code, resume bit-for-bit, Muon routing, training a tiny GPT-2, and input checks."""

import copy
import io
import math

import re

import pytest
import torch
from torch import nn
from transformers import get_scheduler

from hf_fasttrain.optim import (
    OPTIMIZERS,
    SOAP,
    AdEMAMix,
    Lion,
    MuonWithAdamW,
    ademamix_alpha,
    ademamix_beta3,
    conv1d_lr_multiplier,
    create_optimizer,
    muon_routing,
    optimizer_cls_and_kwargs_for,
    parse_optimizer_kwargs,
)

from conftest import make_tiny_gpt2

# ---------------------------------------------------------------------------------------------
# A small problem: params of several shapes, gradient g = 2 (theta - target) + noise_t.
# ---------------------------------------------------------------------------------------------

SHAPES = [(4, 3), (5,), (3, 4)]


def exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly this one-line message."""
    return "^" + re.escape(message) + "$"


def _problem(seed, shapes=SHAPES, steps=6):
    gen = torch.Generator().manual_seed(seed)
    inits = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    targets = [torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes]
    noises = [[0.5 * torch.randn(s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(steps)]
    return inits, targets, noises


def _run(make_opt, inits, targets, noises, dtype=torch.float64):
    params = [nn.Parameter(x.clone().to(dtype)) for x in inits]
    opt = make_opt(params)
    for noise in noises:
        for p, target, n in zip(params, targets, noise):
            p.grad = (2 * (p.detach().double() - target) + n).to(dtype)
        opt.step()
    return [p.detach().double() for p in params], opt


def _flat(t):
    return [float(x) for x in t.flatten().tolist()]


def _assert_close(got, expected_flat, rtol, atol):
    for g, e in zip(got, expected_flat):
        torch.testing.assert_close(g.flatten(), torch.tensor(e, dtype=torch.float64), rtol=rtol, atol=atol)


# ---------------------------------------------------------------------------------------------
# Plain references: one element at a time, Python floats (float64).
# ---------------------------------------------------------------------------------------------


def ref_adamw(inits, targets, noises, lr, b1, b2, eps, wd):
    thetas = [_flat(x) for x in inits]
    tgts = [_flat(x) for x in targets]
    m = [[0.0] * len(t) for t in thetas]
    v = [[0.0] * len(t) for t in thetas]
    for step, noise in enumerate(noises, start=1):
        for k, th in enumerate(thetas):
            nz = _flat(noise[k])
            for i in range(len(th)):
                g = 2 * (th[i] - tgts[k][i]) + nz[i]
                m[k][i] = b1 * m[k][i] + (1 - b1) * g
                v[k][i] = b2 * v[k][i] + (1 - b2) * g * g
                m_hat = m[k][i] / (1 - b1**step)
                v_hat = v[k][i] / (1 - b2**step)
                th[i] = th[i] - lr * (m_hat / (math.sqrt(v_hat) + eps) + wd * th[i])
    return thetas


def ref_lion(inits, targets, noises, lr, b1, b2, wd):
    """Chen et al. 2023, Algorithm 2."""
    thetas = [_flat(x) for x in inits]
    tgts = [_flat(x) for x in targets]
    m = [[0.0] * len(t) for t in thetas]
    for noise in noises:
        for k, th in enumerate(thetas):
            nz = _flat(noise[k])
            for i in range(len(th)):
                g = 2 * (th[i] - tgts[k][i]) + nz[i]
                c = b1 * m[k][i] + (1 - b1) * g
                sign = 1.0 if c > 0 else (-1.0 if c < 0 else 0.0)
                th[i] = th[i] - lr * (sign + wd * th[i])
                m[k][i] = b2 * m[k][i] + (1 - b2) * g
    return thetas


def ref_ademamix(inits, targets, noises, lr, b1, b2, b3, alpha, T, eps, wd):
    """Pagliardini et al. 2024, Algorithm 1, with its alpha and beta3 schedulers."""
    thetas = [_flat(x) for x in inits]
    tgts = [_flat(x) for x in targets]
    m1 = [[0.0] * len(t) for t in thetas]
    m2 = [[0.0] * len(t) for t in thetas]
    nu = [[0.0] * len(t) for t in thetas]
    for t, noise in enumerate(noises, start=1):
        if T is None:
            alpha_t, beta3_t = alpha, b3
        else:
            alpha_t = min(t * alpha / T, alpha)
            x = t / T
            beta3_t = min(math.exp(math.log(b1) * math.log(b3) / ((1 - x) * math.log(b3) + x * math.log(b1))), b3)
        for k, th in enumerate(thetas):
            nz = _flat(noise[k])
            for i in range(len(th)):
                g = 2 * (th[i] - tgts[k][i]) + nz[i]
                m1[k][i] = b1 * m1[k][i] + (1 - b1) * g
                m2[k][i] = beta3_t * m2[k][i] + (1 - beta3_t) * g
                nu[k][i] = b2 * nu[k][i] + (1 - b2) * g * g
                m1_hat = m1[k][i] / (1 - b1**t)
                nu_hat = nu[k][i] / (1 - b2**t)
                th[i] = th[i] - lr * ((m1_hat + alpha_t * m2[k][i]) / (math.sqrt(nu_hat) + eps) + wd * th[i])
    return thetas


# Small dense linear algebra for the SOAP reference (lists of rows).


def _mm(a, b):
    return [[sum(a[i][k] * b[k][j] for k in range(len(b))) for j in range(len(b[0]))] for i in range(len(a))]


def _tr(a):
    return [list(r) for r in zip(*a)]


def _eye(n):
    return [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]


def _jacobi_eigh_desc(s):
    """Eigenvectors (columns) of a symmetric matrix by cyclic Jacobi rotations, descending eigenvalues."""
    n = len(s)
    a = [row[:] for row in s]
    vecs = _eye(n)
    for _ in range(100):
        off = sum(a[i][j] ** 2 for i in range(n) for j in range(n) if i != j)
        if off <= 1e-32 * sum(a[i][i] ** 2 for i in range(n)):
            break
        for p in range(n):
            for q in range(p + 1, n):
                if a[p][q] == 0.0:
                    continue
                theta = (a[q][q] - a[p][p]) / (2 * a[p][q])
                t = (1.0 if theta >= 0 else -1.0) / (abs(theta) + math.sqrt(theta * theta + 1))
                c = 1 / math.sqrt(t * t + 1)
                rot = _eye(n)
                rot[p][p] = rot[q][q] = c
                rot[p][q], rot[q][p] = t * c, -t * c
                a = _mm(_tr(rot), _mm(a, rot))
                vecs = _mm(vecs, rot)
    order = sorted(range(n), key=lambda i: -a[i][i])
    return [[vecs[r][i] for i in order] for r in range(n)]


def _gram_schmidt_q(a):
    """Q of the QR decomposition of `a` by modified Gram-Schmidt on its columns."""
    qs = []
    for col in _tr(a):
        w = col[:]
        for q in qs:
            d = sum(qi * wi for qi, wi in zip(q, w))
            w = [wi - d * qi for qi, wi in zip(q, w)]
        norm = math.sqrt(sum(wi * wi for wi in w))
        qs.append([wi / norm for wi in w])
    return _tr(qs)


def ref_soap_matrix(theta, target, noises, lr, b1, b2, shampoo_beta, eps, wd, freq, max_dim, stats=None):
    """Vyas et al. 2024, Algorithm 3 for one m x n matrix, with the reference code's first step
    (initialise L, R, eigenbases; no update) and refresh (sort by diag(Q^T L Q), one power
    iteration, QR). `stats["reordered"]` counts refreshes whose sort was not the identity."""
    stats = {} if stats is None else stats
    stats.setdefault("reordered", 0)
    m, n = len(theta), len(theta[0])
    s = shampoo_beta
    L = R = QL = QR = None
    M = [[0.0] * n for _ in range(m)]
    V = [[0.0] * n for _ in range(m)]

    def rot(x):
        if QL is not None:
            x = _mm(_tr(QL), x)
        if QR is not None:
            x = _mm(x, QR)
        return x

    def back(x):
        if QL is not None:
            x = _mm(QL, x)
        if QR is not None:
            x = _mm(x, _tr(QR))
        return x

    t = None
    for noise in noises:
        G = [[2 * (theta[i][j] - target[i][j]) + noise[i][j] for j in range(n)] for i in range(m)]
        GGt, GtG = _mm(G, _tr(G)), _mm(_tr(G), G)
        if t is None:
            if m <= max_dim:
                L = [[(1 - s) * x for x in row] for row in GGt]
                QL = _jacobi_eigh_desc(L)
            if n <= max_dim:
                R = [[(1 - s) * x for x in row] for row in GtG]
                QR = _jacobi_eigh_desc(R)
            t = 0
            continue
        t += 1
        Gr = rot(G)
        M = [[b1 * M[i][j] + (1 - b1) * G[i][j] for j in range(n)] for i in range(m)]
        V = [[b2 * V[i][j] + (1 - b2) * Gr[i][j] ** 2 for j in range(n)] for i in range(m)]
        Mr = rot(M)
        Nr = [[Mr[i][j] / (math.sqrt(V[i][j]) + eps) for j in range(n)] for i in range(m)]
        N = back(Nr)
        step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        theta = [[theta[i][j] * (1 - lr * wd) - step_size * N[i][j] for j in range(n)] for i in range(m)]
        if L is not None:
            L = [[s * L[i][j] + (1 - s) * GGt[i][j] for j in range(m)] for i in range(m)]
        if R is not None:
            R = [[s * R[i][j] + (1 - s) * GtG[i][j] for j in range(n)] for i in range(n)]
        if t % freq == 0:
            if L is not None:
                est = [sum(QL[a][k] * L[a][b] * QL[b][k] for a in range(m) for b in range(m)) for k in range(m)]
                order = sorted(range(m), key=lambda k: -est[k])
                stats["reordered"] += order != list(range(m))
                V = [V[k] for k in order]
                QL = _gram_schmidt_q(_mm(L, [[QL[r][k] for k in order] for r in range(m)]))
            if R is not None:
                est = [sum(QR[a][k] * R[a][b] * QR[b][k] for a in range(n) for b in range(n)) for k in range(n)]
                order = sorted(range(n), key=lambda k: -est[k])
                stats["reordered"] += order != list(range(n))
                V = [[row[k] for k in order] for row in V]
                QR = _gram_schmidt_q(_mm(R, [[QR[r][k] for k in order] for r in range(n)]))
    return theta


def ref_soap_vector(theta, target, noises, lr, b1, b2, eps, wd):
    """SOAP on a 1-D param: Adam (no rotation), after the reference code's skipped first step."""
    m = [0.0] * len(theta)
    v = [0.0] * len(theta)
    for t, noise in enumerate(noises):  # t = 0 is the skipped first step
        g = [2 * (theta[i] - target[i]) + noise[i] for i in range(len(theta))]
        if t == 0:
            continue
        step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
        for i in range(len(theta)):
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            theta[i] = theta[i] * (1 - lr * wd) - step_size * m[i] / (math.sqrt(v[i]) + eps)
    return theta


def _newton_schulz_ref(u, steps=5, coeffs=(3.4445, -4.775, 2.0315), eps=1e-7):
    """Jordan et al. 2024's quintic Newton-Schulz, float64 and unrounded."""
    a, b, c = coeffs
    x = u.double()
    transposed = x.shape[0] > x.shape[1]
    if transposed:
        x = x.T
    x = x / max(float(x.norm()), eps)
    for _ in range(steps):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if transposed else x


# ---------------------------------------------------------------------------------------------
# Updates against the references
# ---------------------------------------------------------------------------------------------


def test_adamw_matches_reference():
    inits, targets, noises = _problem(0)
    got, opt = _run(lambda ps: create_optimizer("adamw", _Params(ps), lr=0.05, weight_decay=0.1), inits, targets, noises)
    assert opt.defaults["foreach"] is True and not opt.defaults["fused"]
    # _Params puts 2-D params in the decay group and 1-D ones in the no-decay group, as for a model
    expected = [
        ref_adamw([x], [y], [[n[k]] for n in noises], 0.05, 0.9, 0.999, 1e-8, 0.1 if x.dim() == 2 else 0.0)[0]
        for k, (x, y) in enumerate(zip(inits, targets))
    ]
    _assert_close(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_lion_matches_reference(dtype, tol):
    inits, targets, noises = _problem(1)
    got, _ = _run(lambda ps: Lion(ps, lr=0.01, betas=(0.9, 0.99), weight_decay=0.5), inits, targets, noises, dtype)
    _assert_close(got, ref_lion(inits, targets, noises, 0.01, 0.9, 0.99, 0.5), rtol=tol, atol=tol)


def test_lion_moves_every_element_by_exactly_lr():
    inits, targets, noises = _problem(2, steps=1)
    got, _ = _run(lambda ps: Lion(ps, lr=0.01, weight_decay=0.0), inits, targets, noises)
    for before, after in zip(inits, got):
        torch.testing.assert_close((after - before).abs(), torch.full_like(before, 0.01), rtol=0, atol=1e-15)


@pytest.mark.parametrize("T", [None, 4])
def test_ademamix_matches_reference(T):
    inits, targets, noises = _problem(3, steps=7)  # with T = 4 the warmups end inside the run
    kw = dict(lr=0.02, betas=(0.8, 0.99, 0.995), alpha=5.0, T_alpha_beta3=T, eps=1e-8, weight_decay=0.1)
    got, _ = _run(lambda ps: AdEMAMix(ps, **kw), inits, targets, noises)
    expected = ref_ademamix(inits, targets, noises, 0.02, 0.8, 0.99, 0.995, 5.0, T, 1e-8, 0.1)
    _assert_close(got, expected, rtol=1e-11, atol=1e-12)


def test_ademamix_fp32_close_to_reference():
    inits, targets, noises = _problem(3, steps=7)
    got, _ = _run(lambda ps: AdEMAMix(ps, lr=0.02, T_alpha_beta3=4), inits, targets, noises, torch.float32)
    expected = ref_ademamix(inits, targets, noises, 0.02, 0.9, 0.999, 0.9999, 5.0, 4, 1e-8, 0.1)
    _assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_ademamix_with_alpha_zero_is_adamw():
    inits, targets, noises = _problem(4, steps=8)
    kw = dict(lr=0.03, weight_decay=0.2, eps=1e-8)
    got, _ = _run(lambda ps: AdEMAMix(ps, betas=(0.9, 0.95, 0.9999), alpha=0.0, **kw), inits, targets, noises)
    adamw, _ = _run(lambda ps: torch.optim.AdamW(ps, betas=(0.9, 0.95), **kw), inits, targets, noises)
    for a, b in zip(got, adamw):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize(
    "step, expected_alpha, expected_beta3",
    [
        (0, 0.0, 0.9),  # starts at beta1
        (50, 2.5, math.exp(math.log(0.9) * math.log(0.9999) / (0.5 * math.log(0.9999) + 0.5 * math.log(0.9)))),
        (100, 5.0, 0.9999),
        (500, 5.0, 0.9999),
    ],
)
def test_ademamix_schedules(step, expected_alpha, expected_beta3):
    assert ademamix_alpha(step, 5.0, 100) == pytest.approx(expected_alpha)
    assert ademamix_beta3(step, 0.9, 0.9999, 100) == pytest.approx(expected_beta3, rel=1e-12)
    assert ademamix_alpha(step, 5.0, None) == 5.0 and ademamix_beta3(step, 0.9, 0.9999, None) == 0.9999


def test_ademamix_beta3_halfway_doubles_half_life_harmonically():
    # The paper interpolates 1/ln(beta): at t = T/2 the EMA time scale is the mean of both ends'.
    b = ademamix_beta3(50, 0.9, 0.9999, 100)
    assert -1 / math.log(b) == pytest.approx(0.5 * (-1 / math.log(0.9) - 1 / math.log(0.9999)))


SOAP_KW = dict(lr=0.02, b1=0.9, b2=0.95, shampoo_beta=0.9, eps=1e-8, wd=0.1, freq=3)


def _soap_expected(inits, targets, noises, max_dims, stats=None):
    out = []
    for k, (x, y) in enumerate(zip(inits, targets)):
        noise_k = [n[k].tolist() for n in noises]
        kw = {key: v for key, v in SOAP_KW.items() if key not in ("shampoo_beta", "freq")}
        if x.dim() == 1:
            out.append(ref_soap_vector(x.tolist(), y.tolist(), noise_k, **kw))
        else:
            theta = ref_soap_matrix(
                x.tolist(), y.tolist(), noise_k, **kw, shampoo_beta=SOAP_KW["shampoo_beta"], freq=SOAP_KW["freq"],
                max_dim=max_dims[k], stats=stats,
            )
            out.append([v for row in theta for v in row])
    return out


def _make_soap(ps):
    # The last matrix has max_precond_dim 3: its 4-long dim gets no rotation, only R (3 x 3).
    return SOAP(
        [{"params": ps[:3]}, {"params": ps[3:], "max_precond_dim": 3}],
        lr=0.02, betas=(0.9, 0.95), shampoo_beta=0.9, eps=1e-8, weight_decay=0.1, precondition_frequency=3,
    )


def test_soap_matches_reference():
    # 8 gradients: the first initialises, then 7 updates with eigenbasis refreshes at steps 3 and 6.
    shapes = SHAPES + [(4, 3)]
    inits, targets, noises = _problem(9, shapes=shapes, steps=8)
    got, opt = _run(_make_soap, inits, targets, noises)
    assert int(opt.state[opt.param_groups[0]["params"][0]]["step"]) == 7
    assert sorted(opt.state[opt.param_groups[1]["params"][0]]) == ["GG_1", "Q_1", "exp_avg", "exp_avg_sq", "step"]
    stats = {}
    expected = _soap_expected(inits, targets, noises, [10000, 10000, 10000, 3], stats)
    assert stats["reordered"] >= 1  # this seed exercises the eigenvalue re-sorting of a refresh
    _assert_close(got, expected, rtol=1e-9, atol=1e-11)


def test_soap_fp32_close_to_reference():
    shapes = SHAPES + [(4, 3)]
    inits, targets, noises = _problem(5, shapes=shapes, steps=8)
    got, _ = _run(_make_soap, inits, targets, noises, torch.float32)
    _assert_close(got, _soap_expected(inits, targets, noises, [10000, 10000, 10000, 3]), rtol=1e-4, atol=1e-4)


def test_soap_first_step_only_builds_the_preconditioner():
    inits, targets, noises = _problem(6, steps=1)
    got, opt = _run(lambda ps: SOAP(ps, weight_decay=0.5), inits, targets, noises)
    for before, after in zip(inits, got):
        assert torch.equal(before, after)
    w = opt.param_groups[0]["params"][0]
    q0 = opt.state[w]["Q_0"]
    torch.testing.assert_close(q0.T @ q0, torch.eye(4, dtype=torch.float64))


@pytest.mark.parametrize("name", ["lion", "ademamix", "soap"])
def test_low_precision_params_keep_fp32_state(name):
    model = nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5)).to(torch.bfloat16)
    opt = create_optimizer(name, model)
    for _ in range(2):
        model(torch.ones(3, 6, dtype=torch.bfloat16)).float().pow(2).sum().backward()
        opt.step()
    floats = [v for s in opt.state.values() for k, v in s.items() if k != "step"]
    assert floats and all(v.dtype == torch.float32 for v in floats)
    reloaded = create_optimizer(name, model)
    reloaded.load_state_dict(_roundtrip(opt.state_dict()))
    for p in model.parameters():
        for key, value in opt.state[p].items():
            assert reloaded.state[p][key].dtype == value.dtype
            assert torch.equal(reloaded.state[p][key], value)


# ---------------------------------------------------------------------------------------------
# Muon + AdamW
# ---------------------------------------------------------------------------------------------


def _tiny_gpt2(seed=0, vocab=64):
    return make_tiny_gpt2(vocab, 32, seed=seed)  # no dropout: runs are functions of the seed


def test_muon_routes_every_gpt2_param_to_exactly_one_group():
    model = _tiny_gpt2()
    routing = muon_routing(model)
    hidden = ["attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight"]
    expected_muon = [f"transformer.h.{i}.{n}" for i in range(2) for n in hidden]
    assert [n for n, r in routing.items() if r == "muon"] == expected_muon
    expected_adamw = ["transformer.wte.weight", "transformer.wpe.weight"] + [
        f"transformer.h.{i}.{n}"
        for i in range(2)
        for n in [
            "ln_1.weight", "ln_1.bias", "attn.c_attn.bias", "attn.c_proj.bias",
            "ln_2.weight", "ln_2.bias", "mlp.c_fc.bias", "mlp.c_proj.bias",
        ]
    ] + ["transformer.ln_f.weight", "transformer.ln_f.bias"]
    assert sorted(n for n, r in routing.items() if r == "adamw") == sorted(expected_adamw)
    assert model.lm_head.weight is model.transformer.wte.weight  # tied head: routed with wte, once

    opt = create_optimizer("muon", model, lr=1e-3, weight_decay=0.1)
    groups = [(g["use_muon"], g["weight_decay"], g["param_names"]) for g in opt.param_groups]
    assert groups == [
        (True, 0.1, expected_muon),
        (False, 0.1, ["transformer.wte.weight", "transformer.wpe.weight"]),
        (False, 0.0, [n for n in expected_adamw if n not in ("transformer.wte.weight", "transformer.wpe.weight")]),
    ]
    in_groups = [id(p) for g in opt.param_groups for p in g["params"]]
    assert sorted(in_groups) == sorted(id(p) for p in model.parameters())  # each exactly once
    assert [type(o).__name__ for o in opt.inner_optimizers] == ["Muon", "AdamW"]


def test_muon_adamw_patterns_force_params_to_adamw():
    routing = muon_routing(_tiny_gpt2(), adamw_patterns=[r"\.1\.mlp"])
    assert routing["transformer.h.1.mlp.c_fc.weight"] == "adamw"
    assert routing["transformer.h.0.mlp.c_fc.weight"] == "muon"


def _set_grads(params, seed):
    gen = torch.Generator().manual_seed(seed)
    for p in params:
        p.grad = torch.randn(p.shape, generator=gen)


@pytest.mark.usefixtures("bf16_native")
def test_muon_hybrid_equals_torch_muon_plus_adamw():
    model = _tiny_gpt2()
    twin = copy.deepcopy(model)
    opt = create_optimizer("muon", model, lr=2e-3, weight_decay=0.1)
    # The same updates by hand: torch Muon on the hidden matrices, torch AdamW on the rest.
    named = dict(twin.named_parameters())
    groups = [dict(g) for g in opt.param_groups]
    muon = torch.optim.Muon(
        [{"params": [named[n] for n in g["param_names"]], "lr": g["lr"], "weight_decay": g["weight_decay"]}
         for g in groups if g["use_muon"]],
        momentum=0.95, nesterov=True, adjust_lr_fn="match_rms_adamw",
    )
    adamw = torch.optim.AdamW(
        [{"params": [named[n] for n in g["param_names"]], "weight_decay": g["weight_decay"]}
         for g in groups if not g["use_muon"]],
        lr=2e-3, betas=(0.9, 0.95), eps=1e-8, foreach=True,
    )
    for step in range(3):
        _set_grads(model.parameters(), step)
        _set_grads(twin.parameters(), step)
        opt.step()
        muon.step()
        adamw.step()
    for (name, a), b in zip(model.named_parameters(), twin.parameters()):
        assert torch.equal(a, b), name


def test_muon_update_matches_float64_newton_schulz_and_adamw_rms():
    # One step from zero momentum, no decay: delta = -lr 0.2 sqrt(max(A, B)) NS(g + mu (1 - mu) g ...).
    # torch runs Newton-Schulz in bf16, so the float64 reference agrees to bf16 accuracy only.
    w = nn.Parameter(torch.randn(24, 40, generator=torch.Generator().manual_seed(0)))
    before = w.detach().clone()
    opt = MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.01, weight_decay=0.0)
    w.grad = torch.randn(24, 40, generator=torch.Generator().manual_seed(1))
    opt.step()
    delta = (w.detach() - before).double()
    g = w.grad.double()
    nesterov = g.lerp(g * (1 - 0.95), 0.95)  # torch: buf = lerp(0, g, 1 - mu); u = lerp(g, buf, mu)
    expected = -0.01 * 0.2 * math.sqrt(40) * _newton_schulz_ref(nesterov)
    assert float((delta - expected).norm() / expected.norm()) < 0.03
    rms = float(delta.pow(2).mean().sqrt())
    assert 0.14 * 0.01 < rms < 0.26 * 0.01  # Liu et al. 2025: about 0.2 lr, AdamW's update RMS


@pytest.mark.usefixtures("bf16_native")
def test_muon_original_scale_is_corrected_for_conv1d():
    from transformers.pytorch_utils import Conv1D

    # fan_in 8 -> fan_out 32 stored both ways: nn.Linear as (32, 8), Conv1D as (8, 32).
    assert conv1d_lr_multiplier((8, 32), "original") == pytest.approx(2.0)
    assert conv1d_lr_multiplier((32, 8), "original") == pytest.approx(0.5)
    assert conv1d_lr_multiplier((8, 32), "match_rms_adamw") == 1.0
    linear, conv = nn.Linear(8, 32, bias=False), Conv1D(32, 8)
    with torch.no_grad():
        conv.weight.copy_(linear.weight.T)
    grad = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    results = []
    for module, g in ((linear, grad), (conv, grad.T.contiguous())):
        opt = create_optimizer("muon", nn.Sequential(module), adjust_lr_fn="original", weight_decay=0.1)
        before = module.weight.detach().clone()
        module.weight.grad = g
        if module.bias is not None:
            module.bias.grad = torch.zeros_like(module.bias)
        opt.step()
        results.append(module.weight.detach() - before)
    assert float(results[0].abs().max()) > 0
    torch.testing.assert_close(results[1], results[0].T, rtol=1e-6, atol=1e-9)


def test_muon_groups_follow_lambdalr_and_survive_reload():
    model = _tiny_gpt2()
    opt = create_optimizer("muon", model, lr=1e-3, muon_lr=2e-2)
    base = [g["lr"] for g in opt.param_groups]
    assert base == [2e-2, 1e-3, 1e-3]
    sched = get_scheduler("linear", opt, num_warmup_steps=2, num_training_steps=10)  # the Trainer's LambdaLR
    for _ in range(3):
        _set_grads(model.parameters(), 0)
        opt.step()
        sched.step()
    factor = (10 - 3) / (10 - 2)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([b * factor for b in base])
    # The inner torch optimizers see the same dicts, so they step with the scheduled lr.
    muon, adamw = opt.inner_optimizers
    assert muon.param_groups[0] is opt.param_groups[0] and adamw.param_groups[1] is opt.param_groups[2]
    fresh = create_optimizer("muon", _tiny_gpt2())
    fresh.load_state_dict(_roundtrip(opt.state_dict()))
    muon, adamw = fresh.inner_optimizers
    assert muon.param_groups == [fresh.param_groups[0]] and muon.param_groups[0] is fresh.param_groups[0]
    assert adamw.state is fresh.state and len(fresh.state) == len(list(model.parameters()))


def test_muon_rejects_non_matrix_in_muon_group():
    with pytest.raises(ValueError, match=r"2-D matrices, got 'b' with shape \(4,\)"):
        MuonWithAdamW([{"params": [("b", nn.Parameter(torch.zeros(4)))], "use_muon": True}])
    with pytest.raises(ValueError, match="use_muon"):
        MuonWithAdamW([{"params": [nn.Parameter(torch.zeros(4, 4))]}])


# ---------------------------------------------------------------------------------------------
# Registry: groups, resume, training
# ---------------------------------------------------------------------------------------------


class _Params(nn.Module):
    """A module holding given tensors; 2-D ones are decayed, 1-D ones are 'bias' (not decayed)."""

    def __init__(self, params):
        super().__init__()
        for i, p in enumerate(params):
            self.register_parameter(f"w{i}" if p.dim() > 1 else f"bias{i}", p)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_weight_decay_only_on_decay_params(name):
    model = _tiny_gpt2()
    opt = create_optimizer(name, model, weight_decay=0.3)
    for g in opt.param_groups:
        for n in g["param_names"]:
            decays = not (n.endswith(".bias") or ".ln_" in n)
            assert (g["weight_decay"] > 0) == decays, (n, g["weight_decay"])
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_muon_adamw_lr_ratio_is_the_adamw_part_at_a_multiple_of_muons_lr():
    """adamw_lr_ratio=0.25 is muon_lr=lr with the AdamW part at lr/4: the same groups, the same steps."""
    ratio, explicit = _tiny_gpt2(), _tiny_gpt2()
    a = create_optimizer("muon", ratio, lr=8e-3, adamw_lr_ratio=0.25, ns_dtype="float32")
    b = create_optimizer("muon", explicit, lr=2e-3, muon_lr=8e-3, ns_dtype="float32")
    assert [g["lr"] for g in a.param_groups] == [8e-3, 2e-3, 2e-3] == [g["lr"] for g in b.param_groups]
    for step in range(3):
        for model, opt in ((ratio, a), (explicit, b)):
            _set_grads(model.parameters(), step)
            opt.step()
    for (name, p), q in zip(ratio.named_parameters(), explicit.parameters()):
        assert torch.equal(p, q), name
    assert not torch.equal(ratio.transformer.wte.weight, _tiny_gpt2().transformer.wte.weight)  # it trained


def test_muon_adamw_lr_ratio_resumes_under_a_schedule_bit_for_bit():
    """The long-run settings (the AdamW part at 0.25x, cautious weight decay) under a warmup + cosine schedule:
    a run saved after 3 steps and resumed into a fresh optimizer and scheduler equals the straight run, and the
    AdamW part stays at 0.25x Muon's lr through the schedule."""
    from transformers import get_cosine_schedule_with_warmup

    batch, kw = _batch(), dict(lr=8e-3, weight_decay=0.1, adamw_lr_ratio=0.25, cautious_wd=True, ns_dtype="float32")

    def build(model):
        opt = create_optimizer("muon", model, **kw)
        return opt, get_cosine_schedule_with_warmup(opt, num_warmup_steps=2, num_training_steps=6)

    def train(model, opt, sched, steps):
        for _ in range(steps):
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()
            sched.step()
            opt.zero_grad()

    straight = _tiny_gpt2()
    opt, sched = build(straight)
    train(straight, opt, sched, 3)
    saved = copy.deepcopy(straight.state_dict()), _roundtrip(opt.state_dict()), _roundtrip(sched.state_dict())
    train(straight, opt, sched, 2)
    lrs = [g["lr"] for g in opt.param_groups]
    assert lrs[0] > 0 and lrs[1:] == [pytest.approx(lrs[0] * 0.25, rel=1e-12)] * 2, lrs

    resumed = _tiny_gpt2(seed=1)
    resumed.load_state_dict(saved[0])
    opt2, sched2 = build(resumed)
    opt2.load_state_dict(saved[1])
    sched2.load_state_dict(saved[2])
    train(resumed, opt2, sched2, 2)
    assert [g["lr"] for g in opt2.param_groups] == lrs
    for (n, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), n
    assert not torch.equal(saved[0]["transformer.wte.weight"], straight.transformer.wte.weight)  # it trained on


def _roundtrip(state_dict):
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def _batch(vocab=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (8, 16), generator=gen)


def _train(model, opt, steps, batch):
    losses = []
    for _ in range(steps):
        loss = model(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


RESUME_KW = {
    "adamw": {},
    "lion": {},
    "ademamix": {"T_alpha_beta3": 6},
    "soap": {"precondition_frequency": 2},  # refreshes before and after the save
    "muon": {},
}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_state_dict_resume_is_bit_for_bit(name):
    batch = _batch()
    straight = _tiny_gpt2()
    opt = create_optimizer(name, straight, **RESUME_KW[name])
    _train(straight, opt, 3, batch)
    saved_model = copy.deepcopy(straight.state_dict())
    saved_opt = _roundtrip(opt.state_dict())
    _train(straight, opt, 3, batch)

    resumed = _tiny_gpt2(seed=1)  # different init: everything must come from the checkpoint
    resumed.load_state_dict(saved_model)
    opt2 = create_optimizer(name, resumed, **RESUME_KW[name])
    opt2.load_state_dict(saved_opt)
    _train(resumed, opt2, 3, batch)
    for (n, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), n
    # negative control: the checkpoint is not the end state
    assert not torch.equal(saved_model["transformer.h.0.mlp.c_fc.weight"], straight.transformer.h[0].mlp.c_fc.weight)


TRAIN_LR = {"adamw": 3e-3, "lion": 1e-3, "ademamix": 3e-3, "soap": 3e-3, "muon": 3e-3}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_tiny_gpt2_loss_falls(name):
    model = _tiny_gpt2()
    kwargs = {"T_alpha_beta3": 20} if name == "ademamix" else {}
    opt = create_optimizer(name, model, lr=TRAIN_LR[name], **kwargs)
    before = [p.detach().clone() for p in model.parameters()]
    losses = _train(model, opt, 20, _batch())
    assert losses[0] == pytest.approx(math.log(64), abs=0.15)
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


# ---------------------------------------------------------------------------------------------
# Bad input and the plain-Trainer entry points
# ---------------------------------------------------------------------------------------------


def test_unknown_optimizer_name_lists_known_ones():
    with pytest.raises(ValueError, match=r"^optimizer: got 'lino'; allowed: adamw, lion, ademamix, soap, muon \(did you mean 'lion'\?\)$"):
        create_optimizer("lino", _tiny_gpt2())
    with pytest.raises(ValueError, match="got 'sgd'"):
        optimizer_cls_and_kwargs_for("sgd")


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("adamw", {"lr": -1e-3}, exact('lr: got -0.001 for AdamW; must be a finite number >= 0')),
        ("adamw", {"eps": -1e-8}, exact('eps: got -1e-08 for AdamW; must be a finite number >= 0')),
        ("adamw", {"weight_decay": -0.1}, exact('weight_decay: got -0.1 for AdamW; must be a finite number >= 0')),
        ("lion", {"betas": (0.9, 1.0)}, exact('betas: got [0.9, 1.0] for Lion; must be a list of 2 numbers in [0, 1)')),
        ("lion", {"lr": "1e-4"}, exact("lr: got '1e-4' for Lion; must be a finite number >= 0")),
        ("lion", {"lr": float("nan")}, exact('lr: got nan for Lion; must be a finite number >= 0')),
        ("ademamix", {"betas": (0.9, 0.999)}, exact('betas: got [0.9, 0.999] for AdEMAMix; must be a list of 3 numbers in [0, 1)')),
        ("ademamix", {"alpha": -1.0}, exact('alpha: got -1.0 for AdEMAMix; must be a finite number >= 0')),
        ("ademamix", {"T_alpha_beta3": 0}, exact('T_alpha_beta3: got 0 for AdEMAMix; must be an integer >= 1')),
        ("ademamix", {"betas": (0.0, 0.999, 0.9999), "T_alpha_beta3": 10}, exact('betas: got [0.0, 0.999, 0.9999] for AdEMAMix; betas[0] and betas[2] must be > 0 when T_alpha_beta3 is set (the beta3 warmup interpolates their logarithms)')),
        ("soap", {"precondition_frequency": 0}, exact('precondition_frequency: got 0 for SOAP; must be an integer >= 1')),
        ("soap", {"betas": (-0.1, 0.95)}, exact('betas: got [-0.1, 0.95] for SOAP; must be a list of 2 numbers in [0, 1)')),
        ("soap", {"shampoo_beta": 1.5}, exact('shampoo_beta: got 1.5 for SOAP; must be a number in [0, 1)')),
        ("muon", {"momentum": 1.0}, exact('momentum: got 1.0 for Muon; must be a number in [0, 1)')),
        ("muon", {"adjust_lr_fn": "rms"}, exact("adjust_lr_fn: got 'rms' for Muon; allowed: match_rms_adamw, original, spectral")),
        ("muon", {"ns_steps": 0}, exact('ns_steps: got 0 for Muon; must be an integer in [1, 99]')),
        ("muon", {"muon_lr": -1.0}, exact('muon_lr: got -1.0 for Muon; must be a finite number >= 0')),
        ("muon", {"adamw_lr_ratio": 0.0}, exact("adamw_lr_ratio: got 0.0 for Muon; must be a finite number > 0")),
        ("muon", {"adamw_lr_ratio": True}, exact("adamw_lr_ratio: got True for Muon; must be a finite number > 0")),
        ("muon", {"adamw_lr_ratio": 0.25, "muon_lr": 2e-2}, r"^adamw_lr_ratio: got 0.25 with muon_lr 0.02; .*not both$"),
        ("muon", {"adamw_lr_ratio": 0.25, "adjust_lr_fn": "original"},
         exact("adamw_lr_ratio: got 0.25 with adjust_lr_fn 'original', where Muon's lr is not on AdamW's scale; use it "
               "with adjust_lr_fn 'match_rms_adamw'")),
        ("soap", {"precondition_freq": 10}, r"soap has no option 'precondition_freq'.*Did you mean 'precondition_frequency'"),
    ],
)
def test_bad_hyperparameters_fail_naming_the_field(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        create_optimizer(name, _tiny_gpt2(), **kwargs)


@pytest.mark.parametrize(
    "raw, expected",
    [
        ({"lr": "1e-5", "betas": ["0.9", 0.98]}, {"lr": 1e-5, "betas": [0.9, 0.98]}),
        ('{"weight_decay": "0.5"}', {"weight_decay": 0.5}),
        (None, {}),
    ],
)
def test_parse_optimizer_kwargs(raw, expected):
    assert parse_optimizer_kwargs("lion", raw) == expected


def test_parse_optimizer_kwargs_types_and_errors():
    parsed = parse_optimizer_kwargs("soap", {"precondition_frequency": "20", "precondition_1d": "true", "shampoo_beta": "null"})
    assert parsed == {"precondition_frequency": 20, "precondition_1d": True, "shampoo_beta": None}
    assert type(parsed["precondition_frequency"]) is int
    with pytest.raises(ValueError, match="optimizer_kwargs must be a JSON object"):
        parse_optimizer_kwargs("lion", "{lr: 1}")
    with pytest.raises(ValueError, match="lion has no option 'alpha'"):
        parse_optimizer_kwargs("lion", {"alpha": 1})


def test_plain_trainer_with_optimizer_cls_and_kwargs(tmp_path):
    from datasets import Dataset
    from transformers import Trainer, TrainerCallback, TrainingArguments

    class RecordLr(TrainerCallback):
        lrs = []

        def on_step_end(self, args, state, control, optimizer=None, **kwargs):
            self.lrs.append([g["lr"] for g in optimizer.param_groups])

    model = _tiny_gpt2()
    data = Dataset.from_dict({"input_ids": _batch().tolist(), "labels": _batch().tolist()})
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=4, per_device_train_batch_size=4, lr_scheduler_type="linear",
        warmup_steps=2, report_to=[], use_cpu=True, save_strategy="no", logging_strategy="no",
        disable_tqdm=True,
    )
    before = model.transformer.h[0].mlp.c_fc.weight.detach().clone()
    trainer = Trainer(
        model, args, train_dataset=data, callbacks=[RecordLr()],
        optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for("muon", lr=1e-3, weight_decay=0.1, muon_lr=2e-2),
    )
    trainer.train()
    assert isinstance(trainer.optimizer.optimizer, MuonWithAdamW)
    factors = [0.5, 1.0, 0.5, 0.0]  # linear warmup over 2 steps, then linear decay to step 4
    assert RecordLr.lrs == [pytest.approx([2e-2 * f, 1e-3 * f, 1e-3 * f]) for f in factors]
    assert not torch.equal(before, model.transformer.h[0].mlp.c_fc.weight)


# ---------------------------------------------------------------------------------------------
# FastTrainingArguments(optimizer=..., optimizer_kwargs=...) and FastTrainer
# ---------------------------------------------------------------------------------------------


def test_trainer_optimizer_kwargs_from_args():
    from hf_fasttrain import FastTrainingArguments
    from hf_fasttrain.optim import trainer_optimizer_kwargs

    args = FastTrainingArguments(
        output_dir="x", optimizer="adamw", learning_rate=2e-3, weight_decay=0.05, adam_beta2=0.95,
        optimizer_kwargs={"eps": "1e-6"},
    )
    assert trainer_optimizer_kwargs(args, 100) == {"lr": 2e-3, "weight_decay": 0.05, "betas": (0.9, 0.95), "eps": 1e-6}
    args = FastTrainingArguments(output_dir="x", optimizer="ademamix", optimizer_kwargs='{"lr": "3e-3"}')
    assert args.optimizer_kwargs == {"lr": 3e-3}
    assert trainer_optimizer_kwargs(args, 250) == {"lr": 3e-3, "weight_decay": 0.0, "T_alpha_beta3": 250}
    args = FastTrainingArguments(output_dir="x", optimizer="muon", learning_rate=1e-3)
    assert trainer_optimizer_kwargs(args, 250) == {"lr": 1e-3, "weight_decay": 0.0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"optimizer": "lino"}, r"optimizer: got 'lino'; allowed: adamw, lion, ademamix, soap, muon \(did you mean 'lion'\?\)"),
        ({"optimizer_kwargs": {"lr": 1e-3}}, r"optimizer_kwargs: got \{'lr': 0.001\}; only allowed together with `optimizer`"),
        ({"optimizer": "lion", "optim": "adafactor"}, r"optim: got 'adafactor'; set either `optim` or `optimizer`"),
        ({"optimizer": "lion", "optim_args": "foo=1"}, r"optim_args: got 'foo=1'; applies to `optim` only"),
        ({"optimizer": "lion", "optimizer_kwargs": {"betas": [0.9, "1.2"]}}, exact('betas: got [0.9, 1.2] for Lion; must be a list of 2 numbers in [0, 1)')),
        ({"optimizer": "soap", "optimizer_kwargs": '{"precondition_frequency": "0"}'}, exact('precondition_frequency: got 0 for SOAP; must be an integer >= 1')),
        ({"optimizer": "lion", "learning_rate": -1.0}, r"learning_rate: got -1.0; must be a finite number > 0"),
        ({"optimizer": "muon", "optimizer_kwargs": {"adjust": "original"}}, r"muon has no option 'adjust'.*Did you mean 'adjust_lr_fn'"),
        ({"optimizer": "lion", "optimizer_kwargs": "{betas: 1}"}, r"optimizer_kwargs must be a JSON object"),
    ],
)
def test_fast_training_arguments_reject_bad_optimizer_settings(kwargs, message):
    from hf_fasttrain import FastTrainingArguments

    with pytest.raises(ValueError, match=message):
        FastTrainingArguments(output_dir="x", **kwargs)


def test_recipe_and_command_line_set_the_optimizer(tmp_path):
    from hf_fasttrain.config.recipes import parse_config

    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "output_dir: out\noptimizer: soap\noptimizer_kwargs: {precondition_frequency: '20', betas: [0.9, '0.95']}\n"
    )
    _, _, args = parse_config(["--config", str(recipe)])
    assert (args.optimizer, args.optimizer_kwargs) == ("soap", {"precondition_frequency": 20, "betas": [0.9, 0.95]})
    _, _, args = parse_config(["--config", str(recipe), "--optimizer", "muon", "--optimizer_kwargs", '{"muon_lr": "2e-2"}'])
    assert (args.optimizer, args.optimizer_kwargs) == ("muon", {"muon_lr": 0.02})


def _fast_trainer(model, lm, tok, args):
    from conftest import make_tiny_trainer

    return make_tiny_trainer(tok, lm, args, model=model, eval_dataset=lm["validation"])


FAST_LR = {"adamw": 3e-3, "lion": 3e-3, "ademamix": 3e-3, "soap": 1e-2, "muon": 3e-3}


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_fast_trainer_lowers_eval_loss_with_each_optimizer(name, tiny_lm, tiny_tokenizer, tmp_path):
    from conftest import make_tiny_gpt2, tiny_args

    model = make_tiny_gpt2(len(tiny_tokenizer))
    args = tiny_args(tmp_path, max_steps=15, logging_steps=5, optimizer=name, learning_rate=FAST_LR[name],
                     weight_decay=0.1, warmup_steps=2, lr_scheduler_type="cosine")
    trainer = _fast_trainer(model, tiny_lm, tiny_tokenizer, args)
    start = trainer.evaluate()["eval_loss"]
    trainer.train()
    end = trainer.evaluate()["eval_loss"]
    expected = {"adamw": "AdamW", "lion": "Lion", "ademamix": "AdEMAMix", "soap": "SOAP", "muon": "MuonWithAdamW"}
    assert type(trainer.optimizer.optimizer).__name__ == expected[name]
    if name == "ademamix":  # warmups span the run
        assert trainer.optimizer.optimizer.param_groups[0]["T_alpha_beta3"] == 15
    assert end < start - 0.5, (start, end)


def test_fast_trainer_resume_with_lion_is_bit_for_bit(tiny_lm, tiny_tokenizer, tmp_path):
    from conftest import make_tiny_gpt2, tiny_args

    def args(out):
        return tiny_args(out, max_steps=6, save_strategy="steps", save_steps=3, optimizer="lion",
                         learning_rate=1e-3, weight_decay=1.0, warmup_steps=2, lr_scheduler_type="cosine")

    straight = make_tiny_gpt2(len(tiny_tokenizer))
    _fast_trainer(straight, tiny_lm, tiny_tokenizer, args(tmp_path / "a")).train()
    resumed = make_tiny_gpt2(len(tiny_tokenizer), seed=1)
    trainer = _fast_trainer(resumed, tiny_lm, tiny_tokenizer, args(tmp_path / "b"))
    trainer.train(resume_from_checkpoint=str(tmp_path / "a" / "checkpoint-3"))
    assert isinstance(trainer.optimizer.optimizer, Lion)
    for (n, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), n
    # negative control: the checkpoint at step 3 is not the end state
    from safetensors.torch import load_file

    mid = load_file(str(tmp_path / "a" / "checkpoint-3" / "model.safetensors"))
    assert not torch.equal(mid["transformer.h.0.mlp.c_fc.weight"], straight.transformer.h[0].mlp.c_fc.weight)
