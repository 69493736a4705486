import json
import math

import pytest


def _load():
    from benchmarks import time_to_loss

    return time_to_loss


def _lm():
    from benchmarks._harness import lm

    return lm


def test_crossing_interpolates_and_reports_never():
    ttl = _lm()
    curve = [{"seconds": 0.0, "tokens": 0, "eval_loss": 8.0}, {"seconds": 10.0, "tokens": 100, "eval_loss": 6.0},
             {"seconds": 20.0, "tokens": 200, "eval_loss": 4.0}]
    assert ttl.crossing(curve, 5.0, "seconds") == pytest.approx(15.0)
    assert ttl.crossing(curve, 5.0, "tokens") == pytest.approx(150.0)
    assert ttl.crossing(curve, 6.0, "seconds") == pytest.approx(10.0)
    assert ttl.crossing(curve, 9.0, "seconds") == 0.0
    assert math.isinf(ttl.crossing(curve, 3.9, "seconds"))


def test_summary_ratios_against_the_reference():
    ttl = _lm()

    def run(arm, final, t_end):
        return {"arm": arm, "final_eval_loss": final, "train_seconds": t_end,
                "curve": [{"seconds": 0.0, "tokens": 0, "eval_loss": 8.0},
                          {"seconds": t_end, "tokens": 1000, "eval_loss": final}]}

    runs = [run("hf-tuned", 4.0, 10.0), run("fast", 3.0, 10.0), run("slow", 5.0, 10.0)]
    s = ttl.summarise(runs, ["hf-tuned", "fast", "slow"])
    assert s["target_eval_loss"] == 4.0
    assert s["arms"]["hf-tuned"]["seconds_to_target"] == pytest.approx(10.0)
    assert s["arms"]["fast"]["seconds_to_target"] == pytest.approx(8.0)  # 8 -> 3 over 10 s crosses 4 at 8 s
    assert s["arms"]["fast"]["time_ratio_vs_reference"] == pytest.approx(0.8)
    assert math.isinf(s["arms"]["slow"]["seconds_to_target"]) and s["arms"]["slow"]["reached"] == 0


def test_guard_counts_come_from_the_last_log_that_holds_them():
    ttl = _lm()
    history = [{"loss": 5.0, "guard_skipped_spike": 0, "guard_rollbacks": 0, "step": 10},
               {"loss": 4.0, "guard_skipped_spike": 3, "guard_rollbacks": 1, "step": 20},
               {"eval_loss": 4.1, "step": 20}, {"train_runtime": 9.0, "step": 20}]
    assert ttl.guard_counts(history) == {"guard_skipped_spike": 3, "guard_rollbacks": 1}
    assert ttl.guard_counts([{"loss": 4.0, "step": 1}]) == {}


@pytest.mark.bench  # runs the benchmark (tiny GPT-2 training runs)
def test_quick_run_writes_json_table_and_png(tmp_path):
    ttl = _load()
    record = ttl.main(["--quick", "--seeds", "1", "--arms", "hf-tuned,hf-best+,fasttrain", "--out", str(tmp_path)])
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"time_to_loss.{ext}").exists()
    data = json.loads((tmp_path / "time_to_loss.json").read_text())
    arms = data["summary"]["arms"]
    assert set(arms) == {"hf-tuned", "hf-best+", "fasttrain"}
    assert arms["hf-tuned"]["time_ratio_vs_reference"] == pytest.approx(1.0)
    # the second table: every arm against hf-best+'s median final loss
    also = data["also"]
    assert also["reference"] == "hf-best+" and set(also["arms"]) == set(arms)
    assert also["target_eval_loss"] == pytest.approx(arms["hf-best+"]["final_eval_loss"])
    assert also["arms"]["hf-best+"]["tokens_ratio_vs_reference"] == pytest.approx(1.0)
    md = (tmp_path / "time_to_loss.md").read_text()
    assert "(median final eval loss of hf-tuned)" in md and "(median final eval loss of hf-best+)" in md
    for r in record["runs"]:
        losses = [p["eval_loss"] for p in r["curve"]]
        assert losses[-1] < losses[0] - 0.5  # every arm learned
        steps = [p["step"] for p in r["curve"]]
        if r["arm"] == "fasttrain":
            assert set(r["guard"]) == {"guard_skipped_nonfinite", "guard_skipped_spike", "guard_rollbacks"}
        if r["arm"] == "fasttrain":  # sequence-length warmup: more, shorter steps to the same token budget
            assert steps[:5] == [0, 6, 12, 18, 24] and steps[-1] > 24
        else:
            assert steps == [0, 6, 12, 18, 24]


@pytest.mark.bench  # runs the sweep benchmark
def test_optimizer_lr_sweep_grid_extends_at_the_edge(tmp_path):
    """--grid replaces the starting grid; a best lr at its edge adds one point a factor 2 beyond."""
    from benchmarks import optimizer_lr_sweep as sweep

    record = sweep.main(["--quick", "--optimizers", "lion", "--grid", "lion=1e-5,2e-5", "--max-extend", "1",
                         "--name", "sweep", "--out", str(tmp_path)])
    by_lr = record["summary"]["lion"]["final_eval_loss_by_lr"]
    # far too small lrs: the larger one is better, so the grid grows to 4e-5 and that wins
    assert sorted(by_lr) == [1e-5, 2e-5, 4e-5]
    assert by_lr[4e-5] < by_lr[2e-5] < by_lr[1e-5]
    assert record["summary"]["lion"]["best_lr"] == 4e-5 and record["summary"]["lion"]["best_at_edge"]
    assert record["sweep"] == {"lion": [1e-5, 2e-5]}
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"sweep.{ext}").exists()
    with pytest.raises(SystemExit, match="--grid"):
        sweep.main(["--quick", "--optimizers", "lion", "--grid", "lion=fast", "--out", str(tmp_path)])


@pytest.mark.bench
def test_saved_runs_are_skipped_on_rerun_and_redone_when_settings_change(tmp_path, capsys):
    ttl = _load()
    argv = ["--quick", "--seeds", "1", "--arms", "base+ema", "--out", str(tmp_path), "--name", "t"]
    first = ttl.main(argv)
    saved = tmp_path / "t_runs" / "base+ema-seed0.json"
    assert saved.exists()
    capsys.readouterr()
    again = ttl.main(argv)  # nothing trains: the saved run is read back
    assert "saved run, skipped" in capsys.readouterr().out
    assert again["runs"] == first["runs"]
    # a different setting is a different key: the saved run is not reused for it
    arm = ttl.ARMS["base+ema"]
    changed = ttl.dataclasses.replace(arm, args={**arm.args, "ema_decay": 0.5})
    setup = ttl.dataclasses.replace(ttl.QUICK)
    assert ttl.load_saved_run(saved, ttl.run_key(changed, 0, setup)) is None
    assert ttl.load_saved_run(saved, ttl.run_key(arm, 0, setup)) is not None
    assert ttl.run_key(arm, 0, ttl.dataclasses.replace(setup, corpus="prose")) != ttl.run_key(arm, 0, setup)


@pytest.mark.bench
def test_technique_overhead_smoke(tmp_path):
    from benchmarks import technique_overhead as mod

    record = mod.main(["--quick", "--rounds", "2", "--out", str(tmp_path)])
    assert set(record["rows"]) == set(mod.VARIANTS)
    assert record["rows"]["base"]["ratio_vs_base"] == 1.0
    assert all(len(v) == 2 and min(v) > 0 for v in record["times"].values())
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"technique_overhead.{ext}").exists()


def test_hf_best_arm_is_the_searched_winner_at_1x():
    """The headline's hf-best arm trains exactly what the 1x search (results/hf_best.json) kept."""
    ttl = _load()
    from benchmarks import hf_best

    ledger = hf_best.Ledger(hf_best.RESULTS / "hf_best.json")
    won = hf_best.summarise(ledger, "1x")["hf-best"]
    assert won["complete"] and won["seeds"] >= 2
    best = won["best"]
    setup = ttl.Setup()
    searched = hf_best.arm_for("hf-best", best, setup.max_steps).args
    mine = {k: v(setup) if callable(v) else v for k, v in ttl.ARMS["hf-best"].args.items()}
    assert mine["weight_decay"] == pytest.approx(searched.pop("weight_decay"))  # from its timescale lr x wd x steps
    assert {k: mine[k] for k in searched} == searched
    assert mine["lr_scheduler_kwargs"] == {"num_decay_steps": 60, "decay_type": "linear", "min_lr_ratio": 0.0}
    assert set(mine) == set(searched) | {"weight_decay"}  # nothing else set


def test_hf_best_plus_arm_is_the_group_searchs_winner_at_1x():
    """The headline's hf-best+ arm is hf-best's arm with the per-group options the 1x group search
    (results/hf_best_groups.json) kept, given as a Trainer user gives them (the package's AdamW)."""
    ttl = _load()
    from benchmarks import hf_best

    groups = json.loads((hf_best.RESULTS / "hf_best_groups.json").read_text())["summary"]["1x"]["hf-best+"]
    assert groups["complete"] and groups["seeds"] >= 2
    base = hf_best.summarise(hf_best.Ledger(hf_best.RESULTS / "hf_best.json"), "1x")["hf-best"]["best"]
    assert {k: v for k, v in groups["best"].items() if k not in hf_best.GROUP_KNOBS and k != "wd_on"} == base
    arm = ttl.ARMS["hf-best+"]
    assert not arm.fast and arm.args == ttl.ARMS["hf-best"].args
    assert arm.optimizer == ("adamw", hf_best.group_options(groups["best"])) == ("adamw", {"lr_multipliers": {"embedding": 16.0}})


def test_the_embedding_lr_ablation_arm_trains_the_embeddings_at_hf_bests_lr():
    """fasttrain-emb-2e-3 is the fasttrain arm with only the embeddings' lr moved, to hf-best's peak lr."""
    ttl = _load()
    from conftest import make_tiny_gpt2

    from hf_fasttrain.optim import create_optimizer

    arm, recipe = ttl.ARMS["fasttrain-emb-2e-3"].args, ttl.ARMS["fasttrain"].args
    assert {k: v for k, v in arm.items() if k != "optimizer_kwargs"} == recipe and "optimizer_kwargs" not in recipe
    opt = create_optimizer("muon", make_tiny_gpt2(64, 16), lr=arm["learning_rate"], weight_decay=arm["weight_decay"],
                           **arm["optimizer_kwargs"])
    lrs = {g["lr_group"]: g["lr"] for g in opt.param_groups}
    assert lrs["embedding"] == pytest.approx(ttl.ARMS["hf-best"].args["learning_rate"]) == pytest.approx(2e-3)
    assert {k: v for k, v in lrs.items() if k != "embedding"} == {k: arm["learning_rate"] for k in lrs if k != "embedding"}


def test_fasttrain_budget_arm_gets_the_1x_searchs_recipe_winner():
    """budget_aware at the headline's length picks what the 1x search kept for the recipe."""
    ttl = _load()
    from benchmarks import hf_best

    from hf_fasttrain.config.budget import budget_settings

    arm = ttl.ARMS["fasttrain-budget"]
    assert {k: v for k, v in arm.args.items() if k != "budget_aware"} == ttl.ARMS["fasttrain"].args
    ladder = json.loads((hf_best.RESULTS / "budget_ladder.json").read_text())
    chosen = budget_settings(ladder["summary"]["1x"]["tokens_per_param"], "muon")
    winner = hf_best.summarise(hf_best.Ledger(hf_best.RESULTS / "hf_best.json"), "1x")["recipe"]["best"]
    assert chosen["regime"] == "short"
    assert chosen["settings"]["adam_beta2"] == winner["beta2"]
    # and the embeddings' lr multiplier the recipe's per-group search kept at 1x (hf_best_groups.json)
    groups = json.loads((hf_best.RESULTS / "hf_best_groups.json").read_text())["summary"]["1x"]["recipe+groups"]["best"]
    assert chosen["settings"]["optimizer_kwargs"] == {"betas": [0.9, winner["beta2"]], "normuon_beta2": winner["normuon"],
                                                      "lr_multipliers": {"embedding": groups["emb_lr"]},
                                                      "cautious_wd": False, "adamw_lr_ratio": 1.0}


def test_the_ademamix_arm_trains_what_was_measured():
    """opt-ademamix ran with the paper's betas while the Trainer's adam_beta2 did not reach AdEMAMix; now that it
    does, the arm pins them, so hf-tuned's beta2 0.95 does not change what its committed results measured."""
    ttl = _load()
    from hf_fasttrain.optim import trainer_optimizer_kwargs
    from hf_fasttrain import FastTrainingArguments

    args = ttl.ARMS["opt-ademamix"].args
    assert args["adam_beta2"] == 0.95  # hf-tuned's
    fa = FastTrainingArguments(output_dir="x", optimizer="ademamix", learning_rate=args["learning_rate"],
                               adam_beta2=args["adam_beta2"], optimizer_kwargs=args["optimizer_kwargs"], report_to=[])
    assert trainer_optimizer_kwargs(fa, 300)["betas"] == [0.9, 0.999, 0.9999]


def test_the_restart_control_arm_is_the_saved_single_seed_run():
    """random restart's figure (best-of-4 against one seed, AdamW) is reproducible: the control arm trains
    what the committed results' single-seed arm trained, with best-of-4's own settings."""
    import json

    from benchmarks import time_to_loss as ttl

    saved = json.loads((ttl.RESULTS / "time_to_loss_restarts.json").read_text())["arms"]
    control, search = ttl.ARMS["adamw-single-seed"], ttl.ARMS["fasttrain-best-of-4"]
    assert control.fast and control.run is None and control.args == saved["fasttrain"]["args"]
    assert search.args == saved["fasttrain-best-of-4"]["args"] == control.args
    assert "optimizer" not in control.args  # AdamW: the Trainer's default optimizer, not the recipe's Muon


def test_report_rebuilds_the_tables_from_the_json_and_trains_nothing(tmp_path, monkeypatch):
    """--report reads the saved record alone (no data, no model) and writes the committed table, the median
    rule stated above each table."""
    import shutil

    from benchmarks import time_to_loss as ttl

    shutil.copy(ttl.RESULTS / "time_to_loss.json", tmp_path / "time_to_loss.json")
    monkeypatch.setattr(ttl, "prepare_data", lambda *a, **k: pytest.fail("--report prepared data"))
    monkeypatch.setattr(ttl, "run_arm", lambda *a, **k: pytest.fail("--report trained"))
    ttl.main(["--report", "--out", str(tmp_path)])
    assert (tmp_path / "time_to_loss.md").read_text() == (ttl.RESULTS / "time_to_loss.md").read_text()
    assert (tmp_path / "time_to_loss.md").read_text().count("a seed that never reaches the target counting as never") == 2
    with pytest.raises(ttl.UsageError):
        ttl.main(["--report", "--out", str(tmp_path / "none")])
