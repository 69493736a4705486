"""Hyperball (Muon with ``hyperball``): the authors' MuonH step by step, layouts, resume, refusals, training."""

import copy
import math

import pytest
import torch
from torch import nn

from hf_fasttrain.optim import MuonWithAdamW, check_sharding_support, create_optimizer, newton_schulz
from hf_fasttrain.optim.hyperball import HYPERBALL_STATE, hyperball_step, initial_radius
from test_optim import _batch, _roundtrip, _tiny_gpt2, _train


def _authors_step(param, grad, momentum, radius, lr, mu=0.95, eps=1e-7):
    """One step of the authors' MuonH (their ``_single_tensor_muon`` of ``MuonH``, written out for one
    nn.Linear weight): Nesterov momentum, Newton-Schulz, the update's columns scaled to the initial column
    norms, the step at Muon's lr, the columns put back at those norms. Muon's "match_rms_adamw" scale, as
    this package's default, in place of torch's default."""
    momentum.lerp_(grad, 1 - mu)
    update = grad.lerp(momentum, mu)
    update = newton_schulz(update, "jordan", 5, eps).float()
    update = update / update.norm(dim=0, keepdim=True).clamp_min(eps) * radius
    param.add_(update, alpha=-lr * 0.2 * math.sqrt(max(param.shape)))
    param.mul_(radius / param.norm(dim=0, keepdim=True).clamp_min(eps))


@pytest.mark.parametrize("shape", [(24, 40), (40, 24)])
@pytest.mark.usefixtures("bf16_native")
def test_steps_equal_the_authors_update(shape):
    gen = torch.Generator().manual_seed(0)
    w = nn.Parameter(torch.randn(shape, generator=gen) * torch.linspace(0.5, 2.0, shape[1]))  # unequal columns
    ref, initial = w.detach().clone(), w.detach().clone()
    radius = ref.norm(dim=0, keepdim=True)
    momentum = torch.zeros(shape)
    # weight decay 0.1 is given and, as the authors' MuonH, not applied to the matrix
    opt = MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.02, weight_decay=0.1, hyperball=True)
    for _ in range(5):
        g = torch.randn(shape, generator=gen)
        w.grad = g.clone()
        opt.step()
        _authors_step(ref, g.clone(), momentum, radius, lr=0.02)
    torch.testing.assert_close(w.detach(), ref, rtol=0, atol=1e-6)
    torch.testing.assert_close(opt.state[w][HYPERBALL_STATE], radius, rtol=0, atol=0)
    # the columns kept their norms while the weights moved
    torch.testing.assert_close(w.detach().norm(dim=0, keepdim=True), radius, rtol=1e-6, atol=0)
    assert float((w.detach() - initial).abs().max()) > 1e-2


def test_step_moves_each_vector_by_the_same_fraction_of_its_norm():
    w = torch.tensor([[3.0, 0.0], [4.0, 1.0]])  # column norms 5 and 1
    radius = initial_radius(w, 0, 1e-7)
    torch.testing.assert_close(radius, torch.tensor([[5.0, 1.0]]))
    before = w.clone()
    update = torch.tensor([[8.0, 0.3], [-6.0, 0.0]])  # column norms 10 and 0.3: the sizes do not matter
    hyperball_step(w, update, radius, 0.1, 0, 1e-7)
    # before the projection each column moved by 0.1 x its norm; after it, it is back at its norm
    moved = before - 0.1 * update / update.norm(dim=0, keepdim=True) * radius
    torch.testing.assert_close(w, moved / moved.norm(dim=0, keepdim=True) * radius)
    torch.testing.assert_close(w.norm(dim=0, keepdim=True), radius)


def test_conv1d_gets_the_linear_layers_update_transposed():
    from transformers.pytorch_utils import Conv1D

    linear, conv = nn.Linear(8, 32, bias=False), Conv1D(32, 8)
    with torch.no_grad():
        conv.weight.copy_(linear.weight.T)
    conv.bias.requires_grad_(False)
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(32, 8, generator=gen) for _ in range(3)]
    results = []
    for module, transpose in ((linear, False), (conv, True)):
        opt = create_optimizer("muon", nn.Sequential(module), lr=0.01, weight_decay=0.1, hyperball=True)
        assert [g.get("hyperball_dim") for g in opt.param_groups if g["use_muon"]] == [1 if transpose else 0]
        before = module.weight.detach().clone()
        for g in grads:
            module.weight.grad = g.T.contiguous() if transpose else g.clone()
            opt.step()
        results.append(module.weight.detach() - before)
        assert opt.state[module.weight][HYPERBALL_STATE].shape == ((8, 1) if transpose else (1, 8))  # one per input
    assert float(results[0].abs().max()) > 0
    torch.testing.assert_close(results[1], results[0].T, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_resume_is_bit_for_bit_and_the_norms_hold_in_a_gpt2():
    batch = _batch()
    straight = _tiny_gpt2()
    opt = create_optimizer("muon", straight, lr=3e-3, hyperball=True)
    start = {n: p.detach().norm(dim=1) for n, p in straight.named_parameters() if n.endswith("c_fc.weight")}
    _train(straight, opt, 3, batch)
    saved_model, saved_opt = copy.deepcopy(straight.state_dict()), _roundtrip(opt.state_dict())
    _train(straight, opt, 3, batch)
    resumed = _tiny_gpt2(seed=1)
    resumed.load_state_dict(saved_model)
    opt2 = create_optimizer("muon", resumed, lr=3e-3, hyperball=True)
    opt2.load_state_dict(saved_opt)
    _train(resumed, opt2, 3, batch)
    for (n, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), n
    for n, p in straight.named_parameters():  # GPT-2's Conv1D: a layer's input vectors are the stored rows
        if n in start:
            torch.testing.assert_close(p.detach().norm(dim=1), start[n], rtol=1e-5, atol=0)
            assert not torch.equal(p.detach(), saved_model[n])


@pytest.mark.slow
def test_tiny_gpt2_loss_falls_with_hyperball():
    model = _tiny_gpt2()
    opt = create_optimizer("muon", model, lr=3e-3, hyperball=True)
    losses = _train(model, opt, 20, _batch())
    assert losses[-1] < losses[0] - 0.5, losses


def test_a_zero_vector_is_refused_before_any_step_naming_the_matrix():
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    with torch.no_grad():
        model[1].weight[:, 2] = 0.0  # as LoRA's lora_B, which starts at zero
    with pytest.raises(ValueError) as err:
        create_optimizer("muon", model, hyperball=True)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("optimizer_kwargs: hyperball: '1.weight' has 1 vector(s) of norm 0")
    create_optimizer("muon", model, hyperball=True, adamw_patterns=(r"^1\.",))  # routed to AdamW: accepted


@pytest.mark.parametrize("kwargs, message", [
    ({"hyperball": "yes"}, "hyperball: got 'yes' for Muon; must be true or false"),
    ({"hyperball": True, "normuon_beta2": 0.95},
     "hyperball: got True with normuon_beta2 set, and both normalise the update; use one of them"),
    ({"hyperball": True, "cautious_wd": True},
     "hyperball: got True with cautious_wd=True, which would do nothing (hyperball replaces weight decay on the Muon "
     "matrices); use one of them"),
])
def test_bad_combinations_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError) as err:
        create_optimizer("muon", _tiny_gpt2(), **kwargs)
    assert str(err.value) == message


def test_fsdp2_is_refused_in_one_line_ddp_is_not():
    check_sharding_support("muon", "ddp", hyperball=True)
    with pytest.raises(ValueError) as err:
        check_sharding_support("muon", "fsdp2", hyperball=True)
    assert "\n" not in str(err.value)
    assert str(err.value).startswith("optimizer_kwargs: hyperball does not work under FSDP2")
    with pytest.raises(ValueError, match="hyperball"):
        create_optimizer("muon", _tiny_gpt2(), sharding="fsdp2", hyperball=True)
