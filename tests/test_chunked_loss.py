"""benchmarks/_harness/chunked_ce.py: chunked_lm_head_loss equals the standard loss (values and gradients) and keeps no logits for backward."""

import pytest
import torch
from conftest import make_tiny_gpt2

from benchmarks._harness.chunked_ce import chunked_lm_head_loss, lm_head_loss


def _tiny_gpt2(seed=0):
    return make_tiny_gpt2(97, 16, seed=seed, loss_type="ForCausalLM")


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_matches_gpt2_loss_and_all_parameter_gradients():
    model = _tiny_gpt2()
    x = torch.randint(0, 97, (3, 16), generator=torch.Generator().manual_seed(1))
    ref = model(input_ids=x, labels=x).loss
    ref.backward()
    ref_grads = _grads(model)
    model.zero_grad(set_to_none=True)

    hidden = model.transformer(input_ids=x).last_hidden_state
    loss = chunked_lm_head_loss(hidden, model.lm_head.weight, x, chunk_size=7)
    loss.backward()
    got = _grads(model)
    assert loss.item() == pytest.approx(ref.item(), abs=1e-6)
    assert got.keys() == ref_grads.keys()
    for name in ref_grads:
        torch.testing.assert_close(got[name], ref_grads[name], atol=2e-6, rtol=1e-4, msg=name)
    # tied embeddings: the head's gradient reached the input embedding
    assert model.transformer.wte.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("chunk", [1, 3, 10, 47, 48, 1000])
def test_chunk_size_does_not_change_result(chunk):
    g = torch.Generator().manual_seed(0)
    h = torch.randn(4, 12, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(13, 8, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 13, (4, 12), generator=g)
    y[0, :5] = -100
    y[3, 7] = -100
    ref = lm_head_loss(h, w, y)
    gh_ref, gw_ref = torch.autograd.grad(ref, (h, w))
    got = chunked_lm_head_loss(h, w, y, chunk_size=chunk)
    gh, gw = torch.autograd.grad(got, (h, w))
    assert got.item() == pytest.approx(ref.item(), rel=1e-12)
    torch.testing.assert_close(gh, gh_ref, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(gw, gw_ref, rtol=1e-10, atol=1e-12)


def test_reductions_shift_and_ignore_index():
    h = torch.randn(2, 4, 3, dtype=torch.float64)
    w = torch.randn(5, 3, dtype=torch.float64)
    y = torch.tensor([[1, 2, -100, 4], [0, 0, 3, -100]])
    flat_logits = (h @ w.t()).reshape(-1, 5)
    shifted = torch.tensor([2, -100, 4, -100, 0, 3, -100, -100])  # labels[t + 1], pad at each row end
    want_sum = torch.nn.functional.cross_entropy(flat_logits, shifted, reduction="sum")
    assert chunked_lm_head_loss(h, w, y, reduction="sum", chunk_size=3).item() == pytest.approx(want_sum.item())
    assert chunked_lm_head_loss(h, w, y, chunk_size=3).item() == pytest.approx(want_sum.item() / 4)
    assert chunked_lm_head_loss(h, w, y, num_items_in_batch=10).item() == pytest.approx(want_sum.item() / 10)
    unshifted = torch.nn.functional.cross_entropy(flat_logits, y.reshape(-1), reduction="mean")
    assert chunked_lm_head_loss(h, w, y, shift=False, chunk_size=2).item() == pytest.approx(unshifted.item())


def test_bf16_autocast_on_cpu_close_to_standard():
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 32, 16, generator=g, requires_grad=True)
    w = torch.randn(50, 16, generator=g, requires_grad=True)
    y = torch.randint(0, 50, (2, 32), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = lm_head_loss(h, w, y)
        got = chunked_lm_head_loss(h, w, y, chunk_size=16)
    assert got.dtype == torch.float32
    gh_ref, gw_ref = torch.autograd.grad(ref, (h, w))
    gh, gw = torch.autograd.grad(got, (h, w))
    assert (gh.dtype, gw.dtype) == (torch.float32, torch.float32)
    assert got.item() == pytest.approx(ref.item(), rel=1e-3)
    torch.testing.assert_close(gh, gh_ref, rtol=0.05, atol=2e-3)
    torch.testing.assert_close(gw, gw_ref, rtol=0.05, atol=2e-3)


def _saved_bytes(fn):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn()
    return sum(saved)


def test_keeps_no_logits_for_backward():
    n_tok, d, vocab = 256, 16, 1000
    h = torch.randn(1, n_tok, d, requires_grad=True)
    w = torch.randn(vocab, d, requires_grad=True)
    y = torch.randint(0, vocab, (1, n_tok))
    standard = _saved_bytes(lambda: lm_head_loss(h, w, y))
    chunked = _saved_bytes(lambda: chunked_lm_head_loss(h, w, y, chunk_size=64))
    assert standard >= n_tok * vocab * 4  # at least the fp32 log-softmax
    # exactly grad_hidden + grad_weight (fp32), plus the int64 target count saved by the mean's division
    assert chunked == (n_tok * d + vocab * d) * 4 + 8


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"chunk_size": 0}, "chunk_size must be a positive int; got 0"),
        ({"reduction": "none"}, "reduction must be one of mean, sum; got 'none'"),
    ],
)
def test_bad_arguments(kwargs, match):
    h, w, y = torch.randn(1, 4, 3), torch.randn(5, 3), torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match=match):
        chunked_lm_head_loss(h, w, y, **kwargs)
    with pytest.raises(ValueError, match="labels shape"):
        chunked_lm_head_loss(h, w, torch.zeros(1, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="weight shape"):
        chunked_lm_head_loss(h, torch.randn(5, 4), y)
