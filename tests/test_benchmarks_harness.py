"""benchmarks._harness: the benchmarks are a package importable without sys.path edits, one harness under thin
studies."""

import ast
import json
import os
import subprocess
import sys

import pytest

from benchmarks import _harness


def test_module_command_and_env_run_this_checkout(tmp_path):
    cmd = _harness.module_command("_harness")
    assert cmd == [sys.executable, "-m", "benchmarks._harness"]
    env = _harness.subprocess_env({"X_HARNESS": "1"})
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(_harness.ROOT) and env["X_HARNESS"] == "1"
    # from another directory, a worker still imports this checkout's hf_fasttrain and benchmarks
    code = "import benchmarks, hf_fasttrain; print(benchmarks.__file__); print(hf_fasttrain.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    bench, pkg = out.stdout.split()
    assert bench == str(_harness.ROOT / "benchmarks" / "__init__.py")
    assert pkg == str(_harness.ROOT / "hf_fasttrain" / "__init__.py")


@pytest.mark.parametrize(
    "headers, rows, expected",
    [
        (["a"], [], "| a |\n|---|"),
        (["arm", "ms"], [["x", 1.23456], ["y", 2]], "| arm | ms |\n|---|---|\n| x | 1.235 |\n| y | 2 |"),
        (["v"], [[1e-5], [None]], "| v |\n|---|\n| 1e-05 |\n| None |"),
    ],
)
def test_markdown_table(headers, rows, expected):
    assert _harness.markdown_table(headers, rows) == expected


def test_write_json_and_results_dir(tmp_path):
    path = _harness.write_json(tmp_path / "sub" / "r.json", {"x": 1.5, "p": tmp_path})
    assert json.loads(path.read_text()) == {"x": 1.5, "p": str(tmp_path)}
    assert _harness.RESULTS == _harness.ROOT / "benchmarks" / "results" and _harness.RESULTS.is_dir()


def test_a_benchmark_run_as_a_file_names_the_module_command():
    out = subprocess.run([sys.executable, str(_harness.ROOT / "benchmarks" / "padding.py"), "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert out.stderr.strip() == ("Run it from the checkout root as a module: "
                                  "python -m benchmarks.padding [options]")


def test_a_usage_error_is_one_line_and_exit_status_2(capsys):
    def main(value):
        raise _harness.UsageError(f"--seeds must be >= 1, got {value}")

    with pytest.raises(SystemExit) as stopped:
        _harness.run_cli(main, 0)
    assert stopped.value.code == 2
    assert capsys.readouterr().err == "error: --seeds must be >= 1, got 0\n"
    # a test matches the message as it matches any SystemExit's
    with pytest.raises(SystemExit, match="got 0") as raised:
        main(0)
    assert raised.value.code == 2


@pytest.mark.bench
def test_a_benchmark_refuses_a_bad_option_in_one_line_with_exit_status_2():
    out = subprocess.run(_harness.module_command("hf_best", "--families", "adamw"), env=_harness.subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: --families: 'adamw': each of hf-best, recipe, hf-best+, recipe+groups"


BENCHMARKS = _harness.ROOT / "benchmarks"
STUDIES = sorted(p.stem for p in BENCHMARKS.glob("*.py") if not p.stem.startswith("_"))


def _imported_benchmarks_modules(path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:  # from ._harness import ...: relative to the benchmarks package
                yield (node.module or "").split(".")[0]
            elif node.module and node.module.split(".")[0] == "benchmarks":
                parts = node.module.split(".")
                yield from ([parts[1]] if len(parts) > 1 else [a.name for a in node.names])
        elif isinstance(node, ast.Import):
            yield from (a.name.split(".")[1] for a in node.names if a.name.startswith("benchmarks."))


def test_studies_import_the_harness_and_not_each_other_and_never_edit_sys_path():
    files = sorted(BENCHMARKS.rglob("*.py"))
    assert "time_to_loss" in STUDIES and (BENCHMARKS / "_harness" / "lm.py") in files
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        edits = [n.lineno for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.attr == "path"
                 and isinstance(n.value, ast.Name) and n.value.id == "sys"]
        assert not edits, f"{path.relative_to(_harness.ROOT)}: sys.path at lines {edits}"
        me = path.stem if path.parent == BENCHMARKS else "_harness"
        for name in _imported_benchmarks_modules(path):
            who = "the harness" if me == "_harness" else f"study {me}"
            if ALIASES.get(me) == name:  # an older command of a study: the study itself, nothing more
                continue
            if {me, name} in PARTS:  # one study in two modules (two ledgers, one page)
                continue
            assert name == "_harness", f"{path.relative_to(_harness.ROOT)}: {who} imports study {name}"


# a study's older command -> the study it runs: the module holds its main and nothing else of its own
ALIASES = {"budget_ladder": "ladder", "scaling": "ladder"}
# one study in two modules: the gain across width (its own ledger) shares the transfer study's setup and page
PARTS = [{"transfer", "transfer_gain"}]


@pytest.mark.parametrize("alias, study", sorted(ALIASES.items()))
def test_an_older_command_is_only_its_study(alias, study):
    tree = ast.parse((BENCHMARKS / f"{alias}.py").read_text(encoding="utf-8"))
    defined = [n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))]
    assert defined == ["main"], f"{alias}: defines {defined}, not only main"
    assert set(_imported_benchmarks_modules(BENCHMARKS / f"{alias}.py")) == {"_harness", study}


def test_every_pool_of_the_studies_is_the_harness_one():
    """No study opens a process pool of its own: each runs its processes through ``_harness.processes``."""
    for path in sorted(BENCHMARKS.rglob("*.py")):
        if path == BENCHMARKS / "_harness" / "processes.py":
            continue
        source = path.read_text(encoding="utf-8")
        for own in ("ProcessPoolExecutor", "multiprocessing", "concurrent.futures.wait"):
            assert own not in source, f"{path.relative_to(_harness.ROOT)}: {own}; use benchmarks._harness.processes"


@pytest.mark.parametrize("study", [s for s in STUDIES if (BENCHMARKS / f"{s}.py").read_text().count("def main(")])
def test_a_study_run_as_a_file_names_its_module_command(study):
    # checked in the source: the guard runs before any import, so the file needs no interpreter to prove it
    source = (BENCHMARKS / f"{study}.py").read_text(encoding="utf-8")
    head = source.split("\nimport ", 1)[0]
    assert "if not __package__:" in head, f"{study}: no guard before its imports"
    assert f"python -m benchmarks.{study} [options]" in head


def _run_in_worker(job):
    """A pool job ``(folder, n)``: job 0 waits (at most 60 s) for the caller's ``go``, given once a result is in."""
    import pathlib
    import time

    import torch

    folder, n = job
    if n == 0:
        deadline = time.monotonic() + 60
        while not pathlib.Path(folder, "go").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    return n * n, os.getpid(), torch.get_num_threads()


def test_the_pool_runs_each_job_in_a_worker_and_hands_back_every_result(tmp_path):
    from benchmarks._harness import processes

    folder = str(tmp_path)
    with processes.worker_pool(2, threads=1) as pool:
        finished = processes.as_finished(pool, _run_in_worker, [(folder, 0), (folder, 1)])
        first = next(finished)  # job 0 waits for the go: the first result is job 1's, handed back as it ends
        (tmp_path / "go").touch()
        rest = list(finished)
        ordered = processes.in_order(pool, _run_in_worker, [(folder, 3), (folder, 2)])
    assert first[0] == (folder, 1) and [job for job, _ in rest] == [(folder, 0)]
    assert (first[1][0], rest[0][1][0]) == (1, 0) and [r[0] for r in ordered] == [9, 4]  # in the jobs' order
    assert first[1][1] != rest[0][1][1] and os.getpid() not in {first[1][1], rest[0][1][1]}  # two workers
    assert {r[2] for r in ordered} == {1}  # each worker at the threads asked for
    with processes.worker_pool(1, threads=None) as none:  # one job: no pool, every run here
        assert none is None
        here = processes.in_order(none, _run_in_worker, [(folder, 2), (folder, 1)])
    assert [(r[0], r[1]) for r in here] == [(4, os.getpid()), (1, os.getpid())]
