"""Bad configuration is refused in one place, before any data or model work, naming the field."""

import pytest

from hf_fasttrain.validation import TRAINING_RANGES, ConfigError, check, check_ranges, unknown_name


def test_message_style():
    err = ConfigError("learning_rate", 0.0, "must be a finite number > 0")
    assert str(err) == "learning_rate: got 0.0; must be a finite number > 0"
    assert isinstance(err, ValueError) and (err.field, err.value) == ("learning_rate", 0.0)
    with pytest.raises(ConfigError, match=r"^max_steps: got 'x'; an integer$"):
        check(False, "max_steps", "x", "an integer")
    check(True, "max_steps", "x", "an integer")  # no raise
    assert str(unknown_name("option", "--learnig_rate", ["--learning_rate", "--max_steps"])) == (
        "--learnig_rate: unknown option; did you mean '--learning_rate'?")
    assert str(unknown_name("command", "trian", ["train", "version"])) == "trian: unknown command; did you mean 'train'?"
    assert str(unknown_name("command", "zzz", ["train", "version"])) == "zzz: unknown command; known: train, version"


BAD = [  # (field, value, part of what is allowed)
    ("max_steps", -5, "integer >= 1 (or -1"),
    ("max_steps", 0, "integer >= 1 (or -1"),
    ("learning_rate", 0.0, "finite number > 0"),
    ("learning_rate", -1e-3, "finite number > 0"),
    ("learning_rate", float("nan"), "finite number > 0"),
    ("learning_rate", float("inf"), "finite number > 0"),
    ("save_steps", 0, "integer >= 1"),
    ("per_device_train_batch_size", 0, "integer >= 1"),
    ("per_device_train_batch_size", -2, "integer >= 1"),
    ("gradient_accumulation_steps", 0, "integer >= 1"),
    ("weight_decay", -0.1, ">= 0"),
    ("adam_beta2", 1.0, "[0, 1)"),
    ("warmup_steps", -1, ">= 0"),
    ("eval_steps", 0, "integer >= 1"),
    ("logging_steps", 0, "integer >= 1"),
    ("num_train_epochs", 0.0, "> 0"),
    ("seed", -1, ">= 0"),
]


@pytest.mark.parametrize("field, value, allowed", BAD)
def test_range_table_refuses(field, value, allowed):
    with pytest.raises(ConfigError) as err:
        check_ranges({field: value})
    assert err.value.field == field and allowed in str(err.value)
    assert str(err.value).startswith(f"{field}: got ")


@pytest.mark.parametrize("field, value", [
    ("max_steps", -1), ("max_steps", 1), ("learning_rate", 1e-8), ("save_steps", 500), ("save_steps", 0.25),
    ("eval_steps", None), ("warmup_steps", 0), ("warmup_steps", 0.1), ("save_total_limit", None), ("seed", 0),
])
def test_range_table_accepts(field, value):
    check_ranges({field: value})


@pytest.mark.parametrize("field, value, allowed", BAD)
def test_fast_training_arguments_refuse_before_anything_else(tmp_path, field, value, allowed):
    from hf_fasttrain import FastTrainingArguments

    kw = dict(output_dir=str(tmp_path / "o"), use_cpu=True, report_to="none", optimizer="muon",
              learning_rate=1e-2, max_steps=10)
    kw[field] = value
    with pytest.raises(ConfigError) as err:
        FastTrainingArguments(**kw)
    assert err.value.field == field  # not "Muon: lr", not a crash inside train()
    assert not (tmp_path / "o").exists()


def _recipe(tmp_path, text, name="r.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return str(p)


@pytest.mark.parametrize("text, message", [
    ("max_steps: 0\n", "max_steps: got 0;"),
    ("max_steps: -3\n", "max_steps: got -3;"),
    ("learning_rate: 0\n", "learning_rate: got 0.0;"),
    ("learning_rate: .nan\n", "learning_rate: got nan;"),
    ("save_steps: 0\n", r"save_steps: got 0\.0;"),
    ("per_device_train_batch_size: -1\n", "per_device_train_batch_size: got -1;"),
    ("gradient_accumulation_steps: 0\n", "gradient_accumulation_steps: got 0;"),
    ("learning_rate: 1.0e-3\nmax_steps: 10\nlearning_rate: 2.0e-3\n",
     "learning_rate: written twice in .*r.yaml \\(lines 1 and 3\\); keep one of them"),
    ("model:\n  n_layer: 2\n  n_layer: 3\n", "model.n_layer: written twice"),
])
def test_recipe_values_refused_naming_the_key(tmp_path, text, message):
    from hf_fasttrain.config.recipes import parse_config

    path = _recipe(tmp_path, text + f"output_dir: {tmp_path / 'o'}\n")
    with pytest.raises(ValueError, match=message):
        parse_config(["--config", path])
    assert not (tmp_path / "o").exists()


def test_unknown_flag_gets_the_same_did_you_mean_as_an_unknown_key(tmp_path):
    from hf_fasttrain.config.recipes import parse_config

    with pytest.raises(ConfigError, match=r"^--learnig_rate: unknown option; did you mean '--learning_rate'\?$"):
        parse_config(["--config", "gpt2_tiny", "--learnig_rate", "1e-3"])
    with pytest.raises(ConfigError, match=r"^learnig_rate: unknown recipe key at the top level; did you mean 'learning_rate'\?$"):
        parse_config(["--config", _recipe(tmp_path, "learnig_rate: 1.0e-3\n")])
    # argparse's own errors are one line too, naming the field
    with pytest.raises(ConfigError, match=r"^max_steps: got 'many'; must be an integer$"):
        parse_config(["--config", "gpt2_tiny", "--max_steps", "many"])


# -- the fast path (no torch): the same refusals from the option list read off the sources ----------
def test_preflight_refuses_what_the_full_validation_refuses(tmp_path):
    from hf_fasttrain.config.options import load_schema, preflight

    schema = load_schema()
    assert schema is not None and len(schema) > 150
    assert schema["n_layer"].section == "model" and schema["block_size"].section == "data"
    assert schema["learning_rate"].kind == "float" and schema["max_steps"].kind == "int"
    assert schema["clip_mode"].group == "Stability" and schema["learning_rate"].trainer
    assert preflight(["--config", "gpt2_tiny", "--max_steps", "12", "--no_auto_resume"]) == {
        "max_steps": 12, **{k: v for k, v in preflight(["--config", "gpt2_tiny"]).items() if k != "max_steps"}}
    cases = [
        (["--learnig_rate", "1"], r"--learnig_rate: unknown option; did you mean '--learning_rate'\?"),
        (["--config", "gpt2_tiny", "--max_steps", "0"], r"max_steps: got 0;"),
        (["--config", "gpt2_tiny", "--max_steps", "-2"], r"max_steps: got -2;"),
        (["--learning_rate", "nan"], r"learning_rate: got nan;"),
        (["--max_steps", "many"], r"max_steps: got 'many'; must be an integer$"),
        (["--config", _recipe(tmp_path, "model:\n  n_layers: 2\n", "a.yaml")],
         r"n_layers: unknown recipe key in section 'model:'; did you mean 'n_layer'\?"),
        (["--config", _recipe(tmp_path, "seed: 1\nseed: 2\n", "b.yaml")], r"seed: written twice"),
        (["--config", _recipe(tmp_path, "gradient_accumulation_steps: '0'\n", "c.yaml")], r"gradient_accumulation_steps: got 0;"),
    ]
    for argv, message in cases:
        with pytest.raises(ConfigError, match=message):
            preflight(argv)
    # a prefix is not a flag (the full parser has allow_abbrev=False too): a did-you-mean, never a silent match
    with pytest.raises(ConfigError, match=r"^--max_step: unknown option; did you mean '--max_steps'\?$"):
        preflight(["--max_step", "5"])
    assert preflight(["--max-steps", "6", "--n-layer", "3"])["max_steps"] == 6  # dashes, as HfArgumentParser
    with pytest.raises(ConfigError, match=r"--n_layr: unknown option; did you mean '--n_layer'\?"):
        preflight(["--n-layr", "3"])


def test_every_range_checked_field_exists():
    from hf_fasttrain.config.options import load_schema

    schema = load_schema()
    assert set(TRAINING_RANGES) <= set(schema), set(TRAINING_RANGES) - set(schema)
