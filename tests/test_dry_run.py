"""--dry_run: the resolved options as YAML with each value's source, and nothing written."""

import os
from pathlib import Path

import pytest
import yaml


def _tree(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


@pytest.mark.parametrize("entry", ["recipe script", "hf-fasttrain train"])
def test_dry_run_prints_the_resolved_config_with_sources_and_writes_nothing(entry, tmp_path, capsys, monkeypatch):
    from hf_fasttrain.cli import main, run_recipe
    from hf_fasttrain.config.recipes import parse_config, resolved_config

    monkeypatch.chdir(tmp_path)
    cache = Path(os.environ["HF_FASTTRAIN_CACHE"])
    cache_before = _tree(cache)
    out = tmp_path / "run"
    argv = ["--config", "gpt2_tiny", "--max_steps", "30", "--output_dir", str(out), "--n_embd", "64"]
    if entry == "recipe script":
        assert run_recipe(argv + ["--dry_run"]) == 0
    else:
        assert main(["train", "--dry_run", *argv]) == 0
    text = capsys.readouterr().out
    assert not out.exists() and _tree(tmp_path) == [] and _tree(cache) == cache_before  # nothing written
    printed = yaml.safe_load(text)
    assert printed == resolved_config(*parse_config(argv))  # the values are the resolved config's
    assert printed["max_steps"] == 30 and printed["learning_rate"] == 0.016 and printed["model"]["n_embd"] == 64
    source = {line.split(":")[0].strip(): line.rsplit("# ", 1)[1] for line in text.splitlines()
              if "  # " in line}
    assert source["max_steps"] == "flag" and source["output_dir"] == "flag" and source["n_embd"] == "flag"
    assert source["hidden_size"] == "flag"  # n_embd's other spelling
    assert source["learning_rate"] == "recipe" and source["optimizer"] == "recipe" and source["n_layer"] == "recipe"
    assert source["adam_beta1"] == "default" and source["adam_beta2"] == "recipe"
    assert source["weight_averaging"] == "recipe" and source["dataset"] == "default"
    assert source["dataloader_pin_memory"] == "derived"  # set on CPU when the arguments are built
    assert set(source.values()) <= {"default", "recipe", "flag", "budget_aware", "derived"}


def test_dry_run_applies_budget_aware_as_the_trainer_does(tmp_path, capsys, tiny_lm, tiny_tokenizer):
    """budget_aware's settings in a dry run are the ones FastTrainer applies to the same run, and labelled so."""
    from hf_fasttrain import FastTrainer
    from hf_fasttrain.cli import run_recipe
    from hf_fasttrain.modeling import build_model
    from hf_fasttrain.config.recipes import parse_config

    argv = ["--config", "gpt2_tiny", "--output_dir", str(tmp_path / "run"), "--budget_aware", "true",
            "--optimizer", "adamw", "--learning_rate", "2e-3", "--weight_decay", "0.5", "--max_steps", "40",
            "--block_size", "32"]
    assert run_recipe(argv + ["--dry_run"]) == 0
    text = capsys.readouterr().out
    printed = yaml.safe_load(text)
    source = {line.split(":")[0].strip(): line.rsplit("# ", 1)[1] for line in text.splitlines() if "  # " in line}

    model_args, data_args, args = parse_config(argv)
    model = build_model(model_args, tiny_tokenizer, data_args.block_size)
    trainer = FastTrainer(model=model, args=args, train_dataset=tiny_lm["train"], eval_dataset=tiny_lm["validation"],
                          processing_class=tiny_tokenizer)
    applied = trainer.budget["settings"]
    assert set(applied) == {k for k, v in source.items() if v == "budget_aware"}
    trained = trainer.plan.arguments(trainer.args)  # the values the run trains with and records
    for name in applied:
        assert printed[name] == getattr(trained, name), name
    assert (printed["lr_decay"], trainer.args.lr_decay) == ("linear", "cosine")  # the arguments stay as given
    assert trainer.plan.schedule.decay == "linear"
    assert printed["weight_decay"] != 0.5 and source["learning_rate"] == "flag"  # replaced; the lr stays the user's


def test_dry_run_refuses_as_a_run_does(tmp_path, capsys):
    from hf_fasttrain.cli import run_recipe

    assert run_recipe(["--config", "gpt2_tiny", "--min_lr_ratio", "2", "--output_dir", str(tmp_path / "r"),
                       "--dry_run"]) == 2
    assert capsys.readouterr().err == "error: min_lr_ratio: got 2.0; must be in [0, 1] or null\n"
    assert not (tmp_path / "r").exists()


RECIPE = ["--config", "gpt2_tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--block_size", "32",
          "--vocab_size", "300", "--max_steps", "8", "--warmup_steps", "1", "--report_to", "none"]


def _checkpointed(out, step, argv, **trained_with):
    """An output_dir holding checkpoint-<step> of a run of ``argv`` whose options differed by ``trained_with``."""
    import json

    from hf_fasttrain.resume_identity import write_options
    from hf_fasttrain.callbacks.averaging import AVERAGE_FILE
    from hf_fasttrain.config.recipes import parse_config, resolved_config

    options = resolved_config(*parse_config([*argv, "--output_dir", str(out)]))
    options.update(trained_with)
    ckpt = out / f"checkpoint-{step}"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": step, "max_steps": 8}))
    (ckpt / AVERAGE_FILE).write_bytes(b"")  # gpt2_tiny keeps an EMA in every checkpoint
    write_options(str(ckpt), options)
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("step, trained_with, flags, said", [
    (4, {"learning_rate": 0.01}, [], "holds a run (checkpoint-4) trained with other options: learning_rate 0.01 -> "
                                     "0.016; use a new --output_dir"),
    (8, {}, ["--max_steps", "12"], "holds a run (checkpoint-8) trained with other options: max_steps 8 -> "
                                   "12 (the lr schedule (lr_decay 'cosine') decays over the run's length)"),
])
def test_dry_run_refuses_the_rerun_the_run_refuses(step, trained_with, flags, said, tmp_path, capsys):
    from hf_fasttrain.cli import main, run_recipe

    out = tmp_path / "run"
    before = _checkpointed(out, step, RECIPE, **trained_with)
    argv = [*RECIPE, *flags, "--output_dir", str(out)]
    assert run_recipe([*argv, "--dry_run"]) == 2
    dry = capsys.readouterr()
    assert dry.out == "" and dry.err.count("\n") == 1 and said in dry.err, dry.err
    assert main(["train", *argv]) == 2  # the run itself: the same line
    assert capsys.readouterr().err == dry.err
    assert {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before
    # the same rerun with --overwrite_output_dir: a dry run prints the options and deletes nothing
    assert run_recipe([*argv, "--overwrite_output_dir", "--dry_run"]) == 0
    assert {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == before


def test_dry_run_labels_a_length_replaced_by_the_other_unit_as_derived(tmp_path, capsys):
    from hf_fasttrain.cli import run_recipe

    assert run_recipe(["--config", "gpt2_tiny", "--max_steps", "30", "--output_dir", str(tmp_path / "r"),
                       "--dry_run"]) == 0
    text = capsys.readouterr().out
    source = {line.split(":")[0].strip(): line.rsplit("# ", 1)[1] for line in text.splitlines() if "  # " in line}
    assert yaml.safe_load(text)["max_tokens"] is None  # the recipe's max_tokens gave way to --max_steps
    assert source["max_tokens"] == "derived" and source["max_steps"] == "flag"
    assert run_recipe(["--config", "gpt2_tiny", "--output_dir", str(tmp_path / "r"), "--dry_run"]) == 0
    text = capsys.readouterr().out
    source = {line.split(":")[0].strip(): line.rsplit("# ", 1)[1] for line in text.splitlines() if "  # " in line}
    printed = yaml.safe_load(text)  # the recipe's max_tokens: its optimizer steps, as the run records them
    assert source["max_tokens"] == "recipe" and printed["max_tokens"] == 614400
    assert printed["max_steps"] == 343 and source["max_steps"] == "derived"


def test_dry_run_compares_the_plan_as_the_run_does_and_refuses_another_global_batch(tmp_path, capsys):
    """A checkpoint trained with twice the rows per step (two processes, say) is refused in one line naming the
    plan's field, its old and new value and what is allowed; the same plan resumes."""
    import json

    from hf_fasttrain.resume_identity import PLAN_FILE
    from hf_fasttrain.cli import run_recipe
    from hf_fasttrain.config.recipes import parse_config
    from hf_fasttrain.data.front import run_data
    from hf_fasttrain.run.dry_run import run_plan

    out = tmp_path / "run"
    argv = [*RECIPE, "--output_dir", str(out)]
    _checkpointed(out, 4, RECIPE)
    model_args, data_args, args = parse_config(argv)
    plan = run_plan(model_args, data_args, args, run_data(data_args, model_args, args).plan).as_dict()
    plan = json.loads(json.dumps(plan, default=str))
    batch = plan["length"]["global_batch"]
    assert batch == args.per_device_train_batch_size * args.gradient_accumulation_steps
    (out / "checkpoint-4" / PLAN_FILE).write_text(json.dumps({"plan": plan}))
    assert run_recipe([*argv, "--dry_run"]) == 0  # the same plan: the run resumes
    capsys.readouterr()
    plan["length"]["global_batch"] = 2 * batch
    (out / "checkpoint-4" / PLAN_FILE).write_text(json.dumps({"plan": plan}))
    assert run_recipe([*argv, "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"holds a run (checkpoint-4) trained with other options: plan.length.global_batch {2 * batch} -> {batch} "
        "(the rows per optimizer step (per-device batch x accumulation x processes) are the run's: resume with the "
        "processes, per_device_train_batch_size and gradient_accumulation_steps it was trained with); use a new "
        "--output_dir") in err, err
