"""Decision tables for the divergence guard's pure core (hf_fasttrain.stability.guard) and the disk-space check."""

import errno
import json
from collections import namedtuple
from types import SimpleNamespace

import pytest
import torch

from hf_fasttrain.stability.guard import (
    GuardConfig,
    GuardMemory,
    Healthy,
    RollBack,
    Skip,
    StepObservation,
    Stop,
    detect_spike,
    guard_decision,
    remember,
)
from hf_fasttrain.stability.snapshots import NoSpaceError, check_free_space, checkpoint_bytes, is_no_space_error

CFG = GuardConfig(
    spike_window=4, spike_warmup=4, rollback_after_spikes=3, max_consecutive_skips=5, max_rollbacks=1,
    rollback_window=100, grad_norm_ceiling=100.0,
)
LOSSES, NORMS = [2.0, 2.1, 1.9, 2.0], [1.0, 1.1, 0.9, 1.0]


def mem(**kw):
    base = dict(loss_history=list(LOSSES), grad_norm_history=list(NORMS))
    base.update(kw)
    return GuardMemory(**base)


def obs(step=10, loss=2.0, grad_norm=1.0, **kw):
    return StepObservation(step=step, loss=loss, grad_norm=grad_norm, **kw)


NAN = dict(nonfinite=True, loss=None, grad_norm=None)

# (observation, memory, can_roll_back, config, expected type, expected kind / restore, words in the reason)
TABLE = [
    ("healthy", obs(), mem(), True, CFG, Healthy, None, ""),
    ("no loss known (plain Trainer before the step)", obs(loss=None), mem(), True, CFG, Healthy, None, ""),
    ("NaN before the step, weights fine: skip", obs(**NAN), mem(), True, CFG, Skip, "nonfinite", "non-finite"),
    ("NaN and NaN weights: the update reached them", obs(**NAN, weights_finite=False), mem(), True, CFG, RollBack, None, "non-finite weights"),
    ("NaN weights and nothing to restore", obs(**NAN, weights_finite=False), mem(), False, CFG, Stop, False, "no good state"),
    ("NaN weights before a save (applied)", obs(**NAN, applied=True, weights_finite=False), mem(), True, CFG, RollBack, None, ""),
    ("x1e6 norm in the warm-up: the ceiling", obs(grad_norm=1e6), GuardMemory(), True, CFG, Skip, "grad_ceiling", "grad_norm_ceiling=100"),
    ("x1e6 norm, no ceiling, warm-up: not judged", obs(grad_norm=1e6), GuardMemory(), True, GuardConfig(grad_norm_ceiling=None), Healthy, None, ""),
    ("loss x50 in the warm-up: not judged", obs(loss=100.0), GuardMemory(), True, CFG, Healthy, None, ""),
    ("loss spike before its update: skip, not roll back", obs(loss=100.0), mem(), True, CFG, Skip, "loss_spike", "loss spike (100"),
    ("third spike in a row: the weights are bad", obs(loss=100.0), mem(spike_streak=2), True, CFG, RollBack, None, "3 steps in a row"),
    ("third spike in a row, nothing to restore: skip", obs(loss=100.0), mem(spike_streak=2), False, CFG, Skip, "loss_spike", ""),
    ("spike seen after its update: roll back", obs(loss=100.0, applied=True), mem(), True, CFG, RollBack, None, "loss spike"),
    ("spike after its update, nothing to restore", obs(loss=100.0, applied=True), mem(), False, CFG, Skip, "loss_spike", "already applied"),
    ("rollback disabled", obs(loss=100.0, applied=True), mem(), True, GuardConfig(**{**CFG.as_dict(), "rollback": "none"}), Skip, "loss_spike", ""),
    ("gradient-norm spike (pre-clip)", obs(grad_norm=50.0), mem(), True, CFG, Skip, "grad_spike", "gradient-norm spike (50"),
    ("gradient-norm rule off", obs(grad_norm=50.0), mem(), True, GuardConfig(**{**CFG.as_dict(), "grad_spike_ratio": None}), Healthy, None, ""),
    ("too many skips in a row: roll back", obs(**NAN), mem(consecutive_skips=5), True, CFG, RollBack, None, "6 steps skipped in a row"),
    ("too many skips in a row, nothing to restore: stop", obs(**NAN), mem(consecutive_skips=5), False, CFG, Stop, False, "max_consecutive_skips=5"),
    ("a second rollback within the window: stop", obs(loss=100.0, applied=True), mem(rollback_steps=[5]), True, CFG, Stop, True, "2 rollbacks within 100 steps"),
    ("an old rollback outside the window", obs(step=200, loss=100.0, applied=True), mem(rollback_steps=[5]), True, CFG, RollBack, None, ""),
]


@pytest.mark.parametrize("name, o, m, can, cfg, kind, detail, words", TABLE, ids=[t[0] for t in TABLE])
def test_guard_decision_table(name, o, m, can, cfg, kind, detail, words):
    before = m.as_dict()
    d = guard_decision(o, m, cfg, can_roll_back=can)
    assert type(d) is kind
    if kind is Skip:
        assert d.kind == detail
    if kind is Stop:
        assert d.restore is detail
    assert words in getattr(d, "reason", "")
    assert m.as_dict() == before  # pure: the memory is not touched


def test_remember_after_each_decision():
    m = mem(consecutive_skips=2, spike_streak=1)
    healthy = remember(obs(loss=2.2, grad_norm=1.2), m, Healthy(), CFG)
    assert healthy.loss_history == [2.1, 1.9, 2.0, 2.2] and healthy.grad_norm_history == [1.1, 0.9, 1.0, 1.2]  # window 4
    assert (healthy.consecutive_skips, healthy.spike_streak) == (0, 0)
    assert m.loss_history == LOSSES  # a new object

    nan = remember(obs(**NAN), m, Skip("nonfinite", ""), CFG)
    assert (nan.num_skipped_nonfinite, nan.num_skipped_spike, nan.consecutive_skips, nan.spike_streak) == (1, 0, 3, 1)
    assert nan.loss_history == LOSSES  # nothing learnt from a skipped step
    spike = remember(obs(loss=100.0), m, Skip("loss_spike", ""), CFG)
    assert (spike.num_skipped_nonfinite, spike.num_skipped_spike, spike.consecutive_skips, spike.spike_streak) == (0, 1, 3, 2)
    ceiling = remember(obs(grad_norm=1e6), m, Skip("grad_ceiling", ""), CFG)
    assert (ceiling.num_skipped_spike, ceiling.spike_streak) == (1, 1)
    applied = remember(obs(loss=100.0, applied=True), m, Skip("loss_spike", ""), CFG)
    assert applied.as_dict() == m.as_dict()  # nothing was dropped, nothing counted

    rolled = remember(obs(step=10), mem(rollback_steps=[3]), RollBack(""), CFG)
    assert (rolled.num_rollbacks, rolled.rollback_steps, rolled.consecutive_skips) == (1, [3, 10], 0)
    stopped = remember(obs(step=11), rolled, Stop("", restore=True), CFG)
    assert (stopped.num_rollbacks, stopped.rollback_steps) == (2, [10, 11])  # max_rollbacks + 1 kept
    assert remember(obs(step=12), rolled, Stop("", restore=False), CFG).num_rollbacks == 1


def test_five_spikes_in_a_row_are_skipped_then_the_sixth_healthy_step_learns():
    """Five bad batches in a row are skipped (default rollback_after_spikes=8), no rollback."""
    cfg = GuardConfig(spike_window=4, spike_warmup=4)
    m = mem()
    decisions = []
    for step, loss in enumerate([100.0] * 5 + [2.0], start=11):
        o = obs(step=step, loss=loss)
        d = guard_decision(o, m, cfg, can_roll_back=True)
        m = remember(o, m, d, cfg)
        decisions.append(type(d).__name__)
    assert decisions == ["Skip"] * 5 + ["Healthy"]
    assert (m.num_skipped_spike, m.num_rollbacks, m.spike_streak) == (5, 0, 0)


def test_memory_round_trips_through_json():
    m = mem(num_skipped_nonfinite=2, num_rollbacks=1, rollback_steps=[7], events=[{"step": 7, "kind": "rollback", "reason": "x"}])
    back = GuardMemory.from_dict(json.loads(json.dumps(m.as_dict())))
    assert back == m
    # files written before spike_streak existed (flat attributes, as the callback used to save) still load
    assert GuardMemory.from_dict({"loss_history": [1.0], "num_rollbacks": 2, "unknown": 1}).num_rollbacks == 2


@pytest.mark.parametrize(
    "value, history, expected",
    [
        (5.0, [2.0, 2.1, 1.9, 2.0], True),  # far above mean + 6 std and 10% above the mean
        (2.2, [2.0, 2.1, 1.9, 2.0], False),  # 10% above, but within 6 std
        (1.0, [2.0, 2.1, 1.9, 2.0], False),  # below: one-sided
        (5.0, [2.0, 2.1, 1.9], False),  # warm-up not reached (needs 4)
        (2.05, [2.0, 2.0, 2.0, 2.0], False),  # zero std, but not 10% above the mean
        (2.3, [2.0, 2.0, 2.0, 2.0], True),  # zero std and 15% above
    ],
)
def test_detect_spike(value, history, expected):
    assert detect_spike(value, history, sigma=6.0, ratio=1.1, warmup=4) is expected


def test_guard_warmup_defaults():
    assert GuardConfig().warmup == 64  # OLMo-core: max(20, window // 2)
    assert GuardConfig(spike_window=30).warmup == 20
    assert GuardConfig(spike_window=8).warmup == 8  # never more than the window holds
    assert GuardConfig(spike_window=8, spike_warmup=3).warmup == 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"spike_window": 1}, "spike_window: got 1; must be an integer >= 2"),
        ({"spike_window": 2.0}, "spike_window: got 2.0; "),
        ({"spike_sigma": 0}, "spike_sigma: got 0; must be a finite number > 0"),
        ({"spike_warmup": 500}, "spike_warmup: got 500; must be an integer between 2 and 128"),
        ({"loss_spike_ratio": 0.9}, "loss_spike_ratio: got 0.9; must be a finite number >= 1"),
        ({"grad_spike_ratio": 0.5}, "grad_spike_ratio: got 0.5; must be a finite number >= 1 or null"),
        ({"grad_norm_ceiling": float("inf")}, "grad_norm_ceiling: got inf; "),
        ({"rollback_after_spikes": 0}, "rollback_after_spikes: got 0; must be an integer >= 1"),
        ({"rollback": "disk"}, "rollback: got 'disk'; allowed: auto, memory, checkpoint, none"),
        ({"snapshot_every": 0}, "snapshot_every: got 0; "),
        ({"max_rollbacks": -1}, "max_rollbacks: got -1; must be an integer >= 0"),
        ({"rollback_window": 2.5}, "rollback_window: got 2.5; "),
        ({"max_consecutive_skips": 0}, "max_consecutive_skips: got 0; "),
        ({"raise_on_divergence": "yes"}, "raise_on_divergence: got 'yes'; "),
    ],
)
def test_config_names_the_field_the_value_and_what_is_allowed(kwargs, message):
    with pytest.raises(ValueError) as err:
        GuardConfig(**kwargs)
    assert str(err.value).startswith(message)


def test_config_from_training_args_names_the_guard_field():
    args = SimpleNamespace(guard_spike_window=8, guard_rollback="memory", guard_grad_norm_ceiling=None, unrelated=1)
    cfg = GuardConfig.from_training_args(args)
    assert (cfg.spike_window, cfg.rollback, cfg.grad_norm_ceiling, cfg.snapshot_every) == (8, "memory", None, 50)
    with pytest.raises(ValueError, match=r"^guard_spike_window: got 1; must be an integer >= 2"):
        GuardConfig.from_training_args(SimpleNamespace(guard_spike_window=1))
    assert GuardConfig.from_training_args(object()) == GuardConfig()  # plain TrainingArguments: defaults


# ---------------------------------------------------------------------------------------- disk space

Usage = namedtuple("Usage", "total used free")


def test_checkpoint_bytes_counts_model_and_optimizer_state_once():
    model = torch.nn.Linear(256, 256)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 256)).sum().backward()
    opt.step()
    n = 256 * 256 + 256
    assert checkpoint_bytes(model) == int(n * 4 * 1.05) + 2**20
    # AdamW: exp_avg and exp_avg_sq per parameter (and two 0-dim steps)
    assert checkpoint_bytes(model, opt) == int((3 * n * 4 + 2 * 4) * 1.05) + 2**20
    assert checkpoint_bytes(model, opt, model_only=True) == checkpoint_bytes(model)


def test_check_free_space(tmp_path, monkeypatch):
    import hf_fasttrain.stability.snapshots as snapshots

    monkeypatch.setattr(snapshots.shutil, "disk_usage", lambda p: Usage(10**9, 10**9 - 5 * 2**20, 5 * 2**20))
    check_free_space(str(tmp_path / "out" / "checkpoint-4"), 4 * 2**20, "checkpoint-4")  # fits; path not there yet
    with pytest.raises(NoSpaceError) as err:
        check_free_space(str(tmp_path / "out" / "checkpoint-4"), 6 * 2**20, "checkpoint-4")
    assert err.value.errno == errno.ENOSPC
    assert str(err.value) == (
        f"no space left on {tmp_path / 'out' / 'checkpoint-4'} while saving checkpoint-4 (needs about 6.0 MiB, "
        "5.0 MiB free); free space and rerun the same command"
    )


@pytest.mark.parametrize(
    "exc, expected",
    [
        (OSError(errno.ENOSPC, "No space left on device"), True),
        (RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1536 vs 1430"), True),
        (RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed"), True),
        (OSError(errno.EACCES, "Permission denied"), False),
        (RuntimeError("CUDA out of memory"), False),
    ],
)
def test_is_no_space_error(exc, expected):
    assert is_no_space_error(exc) is expected


@pytest.mark.parametrize("env, shown", [({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, "FSDP2"),
                                        ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed ZeRO")])
def test_guard_and_value_clipping_refused_under_sharding_before_any_work(monkeypatch, tmp_path, env, shown):
    from hf_fasttrain import FastTrainingArguments
    from hf_fasttrain.validation import ConfigError

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    with pytest.raises(ConfigError, match=f"divergence_guard: not supported under {shown}"):
        FastTrainingArguments(output_dir=str(tmp_path / "o"), divergence_guard=True, use_cpu=True)
    with pytest.raises(ConfigError, match=f"clip_mode: not supported under {shown}"):
        FastTrainingArguments(output_dir=str(tmp_path / "o"), clip_mode="value", use_cpu=True)
    assert not (tmp_path / "o").exists()


def test_guard_memory_starts_fresh_at_a_train_that_is_not_a_resume():
    """hyperparameter_search calls train() again on the same Trainer and callbacks: the statistics of the
    previous trial must not judge the next one (its first losses would all look like spikes)."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from hf_fasttrain.callbacks.guard import DivergenceGuardCallback
    from hf_fasttrain.stability.guard import GuardMemory

    guard = DivergenceGuardCallback(spike_window=4, rollback="checkpoint")
    guard.memory = GuardMemory(loss_history=[1.0, 1.1, 0.9, 1.0], num_skipped_spike=3)
    args = TrainingArguments(output_dir="unused", report_to="none", use_cpu=True)
    guard.on_train_begin(args, TrainerState(global_step=0), TrainerControl())
    assert guard.memory == GuardMemory()
    assert guard.pop_log_stats() == {"guard_skipped_nonfinite": 0, "guard_skipped_spike": 0, "guard_rollbacks": 0}
