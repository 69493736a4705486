"""DataPlan: a run's rows, steps and tokens, worked out once from its arguments at the data's front door."""

from types import SimpleNamespace

import pytest

from hf_fasttrain.data.from_args import DataPlan, planned_optimizer_steps, planned_tokens, schedule_length


@pytest.mark.parametrize(
    "config, row, steps, length, tokens, max_tokens",
    [
        # max_tokens 614,400 = 300 steps of 16 rows x 128 tokens; the warmup's short rows take 43 steps more
        ("gpt2_tiny", 128, 343, 300, 615_296, 614_400),
        ("gpt2_small", 1024, 20_000, 20_000, 655_360_000, None),  # 20,000 steps x 32 rows x 1,024 tokens
        ("llama_tiny", 128, 300, 300, 614_400, None),
        ("sft_tiny", 128, 150, 150, 153_600, None),
    ],
)
def test_the_plan_of_each_bundled_recipe(config, row, steps, length, tokens, max_tokens):
    from hf_fasttrain.config.recipes import parse_config

    _, data_args, training_args = parse_config(["--config", config])
    plan = DataPlan.from_args(data_args, training_args)
    assert (plan.row_length, plan.optimizer_steps, plan.schedule_steps, plan.tokens, plan.max_tokens) == (
        row, steps, length, tokens, max_tokens)
    assert plan.streaming is False
    assert training_args.max_steps == steps  # a token budget's steps are the run's max_steps from here on
    assert (plan.seq_len_warmup is not None) == (training_args.seq_len_warmup_min is not None)


def _args(**kw):
    base = dict(max_steps=6, max_tokens=None, per_device_train_batch_size=1, gradient_accumulation_steps=1,
                seq_len_warmup_min=8, seq_len_warmup_fraction=0.5, seq_len_warmup_multiple=8,
                seq_len_warmup_pacing="linear", seq_len_warmup_stages=4, seq_len_warmup_mode="truncate",
                world_size=1)
    return SimpleNamespace(**{**base, **kw})


# rows of 32 tokens; max_tokens 192 = 6 full-length rows (one row a step)
@pytest.mark.parametrize(
    "overrides, steps, length, tokens",
    [
        ({}, 6, 6, 8 + 16 + 24 + 3 * 32),                                # 6 steps, the first 3 short
        ({"seq_len_warmup_min": None}, 6, 6, 6 * 32),
        ({"max_steps": -1}, None, None, None),                           # by epochs: the Trainer counts
        ({"max_steps": -1, "max_tokens": 192}, 8, 6, 208),               # 8+16+24, then 5 full rows
        ({"max_steps": -1, "max_tokens": 193, "seq_len_warmup_min": None}, 7, 6, 7 * 32),  # a token more: a step
        ({"max_steps": -1, "max_tokens": 384, "per_device_train_batch_size": 2}, 8, 6, 2 * 208),
        ({"max_steps": -1, "max_tokens": 384, "gradient_accumulation_steps": 2}, 8, 6, 8 + 8 + 16 + 16 + 24 + 24
         + 10 * 32),                                                     # 16 micro-batches, 6 of them short
        ({"max_steps": 8, "max_tokens": 192}, 8, 6, 208),                # max_steps beside it: the same number
    ],
)
def test_plan_table_agrees_with_the_pure_functions(overrides, steps, length, tokens):
    args = _args(**overrides)
    expected = (planned_optimizer_steps(args, 32), schedule_length(args, 32), planned_tokens(args, 32))
    plan = DataPlan.from_args(SimpleNamespace(block_size=32, streaming=False), args)
    assert (plan.optimizer_steps, plan.schedule_steps, plan.tokens) == (steps, length, tokens) == expected
    if args.max_tokens is not None:
        assert args.max_steps == steps
    if args.seq_len_warmup_min is not None and length is not None:
        ga = args.gradient_accumulation_steps  # the warmup counts micro-batches: 3 optimizer steps' worth
        assert [plan.seq_len_warmup.seq_len(p) for p in range(0, 4 * ga, ga)] == [8, 16, 24, 32]


def test_plan_refuses_before_any_data_is_read():
    from hf_fasttrain.validation import ConfigError

    rows = SimpleNamespace(block_size=32, streaming=False)
    with pytest.raises(ConfigError) as err:  # the same refusal as resolve_max_steps
        DataPlan.from_args(rows, _args(max_steps=6, max_tokens=192))
    assert str(err.value) == ("max_steps: 6 disagrees with max_tokens 192, which takes 8 optimizer steps here (6 "
                              "full-length steps' tokens, shorter rows first); give one of them: max_steps counts "
                              "optimizer steps, max_tokens tokens (max_tokens null to train max_steps steps)")
    with pytest.raises(ConfigError) as err:  # the warmup's shortest rows longer than the rows themselves
        DataPlan.from_args(rows, _args(seq_len_warmup_min=64))
    assert str(err.value) == ("seq_len_warmup_min: got 64; is above the training length 32 (the length of the "
                              "training rows)")


def test_run_data_hands_down_one_plan(tmp_path):
    from hf_fasttrain.config.recipes import parse_config
    from hf_fasttrain.data.front import run_data
    from hf_fasttrain.run._resume import checkpoint_extras

    model_args, data_args, training_args = parse_config(["--config", "gpt2_tiny", "--output_dir", str(tmp_path)])
    data = run_data(data_args, model_args, training_args)
    assert data.plan == DataPlan.from_args(data.args, training_args)  # the same plan, made once per run_data
    assert data.plan.optimizer_steps == training_args.max_steps == 343
    assert data.tokenizer is None and data.train_set is None  # nothing read yet
    assert checkpoint_extras(training_args, data.plan) == checkpoint_extras(training_args, data.args)
    streamed = DataPlan.from_args(SimpleNamespace(block_size=128, streaming=True), _args())
    assert checkpoint_extras(training_args, streamed)[-1] == "stream_position_rank0.json"
