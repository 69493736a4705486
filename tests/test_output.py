"""What a run and the command line print: one progress display, short help, a loss curve that says
something, perplexity only where it means something, no pinned-memory warning on a CPU."""

from __future__ import annotations

import doctest
import warnings

import pytest
import torch


# -- the progress display --------------------------------------------------------------------------
class _Bar:
    """Stands in for the tqdm bar: records what the callback does with it."""

    def __init__(self):
        self.lines, self.postfix = [], None

    def write(self, line):
        self.lines.append(line)

    def set_postfix(self, postfix, refresh=True):
        self.postfix = dict(postfix)


def _state(step=40, max_steps=300):
    from transformers import TrainerState

    state = TrainerState()
    state.global_step, state.max_steps = step, max_steps
    return state


def test_a_training_log_updates_the_bar_and_prints_no_line():
    from hf_fasttrain.callbacks.progress import ReadableProgressCallback

    cb = ReadableProgressCallback()
    cb.training_bar = _Bar()
    logs = {"loss": 5.0123, "learning_rate": 0.016, "grad_norm": 0.9, "tokens_per_second": 9870.4}
    cb.on_log(None, _state(), None, logs=logs)
    assert cb.training_bar.lines == []
    assert cb.training_bar.postfix == {"loss": "5.012", "lr": "0.016", "tokens/s": "9,870"}
    cb.on_log(None, _state(100), None, logs={"eval_loss": 4.2131, "eval_runtime": 1.0})
    assert cb.training_bar.lines == ["eval at step 100:  loss 4.213"]
    cb.on_log(None, _state(300), None, logs={"train_runtime": 9.0, "train_loss": 4.5})  # the end log: nothing
    assert len(cb.training_bar.lines) == 1


def test_no_nested_eval_bar_while_training():
    from hf_fasttrain.callbacks.progress import ReadableProgressCallback

    cb = ReadableProgressCallback()
    cb.training_bar = _Bar()
    state = _state()
    state.is_world_process_zero = True
    cb.on_prediction_step(None, state, None, eval_dataloader=[1, 2, 3])
    assert cb.prediction_bar is None


def test_progress_doctests():
    import hf_fasttrain.callbacks.progress as progress

    assert doctest.testmod(progress).failed == 0


# -- the command line --------------------------------------------------------------------------------
def test_help_shows_first_sentences_whole_and_never_inside_a_value_list():
    import hf_fasttrain.config.options as options
    from hf_fasttrain.config.options import first_sentence, render_help

    assert doctest.testmod(options).failed == 0
    text = "Optimizer from hf_fasttrain.optim: 'adamw', 'lion', 'ademamix', 'soap', 'muon'. Then more."
    assert first_sentence(text) == "Optimizer from hf_fasttrain.optim: 'adamw', 'lion', 'ademamix', 'soap', 'muon'"
    for line in render_help("d").splitlines():
        assert not line.rstrip().endswith("...") and len(line) <= 100, line


def test_restarts_help_is_short_and_starts_nothing(capsys):
    from hf_fasttrain.cli import main

    assert main(["restarts", "--help"]) == 0
    out = capsys.readouterr()
    lines = out.out.splitlines()
    assert lines[0].startswith("usage: hf-fasttrain restarts") and len(lines) <= 40
    for flag in ("--num-seeds", "--explore-fraction", "--rungs", "--keep-fraction", "--parallel"):
        assert any(line.startswith(f"  {flag} ") for line in lines), flag
    assert "no --config given" not in out.out + out.err and out.err == ""


def test_recipes_list_names_every_bundled_recipe_with_a_whole_sentence(capsys):
    from hf_fasttrain.cli import main
    from hf_fasttrain.config.recipes import bundled_recipes

    assert main(["recipes", "list"]) == 0
    out = capsys.readouterr().out
    for name in bundled_recipes():
        line = next(line for line in out.splitlines() if line.startswith(name + " "))
        assert line.rstrip().endswith((".", "corpus")), line  # the description's first sentence, not a cut line


# -- the run's records ----------------------------------------------------------------------------------
def _plot(records, path):
    from hf_fasttrain.callbacks.run_record import plot_loss_curves

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plot_loss_curves(records, path, title="t")
    assert path.is_file() and path.stat().st_size > 0
    return [str(w.message) for w in caught]


def test_loss_curve_of_a_short_run_shows_what_there_is(tmp_path):
    # a 10-step run with logging_steps 500: only the end log's mean training loss
    assert _plot([{"train_loss": 5.1, "step": 10, "train_seconds": 2.0}], tmp_path / "a.png") == []
    # nothing at all: the image says so, and matplotlib has no legend to complain about
    assert _plot([], tmp_path / "b.png") == []
    # one logged loss and one eval
    assert _plot([{"loss": 5.0, "step": 5, "train_seconds": 1.0}, {"eval_loss": 4.9, "step": 10, "train_seconds": 2.0}],
                 tmp_path / "c.png") == []


def test_recorder_keeps_the_end_log_of_a_run_too_short_to_log_a_loss():
    from hf_fasttrain.callbacks import RunRecorderCallback

    rec = RunRecorderCallback(write_files=False)
    state = _state(10, 10)
    rec.on_log(None, state, None, logs={"train_runtime": 1.0, "train_loss": 5.25, "train_seconds": 1.0})
    assert rec.summary()["history"] == [{"train_runtime": 1.0, "train_loss": 5.25, "train_seconds": 1.0, "step": 10}]


# -- metrics that mean something --------------------------------------------------------------------------
def test_is_causal_lm():
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from hf_fasttrain.modeling import is_causal_lm

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, pad_token_id=0)
    assert is_causal_lm(GPT2LMHeadModel(config))
    assert not is_causal_lm(GPT2ForSequenceClassification(config))
    assert not is_causal_lm(torch.nn.Linear(2, 2))


def test_perplexity_only_for_a_causal_lm(tmp_path):
    from datasets import Dataset
    from transformers import GPT2Config, GPT2ForSequenceClassification, GPT2LMHeadModel

    from hf_fasttrain import FastTrainer, FastTrainingArguments

    config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2, pad_token_id=0)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (8, 16), generator=g).tolist()
    args = FastTrainingArguments(str(tmp_path), per_device_eval_batch_size=4, report_to="none", disable_tqdm=True)
    lm = FastTrainer(model=GPT2LMHeadModel(config), args=args,
                     eval_dataset=Dataset.from_dict({"input_ids": ids, "labels": ids}))
    assert "eval_perplexity" in lm.evaluate()
    clf = FastTrainer(model=GPT2ForSequenceClassification(config), args=args,
                      eval_dataset=Dataset.from_dict({"input_ids": ids, "labels": [0, 1] * 4}))
    metrics = clf.evaluate()
    assert "eval_loss" in metrics and "eval_perplexity" not in metrics


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU case")
def test_no_pinned_memory_on_a_cpu(tmp_path):
    from transformers import TrainingArguments

    from hf_fasttrain import FastTrainingArguments

    assert TrainingArguments(str(tmp_path), report_to="none").dataloader_pin_memory  # the Trainer's default
    assert FastTrainingArguments(str(tmp_path), report_to="none").dataloader_pin_memory is False


def test_help_all_is_grouped_as_help_is_and_lists_every_flag(capsys):
    from hf_fasttrain.cli import main
    from hf_fasttrain.config.recipes import make_parser

    assert main(["train", "--help"]) == 0
    short = capsys.readouterr().out
    assert main(["train", "--help-all"]) == 0
    full = capsys.readouterr().out
    lines = full.splitlines()
    assert lines[0] == "usage: hf-fasttrain train [--config RECIPE] [--<option> VALUE ...]" and not lines[2].strip()
    heads = [line for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    short_heads = [line for line in short.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    firsts = [h for h in heads if h in short_heads]
    assert firsts == [h for h in short_heads if h in heads][: len(firsts)] and len(firsts) >= 5  # same order
    rows = {line.split()[0] for line in lines if line.startswith("  --")}
    flags = {s for a in make_parser()._actions for s in a.option_strings if s.startswith("--") and s != "--help"}
    names = {"--" + f[2:].replace("-", "_") for f in flags} - {"--config"}
    names = {n for n in names if not (n.startswith("--no_") and "--" + n[5:] in names)}  # bools' --no_<name>
    missing = sorted(names - rows)
    assert not missing, missing[:20]
    assert len(lines) < 1000 and max(len(line) for line in lines) <= 110


def test_the_recipe_final_evaluate_has_no_bar_of_its_own():
    from hf_fasttrain.callbacks.progress import ReadableProgressCallback

    state = _state()
    state.is_world_process_zero = True
    cb = ReadableProgressCallback(bar_after_training=False)
    cb.training_bar = _Bar()
    cb.training_bar.close = lambda: None
    cb.on_train_end(None, state, None)
    cb.on_prediction_step(None, state, None, eval_dataloader=[1, 2])
    assert cb.training_bar is None and cb.prediction_bar is None
    plain = ReadableProgressCallback()  # an evaluate() outside training: its own bar, as the Trainer's
    plain.on_prediction_step(None, state, None, eval_dataloader=[1, 2])
    assert plain.prediction_bar is not None
    plain.prediction_bar.close()
