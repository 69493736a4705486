"""Random-restart orchestrator: selection, successive halving, divergence, kill-and-resume, validation.

Trials run through a stub runner backed by a table of eval values, so every expectation is exact. The stub
also checks the prefix contract: each call gets the FULL run's max_steps and resumes from the checkpoint
that trial saved at its previous stage.
"""

import doctest
import json
import math
import os
import re
import shutil
import statistics
import threading
import time
from pathlib import Path

import pytest

from hf_fasttrain import restarts
from hf_fasttrain.restarts import (
    CURVES_PNG,
    STATE_FILE,
    SUMMARY_JSON,
    SUMMARY_MD,
    RestartConfig,
    RestartOrchestrator,
    TrialResult,
    TrialRunner,
    compute_rung_steps,
    derive_seeds,
    divergence_reason,
    num_to_keep,
    planned_steps,
    rank_trials,
    seed_statistics,
)
from hf_fasttrain.restarts.state import SearchState, StageResult

NAN = float("nan")


def _search(config, runner, output_dir, max_steps):
    return RestartOrchestrator(config, runner, output_dir, max_steps).run()


class SimulatedKill(Exception):
    """Stands for the process being killed."""


class StubRunner:
    """Eval values come from ``table(trial, step) -> {metric: value}``; evaluates every ``eval_every`` steps
    and at ``until_step``; saves a real checkpoint directory holding a marker. Thread-safe."""

    def __init__(self, table, max_steps, eval_every=2, kill_at_call=None, flag_diverged=(), metrics=None, delay=0.0):
        self.table = table
        self.max_steps = max_steps
        self.eval_every = eval_every
        self.kill_at_call = kill_at_call
        self.flag_diverged = set(flag_diverged)
        self.metrics = metrics
        self.delay = delay
        self.calls = []  # (trial_id, until_step, resume_from, device), in start order
        self.finished = []  # (trial_id, until_step)
        self.active = set()
        self.max_active = 0
        self.lock = threading.Lock()

    def run(self, trial, until_step, resume_from):
        with self.lock:
            self.calls.append((trial.trial_id, until_step, resume_from, trial.device))
            n = len(self.calls)
            self.active.add(trial.device)
            self.max_active = max(self.max_active, len(self.active))
        try:
            if self.kill_at_call == n:
                raise SimulatedKill(f"killed in call {n}: {trial.trial_id} -> {until_step}")
            # the prefix contract: the full run's schedule length, resumed from this trial's own checkpoint
            assert trial.max_steps == self.max_steps
            assert until_step <= self.max_steps
            start = 0
            if resume_from is not None:
                with open(os.path.join(resume_from, "marker.json")) as f:
                    marker = json.load(f)
                assert marker["trial_id"] == trial.trial_id and marker["model_seed"] == trial.model_seed
                start = marker["step"]
                assert start < until_step
            time.sleep(self.delay)
            steps = [s for s in range(start + 1, until_step + 1) if s % self.eval_every == 0 or s == until_step]
            history = [{"step": s, **self.table(trial, s)} for s in steps]
            ckpt = os.path.join(trial.output_dir, f"checkpoint-{until_step}")
            os.makedirs(ckpt, exist_ok=True)
            with open(os.path.join(ckpt, "marker.json"), "w") as f:
                json.dump({"trial_id": trial.trial_id, "model_seed": trial.model_seed, "step": until_step}, f)
            with self.lock:
                self.finished.append((trial.trial_id, until_step))
            return TrialResult(history, self.table(trial, until_step), ckpt, trial.model_seed in self.flag_diverged)
        finally:
            with self.lock:
                self.active.discard(trial.device)

    def available_metrics(self):
        return self.metrics if self.metrics is not None else ["eval_loss"]


def hyperbolic(coeffs):
    """eval_loss of trial i at step s = a_i + b_i / s (falls with steps, at a seed-specific rate)."""

    def table(trial, step):
        a, b = coeffs[trial.index]
        return {"eval_loss": a + b / step}

    return table


# 8 seeds; by hand: step 4 -> [4.0, 4.25, 3.5, 3.6, 5.5, 4.4, 5.0, 4.7], step 8 -> seed-1 overtakes.
SH_COEFFS = [(2.0, 8), (1.0, 13), (3.0, 2), (2.6, 4), (1.5, 16), (3.4, 4), (4.0, 4), (2.2, 10)]


# ----------------------------------------------------------------------------------------------------------
# pure functions
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "args, expected",
    [
        ((100, 0.2, 1, 0.5), [20]),
        ((100, 0.2, 3, 0.5), [5, 10, 20]),
        ((40, 0.4, 3, 0.5), [4, 8, 16]),
        ((10, 1.0, 1, 0.5), [10]),
        ((10, 0.01, 1, 0.5), [1]),  # at least one step
        ((10, 0.25, 1, 0.5), [3]),  # 2.5 rounds half up
        ((90, 1.0, 2, 1 / 3), [30, 90]),
    ],
)
def test_compute_rung_steps(args, expected):
    assert compute_rung_steps(*args) == expected


def test_compute_rung_steps_rejects_colliding_rungs():
    with pytest.raises(ValueError) as err:
        compute_rung_steps(10, 0.4, 4, 0.5)
    assert str(err.value) == ('RestartConfig.rungs: got 4, which with explore_fraction=0.4 and keep_fraction=0.5 cuts the 10 steps at 1, 1, 2, 4; they must strictly increase: lower rungs, raise explore_fraction or train longer')


def test_derive_seeds_vary_model_and_data_independently():
    assert [derive_seeds(i, 10, None, "both") for i in range(3)] == [(10, 10), (11, 11), (12, 12)]
    assert [derive_seeds(i, 10, 100, "both") for i in range(3)] == [(10, 100), (11, 101), (12, 102)]
    assert [derive_seeds(i, 10, 100, "model") for i in range(3)] == [(10, 100), (11, 100), (12, 100)]
    assert [derive_seeds(i, 10, 100, "data") for i in range(3)] == [(10, 100), (10, 101), (10, 102)]


def test_rank_trials_and_num_to_keep():
    vals = {"a": 3.0, "b": 1.0, "c": 2.0, "d": 1.0}
    assert rank_trials(vals, "min", ["a", "b", "c", "d"]) == ["b", "d", "c", "a"]
    assert rank_trials(vals, "max", ["a", "b", "c", "d"]) == ["a", "c", "b", "d"]
    assert rank_trials(vals, "min", ["d", "c", "b", "a"]) == ["d", "b", "c", "a"]  # ties by order
    assert [num_to_keep(n, 0.5) for n in range(0, 9)] == [0, 1, 1, 2, 2, 3, 3, 4, 4]
    assert [num_to_keep(n, 1 / 3) for n in (1, 3, 4, 9)] == [1, 1, 2, 3]


def test_divergence_reason_table():
    assert divergence_reason([(2, 3.0)], "eval_loss", "min", None, 2.0, 4) is None
    assert divergence_reason([(2, math.inf)], "eval_loss", "min", None, 2.0, 4) == "eval_loss is inf at step 2"
    assert divergence_reason([], "eval_loss", "min", None, NAN, 4) == "eval_loss is nan at step 4"
    assert divergence_reason([], "eval_loss", "min", 5.0, 5.0, 4) is None  # equal is not worse
    assert "did not improve past divergence_threshold 5.0" in divergence_reason([], "eval_loss", "min", 5.0, 5.5, 4)
    assert divergence_reason([], "eval_acc", "max", 0.2, 0.1, 4).startswith("eval_acc 0.1 at step 4")
    assert divergence_reason([], "eval_acc", "max", 0.2, 0.3, 4) is None


def test_seed_statistics_and_planned_steps():
    s = seed_statistics([2.0, 4.0, NAN, None, 6.0])
    assert s == {"n": 3, "mean": 4.0, "std": 2.0, "min": 2.0, "max": 6.0}
    assert seed_statistics([1.5]) == {"n": 1, "mean": 1.5, "std": None, "min": 1.5, "max": 1.5}
    assert seed_statistics([]) == {"n": 0, "mean": None, "std": None, "min": None, "max": None}
    assert planned_steps(4, [5], 20) == 4 * 5 + 15
    assert planned_steps(8, [4, 8, 16], 40) == 8 * 4 + 4 * 4 + 2 * 8 + 24
    assert planned_steps(3, [10], 10) == 30


def test_doctests_pass():
    import importlib

    class FencedParser(doctest.DocTestParser):  # the examples sit in ```python fences (rendered as code)
        def get_doctest(self, string, globs, name, filename, lineno):
            string = "\n".join("" if line.strip().startswith("```") else line for line in string.splitlines())
            return super().get_doctest(string, globs, name, filename, lineno)

    attempted = 0
    for name in ("config", "ranking", "state", "orchestrator", "report", "ray_backend"):
        module = importlib.import_module(f"hf_fasttrain.restarts.{name}")
        runner = doctest.DocTestRunner()
        for test in doctest.DocTestFinder(parser=FencedParser()).find(module):
            runner.run(test, out=lambda s: None)
        result = runner.summarize(verbose=False)
        assert result.failed == 0, name
        attempted += result.attempted
    assert attempted >= 20


# ----------------------------------------------------------------------------------------------------------
# selection
# ----------------------------------------------------------------------------------------------------------


def test_selection_picks_lowest_eval_loss_and_continues_it_from_its_checkpoint(tmp_path):
    coeffs = [(2.0, 4.0), (1.5, 5.0), (1.0, 8.0), (2.5, 1.0)]  # step 5: 2.8, 2.5, 2.6, 2.7
    runner = StubRunner(hyperbolic(coeffs), max_steps=20)
    cfg = RestartConfig(num_seeds=4, explore_fraction=0.25, seed=42, data_seed=7)
    summary = RestartOrchestrator(cfg, runner, tmp_path, max_steps=20).run()

    assert summary["rung_steps"] == [5]
    assert summary["winner"] == "seed-1"
    assert (summary["winner_model_seed"], summary["winner_data_seed"]) == (43, 8)
    assert [r["rung_metrics"][0] for r in summary["trials"]] == pytest.approx([2.8, 2.5, 2.6, 2.7])
    # four explorations from scratch, then the winner alone from its step-5 checkpoint to the end
    ck = str(tmp_path / "trials" / "seed-1" / "checkpoint-5")
    assert [c[:3] for c in runner.calls] == [
        ("seed-0", 5, None), ("seed-1", 5, None), ("seed-2", 5, None), ("seed-3", 5, None), ("seed-1", 20, ck)
    ]
    assert summary["winner_final_metric"] == pytest.approx(1.5 + 5.0 / 20)
    assert summary["winner_checkpoint"] == str(tmp_path / "trials" / "seed-1" / "checkpoint-20")
    # seed-2 would have ended lower (1.4 < 1.75) but was not the best at the exploration step: by design
    assert [r["status"] for r in summary["trials"]] == ["dropped", "chosen", "dropped", "dropped"]
    assert [r["chosen"] for r in summary["trials"]] == [False, True, False, False]
    assert [(r["model_seed"], r["data_seed"]) for r in summary["trials"]] == [(42, 7), (43, 8), (44, 9), (45, 10)]
    assert summary["total_steps"] == 4 * 5 + 15 == summary["planned_steps"]
    assert summary["compute_ratio"] == pytest.approx(35 / 20)
    # the winner's curve is its whole run: every eval step 2..20 (eval_every=2) plus the rung step 5
    steps = [s for s, _ in summary["trials"][1]["history"]]
    assert steps == [2, 4, 5, 6, 8, 10, 12, 14, 16, 18, 20]


def test_selection_direction_max(tmp_path):
    acc = {0: 0.30, 1: 0.55, 2: 0.70, 3: 0.40}

    def table(trial, step):
        return {"eval_loss": 1.0, "eval_accuracy": acc[trial.index] * step / 10}

    runner = StubRunner(table, max_steps=10, metrics=["eval_loss", "eval_accuracy"])
    cfg = RestartConfig(num_seeds=4, explore_fraction=0.5, metric="accuracy", direction="max")
    assert cfg.metric == "eval_accuracy"
    summary = _search(cfg, runner, tmp_path, 10)
    assert summary["winner"] == "seed-2"
    assert summary["winner_final_metric"] == pytest.approx(0.70)
    assert summary["rung_stats"][0]["max"] == pytest.approx(0.35)
    # and with direction="min" on the same table the lowest accuracy wins
    summary = _search(
        RestartConfig(num_seeds=4, explore_fraction=0.5, metric="eval_accuracy", direction="min"),
        StubRunner(table, max_steps=10, metrics=["eval_loss", "eval_accuracy"]),
        tmp_path / "min",
        10,
    )
    assert summary["winner"] == "seed-0"


def test_explore_fraction_one_needs_no_continuation(tmp_path):
    runner = StubRunner(hyperbolic([(1.0, 4.0), (0.5, 8.0), (1.0, 1.0)]), max_steps=8)
    summary = _search(RestartConfig(num_seeds=3, explore_fraction=1.0), runner, tmp_path, 8)
    # at step 8: 1.5, 1.5, 1.125
    assert summary["winner"] == "seed-2"
    assert [c[:2] for c in runner.calls] == [("seed-0", 8), ("seed-1", 8), ("seed-2", 8)]
    assert summary["winner_final_metric"] == pytest.approx(1.125)
    assert summary["total_steps"] == 24


@pytest.mark.parametrize("vary, expected", [("model", [(5, 9), (6, 9), (7, 9)]), ("data", [(5, 9), (5, 10), (5, 11)])])
def test_seeds_recorded_per_trial_and_handed_to_runner(tmp_path, vary, expected):
    seen = []

    def table(trial, step):
        seen.append((trial.model_seed, trial.data_seed))
        return {"eval_loss": 1.0 + trial.index}

    cfg = RestartConfig(num_seeds=3, explore_fraction=0.5, seed=5, data_seed=9, vary=vary)
    summary = _search(cfg, StubRunner(table, max_steps=4), tmp_path, 4)
    assert [(r["model_seed"], r["data_seed"]) for r in summary["trials"]] == expected
    assert sorted(set(seen)) == expected


# ----------------------------------------------------------------------------------------------------------
# successive halving
# ----------------------------------------------------------------------------------------------------------


def test_successive_halving_keeps_the_best_half_per_rung(tmp_path):
    runner = StubRunner(hyperbolic(SH_COEFFS), max_steps=40)
    cfg = RestartConfig(num_seeds=8, explore_fraction=0.4, rungs=3, keep_fraction=0.5)
    orch = RestartOrchestrator(cfg, runner, tmp_path, max_steps=40)
    summary = orch.run()

    assert summary["rung_steps"] == [4, 8, 16]
    rungs = orch.state.rungs
    # step 4: 2:3.5 3:3.6 0:4.0 1:4.25 | 5:4.4 7:4.7 6:5.0 4:5.5
    assert rungs[0].kept == ["seed-2", "seed-3", "seed-0", "seed-1"]
    # step 8: 1:2.625 0:3.0 | 3:3.1 2:3.25   (the rung-0 leader is cut here)
    assert rungs[1].entrants == ["seed-2", "seed-3", "seed-0", "seed-1"]
    assert rungs[1].kept == ["seed-1", "seed-0"]
    # step 16: 1:1.8125 0:2.5
    assert rungs[2].ranking == ["seed-1", "seed-0"]
    assert summary["winner"] == "seed-1"
    assert summary["winner_final_metric"] == pytest.approx(1.0 + 13 / 40)

    # each rung resumes the previous rung's checkpoint; nothing is trained twice
    ck = lambda t, s: str(tmp_path / "trials" / t / f"checkpoint-{s}")  # noqa: E731
    assert [c[:3] for c in runner.calls] == (
        [(f"seed-{i}", 4, None) for i in range(8)]
        + [(t, 8, ck(t, 4)) for t in ["seed-2", "seed-3", "seed-0", "seed-1"]]
        + [(t, 16, ck(t, 8)) for t in ["seed-1", "seed-0"]]
        + [("seed-1", 40, ck("seed-1", 16))]
    )
    rows = {r["trial_id"]: r for r in summary["trials"]}
    assert rows["seed-4"]["dropped_at_rung"] == 0 and rows["seed-4"]["rung_metrics"] == [5.5, None, None]
    assert rows["seed-2"]["dropped_at_rung"] == 1 and rows["seed-2"]["rung_metrics"] == pytest.approx([3.5, 3.25, None])
    assert rows["seed-0"]["dropped_at_rung"] == 2 and rows["seed-0"]["rung_metrics"] == pytest.approx([4.0, 3.0, 2.5])
    assert rows["seed-1"]["rung_metrics"] == pytest.approx([4.25, 2.625, 1.8125])
    assert summary["total_steps"] == 8 * 4 + 4 * 4 + 2 * 8 + 24 == summary["planned_steps"] == 88

    rung0 = [4.0, 4.25, 3.5, 3.6, 5.5, 4.4, 5.0, 4.7]
    st = summary["rung_stats"][0]
    assert st["n"] == 8
    assert st["mean"] == pytest.approx(statistics.fmean(rung0))
    assert st["std"] == pytest.approx(statistics.stdev(rung0))
    assert (st["min"], st["max"]) == (3.5, 5.5)
    assert summary["rung_stats"][2]["n"] == 2


def test_search_time_curve_charges_every_trial_before_the_winner_counts(tmp_path):
    def table(trial, step):  # 0.5 s of training per step, for every seed
        a, b = SH_COEFFS[trial.index]
        return {"eval_loss": a + b / step, "train_seconds": 0.5 * step}

    runner = StubRunner(table, max_steps=40)
    summary = _search(RestartConfig(num_seeds=8, explore_fraction=0.4, rungs=3), runner, tmp_path, 40)
    w = next(r for r in summary["trials"] if r["chosen"])
    winner_evals = [{"step": s, **table(type("T", (), {"index": 1}), s)} for s in range(18, 41, 2)]
    curve = restarts.search_time_curve(summary, winner_evals, tokens_per_step=10)
    # exploration: 4 seeds stop at 4, 2 at 8, seed-0 and the winner at 16 -> 64 steps, 32 s
    assert curve[0] == {"step": 16, "tokens": 640, "seconds": 32.0, "eval_loss": pytest.approx(1.8125)}
    assert [p["step"] for p in curve] == [16] + list(range(18, 41, 2))
    assert curve[-1] == {"step": 40, "tokens": 880, "seconds": 44.0, "eval_loss": pytest.approx(1.325)}
    assert curve[-1]["tokens"] == summary["total_steps"] * 10 and w["trial_id"] == "seed-1"
    # from the summary JSON on disk (string step keys) the curve is the same
    on_disk = json.loads((tmp_path / SUMMARY_JSON).read_text())
    assert restarts.search_time_curve(on_disk, winner_evals, tokens_per_step=10) == curve


# ----------------------------------------------------------------------------------------------------------
# divergence
# ----------------------------------------------------------------------------------------------------------


def _divergent_table(trial, step):
    # seed-0: NaN at an intermediate eval though it ends the lowest; seed-1 flagged by the runner (lowest too);
    # seed-2: above the threshold; seed-3 ok (2.0); seed-4, seed-5 (replacements) ok at 1.9 and 1.8
    base = {0: 0.5, 1: 0.6, 2: 9.0, 3: 2.0, 4: 1.9, 5: 1.8, 6: 1.7}[trial.index]
    if trial.index == 0 and step == 2:
        return {"eval_loss": NAN}
    return {"eval_loss": base}


def test_diverged_seeds_are_reported_and_never_chosen(tmp_path):
    runner = StubRunner(_divergent_table, max_steps=10, flag_diverged={43})
    cfg = RestartConfig(num_seeds=4, explore_fraction=0.4, divergence_threshold=8.0, seed=42)
    summary = _search(cfg, runner, tmp_path, 10)
    assert summary["winner"] == "seed-3"
    rows = {r["trial_id"]: r for r in summary["trials"]}
    assert [rows[t]["diverged"] for t in ("seed-0", "seed-1", "seed-2", "seed-3")] == [True, True, True, False]
    assert rows["seed-0"]["diverged_reason"] == "eval_loss is nan at step 2"
    assert rows["seed-1"]["diverged_reason"] == "the runner reported divergence"
    assert rows["seed-2"]["diverged_reason"] == (
        "eval_loss 9 at step 4 did not improve past divergence_threshold 8.0"
    )
    assert summary["num_diverged"] == 3
    assert summary["rung_stats"][0] == {"rung": 0, "step": 4, "n": 1, "mean": 2.0, "std": None, "min": 2.0, "max": 2.0}
    assert [c[:2] for c in runner.calls][-1] == ("seed-3", 10)
    md = (tmp_path / SUMMARY_MD).read_text()
    assert "| seed-0 | 42 | 42 | 0.5000 | - | diverged (eval_loss is nan at step 2) |" in md
    assert "| seed-3 | 45 | 45 | 2.0000 | 2.0000 | **chosen** |" in md


def test_diverged_seeds_are_replaced_when_asked(tmp_path):
    runner = StubRunner(_divergent_table, max_steps=10, flag_diverged={43})
    cfg = RestartConfig(num_seeds=4, explore_fraction=0.4, divergence_threshold=8.0, seed=42, replace_diverged=True,
                        max_replacements=2)
    summary = _search(cfg, runner, tmp_path, 10)
    rows = {r["trial_id"]: r for r in summary["trials"]}
    # seed-0 and seed-1 get fresh seeds 46 and 47 (trained from scratch to the rung); the cap stops at 2,
    # so seed-2 is not replaced
    assert rows["seed-4"]["replaces"] == "seed-0" and rows["seed-4"]["model_seed"] == 46
    assert rows["seed-5"]["replaces"] == "seed-1" and rows["seed-5"]["model_seed"] == 47
    assert "seed-6" not in rows
    assert ("seed-4", 4, None) in [c[:3] for c in runner.calls] and ("seed-5", 4, None) in [c[:3] for c in runner.calls]
    assert summary["winner"] == "seed-5"  # 1.8 beats 1.9 and 2.0
    assert summary["winner_final_metric"] == pytest.approx(1.8)
    assert summary["rung_stats"][0]["n"] == 3


def test_replacement_of_a_replacement_and_unlimited_budget(tmp_path):
    # seed-4 (the replacement of seed-0) diverges too and is itself replaced by seed-5
    def table(trial, step):
        return {"eval_loss": {0: NAN, 1: 3.0, 2: 2.5, 3: NAN, 4: 2.0}[trial.index]}

    runner = StubRunner(table, max_steps=6)
    cfg = RestartConfig(num_seeds=3, explore_fraction=0.5, replace_diverged=True)
    summary = _search(cfg, runner, tmp_path, 6)
    rows = {r["trial_id"]: r for r in summary["trials"]}
    assert rows["seed-3"]["replaces"] == "seed-0" and rows["seed-3"]["diverged"]
    assert rows["seed-4"]["replaces"] == "seed-3" and not rows["seed-4"]["diverged"]
    assert summary["winner"] == "seed-4"


def test_winner_that_diverges_while_continuing_falls_back_to_the_next_best(tmp_path):
    def table(trial, step):
        v = {0: 2.0, 1: 1.0, 2: 1.5}[trial.index]
        return {"eval_loss": NAN if (trial.index == 1 and step > 6) else v}

    runner = StubRunner(table, max_steps=12)
    summary = _search(RestartConfig(num_seeds=3, explore_fraction=0.5), runner, tmp_path, 12)
    assert [c[:2] for c in runner.calls][3:] == [("seed-1", 12), ("seed-2", 12)]
    rows = {r["trial_id"]: r for r in summary["trials"]}
    assert rows["seed-1"]["diverged"] and rows["seed-1"]["diverged_reason"] == "eval_loss is nan at step 8"
    assert summary["winner"] == "seed-2" and summary["winner_final_metric"] == 1.5


def test_all_seeds_diverged_raises_after_writing_the_summary(tmp_path):
    runner = StubRunner(lambda t, s: {"eval_loss": NAN}, max_steps=4)
    with pytest.raises(RuntimeError, match="all 2 trials diverged"):
        _search(RestartConfig(num_seeds=2, explore_fraction=0.5), runner, tmp_path, 4)
    data = json.loads((tmp_path / SUMMARY_JSON).read_text())
    assert data["winner"] is None and data["num_diverged"] == 2
    assert data["trials"][0]["rung_metrics"] == ["nan"]  # non-finite values stay valid JSON
    assert "No winner: every seed diverged." in (tmp_path / SUMMARY_MD).read_text()


# ----------------------------------------------------------------------------------------------------------
# kill and resume
# ----------------------------------------------------------------------------------------------------------


def _kill_config():
    # successive halving + divergence + replacement: every kind of transition appears
    return RestartConfig(num_seeds=4, explore_fraction=0.5, rungs=2, keep_fraction=0.5, seed=0,
                         divergence_threshold=8.0, replace_diverged=True)


def _kill_table(trial, step):
    a, b = [(1.0, 8.0), (9.0, 0.0), (0.5, 12.0), (1.5, 2.0), (0.8, 6.0)][trial.index]
    return {"eval_loss": a + b / step}


def _comparable(summary, out):
    """The summary without start counts, with the output directory written as OUT."""
    rows = [{k: v for k, v in r.items() if k != "starts"} for r in summary["trials"]]
    return json.dumps(dict(summary, trials=rows), sort_keys=True).replace(str(out), "OUT")


@pytest.mark.slow
def test_kill_mid_trial_then_resume_finishes_with_same_choice_and_no_rerun(tmp_path):
    straight_runner = StubRunner(_kill_table, max_steps=12)
    straight = _search(_kill_config(), straight_runner, tmp_path / "straight", 12)
    # rungs at 3, 6. Step 3: seed-1 9.0 > 8 diverges, seed-4 replaces it; 3:2.17 4:2.8 | 0:3.67 2:4.5.
    # Step 6: 4:1.8 3:1.83 -> the replacement wins.
    assert straight["rung_steps"] == [3, 6] and straight["winner"] == "seed-4"
    n_calls = len(straight_runner.calls)
    assert n_calls == 4 + 1 + 2 + 1  # 4 seeds + 1 replacement at rung 0, 2 at rung 1, 1 continuation

    for k in range(1, n_calls + 1):
        out = tmp_path / f"kill{k}"
        first = StubRunner(_kill_table, max_steps=12, kill_at_call=k)
        with pytest.raises(SimulatedKill):
            _search(_kill_config(), first, out, 12)
        recorded = {
            (tid, int(s))
            for tid, t in json.loads((out / STATE_FILE).read_text())["trials"].items()
            for s in t["results"]
        }
        assert recorded == set(first.finished)  # finished == recorded in state
        second = StubRunner(_kill_table, max_steps=12)
        resumed = RestartOrchestrator(_kill_config(), second, out, 12).run()
        # no finished trial rerun: the killed stage is started again, nothing else
        assert not recorded & {c[:2] for c in second.calls}
        assert len(first.calls) + len(second.calls) == n_calls + 1
        assert [c[:2] for c in first.calls + second.calls] == (
            [c[:2] for c in straight_runner.calls[:k]] + [c[:2] for c in straight_runner.calls[k - 1:]]
        )
        assert _comparable(resumed, out) == _comparable(straight, tmp_path / "straight")
        killed_trial = straight_runner.calls[k - 1][0]
        assert {r["trial_id"]: r["starts"] for r in resumed["trials"]}[killed_trial] == (
            sum(c[0] == killed_trial for c in straight_runner.calls) + 1
        )


def test_kill_at_every_state_transition_then_resume(tmp_path, monkeypatch):
    """A kill before any state write (the disk keeps the previous state) resumes to the same result."""
    monkeypatch.setattr(RestartOrchestrator, "plot", lambda self, summary, path: None)  # ~40 runs: skip the PNGs
    # ~800 state writes: a kill here is an exception before a write, so the fsync of each write adds nothing
    monkeypatch.setattr(os, "fsync", lambda fd: None)
    straight = _search(_kill_config(), StubRunner(_kill_table, max_steps=12), tmp_path / "straight", 12)
    saves = []
    real_save = RestartOrchestrator._save
    monkeypatch.setattr(RestartOrchestrator, "_save", lambda self: (saves.append(1), real_save(self)))
    _search(_kill_config(), StubRunner(_kill_table, max_steps=12), tmp_path / "count", 12)
    n_saves = len(saves)
    assert n_saves > 20

    for k in range(1, n_saves + 1):
        count = [0]

        def dying_save(self, k=k, count=count):
            count[0] += 1
            if count[0] == k:
                raise SimulatedKill(f"killed before save {k}")
            real_save(self)

        out = tmp_path / f"save{k}"
        monkeypatch.setattr(RestartOrchestrator, "_save", dying_save)
        first = StubRunner(_kill_table, max_steps=12)
        with pytest.raises(SimulatedKill):
            _search(_kill_config(), first, out, 12)
        monkeypatch.setattr(RestartOrchestrator, "_save", real_save)
        recorded = set()
        if (out / STATE_FILE).exists():
            state = json.loads((out / STATE_FILE).read_text())
            recorded = {(tid, int(s)) for tid, t in state["trials"].items() for s in t["results"]}
        second = StubRunner(_kill_table, max_steps=12)
        resumed = _search(_kill_config(), second, out, 12)
        assert not recorded & {c[:2] for c in second.calls}, k
        assert _comparable(resumed, out) == _comparable(straight, tmp_path / "straight"), k


def test_resume_of_a_finished_search_runs_nothing(tmp_path):
    _search(_kill_config(), StubRunner(_kill_table, max_steps=12), tmp_path, 12)
    again = StubRunner(_kill_table, max_steps=12)
    summary = _search(_kill_config(), again, tmp_path, 12)
    assert again.calls == [] and summary["winner"] == "seed-4"


def test_resume_with_other_settings_fails_naming_the_field(tmp_path):
    _search(_kill_config(), StubRunner(_kill_table, max_steps=12), tmp_path, 12)
    runner = StubRunner(_kill_table, max_steps=12)
    cfg = _kill_config()
    cfg.num_seeds = 5
    with pytest.raises(ValueError, match=r"num_seeds: 4 in the state, 5 now"):
        _search(cfg, runner, tmp_path, 12)
    with pytest.raises(ValueError, match=r"max_steps: 12 in the state, 14 now"):
        _search(_kill_config(), StubRunner(_kill_table, max_steps=14), tmp_path, 14)
    assert runner.calls == []


# ----------------------------------------------------------------------------------------------------------
# parallel
# ----------------------------------------------------------------------------------------------------------


def test_parallel_per_gpu_gives_each_concurrent_trial_its_own_device(tmp_path):
    seq_runner = StubRunner(hyperbolic(SH_COEFFS), 40)
    seq = _search(RestartConfig(num_seeds=8, explore_fraction=0.4, rungs=3), seq_runner, tmp_path / "seq", 40)
    runner = StubRunner(hyperbolic(SH_COEFFS), 40, delay=0.05)
    cfg = RestartConfig(num_seeds=8, explore_fraction=0.4, rungs=3, parallel="per_gpu", devices=["0", "1", "2"])
    par = _search(cfg, runner, tmp_path / "par", 40)
    assert par["winner"] == seq["winner"] == "seed-1"
    assert [(r["rung_metrics"], r["status"]) for r in par["trials"]] == [
        (r["rung_metrics"], r["status"]) for r in seq["trials"]
    ]
    assert sorted(c[:2] for c in runner.calls) == sorted(c[:2] for c in seq_runner.calls)
    assert {c[3] for c in runner.calls} == {"0", "1", "2"} and {c[3] for c in seq_runner.calls} == {None}
    assert runner.max_active == 3  # three trials at once, each on its own device
    assert seq_runner.max_active == 1


# ----------------------------------------------------------------------------------------------------------
# outputs
# ----------------------------------------------------------------------------------------------------------


def test_summary_files_json_markdown_and_png(tmp_path):
    _search(RestartConfig(num_seeds=8, explore_fraction=0.4, rungs=3), StubRunner(hyperbolic(SH_COEFFS), 40),
                 tmp_path, 40)
    data = json.loads((tmp_path / SUMMARY_JSON).read_text())
    assert data["winner"] == "seed-1" and data["metric"] == "eval_loss" and data["rung_steps"] == [4, 8, 16]
    md = (tmp_path / SUMMARY_MD).read_text().splitlines()
    assert md[0] == (
        "| trial | model_seed | data_seed | eval_loss @ 4 | eval_loss @ 8 | eval_loss @ 16 | "
        "eval_loss @ 40 (final) | status |"
    )
    assert md[3] == "| seed-1 | 43 | 43 | 4.2500 | 2.6250 | 1.8125 | 1.3250 | **chosen** |"
    assert md[6] == "| seed-4 | 46 | 46 | 5.5000 | - | - | - | dropped at rung 0 |"
    assert md[10] == "| *mean* |  |  | 4.3688 | 2.9937 | 2.1562 |  |  |"  # 2.99375 in binary rounds down
    assert md[12] == "| *min* |  |  | 3.5000 | 2.6250 | 1.8125 |  |  |"
    png = (tmp_path / CURVES_PNG).read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


# ----------------------------------------------------------------------------------------------------------
# validation: before any trial starts
# ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"num_seeds": 0}, "num_seeds: got 0;"),
        ({"num_seeds": -2}, "num_seeds: got -2;"),
        ({"num_seeds": 2.0}, "num_seeds: got 2.0;"),
        ({"explore_fraction": 0.0}, "explore_fraction: got 0.0;"),
        ({"explore_fraction": 1.5}, "explore_fraction: got 1.5;"),
        ({"explore_fraction": -0.1}, "explore_fraction: got -0.1;"),
        ({"explore_fraction": NAN}, "explore_fraction: got nan;"),
        ({"direction": "minimize"}, "direction: got 'minimize';"),
        ({"direction": "up"}, "direction: got 'up';"),
        ({"metric": ""}, "metric: got '';"),
        ({"rungs": 0}, "rungs: got 0;"),
        ({"keep_fraction": 1.0}, "keep_fraction: got 1.0;"),
        ({"keep_fraction": 0}, "keep_fraction: got 0;"),
        ({"divergence_threshold": math.inf}, "divergence_threshold: got inf;"),
        ({"vary": "neither"}, "vary: got 'neither';"),
        ({"parallel": True}, "parallel: got True;"),
        ({"parallel": "per_node"}, "parallel: got 'per_node';"),
        ({"max_replacements": -1}, "max_replacements: got -1;"),
        ({"seed": -1}, "seed: got -1;"),
        ({"devices": []}, "devices: got [];"),
    ],
)
def test_invalid_config_fails_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match="RestartConfig." + field.replace("[", r"\[").replace("]", r"\]")):
        RestartConfig(**kwargs)


def test_invalid_settings_fail_before_any_trial_starts(tmp_path, monkeypatch):
    runner = StubRunner(hyperbolic(SH_COEFFS), 40)
    msg = r"RestartConfig.metric: got 'eval_accuracy'; allowed: eval_loss \(what this runner reports\)"
    with pytest.raises(ValueError, match=msg):
        _search(RestartConfig(metric="accuracy"), runner, tmp_path / "a", 40)
    with pytest.raises(ValueError, match=r"^RestartConfig.rungs: got 4, .* cuts the 10 steps at 1, 1, 2, 4; "):
        _search(RestartConfig(explore_fraction=0.4, rungs=4), runner, tmp_path / "b", 10)
    with pytest.raises(ValueError, match=r"^max_steps: got 0; must be an integer >= 1$"):
        _search(RestartConfig(), runner, tmp_path / "c", 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    with pytest.raises(ValueError, match=r"parallel: got 'per_gpu', but no GPU is visible"):
        _search(RestartConfig(parallel="per_gpu"), runner, tmp_path / "d", 40)
    assert runner.calls == []
    assert not any((tmp_path / d).exists() for d in "abcd")


def test_runner_protocol():
    assert isinstance(StubRunner(hyperbolic(SH_COEFFS), 40), TrialRunner)
    with pytest.raises(ValueError, match="runner=.* must have a run"):
        RestartOrchestrator(RestartConfig(), object(), "unused", 10)


# ----------------------------------------------------------------------------------------------------------
# the state file: typed in memory, version-1 layout on disk
# ----------------------------------------------------------------------------------------------------------

V1 = Path(__file__).parent / "data" / "restarts_v1"
V1_CONFIG = dict(num_seeds=8, explore_fraction=0.4, rungs=3, replace_diverged=True, seed=42)


def _v1_runner():
    """The runner the fixture was made with (by the single-module orchestrator, killed in its 11th call)."""
    return StubRunner(hyperbolic(SH_COEFFS + [(2.5, 3)] * 4), 40, flag_diverged={44})


def test_state_file_of_version_1_reads_typed_and_writes_back_unchanged():
    raw = json.loads((V1 / "restarts_state_killed.json").read_text())
    state = SearchState.from_json(raw)
    assert state.to_json() == raw
    assert state.order == [f"seed-{i}" for i in range(9)] and state.rung_steps == [4, 8, 16]
    t2, t3, t8 = state.trials["seed-2"], state.trials["seed-3"], state.trials["seed-8"]
    assert (t2.status, t2.diverged_reason, t2.replaced_by) == ("diverged", "the runner reported divergence", "seed-8")
    assert (t8.replaces, t8.model_seed, t8.data_seed) == ("seed-2", 50, 50)
    assert t3.status == "running" and t3.starts == 2 and sorted(t3.results) == [4]  # killed in its rung-1 stage
    assert t3.results[4] == StageResult(3.6, {"eval_loss": 3.6}, "search/trials/seed-3/checkpoint-4", False)
    assert t3.history == {2: pytest.approx(4.6), 4: 3.6} and t3.last_checkpoint(8) == "search/trials/seed-3/checkpoint-4"
    assert t3.last_checkpoint(4) is None
    assert state.rungs[0].kept == ["seed-8", "seed-3", "seed-0", "seed-1"] and state.rungs[1].done is False
    assert (state.replacements_used, state.continuation, state.winner, state.done) == (1, None, None, False)


def test_resume_of_a_state_file_written_by_the_first_orchestrator(tmp_path, monkeypatch):
    """The fixture is the state a killed search left (written by the 1,175-line module this package replaced);
    resumed here it runs the same remaining calls and writes the same summary as that module did."""
    raw = json.loads((V1 / "restarts_state_killed.json").read_text())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "search").mkdir()
    (tmp_path / "search" / STATE_FILE).write_text(json.dumps(raw))
    for tid, t in raw["trials"].items():  # the checkpoints the killed run left behind
        for step, r in t["results"].items():
            os.makedirs(r["checkpoint_dir"])
            with open(os.path.join(r["checkpoint_dir"], "marker.json"), "w") as f:
                json.dump({"trial_id": tid, "model_seed": t["model_seed"], "step": int(step)}, f)
    runner = _v1_runner()
    summary = RestartOrchestrator(RestartConfig(**V1_CONFIG), runner, "search", 40).run()

    expected_calls = json.loads((V1 / "calls_after_resume.json").read_text())["calls_after_resume"]
    assert [list(c) for c in runner.calls] == expected_calls
    assert summary["winner"] == "seed-1" and summary["total_steps"] == 92
    assert (tmp_path / "search" / SUMMARY_MD).read_text() == (V1 / "restarts_summary.md").read_text()
    written = json.loads((tmp_path / "search" / SUMMARY_JSON).read_text())
    # what the summary gained since (failed trials, the backend settings) holds nothing for this search
    assert written.pop("num_failed") == 0
    assert [(r.pop("failed"), r.pop("failed_reason")) for r in written["trials"]] == [(False, None)] * 9
    assert {k: written["config"].pop(k) for k in ("backend", "ray_address", "trial_resources", "max_concurrent")} \
        == {"backend": "local", "ray_address": None, "trial_resources": None, "max_concurrent": None}
    assert written == json.loads((V1 / "restarts_summary.json").read_text())
    # resumed, the state was upgraded: version 2, paths relative to output_dir, this driver's generation
    state = json.loads((tmp_path / "search" / STATE_FILE).read_text())
    assert (state["version"], state["generation"]) == (2, 1)
    assert state["trials"]["seed-3"]["output_dir"] == "trials/seed-3"
    assert state["trials"]["seed-3"]["results"]["4"]["checkpoint_dir"] == "trials/seed-3/checkpoint-4"


def test_state_file_of_another_version_is_refused(tmp_path):
    raw = json.loads((V1 / "restarts_state_killed.json").read_text())
    (tmp_path / STATE_FILE).write_text(json.dumps(dict(raw, version=3)))
    with pytest.raises(ValueError, match=r"has state version 3; expected one of \[1, 2\]"):
        _search(RestartConfig(**V1_CONFIG), _v1_runner(), tmp_path, 40)


@pytest.mark.parametrize(
    "history, value, threshold, direction, expected",
    [  # (step, value) seen before the rung; the rung's value; what the trial's status becomes
        ([(2, 3.0)], 2.0, None, "min", "alive"),
        ([(2, NAN)], 2.0, None, "min", "diverged"),  # a NaN anywhere before the rung
        ([(2, 3.0)], float("inf"), None, "min", "diverged"),
        ([(2, 3.0)], 9.5, 9.0, "min", "diverged"),  # did not get below the threshold
        ([(2, 3.0)], 0.2, 0.5, "max", "diverged"),  # did not get above it
        ([(2, 3.0)], 0.7, 0.5, "max", "alive"),
    ],
)
def test_divergence_check_sets_the_typed_status(tmp_path, history, value, threshold, direction, expected):
    cfg = RestartConfig(num_seeds=1, explore_fraction=0.5, divergence_threshold=threshold, direction=direction)
    orch = RestartOrchestrator(cfg, StubRunner(lambda t, s: {}, 4), tmp_path, 4)
    orch._load_or_init()
    t = orch.state.trials["seed-0"]
    t.history = dict(history)
    t.results[2] = StageResult(value, {"eval_loss": value}, None)
    t.status = "alive"
    assert orch._check_divergence("seed-0", 2) is (expected == "diverged")
    assert t.status == expected
    on_disk = json.loads((tmp_path / STATE_FILE).read_text())["trials"]["seed-0"]["status"]
    assert on_disk == ("diverged" if expected == "diverged" else "pending")  # saved at once, only on a change


# ----------------------------------------------------------------------------------------------------------
# execution backends: failed stages, fencing, a moved search directory, the Ray settings (no Ray needed)
# ----------------------------------------------------------------------------------------------------------


class FailingRunner(StubRunner):
    """A StubRunner whose stages in ``fail`` (trial_id, until_step) -> times raise StageFailed first."""

    def __init__(self, *args, fail=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail = dict(fail or {})

    def run(self, trial, until_step, resume_from):
        key = (trial.trial_id, until_step)
        if self.fail.get(key, 0) > 0:
            self.fail[key] -= 1
            with self.lock:
                self.calls.append((trial.trial_id, until_step, resume_from, trial.device))
            raise restarts.StageFailed(f"worker lost on {trial.trial_id}")
        return super().run(trial, until_step, resume_from)


def test_a_failed_stage_is_retried_once_then_the_trial_is_marked_failed(tmp_path):
    cfg = RestartConfig(num_seeds=8, explore_fraction=0.4, rungs=3)
    straight = _search(cfg, StubRunner(hyperbolic(SH_COEFFS), 40), tmp_path / "a", 40)
    # seed-3 fails once on its way to step 8 (retried from checkpoint-4); seed-1, the leader, fails twice at 16
    runner = FailingRunner(hyperbolic(SH_COEFFS), 40, fail={("seed-3", 8): 1, ("seed-1", 16): 2})
    summary = _search(cfg, runner, tmp_path / "b", 40)
    rows = {r["trial_id"]: r for r in summary["trials"]}
    ckpt4 = os.path.join(str(tmp_path / "b"), "trials", "seed-3", "checkpoint-4")
    assert [c[:3] for c in runner.calls if c[0] == "seed-3"] == [("seed-3", 4, None), ("seed-3", 8, ckpt4),
                                                                  ("seed-3", 8, ckpt4)]
    assert rows["seed-3"]["rung_metrics"][:2] == {r["trial_id"]: r for r in straight["trials"]}["seed-3"][
        "rung_metrics"][:2]
    assert (rows["seed-3"]["starts"], rows["seed-3"]["failed"]) == (3, False)
    assert rows["seed-1"]["status"] == "failed" and rows["seed-1"]["starts"] == 4 and not rows["seed-1"]["chosen"]
    assert rows["seed-1"]["failed_reason"] == "stage to step 16 failed twice: worker lost on seed-1"
    assert straight["winner"] == "seed-1" and summary["winner"] == "seed-0" and summary["num_failed"] == 1
    md = (tmp_path / "b" / SUMMARY_MD).read_text()
    assert "| failed (stage to step 16 failed twice: worker lost on seed-1) |" in md
    assert "1 failed." in md


def test_a_failure_before_a_driver_restart_counts_toward_the_retry(tmp_path):
    cfg = RestartConfig(num_seeds=2, explore_fraction=0.5)
    first = FailingRunner(hyperbolic(SH_COEFFS), 8, fail={("seed-0", 4): 1}, kill_at_call=2)
    with pytest.raises(SimulatedKill):  # seed-0 failed once, then the driver died during its retry
        _search(cfg, first, tmp_path, 8)
    state = json.loads((tmp_path / STATE_FILE).read_text())
    assert state["trials"]["seed-0"]["failures"] == 1 and state["generation"] == 1
    second = FailingRunner(hyperbolic(SH_COEFFS), 8, fail={("seed-0", 4): 1})
    summary = _search(cfg, second, tmp_path, 8)
    assert {r["trial_id"]: r["status"] for r in summary["trials"]} == {"seed-0": "failed", "seed-1": "chosen"}
    assert json.loads((tmp_path / STATE_FILE).read_text())["generation"] == 2


def test_each_driver_raises_the_generation_and_hands_it_to_its_stages(tmp_path):
    cfg = RestartConfig(num_seeds=2, explore_fraction=0.5)
    runner = StubRunner(hyperbolic(SH_COEFFS), 8, kill_at_call=2)
    seen = []
    orig = runner.run
    def run(trial, until, resume):
        seen.append((trial.generation, trial.state_path))
        return orig(trial, until, resume)

    runner.run = run
    with pytest.raises(SimulatedKill):
        _search(cfg, runner, tmp_path, 8)
    runner.kill_at_call = None
    _search(cfg, runner, tmp_path, 8)
    path = os.path.abspath(tmp_path / STATE_FILE)
    assert seen == [(1, path), (1, path), (2, path), (2, path)]
    assert restarts.state.read_generation(path) == 2
    restarts.state.check_generation(path, 2)
    with pytest.raises(restarts.state.StaleStageError, match="launched by generation 1 .* now holds generation 2"):
        restarts.state.check_generation(path, 1)
    restarts.state.check_generation(None, 1)  # a stage with no fence: nothing to check


def test_a_search_directory_moved_elsewhere_resumes_there(tmp_path):
    cfg = RestartConfig(num_seeds=4, explore_fraction=0.5, rungs=2)
    first = StubRunner(hyperbolic(SH_COEFFS), 8, kill_at_call=5)
    with pytest.raises(SimulatedKill):
        _search(cfg, first, tmp_path / "here", 8)
    state = json.loads((tmp_path / "here" / STATE_FILE).read_text())
    assert state["version"] == 2 and state["trials"]["seed-0"]["output_dir"] == "trials/seed-0"
    assert state["trials"]["seed-0"]["results"]["2"]["checkpoint_dir"] == "trials/seed-0/checkpoint-2"
    shutil.move(str(tmp_path / "here"), str(tmp_path / "there"))
    second = StubRunner(hyperbolic(SH_COEFFS), 8)
    summary = _search(cfg, second, tmp_path / "there", 8)
    straight = _search(cfg, StubRunner(hyperbolic(SH_COEFFS), 8), tmp_path / "straight", 8)
    assert summary["winner"] == straight["winner"]
    # resumed from the moved checkpoints (the stub reads each marker)
    assert all(c[2] is None or c[2].startswith(str(tmp_path / "there")) for c in second.calls)
    assert len(first.calls) - 1 + len(second.calls) == len(straight["trials"]) + 2 + 1  # 4 + 2 at rung 1 + winner


class _ConcurrencyProbe(StubRunner):
    def run(self, trial, until_step, resume_from):
        with self.lock:
            self.active_n = getattr(self, "active_n", 0) + 1
            self.peak = max(getattr(self, "peak", 0), self.active_n)
        try:
            return super().run(trial, until_step, resume_from)
        finally:
            with self.lock:
                self.active_n -= 1


@pytest.mark.parametrize("max_concurrent, peak", [(2, 2), (None, 4), (1, 1)])
def test_max_concurrent_bounds_the_stages_in_flight(tmp_path, max_concurrent, peak):
    cfg = RestartConfig(num_seeds=4, explore_fraction=1.0, backend="ray", max_concurrent=max_concurrent)
    runner = _ConcurrencyProbe(hyperbolic(SH_COEFFS), 4, delay=0.4)
    _search(cfg, runner, tmp_path, 4)
    assert runner.peak == peak


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(backend="slurm"), "backend: got 'slurm'; allowed: local, ray"),
        (dict(backend="ray", ray_address="somewhere"), "ray_address: got 'somewhere';"),
        (dict(backend="ray", trial_resources={"num_gpus": -1}), "trial_resources: got {'num_gpus': -1};"),
        (dict(backend="ray", trial_resources="{not json"), "trial_resources: got '{not json';"),
        (dict(backend="ray", max_concurrent=0), "max_concurrent: got 0;"),
        (dict(max_concurrent=2), "max_concurrent: got 2; must be None with backend='local'"),
        (dict(ray_address="auto"), "ray_address: got 'auto'; must be None with backend='local'"),
        (dict(backend="ray", parallel="per_gpu"), "parallel: got 'per_gpu'; must be False with backend='ray'"),
    ],
)
def test_backend_settings_fail_naming_the_field(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        RestartConfig(**kwargs)


def test_backend_settings_are_parsed_and_do_not_change_the_search():
    cfg = RestartConfig(backend="ray", ray_address="ray://10.0.0.1:10001", trial_resources='{"num_gpus": 1}',
                        max_concurrent=4)
    assert cfg.trial_resources == {"num_gpus": 1} and cfg.ray_address == "ray://10.0.0.1:10001"
    assert RestartConfig(backend="ray", ray_address="none").ray_address is None
    assert cfg.search_dict() == RestartConfig().search_dict()  # a search may resume on the other backend


def test_shared_storage_check_refuses_a_node_that_does_not_see_output_dir(tmp_path):
    from hf_fasttrain.restarts.ray_backend import _probe, check_shared_storage

    # a node that shares the directory
    check_shared_storage(str(tmp_path / "out"), lambda d, f, t: [_probe(d, f, t)])
    assert os.listdir(tmp_path / "out") == []  # the probe files are removed
    # a node with its own disk at the same path: it cannot read the driver's file
    elsewhere = tmp_path / "node-disk"

    def other_disk(d, f, t):
        return [_probe(str(elsewhere / os.path.basename(d)), f, t)]

    with pytest.raises(ValueError) as e:
        check_shared_storage(str(tmp_path / "out"), other_disk)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(f"output_dir={str(tmp_path / 'out')!r} is not shared with the Ray workers")
    assert "cannot read the driver's file" in msg and "mounts at the same path" in msg

    # a node that reads the driver's file but writes somewhere the driver cannot see
    def writes_elsewhere(d, f, t):
        host, problem, name = _probe(d, f, t)
        os.remove(os.path.join(d, name))
        return [(host, problem, name)]

    with pytest.raises(ValueError, match="wrote a file that the driver cannot read"):
        check_shared_storage(str(tmp_path / "out"), writes_elsewhere)


def test_ray_backend_without_ray_is_one_line(monkeypatch):
    import builtins

    from hf_fasttrain.restarts import ray_backend

    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    with pytest.raises(ValueError, match=r"restart_backend='ray' needs Ray, which is not installed; pip install "
                                         r"'hf_fasttrain\[ray\]'"):
        ray_backend.import_ray()


def test_the_package_does_not_import_ray():
    import subprocess
    import sys

    # the search core, its Ray adapter module and the command line (which imports the rest lazily)
    code = ("import sys, hf_fasttrain.restarts, hf_fasttrain.restarts.ray_backend, hf_fasttrain.cli; "
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_cli_restarts_refuses_bad_backend_settings_and_a_missing_ray_in_one_line(tmp_path, capsys, monkeypatch):
    import builtins

    from hf_fasttrain.cli import main as cli_main

    base = ["restarts", "--config", "gpt2_tiny", "--num-seeds", "2", "--output_dir", str(tmp_path / "out")]
    assert cli_main(base + ["--backend", "ray", "--max-concurrent", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: restart_max_concurrent: got 0; must be an integer >= 1 or null"]
    assert cli_main(base + ["--max-concurrent", "2"]) == 2  # a Ray setting without the Ray backend
    err = capsys.readouterr().err.strip()
    assert err == ("error: restart_max_concurrent: got 2; must be None with restart_backend='local' (it is a "
                   "setting of restart_backend='ray')")
    real_import = builtins.__import__

    def no_ray(name, *args, **kwargs):
        if name == "ray" or name.startswith("ray."):
            raise ImportError("No module named 'ray'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_ray)
    assert cli_main(base + ["--backend", "ray"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: restart_backend='ray' needs Ray, which is not installed") and "\n" not in err
    assert not (tmp_path / "out" / "trials").exists()  # refused before any trial
