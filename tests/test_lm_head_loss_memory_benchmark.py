"""benchmarks/lm_head_loss_memory.py on its quick setup: the committed table's variants, the chunked loss equal to
the standard one, and the bytes kept for backward as the chunking predicts."""

import json
import math

import pytest

from benchmarks import _harness
from benchmarks import lm_head_loss_memory as lhm


@pytest.mark.bench
def test_quick_run_writes_the_committed_variants_and_the_chunked_loss_equals_the_standard(tmp_path):
    result = lhm.main(["--quick", "--out", str(tmp_path)])
    committed = json.loads((_harness.RESULTS / "lm_head_loss_memory_cpu.json").read_text())
    saved = json.loads((tmp_path / "lm_head_loss_memory_cpu_quick.json").read_text())
    assert saved == result
    assert set(saved) == set(committed) and set(saved["config"]) == set(committed["config"])
    assert list(saved["variants"]) == list(committed["variants"]) == lhm.VARIANTS
    for name, row in saved["variants"].items():
        assert set(row) == set(committed["variants"][name]) and row["variant"] == name
        assert all(math.isfinite(x) for x in [row["loss"], *row["grad_norms"], *row["step_times_s"]])
        assert row["peak_rss_increase_bytes"] >= 0 and row["step_time_median_s"] > 0
        assert len(row["step_times_s"]) == 1  # one repeat
    q = lhm.QUICK
    assert saved["config"] == {**q, "fp32_logits_bytes": q["tokens"] * q["vocab"] * 4}
    v = saved["variants"]
    # random logits near 0 (d 64, weight std 0.02): the loss is about ln(vocab)
    assert v["standard-fp32"]["loss"] == pytest.approx(math.log(q["vocab"]), abs=0.1)
    for dtype, tol in (("fp32", 1e-5), ("bf16", 1e-2)):
        std, chunked = v[f"standard-{dtype}"], v[f"chunked-{dtype}"]
        assert chunked["loss"] == pytest.approx(std["loss"], rel=1e-5)
        assert chunked["grad_norms"] == pytest.approx(std["grad_norms"], rel=tol)
        # chunked keeps only the fp32 gradients of hidden and weight (+ the 8-byte token count of the mean)
        assert chunked["saved_for_backward_bytes"] == (q["tokens"] + q["vocab"]) * q["d_model"] * 4 + 8
    # standard keeps at least the fp32 logits and their log-softmax
    assert v["standard-fp32"]["saved_for_backward_bytes"] >= 2 * saved["config"]["fp32_logits_bytes"]
    assert saved["command"] == f"python -m benchmarks.lm_head_loss_memory --quick --out <{tmp_path.name}>"
    table = (tmp_path / "lm_head_loss_memory_cpu_quick.md").read_text()
    assert all(f"| {name} | " in table for name in lhm.VARIANTS)
    assert (tmp_path / "lm_head_loss_memory_cpu_quick.png").stat().st_size > 0
