"""SOAP on skinny matrices (LoRA's r x d): the long side gets no preconditioner unless skinny_ratio=None;
against the float64 reference of tests/test_optim.py, state bytes against AdamW's, resume bit for bit."""

import pytest
import torch
from torch import nn

from hf_fasttrain.optim import SOAP, check_optimizer_options, create_optimizer, soap_preconditioned_dims
from test_optim import SOAP_KW, _assert_close, _problem, _roundtrip, _run, ref_soap_matrix

SOAP_ARGS = dict(lr=0.02, betas=(0.9, 0.95), shampoo_beta=0.9, eps=1e-8, weight_decay=0.1, precondition_frequency=3)


@pytest.mark.parametrize(
    "shape, max_precond_dim, precondition_1d, skinny_ratio, expected",
    [
        ((4, 512), 10000, False, 16, [0]),  # LoRA's lora_A: only the 4 x 4 factor
        ((512, 4), 10000, False, 16, [1]),  # lora_B
        ((4, 512), 10000, False, None, [0, 1]),  # off: both, as the paper's code
        ((4, 64), 10000, False, 16, [0, 1]),  # ratio 16 exactly: kept
        ((4, 65), 10000, False, 16, [0]),
        ((768, 3072), 10000, False, 16, [0, 1]),  # an MLP matrix
        ((50257, 768), 10000, False, 16, [1]),  # a vocabulary: over max_precond_dim, and skinny
        ((50257, 768), 10000, False, None, [1]),
        ((512, 3, 3, 3), 10000, False, 16, [1, 2, 3]),  # 512 > 16 * 27
        ((512,), 10000, False, 16, []),  # 1-D: only with precondition_1d, never "skinny"
        ((512,), 10000, True, 16, [0]),
        ((512,), 100, True, 16, []),
    ],
)
def test_soap_preconditioned_dims(shape, max_precond_dim, precondition_1d, skinny_ratio, expected):
    assert soap_preconditioned_dims(shape, max_precond_dim, precondition_1d, skinny_ratio) == expected


def _reference(inits, targets, noises, max_dims):
    kw = {key: v for key, v in SOAP_KW.items() if key not in ("shampoo_beta", "freq")}
    out = []
    for k, (x, y) in enumerate(zip(inits, targets)):
        theta = ref_soap_matrix(x.tolist(), y.tolist(), [n[k].tolist() for n in noises], **kw,
                                shampoo_beta=SOAP_KW["shampoo_beta"], freq=SOAP_KW["freq"], max_dim=max_dims[k])
        out.append([v for row in theta for v in row])
    return out


# (shapes, skinny_ratio) -> the reference's max_dim per matrix (a side over it is not rotated) and the
# factors kept. A rotated side must have a factor of full rank, or rank one less: the eigenbasis of a
# larger null space is arbitrary (eigh and the reference's Jacobi pick different ones), so the long side
# of (2, 9) is compared only unrotated.
SKINNY_CASES = [
    ([(2, 9), (9, 2), (3, 4)], 4, [8, 8, 10000], [["GG_0"], ["GG_1"], ["GG_0", "GG_1"]]),
    ([(3, 4), (4, 3), (3, 3)], 1, [3, 3, 10000], [["GG_0"], ["GG_1"], ["GG_0", "GG_1"]]),
    ([(3, 4), (4, 3), (3, 3)], None, [10000, 10000, 10000], [["GG_0", "GG_1"]] * 3),
]


@pytest.mark.parametrize("shapes, skinny_ratio, max_dims, factors", SKINNY_CASES)
def test_soap_skinny_matrices_match_the_reference(shapes, skinny_ratio, max_dims, factors):
    inits, targets, noises = _problem(3, shapes=shapes, steps=8)
    got, opt = _run(lambda ps: SOAP(ps, **SOAP_ARGS, skinny_ratio=skinny_ratio), inits, targets, noises)
    assert [sorted(k for k in opt.state[p] if k.startswith("GG")) for p in opt.param_groups[0]["params"]] == factors
    _assert_close(got, _reference(inits, targets, noises, max_dims), rtol=1e-9, atol=1e-11)


def test_square_ish_matrices_are_unchanged_bit_for_bit():
    shapes = [(4, 3), (5,), (3, 4), (16, 1), (1, 16)]  # ratios up to 16: both sides under either setting
    inits, targets, noises = _problem(4, shapes=shapes, steps=8)
    default, _ = _run(lambda ps: SOAP(ps, **SOAP_ARGS), inits, targets, noises)
    off, _ = _run(lambda ps: SOAP(ps, **SOAP_ARGS, skinny_ratio=None), inits, targets, noises)
    assert all(torch.equal(a, b) for a, b in zip(default, off))


def _state_bytes(opt):
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))


def _lora_pair():
    torch.manual_seed(0)
    return nn.Parameter(torch.randn(4, 512)), nn.Parameter(torch.randn(512, 4))  # lora_A, lora_B of r=4, d=512


def _steps(params, opt, n, seed=0):
    gen = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()


@pytest.mark.parametrize("skinny_ratio", [16, None])
def test_lora_shaped_params_state_against_adamw(skinny_ratio):
    params = _lora_pair()
    opt = SOAP(params, skinny_ratio=skinny_ratio)
    _steps(params, opt, 3)
    adamw_params = _lora_pair()
    adamw = torch.optim.AdamW(adamw_params)
    _steps(adamw_params, adamw, 3)
    ratio = _state_bytes(opt) / _state_bytes(adamw)
    if skinny_ratio is None:  # the old behaviour: a 512 x 512 factor on each long side
        assert [sorted(k for k in opt.state[p] if k.startswith("GG")) for p in params] == [["GG_0", "GG_1"]] * 2
        assert tuple(opt.state[params[0]]["GG_1"].shape) == tuple(opt.state[params[1]]["GG_0"].shape) == (512, 512)
        assert ratio > 100
    else:
        assert sorted(opt.state[params[0]]) == ["GG_0", "Q_0", "exp_avg", "exp_avg_sq", "step"]
        assert sorted(opt.state[params[1]]) == ["GG_1", "Q_1", "exp_avg", "exp_avg_sq", "step"]
        assert tuple(opt.state[params[0]]["Q_0"].shape) == tuple(opt.state[params[1]]["Q_1"].shape) == (4, 4)
        assert 1.0 <= ratio < 1.02  # 2 x 2048 + 2 x 16 numbers per matrix against AdamW's 2 x 2048
    assert all(not torch.equal(p.detach(), q.detach()) for p, q in zip(params, _lora_pair()))  # they trained


def test_soap_resume_with_a_skinny_param_is_bit_for_bit():
    def fresh():
        a, b = _lora_pair()
        return [a, b, nn.Parameter(torch.randn(6, 5, generator=torch.Generator().manual_seed(1)))]

    kw = dict(lr=3e-3, precondition_frequency=2)  # refreshes before and after the save
    straight = fresh()
    opt = SOAP(straight, **kw)
    _steps(straight, opt, 3, seed=0)
    saved_params = [p.detach().clone() for p in straight]
    saved_opt = _roundtrip(opt.state_dict())
    _steps(straight, opt, 3, seed=1)

    resumed = [nn.Parameter(p.clone()) for p in saved_params]
    opt2 = SOAP(resumed, **kw)
    opt2.load_state_dict(saved_opt)
    assert sorted(opt2.state[resumed[0]]) == ["GG_0", "Q_0", "exp_avg", "exp_avg_sq", "step"]
    _steps(resumed, opt2, 3, seed=1)
    assert all(torch.equal(a, b) for a, b in zip(straight, resumed))
    assert not torch.equal(saved_params[0], straight[0].detach())  # negative control: the checkpoint is not the end


def test_a_checkpoint_from_before_skinny_ratio_keeps_both_sides():
    params = _lora_pair()
    old = SOAP(params, skinny_ratio=None)  # what the code did before: both sides
    _steps(params, old, 2)
    saved = _roundtrip(old.state_dict())
    for group in saved["param_groups"]:
        del group["skinny_ratio"]  # saved by a version without the option
    opt = SOAP(params)
    opt.load_state_dict(saved)
    _steps(params, opt, 2, seed=1)
    assert sorted(k for k in opt.state[params[0]] if k.startswith("GG")) == ["GG_0", "GG_1"]


def test_create_soap_passes_skinny_ratio_and_checks_it():
    model = nn.Sequential(nn.Linear(512, 4, bias=False), nn.Linear(4, 512, bias=False))
    assert create_optimizer("soap", model).param_groups[0]["skinny_ratio"] == 16
    assert create_optimizer("soap", model, skinny_ratio=None).param_groups[0]["skinny_ratio"] is None
    for bad in (0.5, float("inf"), "16", True):
        with pytest.raises(ValueError, match=r"^skinny_ratio: got .* for SOAP; must be a finite number >= 1 or null \(off\)$"):
            check_optimizer_options("soap", skinny_ratio=bad)
