"""Drop-in check: transformers' own Trainer tests, run with the Trainer and with FastTrainer substituted.

    python -m benchmarks.hf_trainer_suite --tests /work/hf_trainer_tests [--only callback] [--rerun]

``--tests`` is a local copy of transformers' ``tests/`` folder (at least ``tests/__init__.py`` and
``tests/trainer/``): the tests are not installed with transformers and are not part of this repository.
Every ``test_*.py`` under it runs four times, each file in its own pytest process (CPU, offline:
``HF_HUB_OFFLINE=1``):

- ``trainer``: the plain ``transformers.Trainer`` (the reference);
- ``fast``: ``FastTrainer`` substituted for ``Trainer``, arguments stay ``TrainingArguments``;
- ``fast_args``: ``FastTrainer`` and ``FastTrainingArguments`` substituted (``run_record`` on, its default);
- ``fast_neutral``: as ``fast_args`` with ``run_record`` and ``save_on_signal`` defaulting to False: the
  neutral mode, which must give the Trainer's results exactly.

The substitution is ``benchmarks/_hf_suite_plugin.py`` (``-p``). A test that passes with the Trainer and
fails or errors in another mode is a finding; ``ALLOWED`` lists the ones that are expected (the run record
of ``FastTrainingArguments`` adds a callback, files and log keys), each with its reason. Per-file results
are saved as each file ends (``benchmarks/results/<out>_runs/<mode>/<file>.json``) and reused
on a rerun unless ``--rerun`` is given; a ``tests/_deps`` folder, if present, goes on ``PYTHONPATH``
(``parameterized``, ``pytest-timeout``, ``sentencepiece``). Writes ``hf_trainer_suite.{json,md,png}`` into
``benchmarks/results/`` and prints the table. ``--package DIR`` tests the ``hf_fasttrain`` in ``DIR``
instead of this checkout (``git archive <commit> hf_fasttrain | tar -x -C DIR``: a before/after check).

The copy used (``SOURCES``): an empty ``tests/__init__.py`` (the transformers 5.24.0 and 5.25.0 sdists ship
``tests/`` without one, nor ``tests/trainer``), an empty ``tests/trainer/__init__.py``, and the files below
from huggingface/transformers at the commits named, trimmed to the tests that can run on a CPU offline (each
file's header says what was left out; the saved per-file results list the test ids each file keeps). Of the
kept code only imports change: ``test_trainer_evaluation.py`` no longer imports ``GlueDataset`` and
``GlueDataTrainingArguments`` (gone in transformers 5.25; only a left-out test used them), and
``test_trainer_core.py`` imports only what its excerpt uses.
``pip install --target <tests>/_deps parameterized pytest-timeout sentencepiece`` (then remove the pytest,
pluggy, packaging, iniconfig and pygments it pulls in) gives the test dependencies without touching the
environment; without ``sentencepiece`` the two classes of ``test_trainer_core.py`` are skipped.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.hf_trainer_suite [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from benchmarks._harness import RESULTS, ROOT, display_command, machine_info, markdown_table, write_json

MODES = ("trainer", "fast", "fast_args", "fast_neutral")
MODE_TITLES = {
    "trainer": "Trainer",
    "fast": "FastTrainer + TrainingArguments",
    "fast_args": "FastTrainer + FastTrainingArguments",
    "fast_neutral": "FastTrainer + FastTrainingArguments(run_record=False, save_on_signal=False)",
}
OUTCOMES = ("passed", "failed", "error", "skipped")
SOURCES = {  # tests/trainer/<file> -> the huggingface/transformers commit it was taken from
    "trainer_test_utils.py": "2d754248977f8e25edd8cd4d6d272e86f362d4a5",
    "test_trainer_callback.py": "020a37d2264e60dc7beb9634c3e87ad870073e2c",
    "test_trainer_checkpointing.py": "22c22fa26f5f3352d243bc358f0947af05b1d61b",
    "test_trainer_data.py": "003432ac431659ea2564483634f35e4a2ee4c391",
    "test_trainer_evaluation.py": "0941546be77e98e3382d8467bbd98f892cfeda3d",
    "test_trainer_optimizers.py": "0d7e95d96b4e187c651e2b2406ed98ed40d74963",
    # an excerpt of tests/trainer/test_trainer.py before its split (the split one is not available)
    "test_trainer_core.py": "0052c30e2198e6d9f60c8517df6502042fd48345",
}

# Differences that are expected, by mode: test id (file::Class::test) -> why. Only the run record, which
# FastTrainingArguments switches on by default, may make a test that passes with the Trainer fail.
_CALLBACKS = ("asserts the Trainer's exact default callback list; the run record adds RunRecorderCallback (and "
              "save_on_signal GracefulStopCallback)")
_FILES = ("counts the entries of output_dir; the run record adds config.yaml, run_info.json, metrics.json and "
          "loss_curve.png")
# A resumed run's TrainerState equals a straight run's: the run record keeps its clock and the logs' wall-clock
# keys in each checkpoint's run_record.json, not in trainer_state.json, so the resume tests are no longer allowed
# to differ.
ALLOWED: dict[str, dict[str, str]] = {
    "trainer": {},
    "fast": {},
    "fast_neutral": {},
    "fast_args": {
        "test_trainer_callback.py::TrainerCallbackTest::test_default_callbacks_are_present": _CALLBACKS,
        "test_trainer_callback.py::TrainerCallbackTest::test_custom_callback_added_at_init": _CALLBACKS,
        "test_trainer_callback.py::TrainerCallbackTest::test_printer_callback_when_tqdm_disabled": _CALLBACKS,
        "test_trainer_checkpointing.py::TrainerBestModelTest::test_save_best_checkpoint": _FILES,
        "test_trainer_checkpointing.py::TrainerBestModelTest::test_best_model_checkpoint_behavior": _FILES,
    },
}


def suite_files(tests_dir: Path, only: list[str]) -> list[Path]:
    files = sorted(p for p in tests_dir.rglob("test_*.py") if not {"_deps", "_junit"} & set(p.parts))
    if only:
        files = [p for p in files if any(o in p.name for o in only)]
    return files


def parse_junit(xml_path: Path, file_name: str) -> dict[str, dict]:
    """{test id: {outcome, reason}} from a pytest junit XML file of one test file.

    The id is ``<file>::<Class>::<test>`` (``<file>::<test>`` for a test function, ``<file>::<collection>``
    when the file did not import); the reason is the first line of the failure, error or skip message.
    """
    results: dict[str, dict] = {}
    stem = file_name.removesuffix(".py")
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        parts = case.get("classname", "").split(".")
        # the classname is the dotted module path, then the class if there is one
        rest = parts[parts.index(stem) + 1:] if stem in parts else None
        test_id = f"{file_name}::" + ("::".join(rest + [case.get("name", "")]) if rest is not None else "<collection>")
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                reason = (el.get("message") or el.text or "").strip().splitlines()
                reason = reason[0][:300] if reason else ""
                break
        if test_id in results and results[test_id]["outcome"] != "passed" and outcome == "passed":
            continue  # a teardown error reported as a second entry keeps the first non-pass outcome
        if test_id in results and outcome == "error" and results[test_id]["outcome"] == "passed":
            reason = "teardown: " + reason
        results[test_id] = {"outcome": outcome, "reason": reason}
    return results


def run_file(path: Path, mode: str, tests_dir: Path, runs: Path, package: Path, timeout_s: int,
             file_timeout_s: int) -> dict:
    out_dir = runs / mode
    out_dir.mkdir(parents=True, exist_ok=True)
    # raw reports quote the tests' code: kept beside the tests, not committed
    raw_dir = tests_dir / "_junit" / runs.name / mode
    raw_dir.mkdir(parents=True, exist_ok=True)
    xml = raw_dir / f"{path.stem}.xml"
    subst = raw_dir / f"{path.stem}.substitution.json"
    deps = tests_dir / "_deps"
    pythonpath = [str(package), str(ROOT)] + ([str(deps)] if deps.is_dir() else []) + [os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               HF_FASTTRAIN_SUITE_MODE=mode, HF_FASTTRAIN_SUITE_REPORT=str(subst),
               PYTHONPATH=os.pathsep.join(p for p in pythonpath if p), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider", "-p",
           "benchmarks._hf_suite_plugin", f"--junitxml={xml}", "-o", "junit_family=xunit1",
           f"--rootdir={tests_dir}", "-W", "ignore::DeprecationWarning"]
    have_timeout = importlib.util.find_spec("pytest_timeout") is not None or (deps / "pytest_timeout.py").exists()
    if have_timeout and timeout_s:
        cmd += [f"--timeout={timeout_s}"]  # the plugin loads itself (entry point)
    t0 = time.time()
    try:
        proc = subprocess.run(cmd, cwd=tests_dir, env=env, capture_output=True, text=True, timeout=file_timeout_s)
        # only pytest's error lines (E ..., ERROR ...): enough to say why a file did not run
        lines = [l for l in (proc.stdout + proc.stderr).splitlines() if l.startswith(("E ", "ERROR"))]
        tail = "\n".join(lines[-10:])
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        tail, rc = f"file timed out after {file_timeout_s} s", -1
    seconds = time.time() - t0
    tests = parse_junit(xml, path.name) if xml.exists() else {}
    record = {"file": path.name, "mode": mode, "returncode": rc, "seconds": round(seconds, 1), "tests": tests,
              "substitution": json.loads(subst.read_text()) if subst.exists() else None,
              "tail": tail if not tests or rc not in (0, 1) else ""}
    write_json(out_dir / f"{path.stem}.json", record)
    return record


def counts(tests: dict[str, dict]) -> dict[str, int]:
    c = {o: 0 for o in OUTCOMES}
    for t in tests.values():
        c[t["outcome"]] += 1
    return c


def compare(by_mode: dict[str, dict[str, dict]]) -> dict[str, list[dict]]:
    """Per mode: the tests that pass with the Trainer and do not pass here (plus the reverse, marked)."""
    ref = by_mode.get("trainer", {})
    diffs: dict[str, list[dict]] = {}
    for mode, tests in by_mode.items():
        if mode == "trainer":
            continue
        rows = []
        for tid in sorted(set(ref) | set(tests)):
            a = ref.get(tid, {"outcome": "missing", "reason": ""})
            b = tests.get(tid, {"outcome": "missing", "reason": ""})
            if a["outcome"] == "passed" and b["outcome"] != "passed":
                allowed = ALLOWED.get(mode, {}).get(tid)
                rows.append({"test": tid, "trainer": "passed", mode: b["outcome"], "reason": b["reason"],
                             "allowed": allowed})
            elif b["outcome"] == "passed" and a["outcome"] in ("failed", "error"):
                rows.append({"test": tid, "trainer": a["outcome"], mode: "passed",
                             "reason": "passes here, not with the Trainer: " + a["reason"], "allowed": "better"})
        diffs[mode] = rows
    return diffs


def plot(summary: dict[str, dict[str, int]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(summary)
    fig, ax = plt.subplots(figsize=(8.5, 3.6))
    left = [0] * len(modes)
    colors = {"passed": "#4c9a2a", "failed": "#c0392b", "error": "#e67e22", "skipped": "#95a5a6"}
    for o in OUTCOMES:
        vals = [summary[m][o] for m in modes]
        bars = ax.barh([MODE_TITLES[m] for m in modes], vals, left=left, color=colors[o], label=o)
        ax.bar_label(bars, labels=[str(v) if v else "" for v in vals], label_type="center", fontsize=8)
        left = [l + v for l, v in zip(left, vals)]
    ax.invert_yaxis()
    ax.set_xlabel("tests")
    ax.set_title("transformers' Trainer tests, CPU offline")
    ax.legend(ncol=4, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.18))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.splitlines()[0])
    p.add_argument("--tests", type=Path, default=Path("/work/hf_trainer_tests"),
                   help="local copy of transformers' tests/ folder (with trainer/ inside)")
    p.add_argument("--only", nargs="*", default=[], help="run only files whose name contains one of these")
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    p.add_argument("--rerun", action="store_true", help="run files again even if a saved result exists")
    p.add_argument("--timeout", type=int, default=300, help="per-test timeout in seconds (pytest-timeout)")
    p.add_argument("--file-timeout", type=int, default=3600, help="per-file timeout in seconds")
    p.add_argument("--out", default="hf_trainer_suite", help="name of the result files in benchmarks/results")
    p.add_argument("--package", type=Path, default=ROOT,
                   help="folder holding the hf_fasttrain to test (default: this checkout; e.g. an older export)")
    args = p.parse_args(argv)
    tests_dir = args.tests.resolve()
    runs = RESULTS / f"{args.out}_runs"  # one JSON per (mode, file), written as each file ends
    files = suite_files(tests_dir, args.only)
    if not files:
        print(f"--tests: no test_*.py files under {tests_dir}", file=sys.stderr)
        return 2
    for mode in args.modes:
        for f in files:
            saved = runs / mode / f"{f.stem}.json"
            if saved.exists() and not args.rerun:
                continue
            rec = run_file(f, mode, tests_dir, runs, args.package.resolve(), args.timeout, args.file_timeout)
            print(f"{mode:9s} {f.name:40s} {counts(rec['tests'])} rc={rec['returncode']} {rec['seconds']} s",
                  flush=True)
    # gather every saved file result (also those of earlier runs with other --only)
    by_mode: dict[str, dict[str, dict]] = {m: {} for m in MODES}
    per_file: dict[str, dict[str, dict]] = {}
    for mode in MODES:
        for saved in sorted((runs / mode).glob("*.json")) if (runs / mode).is_dir() else []:
            rec = json.loads(saved.read_text())
            by_mode[mode].update(rec["tests"])
            per_file.setdefault(rec["file"], {})[mode] = {**counts(rec["tests"]), "seconds": rec["seconds"],
                                                          "substitution": rec["substitution"]}
    by_mode = {m: t for m, t in by_mode.items() if t}
    summary = {m: counts(t) for m, t in by_mode.items()}
    diffs = compare(by_mode)
    argv = ["--tests", str(args.tests)]
    if args.package.resolve() != ROOT:
        argv += ["--package", str(args.package.resolve()), "--out", str(args.out)]
    command = display_command("python -m benchmarks.hf_trainer_suite", argv)
    result = {"command": command,
              "machine": machine_info(), "sources": SOURCES, "summary": summary, "per_file": per_file,
              "differences": diffs, "outcomes": by_mode}
    write_json(RESULTS / f"{args.out}.json", result)

    rows = [[MODE_TITLES[m], *(summary[m][o] for o in OUTCOMES),
             "" if m == "trainer" else sum(1 for d in diffs[m] if d["allowed"] is None),
             "" if m == "trainer" else sum(1 for d in diffs[m] if d["allowed"] not in (None, "better"))]
            for m in summary]
    table = markdown_table(["mode", *OUTCOMES, "unexplained differences", "allowed differences"], rows)
    md = ["# transformers' Trainer tests with FastTrainer substituted\n",
          f"Command: `{result['command']}` (CPU, HF_HUB_OFFLINE=1). Test files (huggingface/transformers "
          "tests/trainer, trimmed to what runs on a CPU offline): "
          + ", ".join(f"{f} @ {SOURCES.get(f, '?')[:10]}" for f in sorted(per_file)) + ".\n", table, ""]
    for mode, rows_ in diffs.items():
        md.append(f"\n## {MODE_TITLES[mode]}: tests that pass with the Trainer and not here\n")
        if not rows_:
            md.append("None.")
            continue
        md.append(markdown_table(["test", "outcome", "reason", "allowed because"],
                                 [[d["test"], d[mode], d["reason"].replace("|", "\\|"), d["allowed"] or "-"]
                                  for d in rows_]))
    (RESULTS / f"{args.out}.md").write_text("\n".join(md) + "\n")
    plot(summary, RESULTS / f"{args.out}.png")
    print(table)
    for mode, rows_ in diffs.items():
        for d in rows_:
            print(f"  [{mode}] {d['test']}: {d[mode]} ({d['allowed'] or 'UNEXPLAINED'}) {d['reason'][:160]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
