"""FastTrainer with the sequence-length options: the batches trained are the samplers' own, the
warmup's lengths and token-counted schedule are exact, resumed == straight, bad settings fail early."""

import itertools

import numpy as np
import pytest
from datasets import Dataset

from hf_fasttrain import FastTrainingArguments
from hf_fasttrain.trainer import RESUME_HOOK

from conftest import TINY_BLOCK, StopAt, make_tiny_trainer, tiny_args


def _variable_length_ds(tokenizer, n=48, seed=0):
    """Learnable sequences (each token = previous + 1) of lengths 3..24, no pad/eos ids inside."""
    rng = np.random.default_rng(seed)
    low = max(tokenizer.pad_token_id, tokenizer.eos_token_id) + 1
    span = len(tokenizer) - low
    rows = [[low + (int(rng.integers(span)) + j) % span for j in range(int(k))] for k in rng.integers(3, 25, size=n)]
    return Dataset.from_dict({"input_ids": rows})


def _fast_trainer(tokenizer, ds, args, **kw):
    return make_tiny_trainer(tokenizer, {"train": ds}, args, **kw)


def _train_logs(trainer, **kw):
    trainer.train(**kw)
    return [e for e in trainer.state.log_history if "loss" in e]


OPTIONS = {
    "length_grouping": dict(length_grouping=True),
    "token_budget": dict(max_tokens_per_batch=64),
    "packing_flatten": dict(packing="flatten", max_tokens_per_batch=64),
    "packing_rows": dict(packing="rows", packing_row_length=32),
    "curriculum": dict(curriculum_min_length=10, curriculum_fraction=1.0),
}


@pytest.mark.parametrize("option", list(OPTIONS))
def test_fasttrainer_trains_on_the_samplers_batches(option, tiny_tokenizer, tmp_path):
    ds = _variable_length_ds(tiny_tokenizer)
    args = tiny_args(tmp_path, max_steps=3, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                     include_num_input_tokens_seen="non_padding", **OPTIONS[option])
    trainer = _fast_trainer(tiny_tokenizer, ds, args)
    sampler = trainer.seqlen.sampler
    logs = _train_logs(trainer)
    lengths = np.array([len(r) for r in ds["input_ids"]])
    planned = [int(lengths[b].sum()) for b in sampler.batches(0)[:6]]
    per_step = [planned[2 * s] + planned[2 * s + 1] for s in range(3)]
    # tokens the Trainer counted on the batches it trained = the sampler's first 6 batches, in order
    assert [e["num_input_tokens_seen"] for e in logs] == list(itertools.accumulate(per_step))
    if option in ("token_budget", "packing_flatten"):
        assert all(e["padding_fraction"] < 0.15 for e in logs)
    if option == "packing_flatten":
        assert all(e["padding_fraction"] == 0.0 for e in logs)
    if option == "curriculum":
        # limit of the last micro-batch of step s: floor(10 + 14 * (2s - 1) / 6), logged on every step
        assert [e["length_limit"] for e in logs] == [12, 17, 21]
        assert all(max(lengths[b]) <= sampler.length_limit(k) for k, b in enumerate(sampler.batches(0)[:6]))


@pytest.mark.slow
def test_curriculum_resumed_equals_straight(tiny_tokenizer, tmp_path):
    ds = _variable_length_ds(tiny_tokenizer)
    kw = dict(max_steps=6, per_device_train_batch_size=4, curriculum_min_length=10, curriculum_fraction=1.0,
              save_strategy="steps", save_steps=3, include_num_input_tokens_seen="non_padding")
    straight = _train_logs(_fast_trainer(tiny_tokenizer, ds, tiny_args(tmp_path / "a", **kw)))
    _train_logs(_fast_trainer(tiny_tokenizer, ds, tiny_args(tmp_path / "b", **kw), callbacks=[StopAt(3)]))
    trainer = _fast_trainer(tiny_tokenizer, ds, tiny_args(tmp_path / "b", **kw))
    hook, skips = trainer.get_resumed_dataloader, []
    trainer.get_resumed_dataloader = lambda loader, n: skips.append(n) or hook(loader, n)
    resumed = _train_logs(trainer, resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-3"))
    if RESUME_HOOK:  # transformers >= 5.25: the sampler's skip goes through the Trainer's resume hook
        assert skips == [3]
    resumed = [e for e in resumed if e["step"] > 3]
    assert [e["step"] for e in resumed] == [4, 5, 6]
    for key in ("length_limit", "num_input_tokens_seen"):
        assert [e[key] for e in resumed] == [e[key] for e in straight[3:]]
    assert [e["loss"] for e in resumed] == pytest.approx([e["loss"] for e in straight[3:]], abs=1e-6)
    assert [e["length_limit"] for e in straight] == [10, 12, 14, 17, 19, 21]  # floor(10 + 14 t / 6)


@pytest.mark.slow
def test_seq_len_warmup_token_counted_lengths_schedule_and_resume(tiny_lm, tiny_tokenizer, tmp_path):
    # rows of 32 tokens, 4 per step; max_tokens 768 = 6 full-length steps (6 * 32 = 192 tokens per row); warmup
    # over round(0.5 * 6) = 3 batches: lengths 8, 16, 24, then 32; the warmup reaches 192 a row after 8 steps.
    kw = dict(max_tokens=6 * 4 * 32, max_steps=-1, per_device_train_batch_size=4, seq_len_warmup_min=8, seq_len_warmup_fraction=0.5,
              include_num_input_tokens_seen="all", save_strategy="steps", save_steps=3, learning_rate=3e-3)
    trainer = _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(tmp_path, **kw))
    straight = _train_logs(trainer)
    assert trainer.state.max_steps == trainer.args.max_steps == 8
    assert [e["seq_len"] for e in straight] == [8, 16, 24, 32, 32, 32, 32, 32]
    assert [e["num_input_tokens_seen"] for e in straight] == [32, 96, 192, 320, 448, 576, 704, 832]
    # linear decay over 6 full-length steps, evaluated at the full-length steps seen before each step:
    # tokens per row before step s = 0, 8, 24, 48, 80, ... -> e = 0, .25, .75, 1.5, 2.5, 3.5, 4.5, 5.5
    expected_lr = [3e-3 * (1 - e / 6) for e in (0, 0.25, 0.75, 1.5, 2.5, 3.5, 4.5, 5.5)]
    assert [e["learning_rate"] for e in straight] == pytest.approx(expected_lr, rel=1e-6)
    resumed = _train_logs(_fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(tmp_path, **kw)),
                          resume_from_checkpoint=str(tmp_path / "checkpoint-3"))
    resumed = [e for e in resumed if e["step"] > 3]
    for key in ("seq_len", "num_input_tokens_seen", "learning_rate"):
        assert [e[key] for e in resumed] == [e[key] for e in straight[3:]]
    assert [e["loss"] for e in resumed] == pytest.approx([e["loss"] for e in straight[3:]], abs=1e-6)


def test_seq_len_warmup_rechunk_and_step_counted(tiny_lm, tiny_tokenizer, tmp_path):
    kw = dict(max_steps=4, per_device_train_batch_size=2, seq_len_warmup_min=8, seq_len_warmup_fraction=0.5,
              seq_len_warmup_mode="rechunk", include_num_input_tokens_seen="all")
    trainer = _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(tmp_path / "r", **kw))
    logs = _train_logs(trainer)
    assert trainer.state.max_steps == 4  # rechunk keeps every token: nothing to count
    assert [e["seq_len"] for e in logs] == [8, 16, 32, 32]  # round(0.5 * 4) = 2 warmup batches
    assert [e["num_input_tokens_seen"] for e in logs] == [64, 128, 192, 256]
    off = _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(
        tmp_path / "s", max_steps=6, seq_len_warmup_min=8, seq_len_warmup_count_tokens=False))
    assert off.plan.length.schedule_steps == 6 and not off.seqlen.count_tokens  # counted in optimizer steps


@pytest.mark.parametrize("schedule", [dict(lr_scheduler_type="linear"), dict(lr_decay="linear"),
                                      dict(lr_decay="linear", schedule_unit="tokens")],
                         ids=["trainer-linear", "lr_decay-steps", "lr_decay-tokens"])
def test_max_steps_is_the_number_of_optimizer_steps_with_the_warmup_counted_in_tokens(schedule, tiny_lm, tiny_tokenizer,
                                                                                      tmp_path):
    # the same warmup with max_steps 6: exactly 6 optimizer steps (8 + 16 + 24 + 3 x 32 = 144 tokens a row), and
    # the lr's progress is the share of those tokens seen: 6 x (0, 8, 24, 48, 80, 112) / 144 before each step
    # (with the Trainer's schedule, with hf_fasttrain's counted in steps, and counted in tokens: the token budget)
    kw = dict(max_steps=6, per_device_train_batch_size=4, seq_len_warmup_min=8, seq_len_warmup_fraction=0.5,
              include_num_input_tokens_seen="all", learning_rate=3e-3, **schedule)
    trainer = _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(tmp_path, **kw))
    logs = _train_logs(trainer)
    assert trainer.state.global_step == trainer.state.max_steps == 6
    assert [e["seq_len"] for e in logs] == [8, 16, 24, 32, 32, 32]
    assert logs[-1]["num_input_tokens_seen"] == 4 * 144
    expected_lr = [3e-3 * (1 - t / 144) for t in (0, 8, 24, 48, 80, 112)]
    assert [e["learning_rate"] for e in logs] == pytest.approx(expected_lr, rel=1e-6)
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)  # at the floor after the last step


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(curriculum_min_length=64, curriculum_max_length=32, max_steps=10),
         "curriculum_min_length: got 64; is above curriculum_max_length=32"),
        (dict(curriculum_min_length=8, curriculum_pacing="cubic", max_steps=10),
         "curriculum_pacing: got 'cubic'; allowed: linear, sqrt, steps"),
        (dict(seq_len_warmup_min=8, seq_len_warmup_pacing="exp", max_steps=10), "seq_len_warmup_pacing: got 'exp'"),
        (dict(seq_len_warmup_min=8, seq_len_warmup_mode="crop", max_steps=10), "seq_len_warmup_mode: got 'crop'"),
        (dict(seq_len_warmup_min=8, max_steps=-1), "max_steps: got -1; seq_len_warmup is scheduled over the run's length"),
        (dict(max_tokens=0), "max_tokens: got 0; must be a positive integer"),
        (dict(max_tokens=100, length_grouping=True), "max_tokens: got 100; counts fixed-length rows"),
        (dict(packing="flat"), "packing: got 'flat'; allowed: none, flatten, rows"),
        (dict(packing="rows"), "packing_row_length: got None;"),
        (dict(length_grouping=True, max_tokens_per_batch=64), "max_tokens_per_batch: got 64; choose one"),
        (dict(max_tokens_per_batch=0), "max_tokens_per_batch: got 0;"),
        (dict(length_grouping=True, train_sampling_strategy="group_by_length"), "train_sampling_strategy: got 'group_by_length'"),
        (dict(seq_len_warmup_min=8, packing="rows", packing_row_length=32, max_steps=10), "packing: got 'rows';"),
    ],
)
def test_invalid_settings_fail_in_the_arguments(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=message):
        FastTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **overrides)


def test_settings_that_need_the_data_fail_before_training(tiny_lm, tiny_tokenizer, tmp_path):
    ds = _variable_length_ds(tiny_tokenizer)
    with pytest.raises(ValueError, match="^max_tokens_per_batch: got 16, below the longest example \\(index "):
        _fast_trainer(tiny_tokenizer, ds, tiny_args(tmp_path, max_tokens_per_batch=16))
    with pytest.raises(ValueError, match=f"seq_len_warmup_min: got 64; is above the training length {TINY_BLOCK}"):
        _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(tmp_path, seq_len_warmup_min=64))
    with pytest.raises(ValueError, match="^curriculum_min_length: got 2, which admits 0 examples"):
        _fast_trainer(tiny_tokenizer, ds, tiny_args(tmp_path, curriculum_min_length=2))


def test_recipe_keys_are_the_field_names():
    from hf_fasttrain.config.recipes import validate_recipe

    sections = validate_recipe({"seq_len_warmup_min": 64, "seq_len_warmup_fraction": "0.25", "packing": "none"})
    assert sections[None] == {"seq_len_warmup_min": 64, "seq_len_warmup_fraction": 0.25, "packing": "none"}
    with pytest.raises(ValueError, match="did you mean 'seq_len_warmup_min'"):
        validate_recipe({"seq_len_warmup_mn": 64})


@pytest.mark.parametrize(
    "schedule",
    [dict(lr_decay="linear"), dict(lr_decay="linear", schedule_unit="tokens")],
    ids=["lr_decay-steps", "lr_decay-tokens"],
)
def test_token_counted_warmup_with_hf_fasttrain_schedules(schedule, tiny_lm, tiny_tokenizer, tmp_path):
    # the same run as above; hf_fasttrain.schedules' linear decay, counted in steps (our token mapping
    # wraps it) or in tokens (its own TokenProgress counts them): the same learning rates either way
    kw = dict(max_tokens=6 * 4 * 32, max_steps=-1, per_device_train_batch_size=4, seq_len_warmup_min=8, seq_len_warmup_fraction=0.5,
              learning_rate=3e-3, **schedule)
    trainer = _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(tmp_path, **kw))
    logs = _train_logs(trainer)
    expected_lr = [3e-3 * (1 - e / 6) for e in (0, 0.25, 0.75, 1.5, 2.5, 3.5, 4.5, 5.5)]
    assert [e["learning_rate"] for e in logs] == pytest.approx(expected_lr, rel=1e-6)


def test_the_wiring_reads_the_plans_length(tiny_lm, tiny_tokenizer, tmp_path):
    """The sequence-length warmup the batches are cut to is the plan's, and so are the tokens and steps a schedule
    counted in tokens spans: a run given in tokens (max_steps -1) and one given in steps."""
    kw = dict(max_tokens=6 * 4 * 32, max_steps=-1, per_device_train_batch_size=4, seq_len_warmup_min=8,
              seq_len_warmup_fraction=0.5)
    trainer = _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(tmp_path / "t", **kw))
    length = trainer.plan.length
    assert trainer.seqlen.cutter.warmup is length.seq_len_warmup and trainer.seqlen.count_tokens
    assert (length.optimizer_steps, length.schedule_steps, length.max_tokens, length.tokens) == (8, 6, 768, 832)
    assert trainer.seqlen.schedule_tokens() == 768
    steps = _fast_trainer(tiny_tokenizer, tiny_lm["train"], tiny_args(
        tmp_path / "s", max_steps=6, per_device_train_batch_size=4, seq_len_warmup_min=8, seq_len_warmup_fraction=0.5))
    assert steps.seqlen.cutter.warmup is steps.plan.length.seq_len_warmup
    assert steps.seqlen.schedule_tokens() == steps.plan.length.tokens == 4 * (8 + 16 + 24 + 3 * 32) == 576
