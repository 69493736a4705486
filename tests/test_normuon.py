"""NorMuon (Muon with ``normuon_beta2``): the authors' update step by step, layouts, resume, refusals, training."""

import copy
import math

import pytest
import torch
from torch import nn

from hf_fasttrain.optim import MuonWithAdamW, check_sharding_support, create_optimizer, newton_schulz
from hf_fasttrain.optim.normuon import NORMUON_STATE, neuron_normalize
from test_optim import _batch, _roundtrip, _tiny_gpt2, _train


def _authors_step(param, grad, momentum, second, lr, wd, mu=0.95, beta2=0.95):
    """One step of the authors' NorMuon (normuon_update + SingleDeviceNorMuon.step, arXiv:2510.05491's code),
    with this package's Newton-Schulz and Muon's "match_rms_adamw" scale in place of sqrt(max(1, A/B))."""
    momentum.lerp_(grad, 1 - mu)
    update = grad.lerp(momentum, mu)
    update = newton_schulz(update, "jordan", 5, 1e-7).float()
    vnorm = update.norm(dim=(-2, -1), keepdim=True)
    v_mean = torch.mean(update * update, dim=-1, keepdim=True)
    second.lerp_(v_mean, 1 - beta2)
    update.mul_(1 / second.sqrt().add_(1e-10))
    update.mul_(vnorm / update.norm(dim=(-2, -1), keepdim=True).add_(1e-10))
    param.mul_(1 - lr * wd)
    param.add_(update, alpha=-lr * 0.2 * math.sqrt(max(param.shape)))


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
@pytest.mark.usefixtures("bf16_native")
def test_steps_equal_the_authors_update(shape):
    gen = torch.Generator().manual_seed(0)
    w = nn.Parameter(torch.randn(shape, generator=gen))
    ref = w.detach().clone()
    momentum, second = torch.zeros(shape), torch.zeros(shape[0], 1)
    opt = MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.02, weight_decay=0.1, normuon_beta2=0.95)
    muon = MuonWithAdamW([{"params": [nn.Parameter(w.detach().clone())], "use_muon": True}], lr=0.02,
                         weight_decay=0.1)
    for _ in range(5):
        g = torch.randn(shape, generator=gen) * torch.linspace(0.1, 3.0, shape[0])[:, None]  # unequal neurons
        w.grad = g.clone()
        muon.param_groups[0]["params"][0].grad = g.clone()
        opt.step()
        muon.step()
        _authors_step(ref, g.clone(), momentum, second, lr=0.02, wd=0.1)
    torch.testing.assert_close(w.detach(), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(opt.state[w][NORMUON_STATE], second, rtol=1e-6, atol=0)
    # and it is not Muon: the per-neuron normalisation moved the weights elsewhere
    assert float((muon.param_groups[0]["params"][0].detach() - w.detach()).abs().max()) > 1e-4


def test_normalize_equalises_neurons_and_keeps_the_norm():
    o = torch.tensor([[3.0, 0.0, 0.0], [0.0, 1.0, 1.0]])
    v = torch.zeros(2, 1)
    out = neuron_normalize(o, v, 0.0, reduce_dim=1)
    torch.testing.assert_close(v, torch.tensor([[3.0], [2 / 3]]))  # mean square of each row
    assert float(out.norm()) == pytest.approx(float(o.norm()), rel=1e-6)
    rows = out.square().mean(dim=1)
    assert float(rows[0]) == pytest.approx(float(rows[1]), rel=1e-6)  # every neuron the same RMS
    # with a long memory the first step's statistics stay: v is a running average, not this step's
    v2 = torch.full((2, 1), 1.0)
    neuron_normalize(o, v2, 0.5, reduce_dim=1)
    torch.testing.assert_close(v2, torch.tensor([[2.0], [5 / 6]]))


def test_conv1d_gets_the_linear_layers_update_transposed():
    from transformers.pytorch_utils import Conv1D

    linear, conv = nn.Linear(8, 32, bias=False), Conv1D(32, 8)
    with torch.no_grad():
        conv.weight.copy_(linear.weight.T)
    conv.bias.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(32, 8, generator=gen) * torch.linspace(0.2, 2.0, 32)[:, None] for _ in range(3)]
    results = []
    for module, transpose in ((linear, False), (conv, True)):
        opt = create_optimizer("muon", nn.Sequential(module), lr=0.01, weight_decay=0.1, normuon_beta2=0.9)
        assert [g.get("normuon_dim") for g in opt.param_groups if g["use_muon"]] == [0 if transpose else 1]
        before = module.weight.detach().clone()
        for g in grads:
            module.weight.grad = g.T.contiguous() if transpose else g.clone()
            opt.step()
        results.append(module.weight.detach() - before)
        assert opt.state[module.weight][NORMUON_STATE].shape == ((1, 32) if transpose else (32, 1))
    assert float(results[0].abs().max()) > 0
    torch.testing.assert_close(results[1], results[0].T, rtol=1e-5, atol=1e-7)


def test_gpt2_groups_split_by_layout_and_plain_muon_keeps_its_groups():
    model = _tiny_gpt2()
    plain = create_optimizer("muon", model)
    nor = create_optimizer("muon", model, normuon_beta2=0.95)
    assert [g["use_muon"] for g in plain.param_groups] == [True, False, False]
    assert "normuon_dim" not in plain.param_groups[0] and plain.param_groups[0]["normuon_beta2"] is None
    muon_groups = [g for g in nor.param_groups if g["use_muon"]]
    assert [g["normuon_dim"] for g in muon_groups] == [0]  # GPT-2's hidden matrices are all Conv1D
    assert muon_groups[0]["param_names"] == plain.param_groups[0]["param_names"]


def test_resume_is_bit_for_bit_and_an_old_checkpoint_loads():
    batch = _batch()
    straight = _tiny_gpt2()
    opt = create_optimizer("muon", straight, lr=3e-3, normuon_beta2=0.95)
    _train(straight, opt, 3, batch)
    saved_model, saved_opt = copy.deepcopy(straight.state_dict()), _roundtrip(opt.state_dict())
    _train(straight, opt, 3, batch)
    resumed = _tiny_gpt2(seed=1)
    resumed.load_state_dict(saved_model)
    opt2 = create_optimizer("muon", resumed, lr=3e-3, normuon_beta2=0.95)
    opt2.load_state_dict(saved_opt)
    _train(resumed, opt2, 3, batch)
    for (n, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), n
    # a plain-Muon checkpoint (groups without the NorMuon keys) still loads and steps as Muon
    old_model = _tiny_gpt2()
    old = create_optimizer("muon", old_model, lr=3e-3)
    _train(old_model, old, 1, batch)
    state = _roundtrip(old.state_dict())
    assert [g.pop("normuon_beta2", "absent") for g in state["param_groups"]] == [None, "absent", "absent"]
    model = _tiny_gpt2()
    again = create_optimizer("muon", model, lr=3e-3)
    again.load_state_dict(state)
    assert _train(model, again, 1, batch)


def test_tiny_gpt2_loss_falls_with_normuon():
    model = _tiny_gpt2()
    opt = create_optimizer("muon", model, lr=3e-3, normuon_beta2=0.95)
    losses = _train(model, opt, 20, _batch())
    assert losses[-1] < losses[0] - 0.5, losses


@pytest.mark.parametrize("value", [1.0, -0.1, "0.95", True])
def test_bad_beta2_is_refused_naming_the_field(value):
    with pytest.raises(ValueError, match=r"^normuon_beta2: got .* for Muon; must be null \(plain Muon\) or a number in \[0, 1\)$"):
        create_optimizer("muon", _tiny_gpt2(), normuon_beta2=value)


def test_fsdp2_is_refused_in_one_line_ddp_is_not():
    check_sharding_support("muon", "ddp", normuon=True)
    check_sharding_support("muon", "fsdp2")  # plain Muon works there
    with pytest.raises(ValueError) as err:
        check_sharding_support("muon", "fsdp2", normuon=True)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("optimizer_kwargs: normuon_beta2 (NorMuon) does not work under FSDP2")
    assert "use DDP" in str(err.value)
    with pytest.raises(ValueError, match="normuon_beta2"):
        create_optimizer("muon", _tiny_gpt2(), sharding="fsdp2", normuon_beta2=0.95)
