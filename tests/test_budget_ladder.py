"""The budget ladder (``python -m benchmarks.ladder budget``, benchmarks/ladder.py): lr grids, the budget summary and
trend arithmetic, the rows against hf-best, and a resumable smoke run through both of its commands."""

import json
import math

import pytest

from benchmarks._harness import lm, long_runs


def _load():
    from benchmarks import ladder

    return ladder


def test_budget_setup_spans_the_run():
    bl = _load()
    for multiple, steps, every in [(1, 300, 25), (4, 1200, 100), (16, 4800, 400)]:
        s = bl.budget_setup(multiple)
        assert (s.max_steps, s.eval_steps, s.tokens_per_step) == (steps, every, 2048)
    assert bl.budget_setup(1) == bl.Setup()  # 1x is the time-to-loss setup itself (its runs are imported)
    # the schedules are fractions of the run, so each budget is a complete run
    assert bl.ARMS["hf-tuned"].args["warmup_steps"] == 0.02
    assert bl.ARMS["fasttrain"].args["seq_len_warmup_fraction"] == 0.3


def test_centred_grid_and_names():
    bl = _load()
    assert bl.centred_grid(2e-3) == [1e-3, 2e-3, 4e-3]
    assert (bl.rung_name(4), bl.rung_name(16, "unique")) == ("4x", "16x-unique")
    assert bl.arm_for("recipe", 8e-3).args["learning_rate"] == 8e-3
    assert bl.arm_for("recipe", 8e-3).args["optimizer"] == "muon"
    assert bl.arm_for("adamw", 1e-3).fast is False


def test_phase_order_keeps_what_matters_first():
    bl = _load()
    assert bl.phase_order(["1x", "4x"], ["4x-unique"], seeds=2) == [
        ("1x", 0, "all"), ("4x", 0, "all"),           # every budget's sweep, seed 0
        ("1x", 1, "best"), ("4x", 1, "best"),         # the second seed where it decides the ratio
        ("4x-unique", 0, "all"), ("4x-unique", 1, "all"),
        ("1x", 1, "rest"), ("4x", 1, "rest")]         # the second seed at the other lrs last
    assert bl.phase_order(["1x"], [], seeds=1) == [("1x", 0, "all")]


def _run(opt, lr, seed, losses, rung="4x", step_tokens=100):
    curve = [{"step": i, "tokens": i * step_tokens, "seconds": float(i), "eval_loss": v} for i, v in enumerate(losses)]
    return {"rung": rung, "optimizer": opt, "lr": lr, "seed": seed, "curve": curve, "final_eval_loss": losses[-1],
            "max_steps": len(losses) - 1, "tokens_per_step": step_tokens}


def test_summary_ratio_and_trend():
    bl = _load()
    runs = [_run("adamw", 1e-3, 0, [8, 6, 5, 4.5, 4.0]), _run("adamw", 2e-3, 0, [8, 6, 5, 4.8, 4.6]),
            _run("recipe", 1e-2, 0, [8, 5, 4.5, 4.0, 3.8]),  # reaches 4.0 at step 3: 300 of 400 tokens
            _run("adamw", 1e-3, 0, [8, 6, 5, 4.5, 4.0], rung="16x"),
            _run("recipe", 1e-2, 0, [8, 4.5, 4.0, 3.9, 3.8], rung="16x")]  # at step 2: 200 of 400
    s4 = bl.summarise_budget(runs, "4x", n_params=100)
    assert s4["tokens"] == 400 and s4["tokens_per_param"] == 4.0
    assert s4["optimizers"]["adamw"]["best_lr"] == 1e-3 and s4["target_eval_loss"] == 4.0
    assert s4["optimizers"]["recipe"]["token_ratio_vs_adamw"] == pytest.approx(0.75)
    # a second recipe lr ends worse (3.9) but reaches 4.0 sooner (step 1): the fastest lr is reported beside the best
    s4b = bl.summarise_budget(runs + [_run("recipe", 2e-2, 0, [8, 4.0, 3.95, 3.92, 3.9])], "4x", n_params=100)
    rec = s4b["optimizers"]["recipe"]
    assert rec["best_lr"] == 1e-2 and rec["token_ratio_vs_adamw"] == pytest.approx(0.75)
    assert rec["fastest_lr"] == 2e-2 and rec["fastest_token_ratio"] == pytest.approx(0.25)
    s16 = bl.summarise_budget(runs, "16x", n_params=25)
    assert s16["optimizers"]["recipe"]["token_ratio_vs_adamw"] == pytest.approx(0.5)
    s4.update(multiple=4, corpus="stdlib")
    s16.update(multiple=16, corpus="stdlib")
    tr = bl.budget_trend({"4x": s4, "16x": s16})
    # ratio 0.75 at 4 tokens/param, 0.5 at 16: slope log(0.5/0.75)/log(4) per decade, x(2/3) per 4x budget
    assert tr["budgets"] == 2
    assert tr["ratio_change_per_4x_budget"] == pytest.approx(0.5 / 0.75)
    assert tr["ratio_at_chinchilla"] == pytest.approx(0.75 * (20 / 4) ** (math.log(0.5 / 0.75) / math.log(4)))
    # the unique-corpus rows are not part of the trend
    tr2 = bl.budget_trend({"4x": s4, "16x": s16, "16x-unique": {**s16, "corpus": "unique"}})
    assert tr2["budgets"] == 2


@pytest.mark.bench
def test_smoke_run_is_resumable(tmp_path, monkeypatch):
    bl = _load()
    argv = ["--quick", "--out", str(tmp_path), "--budgets", "1,2", "--unique-budgets", "", "--seeds", "1",
            "--max-extend", "0"]
    result = bl.main(["budget", *argv])
    data = json.loads((tmp_path / "budget_ladder.json").read_text())
    # 2 lrs per optimizer at 1x; at 2x the 3 lrs around 1x's best
    assert sorted(k.rsplit("|", 2)[0] for k in data["runs"]) == sorted(["1x|adamw"] * 2 + ["1x|recipe"] * 2 +
                                                                      ["2x|adamw"] * 3 + ["2x|recipe"] * 3)
    best1 = result["summary"]["1x"]["optimizers"]["adamw"]["best_lr"]
    assert {r["lr"] for r in data["runs"].values() if r["rung"] == "2x" and r["optimizer"] == "adamw"} == \
        {best1 / 2, best1, best1 * 2}
    for r in data["runs"].values():
        assert r["curve"][-1]["eval_loss"] < r["curve"][0]["eval_loss"]  # every run learned
    assert (tmp_path / "budget_ladder.md").exists() and (tmp_path / "budget_ladder.png").exists()
    assert data["command"].startswith("python -m benchmarks.ladder budget --quick --out ")
    before = {k: r["final_eval_loss"] for k, r in data["runs"].items()}
    from benchmarks import budget_ladder

    monkeypatch.setattr(bl, "_run_one", lambda job: pytest.fail(f"reran {job}"))
    budget_ladder.main(argv)  # the old command is the same one: its rerun trains nothing new
    again = json.loads((tmp_path / "budget_ladder.json").read_text())
    assert {k: r["final_eval_loss"] for k, r in again["runs"].items()} == before
    assert again["command"].startswith("python -m benchmarks.budget_ladder --quick --out ")


@pytest.mark.parametrize("finals, target, expected", [
    ({1: 3.973, 4: 3.245, 16: 2.808}, 3.746, 4 ** ((3.973 - 3.746) / (3.973 - 3.245))),  # between 1x and 4x
    ({1: 3.973, 4: 3.245, 16: 2.808}, 3.093, 4 * 4 ** ((3.245 - 3.093) / (3.245 - 2.808))),  # between 4x and 16x
    ({1: 3.973, 4: 3.245}, 3.245, 4.0),  # exactly a run's loss
    ({1: 4.0, 4: 3.0}, 4.5, 4 ** -0.5),  # above every run: the line through the first two, extended
    ({4: 3.0}, 3.5, math.inf),  # one run: no line
    ({8: 3.031, 16: 2.808, 64: 2.818}, 2.705, math.inf),  # below every run, the loss no longer falling: not reached
    ({27: 2.429, 54: 2.446}, 2.501, 27.0),  # above every run, the shorter one lower: at most the shorter budget
    ({13: 2.70, 27: 2.429, 54: 2.446}, 2.501, 13 * (27 / 13) ** ((2.70 - 2.501) / (2.70 - 2.429))),  # the first crossing
])
def test_complete_run_budget_interpolates_in_log_budget(finals, target, expected):
    bl = _load()
    assert bl.complete_run_budget(finals, target) == pytest.approx(expected)


def test_complete_run_ratios_flag_extrapolation():
    bl = _load()
    summary = {f"{m}x": {"multiple": m, "corpus": "stdlib", "optimizers": {
        "adamw": {"final_eval_loss": a}, "recipe": {"final_eval_loss": r}}}
        for m, a, r in [(1, 4.701, 3.973), (4, 3.746, 3.245), (16, 3.093, 2.808)]}
    bl.add_complete_run_ratios(summary)
    rec = {k: s["optimizers"]["recipe"] for k, s in summary.items()}
    assert rec["4x"]["complete_run_ratio_vs_adamw"] == pytest.approx(0.385, abs=1e-3)
    assert rec["16x"]["complete_run_ratio_vs_adamw"] == pytest.approx(0.405, abs=1e-3)
    assert [rec[k]["complete_run_extrapolated_vs_adamw"] for k in ("1x", "4x", "16x")] == [True, False, False]


def test_trend_against_hf_best_fits_each_measure_on_its_own_points():
    bl = _load()
    summary = {"1x": {"tokens_per_param": 1.55}, "4x": {"tokens_per_param": 6.2}, "16x": {"tokens_per_param": 24.8}}
    rows = {"1x": {"recipe_token_ratio": 0.4, "recipe_complete_run_ratio": 0.2, "recipe_complete_run_extrapolated": True},
            "4x": {"recipe_token_ratio": 0.5, "recipe_complete_run_ratio": 0.4, "recipe_complete_run_extrapolated": False},
            "16x": {"recipe_token_ratio": 0.8, "recipe_complete_run_ratio": 0.6, "recipe_complete_run_extrapolated": False}}
    tr = bl.versus_hf_best_trend(rows, summary)
    assert tr["one_run"]["points"] == 3
    assert tr["complete_runs"]["points"] == 2  # the extrapolated 1x figure is left out
    assert tr["complete_runs"]["change_per_4x_budget"] == pytest.approx(1.5)  # 0.4 -> 0.6 over one 4x step
    text = bl.hf_best_markdown({}, tr)
    assert text == ""  # no rows, no section
    only_16x = {"16x": rows["16x"]}
    assert bl.versus_hf_best_trend(only_16x, summary) == {}  # one budget: no trend
    running = {**only_16x, "4x": {**rows["4x"], "search_complete": False}}
    assert bl.versus_hf_best_trend(running, summary) == {}  # a search still running is not a point


def test_a_budget_beyond_the_ladder_compares_the_recipes_winner_with_hf_bests():
    bl = _load()
    summary = {f"{m}x": {"multiple": m, "corpus": "stdlib", "tokens_per_param": tpp, "non_embedding_params": 400_000,
                         "optimizers": {"recipe": {"final_eval_loss": r}}}
               for m, tpp, r in [(4, 6.2, 3.245), (16, 24.8, 2.808)]}
    finals = {4: 3.245, 16: 2.808}
    curve = [{"tokens": 0, "eval_loss": 8.0}, {"tokens": 10_000_000, "eval_loss": 2.7},
             {"tokens": 40_000_000, "eval_loss": 2.5}]
    best = {"hf-best": {"lr": 4e-3}, "recipe": {"lr": 1.6e-2}}
    hf_best = {"setups": {"64x": {"max_steps": 19200, "batch_size": 16, "block_size": 128}},
               "runs": {"a": {"rung": "64x", "family": "recipe", "config": best["recipe"], "curve": curve},
                        "b": {"rung": "64x", "family": "recipe", "config": {"lr": 8e-3}, "curve": curve[:1]}}}
    families = {"hf-best": {"best": best["hf-best"], "final_eval_loss": 2.7, "transfer_from": "16x"},
                "recipe": {"best": best["recipe"], "final_eval_loss": 2.5, "transfer_from": "16x"}}
    row = _load().beyond_the_ladder("64x", families, summary, finals, hf_best)
    budget = 19200 * 2048
    assert row["tokens"] == budget and row["tokens_per_param"] == pytest.approx(budget / 400_000)
    assert row["long_horizon_token_ratio"] == pytest.approx(10_000_000 / budget)  # the curve reaches 2.7 there
    # between the 16x run (2.808) and the 64x winner (2.5), in log budget
    assert row["recipe_complete_run_ratio"] == pytest.approx(16 * 4 ** ((2.808 - 2.7) / (2.808 - 2.5)) / 64)
    assert not row["recipe_complete_run_extrapolated"] and row["recipe_token_ratio"] is None
    assert row["complete_runs_of"] == "the ladder's recipe" and row["complete_runs"] == {4: 3.245, 16: 2.808, 64: 2.5}
    rows = bl.versus_hf_best(summary, [], {**hf_best, "summary": {"64x": families}})
    assert rows["64x"] == row and "fastest_one_run" not in row  # no setting has two seeds there
    # the winner's settings also ran as complete runs at 16x (its source, at two lrs, the winner's decided by the
    # 16x search): the measure interpolates between those, one recipe, not the ladder's
    at_16x = {f"s{i}": {"rung": "16x", "family": "recipe", "config": {"lr": lr}, "seed": seed, "final_eval_loss": loss}
              for i, (lr, seed, loss) in enumerate([(1.6e-2, 0, 2.76), (1.6e-2, 1, 2.74), (8e-3, 0, 2.70)])}
    own = {**hf_best, "runs": {**hf_best["runs"], **at_16x}, "summary": {"16x": {"recipe": {"best": {"lr": 1.6e-2}}}}}
    mine = _load().beyond_the_ladder("64x", families, summary, finals, own)
    assert mine["complete_runs_of"] == "these settings" and mine["complete_runs"] == pytest.approx({16: 2.75, 64: 2.5})
    assert mine["recipe_complete_run_ratio"] == pytest.approx(16 * 4 ** ((2.75 - 2.7) / (2.75 - 2.5)) / 64)
    assert mine["complete_run_lrs"] == {16: 1.6e-2, 64: 1.6e-2}
    # hf-best's winner as a complete run at 16x too (its search's source): the line names the recipe's complete runs
    # with their lrs and hf-best's shorter run, as on a larger model
    hb16 = {"rung": "16x", "family": "hf-best", "config": best["hf-best"], "seed": 0, "final_eval_loss": 2.9}
    theirs = bl.versus_hf_best(summary, [], {**own, "runs": {**own["runs"], "hb": hb16},
                                             "summary": {**own["summary"], "64x": families}})["64x"]
    assert theirs["hf_best_complete_runs"] == {16: 2.9} and theirs["hf_best_shorter_run_lower"] is False
    assert ("At 64x, complete runs of the long-horizon recipe's settings (16x 2.75 at lr 0.016, 64x 2.5 at lr 0.016) "
            "give the complete-run ratio against hf-best's 64x loss (hf-best's winner as complete runs at shorter "
            "budgets: 16x 2.9 at lr 0.004; none ends under its 64x loss, 2.7).") in bl.hf_best_markdown({"64x": theirs})
    # without the 16x search's decision, the lr that ended lowest there
    assert long_runs.complete_runs_of({**own, "summary": {}}, {"lr": 2e-3}, "64x") == {16: (2.70, 8e-3)}
    # two seeds of another setting at this budget: the fastest inside one run, as at a searched budget
    faster = [{"tokens": 0, "eval_loss": 8.0}, {"tokens": 5_000_000, "eval_loss": 2.7}, {"tokens": 40_000_000,
                                                                                       "eval_loss": 2.55}]
    seeded = {**hf_best, "runs": {**hf_best["runs"], **{
        f"c{seed}": {"rung": "64x", "family": "recipe", "config": {"lr": 1.6e-2, "lr_scale": 0.125, "cautious_wd": True},
                     "seed": seed, "curve": faster, "final_eval_loss": 2.55} for seed in (0, 1)}}}
    fast = _load().beyond_the_ladder("64x", families, summary, finals, seeded)["fastest_one_run"]
    assert fast["seeds"] == 2 and fast["token_ratio"] == pytest.approx(5_000_000 / budget)
    assert "At 64x, fastest inside one run of the recipe settings with 2 or more seeds" in bl.hf_best_markdown(
        bl.versus_hf_best(summary, [], {**seeded, "summary": {"64x": families}}))
    text = bl.hf_best_markdown(rows)
    assert "| 64x (16x winners, lr swept) | n/a (not on the ladder) |" in text
    tr = bl.versus_hf_best_trend({**rows, "16x": {"recipe_token_ratio": 0.8, "recipe_complete_run_ratio": 0.6,
                                                  "recipe_complete_run_extrapolated": False}}, summary)
    assert tr["one_run"]["points"] == 2  # 64x's one-run figure is the winner's
    pts = bl.hf_best_points({**rows, "4x": {"search_complete": False, "recipe_token_ratio": 0.3}}, summary)
    # off the ladder: the searched recipe's line, never joined to the ladder recipe's points
    searched = row.get("fastest_one_run", {}).get("token_ratio", row["long_horizon_token_ratio"])
    assert pts == {"one_run": [], "complete_runs": [],
                   "searched_one_run": [(budget / 400_000, searched, False)],
                   "searched_complete_runs": [(budget / 400_000, row["recipe_complete_run_ratio"], False)]}
    on_ladder = {"search_complete": True, "tokens_per_param": 4.0, "recipe_token_ratio": 0.5,
                 "recipe_complete_run_ratio": 0.45, "recipe_complete_run_extrapolated": True,
                 "fastest_one_run": {"token_ratio": 0.4, "complete_run_ratio": 0.35, "complete_run_extrapolated": False}}
    assert bl.hf_best_points({"4x": on_ladder}, {}) == {
        "one_run": [(4.0, 0.5, False)], "complete_runs": [(4.0, 0.45, True)],
        "searched_one_run": [(4.0, 0.4, False)], "searched_complete_runs": [(4.0, 0.35, False)]}

    # the same budget on the corpus that does not repeat: one run only (no shorter complete runs there), its own
    # row, and neither a trend point nor a plot point beside the stdlib budgets
    unique = {**hf_best, "setups": {**hf_best["setups"], "64x-unique": hf_best["setups"]["64x"]},
              "runs": {**hf_best["runs"], **{k + "u": {**r, "rung": "64x-unique"} for k, r in hf_best["runs"].items()}},
              "summary": {"64x": families, "64x-unique": families}}
    both = bl.versus_hf_best(summary, [], unique)
    assert both["64x-unique"]["corpus"] == "unique" and both["64x-unique"]["recipe_complete_run_ratio"] is None
    assert both["64x-unique"]["long_horizon_token_ratio"] == row["long_horizon_token_ratio"]
    assert "| 64x-unique (16x winners, lr swept) (no repeats) | n/a (not on the ladder) | n/a |" in bl.hf_best_markdown(both)
    assert bl.hf_best_points(both, summary)["searched_one_run"] == [(budget / 400_000, searched, False)]

    # a larger model at its own budget: one run only (no shorter complete runs of that model), its own parameter
    # count, and outside the trend and the plot (another model)
    big = {"max_steps": 16200, "batch_size": 16, "block_size": 128, "n_layer": 3, "n_embd": 192, "n_head": 6}
    larger = {**hf_best, "setups": {**hf_best["setups"], "54x-3x192": big},
              "runs": {**hf_best["runs"], **{k + "l": {**r, "rung": "54x-3x192"} for k, r in hf_best["runs"].items()}},
              "summary": {"64x": families, "54x-3x192": families}}
    rows = bl.versus_hf_best(summary, [], larger)
    got = rows["54x-3x192"]
    n = lm.non_embedding_params(3, 192, "gpt2", 6)
    assert 1.3e6 < n < 1.4e6 and got["non_embedding_params"] == n and got["model"] == "3x192"
    assert got["tokens_per_param"] == pytest.approx(16200 * 2048 / n)
    assert got["recipe_complete_run_ratio"] is None and not got["recipe_complete_run_extrapolated"]
    assert got["long_horizon_token_ratio"] == pytest.approx(10_000_000 / (16200 * 2048))
    assert f"| 54x-3x192 (16x winners, lr swept) (GPT-2 3x192, {n / 1e6:.2f}M non-embedding parameters, " in \
        bl.hf_best_markdown(rows)
    with_16x = {**rows, "16x": {"recipe_token_ratio": 0.8, "recipe_complete_run_ratio": 0.6,
                                "recipe_complete_run_extrapolated": False}}
    assert bl.versus_hf_best_trend(with_16x, summary)["one_run"]["points"] == 2  # 16x and 64x, not 54x-3x192
    assert bl.hf_best_points(rows, summary)["searched_one_run"] == [(budget / 400_000, searched, False)]
    # a complete run of the winner's settings on the larger model at half its budget: the complete-run measure
    # interpolates between that and the winner (never the ladder's model's runs), and the row stays off the trend
    half = {"rung": "27x-3x192", "family": "recipe", "config": best["recipe"], "seed": 0, "final_eval_loss": 2.9}
    other_model = {"rung": "16x", "family": "recipe", "config": best["recipe"], "seed": 0, "final_eval_loss": 2.6}
    assert long_runs.complete_runs_of({**larger, "runs": {**larger["runs"], "h": half, "o": other_model}}, best["recipe"],
                               "54x-3x192") == {27: (2.9, 1.6e-2)}
    hb = {"rung": "54x-3x192", "family": "hf-best", "config": best["hf-best"], "seed": 0, "final_eval_loss": 2.7}
    with_half = bl.versus_hf_best(summary, [], {**larger, "runs": {**larger["runs"], "h": half, "o": other_model,
                                                                   "hb": hb}})
    assert with_half["54x-3x192"]["hf_best_multiples"] == [54]
    got = with_half["54x-3x192"]
    assert got["complete_runs_of"] == "these settings" and got["complete_runs"] == {27: 2.9, 54: 2.5}
    assert got["recipe_complete_run_ratio"] == pytest.approx(27 * 2 ** ((2.9 - 2.7) / (2.9 - 2.5)) / 54)
    assert not got["recipe_complete_run_extrapolated"]
    assert ("At 54x-3x192, complete runs of the long-horizon recipe's settings (27x 2.9 at lr 0.016, 54x 2.5 at lr "
            "0.016) give the "
            "complete-run ratio against hf-best's 54x loss (hf-best ran at: 54x;") in bl.hf_best_markdown(with_half)
    assert "hf_best_complete_runs" not in got
    # hf-best's winner as a complete run at half the budget too: ending above its full-length loss, it says so; a
    # lower one would make the ratio compare the recipe's best length with a worse one of hf-best's
    for loss, lower, says in ((2.8, False, "none ends under its 54x loss, 2.7)"),
                              (2.6, True, "one ends under its full-length loss")):
        hb_half = {**hb, "rung": "27x-3x192", "final_eval_loss": loss}
        hb_other = {**hb, "rung": "27x-3x192", "config": {**best["hf-best"], "beta2": 0.9}, "final_eval_loss": 1.0}
        both_half = bl.versus_hf_best(summary, [], {**larger, "runs": {**larger["runs"], "h": half, "hb": hb,
                                                                       "hh": hb_half, "ho": hb_other}})["54x-3x192"]
        assert both_half["hf_best_complete_runs"] == {27: loss} and both_half["hf_best_shorter_run_lower"] is lower
        assert both_half["hf_best_complete_run_lrs"] == {27: long_runs.peak_lr(best["hf-best"])}
        assert both_half["recipe_complete_run_ratio"] == got["recipe_complete_run_ratio"]  # the target stays its own
        text = bl.hf_best_markdown({"54x-3x192": both_half})
        assert (f"hf-best's winner as complete runs at shorter budgets: 27x {loss} at lr "
                f"{long_runs.peak_lr(best['hf-best']):g}; {says}") in text
    assert "complete runs of the long-horizon recipe's settings" not in bl.hf_best_markdown(rows)
    assert bl.versus_hf_best_trend({**with_half, **with_16x}, summary)["complete_runs"]["points"] == 2  # not 54x-3x192
    assert (budget / 400_000) in [p[0] for p in bl.hf_best_points(with_half, summary)["searched_complete_runs"]]
    assert len(bl.hf_best_points(with_half, summary)["searched_complete_runs"]) == 1


@pytest.mark.bench
def test_a_corpus_too_small_to_cover_the_budget_without_repeats_is_refused_before_training(monkeypatch):
    from benchmarks._harness import UsageError
    from benchmarks._harness import budget as bl
    from benchmarks._harness.lm import QUICK

    short = ["def f(x):\n    return x + 1\n" * 20]
    monkeypatch.setattr(bl, "extra_python_sources", lambda min_chars, packages=bl.SOURCE_PACKAGES: short)
    tokenizer, lm = bl.prepare_data(bl.data_args(QUICK))
    have = len(lm["train"]) * QUICK.block_size
    with pytest.raises(UsageError, match=r"--corpus unique: the installed packages' Python sources \(transformers, "
                                         r"torch, .*\) give [0-9.]+M tokens, 1.0M needed for this budget"):
        bl.unique_corpus_data(QUICK, 1_000_000)
    # enough: the stdlib rows come first, unchanged, then the sources' rows
    _, grown = bl.unique_corpus_data(QUICK, have + 2 * QUICK.block_size)
    assert len(grown["train"]) > len(lm["train"])
    assert grown["train"][0]["input_ids"] == lm["train"][0]["input_ids"]
    assert grown["validation"]["input_ids"] == lm["validation"]["input_ids"]
    # a longer budget reads further down the list: the earlier packages keep their place
    assert bl.SOURCE_PACKAGES[:7] == ("transformers", "torch", "datasets", "numpy", "pandas", "pyarrow", "accelerate")


def test_the_fastest_setting_inside_one_run_needs_two_seeds_and_is_shown_beside_the_winner():
    bl = _load()

    def run(config, seed, at_3, final, ns=None):  # a curve that crosses 3.0 at ``at_3`` of a 1000-token budget
        curve = [{"tokens": 0, "eval_loss": 5.0}, {"tokens": at_3, "eval_loss": 3.0}, {"tokens": 1000, "eval_loss": final}]
        return {"rung": "16x", "family": "recipe", "config": config, "seed": seed, "curve": curve,
                "final_eval_loss": final, **({"ns_dtype": ns} if ns else {})}

    winner, fast, once = {"lr": 1.0}, {"lr": 0.5, "cautious_wd": True}, {"lr": 0.25}
    runs = [run(winner, 0, 700, 2.7), run(winner, 1, 650, 2.8), run(fast, 0, 500, 2.72),
            run(fast, 1, 400, 2.70, ns="float32"), run(once, 0, 100, 2.9)]  # once: fastest, but one seed only
    hb = {"runs": {str(i): r for i, r in enumerate(runs)}}
    got = long_runs.fastest_one_run(hb, "16x", 3.0, 1000)
    assert got["config"] == fast and got["seeds"] == 2 and got["ns_dtype_other"] == 1
    assert got["token_ratio"] == pytest.approx(0.45) and got["token_ratios"] == pytest.approx([0.4, 0.5])
    assert got["eval_loss"] == pytest.approx(2.71)
    assert long_runs.fastest_one_run(hb, "64x", 3.0, 1000) is None
    row = {"recipe_token_ratio": 0.7, "recipe_complete_run_ratio": 0.6, "recipe_complete_run_extrapolated": False,
           "target_eval_loss": 3.0, "hf_tuned_eval_loss": 3.1, "long_horizon_recipe": winner,
           "long_horizon_token_ratio": 0.675, "long_horizon_eval_loss": 2.75, "fastest_one_run": got}
    text = bl.hf_best_markdown({"16x": row})
    assert ("At 16x, fastest inside one run of the recipe settings with 2 or more seeds: the long-horizon recipe "
            "with lr 0.5, cautious_wd True, **0.45** (median of 2 seeds (1 with Muon's Newton-Schulz in fp32): "
            "0.4, 0.5), final loss 2.71 (median).") in text
    assert "fastest inside one run" not in bl.hf_best_markdown({"16x": {**row, "fastest_one_run": {**got, "config": winner}}})
    assert "complete_run_ratio" not in got and "By complete runs" not in text  # no complete runs elsewhere yet

    # the same settings as complete runs at shorter budgets: the complete-run measure for them, in log budget
    # between the two that bracket the target; runs of other settings, corpora or models are not read
    shorter = [{**run(fast, 0, 900, 3.1), "rung": "8x"}, {**run(fast, 0, 900, 3.6), "rung": "4x"},
               {**run(fast, 1, 900, 3.5), "rung": "4x"}, {**run(winner, 0, 900, 2.0), "rung": "8x"},
               {**run(fast, 0, 900, 1.0), "rung": "8x-unique"}]
    hb2 = {"runs": {str(i): r for i, r in enumerate(runs + shorter)}}
    got2 = long_runs.fastest_one_run(hb2, "16x", 3.0, 1000)
    assert got2["complete_runs"] == pytest.approx({4: 3.55, 8: 3.1, 16: 2.71})
    assert got2["complete_run_ratio"] == pytest.approx(8 * 2 ** ((3.1 - 3.0) / (3.1 - 2.71)) / 16)
    assert not got2["complete_run_extrapolated"]
    text2 = bl.hf_best_markdown({"16x": {**row, "fastest_one_run": got2}})
    assert (f"By complete runs of these settings (4x 3.55, 8x 3.1, 16x 2.71): **{got2['complete_run_ratio']:.3g}** "
            "of the budget.") in text2
    assert "complete_run_lrs" not in got2  # every budget ran at the same peak lr

    # a longer budget ran the same settings at other peak lrs (lr x lr_scale): each budget counts at the lr that
    # ended lowest there (the median of its seeds), and the text says which
    longer = [{**run({**fast, "lr_scale": 0.25}, 0, 900, 2.5), "rung": "64x"},
              {**run({**fast, "lr_scale": 0.25}, 1, 900, 2.6), "rung": "64x"},
              {**run({**fast, "lr_scale": 0.5}, 0, 900, 2.52), "rung": "64x"},
              {**run({**fast, "lr_scale": 2.0}, 0, 900, 2.3), "rung": "8x-unique"}]
    hb3 = {"runs": {str(i): r for i, r in enumerate(runs + shorter + longer)}}
    got3 = long_runs.fastest_one_run(hb3, "16x", 3.0, 1000)
    assert got3["complete_runs"] == pytest.approx({4: 3.55, 8: 3.1, 16: 2.71, 64: 2.52})
    assert got3["complete_run_lrs"] == {4: 0.5, 8: 0.5, 16: 0.5, 64: 0.25}
    assert got3["complete_run_ratio"] == pytest.approx(got2["complete_run_ratio"])  # 2.71 still brackets 3.0 with 8x
    text3 = bl.hf_best_markdown({"16x": {**row, "fastest_one_run": got3}})
    assert ("By complete runs of these settings (4x 3.55 at lr 0.5, 8x 3.1 at lr 0.5, 16x 2.71 at lr 0.5, 64x 2.52 "
            "at lr 0.25, each budget at its best lr run): ") in text3
    assert long_runs.peak_lr({"lr": 0.016, "lr_scale": 0.125}) == 0.002 and long_runs.peak_lr({"lr": 0.004}) == 0.004
