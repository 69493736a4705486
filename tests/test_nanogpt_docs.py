"""The nanoGPT pages against the study's results: the study page is written from benchmarks/results/nanogpt.json
(every figure on it is the JSON's), and the switch page's figures are the study's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "nanogpt.json"


@pytest.fixture(scope="module")
def data():
    assert RESULTS.exists(), "benchmarks/results/nanogpt.json is missing: python -m benchmarks.nanogpt --text input.txt"
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def test_the_study_page_is_the_results(data):
    from benchmarks import nanogpt

    page = (ROOT / "docs" / "benchmarks" / "nanogpt.md").read_text(encoding="utf-8")
    assert page == nanogpt.page_text(data), ("docs/benchmarks/nanogpt.md differs from what benchmarks/results/"
                                            "nanogpt.json gives: python -m benchmarks.nanogpt --report")


def test_the_switch_page_quotes_the_study(data):
    page = (ROOT / "docs" / "coming-from-nanogpt.md").read_text(encoding="utf-8")
    setup = data["setup"]
    assert f"({data['text']['vocab']} ids for Shakespeare)" in page
    assert f"--max_tokens {setup['max_steps'] * setup['batch_size'] * setup['block_size']}" in page
    assert (f"--n_layer {setup['n_layer']} --n_head {setup['n_head']} --n_embd {setup['n_embd']} --block_size "
            f"{setup['block_size']} --per_device_train_batch_size {setup['batch_size']}") in page


def test_both_pages_are_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert "Coming from nanoGPT: coming-from-nanogpt.md" in nav and "benchmarks/nanogpt.md" in nav


def _x(ratio: float) -> str:
    return f"{ratio:.2f}x the characters ({1 / ratio:.1f}x fewer)"


def test_the_readme_quotes_the_study(data):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    arms = data["summary"]["arms"]
    targets = data["summary"]["targets"]
    assert f"ends at {targets['hf-nanogpt']:.3f}, where nanoGPT's own `train.py` ends at {targets['peer']}" in readme
    assert f"reaches {targets['peer']} in {_x(arms['fasttrain']['tokens_ratio_peer'])}" in readme
    assert f"and ends at {arms['fasttrain']['final_eval_loss']:.3f}." in readme
    assert (f"final loss, {targets['hf-best']:.3f}, in {_x(arms['fasttrain']['tokens_ratio_hf-best'])}") in readme
    setup = data["setup"]
    assert f"{setup['max_steps'] * setup['batch_size'] * setup['block_size'] / 1e6:.3f}M characters" in readme
    assert all(arms[a]["seeds"] == 3 for a in ("hf-nanogpt", "fasttrain")) and "3 seeds" in readme


def test_the_benchmarks_summary_quotes_the_study(data):
    page = (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
    arms, targets = data["summary"]["arms"], data["summary"]["targets"]
    fast = arms["fasttrain"]
    assert (f"reaches nanoGPT's {targets['peer']} in {_x(fast['tokens_ratio_peer'])} and hf-best's final loss in "
            f"{fast['tokens_ratio_hf-best']:.2f}x | {fast['seeds']} |") in page
