"""The first minutes of a new user: help, the bare launch, refusals, the run's story and its records."""

import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = str(ROOT / "recipes" / "gpt2_small.py")


# -- help ------------------------------------------------------------------------------------------
def test_short_help_starts_with_the_headline_options_and_shows_every_value():
    from hf_fasttrain.config.options import load_local_recipe, choices, load_schema, render_help

    text = render_help("Pretrain a causal language model.")
    lines = text.splitlines()
    assert lines[0] == "usage: hf-fasttrain train [--config RECIPE] [--<option> VALUE ...]"
    assert lines[1] == "   or: python recipes/gpt2_small.py [--config RECIPE] [--<option> VALUE ...]"
    assert lines[3] == "Pretrain a causal language model."
    assert any(line.lstrip().startswith("--config RECIPE") for line in lines[:8])
    heads = [line for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    assert heads[:6] == ["run length (optimizer steps or tokens):", "optimizer:", "lr schedule:",
                         "batching and sequence length:", "stability: clipping and the guard:", "weight averaging:"]
    assert [line.split()[0] for line in lines if line.startswith("  --max_")][:2] == ["--max_steps", "--max_tokens"]
    assert "--adam_beta1" not in text and "--ddp_backend" not in text  # Trainer options beyond the essentials
    # every option of the package has its own row, each followed by its allowed values in full
    schema = load_schema()
    rows = {line.split()[0]: i for i, line in enumerate(lines) if line.startswith("  --")}
    blocks = _option_blocks(lines)
    for opt in schema.values():
        if not opt.trainer:
            assert f"--{opt.name}" in rows, opt.name
            assert f"--{opt.name}" in blocks and blocks[f"--{opt.name}"][1], opt.name  # its values follow its text
    values = {name: block[1] for name, block in blocks.items() if block[1]}
    assert values["--optimizer"] == "adamw | lion | ademamix | soap | muon | null"
    assert "muon" in choices("optimizer")  # read from the optimizer registry
    assert values["--lr_decay"] == "cosine | sqrt | linear | 1-sqrt | constant | null"
    assert values["--clip_mode"] == "norm | value | agc | none"
    assert values["--divergence_guard"] == "true | false"
    assert values["--learning_rate"] == "a finite number > 0"
    assert values["--ema_decay"] == "a number in (0, 1)"
    assert values["--weight_averaging"] == "none | ema | lawa"
    # the headline options come before the run's and the model's
    assert rows["--max_steps"] < rows["--max_tokens"] < rows["--optimizer"] < rows["--lr_decay"] \
        < rows["--max_tokens_per_batch"] < rows["--divergence_guard"] < rows["--ema_decay"] < rows["--output_dir"] \
        < rows["--n_layer"]
    assert max(len(line) for line in lines) <= 100

    # with a recipe, its values are the defaults shown
    tiny = render_help("d", load_local_recipe("gpt2_tiny"), recipe_name="gpt2_tiny")
    row = {name: block[0] for name, block in _option_blocks(tiny.splitlines()).items()}
    assert row["--optimizer"].endswith("[muon]") and row["--learning_rate"].endswith("[0.016]")
    assert row["--n_layer"].endswith("[2]")  # (the recipe gives its length as max_tokens: max_steps shows -1)
    assert "recipe gpt2_tiny's" in tiny


def _option_blocks(lines):
    """``--name -> (its help text, its values)`` from the short help: a row, its wrapped lines, then ``values:``."""
    blocks, name, text, vals = {}, None, [], None
    for line in [*lines, ""]:
        if line.startswith("  --") or not line.startswith(" " * 34):
            if name is not None:
                blocks[name] = (" ".join(text), vals)
            name, text, vals = (line.split()[0], [line[34:].strip()] if len(line) > 34 else [], None) \
                if line.startswith("  --") else (None, [], None)
        elif line.strip().startswith("values: "):
            vals = line.split("values: ", 1)[1]
        elif name is not None and vals is not None:  # the values wrapped
            vals += " " + line.strip()
        elif name is not None:
            text.append(line.strip())
    return blocks


def test_short_help_shows_each_first_sentence_whole():
    """One row an option: its first sentence whole (wrapped), never cut mid-phrase."""
    from hf_fasttrain.config.options import first_sentence, load_schema, render_help

    text = render_help("Pretrain a causal language model.")
    assert not [ln for ln in text.splitlines() if ln.rstrip().endswith("...")]
    blocks = _option_blocks(text.splitlines())
    for opt in load_schema().values():
        if not opt.trainer and opt.help:
            shown = blocks[f"--{opt.name}"][0]
            assert shown.startswith(" ".join(first_sentence(opt.help).split())), opt.name
            opened, closed = (sum(shown.count(c) for c in cs) for cs in ("([{", ")]}"))
            assert opened == closed, opt.name  # nothing cut inside brackets ("in (0, 1]" is one pair)
    assert blocks["--vocab_size"][0].startswith("Vocabulary size of the trained BPE tokenizer (no tokenizer given), "
                                                "an integer >= 260")


def test_every_option_of_every_command_has_help():
    import argparse

    from hf_fasttrain.cli import _push_parser, _recipes_parser, _tokenize_parser
    from hf_fasttrain.config.recipes import make_parser
    from hf_fasttrain.run.generate import make_parser as generate_parser

    parsers = {"train": make_parser(), "tokenize": _tokenize_parser(), "push-recipe": _push_parser(),
               "recipes": _recipes_parser(), "generate": generate_parser()}
    ours = {f.name for cls in _package_classes() for f in __import__("dataclasses").fields(cls)}
    for command, parser in parsers.items():
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if command == "train" and action.dest not in ours and action.dest != "config":
                continue  # a Trainer option: its help is transformers'
            assert action.help and action.help.strip(), f"{command} {action.option_strings or action.dest}"


def _package_classes():
    from hf_fasttrain.config.args import DataArguments, FastTrainingArguments, ModelArguments

    return (ModelArguments, DataArguments, FastTrainingArguments)


def test_both_entry_points_print_one_help_text():
    """recipes/gpt2_small.py --help and hf-fasttrain train --help: the same text, byte for byte (with and without a
    recipe); and no measured figure in it (those are in the benchmarks' data and the docs)."""
    import re

    texts = []
    for argv in ([sys.executable, SCRIPT], [sys.executable, "-m", "hf_fasttrain.cli", "train"]):
        for extra in (["--help"], ["--help", "--config", "gpt2_tiny"]):
            out = subprocess.run(argv + extra, capture_output=True, text=True, timeout=120,
                                 env={**os.environ, "PYTHONPATH": str(ROOT)})
            assert out.returncode == 0, out.stderr
            texts.append(out.stdout)
    assert texts[0] == texts[2] and texts[1] == texts[3] and texts[0] != texts[1]
    assert "values: adamw | lion | ademamix | soap | muon | null" in texts[0]
    assert not re.search(r"\b\d+\.\d+ tokens per parameter|\d\.\d+x ", texts[0])


def test_help_refusals_and_recipes_list_import_no_torch():
    """One subprocess: --help, a refusal and `recipes list` run without importing torch or transformers
    (how long they take is benchmarks/startup.py's figure, not a test's)."""
    code = (
        "import sys\n"
        "from hf_fasttrain.cli import main, run_recipe\n"
        "assert run_recipe(['--help']) == 0\n"
        "assert run_recipe(['--config', 'gpt2_tiny', '--learnig_rate', '1e-3']) == 2\n"
        "assert run_recipe(['--config', 'gpt2_tiny', '--max_steps', '0']) == 2\n"
        "assert main(['recipes', 'list']) == 0\n"
        "print('HEAVY', sorted(m for m in ('torch', 'transformers', 'datasets') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert "HEAVY []" in out.stdout
    errors = out.stderr.strip().splitlines()
    assert errors == [
        "error: --learnig_rate: unknown option; did you mean '--learning_rate'?",
        "error: max_steps: got 0; must be an integer >= 1 (or -1, the default, to train for num_train_epochs)",
    ]
    assert "gpt2_tiny" in out.stdout and "usage: hf-fasttrain train [--config RECIPE]" in out.stdout


def test_recipes_list_ends_with_a_command_an_installed_wheel_has(capsys):
    """`recipes list` says how to run a recipe with the console command (a wheel has no recipes/ folder), and
    that command takes the bundled name: `hf-fasttrain train --config gpt2_tiny --help` shows its values."""
    from hf_fasttrain.cli import main

    assert main(["recipes", "list"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "Run one with: hf-fasttrain train --config <name>  (or a path, or hf://<owner>/<repo>)"
    command = last.removeprefix("Run one with: ").split("  (")[0].split()
    assert command[0] == "hf-fasttrain" and not any("recipes/" in word for word in command)
    argv = [("gpt2_tiny" if word == "<name>" else word) for word in command[1:]] + ["--help"]
    assert main(argv) == 0
    assert "Values in [brackets] are recipe gpt2_tiny's." in capsys.readouterr().out


@pytest.mark.e2e
def test_refusal_from_the_full_validation_is_one_line_and_exit_2():
    """A refusal that needs the Trainer's own checks (warmup longer than the run): still one line, status 2;
    --debug shows the traceback."""
    argv = [sys.executable, SCRIPT, "--config", "gpt2_tiny", "--max_steps", "5", "--warmup_steps", "20",
            "--output_dir", "/nonexistent/x"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith("error: warmup_steps: got 20")
    assert "from the recipe" not in out.stderr  # the user's own flag
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) <= 2
    debug = subprocess.run(argv + ["--debug"], capture_output=True, text=True, timeout=300)
    assert debug.returncode == 1 and "Traceback" in debug.stderr


# -- the command line's mistakes: one line, exit 2, before any data work -----------------------------------------
def test_a_prefix_of_a_flag_is_refused_with_a_suggestion(capsys):
    from hf_fasttrain.cli import _push_parser, run_recipe
    from hf_fasttrain.config.recipes import make_parser, parse_config

    assert run_recipe(["--config", "gpt2_tiny", "--max_step", "30"]) == 2
    assert capsys.readouterr().err == "error: --max_step: unknown option; did you mean '--max_steps'?\n"
    with pytest.raises(ValueError, match=r"--max_step: unknown option; did you mean '--max_steps'"):
        parse_config(["--config", "gpt2_tiny", "--max_step", "30"])  # the API path too, not only the preflight
    assert make_parser().allow_abbrev is False and _push_parser().allow_abbrev is False


def test_a_misplaced_recipe_key_names_its_section(tmp_path, capsys):
    from hf_fasttrain.cli import run_recipe
    from hf_fasttrain.config.recipes import validate_recipe

    for text, expected in (
        ("model:\n  block_size: 64\n",
         "block_size: unknown recipe key in section 'model:'; 'block_size' belongs in the data: section"),
        ("n_layer: 2\n", "n_layer: unknown recipe key at the top level; 'n_layer' belongs in the model: section"),
        ("data:\n  max_steps: 3\n", "max_steps: unknown recipe key in section 'data:'; 'max_steps' belongs at the top level"),
    ):
        recipe = tmp_path / "r.yaml"
        recipe.write_text(text)
        assert run_recipe(["--config", str(recipe)]) == 2  # the preflight (before torch)
        assert capsys.readouterr().err == f"error: {expected}\n"
        with pytest.raises(ValueError) as err:  # the full validation says the same
            validate_recipe(yaml.safe_load(text))
        assert str(err.value) == expected


def test_none_switches_an_optional_option_off_and_help_says_so(tmp_path, capsys):
    from hf_fasttrain.cli import run_recipe
    from hf_fasttrain.config.recipes import NULL_HELP, make_parser, parse_config, validate_recipe

    for word in ("none", "None", "null", "NULL"):
        args = parse_config(["--config", "gpt2_tiny", "--seq_len_warmup_min", word, "--min_lr_ratio", word])[2]
        assert args.seq_len_warmup_min is None and args.min_lr_ratio is None, word
    assert validate_recipe({"seq_len_warmup_min": "None", "data": {"max_train_samples": "none"}}) == {
        None: {"seq_len_warmup_min": None}, "model": {}, "data": {"max_train_samples": None}}
    with pytest.raises(ValueError, match="max_steps"):  # not optional: a word is no number
        validate_recipe({"max_steps": "none"})
    helps = {a.dest: a.help for a in make_parser()._actions}
    assert helps["seq_len_warmup_min"].endswith(NULL_HELP) and NULL_HELP not in helps["max_steps"]
    assert run_recipe(["--help"]) == 0
    assert "switched off with none, None or null, e.g. --seq_len_warmup_min none" in " ".join(capsys.readouterr().out.split())


def test_bundled_recipes_give_warmup_as_a_fraction_so_any_max_steps_works():
    from hf_fasttrain.config.recipes import bundled_recipes, load_recipe, parse_config

    for name in bundled_recipes():
        assert 0 < load_recipe(name)["warmup_steps"] < 1, name
    args = parse_config(["--config", "gpt2_tiny", "--max_steps", "5"])[2]  # was refused: warmup 20 > 5 steps
    assert args.max_steps == 5 and args.get_warmup_steps(5) == 1 and args.get_warmup_steps(300) == 20


def test_a_refused_recipe_value_says_it_came_from_the_recipe(tmp_path, capsys):
    from hf_fasttrain.cli import recipe_origin, run_recipe

    recipe = tmp_path / "mine.yaml"
    recipe.write_text("warmup_steps: 20\nlr_decay: cosine\nuse_cpu: true\nreport_to: none\nmodel:\n  n_layer: 2\n")
    argv = ["--config", str(recipe), "--max_steps", "5", "--output_dir", str(tmp_path / "o")]
    assert run_recipe(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: warmup_steps: got 20") and err.count("\n") == 1
    assert err.rstrip().endswith(f"(warmup_steps: 20 is from the recipe {recipe}; override it with --warmup_steps <value>)")
    # the user's own value, or a field the recipe does not set: the message is left alone
    assert recipe_origin("warmup_steps=20 is long", [*argv, "--warmup_steps", "20"]) == "warmup_steps=20 is long"
    assert recipe_origin("max_steps: got 0; ...", argv) == "max_steps: got 0; ..."
    assert recipe_origin("model.n_layer: got 'x'; must be an integer", argv).endswith(
        "(n_layer: 2 is from the recipe " + str(recipe) + "; override it with --n_layer <value>)")


@pytest.mark.parametrize("case", ["under_a_file", "a_file", "read_only", "not_writable"])
def test_output_dir_mistakes_are_one_line_and_exit_2(case, tmp_path, capsys, monkeypatch):
    import errno
    import tempfile

    from hf_fasttrain import cli
    from hf_fasttrain.data import corpus

    monkeypatch.setattr(corpus, "load_text_datasets", lambda *a, **k: pytest.fail("data work before the check"))
    note = tmp_path / "notes.txt"
    note.write_text("x")
    out = {"under_a_file": note / "run", "a_file": note}.get(case, tmp_path / "run")
    if case in ("read_only", "not_writable"):
        code = errno.EROFS if case == "read_only" else errno.EACCES

        def refuse(*a, **k):
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(tempfile, "mkstemp", refuse)
    assert cli.run_recipe(["--config", "gpt2_tiny", "--output_dir", str(out)]) == 2
    err = capsys.readouterr().err
    expected = {"under_a_file": f"{out} is under the file {note}", "a_file": f"{out} is a file, not a folder",
                "read_only": f"{out} is on a read-only file system",
                "not_writable": f"{out} is not writable (permission denied)"}[case]
    assert err == f"error: output_dir: {expected}; give a folder path (new or existing) that you can write to\n"


def test_unknown_command_and_debug_switch(capsys, monkeypatch):
    from hf_fasttrain import cli

    assert cli.main(["trian"]) == 2
    assert capsys.readouterr().err == "error: trian: unknown command; did you mean 'train'?\n"
    assert cli._debug(["--debug", "--max_steps", "3"]) == (True, ["--max_steps", "3"])
    monkeypatch.setenv("HF_FASTTRAIN_DEBUG", "1")
    assert cli._debug(["--max_steps", "3"]) == (True, ["--max_steps", "3"])
    monkeypatch.setenv("HF_FASTTRAIN_DEBUG", "0")
    assert cli._debug(["--max_steps", "3"]) == (False, ["--max_steps", "3"])
    with pytest.raises(ValueError):  # --debug: the refusal is raised, with its traceback
        cli.run_recipe(["--config", "gpt2_tiny", "--max_steps", "0", "--debug"])


# -- the bare launch -------------------------------------------------------------------------------
@pytest.mark.parametrize("cuda, recipe", [(False, "gpt2_tiny"), (True, "gpt2_small")])
def test_bare_launch_picks_a_recipe_for_the_machine_and_says_so(monkeypatch, capsys, cuda, recipe):
    import torch

    from hf_fasttrain.cli import with_default_recipe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    assert with_default_recipe(["--max_steps", "7"]) == ["--config", recipe, "--max_steps", "7"]
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"training the {recipe} recipe" in err[0] and "--config" in err[0]
    assert ("no GPU found" in err[0]) == (not cuda)
    assert with_default_recipe(["--config", "x.yaml"]) == ["--config", "x.yaml"]  # a choice is kept, silently
    assert capsys.readouterr().err == ""


def test_a_run_always_has_its_own_folder(tmp_path):
    from hf_fasttrain.config.recipes import parse_config

    for name in ("gpt2_tiny", "gpt2_small"):  # the bundled recipes name theirs
        assert parse_config(["--config", name, "--use_cpu", "true"])[2].output_dir == f"runs/{name}"
    p = tmp_path / "my_recipe.yaml"
    p.write_text("max_steps: 10\n")  # no output_dir: runs/<recipe name>, never trainer_output
    assert parse_config(["--config", str(p)])[2].output_dir == "runs/my_recipe"
    assert parse_config(["--config", str(p), "--output_dir", "o"])[2].output_dir == "o"


# -- the run's story (pure) -------------------------------------------------------------------------
def test_log_lines_print_numbers_as_numbers():
    from hf_fasttrain.callbacks.progress import format_log, format_number

    assert format_log({"loss": 5.00812, "grad_norm": 0.9123, "learning_rate": 0.016, "tokens_per_second": 12345.6,
                       "train_seconds": 8.21, "padding_fraction": 0.0, "epoch": 0.5, "guard_rollbacks": 0},
                      step=40, max_steps=300) == \
        "step 40/300  loss 5.008  lr 0.016  grad_norm 0.912  tokens/s 12,346  train 8.2 s"
    assert format_log({"loss": 3.0, "guard_rollbacks": 1}, step=2) == "step 2  loss 3  guard_rollbacks 1"
    assert format_log({"eval_loss": 4.2131, "eval_perplexity": 67.56, "eval_runtime": 3.1, "epoch": 1.0},
                      step=100) == "eval at step 100:  loss 4.213  perplexity 67.56"
    assert format_log({"train_runtime": 10.0, "train_loss": 4.0}, step=300) is None
    assert [format_number(v) for v in (3, 12345678, 0.000123456, 54321.2, float("nan"), "x")] == \
        ["3", "12,345,678", "0.0001235", "54,321", "nan", "x"]


def test_start_line_and_end_summary():
    from hf_fasttrain.run._console import end_summary, start_line

    facts = {"parameters": 539648, "world_size": 2, "global_batch": 32, "tokens_per_step": 4096, "max_steps": 300,
             "device": "cuda:0 (NVIDIA H200)", "precision": "bf16"}
    assert start_line("gpt2_tiny", facts, "runs/gpt2_tiny") == (
        "gpt2_tiny: 540k parameters; 4,096 tokens/step (32 rows x 128 tokens over 2 processes); 300 steps "
        "(1.23M tokens); cuda:0 (NVIDIA H200), bf16; output runs/gpt2_tiny")
    # with a sequence-length warmup: the tokens the steps hold; with a token budget, the steps it takes
    tiny = {**facts, "world_size": 1, "global_batch": 16, "tokens_per_step": 2048, "device": "cpu", "precision": "fp32"}
    assert start_line("t", {**tiny, "max_steps": 200, "tokens": 351232}, "o") == (
        "t: 540k parameters; 2,048 tokens/step (16 rows x 128 tokens); 200 steps (351k tokens, shorter rows first); "
        "cpu, fp32; output o")
    assert start_line("t", {**tiny, "max_steps": 343, "tokens": 615296, "max_tokens": 614400}, "o") == (
        "t: 540k parameters; 2,048 tokens/step (16 rows x 128 tokens); max_tokens 614,400 in 343 steps (615k tokens, "
        "shorter rows first); cpu, fp32; output o")
    summary = {"initial_eval_loss": 8.2812, "final_eval_loss": 3.9712, "train_seconds": 53.24,
               "history": [{"eval_loss": 8.2812, "step": 0}, {"loss": 5.0, "tokens_per_second": 11000.0},
                           {"loss": 4.0, "tokens_per_second": 12000.0}, {"eval_loss": 3.9712, "step": 300}]}
    lines = end_summary(summary, "runs/t", steps=300).splitlines()
    assert lines[0] == (f"done: eval loss 8.281 -> 3.971 (perplexity {math.exp(3.9712):.4g}); 300 steps in 53.2 s "
                        f"of training, 11,500 tokens/s")
    assert "; 343 steps (615k tokens) in 53.2 s" in end_summary(summary, "runs/t", steps=343, tokens=615296)
    assert lines[1:3] == ["  metrics    runs/t/metrics.json", "  loss curve runs/t/loss_curve.png"]
    assert lines[3].startswith("  model      runs/t")


def test_each_eval_once():
    from hf_fasttrain.run.train import _tidy_records

    recs = [{"eval_loss": 8.0, "step": 0}, {"loss": 5.0, "step": 5}, {"eval_loss": 4.0, "step": 10},
            {"eval_loss": 4.0, "eval_runtime": 1.0, "step": 10}]
    out = _tidy_records(recs)
    assert [(r["step"], "eval_loss" in r) for r in out] == [(0, True), (5, False), (10, True)]
    assert out[2]["eval_runtime"] == 1.0  # the final evaluate's copy is kept
    assert out[0] == recs[0] and out[1] == recs[1]  # the records as logged: nothing added to them


def test_only_harmless_warnings_are_silenced():
    from conftest import make_tiny_gpt2

    from hf_fasttrain.run.train import _TiedKeysFilter, _quiet_known_warnings, _tied_parameter_names

    model = make_tiny_gpt2(100)
    assert _tied_parameter_names(model) == {"lm_head.weight"}
    f = _TiedKeysFilter({"lm_head.weight"})

    def passes(msg):
        return f.filter(logging.LogRecord("transformers.trainer", logging.WARNING, "", 0, msg, None, None))

    assert not passes("There were missing keys in the checkpoint model loaded: ['lm_head.weight'].")
    assert passes("There were missing keys in the checkpoint model loaded: ['lm_head.weight', 'transformer.h.0.attn.c_attn.weight'].")
    assert passes("There were unexpected keys in the checkpoint model loaded: ['x'].")
    assert model.loss_type is None
    _quiet_known_warnings(model)
    assert model.loss_type == "ForCausalLM"  # what transformers falls back to, said up front: same loss
    ids = __import__("torch").randint(0, 100, (2, 8))
    assert model(input_ids=ids, labels=ids).loss.isfinite()


# -- records without contradictions -------------------------------------------------------------------
def test_config_record_keeps_only_what_the_run_used(tmp_path):
    from hf_fasttrain import FastTrainingArguments
    from hf_fasttrain.runinfo import overridden_fields, run_facts, training_config, write_run_record

    args = FastTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", optimizer="muon",
                                 learning_rate=1e-2, lr_decay="cosine", max_steps=300)
    assert overridden_fields(args) == ("optim", "optim_args", "lr_scheduler_type", "lr_scheduler_kwargs",
                                       "num_train_epochs")
    cfg = training_config(args)
    assert not set(overridden_fields(args)) & set(cfg)
    assert (cfg["optimizer"], cfg["lr_decay"], cfg["max_steps"]) == ("muon", "cosine", 300)
    plain = training_config(FastTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none"))
    assert {"optim", "lr_scheduler_type", "num_train_epochs"} <= set(plain)  # the Trainer's, in charge

    from conftest import make_tiny_gpt2

    facts = run_facts(make_tiny_gpt2(100), args, block_size=128)
    n = sum(p.numel() for p in make_tiny_gpt2(100).parameters())
    assert facts == {"parameters": n, "trainable_parameters": n, "world_size": 1,
                     "global_batch": 8, "tokens_per_step": 1024, "max_steps": 300, "device": "cpu",
                     "precision": "fp32"}
    write_run_record(tmp_path, cfg, run=facts)
    text = (tmp_path / "config.yaml").read_text()
    assert text.startswith("# The resolved config of this run")
    assert "Effective optimizer: muon" in text and "Stops at: max_steps 300" in text
    assert yaml.safe_load(text)["optimizer"] == "muon"
    info = json.loads((tmp_path / "run_info.json").read_text())
    assert (info["world_size"], info["global_batch"], info["tokens_per_step"], info["device"], info["precision"]) == \
        (1, 8, 1024, "cpu", "fp32")


# -- rerun and resume --------------------------------------------------------------------------------
TINY_RUN = ["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300", "--block_size", "32",
            "--n_layer", "2", "--n_embd", "32", "--n_head", "2", "--per_device_train_batch_size", "8",
            "--max_eval_samples", "32", "--logging_steps", "2", "--disable_tqdm", "true", "--warmup_steps", "1",
            "--max_steps", "4", "--save_steps", "2", "--eval_steps", "2", "--save_total_limit", "3"]


def _fingerprint(out: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(out.rglob("*"))
            if p.is_file()}


@pytest.mark.slow
def test_rerun_of_a_finished_run_is_a_noop_and_resumes_say_so(tmp_path, caplog, capsys):
    from hf_fasttrain.run import train as run
    from hf_fasttrain.data.from_args import planned_optimizer_steps
    from hf_fasttrain.config.recipes import parse_config

    out = tmp_path / "run"
    argv = [*TINY_RUN, "--output_dir", str(out)]
    caplog.set_level(logging.INFO, logger="hf_fasttrain")
    # max_steps is the number of optimizer steps, with gpt2_tiny's sequence-length warmup on (rows of 16 tokens at
    # step 1, then 32); its max_tokens (dropped by --max_steps) would have taken 5 steps for 4 full-length ones
    assert [planned_optimizer_steps(parse_config([*argv, "--max_steps", str(n)])[2], 32) for n in (4, 6)] == [4, 6]
    assert planned_optimizer_steps(parse_config([*argv, "--max_tokens", str(4 * 8 * 32)])[2], 32) == 5
    first = run.train(*parse_config(argv))
    assert f"no complete checkpoint in {out}: starting from scratch" in caplog.text
    assert "4 steps (" in caplog.text and "tokens, shorter rows first)" in caplog.text  # the start line
    metrics = json.loads((out / "metrics.json").read_text())
    evals = [h for h in metrics["history"] if "eval_loss" in h]
    assert [h["step"] for h in evals] == [0, 2, 4] and all("eval_perplexity" in h for h in evals)
    printed = capsys.readouterr().out  # disable_tqdm: one line per log, numbers as numbers
    assert "step 2/4  loss " in printed and "eval at step 4:  loss " in printed and "'loss'" not in printed
    assert "\ndone: eval loss " in printed  # the summary on stdout, after the step lines

    # the same command again: nothing trains, nothing is written, the recorded final metrics come back
    before = _fingerprint(out)
    caplog.clear()
    capsys.readouterr()
    again = run.train(*parse_config(argv))
    assert again == json.loads(json.dumps(first))
    assert _fingerprint(out) == before
    assert not (out / "checkpoint-5").exists()
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[hf_fasttrain] ")]
    assert len(said) == 1 and said[0].startswith(  # on the console, whatever the logging setup
        f"[hf_fasttrain] run is complete: {out / 'checkpoint-4'} reached step 4, the run's last; nothing to train "
        "(max_steps 4;")

    # killed after its last checkpoint, before the final save: finished from checkpoint-4, no step 5
    (out / "metrics.json").unlink()
    (out / "model.safetensors").unlink()
    caplog.clear()
    finished = run.train(*parse_config(argv))
    assert finished["eval_loss"] == pytest.approx(first["eval_loss"], abs=1e-6)
    assert "writing the final model and evaluation without training" in caplog.text
    assert json.loads((out / "trainer_state.json").read_text() if (out / "trainer_state.json").exists()
                      else (out / "checkpoint-4" / "trainer_state.json").read_text())["global_step"] == 4
    assert not (out / "checkpoint-5").exists()

    # a longer run into the same folder: gpt2_tiny's cosine spans max_steps, so it is another run: refused
    from hf_fasttrain.resume_identity import RunOptionsChanged

    before = _fingerprint(out)
    with pytest.raises(RunOptionsChanged, match=r"max_steps 4 -> 6 \(the lr schedule \(lr_decay 'cosine'\) decays"):
        run.train(*parse_config([*argv, "--max_steps", "6"]))
    assert _fingerprint(out) == before

    # stopped at checkpoint-2: the same command resumes, and says from where; the tied lm_head raises no warning
    import shutil

    shutil.rmtree(out / "checkpoint-4")
    (out / "metrics.json").unlink()
    caplog.clear()
    seen: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: seen.append(record.getMessage())
    hf_loggers = [logging.getLogger(n) for n in ("transformers.trainer", "transformers.modeling_utils")]
    for lg in hf_loggers:
        lg.addHandler(handler)
    capsys.readouterr()
    try:  # with a new eval and save cadence, which the resumed run keeps to (the checkpoint's state has the old)
        run.train(*parse_config([*argv, "--eval_steps", "1", "--save_steps", "1"]))
    finally:
        for lg in hf_loggers:
            lg.removeHandler(handler)
    said = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("[hf_fasttrain] resuming")]
    assert said == [f"[hf_fasttrain] resuming run from {out / 'checkpoint-2'}; applying eval_steps 2 -> 1, "
                    "save_steps 2 -> 1"]  # once: the recipe's decision, said by FastTrainer
    assert not [m for m in seen if "missing keys" in m or "loss_type" in m], seen
    assert (out / "checkpoint-3").exists() and (out / "checkpoint-4").exists() and not (out / "checkpoint-5").exists()
    evals = [h["step"] for h in json.loads((out / "metrics.json").read_text())["history"] if "eval_loss" in h]
    assert evals == [0, 2, 3, 4]


def test_ctrl_c_outside_the_training_loop_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    from hf_fasttrain import cli
    from hf_fasttrain.run import train as run

    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(run, "train", interrupted)
    assert cli.run_recipe(["--config", "gpt2_tiny", "--output_dir", str(tmp_path)]) == 130
    assert capsys.readouterr().err == ("interrupted: exiting without saving; rerun the same command to resume from "
                                       "the last checkpoint\n")


def test_a_finished_recipe_run_ends_its_process_group(tmp_path, monkeypatch):
    # a launched run's gloo threads must stop before the interpreter does (else a rank can abort at exit)
    import torch.distributed as dist

    from hf_fasttrain import cli
    from hf_fasttrain.run import train as run

    def fake_train(*args, **kwargs):  # what accelerate does at the start of a launched run
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)

    monkeypatch.setattr(run, "train", fake_train)
    assert cli.run_recipe(["--config", "gpt2_tiny", "--output_dir", str(tmp_path / "out")]) == 0
    assert not dist.is_initialized()
    cli._close_process_group()  # and without one: nothing to do


# -- one error style: `error: <field>: <what is wrong>; <what is allowed>` ----------------------------------------
ONE_STYLE = re.compile(r"^error: [\w.-]+: [^\n]+; [^\n]+\n$")
ERROR_CASES = [
    (["--lr", "1e-3"], "--lr: unknown option; did you mean '--learning_rate'?"),
    (["--bs", "8"], "--bs: unknown option; did you mean '--per_device_train_batch_size'?"),
    (["--learnig_rate", "1e-3"], "--learnig_rate: unknown option; did you mean '--learning_rate'?"),
    (["--optimizer", "adamx"], "optimizer: got 'adamx'; allowed: adamw, lion, ademamix, soap, muon (did you mean 'adamw'?)"),
    (["--lr_decay", "cosin"], "lr_decay: got 'cosin'; allowed: cosine, sqrt, linear, 1-sqrt, constant"),
    (["--clip_mode", "nrm"], "clip_mode: got 'nrm'; allowed: norm, value, agc, none"),
    (["--packing", "flat"], "packing: got 'flat'; allowed: none, flatten, rows"),
    (["--weight_averaging", "emma"], "weight_averaging: got 'emma'; allowed: none, ema, lawa"),
    (["--precision", "bf32"], "precision: got 'bf32'; allowed: auto, bf16, fp16, fp32"),
    (["--ema_decay", "1.5"], "ema_decay: got 1.5; must be in (0, 1), e.g. 0.99"),
    (["--min_lr_ratio", "2"], "min_lr_ratio: got 2.0; must be in [0, 1] or null"),
    (["--n_layer", "x"], "n_layer: got 'x'; must be an integer"),
    (["--eval_strategy", "sometimes"], "eval_strategy: got 'sometimes'; allowed: no, steps, epoch"),
    (["--max_steps"], "max_steps: has no value; give --max_steps <value>"),
    (["--max_steps", "5", "--warmup_steps", "20"],
     "warmup_steps: got 20.0 (20 steps), longer than training (5 steps); must be at most 5 steps, or a fraction < 1 "
     "of the run"),
    (["--restart_direction", "up"], "restart_direction: got 'up'; allowed: min, max"),
    (["--learning_rate", "abc"], "learning_rate: got 'abc'; must be a number"),
    (["--precision", "fp32", "--bf16", "true"],
     "precision: got 'fp32', which contradicts bf16=True; set one of them only (precision: auto, bf16, fp16, fp32)"),
    (["--n_layer", "3", "--num_hidden_layers", "4"],
     "n_layer: got 3, but num_hidden_layers got 4; they are the same setting: give one of n_layer, num_hidden_layers"),
    (["--seq_len_warmup_pacing", "cubic"], "seq_len_warmup_pacing: got 'cubic'; allowed: linear, sqrt, steps"),
    # an optimizer's own option is named as it is given: through optimizer_kwargs
    (["--optimizer_kwargs", '{"adjust_lr_fn": "rms"}'],
     "optimizer_kwargs.adjust_lr_fn: got 'rms' for Muon; allowed: match_rms_adamw, original, spectral"),
    (["--optimizer_kwargs", '{"ns_steps": 0}'], "optimizer_kwargs.ns_steps: got 0 for Muon; must be an integer in [1, 99]"),
    (["--optimizer", "lion", "--optimizer_kwargs", '{"betas": [0.9, 2]}'],
     "optimizer_kwargs.betas: got [0.9, 2] for Lion; must be a list of 2 numbers in [0, 1)"),
    (["--optimizer", "adamw", "--optimizer_kwargs", '{"cautious": true, "fused": true}'],
     "optimizer_kwargs.fused: got True with cautious=True, which has no fused kernel; leave fused unset or false"),
    (["--optimizer", "soap", "--optimizer_kwargs", '{"skinny_ratio": 0.5}'],
     "optimizer_kwargs.skinny_ratio: got 0.5 for SOAP; must be a finite number >= 1 or null (off)"),
    (["--seq_len_warmup_mode", "crop"], "seq_len_warmup_mode: got 'crop'; allowed: truncate, rechunk"),
    # a bad name is refused even while its technique is off (gpt2_tiny has no curriculum, no batch warmup)
    (["--curriculum_pacing", "fast"], "curriculum_pacing: got 'fast'; allowed: linear, sqrt, steps"),
    (["--batch_warmup_fraction", "2"],
     "batch_warmup_fraction: got 2.0; must be in [0, 1] (the share of max_steps over which the batch grows)"),
]


@pytest.mark.parametrize("flags, expected", ERROR_CASES, ids=[" ".join(f) for f, _ in ERROR_CASES])
def test_every_refusal_has_one_style_and_close_suggestions_only(flags, expected, tmp_path, capsys):
    from hf_fasttrain.cli import run_recipe

    out = tmp_path / "run"
    assert run_recipe(["--config", "gpt2_tiny", "--output_dir", str(out), *flags, "--dry_run"]) == 2
    err = capsys.readouterr().err
    assert err == f"error: {expected}\n"
    assert ONE_STYLE.match(err), err
    assert not out.exists()


@pytest.mark.slow
def test_random_restart_settings_checked_by_the_search_name_the_option(tmp_path, capsys):
    """The metric and the rungs are checked when the search is set up (the metric against what the runner
    reports): still before any trial, and named as the restart_* option, not as RestartConfig's field."""
    from hf_fasttrain.cli import run_recipe

    base = ["--config", "gpt2_tiny", "--max_steps", "8", "--restart_num_seeds", "4"]
    assert run_recipe([*base, "--output_dir", str(tmp_path / "a"), "--restart_metric", "accuracy"]) == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: restart_metric: got 'eval_accuracy'; allowed: eval_loss, eval_next_token_accuracy, eval_perplexity "
        "(what this runner reports)")
    assert run_recipe([*base, "--output_dir", str(tmp_path / "b"), "--restart_rungs", "9"]) == 2
    line = capsys.readouterr().err.splitlines()[-1]
    assert line.startswith("error: restart_rungs: got 9, which with restart_explore_fraction=0.1 and "
                           "restart_keep_fraction=0.5 cuts the ") and line.endswith(
        "steps at 1, 1, 1, 1, 1, 1, 1, 1, 1; they must strictly increase: lower restart_rungs, raise "
        "restart_explore_fraction or train longer")
    assert ONE_STYLE.match(line + "\n"), line
    assert not any(p.name.startswith("trial") for p in (tmp_path / "b").rglob("*"))


def test_the_other_commands_refuse_in_the_same_style(tmp_path, capsys):
    from hf_fasttrain.cli import main
    from hf_fasttrain.config.recipes import bundled_recipes

    for argv, expected in [
        (["recipes", "lst"], "action: got 'lst'; allowed: list"),
        (["tokenize", "--dataset", "x", "--out", str(tmp_path / "t"), "--block_size", "q"],
         "block_size: got 'q'; must be an integer"),
        (["train", "--config", "nope", "--dry_run"],
         f"config: got 'nope', which is neither a file, a bundled recipe nor a hf:// URI; allowed: a YAML path, a "
         f"bundled name ({', '.join(sorted(bundled_recipes()))}) or hf://<owner>/<repo>"),
        (["generate", "--model", str(tmp_path / "none")],
         f"model: {tmp_path / 'none'} does not exist; give a run's output_dir or one of its checkpoint-<step> folders"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err == f"error: {expected}\n", argv
        assert ONE_STYLE.match(err), err



# -- refusals decided from the arguments and the model config: before any data, and nothing left behind ------------
def _tiny_base(path: Path) -> str:
    from conftest import make_tiny_gpt2

    make_tiny_gpt2(300, n_positions=32).save_pretrained(str(path))
    return str(path)


@pytest.mark.parametrize("case", ["missing tokenizer", "n_positions", "base positions", "vocab_size"])
def test_argument_refusals_come_before_any_data_and_leave_no_folder(case, tmp_path, capsys, monkeypatch):
    from hf_fasttrain.cli import main
    from hf_fasttrain.data import front

    def no_data(self):
        raise AssertionError("the data was read before the refusal")

    monkeypatch.setattr(front.RunData, "load", no_data)
    monkeypatch.chdir(tmp_path)
    flags, expected = {
        "missing tokenizer": (["--tokenizer", "./no_tok"],
                              "tokenizer: the folder or file './no_tok' does not exist; give a save_pretrained folder"),
        "n_positions": (["--block_size", "64", "--n_positions", "32"],
                        "n_positions: got 32; must be >= data block_size=64"),
        "base positions": (["--model_name_or_path", "base", "--block_size", "64"],
                           "block_size: got 64, above the 32 positions of the base 'base'; block_size <= 32"),
        "vocab_size": (["--vocab_size", "100"], "vocab_size: got 100; must be an integer >= 260"),
    }[case]
    if case == "base positions":
        _tiny_base(tmp_path / "base")
        capsys.readouterr()
    out = tmp_path / "new" / "run"
    assert main(["train", "--config", "gpt2_tiny", "--output_dir", str(out), *flags]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {expected}") and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists()  # the folders this command made are gone again


def test_a_data_refusal_leaves_no_folder_it_made_and_keeps_one_that_was_there(tmp_path, capsys):
    from hf_fasttrain.cli import main

    for out in (tmp_path / "made" / "run", tmp_path / "there"):
        (tmp_path / "there").mkdir(exist_ok=True)
        code = main(["train", "--config", "gpt2_tiny", "--output_dir", str(out), "--dataset",
                     str(tmp_path / "missing.txt")])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: dataset: ") and err.count("\n") == 1, err
    assert not (tmp_path / "made").exists() and (tmp_path / "there").is_dir()
