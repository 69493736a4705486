import math

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling

from hf_fasttrain.callbacks.run_record import WALL_CLOCK_LOG_KEYS
from hf_fasttrain import FastTrainer
from hf_fasttrain.throughput import ThroughputMeter, count_tokens, flops_per_token, mfu, throughput_logs

from conftest import StopAt, make_tiny_gpt2, make_tiny_trainer, tiny_args


def _trainer(model, lm, tok, args, **kw):
    return make_tiny_trainer(tok, lm, args, model=model, eval_dataset=lm["validation"], **kw)


def test_training_lowers_eval_loss_and_changes_every_parameter(tiny_lm, tiny_tokenizer, tmp_path):
    model = make_tiny_gpt2(len(tiny_tokenizer))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = _trainer(model, tiny_lm, tiny_tokenizer, tiny_args(tmp_path, max_steps=40, logging_steps=10))
    start = trainer.evaluate()["eval_loss"]
    trainer.train()
    end = trainer.evaluate()
    assert end["eval_loss"] < start - 0.5, (start, end["eval_loss"])
    assert end["eval_perplexity"] == pytest.approx(math.exp(end["eval_loss"]))
    unchanged = [n for n, p in model.named_parameters() if torch.equal(p.detach(), before[n])]
    assert unchanged == []
    # run record
    for f in ("config.yaml", "run_info.json", "metrics.json", "loss_curve.png"):
        assert (tmp_path / f).exists(), f
    logs = [e for e in trainer.recorder.records if "loss" in e]  # the logs as callbacks and metrics.json see them
    assert [e["step"] for e in logs] == [10, 20, 30, 40]
    # the TrainerState keeps no wall clock (a resumed run's equals a straight run's); the run record has it
    assert not {k for e in trainer.state.log_history for k in e} & set(WALL_CLOCK_LOG_KEYS)
    for e in logs:
        assert e["tokens_per_second"] > 0
        assert e["padding_fraction"] == 0.0  # fixed-length chunks have no padding
        assert "mfu" not in e  # CPU: no known peak
    secs = [e["train_seconds"] for e in logs]
    assert secs == sorted(secs) and secs[0] > 0


def test_mfu_is_logged_with_a_given_peak(tiny_lm, tiny_tokenizer, tmp_path):
    model = make_tiny_gpt2(len(tiny_tokenizer))
    trainer = _trainer(model, tiny_lm, tiny_tokenizer, tiny_args(tmp_path, max_steps=4, logging_steps=2, mfu_peak_tflops=0.001))
    trainer.train()
    n = sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()
    fpt = flops_per_token(n, 2, 32, 32)
    for e in [e for e in trainer.recorder.records if "loss" in e]:
        # no padding: mfu = tokens/s * flops per token / peak
        assert e["mfu"] == pytest.approx(e["tokens_per_second"] * fpt / 1e9, rel=1e-9)


def _losses(trainer):
    return {e["step"]: e["loss"] for e in trainer.state.log_history if "loss" in e}


def test_killed_and_resumed_run_logs_the_same_losses(tiny_lm, tiny_tokenizer, tmp_path):
    kw = dict(max_steps=8, save_strategy="steps", save_steps=4)
    straight = _trainer(make_tiny_gpt2(len(tiny_tokenizer)), tiny_lm, tiny_tokenizer, tiny_args(tmp_path / "a", **kw))
    straight.train()

    first = _trainer(make_tiny_gpt2(len(tiny_tokenizer)), tiny_lm, tiny_tokenizer, tiny_args(tmp_path / "b", **kw),
                     callbacks=[StopAt(4)])
    first.train()
    assert max(_losses(first)) == 4
    resumed = _trainer(make_tiny_gpt2(len(tiny_tokenizer), seed=123), tiny_lm, tiny_tokenizer, tiny_args(tmp_path / "b", **kw))
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-4"))
    a, b = _losses(straight), _losses(resumed)
    assert sorted(b) == list(range(1, 9))  # history restored from the checkpoint, then steps 5-8
    assert [b[s] for s in range(1, 9)] == pytest.approx([a[s] for s in range(1, 9)], rel=1e-6, abs=1e-6)
    # negative control: the two checkpoints along the way differ, so equality above is not vacuous
    from safetensors.torch import load_file

    w4 = load_file(str(tmp_path / "b" / "checkpoint-4" / "model.safetensors"))
    w8 = load_file(str(tmp_path / "b" / "checkpoint-8" / "model.safetensors"))
    assert any(not torch.equal(w4[k], w8[k]) for k in w4)
    assert a[5] != a[4]
    # the resumed clock continues from the checkpoint's
    secs = [e["train_seconds"] for e in resumed.recorder.records if "loss" in e]
    assert len(secs) == 8 and secs == sorted(secs)  # steps 1-4 from the checkpoint's run record, then 5-8


def test_count_tokens_and_meter_exact():
    batch = {
        "input_ids": torch.tensor([[5, 6, 7, 0], [5, 6, 0, 0], [1, 2, 3, 4]]),
        "attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]),
    }
    assert count_tokens(batch) == (9, 12)
    assert count_tokens({"input_ids": batch["input_ids"]}, pad_token_id=0) == (9, 12)
    packed = {"input_ids": torch.tensor([[1, 2, 3, 4, 5]]), "position_ids": torch.tensor([[0, 1, 0, 1, 2]])}
    assert count_tokens(packed, pad_token_id=0) == (5, 5)
    # rows packed by PackedRowsCollator: only each row's padded tail (and an empty row) is padding
    from hf_fasttrain.data.packing import PackedRowsCollator

    rows = PackedRowsCollator(row_len=6, pad_token_id=0, num_rows=3)(
        [{"input_ids": [3, 4, 5]}, {"input_ids": [6, 7]}, {"input_ids": [8, 9, 1, 2]}])
    assert rows["input_ids"].tolist() == [[3, 4, 5, 6, 7, 0], [8, 9, 1, 2, 0, 0], [0] * 6]
    assert count_tokens(rows, pad_token_id=0) == (9, 18)
    full = PackedRowsCollator(row_len=5, pad_token_id=0)([{"input_ids": [3, 4, 5]}, {"input_ids": [6, 0]}])
    assert count_tokens(full, pad_token_id=0) == (5, 5)  # a real token equal to the pad id is not padding
    m = ThroughputMeter()
    m.add(batch)
    m.add({"input_ids": torch.ones(1, 4, dtype=torch.long), "attention_mask": torch.ones(1, 4)})
    assert m.flush() == {"real_tokens": 13, "total_tokens": 16, "padding_fraction": 0.1875, "seq_len": 4, "samples": 0}
    assert m.flush()["total_tokens"] == 0


def test_flops_and_mfu_formulas():
    # GPT-2 small: 124M params (85M without embeddings), 12 layers, 768 wide, 1024 context
    assert flops_per_token(100, 2, 8, 16) == 6 * 100 + 12 * 2 * 8 * 16
    assert mfu(1000.0, 2e9, 1e12 * 4, n_devices=1) == pytest.approx(0.5)
    assert mfu(1000.0, 2e9, 1e12, n_devices=4) == pytest.approx(0.5)
    assert mfu(1000.0, 2e9, None) is None


@pytest.mark.parametrize("counts, kwargs, expected", [
    ((750, 1000, 0, 2.0), {}, {"tokens_per_second": 375.0, "padding_fraction": 0.25}),
    ((0, 0, 0, 2.0), {}, {"tokens_per_second": 0.0, "padding_fraction": 0.0}),  # nothing counted yet
    ((0, 0, 8, 2.0), {}, {"samples_per_second": 4.0}),  # images, features: samples only
    # mfu: 1000 of 1000 tokens in 1 s x (6 x 100 + 12 x 2 x 8 x 16 FLOPs) over a 10 kFLOP/s peak x 2 devices
    ((1000, 1000, 0, 1.0), {"seq_len": 16, "peak_flops": 1e4, "dims": (100, 2, 8), "n_devices": 2},
     {"tokens_per_second": 1000.0, "padding_fraction": 0.0, "mfu": 1000 * (600 + 3072) / 2e4}),
    ((1000, 1000, 0, 1.0), {"seq_len": 16, "peak_flops": 1e4, "dims": (100, 0, 0)},  # no layers known: no mfu
     {"tokens_per_second": 1000.0, "padding_fraction": 0.0}),
])
def test_throughput_logs_table(counts, kwargs, expected):
    assert throughput_logs(*counts, **kwargs) == pytest.approx(expected)


def test_logged_padding_fraction_is_exact_on_a_hand_made_batch(tiny_tokenizer, tmp_path):
    pad = tiny_tokenizer.pad_token_id
    # lengths 3, 5, 8, 8 in one batch of 4 -> padded to 8: 24 real of 32 -> 0.25
    rows = [[7] * 3, [8] * 5, [9] * 8, [10] * 8]
    ds = Dataset.from_dict({"input_ids": rows})
    model = make_tiny_gpt2(len(tiny_tokenizer), n_positions=8)
    args = tiny_args(tmp_path, max_steps=1, per_device_train_batch_size=4)
    trainer = FastTrainer(model=model, args=args, train_dataset=ds,
                          data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                          processing_class=tiny_tokenizer)
    trainer.train()
    log = [e for e in trainer.state.log_history if "loss" in e][0]
    assert log["padding_fraction"] == 0.25
    assert pad not in (7, 8, 9, 10)


def test_resume_skips_a_checkpoint_cut_short(tmp_path):
    from hf_fasttrain._files import last_complete_checkpoint

    for step, state in ((5, '{"global_step": 5}'), (10, '{"global_step": 10}'), (15, '{"global_st')):
        d = tmp_path / f"checkpoint-{step}"
        d.mkdir()
        (d / "trainer_state.json").write_text(state)
    (tmp_path / "checkpoint-20").mkdir()  # killed before its state file was written
    assert last_complete_checkpoint(str(tmp_path)) == str(tmp_path / "checkpoint-10")
    assert last_complete_checkpoint(str(tmp_path / "missing")) is None


def test_setup_logging_writes_to_the_current_stderr_or_defers_to_the_app(monkeypatch):
    import io
    import logging
    import sys
    from types import SimpleNamespace

    from hf_fasttrain.run.train import setup_logging

    pkg, root = logging.getLogger("hf_fasttrain"), logging.getLogger()
    monkeypatch.setattr(pkg, "handlers", [])
    monkeypatch.setattr(pkg, "propagate", True)
    monkeypatch.setattr(root, "handlers", [])  # an application that configured no logging
    setup_logging(SimpleNamespace(should_log=True))
    assert pkg.propagate is False and len(pkg.handlers) == 1
    for _ in range(2):  # each record goes to sys.stderr as it is then, not as it was at setup
        err = io.StringIO()
        monkeypatch.setattr(sys, "stderr", err)
        logging.getLogger("hf_fasttrain.run.train").info("resumed from checkpoint-7")
        assert err.getvalue() == "[hf_fasttrain] resumed from checkpoint-7\n"
    setup_logging(SimpleNamespace(should_log=True))  # called again: still one handler
    assert len(pkg.handlers) == 1
    # an application with its own logging set up: records propagate to it, our handler goes
    seen = []
    handler = logging.Handler()
    handler.emit = seen.append
    root.handlers = [handler]
    setup_logging(SimpleNamespace(should_log=True))
    assert pkg.propagate is True and pkg.handlers == []
    logging.getLogger("hf_fasttrain.run.train").info("hello")
    assert [r.getMessage() for r in seen] == ["hello"]
