"""Random restart end to end on the tiny GPT-2 recipe: real trials through hf_fasttrain.run.train.train.

One search (3 seeds, 6 steps, exploration 2 steps, seed-2 forced to diverge with a huge learning rate)
is shared by the tests; each claim is checked against an uninterrupted plain run where it says so.
"""

import json
import math

import pytest
from transformers import TrainerCallback

from hf_fasttrain.cli import main as cli_main
from hf_fasttrain.config.recipes import parse_config
from hf_fasttrain.restarts import (
    STATE_FILE,
    SUMMARY_JSON,
    SUMMARY_MD,
    CURVES_PNG,
    RestartOrchestrator,
    restart_config_from_args,
)
from hf_fasttrain.run.recipe_restarts import RecipeTrialRunner, train_with_restarts
from hf_fasttrain.data.from_args import planned_optimizer_steps
from hf_fasttrain.run.train import train

pytestmark = pytest.mark.slow  # real (tiny) training runs: about a minute on an idle 2-core CPU

MAX_STEPS = 6
# gpt2_tiny's sequence-length warmup (16 -> 32 tokens over round(0.3 * 6) = 2 steps) is on: max_steps is still the
# number of optimizer steps
TOTAL_STEPS = 6
TINY = ["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300", "--block_size", "32",
        "--n_layer", "2", "--n_embd", "32", "--n_head", "2", "--per_device_train_batch_size", "8",
        "--max_eval_samples", "32", "--per_device_eval_batch_size", "32", "--logging_steps", "1",
        "--disable_tqdm", "true", "--warmup_steps", "2", "--eval_steps", "2", "--eval_on_start", "false",
        "--save_strategy", "no", "--max_steps", str(MAX_STEPS), "--seed", "42"]
# ln(300) = 5.70: an eval loss above uniform guessing over the vocabulary at the rung is divergence
SEARCH = ["--restart_num_seeds", "3", "--restart_explore_fraction", str(1 / 3),
          "--restart_divergence_threshold", "5.7"]
FORCE_DIVERGE = {2: {"learning_rate": 5.0}}


class Counting:
    """Counts trial starts; passes the rest through."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []

    def run(self, trial, until_step, resume_from):
        self.calls.append((trial.trial_id, until_step))
        return self.inner.run(trial, until_step, resume_from)

    # Passthroughs
    def available_metrics(self):
        return self.inner.available_metrics()


class SimulatedKill(Exception):
    pass


class KillOnce(TrainerCallback):
    """Raises in the middle of the first trial run whose model seed is `seed` (after its first step)."""

    def __init__(self, seed):
        self.seed, self.fired = seed, False

    def on_step_end(self, args, state, control, **kwargs):
        if args.seed == self.seed and not self.fired:
            self.fired = True
            raise SimulatedKill(f"killed at step {state.global_step} of seed {args.seed}")


def _args(out, *extra):
    return parse_config([*TINY, "--output_dir", str(out), *extra])


def _losses(log_history, key="loss"):
    return {e["step"]: e[key] for e in log_history if key in e}


@pytest.fixture(scope="module")
def search(tmp_path_factory):
    out = tmp_path_factory.mktemp("search")
    m, d, t = _args(out, *SEARCH)
    runner = Counting(RecipeTrialRunner(m, d, t, trial_overrides=FORCE_DIVERGE))
    summary = train_with_restarts(m, d, t, runner=runner)
    return out, summary, runner.calls


def test_selection_and_divergence_end_to_end(search):
    out, summary, calls = search
    assert summary["rung_steps"] == [2]
    rows = {r["trial_id"]: r for r in summary["trials"]}
    assert [(r["model_seed"], r["data_seed"]) for r in summary["trials"]] == [(42, 42), (43, 43), (44, 44)]
    # seed-2 (learning_rate 5.0) is reported diverged and never chosen
    assert rows["seed-2"]["diverged"] and rows["seed-2"]["rung_metrics"][0] > 5.7
    assert "did not improve past divergence_threshold 5.7" in rows["seed-2"]["diverged_reason"]
    assert not rows["seed-0"]["diverged"] and not rows["seed-1"]["diverged"]
    # the winner is the healthy seed with the lower eval loss at the exploration step
    v0, v1 = rows["seed-0"]["rung_metrics"][0], rows["seed-1"]["rung_metrics"][0]
    assert v0 != v1
    winner = "seed-0" if v0 < v1 else "seed-1"
    assert summary["winner"] == winner and rows[winner]["chosen"]
    assert summary["max_steps"] == TOTAL_STEPS == planned_optimizer_steps(_args(out)[2], 32)
    assert calls == [("seed-0", 2), ("seed-1", 2), ("seed-2", 2), (winner, TOTAL_STEPS)]
    # the winner ends lower than it was at the rung
    assert summary["winner_final_metric"] < rows[winner]["rung_metrics"][0]
    for f in (STATE_FILE, SUMMARY_JSON, SUMMARY_MD, CURVES_PNG):
        assert (out / f).exists(), f
    assert "**chosen**" in (out / SUMMARY_MD).read_text()


def test_continued_winner_equals_an_uninterrupted_run_of_its_seed(search, tmp_path):
    out, summary, _ = search
    w = next(r for r in summary["trials"] if r["chosen"])
    m, d, t = _args(tmp_path / "straight", "--seed", str(w["model_seed"]), "--data_seed", str(w["data_seed"]))
    straight_metrics = train(m, d, t)
    straight = json.loads((tmp_path / "straight" / "metrics.json").read_text())["history"]
    with open(out / "trials" / w["trial_id"] / f"checkpoint-{TOTAL_STEPS}" / "trainer_state.json") as f:
        continued = json.load(f)["log_history"]

    a, b = _losses(straight), _losses(continued)
    assert sorted(a) == sorted(b) == list(range(1, TOTAL_STEPS + 1))
    assert [b[s] for s in a] == pytest.approx([a[s] for s in a], rel=1e-6, abs=1e-6)
    # same LR schedule step by step: the exploration ran with the full run's max_steps
    assert _losses(continued, "learning_rate") == pytest.approx(_losses(straight, "learning_rate"), rel=1e-9)
    # the rung value is the uninterrupted run's eval at that step; the final metric its final eval
    assert w["rung_metrics"][0] == pytest.approx(_losses(straight, "eval_loss")[2], rel=1e-6)
    assert summary["winner_final_metric"] == pytest.approx(straight_metrics["eval_loss"], rel=1e-6)
    # the training clock stops with training: the final evaluation after train() carries the training time
    # (the search's cost accounting, search_time_curve, adds up these per-trial values)
    record = json.loads((tmp_path / "straight" / "metrics.json").read_text())
    assert straight_metrics["train_seconds"] == record["train_seconds"] > 0
    # negative control: the losing seed's losses differ, so the equality above is not vacuous
    loser = next(r for r in summary["trials"] if not r["chosen"] and not r["diverged"])
    with open(out / "trials" / loser["trial_id"] / "checkpoint-2" / "trainer_state.json") as f:
        lost = _losses(json.load(f)["log_history"])
    assert lost[1] != pytest.approx(a[1], rel=1e-6)


def test_kill_mid_trial_and_resume_reruns_no_finished_trial(search, tmp_path):
    _, straight_summary, straight_calls = search
    out = tmp_path / "killed"
    m, d, t = _args(out, *SEARCH)
    first = Counting(RecipeTrialRunner(m, d, t, trial_overrides=FORCE_DIVERGE, callbacks=[KillOnce(43)]))
    with pytest.raises(SimulatedKill):
        train_with_restarts(m, d, t, runner=first)
    assert first.calls == [("seed-0", 2), ("seed-1", 2)]
    state = json.loads((out / STATE_FILE).read_text())
    assert list(state["trials"]["seed-0"]["results"]) == ["2"] and state["trials"]["seed-1"]["results"] == {}

    m, d, t = _args(out, *SEARCH)  # a fresh process would parse the same command again
    second = Counting(RecipeTrialRunner(m, d, t, trial_overrides=FORCE_DIVERGE))
    resumed = train_with_restarts(m, d, t, runner=second)
    # seed-0 finished before the kill: not started again; seed-1 started twice in all
    assert second.calls == [("seed-1", 2), ("seed-2", 2), (resumed["winner"], TOTAL_STEPS)]
    assert len(first.calls) + len(second.calls) == len(straight_calls) + 1
    assert resumed["winner"] == straight_summary["winner"]
    assert resumed["winner_final_metric"] == pytest.approx(straight_summary["winner_final_metric"], rel=1e-6)
    assert [r["rung_metrics"][0] for r in resumed["trials"]] == pytest.approx(
        [r["rung_metrics"][0] for r in straight_summary["trials"]], rel=1e-6
    )
    starts = {"seed-0": 1, "seed-1": 2, "seed-2": 1}  # explorations (seed-1: killed once) ...
    starts[resumed["winner"]] += 1  # ... and the winner's continuation
    assert {r["trial_id"]: r["starts"] for r in resumed["trials"]} == starts


def test_cli_restarts_subcommand_and_invalid_settings(tmp_path, capsys):
    out = tmp_path / "cli"
    rc = cli_main(["restarts", *TINY, "--max_steps", "2", "--output_dir", str(out), "--num-seeds", "2",
                   "--explore-fraction", "1.0", "--metric", "next_token_accuracy", "--direction", "max"])
    assert rc == 0
    summary = json.loads((out / SUMMARY_JSON).read_text())
    # max_steps 2 with the recipe's sequence-length warmup on: 2 optimizer steps
    assert summary["metric"] == "eval_next_token_accuracy" and summary["rung_steps"] == [2]
    accs = {r["trial_id"]: r["rung_metrics"][0] for r in summary["trials"]}
    assert summary["winner"] == max(accs, key=lambda k: (accs[k], k == "seed-0"))
    assert "**chosen**" in capsys.readouterr().out
    # bad settings fail naming the field, before any trial (nothing is written)
    for flags, msg in [
        (["--restart_num_seeds", "0"], "restart_num_seeds: got 0;"),
        (["--restart_explore_fraction", "1.5"], "restart_explore_fraction: got 1.5;"),
        (["--restart_direction", "up"], "restart_direction: got 'up';"),
    ]:
        with pytest.raises(ValueError, match=msg):
            _args(tmp_path / "bad", *flags)
    m, d, t = _args(tmp_path / "bad", "--restart_metric", "bleu")
    with pytest.raises(ValueError, match=r"metric: got 'eval_bleu'; allowed: .* \(what this runner reports\)"):
        train_with_restarts(m, d, t)
    m, d, t = _args(tmp_path / "bad", "--max_steps", "-1", "--num_train_epochs", "1", "--seq_len_warmup_min", "null")
    with pytest.raises(ValueError, match=r"max_steps: got -1, which random restart cannot split"):
        train_with_restarts(m, d, t)
    assert not (tmp_path / "bad").exists()


def test_parallel_per_gpu_runs_trials_as_recipe_subprocesses(tmp_path):
    """Two trials at once, each a `hf-fasttrain train --config <trial yaml>` subprocess on its own device id
    (CPU here: the ids only set CUDA_VISIBLE_DEVICES)."""
    out = tmp_path / "par"
    m, d, t = _args(out, "--max_steps", "2")
    cfg = restart_config_from_args(t, num_seeds=2, explore_fraction=1.0, parallel="per_gpu", devices=["0", "1"])
    runner = RecipeTrialRunner(m, d, t, subprocess=True)
    summary = RestartOrchestrator(cfg, runner, str(out), 2).run()
    for r in summary["trials"]:
        trial_cfg = (out / "trials" / r["trial_id"] / "trial_config_2.yaml").read_text()
        assert f"seed: {r['model_seed']}\n" in trial_cfg and "restart_stop_at_step: 2\n" in trial_cfg
        assert math.isfinite(r["rung_metrics"][0])
    vals = [r["rung_metrics"][0] for r in summary["trials"]]
    assert summary["winner"] == ["seed-0", "seed-1"][vals.index(min(vals))]
    assert vals[0] != vals[1]


def test_a_streaming_trial_resumes_only_from_a_checkpoint_with_its_stream_position(tmp_path):
    # a kill between the Trainer's save and the stream position's leaves a checkpoint without it: skipped
    from hf_fasttrain.restarts import TrialSpec
    from hf_fasttrain.run._resume import checkpoint_extras

    m, d, t = parse_config(["--config", "gpt2_tiny", "--output_dir", str(tmp_path / "run")])
    d.streaming = True
    trial = TrialSpec("seed-0", 0, model_seed=1, data_seed=1, max_steps=10, output_dir=str(tmp_path / "seed-0"))
    for step, position in ((2, True), (4, False)):
        ckpt = tmp_path / "seed-0" / f"checkpoint-{step}"
        ckpt.mkdir(parents=True)
        for name in ("trainer_state.json", *checkpoint_extras(t)):  # the recipe's own extras (its average)
            (ckpt / name).write_text("{}")
        if position:
            (ckpt / "stream_position_rank0.json").write_text("{}")
    args = RecipeTrialRunner(m, d, t).trial_args(trial, until_step=10, resume_from=None)
    assert args.resume_from_checkpoint == str(tmp_path / "seed-0" / "checkpoint-2")
    d.streaming = False  # a dataset on disk needs no position: the newest checkpoint
    args = RecipeTrialRunner(m, d, t).trial_args(trial, until_step=10, resume_from=None)
    assert args.resume_from_checkpoint == str(tmp_path / "seed-0" / "checkpoint-4")
