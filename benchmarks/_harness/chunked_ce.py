"""LM-head + cross-entropy computed in chunks of tokens, without materialising all logits.

For GPT-2 small at batch 32 x 1024 the logits are 32,768 tokens x 50,257 vocab: 3.3 GB in bf16, and
the standard loss upcasts them to fp32 (6.6 GB) and keeps a log-softmax of the same size for the
backward pass. `chunked_lm_head_loss` instead walks over the tokens `chunk_size` at a time: for each
chunk it computes the logits, the loss and, right away, the gradients of the loss with respect to
the hidden states and the head weight (softmax minus one-hot, times the chunk); the chunk's logits
are then freed. Only those gradients (the size of the hidden states and of the weight) are kept for
the backward pass. The FLOPs are the same three matmuls as the standard path.

This is the idea behind Liger-Kernel's fused linear cross-entropy (Hsu et al. 2024, "Liger Kernel:
Efficient Triton Kernels for LLM Training", arXiv:2410.10989) and Cut Cross-Entropy (Wijmans et al.
2024, "Cut Your Losses in Large-Vocabulary Language Models", arXiv:2411.09009), written here in plain
PyTorch (no Triton), so it runs on CPU and GPU and composes with autocast. Differences from those:
no custom kernel, the vocabulary is not split, and gradients are computed in the forward pass, so
it suits training (a forward without backward does the backward's matmuls for nothing).

Why this lives in benchmarks/ and not in the package: it is not a drop-in part. It needs the model split
into a body and an LM head (``model.transformer`` + ``model.lm_head`` for GPT-2), so it cannot serve "any
model, any TrainingArguments"; it returns no logits, so ``compute_metrics`` and ``prediction_loss_only=False``
evaluation would need a second path; and its only measured gain is memory (on CPU: 232 vs 1,061 MiB extra
for fp32 forward + backward at 2,048 tokens x 50,257 vocab, 449 vs 1,132 MiB under bf16 autocast), with no
speed gain and no GPU figure yet. It is kept as the ``torch-loop-chunked-ce`` arm of
``benchmarks.gpu_throughput`` and measured by ``benchmarks.lm_head_loss_memory``; tests/test_chunked_loss.py
holds its correctness proof.
"""

from __future__ import annotations

import torch

__all__ = ["chunked_lm_head_loss", "lm_head_loss"]


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Sum of token cross-entropies of `hidden @ weight.T`; gradients computed in forward."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_size, ignore_index):
        n_tokens = hidden.shape[0]
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if need_h else None
        acc = torch.promote_types(weight.dtype, torch.float32)  # fp32, or fp64 for fp64 inputs
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        total = torch.zeros((), dtype=acc, device=hidden.device)
        for start in range(0, n_tokens, chunk_size):
            h = hidden[start : start + chunk_size]
            y = labels[start : start + chunk_size]
            raw = torch.matmul(h, weight.t())  # [c, V]; bf16/fp16 under autocast
            logits = raw.to(torch.promote_types(raw.dtype, torch.float32))
            valid = y != ignore_index
            y_safe = torch.where(valid, y, torch.zeros_like(y))
            lse = torch.logsumexp(logits, dim=-1)
            target = logits.gather(1, y_safe.unsqueeze(1)).squeeze(1)
            total = total + ((lse - target) * valid).sum()
            if need_h or need_w:
                # d(sum of losses)/d logits = softmax - one_hot, zero for ignored tokens (in place)
                grad = logits.sub_(lse.unsqueeze(1)).exp_()
                grad.scatter_add_(1, y_safe.unsqueeze(1), torch.full_like(target, -1.0).unsqueeze(1))
                grad = grad.mul_(valid.unsqueeze(1)).to(raw.dtype)  # the matmul dtype, as autograd would
                if need_h:
                    grad_hidden[start : start + chunk_size] = torch.matmul(grad, weight).to(hidden.dtype)
                if need_w:
                    grad_weight += torch.matmul(grad.t(), h).to(acc)
            del raw, logits
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype) if need_w else None)
        return total

    @staticmethod
    def backward(ctx, grad_total):
        grad_hidden, grad_weight = ctx.saved_tensors
        gh = grad_hidden * grad_total.to(grad_hidden.dtype) if grad_hidden is not None else None
        gw = grad_weight * grad_total.to(grad_weight.dtype) if grad_weight is not None else None
        return gh, gw, None, None, None


def _shift(hidden: torch.Tensor, labels: torch.Tensor, ignore_index: int):
    """Causal-LM shift as in transformers' ForCausalLMLoss: position t predicts labels[t + 1]."""
    pad = torch.full_like(labels[..., :1], ignore_index)
    shifted = torch.cat([labels[..., 1:], pad], dim=-1)
    return hidden.reshape(-1, hidden.shape[-1]), shifted.reshape(-1)


def _check(hidden, weight, labels, chunk_size, reduction):
    if not isinstance(chunk_size, int) or chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive int; got {chunk_size!r}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be one of mean, sum; got {reduction!r}")
    if hidden.shape[:-1] != labels.shape:
        raise ValueError(f"labels shape {tuple(labels.shape)} must equal hidden shape without the last dim {tuple(hidden.shape[:-1])}")
    if weight.shape[-1] != hidden.shape[-1]:
        raise ValueError(f"weight shape {tuple(weight.shape)} must be [vocab, {hidden.shape[-1]}]")


def chunked_lm_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_size: int = 4096,
    ignore_index: int = -100,
    shift: bool = True,
    reduction: str = "mean",
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal-LM loss of `hidden @ weight.T` against `labels`, `chunk_size` tokens at a time.

    Args:
        hidden: `[..., d]` final hidden states (after the last layer norm).
        weight: `[vocab, d]` LM-head weight (tied embeddings: the input embedding matrix).
        labels: `[...]` token ids; `ignore_index` marks positions without a target.
        chunk_size: tokens per chunk; peak extra memory is about `chunk_size * vocab * 4` bytes.
        shift: shift labels left by one as transformers' causal-LM loss does (labels == input_ids).
        reduction: `"mean"` over non-ignored targets, or `"sum"`.
        num_items_in_batch: divide the sum by this instead (the Trainer's gradient-accumulation
            normaliser); overrides `reduction`.

    Returns:
        A scalar fp32 loss with gradients for `hidden` and `weight`.

    Example:
        ```python
        >>> import torch
        >>> h = torch.randn(2, 5, 8, requires_grad=True); w = torch.randn(11, 8, requires_grad=True)
        >>> y = torch.randint(0, 11, (2, 5))
        >>> a = chunked_lm_head_loss(h, w, y, chunk_size=3); b = lm_head_loss(h, w, y)
        >>> torch.allclose(a, b, atol=1e-5)
        True
        ```
    """
    _check(hidden, weight, labels, chunk_size, reduction)
    if shift:
        flat_h, flat_y = _shift(hidden, labels, ignore_index)
    else:
        flat_h, flat_y = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    total = _ChunkedLinearCrossEntropy.apply(flat_h, weight, flat_y, chunk_size, ignore_index)
    if num_items_in_batch is not None:
        return total / num_items_in_batch
    if reduction == "sum":
        return total
    return total / (flat_y != ignore_index).sum().clamp_min(1)


def lm_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    ignore_index: int = -100,
    shift: bool = True,
    reduction: str = "mean",
    num_items_in_batch: int | torch.Tensor | None = None,
) -> torch.Tensor:
    """The standard (unchunked) loss with the same interface: full logits, upcast, cross-entropy.

    This is what `GPT2LMHeadModel(labels=...)` computes; it is the reference the chunked version
    is tested and benchmarked against.
    """
    _check(hidden, weight, labels, 1, reduction)
    if shift:
        flat_h, flat_y = _shift(hidden, labels, ignore_index)
    else:
        flat_h, flat_y = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    logits = torch.matmul(flat_h, weight.t())
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    total = torch.nn.functional.cross_entropy(logits, flat_y, ignore_index=ignore_index, reduction="sum")
    if num_items_in_batch is not None:
        return total / num_items_in_batch
    if reduction == "sum":
        return total
    return total / (flat_y != ignore_index).sum().clamp_min(1)
