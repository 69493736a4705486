"""Stability callbacks in a real Trainer: clipping order and statistics, divergence guard, rollback.

Runs tiny GPT-2s (2 layers, 32 wide, vocab 64) on learnable sequences ``(a + b*i) mod 64`` with
sequential sampling, so batch ``k`` is exactly the batch of optimizer step ``k``. Faults ride on the
data: a batch can make the loss NaN, scale its gradient by 1e6 or 100 (loss value unchanged), multiply
its loss by 50, or carry wrong labels (a loss spike). The pure decision is tested in test_guard.py.
"""

import copy
import json
import math
import os
from types import SimpleNamespace

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest
import safetensors.torch
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
from transformers.utils import logging as hf_logging

from hf_fasttrain import FastTrainer, FastTrainingArguments
from hf_fasttrain.callbacks.stability import (
    DivergenceError,
    DivergenceGuardCallback,
    GradientClippingCallback,
    StabilityTrainerMixin,
    ensure_unscaled,
    load_checkpoint_state,
    restore_snapshot,
    stability_callbacks,
    take_snapshot,
)
from hf_fasttrain.config.recipes import parse_config

from conftest import make_tiny_gpt2

V, T, BS = 64, 16, 8
NAN, GRAD_X1E6, POISON, LOSS_X50, GRAD_X100 = 1, 2, 3, 4, 5


@pytest.fixture(autouse=True)
def _one_thread_quiet():
    # 2 shared cores: one thread is ~8x faster here than two fighting threads
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    yield
    torch.set_num_threads(n)
    hf_logging.set_verbosity(verbosity)


# ------------------------------------------------------------------------------------- fixtures


def tiny_gpt2() -> GPT2LMHeadModel:
    return make_tiny_gpt2(V, T)


def make_rows(num_batches, seed=1, faults=None, drop=()):
    """Rows for ``num_batches`` batches; batch k (1-based) carries ``faults[k]``; batches in ``drop`` left out."""
    g = torch.Generator().manual_seed(seed)
    n = num_batches * BS
    ids = (torch.randint(0, V, (n, 1), generator=g) + torch.randint(1, 4, (n, 1), generator=g) * torch.arange(T)) % V
    rows = []
    for i, r in enumerate(ids):
        k = i // BS + 1
        if k not in drop:
            rows.append({"input_ids": r, "labels": r.clone(), "fault": (faults or {}).get(k, 0), "batch": k})
    return rows


def collate(rows):
    return {
        "input_ids": torch.stack([r["input_ids"] for r in rows]),
        "labels": torch.stack([r["labels"] for r in rows]),
        "fault": torch.tensor([r["fault"] for r in rows]),
        "batch": torch.tensor([r["batch"] for r in rows]),
    }


class FaultyTrainer(Trainer):
    """Injects the fault its batch carries and records which batches it computed a loss on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches_seen = []

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        fault = int(inputs.pop("fault").max())
        batch = int(inputs.pop("batch")[0])
        if model.training:
            self.batches_seen.append(batch)
        if fault == POISON:
            inputs["labels"] = (inputs["labels"] + V // 2) % V  # confidently wrong targets
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        if fault == NAN:
            loss = loss * float("nan")
        elif fault == GRAD_X1E6:
            loss = loss + (1e6 - 1.0) * (loss - loss.detach())  # same value, gradient x 1e6
        elif fault == GRAD_X100:
            loss = loss + (100.0 - 1.0) * (loss - loss.detach())  # same value, gradient x 100
        elif fault == LOSS_X50:
            loss = loss * 50.0  # value and gradient x 50
        return loss


class GuardedTrainer(StabilityTrainerMixin, FaultyTrainer):
    pass


class FaultyFastTrainer(FastTrainer, FaultyTrainer):
    pass


def make_trainer(out, steps, faults=None, callbacks=(), drop=(), cls=GuardedTrainer, optimizers=None, **kw):
    settings = dict(
        output_dir=str(out),
        max_steps=steps,
        per_device_train_batch_size=BS,
        learning_rate=1e-2,
        lr_scheduler_type="cosine",
        max_grad_norm=0.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        train_sampling_strategy="sequential",
        remove_unused_columns=False,
        disable_tqdm=True,
        seed=0,
    )
    settings.update(kw)
    args_cls = FastTrainingArguments if issubclass(cls, FastTrainer) else TrainingArguments
    if args_cls is FastTrainingArguments:
        settings["auto_resume"] = False
    model = tiny_gpt2()
    opt_sched = (None, None)
    if optimizers == "lambda":
        # an lr that depends only on the step count, so runs of different lengths share it
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt_sched = (opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1.0 + 0.1 * s)))
    return cls(
        model=model,
        args=args_cls(**settings),
        train_dataset=make_rows(steps + len(drop), faults=faults, drop=drop),
        eval_dataset=make_rows(8, seed=2),
        data_collator=collate,
        callbacks=list(callbacks),
        optimizers=opt_sched,
    )


def find(trainer, cls):
    """The live instance (the Trainer re-creates stateful callbacks when it restores them)."""
    return next(cb for cb in trainer.callback_handler.callbacks if isinstance(cb, cls))


def all_finite(model) -> bool:
    return all(bool(torch.isfinite(p).all()) for p in model.parameters())


def logged(trainer, key):
    return [h[key] for h in trainer.state.log_history if key in h]


def assert_same_tensors(a, b):
    """Nested dicts/lists of tensors and numbers are equal exactly."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_tensors(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_tensors(x, y)
    else:
        assert a == b


class Recorder(TrainerCallback):
    """Copies model, optimizer and scheduler state at the end of every step."""

    def __init__(self):
        self.states = {}

    def on_step_end(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kwargs):
        self.states[state.global_step] = {
            "model": copy.deepcopy(model.state_dict()),
            "optimizer": copy.deepcopy(optimizer.state_dict()["state"]),
            "scheduler": copy.deepcopy(lr_scheduler.state_dict()),
            "lrs": [g["lr"] for g in optimizer.param_groups],
        }


class GradSpy(TrainerCallback):
    """Records gradients (and the fp16 scaler stage) at on_pre_optimizer_step."""

    def __init__(self):
        self.grads, self.weights, self.stages = [], [], []

    def on_pre_optimizer_step(self, args, state, control, model=None, optimizer=None, **kwargs):
        scaler = getattr(optimizer, "scaler", None)
        self.stages.append(None if scaler is None else scaler._per_optimizer_states[id(optimizer.optimizer)]["stage"])
        self.grads.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
        self.weights.append({n: p.detach().clone() for n, p in model.named_parameters()})


# ------------------------------------------------------------------------------------- pure parts


def test_ensure_unscaled_unscales_once_with_a_cpu_grad_scaler():
    w = torch.nn.Parameter(torch.tensor([1.0, 2.0]))
    opt = torch.optim.SGD([w], lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    scaler.scale((w * torch.tensor([3.0, 4.0])).sum()).backward()
    assert w.grad.tolist() == [3072.0, 4096.0]  # scaled
    wrapped = SimpleNamespace(optimizer=opt, scaler=scaler, param_groups=opt.param_groups)  # like AcceleratedOptimizer
    assert ensure_unscaled(wrapped) is True
    assert w.grad.tolist() == [3.0, 4.0]
    assert ensure_unscaled(wrapped) is False  # a second unscale_ would raise in torch
    scaler.step(opt)  # the scaler accepts the already-unscaled state
    scaler.update()
    assert w.tolist() == pytest.approx([0.7, 1.6])
    assert ensure_unscaled(SimpleNamespace(optimizer=opt, scaler=None)) is False


def test_snapshot_restore_is_exact_and_the_snapshot_is_not_aliased():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    x = torch.randn(5, 3)

    def step():
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()
        sched.step()

    for _ in range(3):
        step()
    snap = take_snapshot(model, opt, sched, step=3)
    expected = (copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()), sched.state_dict()["last_epoch"])
    step()
    step()
    assert not torch.equal(model[0].weight, expected[0]["0.weight"])  # negative control: state moved on
    restore_snapshot(snap, model, opt, sched)
    assert_same_tensors(model.state_dict(), expected[0])
    assert_same_tensors(opt.state_dict()["state"], expected[1]["state"])
    assert sched.state_dict()["last_epoch"] == expected[2] == 3
    assert [g["lr"] for g in opt.param_groups] == [0.1 * 0.5**3]
    step()  # training after a restore must not write into the snapshot
    assert torch.equal(snap.optimizer["state"][0]["exp_avg"], expected[1]["state"][0]["exp_avg"])
    assert torch.equal(snap.model["0.weight"], expected[0]["0.weight"])


@pytest.mark.parametrize("shard", [False, True])
@pytest.mark.slow
def test_load_checkpoint_state_reads_single_and_sharded_checkpoints(tmp_path, shard):
    """The rollback target in 'checkpoint' mode: model (tied lm_head), optimizer, scheduler and lrs in place."""
    source = tiny_gpt2()
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.5)
    opt = torch.optim.AdamW(source.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5**s)
    source(torch.zeros(1, 4, dtype=torch.long), labels=torch.zeros(1, 4, dtype=torch.long)).loss.backward()
    opt.step()
    sched.step()
    source.save_pretrained(str(tmp_path), max_shard_size="50KB" if shard else "1GB")
    torch.save(opt.state_dict(), tmp_path / "optimizer.pt")
    torch.save(sched.state_dict(), tmp_path / "scheduler.pt")
    assert (tmp_path / "model.safetensors.index.json").exists() is shard

    model = tiny_gpt2()
    opt2 = torch.optim.AdamW(model.parameters(), lr=0.1)
    sched2 = torch.optim.lr_scheduler.LambdaLR(opt2, lambda s: 0.5**s)
    load_checkpoint_state(str(tmp_path), model, opt2, sched2)
    assert_same_tensors(model.state_dict(), source.state_dict())
    assert model.lm_head.weight is model.transformer.wte.weight  # still tied
    assert_same_tensors(opt2.state_dict()["state"], opt.state_dict()["state"])
    assert [g["lr"] for g in opt2.param_groups] == [0.05]
    other = GPT2LMHeadModel(GPT2Config(vocab_size=V, n_positions=T, n_embd=32, n_layer=1, n_head=2))
    with pytest.raises(ValueError, match="does not match the model"):
        load_checkpoint_state(str(tmp_path), other, torch.optim.AdamW(other.parameters()), None)


# ------------------------------------------------------------------------------------- clipping in a Trainer


@pytest.mark.parametrize("mode", ["value", "norm", "agc"])
def test_clipping_callback_in_a_trainer(tmp_path, mode):
    before, after = GradSpy(), GradSpy()
    clip = GradientClippingCallback(mode=mode, clip_value=0.01, max_norm=0.5, agc_lambda=0.01)
    steps = 3
    trainer = make_trainer(tmp_path, steps, callbacks=[before, clip, after], gradient_accumulation_steps=2, cls=FaultyTrainer)
    trainer.train()
    assert len(before.grads) == steps  # once per optimizer step, not per micro-batch
    for g_before, g_after, w in zip(before.grads, after.grads, after.weights):
        if mode == "value":
            assert max(g.abs().max().item() for g in g_after.values()) <= 0.01
            assert max(g.abs().max().item() for g in g_before.values()) > 0.01
        elif mode == "norm":
            total = torch.linalg.vector_norm(torch.stack([g.norm() for g in g_after.values()]))
            assert total.item() == pytest.approx(0.5, rel=1e-5)
        else:
            name = "transformer.h.0.mlp.c_fc.weight"  # Conv1D (in, out): one unit per column
            ratio = g_after[name].norm(dim=0) / w[name].norm(dim=0).clamp_min(1e-3)
            assert ratio.max().item() <= 0.01 * (1 + 1e-5)
            assert (g_before[name].norm(dim=0) / w[name].norm(dim=0)).max().item() > 0.01
            # the output layer (tied to wte) and vectors are not clipped
            assert torch.equal(g_after["transformer.wte.weight"], g_before["transformer.wte.weight"])
            assert torch.equal(g_after["transformer.h.0.ln_1.weight"], g_before["transformer.h.0.ln_1.weight"])
    # logged every step: the pre-clip norm is the Trainer's own (unclipped) grad_norm
    assert logged(trainer, "clip_pre_norm") == pytest.approx(logged(trainer, "grad_norm"), rel=1e-5)
    fractions = logged(trainer, "clip_fraction")
    assert len(fractions) == steps
    if mode == "norm":
        assert fractions == [1.0, 1.0, 1.0] and logged(trainer, "clip_post_norm") == pytest.approx([0.5] * 3)
    else:
        assert all(0.0 < f < 1.0 for f in fractions)


def test_clip_stats_reach_earlier_callbacks_only_through_the_mixin(tmp_path):
    class LogSpy(TrainerCallback):
        def __init__(self):
            self.keys = set()

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.keys |= set(logs)

    for cls, reaches in [(FaultyTrainer, False), (GuardedTrainer, True)]:
        spy = LogSpy()
        trainer = make_trainer(tmp_path, 2, callbacks=[spy, GradientClippingCallback(mode="value")], cls=cls)
        trainer.train()
        assert len(logged(trainer, "clip_pre_norm")) == 2  # log_history has them either way
        assert ("clip_pre_norm" in spy.keys) is reaches  # integrations run before callbacks added later


@pytest.mark.parametrize("max_grad_norm", [1.0, 0.0])
def test_clip_sees_unscaled_fp16_gradients(tmp_path, max_grad_norm):
    """A CPU GradScaler in the Trainer's accelerator: the clip must see the unscaled gradients."""
    from accelerate.state import AcceleratorState
    from torch.amp.grad_scaler import OptState

    class TurnOnAmp(TrainerCallback):  # after accelerator.prepare, so the forward stays fp32 on CPU
        def __init__(self, trainer):
            self.trainer = trainer

        def on_train_begin(self, *args, **kwargs):
            self.trainer.accelerator.native_amp = True

    def run(scaled):
        spy = GradSpy()
        clip = GradientClippingCallback(mode="value", clip_value=0.01)
        trainer = make_trainer(tmp_path, 2, callbacks=[spy, clip], cls=FaultyTrainer, max_grad_norm=max_grad_norm)
        state = AcceleratorState()
        old = state._mixed_precision
        if scaled:
            trainer.accelerator.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
            state._mixed_precision = "fp16"
            trainer.add_callback(TurnOnAmp(trainer))
        try:
            trainer.train()
        finally:
            state._mixed_precision = old
        return spy, clip, trainer

    ref, ref_clip, _ = run(scaled=False)
    spy, clip, trainer = run(scaled=True)
    assert trainer.accelerator.scaler.get_scale() == 2.0**10  # in use, no overflow
    assert spy.stages == [OptState.UNSCALED, OptState.UNSCALED]  # the Trainer unscaled before the callbacks
    for g_ref, g in zip(ref.grads, spy.grads):
        for name in g_ref:
            assert torch.equal(g_ref[name], g[name])  # power-of-2 scale: unscaling is exact
    assert clip.last_stats.pre_norm.item() == ref_clip.last_stats.pre_norm.item()


def test_norm_mode_refuses_to_stack_on_max_grad_norm(tmp_path):
    trainer = make_trainer(tmp_path, 2, callbacks=[GradientClippingCallback(mode="norm")], max_grad_norm=1.0)
    with pytest.raises(ValueError, match="max_grad_norm=1.0"):
        trainer.train()


# ------------------------------------------------------------------------------------- divergence guard


def guard(**kw):
    settings = dict(spike_window=8, spike_warmup=5, snapshot_every=4)
    settings.update(kw)
    return DivergenceGuardCallback(**settings)


@pytest.mark.slow
def test_fault_injection_guard_matches_a_clean_run(tmp_path):
    faults = {8: NAN, 15: GRAD_X1E6, 22: POISON}
    clean = make_trainer(tmp_path / "clean", 30)
    clean.train()
    clean_eval = clean.evaluate()["eval_loss"]

    guarded = make_trainer(tmp_path / "guarded", 30, faults, callbacks=[guard()])
    guarded.train()
    g = find(guarded, DivergenceGuardCallback)
    # each caught before its update was applied: skipped, nothing rolled back
    assert [(e["step"], e["kind"]) for e in g.events] == [(8, "skip"), (15, "skip"), (22, "skip")]
    assert "non-finite" in g.events[0]["reason"] and "grad_norm_ceiling" in g.events[1]["reason"]
    assert "loss spike" in g.events[2]["reason"]
    last = guarded.state.log_history[-2]  # the last training log (the one after is the summary)
    assert (last["guard_skipped_nonfinite"], last["guard_skipped_spike"], last["guard_rollbacks"]) == (1, 2, 0)
    assert all_finite(guarded.model)
    assert guarded.evaluate()["eval_loss"] == pytest.approx(clean_eval, abs=0.05)

    # negative controls: without the guard the run ends NaN; without the gradient-norm rules the 1e6
    # gradient poisons Adam's second moment and the run ends far from the clean one
    unguarded = make_trainer(tmp_path / "unguarded", 30, faults)
    unguarded.train()
    assert not all_finite(unguarded.model)
    assert math.isnan(unguarded.evaluate()["eval_loss"])
    partial = make_trainer(tmp_path / "partial", 30, faults, callbacks=[guard(grad_spike_ratio=None, grad_norm_ceiling=None)])
    partial.train()
    assert partial.evaluate()["eval_loss"] > clean_eval + 0.5


def test_a_clean_run_with_the_guard_is_bit_identical_to_one_without(tmp_path):
    plain = make_trainer(tmp_path / "plain", 8, cls=FaultyTrainer)
    plain.train()
    guarded = make_trainer(tmp_path / "guarded", 8, callbacks=[guard(snapshot_every=2, spike_warmup=2)])
    guarded.train()
    assert find(guarded, DivergenceGuardCallback).events == []
    assert_same_tensors(plain.model.state_dict(), guarded.model.state_dict())
    assert_same_tensors(plain.optimizer.state_dict()["state"], guarded.optimizer.state_dict()["state"])


@pytest.mark.parametrize("rollback", ["memory", "checkpoint"])
def test_rollback_restores_state_exactly_and_skips_the_batches(tmp_path, rollback):
    recorder = Recorder()
    # rollback_after_spikes=1: the first spike already counts as "the loss stays high" (default 8)
    g = guard(spike_window=6, spike_warmup=4, spike_sigma=3.0, snapshot_every=3, grad_spike_ratio=None, rollback=rollback,
              rollback_after_spikes=1)
    trainer = make_trainer(
        tmp_path / "run", 16, {10: POISON}, callbacks=[g, recorder], optimizers="lambda", save_strategy="steps", save_steps=3
    )
    trainer.train()
    # candidates at steps 3, 6, 9; the one at 9 is not vouched for (the loss of step 10 is the spike)
    assert [(e["step"], e["kind"]) for e in g.events] == [(10, "rollback")]
    assert "restored step 6, skipping the batches of steps 7-10" in g.events[0]["reason"]
    assert_same_tensors(recorder.states[10], recorder.states[6])  # model, optimizer, scheduler, lrs
    assert recorder.states[10]["scheduler"]["last_epoch"] == 6
    assert trainer.batches_seen == list(range(1, 17))  # every batch computed once, none replayed
    if rollback == "checkpoint":
        saved = safetensors.torch.load_file(str(tmp_path / "run" / "checkpoint-6" / "model.safetensors"))
        for name, t in saved.items():
            assert torch.equal(recorder.states[10]["model"][name], t)

    # data position: from the restored state the run went on with batch 11, exactly like a run that
    # never saw batches 7-10
    reference = make_trainer(tmp_path / "ref", 12, drop=(7, 8, 9, 10), cls=FaultyTrainer, optimizers="lambda")
    reference.train()
    assert reference.batches_seen == [1, 2, 3, 4, 5, 6] + list(range(11, 17))
    assert_same_tensors(trainer.model.state_dict(), reference.model.state_dict())
    assert_same_tensors(trainer.optimizer.state_dict()["state"], reference.optimizer.state_dict()["state"])


def test_plain_trainer_without_mixin_reads_the_loss_from_the_logs(tmp_path):
    g = guard(spike_window=6, spike_warmup=4, spike_sigma=3.0, snapshot_every=3, grad_spike_ratio=None)
    trainer = make_trainer(tmp_path / "run", 16, {5: NAN, 10: POISON}, callbacks=[g], cls=FaultyTrainer, optimizers="lambda")
    trainer.train()
    # the NaN is caught from the gradients before its step; the spike after the fact, from logs["loss"]
    assert [(e["step"], e["kind"]) for e in g.events] == [(5, "skip"), (10, "rollback")]
    assert "restored step 6" in g.events[1]["reason"]
    assert logged(trainer, "guard_rollbacks")[-1] == 1 and logged(trainer, "guard_skipped_nonfinite")[-1] == 1
    reference = make_trainer(tmp_path / "ref", 11, drop=(5, 7, 8, 9, 10), cls=FaultyTrainer, optimizers="lambda")
    reference.train()
    assert_same_tensors(trainer.model.state_dict(), reference.model.state_dict())


def test_too_many_rollbacks_stop_with_a_saved_finite_checkpoint(tmp_path):
    recorder = Recorder()
    g = guard(spike_window=6, spike_warmup=4, spike_sigma=3.0, snapshot_every=3, grad_spike_ratio=None, max_rollbacks=1,
              rollback_after_spikes=1)
    poison_from_8 = {k: POISON for k in range(8, 21)}
    trainer = make_trainer(tmp_path, 20, poison_from_8, callbacks=[g, recorder], optimizers="lambda")
    with pytest.raises(DivergenceError, match=r"2 rollbacks within 1000 steps \(max_rollbacks=1\)") as err:
        trainer.train()
    assert "checkpoint-9" in str(err.value)
    assert [(e["step"], e["kind"]) for e in g.events] == [(8, "rollback"), (9, "rollback"), (9, "stop")]
    assert trainer.state.global_step == 9
    saved = safetensors.torch.load_file(str(tmp_path / "checkpoint-9" / "model.safetensors"))
    assert all(bool(torch.isfinite(t).all()) for t in saved.values())
    for name, t in saved.items():
        assert torch.equal(recorder.states[6]["model"][name], t)  # the last good state


@pytest.mark.parametrize("rollback", ["memory", "none"])
def test_non_finite_weights_are_never_saved(tmp_path, rollback):
    class Corrupt(TrainerCallback):  # NaN weights after the update of step 4, which is then saved
        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 == 4:
                with torch.no_grad():
                    model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")

    g = guard(snapshot_every=3, rollback=rollback)
    trainer = make_trainer(tmp_path, 6, callbacks=[Corrupt(), g], save_strategy="steps", save_steps=4)
    if rollback == "memory":
        trainer.train()
        saved = safetensors.torch.load_file(str(tmp_path / "checkpoint-4" / "model.safetensors"))
        assert all(bool(torch.isfinite(t).all()) for t in saved.values())
        assert [(e["step"], e["kind"]) for e in g.events] == [(4, "rollback")]
        assert "non-finite weights" in g.events[0]["reason"] and all_finite(trainer.model)
    else:
        with pytest.raises(DivergenceError, match="non-finite weights"):
            trainer.train()
        assert not (tmp_path / "checkpoint-4").exists()


def test_resume_equals_straight_with_guard_state(tmp_path):
    def run(out, resume=None):
        callbacks = [guard(), GradientClippingCallback(mode="value", clip_value=0.05)]
        trainer = make_trainer(
            out, 10, {3: NAN, 8: NAN}, callbacks=callbacks, save_strategy="steps", save_steps=5,
            restore_callback_states_from_checkpoint=True,
        )
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = run(tmp_path / "a")
    resumed = run(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-5"))
    assert_same_tensors(straight.model.state_dict(), resumed.model.state_dict())
    gs, gr = find(straight, DivergenceGuardCallback), find(resumed, DivergenceGuardCallback)
    assert gr is not resumed.callback_handler.callbacks[0]  # re-created by the Trainer from the checkpoint
    assert (gs.num_skipped_nonfinite, gr.num_skipped_nonfinite) == (2, 2)
    # the clipper (after the guard) neither clips nor counts the two dropped steps
    assert [h["step"] for h in straight.state.log_history if "clip_pre_norm" in h] == [1, 2, 4, 5, 6, 7, 9, 10]
    assert gs.loss_history == gr.loss_history and gs.grad_norm_history == gr.grad_norm_history
    # order kept: guard before clipper, also after the Trainer re-created both
    kinds = [type(cb) for cb in resumed.callback_handler.callbacks if isinstance(cb, (DivergenceGuardCallback, GradientClippingCallback))]
    assert kinds == [DivergenceGuardCallback, GradientClippingCallback]
    # negative control: the checkpoint along the way differs from the end
    mid = safetensors.torch.load_file(str(tmp_path / "a" / "checkpoint-5" / "model.safetensors"))
    assert not torch.equal(mid["transformer.h.0.mlp.c_fc.weight"], straight.model.state_dict()["transformer.h.0.mlp.c_fc.weight"])
    json.dumps(gs.state())  # stored in trainer_state.json


# ------------------------------------------------------------------------------------- DDP


def _ddp_worker(rank, world, init_file, out_dir):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)

    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = DivergenceGuardCallback(rollback="none", spike_window=4, spike_warmup=2)
    args = SimpleNamespace(deepspeed=None, fsdp=None)
    state = SimpleNamespace(global_step=0)
    guard.on_train_begin(args, state, None, model=model, optimizer=opt)
    results = []
    # step 1: only rank 0 sees a NaN loss -> both ranks skip; step 2 and 3: different finite losses
    # per rank -> both record the same mean
    for step, losses in enumerate([(float("nan"), 1.0), (3.0, 5.0), (2.0, 2.0)], start=1):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        guard.observe_loss(torch.tensor(losses[rank]))
        guard.on_pre_optimizer_step(args, state, None, model=model, optimizer=opt)
        results.append(all(p.grad is None for p in model.parameters()))
        state.global_step = step
    torch.save({"skipped": results, "history": guard.loss_history}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_guard_decisions_agree_across_ranks(tmp_path):
    # fork: the children inherit the imported modules (spawn would re-import transformers: ~30 s here)
    mp.start_processes(_ddp_worker, args=(2, str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True, start_method="fork")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1))
    assert r0["skipped"] == r1["skipped"] == [True, False, False]
    assert r0["history"] == r1["history"] == [4.0, 2.0]


# ------------------------------------------------------------------------------------- settings


@pytest.mark.parametrize(
    "cls, kwargs, field",
    [
        (GradientClippingCallback, {"mode": "clip"}, "mode"),
        (GradientClippingCallback, {"clip_value": 0}, "clip_value"),
        (GradientClippingCallback, {"max_norm": -1.0}, "max_norm"),
        (GradientClippingCallback, {"agc_lambda": float("nan")}, "agc_lambda"),
        (GradientClippingCallback, {"agc_eps": "1e-3"}, "agc_eps"),
        (DivergenceGuardCallback, {"spike_window": 1}, "spike_window"),
        (DivergenceGuardCallback, {"spike_sigma": 0}, "spike_sigma"),
        (DivergenceGuardCallback, {"spike_warmup": 500}, "spike_warmup"),
        (DivergenceGuardCallback, {"loss_spike_ratio": 0.9}, "loss_spike_ratio"),
        (DivergenceGuardCallback, {"grad_spike_ratio": 0.5}, "grad_spike_ratio"),
        (DivergenceGuardCallback, {"rollback": "disk"}, "rollback"),
        (DivergenceGuardCallback, {"snapshot_every": 0}, "snapshot_every"),
        (DivergenceGuardCallback, {"max_rollbacks": -1}, "max_rollbacks"),
        (DivergenceGuardCallback, {"rollback_window": 2.5}, "rollback_window"),
        (DivergenceGuardCallback, {"max_consecutive_skips": 0}, "max_consecutive_skips"),
        (DivergenceGuardCallback, {"grad_norm_ceiling": -1.0}, "grad_norm_ceiling"),
    ],
)
def test_invalid_settings_name_the_field_and_value(cls, kwargs, field):
    with pytest.raises(ValueError, match=field) as err:
        cls(**kwargs)
    assert repr(next(iter(kwargs.values()))) in str(err.value) or str(next(iter(kwargs.values()))) in str(err.value)


@pytest.mark.parametrize("cls", [GradientClippingCallback, DivergenceGuardCallback])
def test_sharded_training_fails_before_training(monkeypatch, cls):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    args = SimpleNamespace(deepspeed=None, fsdp=None, max_grad_norm=0.0)
    with pytest.raises(ValueError, match="FSDP"):
        cls().on_train_begin(args, None, None, model=torch.nn.Linear(2, 2))


# ------------------------------------------------------------------------------------- FastTrainer wiring


@pytest.mark.parametrize(
    "field, value, allowed",
    [
        ("clip_mode", "clip", "norm, value, agc, none"),
        ("clip_value", 0.0, "> 0"),
        ("agc_lambda", -0.01, "> 0"),
        ("guard_rollback", "disk", "auto, memory, checkpoint, none"),
        ("guard_snapshot_every", 0, ">= 1"),
        ("guard_spike_sigma", float("inf"), "> 0"),
        ("guard_spike_window", 1, ">= 2"),
        ("guard_max_rollbacks", -1, ">= 0"),
    ],
)
def test_fast_training_arguments_reject_bad_stability_settings(tmp_path, field, value, allowed):
    with pytest.raises(ValueError, match=f"{field}: got {value!r}; ") as err:
        FastTrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", **{field: value})
    assert allowed in str(err.value)


def test_fasttrainer_value_mode_turns_the_norm_clip_off_and_guards(tmp_path):
    spy = GradSpy()  # user callbacks come before the ones FastTrainer adds: it sees unclipped gradients
    trainer = make_trainer(
        tmp_path, 6, {3: NAN}, callbacks=[spy], cls=FaultyFastTrainer, max_grad_norm=1.0,
        clip_mode="value", clip_value=0.01, divergence_guard=True, guard_spike_window=8,
        per_device_train_batch_size=BS // 2, gradient_accumulation_steps=2,  # batch k in two halves
    )
    kinds = [type(cb) for cb in trainer.callback_handler.callbacks if isinstance(cb, (DivergenceGuardCallback, GradientClippingCallback))]
    assert kinds == [DivergenceGuardCallback, GradientClippingCallback]
    trainer.train()
    norms = [torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])).item() for grads in spy.grads]
    logs = [h for h in trainer.state.log_history if "loss" in h]
    healthy = [n for i, n in enumerate(norms) if i != 2]
    assert max(healthy) > 1.0  # max_grad_norm=1.0 did not clip: value mode replaces it
    assert [h["clip_pre_norm"] for h in logs if "clip_pre_norm" in h] == pytest.approx(healthy, rel=1e-5)
    assert all(h["clip_fraction"] > 0 for h in logs if "clip_fraction" in h)
    g = find(trainer, DivergenceGuardCallback)
    assert [(e["step"], e["kind"]) for e in g.events] == [(3, "skip")]
    # FastTrainer hands the guard every micro-batch loss: per step, the same loss the Trainer logs
    assert g.loss_history == pytest.approx([h["loss"] for h in logs if h["step"] != 3], rel=1e-6)
    assert logs[-1]["guard_skipped_nonfinite"] == 1 and all_finite(trainer.model)


@pytest.mark.parametrize("mode", ["norm", "none"])
def test_fasttrainer_norm_and_none_modes(tmp_path, mode):
    spy = GradSpy()
    trainer = make_trainer(tmp_path, 4, callbacks=[spy], cls=FaultyFastTrainer, max_grad_norm=1.0, clip_mode=mode)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    norms = [torch.linalg.vector_norm(torch.stack([g.norm() for g in grads.values()])).item() for grads in spy.grads]
    pre = [h["grad_norm"] for h in logs]
    assert max(pre) > 1.0
    if mode == "norm":  # the Trainer's clip, with its statistics in the logs
        assert [h["clip_pre_norm"] for h in logs] == pytest.approx(pre, rel=1e-6)
        assert [h["clip_post_norm"] for h in logs] == pytest.approx([min(p, 1.0) for p in pre], rel=1e-5)
        assert [h["clip_fraction"] for h in logs] == [1.0 if p > 1.0 else 0.0 for p in pre]
        assert norms == pytest.approx([min(p, 1.0) for p in pre], rel=1e-5)
    else:  # nothing clips, nothing is logged about clipping
        assert norms == pytest.approx(pre, rel=1e-5)
        assert not any("clip_pre_norm" in h for h in logs)


def test_recipes_switch_the_guard_on():
    _, _, tiny = parse_config(["--config", "gpt2_tiny"])
    assert (tiny.clip_mode, tiny.max_grad_norm, tiny.divergence_guard) == ("norm", 1.0, True)
    (cb,) = stability_callbacks(tiny)
    assert isinstance(cb, DivergenceGuardCallback) and cb.snapshot_every == 50 and cb.spike_sigma == 6.0
    _, _, agc = parse_config(["--config", "gpt2_tiny", "--clip_mode", "agc", "--agc_lambda", "0.05", "--divergence_guard", "false"])
    (cb,) = stability_callbacks(agc)
    assert isinstance(cb, GradientClippingCallback) and (cb.mode, cb.agc_lambda) == ("agc", 0.05)
    assert stability_callbacks(TrainingArguments(output_dir="x", use_cpu=True, report_to="none")) == []


# ------------------------------------------------------------------------------------- the guard's promises


@pytest.mark.parametrize("cls", [FaultyFastTrainer, GuardedTrainer])
def test_gradient_spike_is_judged_on_the_pre_clip_norm(tmp_path, cls):
    """14.2: under norm clipping the guard must judge the norm before the clip (the history is not all 1.0)."""
    if cls is FaultyFastTrainer:
        callbacks, kw = [], dict(clip_mode="norm", divergence_guard=True, guard_spike_window=8)
    else:
        callbacks, kw = [guard(spike_window=8, spike_warmup=8)], {}
    trainer = make_trainer(tmp_path, 14, {12: GRAD_X100}, callbacks=callbacks, cls=cls, max_grad_norm=0.5, **kw)
    trainer.train()
    g = find(trainer, DivergenceGuardCallback)
    assert [(e["step"], e["kind"]) for e in g.events] == [(12, "skip")]
    assert "gradient-norm spike" in g.events[0]["reason"]
    pre_clip = [h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h and h["step"] != 12]
    assert min(pre_clip) > 0.5  # every step was clipped, so a post-clip history would be all 0.5
    assert g.grad_norm_history == pytest.approx(pre_clip[-8:], rel=1e-5)


@pytest.mark.parametrize("setup", ["fasttrainer", "mixin", "plain"])
@pytest.mark.slow
def test_guard_state_survives_a_resume_without_restore_callback_states(tmp_path, setup):
    """14.3: a x50 loss 5 steps after a resume is caught, and the guard_* counters go on."""
    faults = {3: NAN, 15: LOSS_X50}

    def run(out, resume=None):
        if setup == "fasttrainer":
            cls, callbacks, kw = FaultyFastTrainer, [], dict(divergence_guard=True, guard_spike_window=8, guard_snapshot_every=4)
        else:
            cls = GuardedTrainer if setup == "mixin" else FaultyTrainer
            callbacks, kw = [guard(spike_window=8, spike_warmup=8)], {}
        trainer = make_trainer(out, 18, faults, callbacks=callbacks, cls=cls, save_strategy="steps", save_steps=10, **kw)
        assert not trainer.args.restore_callback_states_from_checkpoint
        trainer.train(resume_from_checkpoint=resume)
        return trainer

    straight = run(tmp_path / "a")
    resumed = run(tmp_path / "b", resume=str(tmp_path / "a" / "checkpoint-10"))
    g = find(resumed, DivergenceGuardCallback)
    assert [(e["step"], e["kind"]) for e in g.events] == [(3, "skip"), (15, "skip")]
    # x50 loss, x50 gradient: without the mixin (no loss before the step) the gradient norm gives it away
    assert ("gradient-norm spike" if setup == "plain" else "loss spike") in g.events[1]["reason"]
    last = [h for h in resumed.state.log_history if "guard_skipped_nonfinite" in h][-1]
    assert last["guard_skipped_nonfinite"] == 1  # counted before the resume
    assert g.memory == find(straight, DivergenceGuardCallback).memory  # resumed == straight
    assert_same_tensors(straight.model.state_dict(), resumed.model.state_dict())


def test_spikes_caught_before_their_update_are_skipped_not_rolled_back(tmp_path):
    """14.4: five x50 batches in a row are skipped; the run equals one that never saw those batches."""
    bad = range(10, 15)
    g = guard(snapshot_every=3)
    trainer = make_trainer(tmp_path / "run", 20, {k: LOSS_X50 for k in bad}, callbacks=[g], optimizers="lambda")
    trainer.train()
    assert [(e["step"], e["kind"]) for e in g.events] == [(k, "skip") for k in bad]
    assert g.num_rollbacks == 0 and g.num_skipped_spike == 5
    reference = make_trainer(tmp_path / "ref", 15, drop=tuple(bad), cls=FaultyTrainer, optimizers="lambda")
    reference.train()
    assert_same_tensors(trainer.model.state_dict(), reference.model.state_dict())
    assert_same_tensors(trainer.optimizer.state_dict()["state"], reference.optimizer.state_dict()["state"])


def test_nan_weights_are_rolled_back_at_the_next_step(tmp_path):
    """14.4: a bad update that reached the weights is rolled back at once (not skipped 20 times)."""

    class Corrupt(TrainerCallback):  # NaN in the weights after the update of step 6
        def on_optimizer_step(self, args, state, control, model=None, **kwargs):
            if state.global_step + 1 == 6:
                with torch.no_grad():
                    model.transformer.h[0].mlp.c_fc.weight[0, 0] = float("nan")

    recorder = Recorder()
    g = guard(snapshot_every=4)
    trainer = make_trainer(tmp_path, 10, callbacks=[Corrupt(), g, recorder])
    trainer.train()
    assert [(e["step"], e["kind"]) for e in g.events] == [(7, "rollback")]
    assert "non-finite weights; restored step 4" in g.events[0]["reason"]
    assert_same_tensors(recorder.states[7]["model"], recorder.states[4]["model"])
    assert all_finite(trainer.model)


def test_the_ceiling_catches_a_huge_gradient_inside_the_warm_up(tmp_path):
    """14.5: x1e6 gradient at step 3 (statistics need 5 steps) under value clipping with max_grad_norm=0."""
    g = guard(spike_warmup=5)
    trainer = make_trainer(
        tmp_path / "run", 8, {3: GRAD_X1E6}, cls=FaultyTrainer, optimizers="lambda", max_grad_norm=0.0,
        callbacks=[g, GradientClippingCallback(mode="value", clip_value=1.0)],
    )
    trainer.train()
    assert [(e["step"], e["kind"]) for e in g.events] == [(3, "skip")]
    assert "above grad_norm_ceiling=10000" in g.events[0]["reason"]
    reference = make_trainer(
        tmp_path / "ref", 7, drop=(3,), cls=FaultyTrainer, optimizers="lambda", max_grad_norm=0.0,
        callbacks=[GradientClippingCallback(mode="value", clip_value=1.0)],
    )
    reference.train()
    assert_same_tensors(trainer.model.state_dict(), reference.model.state_dict())


@pytest.mark.slow  # four short Trainer runs
def test_a_full_disk_while_saving_says_where_and_what_to_do(tmp_path, monkeypatch):
    """14.8: a write that fails for lack of space ends with one clear message; resuming still works."""
    import hf_fasttrain.stability.snapshots as snapshots
    from hf_fasttrain._files import last_complete_checkpoint
    from hf_fasttrain.stability.snapshots import NoSpaceError

    Usage = type("Usage", (), {})
    disk = {"full": False}

    def disk_usage(path):
        u = Usage()
        u.free = 0 if disk["full"] else 10**12
        return u

    real_save = torch.save

    def save(obj, f, *args, **kwargs):
        if "checkpoint-4" in str(f):
            disk["full"] = True  # the disk fills up during this write
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1536 vs 1430")
        return real_save(obj, f, *args, **kwargs)

    monkeypatch.setattr(snapshots.shutil, "disk_usage", disk_usage)
    monkeypatch.setattr(torch, "save", save)
    out = tmp_path / "run"
    trainer = make_trainer(out, 6, cls=FaultyFastTrainer, save_strategy="steps", save_steps=2)
    with pytest.raises(NoSpaceError) as err:
        trainer.train()
    assert str(err.value) == (
        f"no space left on {out / 'checkpoint-4'} while saving checkpoint-4; free space and rerun the same command"
    )
    assert not (out / "checkpoint-4").exists()  # the unfinished checkpoint is gone
    assert last_complete_checkpoint(str(out)) == str(out / "checkpoint-2")

    # before a save: nothing is written at all (the guard checks in a plain Trainer, the mixin in FastTrainer)
    disk["full"] = True
    for name, cls, callbacks in [("plain", FaultyTrainer, [guard()]), ("fast", FaultyFastTrainer, [])]:
        t = make_trainer(tmp_path / name, 4, cls=cls, callbacks=callbacks, save_strategy="steps", save_steps=2)
        with pytest.raises(NoSpaceError, match="while saving checkpoint-2 .* free space and rerun the same command"):
            t.train()
        assert not (tmp_path / name / "checkpoint-2").exists()

    # space freed, the same command again: resumes from checkpoint-2 and ends like an uninterrupted run
    monkeypatch.undo()
    resumed = make_trainer(out, 6, cls=FaultyFastTrainer, save_strategy="steps", save_steps=2)
    resumed.train(resume_from_checkpoint=last_complete_checkpoint(str(out)))
    straight = make_trainer(tmp_path / "straight", 6, cls=FaultyFastTrainer)
    straight.train()
    assert_same_tensors(straight.model.state_dict(), resumed.model.state_dict())


def test_without_the_mixin_clipped_gradients_turn_the_norm_rules_off_with_a_warning(tmp_path, caplog):
    """14.2, plain Trainer without the mixin: the Trainer clips before any callback; the guard says so once."""
    g = guard(spike_window=8, spike_warmup=2)
    trainer = make_trainer(tmp_path, 4, {3: NAN}, callbacks=[g], cls=FaultyTrainer, max_grad_norm=0.5)
    with caplog.at_level("WARNING", logger="hf_fasttrain.callbacks.guard"):
        trainer.train()
    warnings = [r.getMessage() for r in caplog.records if "clipped them to max_grad_norm=0.5" in r.getMessage()]
    assert len(warnings) == 1 and "StabilityTrainerMixin" in warnings[0]
    assert g.grad_norm_history == []  # clipped norms are not learnt from
    assert [(e["step"], e["kind"]) for e in g.events] == [(3, "skip")]  # NaN is still caught before its step


def test_the_recipe_command_reports_a_full_disk_in_one_line(tmp_path, monkeypatch, capsys):
    """14.8 at the command line: no traceback, the message and exit status 1."""
    import errno

    from hf_fasttrain import cli
    from hf_fasttrain.run import train as run
    from hf_fasttrain.stability.snapshots import NoSpaceError, no_space_message

    msg = no_space_message(str(tmp_path / "checkpoint-4"), "checkpoint-4")

    def full(*args, **kwargs):
        raise NoSpaceError(errno.ENOSPC, msg)

    monkeypatch.setattr(run, "train", full)
    argv = ["--config", "gpt2_tiny", "--output_dir", str(tmp_path), "--use_cpu", "true", "--report_to", "none"]
    assert cli.run_recipe(argv) == 1
    assert capsys.readouterr().err.strip().splitlines() == [f"error: {msg}"]
    with pytest.raises(NoSpaceError):
        cli.run_recipe([*argv, "--debug"])
