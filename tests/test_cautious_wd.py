"""Cautious weight decay on Muon's matrices (``cautious_wd``): the decay lands only where it agrees with the
update's sign, exactly; resume; training. (Its FSDP2 equality runs in tests/test_optim_sharded.py.)"""

import copy

import pytest
import torch
from torch import nn

from hf_fasttrain.optim import MuonWithAdamW, create_optimizer
from test_optim import _batch, _roundtrip, _tiny_gpt2, _train


def _one_step(w0, grad, **kwargs):
    w = nn.Parameter(w0.clone())
    opt = MuonWithAdamW([{"params": [w], "use_muon": True}], lr=0.05, **kwargs)
    w.grad = grad.clone()
    opt.step()
    return w.detach()


def test_the_decay_lands_only_where_the_update_has_the_weights_sign():
    gen = torch.Generator().manual_seed(0)
    w0, grad = torch.randn(16, 24, generator=gen), torch.randn(16, 24, generator=gen)
    no_decay = _one_step(w0, grad, weight_decay=0.0)
    plain = _one_step(w0, grad, weight_decay=0.5)
    cautious = _one_step(w0, grad, weight_decay=0.5, cautious_wd=True)
    update = w0 - no_decay  # lr * s * O: its sign is O's
    mask = (update * w0 >= 0).float()
    assert 0.3 < float(mask.mean()) < 0.7  # a real mix of kept and skipped decay
    # theta - lr (s O + wd 1[O theta >= 0] theta), against plain Muon's theta (1 - lr wd) - lr s O
    torch.testing.assert_close(cautious, w0 - 0.05 * 0.5 * mask * w0 - update, rtol=0, atol=1e-6)
    torch.testing.assert_close(cautious - plain, 0.05 * 0.5 * w0 * (1 - mask), rtol=0, atol=1e-6)
    # decay never pushes a weight against its own update: where it is skipped, only the update moved it
    skipped = mask == 0
    torch.testing.assert_close(cautious[skipped], no_decay[skipped], rtol=0, atol=1e-6)


@pytest.mark.slow
def test_resume_is_bit_for_bit_with_cautious_wd_and_normuon_together():
    batch = _batch()
    kw = dict(lr=3e-3, weight_decay=0.1, cautious_wd=True, normuon_beta2=0.95)
    straight = _tiny_gpt2()
    opt = create_optimizer("muon", straight, **kw)
    _train(straight, opt, 3, batch)
    saved_model, saved_opt = copy.deepcopy(straight.state_dict()), _roundtrip(opt.state_dict())
    _train(straight, opt, 3, batch)
    resumed = _tiny_gpt2(seed=1)
    resumed.load_state_dict(saved_model)
    opt2 = create_optimizer("muon", resumed, **kw)
    opt2.load_state_dict(saved_opt)
    _train(resumed, opt2, 3, batch)
    for (n, a), b in zip(straight.named_parameters(), resumed.parameters()):
        assert torch.equal(a, b), n


@pytest.mark.slow
def test_tiny_gpt2_loss_falls_with_cautious_wd():
    model = _tiny_gpt2()
    opt = create_optimizer("muon", model, lr=3e-3, cautious_wd=True)
    losses = _train(model, opt, 20, _batch())
    assert losses[-1] < losses[0] - 0.5, losses


def test_a_bad_value_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="cautious_wd"):
        create_optimizer("muon", _tiny_gpt2(), cautious_wd="yes")
