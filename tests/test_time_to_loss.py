import json
import math

import pytest


def _load():
    from benchmarks import time_to_loss

    return time_to_loss


def test_crossing_interpolates_and_reports_never():
    ttl = _load()
    curve = [{"seconds": 0.0, "tokens": 0, "eval_loss": 8.0}, {"seconds": 10.0, "tokens": 100, "eval_loss": 6.0},
             {"seconds": 20.0, "tokens": 200, "eval_loss": 4.0}]
    assert ttl.crossing(curve, 5.0, "seconds") == pytest.approx(15.0)
    assert ttl.crossing(curve, 5.0, "tokens") == pytest.approx(150.0)
    assert ttl.crossing(curve, 6.0, "seconds") == pytest.approx(10.0)
    assert ttl.crossing(curve, 9.0, "seconds") == 0.0
    assert math.isinf(ttl.crossing(curve, 3.9, "seconds"))


def test_summary_ratios_against_the_reference():
    ttl = _load()

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


@pytest.mark.slow  # runs the benchmark (tiny GPT-2 training runs)
def test_quick_run_writes_json_table_and_png(tmp_path):
    ttl = _load()
    record = ttl.main(["--quick", "--seeds", "1", "--arms", "hf-tuned,fasttrain", "--out", str(tmp_path)])
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"time_to_loss.{ext}").exists()
    data = json.loads((tmp_path / "time_to_loss.json").read_text())
    arms = data["summary"]["arms"]
    assert set(arms) == {"hf-tuned", "fasttrain"}
    assert arms["hf-tuned"]["time_ratio_vs_reference"] == pytest.approx(1.0)
    for r in record["runs"]:
        losses = [p["eval_loss"] for p in r["curve"]]
        assert losses[-1] < losses[0] - 0.5  # every arm learned
        assert [p["step"] for p in r["curve"]] == [0, 6, 12, 18, 24]


@pytest.mark.slow  # runs the sweep benchmark
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
