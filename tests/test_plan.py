"""The run plan: each technique's spec built once per run, the run's length in one place, the plan in every
checkpoint."""

import json

import pytest
from transformers import DataCollatorForLanguageModeling

from hf_fasttrain import FastTrainer
from hf_fasttrain.config.plan import PLAN_FILE, RunPlan
from hf_fasttrain.optim.spec import OptimizerSpec
from hf_fasttrain.schedules import ScheduleSpec
from hf_fasttrain.stability.averaging import AveragingSpec
from hf_fasttrain.stability.guard import GuardConfig

from conftest import make_tiny_gpt2, tiny_args

SPECS = (OptimizerSpec, ScheduleSpec, AveragingSpec, GuardConfig)
OPTIONS = dict(max_steps=4, optimizer="ademamix", lr_decay="cosine", warmup_steps=1, weight_averaging="ema",
               ema_decay=0.9, divergence_guard=True, save_strategy="steps", save_steps=4)


def _count_constructions(monkeypatch) -> dict:
    made = {cls.__name__: 0 for cls in SPECS}
    for cls in SPECS:
        init = cls.__init__

        def counted(self, *args, __init=init, __name=cls.__name__, **kwargs):
            made[__name] += 1
            __init(self, *args, **kwargs)

        monkeypatch.setattr(cls, "__init__", counted)
    return made


@pytest.mark.slow
def test_each_spec_is_built_once_per_run_and_every_part_takes_the_plans(tiny_lm, tiny_tokenizer, tmp_path,
                                                                          monkeypatch):
    made = _count_constructions(monkeypatch)
    args = tiny_args(tmp_path, **OPTIONS)  # the arguments' own checks build each spec; the run takes those
    assert made == {"OptimizerSpec": 1, "ScheduleSpec": 1, "AveragingSpec": 1, "GuardConfig": 1}
    trainer = FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                          processing_class=tiny_tokenizer,
                          data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False))
    trainer.train()
    assert made == {"OptimizerSpec": 1, "ScheduleSpec": 1, "AveragingSpec": 1, "GuardConfig": 1}
    plan = trainer.plan
    assert (plan.length.optimizer_steps, plan.length.schedule_steps, plan.length.row_length,
            plan.length.global_batch, plan.length.tokens) == (4, 4, 32, 8, 4 * 8 * 32)
    # the parts are the plan's: AdEMAMix's warmup spans the plan's steps, the guard and the average hold its specs
    assert {g["T_alpha_beta3"] for g in trainer.optimizer.param_groups} == {plan.length.optimizer_steps}
    assert {g["initial_lr"] for g in trainer.optimizer.param_groups} == {plan.optimizer.lr}
    guard = next(c for c in trainer.callback_handler.callbacks if type(c).__name__ == "DivergenceGuardCallback")
    assert guard.config is plan.guard
    assert trainer.weight_averaging.settings["decay"] == plan.averaging.decay == 0.9
    # the checkpoint holds the plan
    saved = json.loads((tmp_path / "checkpoint-4" / PLAN_FILE).read_text())["plan"]
    assert saved == json.loads(json.dumps(plan.as_dict()))
    assert saved["optimizer"]["name"] == "ademamix" and saved["schedule"]["decay"] == "cosine"


@pytest.mark.slow
def test_budget_awares_plan_builds_the_measured_specs_once_and_training_builds_none(tiny_lm, tiny_tokenizer,
                                                                                     tmp_path, monkeypatch):
    """budget_aware: the given optimizer and schedule specs are built once (the arguments' checks), the measured
    ones once (the plan step, its fit check included); training builds none."""
    made = _count_constructions(monkeypatch)
    args = tiny_args(tmp_path, budget_aware=True, **{**OPTIONS, "optimizer": "adamw"})
    trainer = FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                          processing_class=tiny_tokenizer,
                          data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False))
    assert made == {"OptimizerSpec": 2, "ScheduleSpec": 2, "AveragingSpec": 1, "GuardConfig": 1}
    trainer.train()
    assert made == {"OptimizerSpec": 2, "ScheduleSpec": 2, "AveragingSpec": 1, "GuardConfig": 1}
    assert trainer.plan.schedule.decay == "linear" != args.lr_decay == "cosine"  # the short run's measured decay
    assert {g["weight_decay"] for g in trainer.optimizer.param_groups} == {trainer.plan.optimizer.weight_decay, 0.0}


def test_the_plan_of_a_token_budget_holds_its_steps_and_tokens(tmp_path):
    args = tiny_args(tmp_path, max_steps=-1, max_tokens=8 * 32 * 5, seq_len_warmup_min=16,
                     seq_len_warmup_fraction=0.5)
    plan = RunPlan.from_args(args, row_length=32)
    # short early rows hold fewer tokens: more optimizer steps than the 5 full-length ones, set as max_steps
    assert plan.length.optimizer_steps == args.max_steps == 6
    assert plan.length.tokens == 1344 >= 8 * 32 * 5  # the 6 steps: 2 of 16-token rows and 4 of 32, 8 rows each
    assert plan.length.max_tokens == 8 * 32 * 5 and plan.length.seq_len_warmup.min_seq_len == 16
    assert plan.length.schedule_steps == 5  # counted in tokens: the full-length steps of the budget
    in_steps = RunPlan.from_args(tiny_args(tmp_path, max_steps=-1, max_tokens=8 * 32 * 5, seq_len_warmup_min=16,
                                           seq_len_warmup_fraction=0.5, seq_len_warmup_count_tokens=False),
                                 row_length=32)
    assert in_steps.length.schedule_steps == in_steps.length.optimizer_steps == 6  # counted in optimizer steps


@pytest.mark.slow
def test_a_rerun_whose_plan_differs_from_its_checkpoints_is_refused(tiny_lm, tiny_tokenizer, tmp_path):
    """The options agree, but a setting derived from them differs from the checkpoint's plan (as when a budget_aware
    table changed between versions): refused in one line naming the plan's field; the same plan resumes."""
    from conftest import StopAt
    from hf_fasttrain.resume_identity import RunOptionsChanged

    def trainer(callbacks=()):
        args = tiny_args(tmp_path, auto_resume=True, **{**OPTIONS, "optimizer": "adamw", "save_steps": 2})
        return FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                           processing_class=tiny_tokenizer, callbacks=list(callbacks),
                           data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False))

    trainer([StopAt(2)]).train()
    plan_file = tmp_path / "checkpoint-2" / PLAN_FILE
    saved = json.loads(plan_file.read_text())
    assert saved["plan"]["optimizer"]["weight_decay"] == 0.0
    saved["plan"]["optimizer"]["weight_decay"] = 0.1
    plan_file.write_text(json.dumps(saved))
    again = trainer()
    with pytest.raises(RunOptionsChanged) as err:
        again.train()
    assert "plan.optimizer.weight_decay 0.1 -> 0 (settings derived from the options differ" in str(err.value)
    assert "\n" not in str(err.value) and again.state.global_step == 0
    saved["plan"]["optimizer"]["weight_decay"] = 0.0
    plan_file.write_text(json.dumps(saved))
    assert trainer().train().global_step == 4  # the same plan: resumed to the end


def _trainer(tmp_path, tiny_lm, tiny_tokenizer, callbacks=(), output="run", **options):
    args = tiny_args(tmp_path / output, auto_resume=True, **options)
    return FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                       processing_class=tiny_tokenizer, callbacks=list(callbacks),
                       data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False))


@pytest.mark.slow
def test_a_resume_with_another_global_batch_is_refused_in_one_line(tiny_lm, tiny_tokenizer, tmp_path):
    """The options agree but the checkpoint's plan held twice the rows per optimizer step (as a run on two
    processes with the same per-device batch does): refused before training, one line naming the field."""
    from conftest import StopAt
    from hf_fasttrain.resume_identity import RunOptionsChanged

    options = dict(max_steps=4, optimizer="adamw", save_strategy="steps", save_steps=2)
    _trainer(tmp_path, tiny_lm, tiny_tokenizer, [StopAt(2)], **options).train()
    plan_file = tmp_path / "run" / "checkpoint-2" / PLAN_FILE
    saved = json.loads(plan_file.read_text())
    assert saved["plan"]["length"]["global_batch"] == 8
    saved["plan"]["length"]["global_batch"] = 16
    plan_file.write_text(json.dumps(saved))
    again = _trainer(tmp_path, tiny_lm, tiny_tokenizer, **options)
    with pytest.raises(RunOptionsChanged) as err:
        again.train()
    assert str(err.value) == (
        f"output_dir: {tmp_path / 'run'} holds a run (checkpoint-2) trained with other options: "
        "plan.length.global_batch 16 -> 8 (the rows per optimizer step (per-device batch x accumulation x "
        "processes) are the run's: resume with the processes, per_device_train_batch_size and "
        "gradient_accumulation_steps it was trained with); use a new --output_dir for this run, or add "
        "--overwrite_output_dir to discard the old run (its checkpoints are deleted)")
    assert again.state.global_step == 0


@pytest.mark.slow
def test_a_resume_applies_a_longer_run_and_new_cadences_and_equals_the_straight_run(tiny_lm, tiny_tokenizer,
                                                                                     tmp_path, capsys):
    """Nothing is laid out over the run's length (a constant lr, a warmup in steps): a rerun with more steps and
    another logging cadence resumes, says what it applies, records it in its next checkpoint's plan, and ends
    with the weights of the same run trained straight through."""
    import torch
    from conftest import StopAt

    options = dict(optimizer="adamw", lr_decay="constant", warmup_steps=1, save_strategy="steps", save_steps=2)
    _trainer(tmp_path, tiny_lm, tiny_tokenizer, [StopAt(4)], max_steps=4, **options).train()
    capsys.readouterr()
    resumed = _trainer(tmp_path, tiny_lm, tiny_tokenizer, max_steps=6, logging_steps=2, **options)
    assert resumed.train().global_step == 6
    said = capsys.readouterr().err
    assert ("resuming run from " + str(tmp_path / "run" / "checkpoint-4") + "; applying max_steps 4 -> 6, "
            "logging_steps 1 -> 2, plan.length.optimizer_steps 4 -> 6, plan.length.schedule_steps 4 -> 6, "
            "plan.length.tokens 1024 -> 1536") in said, said
    plan = json.loads((tmp_path / "run" / "checkpoint-6" / PLAN_FILE).read_text())["plan"]["length"]
    assert (plan["optimizer_steps"], plan["schedule_steps"], plan["tokens"], plan["logging_steps"]) == (6, 6, 1536, 2)
    assert [h["step"] for h in resumed.state.log_history if "loss" in h] == [1, 2, 3, 4, 6]
    straight = _trainer(tmp_path, tiny_lm, tiny_tokenizer, output="straight", max_steps=6, **options)
    straight.train()
    for (name, a), (_, b) in zip(resumed.model.state_dict().items(), straight.model.state_dict().items()):
        assert torch.equal(a, b), name
