"""Host reads (device -> host syncs) per training step, counted on CPU: FastTrainer with the GPU recipe's
options reads no more than the plain Trainer, apart from the divergence guard's one exact read.

A read is a call of ``Tensor.item``, ``__float__``, ``__int__``, ``__bool__`` or ``tolist``; on a GPU each one
waits for every kernel queued before it. The counts are those of transformers 5.24's Trainer: per
non-logging step it reads 3 times (its NaN/inf loss filter twice, GPT-2's attention-mask check once).
"""

from __future__ import annotations

import contextlib

import pytest
import torch
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

from hf_fasttrain import FastTrainer

from conftest import make_tiny_gpt2, tiny_args

READS = ("item", "__float__", "__int__", "__bool__", "tolist")

# The plain Trainer's reads per non-logging step, and the divergence guard's: one read of its packed
# statistics (loss, non-finite flag, gradient norm) to decide, before the update, whether to skip the step.
TRAINER_READS = 3
GUARD_READS = 1


@contextlib.contextmanager
def count_host_reads():
    """Count calls of the Tensor methods that read a value to the host (nested calls count once)."""
    counter = {"n": 0, "depth": 0}
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def wrap(fn):
        def counted(self, *args, **kwargs):
            if counter["depth"] == 0:
                counter["n"] += 1
                if "stacks" in counter:
                    import traceback
                    counter["stacks"].append("".join(traceback.format_stack(limit=6)[:-1]))
            counter["depth"] += 1
            try:
                return fn(self, *args, **kwargs)
            finally:
                counter["depth"] -= 1
        return counted

    for name, fn in originals.items():
        setattr(torch.Tensor, name, wrap(fn))
    try:
        yield counter
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)


class _ReadsPerStep(TrainerCallback):
    """Reads between consecutive on_step_end calls: one optimizer step, its data loading and its log check."""

    def __init__(self, counter):
        self.counter, self.marks = counter, []

    def on_step_end(self, args, state, control, **kwargs):
        self.marks.append(self.counter["n"])

    def per_step(self) -> list[int]:
        return [b - a for a, b in zip(self.marks, self.marks[1:])]


def _reads_per_step(trainer_cls, args, tokenizer, ds) -> list[int]:
    trainer = trainer_cls(model=make_tiny_gpt2(len(tokenizer)), args=args, train_dataset=ds,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                          processing_class=tokenizer)
    with count_host_reads() as counter:
        probe = _ReadsPerStep(counter)
        trainer.add_callback(probe)
        trainer.train()
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


def test_fasttrainer_defaults_read_as_the_trainer(tiny_lm, tiny_tokenizer, tmp_path):
    args = tiny_args(tmp_path, run_record=False, **COMMON)
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"])
    assert reads == [TRAINER_READS] * 5, f"FastTrainer, options off: {reads} host reads per step, expected 3"


def test_fasttrainer_recipe_reads_3_plus_the_guards_1(tiny_lm, tiny_tokenizer, tmp_path):
    args = tiny_args(tmp_path, **{**COMMON, **RECIPE})
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"])
    expected = TRAINER_READS + GUARD_READS
    assert reads == [expected] * 5, (
        f"FastTrainer with Muon, guard, run record, token schedule, EMA: {reads} host reads per step, expected "
        f"{expected} (the Trainer's 3 + the guard's 1)")


def test_fasttrainer_recipe_without_guard_reads_as_the_trainer(tiny_lm, tiny_tokenizer, tmp_path):
    args = tiny_args(tmp_path, **{**COMMON, **RECIPE, "divergence_guard": False})
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"])
    assert reads == [TRAINER_READS] * 5, f"FastTrainer recipe without the guard: {reads} host reads per step, expected 3"
