"""Host reads (device -> host syncs) per training step, counted on CPU: FastTrainer with the GPU recipe's
options reads no more than the plain Trainer, apart from the divergence guard's one exact read.

A read is a call of ``Tensor.item``, ``__float__``, ``__int__``, ``__bool__`` or ``tolist``
(``benchmarks._harness.HostReadCounter``); on a GPU each one waits for every kernel queued before it. The token
count of the token-counted schedule reaches the host through ``hf_fasttrain.throughput.HostCopy`` (a
non-blocking copy queued before the step's forward pass, read after ``optimizer.step()``), which waits for that
copy only and is not a read here. The counts are those of transformers 5.24's Trainer: per
non-logging step it reads 3 times (its NaN/inf loss filter twice, GPT-2's attention-mask check once).
"""

from __future__ import annotations

import pytest
import torch
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

from benchmarks._harness import HostReadCounter
from hf_fasttrain import FastTrainer

from conftest import make_tiny_gpt2, tiny_args

# The plain Trainer's reads per non-logging step, and the divergence guard's: one read of its packed
# statistics (loss, non-finite flag, gradient norm) to decide, before the update, whether to skip the step.
TRAINER_READS = 3
GUARD_READS = 1


class _ReadsPerStep(TrainerCallback):
    """Reads between consecutive on_step_end calls: one optimizer step, its data loading and its log check."""

    def __init__(self, counter):
        self.counter, self.marks = counter, []

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(self.counter.n)

    def per_step(self) -> list[int]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def _reads_per_step(trainer_cls, args, tokenizer, ds, out=None) -> list[int]:
    trainer = trainer_cls(model=make_tiny_gpt2(len(tokenizer)), args=args, train_dataset=ds,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                          processing_class=tokenizer)
    with HostReadCounter() as counter:
        probe = _ReadsPerStep(counter)
        trainer.add_callback(probe)
        trainer.train()
    if out is not None:
        out.append(trainer)
    return probe.per_step()


COMMON = dict(max_steps=6, per_device_train_batch_size=4, logging_steps=1000, learning_rate=1e-3)
RECIPE = dict(  # the GPU recipe's options, on a tiny model
    optimizer="muon", lr_decay="cosine", min_lr_ratio=0.1, warmup_steps=2, max_grad_norm=1.0, clip_mode="norm",
    divergence_guard=True, guard_snapshot_every=2, weight_averaging="ema", ema_decay=0.9,
    schedule_unit="tokens", schedule_total_tokens=4 * 6 * 32, run_record=True,
    optimizer_kwargs={"fused": True},  # as on a GPU: fused AdamW keeps its step counts on the device
)


def test_plain_trainer_reads_3_per_step(tiny_lm, tiny_tokenizer, tmp_path):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none", save_strategy="no",
                             disable_tqdm=True, dataloader_num_workers=0, **COMMON)
    reads = _reads_per_step(Trainer, args, tiny_tokenizer, tiny_lm["train"])
    assert reads == [TRAINER_READS] * 5, f"plain Trainer: {reads} host reads per step, expected 3"


@pytest.mark.slow
def test_fasttrainer_defaults_read_as_the_trainer(tiny_lm, tiny_tokenizer, tmp_path):
    args = tiny_args(tmp_path, run_record=False, **COMMON)
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"])
    assert reads == [TRAINER_READS] * 5, f"FastTrainer, options off: {reads} host reads per step, expected 3"


@pytest.mark.slow  # Muon's bf16 Newton-Schulz is slow on a CPU
def test_fasttrainer_recipe_reads_3_plus_the_guards_1(tiny_lm, tiny_tokenizer, tmp_path):
    args = tiny_args(tmp_path, **{**COMMON, **RECIPE})
    out = []
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"], out)
    # the token count reached the schedule without a read: 6 steps x 4 rows x 32 tokens, all real
    assert out[0].token_progress.tokens_seen == 6 * 4 * 32
    assert out[0].lr_scheduler.get_last_lr()[0] == pytest.approx(1e-4)  # the cosine's floor at the budget
    expected = TRAINER_READS + GUARD_READS
    assert reads == [expected] * 5, (
        f"FastTrainer with Muon, guard, run record, token schedule, EMA: {reads} host reads per step, expected "
        f"{expected} (the Trainer's 3 + the guard's 1)")


@pytest.mark.slow
def test_fasttrainer_recipe_without_guard_reads_as_the_trainer(tiny_lm, tiny_tokenizer, tmp_path):
    args = tiny_args(tmp_path, **{**COMMON, **RECIPE, "divergence_guard": False})
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"])
    assert reads == [TRAINER_READS] * 5, f"FastTrainer recipe without the guard: {reads} host reads per step, expected 3"
