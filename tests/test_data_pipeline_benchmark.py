"""benchmarks/data_pipeline.py in its tiny setting: every path measured, the files written, the stream's
peak RSS flat over a larger corpus."""

import json
import math

import pytest

from benchmarks import data_pipeline


@pytest.mark.bench
def test_tiny_run_writes_the_table_and_keeps_streaming_memory_flat(tmp_path):
    args = data_pipeline.make_parser().parse_args(["--tiny", "--out", str(tmp_path)])
    out = data_pipeline.main(args)
    rates = {r["path"]: r for r in out["rates"]}
    assert set(rates) == {"pretokenized", "streaming", "map_style", "tokenize_once", "map_style_prepare"}
    for r in rates.values():
        assert r["tokens_per_s"] > 0
        assert r["workers_for_350k"] == math.ceil(350_000 / r["tokens_per_s"])
        assert r["workers_for_900k"] >= r["workers_for_350k"]
    rss = out["streaming_rss"]
    # the same documents three times, all streamed (packing cuts per map batch: a few rows of 64 either way)
    assert rss["corpus_tokens"] > 0 and abs(rss["larger_tokens"] - 3 * rss["corpus_tokens"]) <= 6 * 64
    assert rss["flat"] and rss["ratio"] <= 1.2
    saved = json.loads((tmp_path / "data_pipeline.json").read_text())
    assert saved["rates"] == json.loads(json.dumps(out["rates"])) and "loaded" in saved["note"]
    md = (tmp_path / "data_pipeline.md").read_text()
    assert "loaded 2-core" in md and "| streaming |" in md and (tmp_path / "data_pipeline.png").stat().st_size > 1000
