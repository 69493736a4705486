"""benchmarks/transfer_gain.py: the gain across width (the recipe against hf-best at the same tokens per
parameter): its run lengths, each arm's transfer rule, the token ratio's math, the summary, and a quick study."""

import json
import math

import pytest


def tg():
    from benchmarks import transfer_gain

    return transfer_gain


def test_every_width_trains_the_same_tokens_per_parameter():
    mod = tg()
    from benchmarks.transfer import _non_embedding

    assert [mod.steps_for(w, 0.1) for w in (128, 256, 512)] == [78, 309, 1232]
    for w in (128, 256, 512):  # within half a step of 0.1 x the width's non-embedding parameters
        assert abs(mod.steps_for(w, 0.1) * 512 - 0.1 * _non_embedding(w)) <= 256
    assert mod.steps_for(32, 0.001) == mod.EVALS  # at least one step per evaluation


def test_each_arm_carries_its_lr_by_its_own_rule():
    mod = tg()
    assert mod.carried_lr("recipe", 0.032, 512, 128, -0.58) == 0.032  # muP at no tokens exponent: the lr stays
    # 1232 / 78 times the tokens at width 512, the lr by that to the -0.5
    assert mod.carried_lr("recipe", 0.032, 512, 128, -0.58, -0.5, 0.1) == pytest.approx(0.032 * (1232 / 78) ** -0.5)
    assert mod.recipe_tokens_exponent() == pytest.approx((-0.42 - 0.62) / 2)
    assert mod.carried_lr("hf-best", 0.002, 512, 128, -0.5) == pytest.approx(0.001)  # 4x wider, 4^-0.5
    assert mod.carried_lr("hf-best", 0.002, 256, 128, -1.0) == pytest.approx(0.001)
    recipe = mod.gain_arm("recipe", 256, 0.032, 128)
    assert recipe.fast and recipe.args["optimizer"] == "muon" and recipe.args["learning_rate"] == 0.032
    assert recipe.args["optimizer_kwargs"] == {"parameterization": "mup", "base_width": 128}
    assert recipe.args["weight_averaging"] == "ema" and recipe.args["seq_len_warmup_min"] == 16
    hf = mod.gain_arm("hf-best", 256, 0.001, 128)
    assert not hf.fast and hf.args["lr_scheduler_type"] == "warmup_stable_decay" and hf.args["adam_beta2"] == 0.999
    with pytest.raises(SystemExit, match="unknown arm 'sgd'"):
        mod.gain_arm("sgd", 128, 1e-3, 128)


def test_hf_best_s_exponent_is_the_slope_of_standard_adamw_s_best_lr():
    mod = tg()
    widths = {str(w): {"best_lr": 0.004 * (w / 64) ** -0.75} for w in (64, 128, 512)}
    assert mod.hf_exponent({"summary": {"transfer": {"python": {"1": {"adamw": {"widths": widths}}}}}}) == \
        pytest.approx(-0.75)
    assert mod.hf_exponent({"summary": {}}) is None


def _run(arm, w, lr, losses, tokens_per_eval=100):
    curve = [{"step": i, "tokens": i * tokens_per_eval, "seconds": float(i), "eval_loss": x}
             for i, x in enumerate(losses)]
    return {"arm": arm, "width": w, "lr": lr, "steps": len(losses) - 1, "tokens": curve[-1]["tokens"],
            "curve": curve, "final_eval_loss": losses[-1]}


def test_summary_reads_the_token_ratio_and_the_walk_from_the_runs():
    mod = tg()
    runs = {"r1": _run("recipe", 32, 0.03, [8, 6, 5, 4]), "h1": _run("hf-best", 32, 0.002, [8, 7, 6, 5]),
            "r2": _run("recipe", 64, 0.03, [8, 6, 4, 3]), "h2": _run("hf-best", 64, 0.0014, [8, 7, 5.5, 4.5]),
            "r2a": _run("recipe", 64, 0.015, [8, 6, 4.5, 3.5]), "r2b": _run("recipe", 64, 0.06, [8, 6, 4, 2.9]),
            "h2a": _run("hf-best", 64, 0.0007, [8, 7, 6, 5]), "h2b": _run("hf-best", 64, 0.0028, [8, 7, 5, 4])}
    plan = {"widths": [32, 64], "tokens_per_param": 0.1, "hf_exponent": -0.5,
            "base_lrs": {"recipe": 0.03, "hf-best": 0.002},
            "carried": {"recipe": {"32": "r1", "64": "r2"}, "hf-best": {"32": "h1", "64": "h2"}}}
    s = mod.summarise({"runs": runs, "plan": plan})
    w32, w64 = s["widths"]["32"], s["widths"]["64"]
    # width 32: hf-best ends at 5 after 300 tokens; the recipe reaches 5 at 200 tokens (an evaluation)
    assert w32["target_eval_loss"] == 5 and w32["recipe_tokens_to_target"] == 200 and w32["tokens_ratio"] == 2 / 3
    # width 64: the recipe reaches 4.5 between 100 (6) and 200 (4): 175 tokens
    assert w64["recipe_tokens_to_target"] == pytest.approx(175) and w64["tokens_ratio"] == pytest.approx(175 / 300)
    assert s["ratio_change_smallest_to_widest"] == pytest.approx(175 / 300 - 2 / 3)
    assert list(w64["walk"]["recipe"]) == ["0.015", "0.03", "0.06"]  # by lr
    assert w64["carried_above_walk_best_pct"]["recipe"] == pytest.approx(100 * (3 / 2.9 - 1))
    assert w64["carried_above_walk_best_pct"]["hf-best"] == pytest.approx(100 * (4.5 / 4 - 1))
    # the walks' best runs: hf-best at 0.0028 ends at 4; the recipe at 0.06 reaches 4 at 200 tokens
    assert w64["walk_best"]["hf-best_lr"] == 0.0028 and w64["walk_best"]["tokens_ratio"] == pytest.approx(200 / 300)
    assert "walk" not in w32
    text = mod.tables(s)
    assert "| 64 | 300 | 0.0014 | 4.5000 | 0.03 | 3.0000 | 175 | 0.58x |" in text
    assert "| 64 | recipe | 0.015: 3.5000, 0.03: 3.0000, 0.06: 2.9000 | +3.45% |" in text


def test_a_walk_cut_short_says_which_lrs_did_not_run():
    mod = tg()
    runs = {"r1": _run("recipe", 32, 0.03, [8, 6, 5, 4]), "h1": _run("hf-best", 32, 0.002, [8, 7, 6, 5]),
            "r2": _run("recipe", 64, 0.03, [8, 6, 4, 3]), "h2": _run("hf-best", 64, 0.0014, [8, 7, 5.5, 4.5]),
            "r2a": _run("recipe", 64, 0.015, [8, 6, 4.5, 2.8]), "h2a": _run("hf-best", 64, 0.0007, [8, 7, 6, 5]),
            "h2b": _run("hf-best", 64, 0.0028, [8, 7, 5, 4])}
    plan = {"widths": [32, 64], "tokens_per_param": 0.1, "hf_exponent": -0.5,
            "base_lrs": {"recipe": 0.03, "hf-best": 0.002},
            "carried": {"recipe": {"32": "r1", "64": "r2"}, "hf-best": {"32": "h1", "64": "h2"}}}
    w64 = mod.summarise({"runs": runs, "plan": plan})["widths"]["64"]
    assert w64["walk_missing"] == {"recipe": ["0.06"], "hf-best": []}
    assert w64["carried_above_walk_best_pct"]["recipe"] == pytest.approx(100 * (3 / 2.8 - 1))
    assert "walk_best" not in w64  # no ratio between walks that did not both run
    assert "| 64 | recipe | 0.015: 2.8000, 0.03: 3.0000 (0.06: not run) | +7.14% |" in mod.tables(
        mod.summarise({"runs": runs, "plan": plan}))


def test_a_recipe_that_never_reaches_hf_best_s_loss_has_no_ratio():
    mod = tg()
    r = mod._ratio(_run("recipe", 32, 0.03, [8, 7, 6]), _run("hf-best", 32, 0.002, [8, 6, 5]))
    assert r["recipe_tokens_to_target"] is None and r["tokens_ratio"] is None


def test_bad_options_fail_in_one_line_before_training(tmp_path):
    mod = tg()
    for argv, msg in ((["--widths", "128"], "give at least two widths"),
                      (["--widths", "128,200"], "not a multiple of the head size"),
                      (["--widths", "a,b"], "not a comma-separated list"),
                      (["--tokens-per-param", "0"], "must be > 0")):
        with pytest.raises(SystemExit, match=msg):
            mod.main([*argv, "--out", str(tmp_path), "--hf-exponent", "-0.5"])
    with pytest.raises(SystemExit, match="--hf-exponent: not given"):  # no transfer.json beside it
        mod.main(["--out", str(tmp_path)])
    assert not (tmp_path / "transfer_gain.json").exists() or not json.loads(
        (tmp_path / "transfer_gain.json").read_text())["runs"]


@pytest.mark.bench
def test_quick_gain_study_is_resumable(tmp_path):
    mod = tg()
    argv = ["--widths", "32,64", "--tokens-per-param", "0.05", "--hf-exponent", "-0.5", "--max-extend", "0",
            "--out", str(tmp_path)]
    first = mod.main(argv)
    data = json.loads((tmp_path / "transfer_gain.json").read_text())
    runs = data["runs"]
    assert len(runs) == 2 * 3 + 2 + 2 * 2  # a 3-lr grid per arm, the carried runs, the walk
    for r in runs.values():  # every run trained
        assert r["curve"][-1]["eval_loss"] < r["curve"][0]["eval_loss"]
    assert set(first["widths"]) == {"32", "64"} and "walk" in first["widths"]["64"]
    assert first["widths"]["64"]["hf-best_lr"] == pytest.approx(first["base_lrs"]["hf-best"] * 2 ** -0.5)
    again = mod.main(argv)  # read back: the same summary, nothing trained
    assert again == first and len(json.loads((tmp_path / "transfer_gain.json").read_text())["runs"]) == len(runs)
    assert (tmp_path / "transfer_gain.png").stat().st_size > 0
    assert math.isfinite(first["widths"]["32"]["hf-best_final_eval_loss"])


def test_the_card_and_the_summary_quote_the_gain_study():
    """docs/techniques/transfer.md and docs/benchmarks.md quote results/transfer_gain.json's token ratios (two
    decimals) and their change from the smallest width to the widest."""
    from pathlib import Path

    root = Path(__file__).parents[1]
    s = json.loads((root / "benchmarks/results/transfer_gain.json").read_text())["summary"]
    rows = s["widths"]
    card = " ".join((root / "docs/techniques/transfer.md").read_text(encoding="utf-8").split())
    summary = (root / "docs/benchmarks.md").read_text(encoding="utf-8")
    r128, r256, r512 = (rows[w]["tokens_ratio"] for w in ("128", "256", "512"))
    assert (f"The recipe needs {r128:.2f}x hf-best's tokens to reach hf-best's final loss at width 128, "
            f"{r256:.2f}x at 256 and {r512:.2f}x at 512.") in card
    assert f"So the ratio moves {s['ratio_change_smallest_to_widest']:+.2f} from width 128 to 512" in card
    assert f"{s['tokens_per_param']:g} tokens per non-embedding parameter" in card
    assert f"width 128's {rows['128']['steps']} steps" in card
    assert (f"at {s['tokens_per_param']:g} tokens per parameter the recipe needs {r128:.2f}x hf-best's tokens at "
            f"width 128 and {r512:.2f}x at 512") in summary
