"""Host reads (device -> host syncs) per training step, counted on CPU: FastTrainer with the recipe's options reads
no more than the plain Trainer. The divergence guard reads its statistics once a step; the Trainer's NaN/inf loss
filter, two reads a micro-batch, runs on the device in FastTrainer (the same logged values).

A read is a call of ``Tensor.item``, ``__float__``, ``__int__``, ``__bool__`` or ``tolist``
(``benchmarks._harness.HostReadCounter``); on a GPU each one waits for every kernel queued before it. The counts
are those of transformers 5.24's Trainer: per non-logging step it reads 3 times (its NaN/inf loss filter twice,
GPT-2's attention-mask check once).

The counter cannot see one kind of wait: ``hf_fasttrain.throughput.HostCopy``, a non-blocking copy of a device
value whose ``value()`` waits on a CUDA event (on a GPU, a host synchronisation per micro-batch; on CPU nothing).
The token-counted schedule used it for every micro-batch (5 waits per step on a GPU, against the Trainer's 3).
Now each micro-batch's tokens are counted while the batch is still in host memory (``HostBatchCollator``; the
batch's tensors ride along as a ``HostBatch``), so the schedule and the throughput meter get plain ints from
the host: no ``HostCopy`` is made with one process, which the tests below count, and the host counts equal the
device counts (sequence-length warmup's cut included).
"""
from __future__ import annotations

import pytest
import torch
from datasets import Dataset
from transformers import DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments

import hf_fasttrain.trainer as trainer_module
from benchmarks._harness import HostReadCounter
from hf_fasttrain import FastTrainer
from hf_fasttrain.schedules import TokenProgress
from hf_fasttrain.throughput import HOST_BATCH_KEY, HostBatch, HostBatchCollator, HostCopy

from conftest import make_tiny_gpt2, tiny_args

# The plain Trainer's reads per non-logging step, the two of them its NaN/inf loss filter makes (on the device in
# FastTrainer), and the divergence guard's: one read of its packed statistics (loss, non-finite flag, gradient
# norm) to decide, before the update, whether to skip the step. The docs quote these (tests/test_docs.py).
TRAINER_READS = 3
FILTER_READS = 2
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


class _TokenPath:
    """What reached the token-counted schedule: the values ``TokenProgress.add`` got, the ``HostCopy`` waits made
    (each a host synchronisation on a GPU) and the devices of the host batches counted."""

    def __init__(self, monkeypatch):
        self.added, self.host_copies, self.counted_on = [], 0, []
        add, copy_init, count = TokenProgress.add, HostCopy.__init__, HostBatch.count

        def spy_add(progress, n):
            self.added.append(n)
            add(progress, n)

        def spy_copy(copy, value):
            self.host_copies += 1
            copy_init(copy, value)

        def spy_count(host, pad_token_id=None):
            self.counted_on.append({t.device.type for t in host.tensors.values()})
            return count(host, pad_token_id)

        monkeypatch.setattr(TokenProgress, "add", spy_add)
        monkeypatch.setattr(HostCopy, "__init__", spy_copy)
        monkeypatch.setattr(HostBatch, "count", spy_count)

    def ints(self) -> bool:
        return bool(self.added) and all(type(n) is int for n in self.added)


@pytest.mark.slow  # Muon's bf16 Newton-Schulz is slow on a CPU
def test_fasttrainer_recipe_reads_no_more_than_the_trainer(tiny_lm, tiny_tokenizer, tmp_path, monkeypatch):
    """The guard reads its statistics once a step; the Trainer's NaN/inf loss filter (two reads a micro-batch) runs
    on the device instead: fewer reads than the plain Trainer's, measured side by side."""
    plain = TrainingArguments(output_dir=str(tmp_path / "plain"), use_cpu=True, report_to="none", save_strategy="no",
                              disable_tqdm=True, dataloader_num_workers=0, **COMMON)
    trainer_reads = _reads_per_step(Trainer, plain, tiny_tokenizer, tiny_lm["train"])
    path = _TokenPath(monkeypatch)
    args = tiny_args(tmp_path / "fast", **{**COMMON, **RECIPE})
    out = []
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"], out)
    # the token count reached the schedule without a read or a wait: 6 steps x 4 rows x 32 tokens, all real,
    # counted from each batch in host memory (no HostCopy: on a GPU each would wait on a CUDA event)
    assert out[0].token_progress.tokens_seen == 6 * 4 * 32
    assert path.ints() and len(path.added) == 6 and path.host_copies == 0
    assert out[0].lr_scheduler.get_last_lr()[0] == pytest.approx(1e-4)  # the cosine's floor at the budget
    assert trainer_reads == [TRAINER_READS] * 5
    assert reads == [TRAINER_READS - FILTER_READS + GUARD_READS] * 5, reads  # the Trainer's, less its filter, plus the guard's
    assert max(reads) <= min(trainer_reads)
    assert out[0].args.logging_nan_inf_filter is True  # the arguments as given, after the run


@pytest.mark.slow
def test_recipe_with_sequence_length_warmup_reads_no_more_than_the_trainer(tiny_lm, tiny_tokenizer, tmp_path):
    """The recipe's options on CPU (AdamW, guard, EMA, run record with its throughput counts, sequence-length
    warmup, checkpoints): per non-logging step, no more host reads than the plain Trainer makes."""
    plain = TrainingArguments(output_dir=str(tmp_path / "plain"), use_cpu=True, report_to="none", save_strategy="no",
                              disable_tqdm=True, dataloader_num_workers=0, **COMMON)
    trainer_reads = _reads_per_step(Trainer, plain, tiny_tokenizer, tiny_lm["train"])
    options = {**COMMON, **RECIPE, "optimizer": "adamw", "seq_len_warmup_min": 8, "seq_len_warmup_fraction": 0.5,
               "schedule_unit": "steps", "schedule_total_tokens": None}
    reads = _reads_per_step(FastTrainer, tiny_args(tmp_path / "fast", **options), tiny_tokenizer, tiny_lm["train"])
    assert len(reads) == 5 and max(reads) <= min(trainer_reads), (reads, trainer_reads)


@pytest.mark.slow
def test_fasttrainer_recipe_without_guard_reads_less_than_the_trainer(tiny_lm, tiny_tokenizer, tmp_path):
    args = tiny_args(tmp_path, **{**COMMON, **RECIPE, "divergence_guard": False})
    reads = _reads_per_step(FastTrainer, args, tiny_tokenizer, tiny_lm["train"])
    assert reads == [TRAINER_READS - FILTER_READS] * 5, f"FastTrainer recipe without the guard: {reads} host reads per step"


class _NaNLossAt:
    """compute_loss whose value is NaN at the given micro-batches (its gradient is the real loss's, so training goes
    on): the loss filter's input."""

    nan_at = (3, 4)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        self.calls = getattr(self, "calls", 0) + 1
        if self.calls in self.nan_at:
            loss = loss + (torch.full_like(loss, float("nan")) - loss).detach()
        return loss


class _NaNTrainer(_NaNLossAt, Trainer):
    pass


class _NaNFastTrainer(_NaNLossAt, FastTrainer):
    pass


@pytest.mark.slow
def test_the_loss_filter_on_the_device_logs_what_the_trainers_logs(tiny_lm, tiny_tokenizer, tmp_path):
    kw = dict(max_steps=6, per_device_train_batch_size=4, logging_steps=2, learning_rate=1e-3, save_strategy="no",
              report_to="none", use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=0)
    logs = {}
    for name, cls, args in (("trainer", _NaNTrainer, TrainingArguments(output_dir=str(tmp_path / "a"), **kw)),
                            ("fast", _NaNFastTrainer, tiny_args(tmp_path / "b", **kw))):
        trainer = cls(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                      data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                      processing_class=tiny_tokenizer)
        trainer.train()
        logs[name] = [(e["step"], e["loss"]) for e in trainer.state.log_history if "loss" in e]
    assert logs["fast"] == logs["trainer"] and len(logs["fast"]) == 3
    assert all(loss == loss for _, loss in logs["fast"])  # the NaN losses were filtered, not logged


# ---- the token count comes from the batch while it is on the host ---------------------------------------

TOKENS = dict(max_steps=6, per_device_train_batch_size=4, logging_steps=1, learning_rate=1e-3, lr_decay="linear",
              schedule_unit="tokens", schedule_total_tokens=6 * 4 * 32, run_record=True)


def _padded_rows(tokenizer, lm, n=48):
    """Rows of 32 tokens whose real length (attention mask) is 8..32, the rest pad ids: the mask decides the count."""
    pad = tokenizer.pad_token_id
    ids, masks = [], []
    for i, row in enumerate(lm["input_ids"][:n]):
        real = 8 + (5 * i) % 25
        ids.append(row[:real] + [pad] * (len(row) - real))
        masks.append([1] * real + [0] * (len(row) - real))
    return Dataset.from_dict({"input_ids": ids, "attention_mask": masks})


def _train(tokenizer, ds, args):
    trainer = FastTrainer(model=make_tiny_gpt2(len(tokenizer)), args=args, train_dataset=ds,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                          processing_class=tokenizer)
    trainer.train()
    return trainer, [e for e in trainer.state.log_history if "loss" in e]


@pytest.mark.parametrize("workers", [0, 1], ids=["main-process", "worker"])
@pytest.mark.slow
def test_token_schedule_gets_host_ints_from_the_cpu_batch(workers, tiny_lm, tiny_tokenizer, tmp_path, monkeypatch):
    # The old path counted the batch after it was moved to the device and handed the schedule a HostCopy per
    # micro-batch: this test fails there (HostCopy made 6 times, no plain ints added).
    path = _TokenPath(monkeypatch)
    args = tiny_args(tmp_path, dataloader_num_workers=workers, **TOKENS)
    trainer, logs = _train(tiny_tokenizer, tiny_lm["train"], args)
    assert path.ints() and path.added == [4 * 32] * 6  # one host int per micro-batch: 4 rows x 32 real tokens
    assert path.host_copies == 0
    assert path.counted_on == [{"cpu"}] * 6  # each from the collator's tensors (from the worker: through its queue)
    assert trainer.token_progress.tokens_seen == 6 * 4 * 32
    assert trainer.lr_scheduler.get_last_lr()[0] == pytest.approx(0.0, abs=1e-12)  # linear to 0 at the budget
    assert [e["padding_fraction"] for e in logs] == [0.0] * 6


@pytest.mark.parametrize("options", [
    dict(gradient_accumulation_steps=2),
    dict(seq_len_warmup_min=8, seq_len_warmup_fraction=0.5),
    dict(seq_len_warmup_min=8, seq_len_warmup_fraction=0.5, seq_len_warmup_mode="rechunk"),
], ids=["padded-grad-accum", "seq-len-warmup", "seq-len-warmup-rechunk"])
@pytest.mark.slow
def test_host_counts_equal_the_device_counts(options, tiny_lm, tiny_tokenizer, tmp_path, monkeypatch):
    ds = _padded_rows(tiny_tokenizer, tiny_lm["train"])
    path = _TokenPath(monkeypatch)
    host, host_logs = _train(tiny_tokenizer, ds, tiny_args(tmp_path / "host", **{**TOKENS, **options}))
    # (a token-counted warmup takes more, shorter steps to the same budget)
    micro_batches = host.state.global_step * options.get("gradient_accumulation_steps", 1)
    assert path.ints() and len(path.added) == micro_batches and path.host_copies == 0
    # the same run counted on the device (no host batches): today's path, a HostCopy per micro-batch
    monkeypatch.setattr(trainer_module, "_collate_with_host_batch", lambda loader: None)
    path = _TokenPath(monkeypatch)
    device, device_logs = _train(tiny_tokenizer, ds, tiny_args(tmp_path / "device", **{**TOKENS, **options}))
    assert path.host_copies == micro_batches and path.counted_on == []
    assert host.token_progress.tokens_seen == device.token_progress.tokens_seen
    assert host.token_progress.tokens_seen < micro_batches * 4 * 32  # padding (and a cut) was not counted
    for key in ("learning_rate", "padding_fraction", "loss"):  # the same run, counted the same
        assert [e[key] for e in host_logs] == [e[key] for e in device_logs], key
    assert any(e["padding_fraction"] > 0 for e in host_logs)


def test_host_batch_rides_along_to_the_device_untouched(tiny_tokenizer):
    from accelerate.utils import send_to_device

    collate = HostBatchCollator(DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False))
    batch = collate([{"input_ids": [5, 6, 7], "attention_mask": [1, 1, 1]}, {"input_ids": [5, 6], "attention_mask": [1, 1]}])
    host = batch[HOST_BATCH_KEY]
    moved = send_to_device(batch, torch.device("cpu"))  # what accelerate's DataLoaderShard does with each batch
    assert moved[HOST_BATCH_KEY] is host
    assert host.tensors["input_ids"] is batch["input_ids"]  # the batch's own tensors, not copies
    count = host.count(tiny_tokenizer.pad_token_id)
    assert (count.real, count.total, count.seq_len) == (5, 6, 3) and type(count.real) is int
    # not a mapping, or tensors already on a device: passed through unchanged
    assert HostBatchCollator(lambda f: (torch.ones(2),))(None)[0].tolist() == [1.0, 1.0]
    meta = HostBatchCollator(lambda f: {"input_ids": torch.ones(1, 2, device="meta")})(None)
    assert HOST_BATCH_KEY not in meta


# ---- two processes (DDP over gloo): the schedule's count stays a device sum over ranks ------------------

DDP_SCRIPT = r"""
import json, sys
import datasets, numpy as np, torch
from transformers import GPT2Config, GPT2LMHeadModel
from hf_fasttrain import FastTrainer, FastTrainingArguments
from hf_fasttrain.schedules import TokenProgress

out = sys.argv[1]
rng = np.random.default_rng(0)
ids = [[(int(rng.integers(1, 64)) + j) % 63 + 1 for j in range(int(n))] for n in rng.integers(3, 33, size=64)]
ds = datasets.Dataset.from_dict({"input_ids": ids})
collated, added = [], []

def collate(features):
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros((len(features), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for r, f in enumerate(features):
        ids[r, : len(f["input_ids"])] = torch.tensor(f["input_ids"])
        mask[r, : len(f["input_ids"])] = 1
    collated.append([int(mask.numpy().sum()), mask.numel()])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}

add = TokenProgress.add
def spy_add(progress, n):
    added.append(type(n).__name__)
    add(progress, n)
TokenProgress.add = spy_add

args = FastTrainingArguments(output_dir=out, max_steps=6, per_device_train_batch_size=2, learning_rate=1e-3,
                             report_to="none", use_cpu=True, logging_steps=1, save_strategy="no", seed=0,
                             disable_tqdm=True, lr_decay="linear", schedule_unit="tokens", schedule_total_tokens=400)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2))
trainer = FastTrainer(model=model, args=args, train_dataset=ds, data_collator=collate)
trainer.train()
logs = [h for h in trainer.state.log_history if "loss" in h]
json.dump({"world_size": args.world_size, "collated": collated[:6], "added": added,
           "tokens_seen": trainer.token_progress.tokens_seen, "lr": [h["learning_rate"] for h in logs],
           "padding": [h["padding_fraction"] for h in logs]}, open(f"{out}/rank{args.process_index}.json", "w"))
# the DDP wrapper holds the process group and its gloo threads: free it now, or the threads end in the
# interpreter's teardown, where one can abort the rank
del trainer
torch.distributed.destroy_process_group()
import gc; gc.collect()
"""


@pytest.mark.e2e
def test_two_processes_schedule_on_the_sum_over_ranks(tmp_path):
    import json
    import os
    import subprocess
    import sys

    script = tmp_path / "ddp_tokens.py"
    script.write_text(DDP_SCRIPT)
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.getcwd(), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script), str(tmp_path)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2))
    assert r0["world_size"] == r1["world_size"] == 2
    # each rank's schedule followed the tokens of both ranks' batches (a device all-reduce, read via HostCopy)
    real = [a[0] + b[0] for a, b in zip(r0["collated"], r1["collated"])]
    assert r0["tokens_seen"] == r1["tokens_seen"] == sum(real)
    # (the ints in between are those HostCopies read when the schedule next needed them)
    assert [a for a in r0["added"] if a != "int"] == [a for a in r1["added"] if a != "int"] == ["HostCopy"] * 6
    assert r0["lr"] == r1["lr"]
    # the meter counted on the host and summed over ranks at each log
    total = [a[1] + b[1] for a, b in zip(r0["collated"], r1["collated"])]
    assert r0["padding"] == pytest.approx([1 - r / t for r, t in zip(real, total)], rel=1e-12)
    assert r0["padding"] == r1["padding"] and any(p > 0 for p in r0["padding"])
