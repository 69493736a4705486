"""A compiled run under sequence-length warmup compiles the model at most twice (a static graph at the first
length, one dynamic graph for every later length), whatever the pacing; FastTrainer logs the count and writes it into
run_info.json. Dynamo's guards (what forces a recompile) do not depend on the backend, so the tests compile with
the "eager" backend: seconds instead of minutes of inductor on a CPU."""

import json

import pytest
import torch
from transformers import DataCollatorForLanguageModeling

from hf_fasttrain import FastTrainer
from hf_fasttrain.throughput import CompileCounter
from hf_fasttrain.data.seqlen import PACINGS, set_batch_sequence_length

from conftest import make_tiny_gpt2, tiny_args

MAX_COMPILES = 2


def test_truncated_batches_are_contiguous():
    batch = {"input_ids": torch.arange(24).view(3, 8), "attention_mask": torch.ones(3, 8, dtype=torch.long)}
    cut = set_batch_sequence_length(batch, 4, "truncate")
    assert all(v.is_contiguous() and v.shape == (3, 4) for v in cut.values())
    assert cut["input_ids"].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19]]
    rechunked = set_batch_sequence_length({**batch, "position_ids": torch.arange(8).expand(3, 8)}, 4, "rechunk")
    assert all(v.is_contiguous() and v.shape == (6, 4) for v in rechunked.values())


def test_compile_counter_counts_a_recompile():
    counter = CompileCounter()
    f = torch.compile(lambda x: x + 1, backend="eager")
    f(torch.ones(2, 3))
    f(torch.ones(2, 4))  # a second length: one dynamic graph
    f(torch.ones(2, 5))
    assert counter.stats() == {"compiles": 2, "compiled_graphs": 2}
    f(torch.ones(2, 8)[:, :6])  # a slice keeps the parent's row stride: one more compile
    assert counter.compiles() == 3


def _run(tmp_path, tiny_lm, tiny_tokenizer, compile_: bool, pacing: str):
    args = tiny_args(
        tmp_path, max_steps=10, per_device_train_batch_size=4, logging_steps=1, learning_rate=1e-3,
        seq_len_warmup_min=8, seq_len_warmup_fraction=0.6, seq_len_warmup_pacing=pacing,
        seq_len_warmup_multiple=4 if pacing == "linear" else 8,
        torch_compile=compile_, torch_compile_backend="eager" if compile_ else None,
    )
    torch._dynamo.reset()
    trainer = FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                          data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False), processing_class=tiny_tokenizer)
    trainer.train()
    logs = [e for e in trainer.state.log_history if "loss" in e]
    return trainer, logs


@pytest.mark.slow
@pytest.mark.parametrize("pacing", PACINGS)
def test_compiled_warmup_run_compiles_the_model_at_most_2_times(pacing, tiny_lm, tiny_tokenizer, tmp_path):
    _, eager = _run(tmp_path / "eager", tiny_lm, tiny_tokenizer, False, pacing)
    trainer, compiled = _run(tmp_path / "compiled", tiny_lm, tiny_tokenizer, True, pacing)
    lengths = sorted({e["seq_len"] for e in compiled})
    assert len(lengths) >= 4 and lengths[-1] == 32, lengths  # the warmup went through several lengths
    compiles = compiled[-1]["compiles"]
    assert compiles <= MAX_COMPILES, f"{pacing} pacing over lengths {lengths}: {compiles} compiles of the model, at most 2"
    first_len = compiled[0]["seq_len"]
    second = next(e for e in compiled if e["seq_len"] != first_len)
    assert (compiled[0]["compiles"], second["compiles"]) == (1, 2)  # static at the first length, then dynamic
    # graphs in all: the tiny model's forward is split in 2 by a graph break (a logging call), so 2 per compile
    assert compiled[-1]["compiled_graphs"] <= 2 * MAX_COMPILES
    info = json.loads((tmp_path / "compiled" / "run_info.json").read_text())
    assert (info["compiles"], info["compiled_graphs"]) == (compiles, compiled[-1]["compiled_graphs"])
    assert [e["loss"] for e in compiled] == pytest.approx([e["loss"] for e in eager], rel=1e-4)
    assert "compiles" not in eager[-1] and "compiled_graphs" not in eager[-1]
