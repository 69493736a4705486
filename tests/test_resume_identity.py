"""A rerun into an output_dir with a checkpoint: options that may change are applied and recorded, any other change
is refused in one line before any work, a finished run trains nothing, and a stopped FastTrainer script run again
unchanged resumes by itself to the straight run's result."""

import json
import logging
import os

import pytest
import torch

from hf_fasttrain.callbacks.stop_at_step import StopAtStepCallback
from hf_fasttrain.resume_identity import (MAY_CHANGE_ON_RESUME, OPTIONS_FILE, Change, RunOptionsChanged,
                                          length_blocker, option_changes, split_changes)

from conftest import make_tiny_trainer, tiny_args

BASE = {"model": {"n_layer": 2, "n_embd": 32}, "data": {"block_size": 32, "tokenizer": None, "vocab_size": 300},
        "learning_rate": 1e-3, "lr_decay": "cosine", "warmup_steps": 2, "optimizer": "muon",
        "optimizer_kwargs": {"muon_lr": 0.02}, "max_steps": 10, "logging_steps": 5, "save_steps": 5, "seed": 0,
        "per_device_train_batch_size": 8}


def test_option_changes_flattens_sections_and_ignores_what_the_record_lacks():
    now = {**BASE, "model": {"n_layer": 4, "n_embd": 32}, "learning_rate": 3e-3, "min_lr_ratio": 0.1}
    assert option_changes(BASE, now) == [("n_layer", 2, 4), ("learning_rate", 1e-3, 3e-3)]
    assert option_changes(BASE, {**BASE, "optimizer_kwargs": {"muon_lr": 0.02}}) == []
    assert option_changes({**BASE, "optimizer_kwargs": None}, {**BASE, "optimizer_kwargs": {}}) == []
    # a LoRA run met by a full-training one: lora_r 8 -> None
    assert option_changes({**BASE, "peft": {"lora_r": 8}}, BASE) == [("lora_r", 8, None)]
    assert option_changes(BASE, {**BASE, "data": {**BASE["data"], "vocab_size": 500, "tokenizer": "gpt2"}}) == \
        [("tokenizer", None, "gpt2")]  # vocab_size only counts for the trained BPE


@pytest.mark.parametrize("options, blocker", [
    ({"lr_decay": "constant", "warmup_steps": 20}, None),
    ({"lr_scheduler_type": "constant_with_warmup", "warmup_steps": 3}, None),
    ({"lr_decay": "cosine", "schedule_unit": "tokens", "schedule_total_tokens": 10_000}, None),
    ({"lr_decay": "cosine"}, "the lr schedule (lr_decay 'cosine') decays over the run's length"),
    ({"lr_scheduler_type": "linear"}, "the lr schedule (lr_scheduler_type 'linear') spans the run's length"),
    ({"lr_decay": "constant", "warmup_steps": 0.1}, "warmup_steps 0.1 is a fraction of the run's length"),
    ({"lr_decay": "constant", "seq_len_warmup_min": 16},
     "the sequence-length warmup (seq_len_warmup_min 16) spans a fraction of the run's length"),
    ({"lr_decay": "constant", "budget_aware": True}, "budget_aware chose its settings for the run's length"),
    ({"lr_decay": "constant", "optimizer": "ademamix"},
     "AdEMAMix warms alpha and beta3 up over the run's length (T_alpha_beta3 = max_steps)"),
    ({"lr_decay": "constant", "optimizer": "ademamix", "optimizer_kwargs": '{"T_alpha_beta3": 50}'}, None),
    ({"lr_decay": "constant", "optimizer": "ademamix", "optimizer_kwargs": {"T_alpha_beta3": None}}, None),
])
def test_length_blocker_table(options, blocker):
    assert length_blocker(options) == blocker


def test_split_changes_applies_cadence_and_refuses_the_rest():
    now = {**BASE, "logging_steps": 1, "save_steps": 2, "max_steps": 20, "learning_rate": 2e-3,
           "optimizer_kwargs": {"muon_lr": 0.05}, "per_device_train_batch_size": 16}
    applied, refused, why = split_changes(BASE, now)
    assert applied == [("logging_steps", 5, 1), ("save_steps", 5, 2)]
    assert refused == [("learning_rate", 1e-3, 2e-3), ("optimizer_kwargs", {"muon_lr": 0.02}, {"muon_lr": 0.05}),
                       ("max_steps", 10, 20), ("per_device_train_batch_size", 8, 16)]
    assert why == "the lr schedule (lr_decay 'cosine') decays over the run's length"
    constant = {**BASE, "lr_decay": "constant"}
    assert split_changes(constant, {**constant, "max_steps": 20}) == ([("max_steps", 10, 20)], [], None)
    assert all(isinstance(v, str) and v for v in MAY_CHANGE_ON_RESUME.values())


def test_refusal_is_one_line_naming_each_field_and_the_two_ways_on():
    err = RunOptionsChanged("runs/x", "runs/x/checkpoint-38", [Change("learning_rate", 0.016, 0.003),
                                                              Change("optimizer", "muon", "adamw")])
    assert str(err) == ("output_dir: runs/x holds a run (checkpoint-38) trained with other options: learning_rate "
                        "0.016 -> 0.003, optimizer 'muon' -> 'adamw'; use a new --output_dir for this run, or add "
                        "--overwrite_output_dir to discard the old run (its checkpoints are deleted)")


# --- FastTrainer in a user's own script --------------------------------------------------------------------------

def _trainer(out, tok, lm, callbacks=(), **overrides):
    kw = dict(max_steps=6, save_strategy="steps", save_steps=3, lr_decay="cosine", warmup_steps=1, auto_resume=True)
    kw.update(overrides)
    return make_tiny_trainer(tok, lm, tiny_args(out, **kw), callbacks=list(callbacks))


def _losses(trainer):
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def _record(out):
    return {f: ((out / f).read_bytes(), (out / f).stat().st_mtime_ns) for f in ("config.yaml", "run_info.json")}


@pytest.fixture(scope="module")
def stopped(tiny_lm, tiny_tokenizer, tmp_path_factory):
    """A run of 6 steps stopped at step 3 (checkpoint-3), and the straight run's losses."""
    straight = _trainer(tmp_path_factory.mktemp("straight"), tiny_tokenizer, tiny_lm)
    straight.train()
    out = tmp_path_factory.mktemp("stopped")
    _trainer(out, tiny_tokenizer, tiny_lm, callbacks=[StopAtStepCallback(3)]).train()
    assert sorted(p for p in os.listdir(out) if p.startswith("checkpoint")) == ["checkpoint-3"]
    return out, _losses(straight), straight


@pytest.mark.parametrize("change, named", [
    ({"learning_rate": 1e-2}, "learning_rate 0.003 -> 0.01"),
    ({"lr_decay": "linear"}, "lr_decay 'cosine' -> 'linear'"),
    ({"optimizer": "adamw"}, "optimizer None -> 'adamw'"),
    ({"per_device_train_batch_size": 4, "seed": 1}, "per_device_train_batch_size 8 -> 4, seed 0 -> 1"),
    ({"max_steps": 12}, "max_steps 6 -> 12 (the lr schedule (lr_decay 'cosine') decays over the run's length)"),
])
def test_a_changed_option_is_refused_before_any_work(change, named, stopped, tiny_lm, tiny_tokenizer):
    out = stopped[0]
    before = _record(out)
    trainer = _trainer(out, tiny_tokenizer, tiny_lm, **change)
    with pytest.raises(RunOptionsChanged) as err:
        trainer.train()
    assert "\n" not in str(err.value) and f"other options: {named}; use a new --output_dir" in str(err.value)
    assert trainer.state.global_step == 0 and _record(out) == before  # nothing trained, nothing written
    assert sorted(p for p in os.listdir(out) if p.startswith("checkpoint")) == ["checkpoint-3"]


def test_the_script_run_again_resumes_by_itself_and_ends_as_the_straight_run(stopped, tiny_lm, tiny_tokenizer,
                                                                             tmp_path, capfd):
    import shutil

    out = tmp_path / "again"
    shutil.copytree(stopped[0], out)
    options = json.loads((out / "checkpoint-3" / OPTIONS_FILE).read_text())["options"]
    assert options["learning_rate"] == 3e-3 and options["lr_decay"] == "cosine"
    again = _trainer(out, tiny_tokenizer, tiny_lm, logging_steps=2)  # logging cadence may change
    capfd.readouterr()
    again.train()
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[hf_fasttrain]")]
    assert said == [f"[hf_fasttrain] resuming again from {out / 'checkpoint-3'}; applying logging_steps 1 -> 2"]
    losses = _losses(again)
    assert sorted(s for s in losses if s > 3) == [4, 6]  # logged at the new cadence, every 2 steps
    assert losses[4] == stopped[1][4]  # bit-equal to the straight run; step 6 logs the mean of steps 5 and 6
    assert losses[6] == pytest.approx((stopped[1][5] + stopped[1][6]) / 2, rel=1e-6)
    for p, q in zip(stopped[2].model.parameters(), again.model.parameters()):
        assert torch.equal(p, q)
    import yaml

    assert yaml.safe_load((out / "config.yaml").read_text())["logging_steps"] == 2  # the record says what ran

    # run once more, unchanged: the run is complete, nothing trains
    done = _trainer(out, tiny_tokenizer, tiny_lm, logging_steps=2)
    before = _record(out)
    result = done.train()
    assert result.global_step == 6 and _record(out) == before
    said = [ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("[hf_fasttrain]")]
    assert len(said) == 1 and said[0].startswith("[hf_fasttrain] again is complete: ") and "nothing to train" in said[0]


def test_a_longer_run_continues_where_its_schedule_does_not_depend_on_its_length(tiny_lm, tiny_tokenizer, tmp_path):
    import yaml

    const = dict(lr_decay="constant", warmup_steps=0)
    straight = _trainer(tmp_path / "straight", tiny_tokenizer, tiny_lm, max_steps=6, **const)
    straight.train()
    out = tmp_path / "extended"
    _trainer(out, tiny_tokenizer, tiny_lm, max_steps=3, **const).train()
    longer = _trainer(out, tiny_tokenizer, tiny_lm, max_steps=6, **const)
    longer.train()
    assert _losses(longer) == _losses(straight) and longer.state.global_step == 6
    assert yaml.safe_load((out / "config.yaml").read_text())["max_steps"] == 6
    assert json.loads((out / "checkpoint-6" / OPTIONS_FILE).read_text())["options"]["max_steps"] == 6


def test_overwrite_output_dir_discards_the_old_run(stopped, tiny_lm, tiny_tokenizer, tmp_path):
    import shutil

    out = tmp_path / "fresh"
    shutil.copytree(stopped[0], out)
    trainer = _trainer(out, tiny_tokenizer, tiny_lm, learning_rate=1e-2, max_steps=2, save_strategy="no",
                       overwrite_output_dir=True)
    trainer.train()
    assert trainer.state.global_step == 2 and not (out / "checkpoint-3").exists()


# --- the recipe's command line -----------------------------------------------------------------------------------

RECIPE = ["--config", "gpt2_tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--block_size", "32",
          "--vocab_size", "300", "--max_steps", "8", "--warmup_steps", "1", "--report_to", "none",
          "--max_corpus_files", "40"]


def _stopped_recipe_run(out, **trained_with):
    """An output_dir as a recipe run stopped at step 4 leaves it: checkpoint-4 holding the options it trained with
    (this command's, changed by ``trained_with``), its config.yaml and run_info.json."""
    from hf_fasttrain.config.recipes import parse_config, resolved_config
    from hf_fasttrain.resume_identity import write_options

    options = resolved_config(*parse_config([*RECIPE, "--output_dir", str(out)]))
    options.update(trained_with)
    ckpt = out / "checkpoint-4"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 8}))
    from hf_fasttrain.callbacks.averaging import AVERAGE_FILE

    (ckpt / AVERAGE_FILE).write_bytes(b"")  # gpt2_tiny keeps an EMA in every checkpoint
    write_options(str(ckpt), options)
    (out / "config.yaml").write_text("learning_rate: 0.01\n")
    (out / "run_info.json").write_text("{}")


def _files(out):
    return {str(p.relative_to(out)): (p.stat().st_mtime_ns, p.read_bytes()) for p in sorted(out.rglob("*")) if p.is_file()}


def test_the_recipe_refuses_a_changed_rerun_in_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    from hf_fasttrain.cli import main

    out = tmp_path / "run"
    _stopped_recipe_run(out, learning_rate=0.01, lr_decay="linear", optimizer="adamw",
                        per_device_train_batch_size=4)
    before = _files(out)
    code = main(["train", *RECIPE, "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err == (f"error: output_dir: {out} holds a run (checkpoint-4) trained with other options: "
                   "per_device_train_batch_size 4 -> 16, learning_rate 0.01 -> 0.016, lr_decay 'linear' -> 'cosine', "
                   "optimizer 'adamw' -> 'muon'; use a new --output_dir for this run, or add --overwrite_output_dir to "
                   "discard the old run (its checkpoints are deleted)\n")
    assert _files(out) == before  # nothing written: not config.yaml, not run_info.json, no checkpoint


def test_a_rerun_with_a_new_cadence_evaluates_logs_and_saves_at_it(tiny_lm, tiny_tokenizer, tmp_path):
    """A 20-step run stopped at checkpoint-12, rerun with new eval/save/logging steps: the resumed run keeps to the
    new ones (the checkpoint's trainer_state.json carries the old ones), and config.yaml records them."""
    import yaml

    from conftest import StopAt

    out = tmp_path / "cadence"

    def trainer(callbacks=(), **cadence):
        kw = dict(max_steps=20, lr_decay="constant", warmup_steps=0, eval_strategy="steps", **cadence)
        return make_tiny_trainer(tiny_tokenizer, tiny_lm, tiny_args(out, auto_resume=True, **kw),
                                 eval_dataset=tiny_lm["validation"].select(range(8)), callbacks=list(callbacks))

    first = trainer([StopAt(12)], eval_steps=10, save_strategy="steps", save_steps=6, logging_steps=6)
    first.train()
    assert [e["step"] for e in first.state.log_history if "eval_loss" in e] == [10]
    again = trainer(eval_steps=4, save_strategy="steps", save_steps=5, logging_steps=2)
    again.train()
    history = again.state.log_history
    assert [e["step"] for e in history if "eval_loss" in e] == [10, 16, 20]
    assert [e["step"] for e in history if "loss" in e] == [6, 12, 14, 16, 18, 20]
    assert sorted(int(p.split("-")[1]) for p in os.listdir(out) if p.startswith("checkpoint-")) == [6, 12, 15, 20]
    recorded = yaml.safe_load((out / "config.yaml").read_text())
    assert (recorded["eval_steps"], recorded["save_steps"], recorded["logging_steps"]) == (4, 5, 2)
    saved = json.loads((out / "checkpoint-20" / "trainer_state.json").read_text())
    assert (saved["eval_steps"], saved["save_steps"], saved["logging_steps"]) == (4, 5, 2)


def test_ademamix_refuses_a_longer_run_and_keeps_a_fixed_warmup(tiny_lm, tiny_tokenizer, tmp_path):
    """AdEMAMix's alpha/beta3 warmup spans max_steps: a longer rerun is refused in one line (the optimizer state it
    would load says T_alpha_beta3 = the old length). With T_alpha_beta3 given, the run continues and keeps it."""
    const = dict(lr_decay="constant", warmup_steps=0, optimizer="ademamix")
    out = tmp_path / "ademamix"
    _trainer(out, tiny_tokenizer, tiny_lm, max_steps=3, **const).train()
    longer = _trainer(out, tiny_tokenizer, tiny_lm, max_steps=6, **const)
    with pytest.raises(RunOptionsChanged) as err:
        longer.train()
    assert "max_steps 3 -> 6 (AdEMAMix warms alpha and beta3 up over the run's length" in str(err.value)
    assert "\n" not in str(err.value) and longer.state.global_step == 0

    fixed = dict(const, optimizer_kwargs={"T_alpha_beta3": 4})
    out = tmp_path / "fixed"
    _trainer(out, tiny_tokenizer, tiny_lm, max_steps=3, **fixed).train()
    longer = _trainer(out, tiny_tokenizer, tiny_lm, max_steps=6, **fixed)
    longer.train()
    assert longer.state.global_step == 6
    assert {g["T_alpha_beta3"] for g in longer.optimizer.param_groups} == {4}
