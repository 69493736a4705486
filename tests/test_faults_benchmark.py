"""Smoke test of benchmarks/faults.py on a short run: the table's claims hold on two injections."""

import json
import math

import pytest


def _load():
    from benchmarks import faults

    return faults


@pytest.mark.bench
def test_faults_benchmark_short_run(tmp_path):
    faults = _load()
    argv = ["--steps", "90", "--at", "70", "--injections", "none", "nan_loss", "--setups", "fasttrainer", "bare",
            "--no-advice", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")]
    result = faults.main(argv)
    runs = {(r["setup"], r["injection"]): r for r in result["runs"]}
    assert runs["fasttrainer", "nan_loss"]["survived"] and runs["fasttrainer", "nan_loss"]["actions"] == ["skip@70"]
    assert runs["fasttrainer", "nan_loss"]["disk"]["nonfinite_tensors"] == 0
    assert runs["fasttrainer", "none"]["guard"]["events"] == []  # no false alarm on the clean run
    bare = runs["bare", "nan_loss"]
    assert not bare["survived"] and math.isnan(bare["eval_loss"]) and bare["disk"]["nonfinite_tensors"] > 0
    assert bare["disk"]["files"] == 8  # checkpoints 25, 50, 75 and the last step, 90: model + optimizer each
    # a skipped NaN step leaves the run where the clean one is (to float noise of the skipped batch)
    assert runs["fasttrainer", "nan_loss"]["eval_loss"] == pytest.approx(runs["fasttrainer", "none"]["eval_loss"], abs=0.05)
    saved = json.loads((tmp_path / "out" / "faults.json").read_text())
    assert len(saved["runs"]) == 4 and (tmp_path / "out" / "faults.png").stat().st_size > 0
    assert "| NaN loss at step 70 | bare | no (NaN weights) |" in (tmp_path / "out" / "faults.md").read_text()
    # rerun: every run is read back, none trained again
    again = faults.main(argv)
    assert [r["cpu_seconds"] for r in again["runs"]] == [r["cpu_seconds"] for r in result["runs"]]
    # a later run for a weight-average setup adds its rows to the table: NaN written into the weights after an
    # update, with EMA: the guard rolls the average back with them, the final model is the (finite) average
    more = faults.main(["--steps", "90", "--at", "70", "--injections", "nan_weight", "--setups", "fasttrainer+ema",
                        "--no-advice", "--work", str(tmp_path / "work"), "--out", str(tmp_path / "out")])
    assert len(more["runs"]) == 5
    ema = next(r for r in more["runs"] if r["setup"] == "fasttrainer+ema")
    assert ema["survived"] and ema["final_is_average"] is True and ema["guard"]["rollbacks"] >= 1
    assert ema["disk"]["nonfinite_tensors"] == 0 and ema["disk"]["files"] == 12  # + weight_average.pt each
