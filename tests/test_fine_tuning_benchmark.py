"""benchmarks/fine_tuning.py: its batching plans, verdicts and a smoke run."""

import json
import math

import datasets
import pytest

from benchmarks import fine_tuning as ft


def test_plans_hold_the_padded_batches_real_tokens_per_step():
    lengths = [10, 100, 20, 90, 30, 80, 40, 70, 50, 60, 15, 95, 25, 85, 35, 75] * 4
    train = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in lengths]})
    setup = ft.Setup(batch_size=4, max_length=100)
    plans, fills = ft.plans(train, setup)
    padded = plans["padded"].real_per_step
    assert padded == pytest.approx(4 * sum(lengths) / len(lengths))  # every example once, 4 a step
    assert plans["padded"].padding > 0.2
    for name in ("token_budget", "packed"):
        assert plans[name].real_per_step == pytest.approx(padded, rel=0.15)
        assert plans[name].padding < plans["padded"].padding
    assert fills["rows"] == 2 and fills["max_length"] == 100


@pytest.mark.parametrize("ratio, tokens, expected", [
    (0.5, 10.0, "helps"), (1.0, 10.0, "no measurable gain"), (1.2, 10.0, "does not help"),
    (math.inf, math.inf, "does not help (the median seed does not reach the target)"),
    (math.nan, 10.0, "n/a"),
])
def test_verdict(ratio, tokens, expected):
    assert ft.verdict({"tokens_ratio_vs_reference": ratio, "tokens_to_target": tokens}) == expected


@pytest.mark.bench
def test_quick_run_writes_the_table_and_resumes(tmp_path):
    args = ["--quick", "--seeds", "1", "--no-trl", "--lrs", "1e-3,4e-3", "--muon-lrs", "1.6e-2",
            "--out", str(tmp_path), "--cache", str(tmp_path / "bases")]
    record = ft.main(args)
    assert set(record["summary"]["arms"]) == {"hf-tuned", "+token-budget", "+packing", "+ema", "+wsd", "+guard",
                                              "muon@adamw-base", "hf-tuned@muon-base", "muon@muon-base", "best"}
    for run in record["runs"]:
        losses = [p["eval_loss"] for p in run["curve"]]
        assert losses[-1] < losses[0] and "cpu_seconds" in run["curve"][-1]
    saved = json.loads((tmp_path / "fine_tuning.json").read_text())
    assert saved["summary"]["target_eval_loss"] == record["summary"]["target_eval_loss"]
    again = ft.main(args + ["--no-train"])  # every run saved: nothing trains, the same table
    assert again["summary"] == record["summary"]
    assert (tmp_path / "fine_tuning.md").read_text().startswith("Command: `python -m benchmarks.fine_tuning --quick")
