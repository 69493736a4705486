"""Pacing, curriculum limits and sequence-length warmup: exact schedule values and exact tensors."""

import re

import pytest
import torch
from transformers import default_data_collator

from hf_fasttrain.data.seqlen import (
    SeqLenWarmup,
    SeqLenWarmupCollator,
    length_limit_at,
    pacing_value,
    seq_len_at,
    set_batch_sequence_length,
)


def exact(message: str) -> str:
    """A ``pytest.raises(match=...)`` pattern for exactly this one-line message."""
    return "^" + re.escape(message) + "$"


@pytest.mark.parametrize(
    "progress, pacing, expected",
    [
        (0.0, "linear", 0.0),
        (0.25, "linear", 0.25),
        (0.25, "sqrt", 0.5),
        (0.49, "steps", 0.25),
        (0.5, "steps", 0.5),
        (0.99, "steps", 0.75),
        (1.0, "steps", 1.0),
        (1.7, "sqrt", 1.0),
        (-0.3, "linear", 0.0),
    ],
)
def test_pacing_value_table(progress, pacing, expected):
    assert pacing_value(progress, pacing, num_stages=4) == pytest.approx(expected)


def test_length_limit_at_table():
    assert [length_limit_at(p / 4, 10, 50) for p in range(6)] == [10, 20, 30, 40, 50, 50]
    assert [length_limit_at(p / 4, 10, 50, "sqrt") for p in range(5)] == [10, 30, 38, 44, 50]


@pytest.mark.parametrize(
    "progress, kwargs, expected",
    [
        (0.0, {}, 64),
        (0.5, {}, 544),  # 64 + 960 / 2
        (0.51, {}, 552),  # 553.6 rounded down to a multiple of 8
        (0.999, {}, 1016),
        (1.0, {}, 1024),
        (0.5, {"multiple": 128}, 512),
        (0.01, {"multiple": 128}, 64),  # never below min_seq_len
        (0.25, {"pacing": "sqrt"}, 544),
        (0.3, {"pacing": "steps", "num_stages": 2}, 64),
        (0.6, {"pacing": "steps", "num_stages": 2}, 544),
    ],
)
def test_seq_len_at_table(progress, kwargs, expected):
    assert seq_len_at(progress, 64, 1024, **kwargs) == expected


def test_seq_len_at_reaches_an_odd_max_exactly():
    assert seq_len_at(0.999, 8, 100) == 96 and seq_len_at(1.0, 8, 100) == 100


def test_invalid_settings_name_the_field():
    with pytest.raises(ValueError, match=exact('min_seq_len: got 2048; must be <= max_seq_len (1024)')):
        seq_len_at(0.5, 2048, 1024)
    with pytest.raises(ValueError, match=exact('min_length: got 9; must be <= max_length (8)')):
        length_limit_at(0.5, 9, 8)
    with pytest.raises(ValueError, match=exact("pacing: got 'exp'; allowed: linear, sqrt, steps")):
        SeqLenWarmup(8, 64, 10, pacing="exp")
    with pytest.raises(ValueError, match=exact("mode: got 'crop'; allowed: truncate, rechunk")):
        SeqLenWarmup(8, 64, 10, mode="crop")
    with pytest.raises(ValueError, match=exact('warmup_batches: got -1; must be an integer >= 0')):
        SeqLenWarmup(8, 64, -1)
    with pytest.raises(ValueError, match=exact('num_stages: got 0; must be an integer >= 1')):
        pacing_value(0.5, "steps", num_stages=0)


def test_truncate_exact_tensors():
    batch = {
        "input_ids": torch.arange(12).view(2, 6),
        "attention_mask": torch.ones(2, 6, dtype=torch.long),
        "labels": torch.arange(12).view(2, 6) + 100,
        "meta": torch.tensor([7, 8]),
    }
    out = set_batch_sequence_length(batch, 4, "truncate")
    assert out["input_ids"].tolist() == [[0, 1, 2, 3], [6, 7, 8, 9]]
    assert out["labels"].tolist() == [[100, 101, 102, 103], [106, 107, 108, 109]]
    assert out["attention_mask"].shape == (2, 4)
    assert out["meta"].tolist() == [7, 8]  # not a [B, L] tensor: untouched
    assert set_batch_sequence_length(batch, 6)["input_ids"] is batch["input_ids"]


def test_rechunk_exact_tensors_divisible():
    batch = {"input_ids": torch.arange(12).view(2, 6), "labels": torch.arange(12).view(2, 6) + 100}
    out = set_batch_sequence_length(batch, 3, "rechunk")
    assert out["input_ids"].tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    assert out["labels"].tolist() == [[100, 101, 102], [103, 104, 105], [106, 107, 108], [109, 110, 111]]
    assert "attention_mask" not in out  # nothing padded, so no mask needed
    assert sorted(out["input_ids"].flatten().tolist()) == list(range(12))  # no token dropped


def test_rechunk_pads_the_last_piece_when_not_divisible():
    batch = {
        "input_ids": torch.arange(1, 11).view(2, 5),
        "labels": torch.arange(1, 11).view(2, 5),
        "position_ids": torch.arange(5).expand(2, 5),
    }
    out = set_batch_sequence_length(batch, 2, "rechunk", pad_token_id=0)
    assert out["input_ids"].tolist() == [[1, 2], [3, 4], [5, 0], [6, 7], [8, 9], [10, 0]]
    assert out["labels"].tolist() == [[1, 2], [3, 4], [5, -100], [6, 7], [8, 9], [10, -100]]
    assert out["attention_mask"].tolist() == [[1, 1], [1, 1], [1, 0], [1, 1], [1, 1], [1, 0]]
    assert out["position_ids"].tolist() == [[0, 1]] * 6
    assert out["attention_mask"].sum() == 10


def test_set_batch_sequence_length_rejects_bad_input():
    with pytest.raises(ValueError, match=exact("mode: got 'drop'; allowed: truncate, rechunk")):
        set_batch_sequence_length({"input_ids": torch.zeros(1, 4)}, 2, "drop")
    with pytest.raises(ValueError, match=exact('seq_len: got 0; must be an integer >= 1')):
        set_batch_sequence_length({"input_ids": torch.zeros(1, 4)}, 0)


def test_warmup_schedule_and_token_accounting():
    w = SeqLenWarmup(min_seq_len=8, max_seq_len=32, warmup_batches=4)
    assert [w.seq_len(p) for p in range(6)] == [8, 8, 16, 24, 32, 32]
    assert [w.tokens_in_batch(p, 2) for p in range(5)] == [16, 16, 32, 48, 64]
    assert [w.cumulative_tokens(n, 2) for n in range(7)] == [0, 16, 32, 64, 112, 176, 240]
    # a token-counted stop: the first n whose cumulative tokens reach the target
    assert [w.batches_for_tokens(t, 2) for t in (0, 1, 16, 17, 112, 113, 240, 241)] == [0, 1, 1, 2, 4, 5, 6, 7]
    # 10 full-length batches = 640 tokens; with the warmup: 112 in 4 batches, then ceil(528 / 64) = 9
    assert w.batches_for_tokens(10 * 2 * 32, 2) == 13
    assert w.token_progress(3, 6, 2) == pytest.approx(64 / 240)
    rechunk = SeqLenWarmup(8, 32, 4, mode="rechunk")
    assert rechunk.cumulative_tokens(6, 2) == 6 * 64  # rechunk keeps every token
    assert SeqLenWarmup(8, 32, 0).seq_len(0) == 32  # no warmup


def test_collator_counts_batches_it_produces_and_resumes():
    w = SeqLenWarmup(min_seq_len=2, max_seq_len=8, warmup_batches=3, multiple=2)
    features = [{"input_ids": list(range(8)), "labels": list(range(8))}] * 2
    collator = SeqLenWarmupCollator(default_data_collator, w)
    shapes = [tuple(collator(features)["input_ids"].shape) for _ in range(5)]
    assert shapes == [(2, 2), (2, 4), (2, 6), (2, 8), (2, 8)]
    assert collator.state_dict() == {"position": 5}
    resumed = SeqLenWarmupCollator(default_data_collator, w)
    resumed.load_state_dict({"position": 2})
    assert resumed(features)["input_ids"].tolist() == [[0, 1, 2, 3, 4, 5]] * 2
    assert resumed.last_seq_len == 6
    rechunk = SeqLenWarmupCollator(default_data_collator, SeqLenWarmup(2, 8, 3, multiple=2, mode="rechunk"))
    first = rechunk(features)
    assert first["input_ids"].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]] * 2


def test_collator_refuses_worker_processes():
    w = SeqLenWarmup(2, 4, 2, multiple=2)
    collator = SeqLenWarmupCollator(default_data_collator, w)
    loader = torch.utils.data.DataLoader([{"input_ids": [1, 2, 3, 4]}] * 2, batch_size=1, num_workers=1, collate_fn=collator)
    with pytest.raises(RuntimeError, match="dataloader_num_workers=0"):
        next(iter(loader))


def test_truncated_batch_trains_tiny_gpt2():
    from conftest import make_tiny_gpt2

    model = make_tiny_gpt2(64, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    w = SeqLenWarmup(min_seq_len=8, max_seq_len=32, warmup_batches=6)
    collator = SeqLenWarmupCollator(default_data_collator, w)
    data = [{"input_ids": [(i * 3 + j) % 64 for j in range(32)]} for i in range(4)]
    losses, lengths = [], []
    for _ in range(8):
        batch = collator([dict(d, labels=d["input_ids"]) for d in data])
        lengths.append(batch["input_ids"].shape[1])
        loss = model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    assert lengths == [8, 8, 16, 16, 24, 24, 32, 32]
    assert losses[-1] < losses[0]


def _train_with_warmup(tmp_path, max_steps, resume=None, save_steps=None):
    import datasets
    from conftest import make_tiny_gpt2
    from transformers import Trainer, TrainingArguments

    from hf_fasttrain.callbacks.seqlen import apply_seq_len_warmup

    chunks = [[(start + j) % 63 + 1 for j in range(16)] for start in range(0, 40 * 7, 7)]
    ds = datasets.Dataset.from_dict({"input_ids": chunks, "labels": chunks})
    args = TrainingArguments(
        output_dir=str(tmp_path), max_steps=max_steps, per_device_train_batch_size=2, learning_rate=1e-2,
        report_to=[], use_cpu=True, logging_steps=1, save_strategy="steps" if save_steps else "no",
        save_steps=save_steps or 500, seed=0, disable_tqdm=True, include_num_input_tokens_seen="all",
    )
    model = make_tiny_gpt2(64, 16)
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=default_data_collator)
    collator = apply_seq_len_warmup(trainer, SeqLenWarmup(min_seq_len=8, max_seq_len=16, warmup_batches=4, multiple=4))
    trainer.train(resume_from_checkpoint=resume)
    return collator, trainer, [h for h in trainer.state.log_history if "loss" in h]


def test_plain_trainer_seq_len_warmup_logs_trains_and_resumes(tmp_path):
    collator, trainer, straight = _train_with_warmup(tmp_path, max_steps=6, save_steps=3)
    assert [h["seq_len"] for h in straight] == [8, 8, 12, 12, 16, 16]
    # tokens actually trained (counted by the Trainer on the batches it used): 2 rows x seq_len
    assert [h["num_input_tokens_seen"] for h in straight] == [16, 32, 56, 80, 112, 144]
    # evaluation batches keep their full length: the Trainer's own collator is not wrapped
    assert trainer.data_collator is default_data_collator
    _, _, resumed = _train_with_warmup(tmp_path, max_steps=6, resume=str(tmp_path / "checkpoint-3"))
    resumed = [h for h in resumed if h["step"] > 3]
    assert [h["seq_len"] for h in resumed] == [12, 16, 16]
    assert [h["num_input_tokens_seen"] for h in resumed] == [80, 112, 144]
    assert [h["loss"] for h in resumed] == pytest.approx([h["loss"] for h in straight[3:]], abs=1e-6)


def test_batches_consumed_with_short_last_step():
    from hf_fasttrain.data.seqlen import batches_consumed

    # 5 micro-batches per epoch, accumulation 2 -> 3 optimizer steps per epoch (2, 2, 1)
    assert [batches_consumed(s, 2, 5) for s in range(7)] == [0, 2, 4, 5, 7, 9, 10]


def _slw_args(**kw):
    from types import SimpleNamespace

    base = dict(max_steps=6, max_tokens=None, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                seq_len_warmup_min=8, seq_len_warmup_fraction=0.5, seq_len_warmup_multiple=8,
                seq_len_warmup_pacing="linear", seq_len_warmup_stages=4, seq_len_warmup_mode="truncate",
                seq_len_warmup_count_tokens=True, batch_warmup_min_tokens=None)
    return SimpleNamespace(**{**base, **kw})


# max_tokens 192 = the tokens of 6 full-length rows of 32 (one row a step)
@pytest.mark.parametrize(
    "overrides, row_length, expected",
    [
        ({}, 32, 6),                                                # max_steps is the number of optimizer steps
        ({"batch_warmup_min_tokens": 64}, 32, 6),                   # whatever else is on
        ({"max_steps": -1}, 32, None),                              # by epochs: the Trainer counts
        # lengths 8, 16, 24 over 3 warmup batches, then 32: 8+16+24 = 48, then 144 / 32 = 4.5 -> 5 more: 8
        ({"max_steps": -1, "max_tokens": 192}, 32, 8),
        ({"max_steps": -1, "max_tokens": 192, "seq_len_warmup_min": None}, 32, 6),      # no warmup: full rows
        ({"max_steps": -1, "max_tokens": 193, "seq_len_warmup_min": None}, 32, 7),      # a token more: a step more
        ({"max_steps": -1, "max_tokens": 192, "seq_len_warmup_mode": "rechunk"}, 32, 6),  # rechunk keeps every token
        ({"max_steps": -1, "max_tokens": 192, "seq_len_warmup_count_tokens": False}, 32, 8),  # the same tokens
        ({"max_steps": -1, "max_tokens": 192, "seq_len_warmup_min": 32}, 32, 6),        # starts at full length
        ({"max_steps": -1, "max_tokens": 384, "per_device_train_batch_size": 2}, 32, 8),  # over 2 rows a batch
        ({"max_steps": -1, "max_tokens": 192}, None, None),         # row length unknown
        # 2 micro-batches per step: 6 warmup micro-batches of 8, 8, 16, 16, 24, 24 (multiple 8), then 32:
        # 96 + 32 k >= 12 x 32 = 384 -> k = 9: 15 micro-batches -> 8 optimizer steps
        ({"max_steps": -1, "max_tokens": 384, "gradient_accumulation_steps": 2}, 32, 8),
    ],
)
def test_planned_optimizer_steps_table(overrides, row_length, expected):
    from hf_fasttrain.data.from_args import planned_optimizer_steps

    args = _slw_args(**overrides)
    assert planned_optimizer_steps(args, row_length) == expected


def test_planned_steps_match_the_warmup_the_trainer_builds():
    # the same count as the one FastTrainer takes for max_tokens (tests/test_seqlen_trainer.py: 8 steps)
    from hf_fasttrain.data.from_args import planned_tokens, schedule_length, seq_len_warmup_from_args

    args = _slw_args(max_steps=-1, max_tokens=192)
    assert schedule_length(args, 32) == 6  # the warmup spans half of the run's 6 full-length steps
    w = seq_len_warmup_from_args(args, 32)
    assert [w.seq_len(p) for p in range(5)] == [8, 16, 24, 32, 32]
    assert w.cumulative_tokens(8, 1) >= 6 * 32 > w.cumulative_tokens(7, 1)
    assert planned_tokens(args, 32) == w.cumulative_tokens(8, 1) == 208
    assert planned_tokens(_slw_args(), 32) == 8 + 16 + 24 + 3 * 32  # 6 steps, the first 3 short


def test_max_steps_beside_max_tokens_must_be_their_steps():
    from hf_fasttrain.validation import ConfigError
    from hf_fasttrain.data.from_args import resolve_max_steps

    args = _slw_args(max_steps=-1, max_tokens=192)
    resolve_max_steps(args, 32)
    assert args.max_steps == 8
    resolve_max_steps(args, 32)  # again (a saved config holds both): the same
    with pytest.raises(ConfigError) as err:
        resolve_max_steps(_slw_args(max_steps=6, max_tokens=192), 32)
    assert str(err.value) == ("max_steps: 6 disagrees with max_tokens 192, which takes 8 optimizer steps here (6 "
                              "full-length steps' tokens, shorter rows first); give one of them: max_steps counts "
                              "optimizer steps, max_tokens tokens (max_tokens null to train max_steps steps)")


def test_finished_checkpoint_counts_the_steps_of_max_tokens(tmp_path):
    import json

    from hf_fasttrain.config.args import FastTrainingArguments
    from hf_fasttrain.run._resume import finished_checkpoint

    args = FastTrainingArguments(output_dir=str(tmp_path), max_tokens=6 * 8 * 32, per_device_train_batch_size=8,
                                 seq_len_warmup_min=8, seq_len_warmup_fraction=0.5, report_to="none", use_cpu=True)
    for step in (6, 8):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
    # step 6 of a run that takes 8 optimizer steps (rows of 32 tokens) is not the end; step 8 is
    assert finished_checkpoint(args, str(tmp_path / "checkpoint-6"), row_length=32) is None
    assert finished_checkpoint(args, str(tmp_path / "checkpoint-8"), row_length=32) == 8
