"""benchmarks/hf_best.py: the coordinate descent (a pure generator), the arms it builds, and a resumable smoke
search; benchmarks/lora_fine_tuning.py: a smoke run."""

import json
import math
import sys

import pytest

from benchmarks._harness import long_runs, processes


def hb():
    from benchmarks import hf_best

    return hf_best


def drive(search, losses):
    """Run a coordinate descent against a table of losses (config -> loss); returns (batches, outcome)."""
    mod = hb()
    batches, batch = [], next(search)
    while True:
        batches.append(batch)
        try:
            batch = search.send({mod.config_key(c): losses(c) for c in batch})
        except StopIteration as stop:
            return batches, stop.value


def test_coordinate_descent_keeps_only_changes_larger_than_the_noise():
    start = {"a": 1, "b": "x"}
    knobs = [("a", [0, 2]), ("b", ["y", "z"])]
    table = {(1, "x"): 3.00, (0, "x"): 2.995, (2, "x"): 2.90, (2, "y"): 2.895, (2, "z"): 2.80,
             (1, "y"): 2.99, (1, "z"): 2.95}
    batches, out = drive(long_runs.coordinate_descent(start, knobs, noise=0.01), lambda c: table[(c["a"], c["b"])])
    assert batches == [[start], [{"a": 0, "b": "x"}, {"a": 2, "b": "x"}], [{"a": 2, "b": "y"}, {"a": 2, "b": "z"}]]
    assert out["best"] == {"a": 2, "b": "z"} and out["loss"] == 2.80
    assert [(d["knob"], d["best_value"], d["accepted"]) for d in out["decisions"]] == [("a", 2, True), ("b", "z", True)]
    # a gain inside the noise is not taken
    _, out = drive(long_runs.coordinate_descent(start, knobs, noise=0.2), lambda c: table[(c["a"], c["b"])])
    assert out["best"] == start and not any(d["accepted"] for d in out["decisions"])


def test_the_lr_walk_goes_downhill_one_run_at_a_time_and_stops_where_the_loss_rises():
    """``lr_walk``: x0.5 first, on while the loss falls; where the first step down loses, x2 and on up; at most
    ``steps`` steps one way. Each batch is one run; each step is one decision."""
    start = {"lr": 1e-2, "lr_scale": 1.0}

    def walk(best_scale, steps=4):
        batches, out = drive(long_runs.lr_walk(start, steps=steps),
                             lambda c: 3.0 + abs(math.log2(c["lr_scale"] / best_scale)) * 0.1)
        assert all(len(b) == 1 for b in batches)
        return [b[0]["lr_scale"] for b in batches], out

    scales, out = walk(0.25)  # down twice, the third step down loses: the best has both neighbours
    assert scales == [1.0, 0.5, 0.25, 0.125] and out["best"]["lr_scale"] == 0.25 and out["loss"] == 3.0
    assert [(d["from"], d["best_value"], d["accepted"]) for d in out["decisions"]] == \
        [(1.0, 0.5, True), (0.5, 0.25, True), (0.25, 0.125, False)]
    scales, out = walk(4.0)  # the first step down loses: up, twice, then the third step up loses
    assert scales == [1.0, 0.5, 2.0, 4.0, 8.0] and out["best"]["lr_scale"] == 4.0
    scales, out = walk(1.0)  # the start is the best: one step each way, three runs in all
    assert scales == [1.0, 0.5, 2.0] and out["best"] == start
    scales, out = walk(1 / 64, steps=4)  # four steps down and still falling: stops at the edge
    assert scales == [1.0, 0.5, 0.25, 0.125, 0.0625] and out["best"]["lr_scale"] == 0.0625
    # a step that ties does not move the walk (the lowest loss wins, ties keep the current best)
    _, out = drive(long_runs.lr_walk(start), lambda c: 3.0)
    assert out["best"] == start and [d["best_value"] for d in out["decisions"]] == [0.5, 2.0]


def test_arms_use_the_trainers_own_options_for_hf_best():
    mod = hb()
    steps = 4800
    start = mod.start_config("hf-best", 4e-3, steps)
    assert start["wd_timescale"] == pytest.approx(4e-3 * 0.1 * steps)
    arm = mod.arm_for("hf-best", start, steps)
    assert not arm.fast and arm.args["weight_decay"] == pytest.approx(0.1)
    assert (arm.args["lr_scheduler_type"], arm.args["lr_scheduler_kwargs"]) == ("cosine_with_min_lr", {"min_lr_rate": 0.1})
    wsd = mod.arm_for("hf-best", {**start, "schedule": "wsd-1-sqrt", "lr_scale": 2.0}, steps).args
    assert wsd["lr_scheduler_type"] == "warmup_stable_decay" and wsd["learning_rate"] == pytest.approx(8e-3)
    assert wsd["lr_scheduler_kwargs"] == {"num_decay_steps": 960, "decay_type": "1-sqrt", "min_lr_ratio": 0.0}
    assert wsd["weight_decay"] == pytest.approx(0.05)  # the timescale lr x wd x steps is kept
    sf = mod.arm_for("hf-best", {**start, "optim": "schedule_free_adamw"}, steps).args
    assert (sf["optim"], sf["lr_scheduler_type"], sf["warmup_steps"]) == ("schedule_free_adamw", "constant", 96)
    recipe = mod.arm_for("recipe", {**mod.start_config("recipe", 1.6e-2, steps), "ema": False, "beta2": 0.99}, steps)
    assert recipe.fast and recipe.args["optimizer"] == "muon" and "weight_averaging" not in recipe.args
    assert recipe.args["optimizer_kwargs"] == {"betas": [0.9, 0.99]}
    assert recipe.args["seq_len_warmup_min"] == 16
    # the sub-noise candidates together: Muon at half the lr, the AdamW part at a quarter of that, timescale 4
    start = mod.start_config("recipe", 1.6e-2, steps)
    together = long_runs.with_knob(start, long_runs.TOGETHER, (True, 0.25, 4.0, 0.5))
    args = mod.arm_for("recipe", together, steps).args
    assert args["optimizer_kwargs"] == {"betas": [0.9, 0.95], "cautious_wd": True, "muon_lr": 8e-3}
    assert args["learning_rate"] == pytest.approx(2e-3) and args["weight_decay"] == pytest.approx(4.0 / (8e-3 * steps))
    # Hyperball replaces Muon's decay, so cautious weight decay is not passed beside it (the optimizer refuses both)
    ball_config = long_runs.with_knob(together, "hyperball+lr_scale", (True, 0.25))
    assert ball_config["cautious_wd"] is False  # one setting, so the search does not train it twice
    assert long_runs.with_knob(ball_config, "cautious_wd", True) == ball_config
    ball = mod.arm_for("recipe", ball_config, steps).args
    assert ball["optimizer_kwargs"] == {"betas": [0.9, 0.95], "hyperball": True, "muon_lr": 4e-3}
    # AdEMAMix in place of Muon: Muon's options dropped, AdamW's lr and weight decay timescale
    adema = long_runs.with_knob(ball_config, long_runs.ADEMAMIX, ("ademamix", 0.25, long_runs.ADAMW_TIMESCALE))
    assert not set(long_runs.MUON_ONLY) & set(adema) and adema["optimizer"] == "ademamix"
    args = mod.arm_for("recipe", adema, steps).args
    assert (args["optimizer"], args["learning_rate"]) == ("ademamix", pytest.approx(4e-3))
    assert args["weight_decay"] == pytest.approx(0.1) and args["weight_averaging"] == "ema"
    assert args["optimizer_kwargs"] == {"betas": [0.9, 0.95, 0.9999], "alpha": 5.0}
    # its slow momentum's decay is a knob of its own (absent: the paper's 0.9999); to Muon it means nothing
    faster = mod.arm_for("recipe", {**adema, "beta3": 0.999}, steps).args
    assert faster["optimizer_kwargs"] == {"betas": [0.9, 0.95, 0.999], "alpha": 5.0}
    assert "beta3" not in long_runs.with_knob(adema, "optimizer", "muon")
    assert mod.parse_config(json.dumps({**adema, "beta3": 0.999}), ["recipe"])["beta3"] == 0.999


@pytest.mark.bench
def test_smoke_search_is_resumable(tmp_path):
    mod = hb()
    first = mod.main(["--quick", "--out", str(tmp_path), "--families", "hf-best"])
    data = json.loads((tmp_path / "hf_best.json").read_text())
    n = len(data["runs"])
    assert n == 1 + sum(len(v) for _, v in mod.KNOBS["hf-best"]) + 1  # start, every value once, the 2nd seed
    again = mod.main(["--quick", "--out", str(tmp_path), "--families", "hf-best"])  # replays, trains nothing
    assert len(json.loads((tmp_path / "hf_best.json").read_text())["runs"]) == n
    assert again["summary"]["hf-best"]["best"] == first["summary"]["hf-best"]["best"]
    assert "| hf-best | schedule |" in (tmp_path / "hf_best.md").read_text()


@pytest.mark.bench
def test_lora_fine_tuning_smoke_run(tmp_path):
    from benchmarks import lora_fine_tuning

    record = lora_fine_tuning.main(["--quick", "--seeds", "1", "--out", str(tmp_path), "--cache", str(tmp_path / "c")])
    arms = record["summary"]["arms"]
    assert set(arms) == {"lora-adamw", "lora-muon", "lora-muon-b", "full-adamw"}
    assert arms["lora-adamw"]["tokens_ratio_vs_reference"] == 1.0
    assert arms["lora-adamw"]["trainable_bytes"] < arms["full-adamw"]["trainable_bytes"] / 4
    assert (tmp_path / "lora_fine_tuning.md").is_file() and (tmp_path / "lora_fine_tuning.png").is_file()


def test_summary_of_a_search_still_running_shows_the_best_so_far_and_the_knob_being_tried():
    mod = hb()
    start = {"lr": 4e-3, "schedule": "cosine10", "beta2": 0.95}
    wsd = {**start, "schedule": "wsd-1-sqrt"}
    trying = [{**wsd, "beta2": 0.99}, {**wsd, "beta2": 0.999}]

    def run(config, loss, seed=0, **extra):
        return {"rung": "16x", "family": "hf-best", "config": config, "seed": seed, "final_eval_loss": loss, **extra}

    runs = [run(start, 3.093, imported_from="budget_ladder.json"), run(start, 3.093, seed=1, imported_from="x"),
            run(wsd, 3.006), run(trying[0], 2.99), run({**wsd, "optim": "schedule_free_adamw"}, 3.1)]
    data = {"runs": {str(i): r for i, r in enumerate(runs)},
            "progress": {"16x": {"hf-best": {"decisions": [{"knob": "schedule", "from": "cosine10", "best_value":
                                                             "wsd-1-sqrt", "accepted": True, "tried": {},
                                                             "current_loss": 3.093, "best_loss": 3.006}],
                                             "running": trying}}}}
    view = type("View", (), {"data": data})()
    s = mod.summarise(view, "16x")["hf-best"]
    assert s["best"] == wsd and s["final_eval_loss"] == 3.006 and not s["complete"]
    assert s["trying"] == {"knob": "beta2", "finished": {"0.99": 2.99, "0.999": None}, "from": 0.95, "from_loss": 3.006}
    # a run of a later knob that finished first (a restarted search) is shown, not decided
    assert s["ahead"] == {"optim": {"schedule_free_adamw": 3.1}}
    text = mod.markdown({"hf-best": s})
    assert "| hf-best | beta2 | 0.95 (3.006) | 0.99: 2.990, 0.999: running | deciding |" in text
    assert "| hf-best (search running) |" in text
    assert "| schedule_free_adamw: 3.100 | finished ahead of its turn |" in text
    # a second budget searched into the same file: the report shows both, shortest first, each its command
    one = {**start, "lr": 2e-3}
    data["runs"]["1x"] = {**run(one, 4.7, imported_from="budget_ladder.json"), "rung": "1x"}
    data["progress"]["1x"] = {"hf-best": {"decisions": [], "running": [{**one, "beta2": 0.99}]}}
    data["commands"] = {"1x": ["python -m benchmarks.hf_best --budget 1 --jobs 1",
                               "python -m benchmarks.hf_best --budget 1 --families recipe --seeds 3"]}
    report = mod.report_text(view)
    assert ("Command: `python -m benchmarks.hf_best --budget 1 --jobs 1`; then "
            "`python -m benchmarks.hf_best --budget 1 --families recipe --seeds 3`." in report)
    data["commands"] = {"1x": "python -m benchmarks.hf_best --budget 1 --jobs 1"}  # as older files hold it
    report = mod.report_text(view)
    assert mod.searched_rungs(view) == ["1x", "16x"]
    assert report.index("## Budget 1x") < report.index("## Budget 16x")
    assert "Command: `python -m benchmarks.hf_best --budget 1 --jobs 1`." in report
    assert "Command: `nice -n 10 python -m benchmarks.hf_best --budget 16 --jobs 2`." in report
    assert "| hf-best (search running) | lr 0.002, schedule cosine10, beta2 0.95 | 4.700 | 1 |" in report


def test_families_share_the_workers_and_decide_as_one_at_a_time(tmp_path, monkeypatch):
    import concurrent.futures
    import threading

    mod = hb()

    def loss(config):  # a made-up landscape: every knob matters a little, in a fixed way
        return (3.0 - 0.05 * (config["schedule"] == "wsd-1-sqrt") - 0.03 * (config["beta2"] == 0.99)
                - 0.04 * (config.get("normuon") == 0.95) + 0.01 * config["lr_scale"])

    order, lock = [], threading.Lock()

    def fake_run(job):
        import time

        rung, family, config, seed = job
        with lock:
            order.append((family, config["schedule"]))
        time.sleep(0.02)  # long enough that jobs overlap, as real runs do
        return {"rung": rung, "family": family, "config": config, "seed": seed, "final_eval_loss": loss(config),
                "cpu_seconds": 0.0}

    monkeypatch.setattr(mod, "_run_one", fake_run)
    starts = {f: mod.start_config(f, 4e-3, 100) for f in mod.SEARCHED_BY_DEFAULT}
    outcomes = []
    for pool in (None, concurrent.futures.ThreadPoolExecutor(2)):
        order.clear()
        ledger = mod.Ledger(tmp_path / f"{pool is None}.json")
        outcomes.append(mod.search(ledger, "16x", starts, pool, seeds=2, log=lambda m: None))
        runs = ledger.data["runs"]
        seed0 = {k for k in runs if k.endswith("|0")}
        assert len(runs) == len(seed0) + 2  # and a 2nd seed at each winner
        for f, o in outcomes[-1].items():  # every knob decided, each from the runs of its values
            assert [d["knob"] for d in o["decisions"]] == [k for k, _ in mod.KNOBS[f]]
            assert sum(k.split("|")[1] == f for k in seed0) <= 1 + sum(len(d["tried"]) for d in o["decisions"])
        if pool is not None:
            assert {f for f, _ in order[:2]} == {"hf-best", "recipe"}  # both families start at once
            # a free worker goes to the family with fewer jobs running: the recipe's 2 schedules do not wait
            # behind all 4 of hf-best's
            hf = [i for i, (f, sch) in enumerate(order) if f == "hf-best" and sch != "cosine10"][:4]
            rec = [i for i, (f, sch) in enumerate(order) if f == "recipe" and sch != "cosine10"][:2]
            assert rec[0] < hf[-1], order[:8]
            pool.shutdown()
    assert outcomes[0] == outcomes[1]
    recipe = outcomes[1]["recipe"]["best"]
    assert recipe["normuon"] == 0.95 and recipe["schedule"] == "wsd-1-sqrt"
    assert "normuon" not in outcomes[1]["hf-best"]["best"]
    # a knob added later is absent from the start point, so the runs made before it keep their keys
    assert "normuon" not in starts["recipe"] and mod.knob_value(starts["recipe"], "normuon") is None
    arm = mod.arm_for("recipe", recipe, 100)
    assert arm.args["optimizer_kwargs"]["normuon_beta2"] == 0.95


def test_joint_and_relative_knobs():
    # a joint knob "a+b" sets both parts at once (a candidate at its own lr); the lr knob multiplies the current lr
    start = {"normuon": None, "lr_scale": 1.0}
    knobs = [("normuon", [0.95]), ("normuon+lr_scale", [(0.95, 0.5)]), ("lr_scale", [0.5, 2.0])]
    table = {(None, 1.0): 3.0, (0.95, 1.0): 3.2, (0.95, 0.5): 2.9, (0.95, 0.25): 2.95, (0.95, 1.0 + 0): 3.2}
    batches, out = drive(long_runs.coordinate_descent(start, knobs, noise=0.01), lambda c: table[(c["normuon"], c["lr_scale"])])
    assert batches[2] == [{"normuon": 0.95, "lr_scale": 0.5}]
    assert batches[3] == [{"normuon": 0.95, "lr_scale": 0.25}, {"normuon": 0.95, "lr_scale": 1.0}]  # x0.5, x2 of 0.5
    assert out["best"] == {"normuon": 0.95, "lr_scale": 0.5}
    joint = out["decisions"][1]
    assert joint["tried"] == {"(0.95, 0.5)": 2.9} and joint["accepted"] and joint["best_value"] == (0.95, 0.5)
    # the summary rebuilds the best setting from the decisions, joint ones included
    assert long_runs.set_knob(start, "normuon+lr_scale", [0.95, 0.5]) == out["best"]


def test_a_search_of_one_family_keeps_the_other_familys_record(tmp_path, monkeypatch):
    mod = hb()

    def fake_run(job):
        rung, family, config, seed = job
        return {"rung": rung, "family": family, "config": config, "seed": seed, "cpu_seconds": 0.0,
                "final_eval_loss": 3.0 - 0.05 * (config["schedule"] == "wsd-1-sqrt")}

    monkeypatch.setattr(mod, "_run_one", fake_run)
    starts = {f: mod.start_config(f, 4e-3, 100) for f in mod.SEARCHED_BY_DEFAULT}
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    both = mod.search(ledger, "16x", starts, None, seeds=2, log=lambda m: None)
    # later: a third seed of the recipe only (``--families recipe --seeds 3``)
    mod.search(ledger, "16x", {"recipe": starts["recipe"]}, None, seeds=3, log=lambda m: None)
    searches = ledger.data["searches"]["16x"]
    assert set(searches) == {"hf-best", "recipe"} and searches["hf-best"] == both["hf-best"]
    assert set(ledger.data["progress"]["16x"]) == {"hf-best", "recipe"}
    summary = mod.summarise(ledger, "16x")
    assert summary["hf-best"]["seeds"] == 2 and summary["recipe"]["seeds"] == 3


class _Killed(Exception):
    pass


def _kill_at(step):
    from transformers import TrainerCallback

    class KillAt(TrainerCallback):  # a run killed part way, after its checkpoint at an eval
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == step:
                raise _Killed(step)

    return lambda: [KillAt()]


@pytest.mark.parametrize("family", ["hf-best", "recipe"])
@pytest.mark.bench
def test_a_killed_run_resumes_from_its_checkpoint_and_equals_a_straight_run(tmp_path, family):
    import dataclasses

    mod = hb()
    from benchmarks._harness.budget import budget_setup, data_args
    from benchmarks._harness.lm import run_arm

    from hf_fasttrain.data.front import prepare_data

    setup = budget_setup(1, quick=True, base_steps=24)  # 24 steps, eval (and a checkpoint) every 2
    tokenizer, lm = prepare_data(data_args(setup))
    config = mod.start_config(family, 2e-3 if family == "hf-best" else 1.6e-2, setup.max_steps)
    arm = mod.arm_for(family, config, setup.max_steps)
    straight = run_arm(arm, 0, setup, tokenizer, lm, tmp_path / "straight")
    ckpt = tmp_path / "partial" / "run"
    with pytest.raises(_Killed):
        run_arm(dataclasses.replace(arm, callbacks=_kill_at(15)), 0, setup, tokenizer, lm, tmp_path / "w", checkpoint_dir=ckpt)
    assert [p.name for p in ckpt.iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-14"]
    resumed = run_arm(arm, 0, setup, tokenizer, lm, tmp_path / "w", checkpoint_dir=ckpt)
    assert resumed["resumed_from_step"] == 14 and not ckpt.exists()  # the folder goes once the run has finished
    assert [p["step"] for p in resumed["curve"]] == [p["step"] for p in straight["curve"]], (resumed["curve"], straight["curve"])
    assert [p["eval_loss"] for p in resumed["curve"]] == pytest.approx([p["eval_loss"] for p in straight["curve"]],
                                                                        abs=1e-6)


def _sigterm_at(step):
    import os
    import signal

    from transformers import TrainerCallback

    class SigtermAt(TrainerCallback):  # the signal a session's end or `kill` sends, in the middle of a step
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == step - 1:
                os.kill(os.getpid(), signal.SIGTERM)

    return lambda: [SigtermAt()]


@pytest.mark.bench
def test_a_baseline_run_stopped_by_sigterm_saves_the_step_it_reached_and_resumes_from_it(tmp_path):
    import dataclasses

    mod = hb()
    from benchmarks._harness.budget import budget_setup, data_args
    from benchmarks._harness.lm import run_arm

    from hf_fasttrain.callbacks import TrainingStopped
    from hf_fasttrain.data.front import prepare_data

    setup = budget_setup(1, quick=True, base_steps=24)  # 24 steps, eval (and a checkpoint) every 2
    tokenizer, lm = prepare_data(data_args(setup))
    arm = mod.arm_for("hf-best", mod.start_config("hf-best", 2e-3, setup.max_steps), setup.max_steps)
    straight = run_arm(arm, 0, setup, tokenizer, lm, tmp_path / "straight")
    ckpt = tmp_path / "partial" / "run"
    with pytest.raises(TrainingStopped) as stopped:  # the plain Trainer's step 15, between two evals
        run_arm(dataclasses.replace(arm, callbacks=_sigterm_at(15)), 0, setup, tokenizer, lm, tmp_path / "w",
                checkpoint_dir=ckpt)
    assert (stopped.value.step, stopped.value.code) == (15, 143)
    assert [p.name for p in ckpt.iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-15"]
    resumed = run_arm(arm, 0, setup, tokenizer, lm, tmp_path / "w", checkpoint_dir=ckpt)
    assert resumed["resumed_from_step"] == 15 and not ckpt.exists()
    assert [p["step"] for p in resumed["curve"]] == [p["step"] for p in straight["curve"]]
    assert [p["eval_loss"] for p in resumed["curve"]] == pytest.approx([p["eval_loss"] for p in straight["curve"]],
                                                                        abs=1e-6)


@pytest.mark.bench
def test_the_train_rows_loss_shows_a_run_that_memorised_repeated_data(tmp_path):
    mod = hb()
    from benchmarks._harness.budget import budget_setup, data_args
    from benchmarks._harness.lm import run_arm

    import datasets
    from hf_fasttrain.data.front import prepare_data

    setup = budget_setup(1, quick=True, base_steps=24)
    tokenizer, lm = prepare_data(data_args(setup))
    small = datasets.DatasetDict({"train": lm["train"].select(range(setup.batch_size)), "validation": lm["validation"]})
    arm = mod.arm_for("hf-best", mod.start_config("hf-best", 1e-2, setup.max_steps), setup.max_steps)
    r = run_arm(arm, 0, setup, tokenizer, small, tmp_path, train_rows=4)
    assert r["epochs"] == pytest.approx(setup.max_steps)  # one batch is the whole training set: an epoch a step
    assert r["final_train_loss"] < r["final_eval_loss"] - 1.0, r  # 24 passes over 8 rows: memorised


def test_a_per_group_family_carries_only_its_group_knobs_to_a_longer_budget():
    mod = hb()
    won = {**mod.start_config("hf-best", 2e-3, 1200), "emb_lr": 8.0, "norm_lr": 4.0, "wd_on": "matrices"}
    base_best = {**mod.start_config("hf-best", 4e-3, 4800), "schedule": "wsd-1-sqrt", "beta2": 0.99}
    base = {"searches": {"16x": {"hf-best": {"best": base_best, "loss": 2.9, "decisions": []}}}}
    start = mod.carried_groups(won, base, "16x", "hf-best+")
    assert start == {**base_best, "emb_lr": 8.0, "norm_lr": 4.0, "wd_on": "matrices"}  # hf-best's 16x winner + groups
    assert start["lr"] == 4e-3 and start["schedule"] == "wsd-1-sqrt"
    assert mod.carried_groups(won, base, "64x", "hf-best+") == won  # no base search there: the winner as it is


def test_a_budget_too_long_to_search_sweeps_only_the_peak_lr_from_the_shorter_budgets_winner(tmp_path, monkeypatch):
    mod = hb()
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    with pytest.raises(SystemExit, match="--transfer-from: 16: no finished search of hf-best, recipe there"):
        mod.transfer_starts(ledger, "16x", "64x", ["hf-best", "recipe"])
    winners = {"hf-best": {**mod.start_config("hf-best", 4e-3, 4800), "schedule": "wsd-1-sqrt", "beta2": 0.99},
               "recipe": {**mod.start_config("recipe", 1.6e-2, 4800), "beta2": 0.99}}
    ledger.data["searches"] = {"16x": {f: {"best": w, "loss": 3.0, "decisions": []} for f, w in winners.items()}}
    with pytest.raises(SystemExit, match="must be a shorter budget than --budget 16"):
        mod.transfer_starts(ledger, "16x", "16x", ["recipe"])
    starts = mod.transfer_starts(ledger, "16x", "64x", ["hf-best", "recipe"])
    assert starts == winners  # the weight-decay timescale is in units of the run: it carries over as is

    best_scale = {"hf-best": 0.0625, "recipe": 1.0}  # hf-best's best lr: three steps beyond the first grid's low edge

    def fake_run(job):
        rung, family, config, seed = job
        return {"rung": rung, "family": family, "config": config, "seed": seed, "cpu_seconds": 0.0,
                "final_eval_loss": 3.0 + abs(math.log2(config["lr_scale"] / best_scale[family])) * 0.1}

    import math

    monkeypatch.setattr(mod, "_run_one", fake_run)
    out = mod.search(ledger, "64x", starts, None, seeds=2, log=lambda m: None, transfer_from="16x")
    assert out["hf-best"]["best"] == {**winners["hf-best"], "lr_scale": 0.0625}
    assert out["recipe"]["best"] == winners["recipe"]
    scales = {f: sorted(r["config"]["lr_scale"] for r in ledger.data["runs"].values() if r["family"] == f and r["seed"] == 0)
              for f in starts}
    # hf-best walks down four steps (its edge: x1/16, where its best is); the recipe's x0.5 loses, so does x2: done
    assert scales == {"hf-best": [0.0625, 0.125, 0.25, 0.5, 1.0], "recipe": [0.5, 1.0, 2.0]}
    assert [(d["best_value"], d["accepted"]) for d in out["recipe"]["decisions"]] == [(0.5, False), (2.0, False)]
    summary = mod.summarise(ledger, "64x")
    assert summary["hf-best"]["transfer_from"] == "16x" and summary["hf-best"]["seeds"] == 2
    assert summary["hf-best"]["final_eval_loss"] == 3.0


def test_a_finished_sweep_that_asks_for_more_is_reported_as_running_until_it_ends(tmp_path, monkeypatch):
    """A sweep finished under fewer rounds (its best at the edge) is resumed by a longer one: while the new
    point runs, the budget's record is the search in progress (best so far), not the old winner."""
    import math

    mod = hb()
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    start = {**mod.start_config("recipe", 1.6e-2, 4800), "beta2": 0.99}
    seen = []

    def fake_run(job):
        rung, family, config, seed = job
        if config["lr_scale"] == 0.125:
            seen.append((dict(ledger.data["searches"].get("64x", {})), mod.summarise(ledger, "64x")["recipe"]))
        return {"rung": rung, "family": family, "config": config, "seed": seed, "cpu_seconds": 0.0,
                "final_eval_loss": 3.0 + abs(math.log2(config["lr_scale"] / 0.125)) * 0.1}

    monkeypatch.setattr(mod, "_run_one", fake_run)
    monkeypatch.setattr(mod, "TRANSFER_STEPS", 2)
    first = mod.search(ledger, "64x", {"recipe": start}, None, seeds=1, log=lambda m: None, transfer_from="16x")
    assert first["recipe"]["best"]["lr_scale"] == 0.25  # at the edge: two rounds were all it had
    assert mod.summarise(ledger, "64x")["recipe"]["complete"] is True
    monkeypatch.setattr(mod, "TRANSFER_STEPS", 3)
    again = mod.search(ledger, "64x", {"recipe": start}, None, seeds=1, log=lambda m: None, transfer_from="16x")
    (searches_then, summary_then), = seen
    assert "recipe" not in searches_then
    assert summary_then["complete"] is False and summary_then["best"]["lr_scale"] == 0.25
    assert again["recipe"]["best"]["lr_scale"] == 0.125
    summary = mod.summarise(ledger, "64x")["recipe"]
    assert summary["complete"] is True and summary["final_eval_loss"] == 3.0


def test_a_larger_model_starts_at_the_measured_laws_lr_and_is_named_by_its_shape():
    mod = hb()
    import dataclasses

    from benchmarks._harness.budget import budget_setup

    from hf_fasttrain.config.budget import predict_learning_rate

    assert (mod.rung_name(64), mod.rung_name(54, "3x192")) == ("64x", "54x-3x192")
    assert [mod.rung_multiple(r) for r in ("64x", "54x-3x192")] == [64, 54]
    setup = dataclasses.replace(budget_setup(54), **mod.MODELS["3x192"])
    assert mod.tokens_per_param(setup) == pytest.approx(54 * 300 * 2048 / 1_334_976)  # 24.9
    winner = {**mod.start_config("recipe", 1.6e-2, 4800), "beta2": 0.99, "lr_scale": 2.0}
    moved = mod.at_law_lr(winner, "recipe", setup)
    assert moved["lr"] == float(f"{predict_learning_rate('muon', 192, mod.tokens_per_param(setup)):.3g}")
    assert moved["lr_scale"] == 1.0 and moved["beta2"] == 0.99 and moved["wd_timescale"] == winner["wd_timescale"]
    assert mod.at_law_lr(winner, "hf-best", setup)["lr"] < moved["lr"]  # AdamW's law, not Muon's
    with pytest.raises(SystemExit, match="--model: 3x192: another model than the ladder's is not searched"):
        mod.main(["--model", "3x192", "--budget", "54", "--out", "/nonexistent"])
    with pytest.raises(SystemExit, match="--model: '4x256': one of 2x128, 3x192"):
        mod.main(["--model", "4x256", "--out", "/nonexistent"])


def test_the_report_lists_each_runs_training_rows_loss_and_its_gap(tmp_path):
    mod = hb()
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    ledger.data["runs"] = {
        "a": {"rung": "64x", "family": "recipe", "config": {"lr": 0.016, "schedule": "cosine10"}, "seed": 0,
              "final_eval_loss": 2.818, "final_train_loss": 2.5, "epochs": 11.9},
        "b": {"rung": "16x", "family": "recipe", "config": {"lr": 0.016}, "seed": 0, "final_eval_loss": 2.7},
    }
    assert mod.memorisation(ledger, "64x").splitlines()[-1] == \
        "| recipe | lr 0.016, schedule cosine10 | 0 | 11.90 | 2.818 | 2.500 | +0.318 |"
    assert mod.memorisation(ledger, "16x") == ""  # no run there measured it


def test_an_lr_sweep_still_running_takes_its_lowest_finished_run_as_the_best_so_far():
    """A transfer sweep keeps the lowest loss with no threshold, so before its batch is decided the best so far
    (what the budget ladder measures the recipe against) is the lowest finished run, not the start; a coordinate
    descent (with its noise threshold) keeps the start until it decides."""
    mod = hb()
    start = {"lr": 3.16e-3, "schedule": "wsd-1-sqrt", "beta2": 0.99, "lr_scale": 1.0}
    half, double = {**start, "lr_scale": 0.5}, {**start, "lr_scale": 2.0}

    def run(config, loss, seed=0):
        return {"rung": "54x-3x192", "family": "hf-best", "config": config, "seed": seed, "final_eval_loss": loss}

    data = {"runs": {"a": run(start, 2.518), "b": run(half, 2.501), "c": run(half, 2.495, seed=1)},
            "progress": {"54x-3x192": {"hf-best": {"decisions": [], "running": [half, double], "start": start,
                                                   "transfer_from": "16x"}}}}
    view = type("View", (), {"data": data})()
    s = mod.summarise(view, "54x-3x192")["hf-best"]
    assert (s["best"], s["final_eval_loss"], s["seeds"], s["complete"]) == (half, pytest.approx(2.498), 2, False)
    assert s["trying"] == {"knob": "lr_scale", "finished": {"0.5": 2.501, "2.0": None}, "from": 1.0, "from_loss": 2.518}
    assert "| hf-best | lr_scale | 1.0 (2.518) | 0.5: 2.501, 2.0: running | deciding |" in mod.markdown({"hf-best": s})
    # a higher finished run leaves the start as the best so far
    data["runs"]["b"]["final_eval_loss"] = data["runs"]["c"]["final_eval_loss"] = 2.6
    assert mod.summarise(view, "54x-3x192")["hf-best"]["best"] == start
    # without transfer_from (a coordinate descent still deciding) the start stays even where a trial is lower
    data["runs"]["b"]["final_eval_loss"] = data["runs"]["c"]["final_eval_loss"] = 2.4
    del data["progress"]["54x-3x192"]["hf-best"]["transfer_from"]
    assert mod.summarise(view, "54x-3x192")["hf-best"]["best"] == start


def test_the_corpus_that_does_not_repeat_is_its_own_budget_and_is_not_searched(tmp_path):
    mod = hb()
    assert [mod.rung_name(64, corpus="unique"), mod.rung_name(54, "3x192", "unique")] == ["64x-unique", "54x-3x192-unique"]
    assert mod.rung_multiple("64x-unique") == 64
    with pytest.raises(SystemExit, match="--corpus: unique: a corpus other than the ladder's is not searched"):
        mod.main(["--corpus", "unique", "--budget", "64", "--out", str(tmp_path)])
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    config = {**mod.start_config("recipe", 1.6e-2, 19200), "beta2": 0.99}
    ledger.data.update(
        runs={"k": {"rung": "64x-unique", "family": "recipe", "config": config, "seed": 0, "final_eval_loss": 3.1}},
        progress={"64x-unique": {"recipe": {"decisions": [], "running": [], "start": config, "transfer_from": "16x"}}},
        corpora={"64x-unique": {"corpus": "unique", "train_tokens": 41_000_000}},
        setups={"64x-unique": {"n_layer": 2, "n_embd": 128, "batch_size": 16, "block_size": 128}})
    text = mod.report_text(ledger)
    assert "## Budget 64x-unique" in text and "41.0M training tokens, so no row repeats" in text
    assert "Model: GPT-2" not in text  # the ladder's model: no larger-model note


def test_one_run_table_ranks_recipe_runs_by_tokens_to_hf_bests_loss(tmp_path):
    mod = hb()
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    start = {"lr": 0.016, "lr_scale": 1.0, "ema": True}
    ledger.data["progress"] = {"16x": {"recipe": {"start": start, "decisions": []}}}

    def run(config, seed, losses, final):
        curve = [{"step": i * 10, "tokens": i * 1000, "eval_loss": x} for i, x in enumerate(losses)]
        return {"rung": "16x", "family": "recipe", "config": config, "seed": seed, "curve": curve,
                "final_eval_loss": final, "max_steps": 40, "tokens_per_step": 100}  # a 4000-token budget

    ledger.data["runs"] = {
        "a": run(start, 0, [5.0, 4.0, 3.0, 2.0, 1.9], 1.9),             # reaches 3.0 at 2000 tokens: 0.5
        "b": run({**start, "lr_scale": 0.5}, 0, [5.0, 3.5, 2.5, 2.2, 2.0], 2.0),  # 3.0 at 1500 tokens: 0.375
        "c": {**run({**start, "ema": False}, 0, [5.0, 4.5, 4.0, 3.5, 3.2], 3.2), "diverged": {"step": 31}},  # never
        "d": run({**start, "lr_scale": 2.0, "ema": False}, 0, [5.0, 4.0, 3.6, 3.5, 3.5], 3.5),  # never
        "h": {**run(start, 0, [5.0, 3.0], 3.0), "family": "hf-best"},
    }
    rows = mod.one_run_ratios(ledger, "16x", {"hf-best": {"final_eval_loss": 3.0}})
    assert [(r["config"].get("lr_scale"), r["ratio"]) for r in rows][:2] == [(0.5, 0.375), (1.0, 0.5)]
    assert math.isinf(rows[2]["ratio"])
    text = mod.one_run_table(ledger, "16x", {"hf-best": {"final_eval_loss": 3.0}})
    assert "| lr_scale 0.5 | 0 | 0.375 | 2.000 |" in text and "| the start | 0 | 0.500 | 1.900 |" in text
    assert "| ema False | 0 | never (the guard stopped it at step 31) | 3.200 |" in text
    assert "| ema False, lr_scale 2.0 | 0 | never | 3.500 |" in text  # settings by name, whatever the run's order
    assert mod.one_run_table(ledger, "16x", {}) == ""  # no hf-best result there: no table


@pytest.mark.bench
def test_a_run_the_guard_gives_up_on_is_a_result_not_a_crash(tmp_path):
    """A candidate that diverges (the guard stops after its last rollback) is recorded: the curve up to the stop
    and, as the final loss, the loss of the last good state the guard restored; the search then decides on it."""
    import dataclasses

    mod = hb()
    from benchmarks._harness.budget import budget_setup, data_args
    from benchmarks._harness.lm import run_arm

    from hf_fasttrain.data.front import prepare_data

    setup = budget_setup(1, quick=True, base_steps=24)
    tokenizer, lm = prepare_data(data_args(setup))
    arm = mod.arm_for("recipe", mod.start_config("recipe", 1.6e-2, setup.max_steps), setup.max_steps)
    # every step after the blow-up is skipped, so the guard stops whatever the thread count does to the numbers
    wild = dataclasses.replace(arm, args={**arm.args, "learning_rate": 50.0, "max_grad_norm": 1e9,
                                          "guard_max_rollbacks": 0, "guard_snapshot_every": 2,
                                          "guard_grad_norm_ceiling": 100.0})
    r = run_arm(wild, 0, setup, tokenizer, lm, tmp_path)
    assert "DivergenceGuardCallback stopped" in r["diverged"]["message"]
    assert "The last good state" not in r["diverged"]["message"]  # no path of a folder that is gone
    assert r["curve"][-1]["step"] == r["diverged"]["step"] and math.isfinite(r["final_eval_loss"])
    assert r["final_eval_loss"] == r["curve"][-1]["eval_loss"]


def test_config_runs_more_seeds_of_one_setting_and_a_precision_check_keeps_its_reruns_apart(tmp_path, monkeypatch):
    """``--config``: seeds of one setting outside the search (the finished ones skipped); ``--ns-dtype`` reaches
    Muon's options of the recipe's runs only and is recorded; ``--precision-check`` keeps its reruns apart and
    the report sets each beside the run it repeats."""
    mod = hb()
    ran, seen = [], []

    def fake_run_arm(arm, seed, setup, tokenizer, lm, work, checkpoint_dir=None, train_rows=None):
        seen.append((arm.args.get("optimizer_kwargs"), checkpoint_dir))
        loss = 3.0 + 0.01 * seed + (0.004 if "ns_dtype" in (arm.args.get("optimizer_kwargs") or {}) else 0.0)
        curve = [{"step": 0, "tokens": 0, "eval_loss": 5.0}, {"step": 40, "tokens": 4000, "eval_loss": loss}]
        return {"seed": seed, "final_eval_loss": loss, "curve": curve}

    monkeypatch.setattr(mod, "run_arm", fake_run_arm)
    setup = type("S", (), {"max_steps": 40, "tokens_per_step": 100, "eval_rows": 4})
    monkeypatch.setattr(mod, "_SHARED", {"setup": setup, "data": (None, None), "work": str(tmp_path),
                                         "partial": str(tmp_path / "partial"), "ns_dtype": "float32"})
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    recipe = mod.start_config("recipe", 0.016, 40)
    ledger.data["runs"][mod.run_key("16x", "recipe", recipe, 0)] = {
        "rung": "16x", "family": "recipe", "config": recipe, "seed": 0, "final_eval_loss": 3.0,
        "max_steps": 40, "tokens_per_step": 100,
        "curve": [{"step": 0, "tokens": 0, "eval_loss": 5.0}, {"step": 40, "tokens": 4000, "eval_loss": 3.0}]}
    got = mod.run_config(ledger, "16x", "recipe", recipe, 3, None, log=ran.append)
    assert [r["seed"] for r in got] == [1, 2] and all(r["ns_dtype"] == "float32" for r in got)  # seed 0 was there
    assert seen[0][0]["ns_dtype"] == "float32" and seen[0][0]["betas"] == [0.9, 0.95]
    assert seen[0][1].name.endswith("-ns-float32")  # never resumes a checkpoint of the bf16 run
    assert "seed 1 ns float32: final eval loss 3.0140" in ran[0]
    # the precision check: seed 0 again at fp32, kept apart; the runs keep the bf16 one
    mod.run_config(ledger, "16x", "recipe", recipe, 1, None, log=ran.append, check="float32")
    key = mod.run_key("16x", "recipe", recipe, 0)
    assert ledger.data["runs"][key]["final_eval_loss"] == 3.0
    assert ledger.data["precision_check"][key + "|float32"]["final_eval_loss"] == pytest.approx(3.004)
    with pytest.raises(mod.UsageError, match="no finished run"):
        mod.run_config(ledger, "16x", "recipe", {**recipe, "lr": 0.008}, 1, None, check="float32")
    # hf-best and AdEMAMix have no Newton-Schulz iteration: nothing set, nothing recorded
    seen.clear()
    hf = mod._run_one(("16x", "hf-best", mod.start_config("hf-best", 4e-3, 40), 0))
    ade = mod._run_one(("16x", "recipe", {**recipe, "optimizer": "ademamix"}, 0))
    assert "ns_dtype" not in hf and "ns_dtype" not in ade and seen[0][0] is None
    assert "ns_dtype" not in seen[1][0]
    # by default the recipe's runs pin bf16 (every ladder run's), recorded as nothing special
    mod._SHARED["ns_dtype"] = mod.NS_DTYPE
    plain = mod._run_one(("16x", "recipe", {**recipe, "lr": 0.008}, 0))
    assert seen[-1][0]["ns_dtype"] == "bfloat16" and "ns_dtype" not in plain
    assert not seen[-1][1].name.endswith("-ns-bfloat16")
    mod._SHARED["ns_dtype"] = "float32"
    # the report: the seeds at fp32 named in the winner row, the one-run table and the precision table
    ledger.data["progress"] = {"16x": {"recipe": {"start": recipe, "decisions": []}}}
    summary = mod.summarise(ledger, "16x")
    assert summary["recipe"]["seeds"] == 3 and summary["recipe"]["seeds_ns_other"] == 2
    assert "| 3 (2 with Muon's Newton-Schulz in fp32) |" in mod.markdown(summary)
    target = {"hf-best": {"final_eval_loss": 3.5}}
    assert "| the start | 1 (Newton-Schulz in float32) | 0.755 | 3.014 |" in mod.one_run_table(ledger, "16x", target)
    assert "| the start | 0 | float32 | 3.000 / 3.004 | +0.004 | 0.750 / 0.752 |" in mod.precision_table(ledger, "16x", target)


def test_config_must_name_every_knob_of_one_family():
    mod = hb()
    recipe = mod.start_config("recipe", 0.016, 40)
    assert mod.parse_config(json.dumps(recipe), ["recipe"]) == recipe
    # any order in the JSON names the same run and lists its settings in one order (by name) in the report
    shuffled = json.dumps(dict(reversed(list(recipe.items()))))
    assert list(mod.parse_config(shuffled, ["recipe"])) == sorted(recipe)
    assert mod.run_key("4x", "recipe", mod.parse_config(shuffled, ["recipe"]), 0) == mod.run_key("4x", "recipe", recipe, 0)
    for text, families, message in [
            (json.dumps(recipe), ["recipe", "hf-best"], "--families: recipe,hf-best: --config runs one family"),
            ("{lr: 1}", ["recipe"], "--config: '{lr: 1}': not JSON"),
            ('{"lr": 1}', ["recipe"], "missing: beta2, ema, lr_scale, schedule, seq_len_warmup, wd_timescale"),
            (json.dumps({**recipe, "momentum": 0.9}), ["recipe"], "--config: momentum: not a knob of recipe")]:
        with pytest.raises(mod.UsageError) as e:
            mod.parse_config(text, families)
        assert message in str(e.value)


def test_a_stopped_search_starts_no_run_after_the_stop_and_its_rerun_ends_as_a_straight_one(tmp_path, monkeypatch):
    import concurrent.futures
    import signal

    from hf_fasttrain.callbacks import TrainingStopped

    mod = hb()
    monkeypatch.setattr(processes, "STOP", [])
    started, stop_at = [], {"n": 3}

    def fake_run(job):  # the 3rd run started is stopped by a signal (its checkpoint saved); the others finish
        rung, family, config, seed = job
        started.append(job)
        if len(started) == stop_at["n"]:
            raise TrainingStopped(signal.SIGTERM, 7)
        return {"rung": rung, "family": family, "config": config, "seed": seed, "cpu_seconds": 0.0,
                "final_eval_loss": 3.0 - 0.05 * (config["schedule"] == "wsd-1-sqrt") + 0.01 * config["lr_scale"]}

    monkeypatch.setattr(mod, "_run_one", fake_run)
    starts = {f: mod.start_config(f, 4e-3, 100) for f in mod.SEARCHED_BY_DEFAULT}
    ledger = mod.Ledger(tmp_path / "hf_best.json")
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # one worker: the order of the runs is fixed
        mod.search(ledger, "16x", starts, pool, seeds=2, log=lambda m: None)
    assert processes.STOP == [signal.SIGTERM]
    assert len(started) == 3 and len(ledger.data["runs"]) == 2  # the stopped run is not a result; none started after
    assert mod.run_key(*started[2]) not in ledger.data["runs"]
    assert "16x" not in ledger.data.get("searches", {})  # neither family's search is recorded as finished
    processes.STOP.clear()
    stop_at["n"] = 0
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        resumed = mod.search(mod.Ledger(tmp_path / "hf_best.json"), "16x", starts, pool, seeds=2, log=lambda m: None)
    assert started[3] == started[2]  # the rerun starts with the stopped run, then goes on
    straight = mod.search(mod.Ledger(tmp_path / "straight.json"), "16x", starts, None, seeds=2, log=lambda m: None)
    assert resumed == straight


def _run_until_sigterm(ready_dir: str, i: int) -> int:
    # a worker's run: waits for its stop as a trainer's step loop would, then raises what FastTrainer raises
    import pathlib
    import signal
    import time

    from hf_fasttrain.callbacks import TrainingStopped

    got = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    pathlib.Path(ready_dir, str(i)).touch()
    deadline = time.monotonic() + 30
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    if got:
        raise TrainingStopped(got[0], 40 + i)
    return i


def test_sigterm_to_the_search_reaches_each_worker_and_the_search_outlives_it(tmp_path, monkeypatch):
    import concurrent.futures
    import os
    import signal
    import time

    monkeypatch.setattr(processes, "STOP", [])
    before = signal.getsignal(signal.SIGTERM)
    with processes.worker_pool(2) as pool, processes.stops_forwarded(pool):  # the studies' pool, as hf_best opens it
        futures = {pool.submit(_run_until_sigterm, str(tmp_path), i): i for i in range(2)}
        deadline = time.monotonic() + 60
        while len(list(tmp_path.iterdir())) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # to the search's process only, as `kill <pid>` does
        got = list(processes.finished_results(futures, concurrent.futures.as_completed(list(futures))))
    assert got == [] and not futures and processes.STOP == [signal.SIGTERM]  # both runs stopped, neither is a result
    assert signal.getsignal(signal.SIGTERM) is before  # the handler is put back


_ORPHAN_SCRIPT = """
import os, pathlib, signal, sys, time
from benchmarks import hf_best
from benchmarks._harness import processes
from hf_fasttrain.callbacks import TrainingStopped
out = pathlib.Path(sys.argv[1])

def run_job(job):  # a run: waits for its stop as a trainer's step loop would, then raises what a trainer raises
    got = []
    signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    (out / f"ready{job}").write_text(str(os.getpid()))
    t0 = time.monotonic()
    while not got and time.monotonic() - t0 < 30:
        time.sleep(0.01)
    (out / f"{'term' if got else 'timeout'}{job}").touch()
    raise TrainingStopped(signal.SIGTERM, 7)

hf_best._run_job = run_job  # forked workers inherit it
with processes.worker_pool(2) as pool:  # the studies' pool, as hf_best opens it
    for i in range(2):
        pool.submit(hf_best._run_one, i)
    time.sleep(120)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.bench
def test_a_worker_whose_search_was_killed_is_told_to_stop(tmp_path):
    # SIGKILL to the search (no handler can run): its workers get SIGTERM, so a running run saves and stops
    import os
    import signal
    import subprocess
    import time

    from benchmarks._harness import subprocess_env

    search = subprocess.Popen([sys.executable, "-c", _ORPHAN_SCRIPT, str(tmp_path)], env=subprocess_env())
    try:
        deadline = time.monotonic() + 90
        while not ((tmp_path / "ready0").exists() and (tmp_path / "ready1").exists()):
            assert time.monotonic() < deadline and search.poll() is None, "the workers did not start"
            time.sleep(0.05)
        os.kill(search.pid, signal.SIGKILL)
        search.wait()
        deadline = time.monotonic() + 20
        while len([p for p in tmp_path.iterdir() if not p.name.startswith("ready")]) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if search.poll() is None:
            search.kill()
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("ready")) == ["term0", "term1"]
    workers = [int((tmp_path / f"ready{i}").read_text()) for i in range(2)]
    deadline = time.monotonic() + 20
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in workers)  # stopped, then gone: no orphan waits for work


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # an exited child of init not reaped yet is a zombie, not a worker
        return f.read().split(") ")[-1][0] != "Z"


def test_per_group_families_start_at_their_bases_winner_and_train_it_unchanged(tmp_path):
    mod = hb()
    from benchmarks._harness.ledger import Ledger

    steps = 300
    winner = {"lr": 2e-3, "schedule": "wsd-linear", "beta2": 0.999, "wd_timescale": 0.06, "lr_scale": 1.0,
              "optim": "adamw_torch"}
    curve = [{"step": 0, "tokens": 0, "eval_loss": 8.0}, {"step": 150, "tokens": 100, "eval_loss": 5.0},
             {"step": 300, "tokens": 200, "eval_loss": 4.5}]
    base_run = {"rung": "1x", "family": "hf-best", "config": winner, "seed": 0, "final_eval_loss": 4.5,
                "curve": curve, "max_steps": steps, "tokens_per_step": 200 / steps}
    base = {"runs": {mod.run_key("1x", "hf-best", winner, 0): base_run,
                     mod.run_key("1x", "hf-best", {**winner, "lr_scale": 2.0}, 0): {**base_run, "config": {}}},
            "searches": {"1x": {"hf-best": {"best": winner}}}}
    ledger = Ledger(tmp_path / "groups.json")
    start = mod.group_start(ledger, base, "1x", "hf-best+", 1e-3, steps)
    assert start == winner
    taken = ledger.data["runs"][mod.run_key("1x", "hf-best+", winner, 0)]
    assert (taken["family"], taken["final_eval_loss"], taken["imported_from"]) == (
        "hf-best+", 4.5, "hf-best's winner in hf_best.json")
    assert len(ledger.data["runs"]) == 1  # only the winner's runs
    # at the group defaults the arm is hf-best's own (the Trainer's AdamW); with a multiplier, the package's factory
    assert mod.arm_for("hf-best+", start, steps).optimizer is None
    assert mod.arm_for("hf-best+", start, steps).args == mod.arm_for("hf-best", winner, steps).args
    grouped = long_runs.with_knob(long_runs.with_knob(start, "emb_lr", 16.0), "wd_on", "matrices")
    arm = mod.arm_for("hf-best+", grouped, steps)
    assert arm.optimizer == ("adamw", {"lr_multipliers": {"embedding": 16.0}, "weight_decay_on": "matrices"})
    assert not arm.fast and arm.args == mod.arm_for("hf-best", winner, steps).args
    recipe = mod.start_config("recipe", 1.6e-2, steps)
    kwargs = mod.arm_for("recipe+groups", long_runs.with_knob(recipe, "norm_lr", 0.25), steps).args["optimizer_kwargs"]
    assert kwargs == {"betas": [0.9, 0.95], "lr_multipliers": {"norm": 0.25}}
    assert "lr_multipliers" not in mod.arm_for("recipe", recipe, steps).args["optimizer_kwargs"]
    with pytest.raises(ValueError, match="need the package's AdamW"):
        mod.arm_for("hf-best+", {**grouped, "optim": "schedule_free_adamw"}, steps)
    # no finished search in the base: the base's start (a smoke run)
    assert mod.group_start(ledger, {"runs": {}}, "4x", "recipe+groups", 1.6e-2, steps) == mod.start_config(
        "recipe", 1.6e-2, steps)


def test_the_recipes_tokens_to_each_baselines_loss(tmp_path):
    mod = hb()
    from benchmarks._harness.ledger import Ledger

    ledger = Ledger(tmp_path / "groups.json")
    start = {"lr": 2e-3, "lr_scale": 1.0}
    plus = {**start, "emb_lr": 16.0}
    recipe = {"lr": 1.6e-2, "lr_scale": 1.0}

    def run(family, config, seed, losses, imported=False):
        curve = [{"step": i, "tokens": 100 * i, "eval_loss": x} for i, x in enumerate(losses)]
        r = {"rung": "1x", "family": family, "config": config, "seed": seed, "final_eval_loss": losses[-1],
             "curve": curve, "max_steps": 4, "tokens_per_step": 100}
        if imported:
            r["imported_from"] = "base"
        ledger.data["runs"][mod.run_key("1x", family, config, seed)] = r

    run("hf-best+", start, 0, [8, 6, 5, 4.6, 4.5], imported=True)
    run("hf-best+", start, 1, [8, 6, 5, 4.6, 4.7], imported=True)
    run("hf-best+", plus, 0, [8, 5, 4.5, 4.3, 4.2])
    run("recipe+groups", recipe, 0, [8, 4.6, 4.2, 4.0, 3.9], imported=True)
    run("recipe+groups", recipe, 1, [8, 4.4, 4.3, 4.0, 3.9], imported=True)
    summary = {"hf-best+": {"best": plus, "final_eval_loss": 4.2}}
    got = mod.group_ratios(ledger, "1x", summary)
    assert got["baselines"] == {"hf-best": 4.6, "hf-best+": 4.2}
    row = got["rows"]["recipe (its searched winner)"]
    # of 400 tokens: seed 0 reaches 4.6 at its first eval (100), 4.2 at its second (200); seed 1 reaches 4.6 at
    # 100 x 3.4/3.6 (between 8 and 4.4) and 4.2 at 200 + 100 x 0.1/0.3 (between 4.3 and 4.0)
    assert row["to"]["hf-best"]["per_seed"] == pytest.approx([0.25, 100 * 3.4 / 3.6 / 400])
    assert row["to"]["hf-best+"]["per_seed"] == pytest.approx([0.5, (200 + 100 / 3) / 400])
    plus_row = got["rows"]["hf-best+ (AdamW with per-group lrs)"]  # an AdamW user's own gain
    # seed 0 reaches 4.6 between 5 (100 tokens) and 4.5 (200): at 180 of 400
    assert plus_row["seeds"] == [0] and plus_row["to"] == {"hf-best": {"per_seed": [pytest.approx(0.45)],
                                                                        "median": pytest.approx(0.45)}}
    table = mod.group_ratio_table(got)
    assert "| hf-best+ | 4.200 |" in table and "| recipe (its searched winner) | 3.900 | 2 |" in table
    assert "| hf-best+ (AdamW with per-group lrs) | 4.200 | 1 | 0.450 (0.450) | - |" in table
    # the budget ladder's recipe at its best lr (the headline's) too
    lad_run = {**ledger.data["runs"][mod.run_key("1x", "recipe+groups", recipe, 0)], "optimizer": "recipe", "lr": 1.6e-2}
    ladder = {"runs": {"a": lad_run, "b": {**lad_run, "lr": 8e-3, "final_eval_loss": 9.0}},
              "summary": {"1x": {"optimizers": {"recipe": {"best_lr": 1.6e-2}}}}}
    row = mod.group_ratios(ledger, "1x", summary, ladder)["rows"]["recipe (the budget ladder's, at its best lr)"]
    assert (row["final_eval_loss"], row["to"]["hf-best+"]["per_seed"]) == (3.9, [0.5])
    # carried to a budget without a start of its own: hf-best and the recipe's winner are the base ledger's
    carried = Ledger(tmp_path / "carried.json")
    carried.data["runs"] = {k: r for k, r in ledger.data["runs"].items() if r["family"] == "hf-best+"
                            and not r.get("imported_from")}
    base = {"searches": {"1x": {"hf-best": {"best": start}, "recipe": {"best": recipe}}},
            "runs": {k: {**r, "family": "hf-best" if r["family"] == "hf-best+" else "recipe"}
                     for k, r in ledger.data["runs"].items() if r.get("imported_from")}}
    got = mod.group_ratios(carried, "1x", summary, None, base)
    assert got["baselines"] == {"hf-best": 4.6, "hf-best+": 4.2}
    assert got["rows"]["recipe (its searched winner)"]["to"]["hf-best+"]["per_seed"] == pytest.approx(
        [0.5, (200 + 100 / 3) / 400])
    assert "recipe (the setting that reaches hf-best's loss soonest)" not in got["rows"]  # it is the winner here
    assert mod.group_ratios(carried, "1x", {}, None, base) == {}  # no per-group family: no table
    # a recipe setting that ends higher but reaches hf-best's loss sooner (the long-run summary's recipe) gets its row
    fast = {**recipe, "lr_scale": 0.5}
    for seed, losses in ((0, [8, 4.2, 4.15, 4.12, 4.1]), (1, [8, 4.4, 4.3, 4.2, 4.15])):
        curve = [{"step": i, "tokens": 100 * i, "eval_loss": x} for i, x in enumerate(losses)]
        base["runs"][f"fast{seed}"] = {"rung": "1x", "family": "recipe", "config": fast, "seed": seed, "curve": curve,
                                      "final_eval_loss": losses[-1], "max_steps": 4, "tokens_per_step": 100}
    row = mod.group_ratios(carried, "1x", summary, None, base)["rows"]["recipe (the setting that reaches hf-best's loss soonest)"]
    assert row["seeds"] == [0, 1] and row["final_eval_loss"] == pytest.approx(4.125)
    # 4.6 between 8 and the first eval (100 tokens): at 100 x 3.4/3.8 (seed 0), 100 x 3.4/3.6 (seed 1), sooner than
    # the winner's median; 4.2 at the first eval (seed 0) and the third (seed 1)
    assert row["to"]["hf-best"]["per_seed"] == pytest.approx([100 * 3.4 / 3.8 / 400, 100 * 3.4 / 3.6 / 400])
    assert row["to"]["hf-best+"]["per_seed"] == pytest.approx([0.25, 0.75])


def test_the_16x_per_group_winner_written_at_hf_bests_lr_trains_the_same_groups():
    """The study page writes hf-best+'s 16x winner (the 4x multipliers at 0.25x hf-best's peak lr, weight decay from
    the walk's timescale) as multipliers on hf-best's own lr: every group gets the same lr and weight decay."""
    mod = hb()
    from conftest import make_tiny_gpt2

    from hf_fasttrain.optim import create_optimizer

    data = json.loads((mod.RESULTS / "hf_best_groups.json").read_text())
    won = data["summary"]["16x"]["hf-best+"]
    assert won["complete"] and won["seeds"] == 2 and won["best"]["lr_scale"] == 0.25
    arm = mod.arm_for("hf-best+", won["best"], data["setups"]["16x"]["max_steps"])
    name, groups = arm.optimizer
    measured = create_optimizer(name, make_tiny_gpt2(64, 16), lr=arm.args["learning_rate"],
                                weight_decay=arm.args["weight_decay"], **groups)
    written = create_optimizer("adamw", make_tiny_gpt2(64, 16), lr=won["best"]["lr"], weight_decay=0.4,
                               lr_multipliers={"matrix": 0.25, "bias": 0.25, "embedding": 2}, weight_decay_on="matrices")

    def by_group(opt):
        return {g["lr_group"]: (g["lr"], g["weight_decay"]) for g in opt.param_groups}

    assert set(by_group(written)) == set(by_group(measured)) == {"embedding", "matrix", "norm", "bias"}
    for group, (lr, wd) in by_group(measured).items():
        assert by_group(written)[group] == (pytest.approx(lr), pytest.approx(wd)), group
    assert by_group(written)["matrix"] == (pytest.approx(1e-3), pytest.approx(0.4))  # the walk's 0.25x of 4e-3
    assert arm.args["weight_decay"] == pytest.approx(0.4)
