"""Weight averaging (EMA / LAWA): exact values of the core, the Trainer callback, resume == straight."""

import pytest
import torch
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

from hf_fasttrain import FastTrainer
from hf_fasttrain.stability.averaging import (
    WeightAverage,
    decay_from_half_life,
    ema_decay_at,
    ema_update_,
    load_average_file,
)
from hf_fasttrain.callbacks import WeightAveragingCallback

from conftest import StopAt, make_tiny_gpt2, tiny_args


# ---- the core ----------------------------------------------------------------------------------


def test_ema_update_is_the_hand_computed_blend():
    # dyadic numbers and decay 0.75: every intermediate value is exact in float32
    avg = [torch.tensor([0.0, 8.0])]
    for w in ([4.0, 0.0], [4.0, 0.0], [0.0, 16.0]):
        ema_update_(avg, [torch.tensor(w)], 0.75)
    # a1 = (1, 6); a2 = (1.75, 4.5); a3 = (1.3125, 7.375)
    assert avg[0].tolist() == [1.3125, 7.375]


def test_ema_after_k_steps_with_the_decay_warmup():
    w = {"x": torch.zeros(3), "n": torch.tensor([7])}  # the integer tensor is not averaged
    avg = WeightAverage(w, mode="ema", decay=0.9)
    assert avg.names == ["x"]
    values = [1.0, 2.0, 4.0, 8.0, 16.0]
    expected = 0.0
    for t, v in enumerate(values, start=1):
        w["x"].fill_(v)
        assert avg.update(w, step=t)
        d = min(0.9, (1 + t) / (10 + t))
        expected = d * expected + (1 - d) * v
    assert ema_decay_at(1, 0.9) == pytest.approx(2 / 11) and ema_decay_at(100, 0.9) == 0.9
    assert avg.average()["x"].tolist() == pytest.approx([expected] * 3, rel=1e-6)
    assert avg.num_updates == 5


def test_ema_without_warmup_and_update_every():
    w = {"x": torch.zeros(1)}
    avg = WeightAverage(w, mode="ema", decay=0.5, warmup=False, update_every=2)
    w["x"].fill_(1.0)
    assert not avg.update(w, step=1)  # odd steps skipped
    assert avg.update(w, step=2)  # decay 0.5**2 = 0.25: 0.25*0 + 0.75*1
    assert avg.average()["x"].item() == 0.75
    assert decay_from_half_life(1) == 0.5 and decay_from_half_life(2) == pytest.approx(2 ** -0.5)


def test_lawa_is_the_mean_of_the_last_k_copies():
    w = {"x": torch.zeros(2)}
    avg = WeightAverage(w, mode="lawa", lawa_k=2, lawa_interval=2)
    w["x"].fill_(5.0)
    avg.update(w, step=1)  # not a copy step: the average is the current weights
    assert avg.average()["x"].tolist() == [5.0, 5.0]
    for t in range(2, 7):
        w["x"].fill_(float(t))
        avg.update(w, step=t)
    # copies at steps 2, 4, 6; the window keeps 4 and 6
    assert avg.average()["x"].tolist() == [5.0, 5.0] and len(avg.window) == 2
    w["x"].fill_(10.0)
    avg.update(w, step=8)  # window (6, 10)
    assert avg.average()["x"].tolist() == [8.0, 8.0]


def test_swap_restores_the_iterate_bit_for_bit_and_state_round_trips():
    model = torch.nn.Linear(3, 2)
    with torch.no_grad():  # dyadic values: the average is exact, whatever the random init was
        for i, p in enumerate(model.parameters()):
            p.copy_(torch.arange(p.numel(), dtype=p.dtype).reshape(p.shape) * 0.25 - i)
    avg = WeightAverage(dict(model.named_parameters()), mode="ema", decay=0.5, warmup=False)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    avg.update(dict(model.named_parameters()), step=1)
    iterate = {n: p.detach().clone() for n, p in model.named_parameters()}
    with avg.swapped_into(model):
        for n, p in model.named_parameters():
            assert torch.equal(p, before[n] + 0.5)
    for n, p in model.named_parameters():
        assert torch.equal(p, iterate[n])
    other = WeightAverage(dict(model.named_parameters()), mode="ema", decay=0.5, warmup=False)
    other.load_state_dict(avg.state_dict())
    assert all(torch.equal(other.average()[n], avg.average()[n]) for n in avg.names)
    assert other.num_updates == 1
    with pytest.raises(ValueError, match="mode='lawa'"):
        WeightAverage(dict(model.named_parameters()), mode="lawa").load_state_dict(avg.state_dict())


@pytest.mark.parametrize("kw, match", [
    (dict(mode="swa"), "mode: got 'swa'"), (dict(decay=1.0), "decay: got 1.0"), (dict(lawa_k=0), "lawa_k: got 0"),
    (dict(update_every=1.5), "update_every: got 1.5"),
])
def test_bad_settings_name_the_field(kw, match):
    with pytest.raises(ValueError, match=match):
        WeightAverage({"x": torch.zeros(1)}, **kw)


def test_args_fields_are_checked(tmp_path):
    with pytest.raises(ValueError, match="weight_averaging: got 'swa'; allowed: none, ema, lawa"):
        tiny_args(tmp_path, weight_averaging="swa")
    with pytest.raises(ValueError, match="ema_decay: got 0;"):
        tiny_args(tmp_path, weight_averaging="ema", ema_decay=0)
    with pytest.raises(ValueError, match="lawa_interval: got 0;"):
        tiny_args(tmp_path, weight_averaging="lawa", lawa_interval=0)


# ---- in a Trainer ------------------------------------------------------------------------------


class _Snapshot(TrainerCallback):
    """Records the model's weights at the end of training, before the averaging callback replaces them."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.iterate = {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.slow
def test_plain_trainer_evaluates_and_ends_with_the_average(tiny_lm, tiny_tokenizer, tmp_path):
    model = make_tiny_gpt2(len(tiny_tokenizer))
    snap, cb = _Snapshot(), WeightAveragingCallback(mode="ema", decay=0.8)
    args = TrainingArguments(output_dir=str(tmp_path), max_steps=6, per_device_train_batch_size=8,
                             per_device_eval_batch_size=16, learning_rate=3e-3, eval_strategy="steps", eval_steps=3,
                             save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=tiny_lm["train"], eval_dataset=tiny_lm["validation"],
                      data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                      callbacks=[snap, cb])
    trainer.train()
    evals = {e["step"]: e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
    assert sorted(evals) == [3, 6]
    # the model now holds the average: equal to the callback's, different from the last iterate
    avg = cb.average.average()
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), avg[n])
    assert any(not torch.equal(snap.iterate[n], avg[n]) for n in avg)
    # the step-6 evaluation ran on the average (the same loss again now), not on the iterate
    assert trainer.evaluate()["eval_loss"] == pytest.approx(evals[6], rel=1e-6)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(snap.iterate[n])
    assert abs(trainer.evaluate()["eval_loss"] - evals[6]) > 1e-4


def _fast(model, lm, tok, args, **kw):
    return FastTrainer(model=model, args=args, train_dataset=lm["train"], eval_dataset=lm["validation"],
                       data_collator=DataCollatorForLanguageModeling(tok, mlm=False), processing_class=tok, **kw)


@pytest.mark.parametrize("mode", ["ema", "lawa"])
@pytest.mark.slow
def test_checkpoints_carry_the_average_and_resume_bit_exactly(tiny_lm, tiny_tokenizer, tmp_path, mode):
    kw = dict(max_steps=8, save_strategy="steps", save_steps=4, weight_averaging=mode, ema_decay=0.8,
              lawa_checkpoints=2, lawa_interval=2, auto_resume=False)
    vocab = len(tiny_tokenizer)
    straight = _fast(make_tiny_gpt2(vocab), tiny_lm, tiny_tokenizer, tiny_args(tmp_path / "a", **kw))
    straight.train()
    first = _fast(make_tiny_gpt2(vocab), tiny_lm, tiny_tokenizer, tiny_args(tmp_path / "b", **kw), callbacks=[StopAt(4)])
    first.train()
    resumed = _fast(make_tiny_gpt2(vocab, seed=123), tiny_lm, tiny_tokenizer, tiny_args(tmp_path / "b", **kw))
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-4"))
    a = load_average_file(str(tmp_path / "a" / "checkpoint-8" / "weight_average.pt"))
    b = load_average_file(str(tmp_path / "b" / "checkpoint-8" / "weight_average.pt"))
    key = "ema" if mode == "ema" else "window"
    flat = (lambda s: s["ema"]) if mode == "ema" else (lambda s: {f"{i}.{n}": t for i, snap in enumerate(s["window"])
                                                                 for n, t in snap.items()})
    assert a["num_updates"] == b["num_updates"] == (8 if mode == "ema" else 4)
    fa, fb = flat(a), flat(b)
    assert fa.keys() == fb.keys() and all(torch.equal(fa[k], fb[k]) for k in fa), key
    # the final models (the averages) are equal too
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.equal(p, q), n
    # negative control: the average moved between the two checkpoints
    a4 = flat(load_average_file(str(tmp_path / "a" / "checkpoint-4" / "weight_average.pt")))
    assert any(not torch.equal(a4[k], fa[k]) for k in a4 if k in fa)


def test_averaging_spec_is_read_once_from_the_arguments_and_checked_naming_their_fields(tmp_path):
    import typing

    from hf_fasttrain import FastTrainingArguments
    from hf_fasttrain.stability.averaging import AVERAGING_MODES, AveragingSpec

    assert typing.get_args(typing.get_type_hints(AveragingSpec)["mode"]) == AVERAGING_MODES == ("none", "ema", "lawa")
    args = FastTrainingArguments(output_dir=str(tmp_path), weight_averaging="lawa", lawa_checkpoints=3,
                                 lawa_interval=7, ema_decay=0.9, report_to=[])
    assert AveragingSpec.from_args(args) == AveragingSpec("lawa", 0.9, True, 1, 3, 7)
    assert AveragingSpec.from_args(TrainingArguments(output_dir=str(tmp_path), report_to=[])) == AveragingSpec()
    with pytest.raises(ValueError, match=r"^lawa_checkpoints: got 0; must be an integer >= 1$"):
        FastTrainingArguments(output_dir=str(tmp_path), weight_averaging="lawa", lawa_checkpoints=0, report_to=[])
    with pytest.raises(ValueError, match=r"^lawa_k: got 0; must be an integer >= 1$"):  # the callback's own names
        WeightAveragingCallback(mode="lawa", lawa_k=0)
    callback = WeightAveragingCallback.from_args(args)
    assert callback.settings == {"mode": "lawa", "decay": 0.9, "warmup": True, "update_every": 1, "lawa_k": 3,
                                 "lawa_interval": 7}
    assert WeightAveragingCallback.from_args(TrainingArguments(output_dir=str(tmp_path), report_to=[])) is None
