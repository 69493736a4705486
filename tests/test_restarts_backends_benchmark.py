"""benchmarks/restarts_backends.py on its quick setup: the same search on the local and the Ray backend (a local
Ray cluster on 127.0.0.1, started and stopped by the ``hf-fasttrain restarts`` process) picks the same winner with
the same losses, and the committed results' rows and keys are written."""

import importlib.util
import json
import math

import pytest

from benchmarks import _harness
from benchmarks import restarts_backends as rb

needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None or importlib.util.find_spec("psutil") is None,
                               reason="needs Ray and psutil (pip install 'hf_fasttrain[ray]')")


@pytest.mark.parametrize("args, options, expected", [
    (["--a", "1"], {}, ["--a", "1"]),
    (["--a", "1", "--b", "2"], {"--a": "3"}, ["--a", "3", "--b", "2"]),
    (["--a", "1"], {"--c": "4"}, ["--a", "1", "--c", "4"]),
])
def test_with_options_replaces_a_flag_in_place_or_appends_it(args, options, expected):
    assert rb.with_options(args, options) == expected


def test_the_quick_search_is_the_full_one_on_smaller_settings():
    quick = dict(zip(*[iter(rb.with_options(rb.SEARCH, rb.QUICK))] * 2))
    full = dict(zip(*[iter(rb.SEARCH)] * 2))
    assert {k: v for k, v in quick.items() if k not in rb.QUICK} == {k: v for k, v in full.items() if k not in rb.QUICK}
    assert quick["--config"] == "gpt2_tiny" and quick["--explore-fraction"] == "0.5"


@pytest.mark.bench
@needs_ray
def test_quick_run_gives_the_same_winner_on_both_backends(tmp_path):
    committed_path = _harness.RESULTS / "restarts_backends.json"
    before = committed_path.read_bytes()
    record = rb.main(["--quick", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    committed = json.loads(before)
    saved = json.loads((tmp_path / "out" / "restarts_backends_quick.json").read_text())
    assert saved == json.loads(json.dumps(record)) and committed_path.read_bytes() == before
    assert set(saved) == set(committed) and saved["command"] == "python -m benchmarks.restarts_backends --repeats 1 --quick"
    assert [(r["backend"], r["repeat"]) for r in saved["runs"]] == [(r["backend"], r["repeat"]) for r in committed["runs"]]
    local, ray = saved["runs"]
    for run in (local, ray):
        assert set(run) == set(committed["runs"][0])
        assert all(math.isfinite(run[k]) and run[k] > 0 for k in ("wall_s", "cpu_s", "peak_rss_mb"))
        # 2 seeds to the rung at step 2 of 4, then the winner on to step 4
        assert run["total_steps"] == 6 and set(run["rung_metrics"]) == {"seed-0", "seed-1"}
        assert all(len(m) == 1 and math.isfinite(m[0]) for m in run["rung_metrics"].values())
        summary = json.loads((tmp_path / "work" / f"{run['backend']}-0" / "restarts_summary.json").read_text())
        assert summary["config"]["backend"] == run["backend"] and summary["winner"] == run["winner"]
        # the winner is the seed with the lower rung loss, and it trained on past the rung
        best = min(run["rung_metrics"], key=lambda t: run["rung_metrics"][t][0])
        assert run["winner"] == best and run["winner_final_metric"] < run["rung_metrics"][best][0]
    assert ray["processes_seen"] > local["processes_seen"] >= 1  # Ray's services and workers are processes of the tree
    assert ray["winner"] == local["winner"]
    assert ray["winner_final_metric"] == pytest.approx(local["winner_final_metric"], rel=1e-3)
    for trial, metrics in local["rung_metrics"].items():
        assert ray["rung_metrics"][trial] == pytest.approx(metrics, rel=1e-3)
    table = (tmp_path / "out" / "restarts_backends_quick.md").read_text()
    assert "| local | 1 |" in table and "| ray | 1 |" in table and "Same winner in every run: yes." in table
    assert (tmp_path / "out" / "restarts_backends_quick.png").stat().st_size > 0
