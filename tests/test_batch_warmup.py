"""Batch-size warmup: exact plans of the pure core, the sampler's resume, FastTrainer's wiring."""

import numpy as np
import pytest
from transformers import DataCollatorForLanguageModeling

from hf_fasttrain import FastTrainer
from hf_fasttrain.data.samplers import StepPlanSettings
from hf_fasttrain.data.token_budget import (
    BatchWarmupBatchSampler,
    batch_warmup_budget,
    batch_warmup_steps,
    token_budget_steps,
)

from conftest import TINY_BLOCK, make_tiny_gpt2, tiny_args


@pytest.mark.parametrize("step, expected", [(0, 4), (1, 8), (2, 12), (3, 16), (10, 16)])
def test_budget_grows_linearly_to_the_full_batch(step, expected):
    assert batch_warmup_budget(step, 4, 16, warmup_steps=3) == expected


def test_budget_without_warmup_is_the_full_batch():
    assert batch_warmup_budget(0, 4, 16, warmup_steps=0) == 16


def test_fixed_rows_ramp_exactly():
    # rows of 4 tokens, full micro-batch 16 tokens (4 rows), warmup from 1 row over 3 steps:
    # budgets 4, 8, 12 -> 1, 2, 3 rows; then the 2 rows left of the taken plan steps, then full batches
    steps = batch_warmup_steps([4] * 12, 16, min_tokens=4, warmup_steps=3)
    assert [len(s[0]) for s in steps] == [1, 2, 3, 2, 4]
    # the examples come in the full-budget plan's order, each exactly once
    full = token_budget_steps([4] * 12, 16)
    assert [i for s in steps for i in s[0]] == [i for s in full for i in s[0]]


def test_every_example_once_on_the_harness_shape():
    steps = batch_warmup_steps([128] * 2000, 2048, StepPlanSettings(seed=3), min_tokens=512, warmup_steps=30)
    sizes = [len(s[0]) for s in steps]
    assert sizes[:8] == [4, 4, 4, 5, 5, 6, 6, 6]  # floor(512 + 1536 * t / 30) // 128 rows
    assert sorted(i for s in steps for i in s[0]) == list(range(2000))
    assert sizes == sorted(sizes[:30]) + sizes[30:]  # rises during the warmup
    assert set(sizes[32:-1]) == {16}


def test_variable_lengths_fit_the_budget_of_their_step():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 17, size=300).tolist()
    steps = batch_warmup_steps(lengths, 64, StepPlanSettings(seed=1), min_tokens=16, warmup_steps=20, pad_to_multiple_of=4)
    padded = -(-np.asarray(lengths) // 4) * 4
    for t, s in enumerate(steps):
        b = s[0]
        budget = batch_warmup_budget(t, 16, 64, 20) if t < 20 else 64
        assert len(b) == 1 or len(b) * padded[b].max() <= budget, (t, b)
    assert sorted(i for s in steps for i in s[0]) == list(range(300))


def test_ranks_and_gradient_accumulation():
    steps = batch_warmup_steps([4] * 40, 16, StepPlanSettings(world_size=2), min_tokens=4, warmup_steps=3)
    assert [[len(b) for b in s] for s in steps][:4] == [[1, 1], [2, 2], [3, 3], [2, 2]]
    assert sorted(i for s in steps for b in s for i in b) == list(range(40))
    ga = batch_warmup_steps([4] * 40, 16, StepPlanSettings(grad_accum=2), min_tokens=4, warmup_steps=3)
    assert len(ga) % 2 == 0
    # optimizer step t = micro-batch // 2: budgets 4, 8, 12 hold for two micro-batches each
    assert [len(s[0]) for s in ga][:6] == [1, 1, 2, 2, 3, 3]


def test_later_epochs_and_no_warmup_are_the_plain_token_budget_plan():
    lengths = [4] * 12
    assert batch_warmup_steps(lengths, 16, min_tokens=4, warmup_steps=3, epoch=1) == token_budget_steps(lengths, 16, epoch=1)
    assert batch_warmup_steps(lengths, 16, min_tokens=4, warmup_steps=0) == token_budget_steps(lengths, 16)


def test_sampler_resumes_mid_warmup():
    s = BatchWarmupBatchSampler([4] * 40, max_tokens=16, min_tokens=4, warmup_steps=5, seed=2)
    straight = list(s)
    s2 = BatchWarmupBatchSampler([4] * 40, max_tokens=16, min_tokens=4, warmup_steps=5, seed=2)
    it = iter(s2)
    first = [next(it) for _ in range(3)]
    state = s2.state_dict()
    s3 = BatchWarmupBatchSampler([4] * 40, max_tokens=16, min_tokens=4, warmup_steps=5, seed=2)
    s3.load_state_dict(state)
    assert first + list(s3) == straight
    assert [s.budget_at(t) for t in range(6)] == [4, 6, 8, 11, 13, 16]


@pytest.mark.parametrize("kw, match", [
    (dict(min_tokens=0), "min_tokens: got 0; must be an integer >= 1"),
    (dict(min_tokens=32), "min_tokens: got 32; must be <= max_tokens (16)"),
    (dict(warmup_steps=-1), "warmup_steps: got -1; must be an integer >= 0"),
    (dict(pacing="cubic"), "pacing: got 'cubic'; allowed: linear, sqrt, steps"),
])
def test_bad_plan_settings(kw, match):
    with pytest.raises(ValueError) as err:
        batch_warmup_steps([4] * 12, 16, **{"min_tokens": 4, "warmup_steps": 3, **kw})
    assert str(err.value) == match


def test_args_need_a_token_counted_run(tmp_path):
    with pytest.raises(ValueError, match="batch_warmup_min_tokens: got 64;.*schedule_unit='tokens'"):
        tiny_args(tmp_path, batch_warmup_min_tokens=64)
    with pytest.raises(ValueError, match="batch_warmup_fraction: got 2;"):
        tiny_args(tmp_path, batch_warmup_min_tokens=64, batch_warmup_fraction=2, lr_decay="cosine",
                  schedule_unit="tokens", schedule_total_tokens=1000)
    with pytest.raises(ValueError, match="choose one batching option"):
        tiny_args(tmp_path, batch_warmup_min_tokens=64, length_grouping=True, lr_decay="cosine",
                  schedule_unit="tokens", schedule_total_tokens=1000)


def _train_recording_rows(args, train, tokenizer):
    """A FastTrainer run on ``train``; returns the trainer and the rows of each micro-batch it trained on."""
    trainer = FastTrainer(model=make_tiny_gpt2(len(tokenizer)), args=args, train_dataset=train,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                          processing_class=tokenizer)
    seen = []
    step = trainer.training_step
    trainer.training_step = lambda model, inputs, n=None: (seen.append(inputs["input_ids"].shape[0]), step(model, inputs, n))[1]
    trainer.train()
    return trainer, seen


@pytest.mark.slow
def test_fast_trainer_ramps_the_batch_and_stops_at_the_token_budget(tiny_lm, tiny_tokenizer, tmp_path):
    rows = 8
    budget = 6 * rows * TINY_BLOCK  # tokens of 6 full steps; the smaller warmup steps need 8: max_steps gives them room
    args = tiny_args(tmp_path, max_steps=10, per_device_train_batch_size=rows, lr_decay="cosine",
                     schedule_unit="tokens", schedule_total_tokens=budget, batch_warmup_min_tokens=2 * TINY_BLOCK,
                     batch_warmup_fraction=0.3, logging_steps=1)
    trainer, seen = _train_recording_rows(args, tiny_lm["train"], tiny_tokenizer)
    # warmup over round(0.3 * 10) = 3 steps: budgets 64, 128, 192 tokens -> 2, 4, 6 rows of 32; 4 left; full
    assert seen[:4] == [2, 4, 6, 4] and set(seen[4:]) == {8}
    assert sum(seen) * TINY_BLOCK == budget  # stopped at the token budget: 2+4+6+4 + 4*8 = 48 rows
    assert trainer.state.global_step == len(seen) == 8
    assert trainer.token_progress.tokens_seen == budget
    lrs = [e["learning_rate"] for e in trainer.state.log_history if "learning_rate" in e]
    assert lrs[-1] < lrs[2]  # the cosine ran to the end of the budget


@pytest.mark.slow
def test_a_run_longer_than_one_epoch_reaches_its_budget(tiny_lm, tiny_tokenizer, tmp_path):
    # 40 rows, full batch 8 rows: epoch 0 (with the warmup) has 2 + 4 + 6 + 4 + 3 * 8 = 40 rows in 8 steps,
    # epoch 1 five full steps; a budget of 12 full steps (96 rows) needs both and 4 more steps of epoch 2
    rows = 8
    train = tiny_lm["train"].select(range(40))
    budget = 12 * rows * TINY_BLOCK
    args = tiny_args(tmp_path, max_steps=15, per_device_train_batch_size=rows, lr_decay="cosine",
                     schedule_unit="tokens", schedule_total_tokens=budget, batch_warmup_min_tokens=2 * TINY_BLOCK,
                     batch_warmup_fraction=0.2, logging_steps=1)
    trainer, seen = _train_recording_rows(args, train, tiny_tokenizer)
    assert seen[:4] == [2, 4, 6, 4] and set(seen[4:]) == {8}
    assert sum(seen) * TINY_BLOCK == budget and trainer.state.global_step == len(seen) == 4 + 10


def test_max_steps_stops_a_batch_warmup_before_its_budget(tiny_lm, tiny_tokenizer, tmp_path):
    # max_steps is the number of optimizer steps: 6 steps of 2, 4, 6, 4 (the warmup) then 8 rows, short of the budget
    rows = 8
    args = tiny_args(tmp_path, max_steps=6, per_device_train_batch_size=rows, lr_decay="cosine",
                     schedule_unit="tokens", schedule_total_tokens=6 * rows * TINY_BLOCK,
                     batch_warmup_min_tokens=2 * TINY_BLOCK, batch_warmup_fraction=0.5, logging_steps=1)
    trainer, seen = _train_recording_rows(args, tiny_lm["train"], tiny_tokenizer)
    assert trainer.state.global_step == len(seen) == 6 and seen == [2, 4, 6, 4, 8, 8]
