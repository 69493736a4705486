"""benchmarks/data_resume.py in miniature: both arms resume a stream at the same batch, files written."""

import json

import pytest

from benchmarks import data_resume


@pytest.mark.bench
def test_data_resume_smoke(tmp_path):
    assert data_resume.main(["--steps", "3", "--repeats", "1", "--out", str(tmp_path), "--name", "smoke"]) == 0
    result = json.loads((tmp_path / "smoke.json").read_text())
    (row,) = result["rows"]
    # the script raised unless both arms took the same first batch; the skip arm re-read 3 steps x 2 rows
    assert row["step"] == 3 and row["rows_skipped"] == 6 and len(row["first_batch"]) == 12
    assert row["position_s"] > 0 and row["trainer_skip_s"] > 0
    assert (tmp_path / "smoke.png").stat().st_size > 0
    assert "| 3 | 6 |" in (tmp_path / "smoke.md").read_text()
