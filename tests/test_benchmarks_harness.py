"""benchmarks/_harness.py: the benchmarks are a package importable without sys.path edits."""

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


def test_a_benchmark_refuses_a_bad_option_in_one_line_with_exit_status_2():
    out = subprocess.run(_harness.module_command("hf_best", "--families", "adamw"), env=_harness.subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert out.stderr.strip().splitlines()[-1] == "error: --families: 'adamw': each of hf-best, recipe"
