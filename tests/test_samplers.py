"""Exact-index tests for the length-grouped, token-budget and curriculum batch samplers."""

import itertools

import datasets
import numpy as np
import re

import pytest

from hf_fasttrain.data.samplers import (
    CurriculumBatchSampler,
    LengthGroupedBatchSampler,
    StepPlanSettings,
    TokenBudgetBatchSampler,
    add_length_column,
    curriculum_steps,
    get_lengths,
    length_grouped_steps,
    token_budget_steps,
)

LENGTHS_8 = [5, 1, 4, 2, 3, 6, 8, 7]
LENGTHS_10 = [10, 3, 7, 1, 4, 9, 2, 5, 6, 8]


def exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly this one-line message."""
    return "^" + re.escape(message) + "$"


def rank_batches(cls, lengths, world_size, *args, epoch=0, **kwargs):
    """Batches of every simulated rank: {rank: [batch, ...]}."""
    out = {}
    for rank in range(world_size):
        sampler = cls(lengths, *args, world_size=world_size, rank=rank, **kwargs)
        sampler.set_epoch(epoch)
        out[rank] = list(sampler)
    return out


def assert_disjoint_cover(per_rank, n):
    counts = {len(b) for b in per_rank.values()}
    assert len(counts) == 1, f"ranks got different numbers of batches: {counts}"
    flat = [i for batches in per_rank.values() for b in batches for i in b]
    assert sorted(flat) == list(range(n))  # full coverage, nothing twice


# ---- lengths column -----------------------------------------------------------------------------


def test_add_length_column_computes_once_and_get_lengths_reads_it():
    ds = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]]})
    with_len = add_length_column(ds)
    assert list(with_len["length"]) == [3, 1, 2]
    assert get_lengths(with_len).tolist() == [3, 1, 2]
    # an existing column is read, not recomputed (it may come from elsewhere, e.g. raw text length)
    preset = ds.add_column("length", [7, 8, 9])
    assert get_lengths(preset).tolist() == [7, 8, 9]
    assert add_length_column(preset) is preset
    assert list(add_length_column(preset, overwrite=True)["length"]) == [3, 1, 2]
    # selections (an indices mapping) are respected
    assert get_lengths(with_len.select([2, 0])).tolist() == [2, 3]
    # plain list of dicts
    assert get_lengths([{"input_ids": [1, 2]}, {"input_ids": [3]}]).tolist() == [2, 1]
    with pytest.raises(ValueError, match="column='text' is not a column"):
        add_length_column(ds, column="text")


# ---- length grouping ----------------------------------------------------------------------------


def test_length_grouped_exact_batches_one_megabatch():
    # one megabatch covering the epoch: batches are consecutive in length order, steps shuffled
    steps = length_grouped_steps(LENGTHS_8, batch_size=2, megabatch_mult=4, settings=StepPlanSettings(seed=0))
    assert steps == [[[5, 0]], [[3, 1]], [[2, 4]], [[6, 7]]]
    assert [[LENGTHS_8[i] for i in s[0]] for s in steps] == [[6, 5], [2, 1], [4, 3], [8, 7]]


def test_length_grouped_megabatches_sort_within_each():
    lengths = [5, 1, 4, 2, 3, 6, 8, 7, 9, 1, 2, 3]
    steps = length_grouped_steps(lengths, batch_size=2, megabatch_mult=2, settings=StepPlanSettings(seed=0))
    # permutation (seed 0) = [8 0 5 9 | 7 4 2 10 | 3 1 11 6]; each megabatch of 4 sorted, cut in 2
    assert sorted(s[0] for s in steps) == sorted([[8, 5], [0, 9], [7, 2], [4, 10], [6, 11], [3, 1]])
    assert steps == [[[0, 9]], [[3, 1]], [[7, 2]], [[8, 5]], [[4, 10]], [[6, 11]]]


def test_length_grouped_sampler_len_and_determinism():
    lengths = np.random.default_rng(0).integers(1, 100, size=50)
    a = LengthGroupedBatchSampler(lengths, batch_size=4, seed=3)
    b = LengthGroupedBatchSampler(lengths, batch_size=4, seed=3)
    assert len(a) == 13 and list(a) == list(b)  # ceil(50 / 4)
    assert list(a) != list(LengthGroupedBatchSampler(lengths, batch_size=4, seed=4))
    epoch0 = list(a)
    a.set_epoch(1)
    epoch1 = list(a)
    assert epoch0 != epoch1
    assert sorted(i for bt in epoch0 for i in bt) == sorted(i for bt in epoch1 for i in bt) == list(range(50))
    # batches are groups of similar lengths: padding far below random batching
    def padded(batches):
        return sum(len(bt) * max(lengths[i] for i in bt) for bt in batches)
    rng = np.random.default_rng(1).permutation(50)
    random_batches = [rng[i : i + 4].tolist() for i in range(0, 50, 4)]
    assert padded(epoch0) < 0.8 * padded(random_batches)


@pytest.mark.parametrize("world_size", [2, 3])
def test_length_grouped_ranks_disjoint_and_cover(world_size):
    lengths = list(range(1, 12))  # N = 11, not a multiple of batch_size * world_size
    per_rank = rank_batches(LengthGroupedBatchSampler, lengths, world_size, 2, megabatch_mult=3)
    assert_disjoint_cover(per_rank, 11)
    # one megabatch holds all 11: a step is a contiguous slice of the sorted order, so the ranks of
    # a step hold neighbouring lengths
    for step in zip(*per_rank.values()):
        step_lengths = sorted(lengths[i] for b in step for i in b)
        assert step_lengths[-1] - step_lengths[0] == len(step_lengths) - 1


def test_length_grouped_two_ranks_exact():
    per_rank = rank_batches(LengthGroupedBatchSampler, LENGTHS_8, 2, 2, megabatch_mult=2)
    # one sorted megabatch [6 7 5 0 | 2 4 3 1] (lengths 8..1): a step deals 2 + 2; steps shuffled
    assert per_rank == {0: [[2, 4], [6, 7]], 1: [[3, 1], [5, 0]]}


def test_length_grouped_drop_last_drops_short_step():
    lengths = list(range(1, 12))
    per_rank = rank_batches(LengthGroupedBatchSampler, lengths, 2, 2, megabatch_mult=5, drop_last=True)
    flat = [i for b in per_rank.values() for bt in b for i in bt]
    assert len(per_rank[0]) == len(per_rank[1]) == 2 and len(set(flat)) == 8
    assert all(len(bt) == 2 for b in per_rank.values() for bt in b)


def test_length_grouped_mid_epoch_resume_equals_straight():
    lengths = np.random.default_rng(0).integers(1, 50, size=30)
    straight = LengthGroupedBatchSampler(lengths, batch_size=3, seed=1)
    straight.set_epoch(2)
    it = iter(straight)
    first = [next(it) for _ in range(4)]
    state = straight.state_dict()
    assert state == {"seed": 1, "world_size": 1, "epoch": 2, "position": 4}
    rest = list(it)
    resumed = LengthGroupedBatchSampler(lengths, batch_size=3, seed=1)
    resumed.load_state_dict(state)
    assert list(resumed) == rest and len(first) + len(rest) == 10
    # the resume offset is used once; the next iteration is the full epoch again
    assert list(resumed) == first + rest
    with pytest.raises(ValueError, match="seed=1"):
        LengthGroupedBatchSampler(lengths, batch_size=3, seed=2).load_state_dict(state)


def test_length_grouped_invalid_settings():
    with pytest.raises(ValueError, match=exact('batch_size: got 0; must be an integer >= 1')):
        LengthGroupedBatchSampler([1, 2], batch_size=0)
    with pytest.raises(ValueError, match=exact('rank: got 2; must be an integer in [0, world_size=2)')):
        LengthGroupedBatchSampler([1, 2], batch_size=1, world_size=2, rank=2)
    with pytest.raises(ValueError, match="lengths must be >= 0"):
        LengthGroupedBatchSampler([1, -2], batch_size=1)


@pytest.mark.parametrize("kwargs, message", [
    (dict(seed=-1), "seed: got -1; must be an integer >= 0"),
    (dict(world_size=0), "world_size: got 0; must be an integer >= 1"),
    (dict(world_size=2, rank=2), "rank: got 2; must be an integer in [0, world_size=2)"),
    (dict(grad_accum=0), "grad_accum: got 0; must be an integer >= 1"),
    (dict(drop_last="yes"), "drop_last: got 'yes'; must be true or false"),
])
def test_step_plan_settings_check_themselves(kwargs, message):
    with pytest.raises(ValueError) as err:
        StepPlanSettings(**kwargs)
    assert str(err.value) == message


def test_samplers_hold_the_shared_settings_whole():
    settings = StepPlanSettings(seed=np.int64(3), world_size=2, rank=1, grad_accum=2)
    assert (settings.seed, type(settings.seed)) == (3, int)  # numpy integers come in, plain ints are kept
    s = TokenBudgetBatchSampler(LENGTHS_10, 16, seed=3, world_size=2, rank=1, grad_accum=2)
    assert s.settings == settings and (s.seed, s.world_size, s.rank) == (3, 2, 1)
    assert s.batches() == [step[1] for step in token_budget_steps(LENGTHS_10, 16, settings)]
    grouped = LengthGroupedBatchSampler(LENGTHS_10, 2, world_size=2, rank=1, drop_last=True)
    assert grouped.settings == StepPlanSettings(world_size=2, rank=1, drop_last=True)


# ---- token budget -------------------------------------------------------------------------------


def test_token_budget_exact_batches():
    steps = token_budget_steps(LENGTHS_10, max_tokens=16)
    # sorted: 10 | 9 | 8 7 | 6 5 | 4 3 2 1 -> 16 // 10 = 1, 16 // 9 = 1, 16 // 8 = 2, 16 // 6 = 2, 16 // 4 = 4
    assert steps == [[[0]], [[4, 1, 6, 3]], [[9, 2]], [[8, 7]], [[5]]]
    for (batch,) in steps:
        assert len(batch) * max(LENGTHS_10[i] for i in batch) <= 16


def test_token_budget_two_ranks_split_to_equal_counts():
    # 5 batches for 2 ranks: the largest batch is halved so both ranks get 3
    assert token_budget_steps(LENGTHS_10, 16, StepPlanSettings(world_size=2)) == [[[9, 2], [8, 7]], [[4, 1], [6, 3]], [[0], [5]]]
    per_rank = rank_batches(TokenBudgetBatchSampler, LENGTHS_10, 2, 16)
    assert per_rank == {0: [[9, 2], [4, 1], [0]], 1: [[8, 7], [6, 3], [5]]}


def test_token_budget_gradient_accumulation_full_optimizer_steps():
    steps = token_budget_steps(LENGTHS_10, 16, StepPlanSettings(world_size=2, grad_accum=2))
    assert steps == [[[9, 2], [8, 7]], [[6], [3]], [[4], [1]], [[0], [5]]]
    per_rank = rank_batches(TokenBudgetBatchSampler, LENGTHS_10, 2, 16, grad_accum=2)
    assert len(per_rank[0]) == len(per_rank[1]) == 4  # 2 full optimizer steps per rank
    assert_disjoint_cover(per_rank, 10)


@pytest.mark.parametrize("world_size", [2, 3])
def test_token_budget_ranks_disjoint_cover_within_budget(world_size):
    lengths = np.random.default_rng(5).integers(1, 40, size=37)
    per_rank = rank_batches(TokenBudgetBatchSampler, lengths, world_size, 64, seed=2, epoch=1)
    assert_disjoint_cover(per_rank, 37)
    for batches in per_rank.values():
        for b in batches:
            assert len(b) * max(lengths[i] for i in b) <= 64


def test_token_budget_same_count_every_epoch_different_order():
    lengths = np.random.default_rng(0).integers(1, 6, size=40)  # many ties
    sampler = TokenBudgetBatchSampler(lengths, max_tokens=12, seed=0)
    plans = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        plans.append(list(sampler))
    assert len({len(p) for p in plans}) == 1
    assert all(plans[0] != p for p in plans[1:])
    assert all(sorted(i for b in p for i in b) == list(range(40)) for p in plans)
    # determinism per seed, and another seed gives another order
    again = TokenBudgetBatchSampler(lengths, max_tokens=12, seed=0)
    again.set_epoch(3)
    assert list(again) == plans[3]
    assert list(TokenBudgetBatchSampler(lengths, max_tokens=12, seed=1)) != plans[0]


def test_token_budget_caps_and_padding_multiple():
    steps = token_budget_steps([1] * 6, 100, max_batch_size=4)
    assert sorted(len(s[0]) for s in steps) == [2, 4]
    # lengths 3, 5 padded to 4, 8: a budget of 8 holds one 8 or two 4s
    assert sorted(sorted(s[0]) for s in token_budget_steps([3, 5, 3], 8, pad_to_multiple_of=4)) == [[0, 2], [1]]
    with pytest.raises(ValueError, match=exact('max_tokens: got 7, below the longest example (index 1, length 5, padded to 8); must be >= 8, or truncate the examples')):
        token_budget_steps([3, 5], 7, pad_to_multiple_of=4)


def test_token_budget_below_longest_example_fails_early():
    with pytest.raises(ValueError, match=exact('max_tokens: got 9, below the longest example (index 0, length 10); must be >= 10, or truncate the examples')):
        TokenBudgetBatchSampler(LENGTHS_10, max_tokens=9)
    with pytest.raises(ValueError, match="world_size \\* grad_accum"):
        TokenBudgetBatchSampler([1, 1], max_tokens=4, world_size=3)


def test_token_budget_resume_mid_epoch():
    lengths = np.random.default_rng(3).integers(1, 30, size=60)
    a = TokenBudgetBatchSampler(lengths, 64, seed=7, world_size=2, rank=1)
    a.set_epoch(1)
    it = iter(a)
    [next(it) for _ in range(3)]
    state = a.state_dict()
    rest = list(it)
    b = TokenBudgetBatchSampler(lengths, 64, seed=7, world_size=2, rank=1)
    b.load_state_dict(state)
    assert list(b) == rest and len(rest) == len(a) - 3


# ---- curriculum ---------------------------------------------------------------------------------


def test_curriculum_limits_exact_per_pacing():
    lengths = list(range(1, 17))
    def limits(**kw):
        s = CurriculumBatchSampler(lengths, 2, min_length=4, curriculum_batches=8, **kw)
        return [s.length_limit(t) for t in range(10)]
    assert limits() == [4, 5, 7, 8, 10, 11, 13, 14, 16, 16]
    assert limits(pacing="sqrt") == [4, 8, 10, 11, 12, 13, 14, 15, 16, 16]
    assert limits(pacing="steps", num_stages=3) == [4, 4, 4, 8, 8, 8, 12, 12, 16, 16]


def test_curriculum_exact_batches_and_limits():
    steps, limits = curriculum_steps(list(range(1, 9)), 2, min_length=2, curriculum_batches=4)
    assert limits == [2, 3, 5, 6]
    assert steps == [[[1, 0]], [[2, 1]], [[4, 3]], [[5, 0]]]
    # epoch 1 starts at run position 4: everything admitted, a plain random pass
    steps1, limits1 = curriculum_steps(list(range(1, 9)), 2, min_length=2, curriculum_batches=4, epoch=1)
    assert limits1 == [8, 8, 8, 8]
    assert sorted(i for s in steps1 for i in s[0]) == list(range(8))


def test_curriculum_batches_respect_limit_and_ranks_agree():
    lengths = np.random.default_rng(0).integers(1, 64, size=60)
    kwargs = dict(min_length=20, curriculum_batches=12, seed=5)
    samplers = [CurriculumBatchSampler(lengths, 3, world_size=2, rank=r, **kwargs) for r in range(2)]
    for epoch in range(2):
        per_rank = []
        for s in samplers:
            s.set_epoch(epoch)
            per_rank.append(list(s))
        assert len(per_rank[0]) == len(per_rank[1]) == 10  # ceil(60 / (3 * 2))
        for k, (b0, b1) in enumerate(zip(*per_rank)):
            limit = samplers[0].length_limit(epoch * 10 + k)
            assert limit == samplers[1].length_limit(epoch * 10 + k)
            assert max(lengths[i] for i in b0 + b1) <= limit
            assert not set(b0) & set(b1)  # disjoint at every step
    # limits rise: at position 0 only short examples, after the curriculum the longest are drawn
    s = samplers[0]
    s.set_epoch(0)
    assert max(lengths[i] for i in next(iter(s))) <= 20
    assert s.current_length_limit == 20


def test_curriculum_after_warmup_full_coverage_across_ranks():
    lengths = list(range(1, 13))
    for world_size in (2, 3):
        per_rank = rank_batches(
            CurriculumBatchSampler, lengths, world_size, 2, min_length=6, curriculum_batches=1, epoch=1
        )
        assert_disjoint_cover(per_rank, 12)


def test_curriculum_top_up_has_no_duplicates_within_a_step():
    steps, _ = curriculum_steps(list(range(1, 8)), 2, StepPlanSettings(world_size=2), min_length=4, curriculum_batches=2)
    for step in steps:
        flat = [i for b in step for i in b]
        assert len(flat) == 4 and len(set(flat)) == 4


def test_curriculum_resume_mid_epoch_and_state():
    lengths = np.random.default_rng(1).integers(1, 40, size=30)
    a = CurriculumBatchSampler(lengths, 2, min_length=15, curriculum_batches=20, seed=3)
    a.set_epoch(1)
    it = iter(a)
    [next(it) for _ in range(5)]
    assert a.run_position == 15 + 5 and a.current_length_limit == a.length_limit(19)
    state = a.state_dict()
    rest = list(it)
    b = CurriculumBatchSampler(lengths, 2, min_length=15, curriculum_batches=20, seed=3)
    b.load_state_dict(state)
    assert list(b) == rest


def test_curriculum_invalid_settings_name_the_field():
    with pytest.raises(ValueError, match=exact('min_length: got 9; must be <= max_length (8)')):
        CurriculumBatchSampler(list(range(1, 9)), 2, min_length=9, curriculum_batches=4)
    with pytest.raises(ValueError, match=exact("pacing: got 'cubic'; allowed: linear, sqrt, steps")):
        CurriculumBatchSampler(list(range(1, 9)), 2, min_length=2, curriculum_batches=4, pacing="cubic")
    with pytest.raises(ValueError, match=exact('min_length: got 1, which admits 1 examples, fewer than one step needs (batch_size * world_size = 2); must be at least 2')):
        CurriculumBatchSampler(list(range(1, 9)), 2, min_length=1, curriculum_batches=4)
    with pytest.raises(ValueError, match=exact("curriculum_batches: got -1; must be an integer >= 0")):
        CurriculumBatchSampler(list(range(1, 9)), 2, min_length=2, curriculum_batches=-1)


def test_samplers_are_independent_of_global_rng():
    import torch

    lengths = list(range(1, 21))
    torch.manual_seed(0)
    a = [list(cls(lengths, *args)) for cls, args in _all_samplers()]
    torch.manual_seed(123)
    np.random.seed(9)
    b = [list(cls(lengths, *args)) for cls, args in _all_samplers()]
    assert a == b


def _all_samplers():
    yield LengthGroupedBatchSampler, (3,)
    yield TokenBudgetBatchSampler, (40,)
    yield (lambda lengths, bs: CurriculumBatchSampler(lengths, bs, min_length=5, curriculum_batches=3)), (2,)


def test_epochs_differ_for_all_samplers():
    lengths = list(range(1, 31))
    for make in (
        lambda: LengthGroupedBatchSampler(lengths, 3),
        lambda: TokenBudgetBatchSampler(lengths, 60),
        lambda: CurriculumBatchSampler(lengths, 3, min_length=30, curriculum_batches=0),
    ):
        s = make()
        orders = []
        for epoch in range(3):
            s.set_epoch(epoch)
            orders.append(list(s))
        assert all(a != b for a, b in itertools.combinations(orders, 2))


# ---- plain transformers.Trainer: the one-liner, resume == straight --------------------------------


def _pad_collate(features):
    import torch

    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros((len(features), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, f in enumerate(features):
        ids[r, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[r, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def _train_with_sampler(tmp_path, make_sampler, max_steps, resume=None, save_steps=None):
    from conftest import make_tiny_gpt2
    from transformers import Trainer, TrainingArguments

    from hf_fasttrain.callbacks.seqlen import apply_batch_sampler

    rng = np.random.default_rng(0)
    # learnable sequences (each token is the previous + 1), lengths 3..16
    ids = [[(int(rng.integers(1, 64)) + j) % 63 + 1 for j in range(int(n))] for n in rng.integers(3, 17, size=40)]
    ds = datasets.Dataset.from_dict({"input_ids": ids})
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=max_steps, learning_rate=1e-2, report_to=[], use_cpu=True,
        logging_steps=1, save_strategy="steps" if save_steps else "no", save_steps=save_steps or 500,
        seed=0, disable_tqdm=True, gradient_accumulation_steps=2, include_num_input_tokens_seen="non_padding",
    )
    model = make_tiny_gpt2(64, 32)
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=_pad_collate)
    sampler = make_sampler(get_lengths(ds), args)
    apply_batch_sampler(trainer, sampler)
    trainer.train(resume_from_checkpoint=resume)
    logs = [h for h in trainer.state.log_history if "loss" in h]
    return sampler, logs, get_lengths(ds)


def test_plain_trainer_token_budget_resume_equals_straight(tmp_path):
    def make(lengths, args):
        return TokenBudgetBatchSampler(lengths, 32, seed=args.seed, world_size=args.world_size,
                                       rank=args.process_index, grad_accum=args.gradient_accumulation_steps)

    sampler, straight, lengths = _train_with_sampler(tmp_path / "a", make, max_steps=6, save_steps=3)
    # tokens seen = the sampler's own batches, in order, 2 micro-batches per optimizer step
    batches = sampler.batches(0)
    assert len(batches) >= 12 and len(batches) % 2 == 0
    per_step = [int(lengths[batches[2 * s]].sum() + lengths[batches[2 * s + 1]].sum()) for s in range(6)]
    assert [h["num_input_tokens_seen"] for h in straight] == list(itertools.accumulate(per_step))
    _, resumed, _ = _train_with_sampler(tmp_path / "a", make, max_steps=6, resume=str(tmp_path / "a" / "checkpoint-3"))
    resumed = [h for h in resumed if h["step"] > 3]  # log_history also holds the checkpoint's steps 1-3
    assert [h["step"] for h in resumed] == [4, 5, 6]
    assert [h["loss"] for h in resumed] == pytest.approx([h["loss"] for h in straight[3:]], abs=1e-6)
    assert [h["num_input_tokens_seen"] for h in resumed] == [h["num_input_tokens_seen"] for h in straight[3:]]
    # the token counts tell the steps apart, so a resume that re-read the first batches would fail above
    assert per_step[:3] != per_step[3:]


def test_plain_trainer_curriculum_logs_length_limit(tmp_path):
    def make(lengths, args):
        return CurriculumBatchSampler(lengths, 2, min_length=6, curriculum_batches=8, seed=args.seed)

    sampler, logs, lengths = _train_with_sampler(tmp_path, make, max_steps=5)
    # micro-batches 0..9; the last of optimizer step s is batch 2s - 1
    assert [h["length_limit"] for h in logs] == [sampler.length_limit(2 * s - 1) for s in range(1, 6)]
    assert [h["length_limit"] for h in logs] == [7, 9, 12, 14, 16]  # floor(6 + 10 * t / 8), t = 1, 3, 5, 7, 9
    batches = sampler.batches(0)
    for s in range(5):
        for b in (batches[2 * s], batches[2 * s + 1]):
            assert max(lengths[b]) <= sampler.length_limit(2 * s + (b is batches[2 * s + 1]))


# ---- two processes, FastTrainer with the curriculum: accelerate launch --multi_gpu --num_processes 2, CPU (gloo)

DDP_SCRIPT = r'''
import json, sys
import datasets, numpy as np, torch
from transformers import GPT2Config, GPT2LMHeadModel
from hf_fasttrain import FastTrainer, FastTrainingArguments
from hf_fasttrain.data.samplers import get_lengths

out = sys.argv[1]
rng = np.random.default_rng(0)
ids = [[(int(rng.integers(1, 64)) + j) % 63 + 1 for j in range(int(n))] for n in rng.integers(3, 33, size=64)]
ds = datasets.Dataset.from_dict({"input_ids": ids, "idx": list(range(64))})
seen = []

def collate(features):
    seen.append([f["idx"] for f in features])
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros((len(features), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, f in enumerate(features):
        ids[r, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[r, : len(f["input_ids"])] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

args = FastTrainingArguments(output_dir=out, max_steps=6, per_device_train_batch_size=2, learning_rate=1e-3,
                             report_to="none", use_cpu=True, logging_steps=1, save_strategy="no", seed=0,
                             disable_tqdm=True, remove_unused_columns=False,
                             curriculum_min_length=8, curriculum_fraction=1.0)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
trainer = FastTrainer(model=model, args=args, train_dataset=ds, data_collator=collate)
trainer.train()
limits = [h["length_limit"] for h in trainer.state.log_history if "loss" in h]
json.dump({"world_size": args.world_size, "rank": args.process_index, "batches": seen[:6], "limits": limits,
           "lengths": get_lengths(ds).tolist()}, open(f"{out}/rank{args.process_index}.json", "w"))
# the DDP wrapper holds the process group and its gloo threads: free it now, or the threads end in the
# interpreter's teardown, where one can abort the rank
del trainer
torch.distributed.destroy_process_group()
import gc; gc.collect()
'''


@pytest.mark.e2e
def test_two_process_curriculum_same_limit_disjoint_examples(tmp_path):
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "ddp_curriculum.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    # NOTE: in accelerate 1.15 `launch --cpu --num_processes 2` starts ONE process unless mpirun is
    # used; `--multi_gpu` goes through torchrun and, with use_cpu=True, trains on CPU over gloo.
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    lengths = ranks[0]["lengths"]
    # both ranks logged the same limit at every step, and it rose: floor(8 + 24 * step / 6)
    assert ranks[0]["limits"] == ranks[1]["limits"] == [8, 12, 16, 20, 24, 28]
    for step in range(6):
        b0, b1 = ranks[0]["batches"][step], ranks[1]["batches"][step]
        assert len(b0) == len(b1) == 2 and not set(b0) & set(b1)  # disjoint examples at every step
        limit = 8 + 24 * step // 6
        assert max(lengths[i] for i in b0 + b1) <= limit


def test_typed_choices_are_the_checked_names():
    """The Literal types of the pacing and the sequence-length mode name what the runtime checks allow."""
    import typing

    from hf_fasttrain.data.seqlen import PACINGS, SEQ_LEN_MODES, Mode, Pacing

    assert typing.get_args(Pacing) == PACINGS and typing.get_args(Mode) == SEQ_LEN_MODES
