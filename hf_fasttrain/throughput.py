"""Throughput accounting: tokens, padding, model FLOPs utilisation (MFU) and compiles.

Plain functions; FastTrainer feeds them the batches it trains on and adds the results to its logs.

No host reads per step. A batch's real-token count is a sum over its attention mask (or its ids); where the batch
sits on the device, reading that sum to the host (``int(...)``) waits for every kernel queued before it. So the
batch is counted while it is still in host memory: :class:`HostBatchCollator` puts the tensors the collator made
into the batch as a :class:`HostBatch` (under ``HOST_BATCH_KEY``), which rides along untouched while the batch
itself moves to the device, and :meth:`HostBatch.count` reads them from host memory: plain ints, no device
involved. Where no host batch came along (a DataLoader FastTrainer did not build; a count summed over processes,
which a device collective makes), ``count_batch(..., lazy=True)`` leaves the count on the device:
:class:`ThroughputMeter` sums it there and reads it once per log, and :class:`HostCopy` copies it to pinned host
memory without waiting, for a schedule that needs the number before the next step (the copy is queued before the
step's forward pass, so it has long finished when the scheduler reads it after ``optimizer.step()``).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Mapping, MutableMapping, Optional

import torch

__all__ = [
    "BatchCount",
    "CompileCounter",
    "HOST_BATCH_KEY",
    "HostBatch",
    "HostBatchCollator",
    "HostCopy",
    "count_batch",
    "count_tokens",
    "flops_per_token",
    "device_peak_flops",
    "mfu",
    "model_dims",
    "throughput_logs",
    "ThroughputMeter",
    "PEAK_BF16_FLOPS",
    "compiled_graphs",
    "compiles_by_function",
]

# Dense bf16/fp16 tensor-core peaks from the vendors' datasheets (FLOP/s, no sparsity). Matched by
# substring of torch.cuda.get_device_name(); the first match wins, so longer names come first.
PEAK_BF16_FLOPS: dict[str, float] = {
    "H200": 989e12,
    "H100 PCIe": 756e12,
    "H100": 989e12,
    "GH200": 989e12,
    "A100": 312e12,
    "A10G": 70e12,  # 35 TFLOP/s dense fp32-accumulate is often quoted; 70 with fp16 accumulate
    "L40S": 362e12,
    "L4": 121e12,
    "RTX 4090": 165e12,
    "RTX 3090": 71e12,
    "V100": 125e12,
    "T4": 65e12,
}


@dataclass(frozen=True)
class BatchCount:
    """What one batch holds, for throughput: ``tokens`` (``real`` of ``total``, rows of ``seq_len``) or,
    for a batch without a token dimension (images, features), ``samples``. ``real`` is a 0-d device tensor
    when counted with ``lazy=True`` from a mask or ids (the shapes, and so ``total``, are known on the host)."""

    real: "int | torch.Tensor" = 0
    total: int = 0
    seq_len: int = 0
    samples: int = 0


def _tensor(batch, key: str) -> Optional[torch.Tensor]:
    value = batch.get(key) if isinstance(batch, Mapping) else None
    return value if isinstance(value, torch.Tensor) else None


def _token_grid(batch) -> Optional[tuple[int, int]]:
    """(rows, sequence length) of a batch's tokens, or None when it has no token dimension.

    Read from ``input_ids``; else integer ``labels`` of two or more dims (per-token labels, not a class per
    sample or a multi-label float vector); else a 2-D ``attention_mask``; else ``inputs_embeds`` (batch,
    sequence, hidden).
    """
    ids = _tensor(batch, "input_ids")
    if ids is not None and ids.ndim >= 1:
        return ids.numel() // max(ids.shape[-1], 1), ids.shape[-1]
    labels = _tensor(batch, "labels")
    if labels is not None and labels.ndim >= 2 and not (labels.is_floating_point() or labels.dtype == torch.bool):
        return labels.numel() // max(labels.shape[-1], 1), labels.shape[-1]
    mask = _tensor(batch, "attention_mask")
    if mask is not None and mask.ndim == 2:
        return mask.shape[0], mask.shape[1]
    embeds = _tensor(batch, "inputs_embeds")
    if embeds is not None and embeds.ndim == 3:
        return embeds.shape[0], embeds.shape[1]
    return None


def _num_samples(batch) -> int:
    """Leading dimension of the batch's first tensor (0 when it holds none)."""
    values = batch.values() if isinstance(batch, Mapping) else batch if isinstance(batch, (list, tuple)) else [batch]
    for value in values:
        if isinstance(value, torch.Tensor) and value.ndim >= 1:
            return int(value.shape[0])
    return 0


def count_batch(batch, pad_token_id: Optional[int] = None, lazy: bool = False) -> BatchCount:
    """Tokens of a batch when it has a token dimension (see ``count_tokens``), else its samples. Never raises:
    any model's batch (token ids, ``inputs_embeds``, ``pixel_values``, regression features, a tuple) is counted.
    ``lazy``: a count that needs the batch's values (a mask or pad ids) stays a 0-d int64 tensor on the
    batch's device (no host read); counts from shapes alone are ints either way.

    Example:
        >>> count_batch({"input_ids": torch.ones(2, 4, dtype=torch.long)})
        BatchCount(real=8, total=8, seq_len=4, samples=0)
        >>> count_batch({"pixel_values": torch.zeros(3, 3, 8, 8), "labels": torch.tensor([0, 1, 1])})
        BatchCount(real=0, total=0, seq_len=0, samples=3)
    """
    grid = _token_grid(batch)
    if grid is None:
        return BatchCount(samples=_num_samples(batch))
    rows, seq_len = grid
    total = rows * seq_len
    ids = _tensor(batch, "input_ids")
    mask = _tensor(batch, "attention_mask")
    positions = _tensor(batch, "position_ids")
    read = (lambda t: t.to(torch.int64)) if lazy else int
    if mask is not None and mask.numel() == total:
        real = read(mask.sum())
    elif ids is None or pad_token_id is None:
        real = total
    elif positions is None or positions.shape != ids.shape:
        real = read((ids != pad_token_id).sum())
    else:
        labels = _tensor(batch, "labels")
        labels = labels if labels is not None and labels.shape == ids.shape else None
        real = total - read(_packed_tail_padding(ids, positions, labels, pad_token_id))
    return BatchCount(real=real, total=total, seq_len=int(seq_len))


def count_tokens(batch: Mapping[str, torch.Tensor], pad_token_id: Optional[int] = None) -> tuple[int, int]:
    """(real, total) token counts of a batch as the model sees it; (0, 0) for a batch without tokens.

    ``total`` is the padded size of ``input_ids`` (or of per-token ``labels``, a 2-D ``attention_mask``, or
    ``inputs_embeds``' batch and sequence dims); ``real`` excludes padding, read from the
    ``attention_mask`` when there is one, else from ``pad_token_id``. A packed batch
    (``position_ids`` and no attention mask) counts as padding only each row's tail: the last
    segment (from the last restart of ``position_ids`` at 0) when it is all ``pad_token_id`` and,
    if labels are given, all -100, as ``PackedRowsCollator`` pads; a row packed full has none.
    """
    count = count_batch(batch, pad_token_id)
    return count.real, count.total


def _packed_tail_padding(ids: torch.Tensor, positions: torch.Tensor, labels, pad_token_id: int) -> int:
    """Tokens in the padded tails of packed rows (see ``count_tokens``), as a 0-d device tensor; vectorised."""
    width = ids.shape[-1]
    ids2, pos2 = ids.reshape(-1, width), positions.reshape(-1, width)
    cols = torch.arange(width, device=pos2.device).expand_as(pos2)
    start = torch.where(pos2 == 0, cols, torch.zeros_like(cols)).amax(dim=-1, keepdim=True)  # last restart
    is_pad = ids2 == pad_token_id
    if labels is not None:
        is_pad &= labels.reshape(-1, width) == -100
    tail_is_padding = (is_pad | (cols < start)).all(dim=-1, keepdim=True)
    return ((width - start) * tail_is_padding).sum()


def flops_per_token(n_params: int, n_layer: int, d_model: int, seq_len: int) -> float:
    """Training FLOPs per token: 6N for the weights (forward 2N, backward 4N) plus attention
    scores and values, 12 * n_layer * d_model * seq_len (Chowdhery et al. 2022, PaLM, appendix B)."""
    return 6.0 * n_params + 12.0 * n_layer * d_model * seq_len


def device_peak_flops(device: Optional[torch.device] = None) -> Optional[float]:
    """Peak dense bf16 FLOP/s of a CUDA device from ``PEAK_BF16_FLOPS``; None on CPU or when unknown."""
    if not torch.cuda.is_available():
        return None
    if device is not None and torch.device(device).type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, peak in PEAK_BF16_FLOPS.items():
        if key in name:
            return peak
    return None


def mfu(tokens_per_second: float, flops_per_tok: float, peak_flops: Optional[float], n_devices: int = 1) -> Optional[float]:
    """Model FLOPs utilisation: achieved model FLOP/s over the devices' peak; None without a peak."""
    if not peak_flops:
        return None
    return tokens_per_second * flops_per_tok / (peak_flops * n_devices)


def model_dims(model) -> tuple[int, int, int]:
    """(matmul parameters, layers, attention width) for the FLOP estimate, for any decoder family.

    Parameters exclude position-embedding tables and an input embedding that is not tied to the LM
    head: both are table lookups, not matmuls (as nanoGPT counts; a tied embedding is the head's
    matmul and counts once). The attention width is heads x head size, which for GQA models is the
    query width: the score and value FLOPs grow with the query heads, not the key/value heads.
    """
    cfg = getattr(model, "config", None)
    n_layer = getattr(cfg, "num_hidden_layers", None) or getattr(cfg, "n_layer", 0) or 0
    d_model = getattr(cfg, "hidden_size", None) or getattr(cfg, "n_embd", 0) or 0
    n_heads = getattr(cfg, "num_attention_heads", None) or getattr(cfg, "n_head", None)
    head_dim = getattr(cfg, "head_dim", None)
    attn_width = n_heads * head_dim if n_heads and head_dim else d_model
    n_params = sum(p.numel() for p in model.parameters())
    for name, p in model.named_parameters():
        if name.endswith(("wpe.weight", "position_embeddings.weight", "embed_positions.weight")):
            n_params -= p.numel()  # a table lookup, not matmul FLOPs (as nanoGPT counts)
    get_in, get_out = getattr(model, "get_input_embeddings", None), getattr(model, "get_output_embeddings", None)
    inp = get_in() if callable(get_in) else None
    out = get_out() if callable(get_out) else None
    w_in, w_out = getattr(inp, "weight", None), getattr(out, "weight", None)
    if w_in is not None and w_out is not None and w_in is not w_out:
        n_params -= w_in.numel()  # untied input embedding (Llama's default): a lookup
    return n_params, int(n_layer), int(attn_width)


def throughput_logs(real: int, total: int, samples: int, seconds: float, seq_len: int = 0,
                    peak_flops: Optional[float] = None, dims: Optional[tuple[int, int, int]] = None,
                    n_devices: int = 1) -> dict[str, float]:
    """The throughput logs of ``seconds`` of training over which ``real`` of ``total`` tokens (rows of
    ``seq_len``) and ``samples`` samples of batches without tokens were counted: ``tokens_per_second`` and
    ``padding_fraction`` for token batches (or when nothing was counted), ``samples_per_second`` for the others,
    and ``mfu`` with a ``peak_flops`` and the model's :func:`model_dims` (padded tokens cost compute too:
    utilisation counts every token the model ran on).

    Example:
        >>> throughput_logs(real=750, total=1000, samples=0, seconds=2.0)
        {'tokens_per_second': 375.0, 'padding_fraction': 0.25}
    """
    seconds = max(seconds, 1e-9)
    out: dict[str, float] = {}
    if total or not samples:  # token batches (or nothing counted yet): tokens
        out["tokens_per_second"] = real / seconds
        out["padding_fraction"] = (1.0 - real / total) if total else 0.0
    if samples:  # batches without a token dimension (images, features): samples
        out["samples_per_second"] = samples / seconds
    if peak_flops and total and dims is not None:
        n_params, n_layer, d_model = dims
        if n_layer and d_model:  # the FLOP count is known only for a transformer with these in its config
            value = mfu(total / seconds, flops_per_token(n_params, n_layer, d_model, seq_len), peak_flops,
                        n_devices=n_devices)
            if value is not None:
                out["mfu"] = value
    return out


@dataclass
class ThroughputMeter:
    """Counts real and padded tokens (and the samples of batches without tokens) between two log calls.

    Example:
        >>> m = ThroughputMeter()
        >>> m.add({"input_ids": torch.ones(2, 4, dtype=torch.long), "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])})
        >>> m.add({"pixel_values": torch.zeros(5, 3, 8, 8)})
        >>> m.flush()
        {'real_tokens': 6, 'total_tokens': 8, 'padding_fraction': 0.25, 'seq_len': 4, 'samples': 5}
    """

    pad_token_id: Optional[int] = None
    real: "int | torch.Tensor" = 0
    total: int = 0
    seq_len: int = 0
    samples: int = 0

    def add(self, batch) -> None:
        """Count a batch (its real tokens stay on the device until :meth:`flush`)."""
        self.add_count(count_batch(batch, self.pad_token_id, lazy=True))

    def add_count(self, count: BatchCount) -> None:
        """Add a batch counted elsewhere (``count_batch``, lazy or not): one count serves several users."""
        self.real = self.real + count.real
        self.total += count.total
        self.samples += count.samples
        if count.total:
            self.seq_len = count.seq_len

    def flush(self) -> dict:
        """Counts since the last flush (one host read); ``samples`` are those of batches without tokens."""
        if isinstance(self.real, torch.Tensor):
            self.real = int(self.real)
        out = {
            "real_tokens": self.real,
            "total_tokens": self.total,
            "padding_fraction": (1.0 - self.real / self.total) if self.total else 0.0,
            "seq_len": self.seq_len,
            "samples": self.samples,
        }
        self.real = self.total = self.samples = 0
        return out


# ---- counting a batch on the host -----------------------------------------------------------------
# The tokens of a batch are known before it reaches the device: the collator made its tensors in host memory.
# The Trainer's DataLoader (accelerate's DataLoaderShard, ``send_to_device``) then moves every tensor of the batch,
# and recurses into lists and mappings, but leaves any other object as it is: a HostBatch, which has no ``to``
# (nor ``pin_memory``, so the DataLoader's pinning skips it too), keeps the host tensors with the batch, also
# from a DataLoader worker (the batch and its HostBatch share those tensors; nothing is copied).

HOST_BATCH_KEY = "_host_batch"


class HostBatch:
    """The tensors of a collated batch as they were in host memory, carried in that batch (``HOST_BATCH_KEY``).

    :meth:`count` is ``count_batch`` of these tensors with every value read from host memory (through numpy):
    the count of the batch as trained, without waiting for the device that now holds its copy. A change to the
    batch after collation (sequence-length warmup's cut) must be applied to ``tensors`` too (FastTrainer does).

    Example:
        >>> host = HostBatch({"input_ids": torch.tensor([[5, 6, 0]]), "attention_mask": torch.tensor([[1, 1, 0]])})
        >>> host.count(pad_token_id=0)
        BatchCount(real=2, total=3, seq_len=3, samples=0)
    """

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.tensors = tensors

    def count(self, pad_token_id: Optional[int] = None) -> BatchCount:
        count = count_batch(self.tensors, pad_token_id, lazy=True)  # lazy: sums stay 0-d host tensors ...
        if isinstance(count.real, torch.Tensor):  # ... read here from host memory (no Tensor.item, no device)
            count = replace(count, real=int(count.real.numpy()))
        return count


class HostBatchCollator:
    """Wraps a training collator: every mapping batch whose tensors are all in host memory gets a
    :class:`HostBatch` of them under ``HOST_BATCH_KEY``. Whoever trains on the batch takes it out before the
    model sees the inputs (FastTrainer's ``training_step`` does). Other batches (tuples, tensors already on a
    device) pass unchanged.

    Example:
        >>> from transformers import default_data_collator
        >>> collate = HostBatchCollator(default_data_collator)
        >>> batch = collate([{"input_ids": [5, 6, 0]}, {"input_ids": [7, 0, 0]}])
        >>> batch.pop(HOST_BATCH_KEY).count(pad_token_id=0), sorted(batch)
        (BatchCount(real=3, total=6, seq_len=3, samples=0), ['input_ids'])
    """

    def __init__(self, collator: Callable):
        self.collator = collator

    def __call__(self, features):
        batch = self.collator(features)
        if isinstance(batch, MutableMapping):  # a BatchEncoding too
            tensors = {k: v for k, v in batch.items() if isinstance(v, torch.Tensor)}
            if tensors and all(v.device.type == "cpu" for v in tensors.values()):
                batch[HOST_BATCH_KEY] = HostBatch(tensors)
        return batch


class HostCopy:
    """A device value copied to the host without waiting for the device; :meth:`value` reads it later.

    For a count that only the device has: a sum over processes (a device collective), or the count of a batch
    that came without a :class:`HostBatch`.

    On a GPU the copy goes into pinned host memory, queued on the current stream behind the kernels that make
    the value, and a CUDA event marks its end; :meth:`value` waits for that event only, not for the kernels
    queued after it. Elsewhere (CPU tensors, ints) the value is already on the host.

    Example:
        >>> HostCopy(torch.tensor(7)).value(), HostCopy(5).value()
        (7, 5)
    """

    def __init__(self, value: "int | torch.Tensor"):
        self._event = None
        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
            host = torch.empty(value.shape, dtype=value.dtype, pin_memory=True)
            host.copy_(value.detach(), non_blocking=True)
            self._event = torch.cuda.Event()
            self._event.record()
            value = host
        self._value = value

    def value(self) -> int:
        if self._event is not None:
            self._event.synchronize()  # the copy's own end, queued before the step's forward pass
            self._event = None
        v = self._value
        # a host tensor's memory is read as a numpy array: no device is involved
        return int(v.numpy().sum()) if isinstance(v, torch.Tensor) else int(v)

# ---- compiles ------------------------------------------------------------------------------------
# How often ``torch.compile`` compiled: each compile is a cold start (tens of seconds on a GPU).
#
# A compiled function recompiles whenever an input's shape or strides leave what its graphs cover. Under
# sequence-length warmup the first length gives a static graph and the second a dynamic one that serves every
# later length, so each compiled function should compile at most 2 times in a run (the data cut keeps strides
# the same: :func:`hf_fasttrain.data.seqlen.set_batch_sequence_length`). Two numbers, both from dynamo's
# per-process counters, taken since a :class:`CompileCounter` was made:
#
# - ``compiles``: the most times any one function was compiled (2 under warmup; a third means a recompile);
# - ``graphs``: graphs compiled in all, which also counts the pieces a graph break splits a function into.
#
# FastTrainer logs both with every training log (``compiles``, ``compiled_graphs``) when ``torch_compile`` is on,
# and writes them into ``run_info.json`` at the end of ``train()``.


def compiled_graphs() -> int:
    """Graphs dynamo has compiled in this process so far (its ``unique_graphs`` counter; 0 without dynamo)."""
    try:
        from torch._dynamo.utils import counters
    except Exception:  # a torch without dynamo
        return 0
    return int(counters["stats"]["unique_graphs"])


def compiles_by_function() -> Counter:
    """Compiles so far of each function dynamo compiled (by its frame id; empty when unknown)."""
    try:
        from torch._dynamo.convert_frame import FRAME_COMPILE_COUNTER
    except Exception:  # a torch without dynamo, or one that moved this counter
        return Counter()
    return Counter(dict(FRAME_COMPILE_COUNTER))


class CompileCounter:
    """Compiles since this counter was made (dynamo's counters are per process, not per run).

    Example:
        >>> counter = CompileCounter()
        >>> f = torch.compile(lambda x: x * 2, backend="eager")
        >>> for n in (3, 4, 5, 6):
        ...     _ = f(torch.ones(n))
        >>> counter.compiles(), counter.graphs()   # static at length 3, then one dynamic graph for 4, 5 and 6
        (2, 2)
    """

    def __init__(self) -> None:
        self._graphs = compiled_graphs()
        self._by_function = compiles_by_function()

    def graphs(self) -> int:
        return compiled_graphs() - self._graphs

    def compiles(self) -> int:
        """The most compiles of one function since then (0: nothing was compiled)."""
        now = compiles_by_function()
        return max((n - self._by_function.get(k, 0) for k, n in now.items()), default=0)

    def stats(self) -> dict[str, int]:
        return {"compiles": self.compiles(), "compiled_graphs": self.graphs()}
