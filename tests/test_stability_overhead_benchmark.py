"""benchmarks/stability_overhead.py on its quick setup: every committed arm measured, the ratios to the plain
Trainer's step, and the committed results left alone."""

import json
import math

import pytest
import torch
from transformers.utils import logging as hf_logging

from benchmarks import _harness
from benchmarks import stability_overhead as so


@pytest.fixture
def restores_torch_threads_and_logging():
    threads, verbosity = torch.get_num_threads(), hf_logging.get_verbosity()
    yield
    torch.set_num_threads(threads)
    hf_logging.set_verbosity(verbosity)


@pytest.mark.bench
def test_quick_run_measures_every_committed_arm(tmp_path, restores_torch_threads_and_logging):
    committed_path = _harness.RESULTS / "stability_overhead.json"
    before = committed_path.read_bytes()
    result = so.main(["--quick", "--out", str(tmp_path)])
    committed = json.loads(before)
    saved = json.loads((tmp_path / "stability_overhead_quick.json").read_text())
    assert saved == result and committed_path.read_bytes() == before
    assert set(saved) == set(committed) and (saved["steps"], saved["repeats"]) == (12, 1)
    assert [r["arm"] for r in saved["rows"]] == [r["arm"] for r in committed["rows"]] == list(so.ARMS)
    base = saved["rows"][0]["ms_per_step_median"]
    for row in saved["rows"]:
        assert set(row) == set(committed["rows"][0])
        assert len(row["ms_per_step_all"]) == 1 and row["ms_per_step_median"] == row["ms_per_step_all"][0]
        # a step of this model is tens of CPU ms; a callback neither makes it free nor 100x dearer
        assert math.isfinite(row["ms_per_step_median"]) and 1 < row["ms_per_step_median"] < 10_000
        assert row["relative"] == pytest.approx(row["ms_per_step_median"] / base) and 0.1 < row["relative"] < 10
    assert saved["rows"][0]["relative"] == 1.0
    assert (tmp_path / "stability_overhead_quick.png").stat().st_size > 0


def test_too_few_steps_is_a_usage_error(tmp_path):
    with pytest.raises(SystemExit, match="^--steps: 10 leaves no step to measure") as stopped:
        so.main(["--steps", "10", "--out", str(tmp_path)])
    assert stopped.value.code == 2 and not any(tmp_path.iterdir())
