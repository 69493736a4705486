"""Packing: exact bins, sharded packed batches, exact collated tensors, and GPT-2 logits per document."""

import numpy as np
import re

import pytest
import torch
from conftest import make_tiny_gpt2
from transformers import DataCollatorWithFlattening

from hf_fasttrain.data.packing import PackedBatchSampler, PackedRowsCollator, pack_bins, packed_steps

DOCS = [[5, 6, 7, 8, 9], [10, 11, 12], [13, 14, 15, 16, 17, 18, 19], [20, 21], [22, 23, 24, 25]]


def exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly this one-line message."""
    return "^" + re.escape(message) + "$"


def test_pack_bins_best_fit_decreasing_exact():
    # order 6, 5, 4, 3, 2: 6 opens a bin (room 2), 5 (room 3), 4 (room 4); 3 -> room 3 (full), 2 -> room 2
    assert pack_bins([5, 3, 4, 2, 6], 8) == [[4, 3], [0, 1], [2]]
    assert pack_bins([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    lengths = np.random.default_rng(0).integers(1, 50, size=200)
    bins = pack_bins(lengths, 64)
    assert sorted(i for b in bins for i in b) == list(range(200))
    assert all(lengths[b].sum() <= 64 for b in bins)
    assert len(bins) <= int(np.ceil(lengths.sum() / 64 * 1.1)) + 1  # near the lower bound
    with pytest.raises(ValueError, match=exact('max_tokens: got 4, below the longest example (index 4, length 6); must be >= 6, or truncate the examples')):
        pack_bins([5, 3, 4, 2, 6], 4)


def test_packed_steps_exact_and_rows_per_batch():
    assert packed_steps([5, 3, 4, 2, 6], 8) == [[[0, 1]], [[2]], [[4, 3]]]
    steps = packed_steps([5, 3, 4, 2, 6], 8, rows_per_batch=2)
    assert sorted(sorted(s[0]) for s in steps) == [[0, 1, 3, 4], [2]]


@pytest.mark.parametrize("world_size", [2, 3])
def test_packed_sampler_ranks_disjoint_cover(world_size):
    lengths = np.random.default_rng(1).integers(1, 30, size=41)
    per_rank = []
    for rank in range(world_size):
        s = PackedBatchSampler(lengths, 48, rows_per_batch=2, world_size=world_size, rank=rank, grad_accum=2, seed=4)
        s.set_epoch(1)
        per_rank.append(list(s))
    assert len({len(b) for b in per_rank}) == 1 and len(per_rank[0]) % 2 == 0
    flat = [i for batches in per_rank for b in batches for i in b]
    assert sorted(flat) == list(range(41))
    # every batch fits in 2 rows of 48 when the collator packs it in the order given
    collator = PackedRowsCollator(row_len=48, num_rows=2)
    for batches in per_rank:
        for b in batches:
            out = collator([{"input_ids": [1] * int(lengths[i])} for i in b])
            assert out["input_ids"].shape == (2, 48)


def test_packed_rows_collator_exact_tensors():
    c = PackedRowsCollator(row_len=8, num_rows=3, pad_token_id=0, return_seq_idx=True)
    out = c([{"input_ids": d} for d in DOCS[:2]] + [{"input_ids": DOCS[3]}])
    assert out["input_ids"].tolist() == [
        [5, 6, 7, 8, 9, 10, 11, 12],
        [20, 21, 0, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 0, 0, 0],
    ]
    assert out["position_ids"].tolist() == [
        [0, 1, 2, 3, 4, 0, 1, 2],
        [0, 1, 0, 1, 2, 3, 4, 5],
        [0, 1, 2, 3, 4, 5, 6, 7],
    ]
    assert out["labels"].tolist() == [
        [-100, 6, 7, 8, 9, -100, 11, 12],
        [-100, 21, -100, -100, -100, -100, -100, -100],
        [-100] * 8,
    ]
    assert out["seq_idx"].tolist()[1] == [2, 2, -1, -1, -1, -1, -1, -1]
    assert "attention_mask" not in out
    with pytest.raises(ValueError, match="more than num_rows=1"):
        PackedRowsCollator(row_len=8, num_rows=1)([{"input_ids": d} for d in DOCS[:3]])
    with pytest.raises(ValueError, match="example 0 has 7 tokens, more than row_len=4"):
        PackedRowsCollator(row_len=4)([{"input_ids": DOCS[2]}])


def _tiny_gpt2():
    return make_tiny_gpt2(64, 32).eval()


def _separate(model, docs):
    with torch.no_grad():
        logits = [model(torch.tensor([d]), use_cache=False).logits[0] for d in docs]
        losses = [model(torch.tensor([d]), labels=torch.tensor([d]), use_cache=False).loss for d in docs]
    return logits, losses


def test_flattened_gpt2_logits_equal_separate_runs():
    model = _tiny_gpt2()
    separate, losses = _separate(model, DOCS)
    batch = DataCollatorWithFlattening()([{"input_ids": d} for d in DOCS])
    assert batch["input_ids"].shape == (1, sum(map(len, DOCS)))
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], labels=batch["labels"], use_cache=False)
    start = 0
    for d, ref in zip(DOCS, separate):
        torch.testing.assert_close(out.logits[0, start : start + len(d)], ref, atol=1e-5, rtol=1e-5)
        start += len(d)
    # the packed loss is the token-weighted mean of the separate losses (no cross-document targets)
    weights = torch.tensor([len(d) - 1 for d in DOCS], dtype=torch.float)
    expected = (torch.stack(losses) * weights).sum() / weights.sum()
    torch.testing.assert_close(out.loss, expected, atol=1e-5, rtol=1e-5)
    # negative control: an all-ones attention mask lets documents see each other
    with torch.no_grad():
        leaky = model(input_ids=batch["input_ids"], attention_mask=torch.ones_like(batch["input_ids"]), use_cache=False)
    assert not torch.allclose(leaky.logits[0, 5:8], separate[1], atol=1e-3)


def test_packed_rows_gpt2_logits_equal_separate_runs():
    model = _tiny_gpt2()
    separate, _ = _separate(model, DOCS)
    batch = PackedRowsCollator(row_len=12, num_rows=3, pad_token_id=0, return_seq_idx=True)([{"input_ids": d} for d in DOCS])
    assert batch["input_ids"].shape == (3, 12)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
    seen = set()
    for row in range(3):
        for k, d in enumerate(DOCS):
            where = (batch["seq_idx"][row] == k).nonzero().flatten()
            if len(where):
                torch.testing.assert_close(logits[row, where], separate[k], atol=1e-5, rtol=1e-5)
                seen.add(k)
    assert seen == set(range(len(DOCS)))
