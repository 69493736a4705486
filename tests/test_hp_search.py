"""``Trainer.hyperparameter_search`` with FastTrainer and ``model_init``: every trial is a fresh run.

The Trainer reuses one FastTrainer and its callbacks across trials (it re-creates only the model and the
optimizer), so every stateful part (the divergence guard's loss statistics, the EMA, the run record, the token
counters, the sequence-length warmup) must start again at a ``train()`` that is not a resume. Three trials
with the guard, EMA, the run record and sequence-length warmup on; each must log exactly what a fresh
FastTrainer with the same settings logs. Needs optuna (the ``test`` extra).
"""

import pytest
from transformers import TrainerCallback

from conftest import make_tiny_gpt2, make_tiny_trainer, tiny_args

optuna = pytest.importorskip("optuna")

pytestmark = pytest.mark.slow  # 6 tiny runs: about half a minute on 2 loaded cores

# the first trial trains fastest: its last losses are far below the next trial's first ones, which a guard
# that kept them would take for spikes (the bug this test guards against)
LRS = [3e-2, 3e-3, 1e-2]
KW = dict(max_steps=8, per_device_train_batch_size=4, seq_len_warmup_min=8, seq_len_warmup_fraction=0.5,
          include_num_input_tokens_seen="all", divergence_guard=True, guard_spike_window=4, guard_spike_sigma=2.0,
          weight_averaging="ema", ema_decay=0.9, eval_strategy="steps", eval_steps=4, learning_rate=3e-3)
KEYS = ("loss", "learning_rate", "seq_len", "num_input_tokens_seen", "guard_skipped_spike", "guard_skipped_nonfinite",
        "guard_rollbacks", "clip_pre_norm", "padding_fraction", "eval_loss")


class RecordTrials(TrainerCallback):
    """The log of every train() call, with the learning rate it was given, and the logs the callbacks saw (they
    carry the run record's wall clock, which the TrainerState's history leaves out)."""

    def __init__(self):
        self.trials = []
        self.seen = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.seen.append([])

    def on_log(self, args, state, control, logs=None, **kwargs):
        self.seen[-1].append(dict(logs or {}))

    def on_train_end(self, args, state, control, **kwargs):
        self.trials.append((args.learning_rate, [dict(e) for e in state.log_history]))


def _values(log):
    return [{k: e[k] for k in KEYS if k in e} | {"step": e["step"]} for e in log if any(k in e for k in KEYS)]


def _trainer(tokenizer, lm, args, **kw):
    return make_tiny_trainer(tokenizer, lm, args, model_init=lambda trial=None: make_tiny_gpt2(len(tokenizer)),
                             eval_dataset=lm["validation"], **kw)


def test_each_search_trial_equals_a_fresh_fasttrainer_run(tiny_lm, tiny_tokenizer, tmp_path):
    record = RecordTrials()
    trainer = _trainer(tiny_tokenizer, tiny_lm, tiny_args(tmp_path / "search", **KW), callbacks=[record])
    best = trainer.hyperparameter_search(
        hp_space=lambda trial: {"learning_rate": LRS[trial.number]}, backend="optuna", n_trials=3,
        direction="minimize", compute_objective=lambda metrics: metrics["eval_loss"],
    )
    assert [lr for lr, _ in record.trials] == LRS
    objectives = []
    last_clock = None
    for (lr, log), seen in zip(record.trials, record.seen):
        fresh = _trainer(tiny_tokenizer, tiny_lm, tiny_args(tmp_path / f"fresh-{lr}", **dict(KW, learning_rate=lr)))
        fresh.train()
        got, want = _values(log), _values(fresh.state.log_history)
        objectives.append(fresh.evaluate()["eval_loss"])  # the search's objective: the eval after train()
        assert got == want, f"trial with learning_rate={lr} differs from a fresh run"
        assert [e["step"] for e in got if "loss" in e] == list(range(1, 9))  # max_steps 8: eight optimizer steps
        # the run record too: its clock and throughput restart with each trial
        clocks = [e["train_seconds"] for e in seen if "train_seconds" in e]
        assert clocks and clocks == sorted(clocks) and clocks[-1] < 60
        assert last_clock is None or clocks[0] < last_clock  # restarted, not continued from the trial before
        last_clock = clocks[-1]
        assert 0 < fresh.recorder.records[-1]["train_seconds"] < 60
    # the search's best trial is the best fresh run (its evaluation of the final, averaged weights)
    assert best.run_id == str(objectives.index(min(objectives)))
    assert best.objective == pytest.approx(min(objectives), abs=1e-6)
    # the trials differ from each other (the equality above is not vacuous)
    finals = {lr: [e["loss"] for e in log if "loss" in e][-1] for lr, log in record.trials}
    assert len(set(finals.values())) == 3
