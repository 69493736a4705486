"""The drop-in check's runner (benchmarks/hf_trainer_suite.py): junit parsing, comparison, substitution."""

import subprocess
import sys
import textwrap

import pytest

from benchmarks import hf_trainer_suite as suite

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="hf_trainer_tests.trainer.test_x.ACase" name="test_ok" time="0.1"/>
  <testcase classname="hf_trainer_tests.trainer.test_x.ACase" name="test_bad" time="0.1">
    <failure message="AssertionError: 6 != 2&#10;second line">trace</failure></testcase>
  <testcase classname="hf_trainer_tests.trainer.test_x.ACase" name="test_gpu" time="0">
    <skipped message="test requires accelerator"/></testcase>
  <testcase classname="hf_trainer_tests.trainer.test_x" name="test_function" time="0.1"/>
  <testcase classname="hf_trainer_tests.trainer.test_x.ACase" name="test_teardown" time="0.1"/>
  <testcase classname="hf_trainer_tests.trainer.test_x.ACase" name="test_teardown" time="0.1">
    <error message="failed on teardown with OSError">trace</error></testcase>
</testsuite></testsuites>
"""


def test_parse_junit_ids_outcomes_reasons(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(JUNIT)
    got = suite.parse_junit(xml, "test_x.py")
    assert got == {
        "test_x.py::ACase::test_ok": {"outcome": "passed", "reason": ""},
        "test_x.py::ACase::test_bad": {"outcome": "failed", "reason": "AssertionError: 6 != 2"},
        "test_x.py::ACase::test_gpu": {"outcome": "skipped", "reason": "test requires accelerator"},
        "test_x.py::test_function": {"outcome": "passed", "reason": ""},
        "test_x.py::ACase::test_teardown": {"outcome": "error",
                                             "reason": "teardown: failed on teardown with OSError"},
    }


def test_parse_junit_collection_error(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="" name="trainer.test_y">'
                   '<error message="collection failure">x</error></testcase></testsuite></testsuites>')
    assert suite.parse_junit(xml, "test_y.py") == {
        "test_y.py::<collection>": {"outcome": "error", "reason": "collection failure"}}


def test_compare_lists_only_tests_that_pass_with_the_trainer(monkeypatch):
    monkeypatch.setitem(suite.ALLOWED, "fast_args", {"f.py::t_allowed": "record adds a file"})
    ok, bad = {"outcome": "passed", "reason": ""}, {"outcome": "failed", "reason": "boom"}
    skip = {"outcome": "skipped", "reason": "gpu"}
    by_mode = {
        "trainer": {"f.py::t_same": ok, "f.py::t_new_fail": ok, "f.py::t_allowed": ok, "f.py::t_both_fail": bad,
                    "f.py::t_fixed": bad, "f.py::t_skip": skip},
        "fast_args": {"f.py::t_same": ok, "f.py::t_new_fail": bad, "f.py::t_allowed": bad,
                      "f.py::t_both_fail": bad, "f.py::t_fixed": ok, "f.py::t_skip": skip},
    }
    rows = suite.compare(by_mode)["fast_args"]
    assert [(r["test"], r["allowed"]) for r in rows] == [
        ("f.py::t_allowed", "record adds a file"), ("f.py::t_fixed", "better"), ("f.py::t_new_fail", None)]
    assert suite.counts(by_mode["trainer"]) == {"passed": 3, "failed": 2, "error": 0, "skipped": 1}


@pytest.mark.bench  # four pytest subprocesses (~40 s)
def test_plugin_substitutes_trainer_names_in_test_modules(tmp_path):
    """The pytest plugin swaps the names before the test module imports them, per mode."""
    pkg = tmp_path / "tests"
    pkg.mkdir()
    (pkg / "test_probe.py").write_text(textwrap.dedent("""
        import os
        from transformers import Trainer, TrainingArguments

        def test_names():
            mode = os.environ["HF_FASTTRAIN_SUITE_MODE"]
            assert Trainer.__name__ == ("Trainer" if mode == "trainer" else "FastTrainer")
            expected = {"fast_args": "FastTrainingArguments", "fast_neutral": "NeutralFastTrainingArguments"}
            assert TrainingArguments.__name__ == expected.get(mode, "TrainingArguments")
            if mode == "fast_neutral":
                assert TrainingArguments("out").run_record is False
                assert TrainingArguments("out").save_on_signal is False
    """))
    for mode in suite.MODES:
        env = dict(suite.os.environ, HF_FASTTRAIN_SUITE_MODE=mode, HF_HUB_OFFLINE="1",
                   PYTHONPATH=str(suite.ROOT))
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                               "benchmarks._hf_suite_plugin", str(pkg / "test_probe.py")],
                              cwd=tmp_path, env=env, capture_output=True, text=True)
        assert proc.returncode == 0, (mode, proc.stdout[-2000:])
