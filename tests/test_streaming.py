"""Streaming: rows packed exactly, every document once across ranks and workers, a resume at any row
continues with the next one, FastTrainer resumed == straight to the bit, and what a stream cannot do is
refused in one line."""

import json
import random

import datasets
import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import DataCollatorForLanguageModeling, PreTrainedTokenizerFast, TrainerCallback

from hf_fasttrain import FastTrainer
from hf_fasttrain.callbacks.data_position import ResumedEpochCallback, load_stream_position
from hf_fasttrain.data.from_args import planned_optimizer_steps
from hf_fasttrain.data.streaming import STREAM_KEY, TokenStream, holdout_rows
from hf_fasttrain.trainer import RESUME_HOOK

from conftest import StopAt, make_tiny_gpt2, tiny_args

N_DOCS = 60
FIRST_ID = 8  # token ids below are fillers and EOS; id FIRST_ID + k marks document k


def _word_tokenizer():
    vocab = {"<eos>": 0, "<pad>": 1, **{w: i + 2 for i, w in enumerate("abcdef")}}
    vocab.update({f"d{k}": FIRST_ID + k for k in range(N_DOCS)})
    tk = Tokenizer(models.WordLevel(vocab, unk_token="a"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<eos>", pad_token="<pad>")


def _docs(n=N_DOCS, seed=0):
    rng = random.Random(seed)
    return [f"d{k} " + " ".join(rng.choice("abcdef") for _ in range(rng.randint(1, 12))) for k in range(n)]


def _source(docs, shards=4):
    return datasets.Dataset.from_dict({"text": docs}).to_iterable_dataset(num_shards=shards)


def _doc_ids(rows):
    return [t - FIRST_ID for r in rows for t in r["input_ids"] if t >= FIRST_ID]


def test_rows_are_the_documents_concatenated_with_eos_and_cut():
    tok, docs = _word_tokenizer(), _docs(12)
    rows = list(TokenStream(_source(docs, shards=1), tok, block_size=5))
    flat = [t for d in docs for t in tok(d, add_special_tokens=False)["input_ids"] + [0]]
    assert [r["input_ids"] for r in rows] == [flat[i:i + 5] for i in range(0, len(flat), 5)]
    assert all(len(r["input_ids"]) == 5 for r in rows[:-1]) and 1 <= len(rows[-1]["input_ids"]) <= 5


@pytest.mark.parametrize("world_size,shards", [(2, 4), (2, 3), (3, 4)])
def test_every_document_once_across_ranks(world_size, shards):
    tok = _word_tokenizer()
    seen = []
    for rank in range(world_size):
        stream = TokenStream(_source(_docs(), shards), tok, block_size=7, rank=rank, world_size=world_size,
                             shuffle_buffer=5, seed=3)
        seen += _doc_ids(list(stream))
    assert sorted(seen) == list(range(N_DOCS))


def test_shuffle_is_seeded_and_changes_with_the_epoch():
    tok = _word_tokenizer()

    def order(seed, epoch):
        s = TokenStream(_source(_docs(), 1), tok, block_size=7, shuffle_buffer=10, seed=seed)
        s.set_epoch(epoch)
        return _doc_ids(list(s))

    assert order(0, 0) == order(0, 0) != order(1, 0)
    assert order(0, 0) != order(0, 1) and sorted(order(0, 1)) == list(range(N_DOCS))
    assert order(0, 0)[:10] != list(range(10)) and sorted(order(0, 0)[:10]) == list(range(10))  # within a window


@pytest.mark.parametrize("shuffle_buffer", [0, 7])
def test_resume_at_any_row_continues_with_the_next(shuffle_buffer):
    tok = _word_tokenizer()
    make = lambda: TokenStream(_source(_docs(), 2), tok, block_size=6, shuffle_buffer=shuffle_buffer, seed=1)  # noqa: E731
    straight = list(make())
    for k in random.Random(0).sample(range(len(straight) - 1), 8):
        position = dict(straight[k][STREAM_KEY])
        state = {"epoch": 0, "workers": 1, "next_worker": 0, "readers": {"0": position}}
        resumed = make()
        resumed.load_state_dict(state)
        again = list(resumed)
        assert [r["input_ids"] for r in again] == [r["input_ids"] for r in straight[k + 1:]], k
        if len(again) > 1:  # a second resume, from the first row after the first: positions stay exact
            twice = make()
            twice.load_state_dict({**state, "readers": {"0": again[0][STREAM_KEY]}})
            assert [r["input_ids"] for r in twice] == [r["input_ids"] for r in straight[k + 2:]], k


def test_dataloader_workers_split_shards_and_resume_in_order(tmp_path):
    from hf_fasttrain.data.streaming import StreamCollator, StreamPosition

    tok = _word_tokenizer()
    make = lambda: TokenStream(_source(_docs(), 4), tok, block_size=6)  # noqa: E731

    def loader(stream):
        collate = StreamCollator(lambda f: {"input_ids": [x["input_ids"] for x in f]})
        return torch.utils.data.DataLoader(stream, batch_size=2, num_workers=2, collate_fn=collate)

    straight_stream = make()
    batches = list(loader(straight_stream))
    assert sorted(_doc_ids([{"input_ids": t} for b in batches for t in b["input_ids"]])) == list(range(N_DOCS))
    for k in (2, 5):
        taker = StreamPosition(straight_stream)
        for b in batches[:k + 1]:
            taker.take(dict(b))
        resumed = make()
        resumed.load_state_dict(json.loads(json.dumps(taker.state_dict())))  # through JSON, as in a checkpoint
        assert [b["input_ids"] for b in loader(resumed)] == [b["input_ids"] for b in batches[k + 1:]], k


def test_held_out_documents_are_never_trained_on():
    tok = _word_tokenizer()
    rows, used = holdout_rows(_source(_docs(), 1), tok, block_size=6, num_rows=5)
    held = set(_doc_ids([{"input_ids": r} for r in rows]))
    assert len(rows) == 5 and held and len(used) >= len(held)
    trained = _doc_ids(list(TokenStream(_source(_docs(), 2), tok, block_size=6, exclude=used)))
    assert not held & set(trained) and len(trained) == N_DOCS - len(used)


class _CountDocs:
    """A tokenizer wrapper counting the documents it tokenizes (what a resume had to read again)."""

    def __init__(self, tok):
        self.tok, self.count = tok, 0
        self.eos_token_id = tok.eos_token_id

    def __call__(self, texts, **kw):
        self.count += len(texts)
        return self.tok(texts, **kw)


def _stream_trainer(tokenizer, out, **kw):
    source = datasets.load_dataset("json", data_files={"train": [str(out.parent / "docs.jsonl")]}, split="train",
                                   streaming=True)
    counting = _CountDocs(tokenizer)
    stream = TokenStream(source, counting, block_size=32, shuffle_buffer=16, seed=0)
    args = tiny_args(out, **{**dict(max_steps=6, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                                    save_strategy="steps", save_steps=3), **kw})
    trainer = FastTrainer(model=make_tiny_gpt2(len(tokenizer)), args=args, train_dataset=stream,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
                          processing_class=tokenizer)
    return trainer, counting


def _write_docs(path, n=400):
    rng = random.Random(0)
    words = "def return self import class for in if else while with as lambda yield".split()
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(rng.randint(3, 40)))}) + "\n")


@pytest.mark.slow
def test_fasttrainer_stream_resumed_equals_straight_bit_exact(tiny_tokenizer, tmp_path):
    _write_docs(tmp_path / "docs.jsonl")
    straight, _ = _stream_trainer(tiny_tokenizer, tmp_path / "straight")
    straight.train()
    first, _ = _stream_trainer(tiny_tokenizer, tmp_path / "resumed")
    first.add_callback(StopAt(3))
    first.train()
    assert first.state.global_step == 3
    checkpoint = tmp_path / "resumed" / "checkpoint-3"
    position = load_stream_position(str(checkpoint), 0)
    assert position["readers"]["0"]["epoch"] == 0 and position["next_worker"] == 0
    resumed, counting = _stream_trainer(tiny_tokenizer, tmp_path / "resumed")
    resumed.train(resume_from_checkpoint=str(checkpoint))
    assert resumed.state.global_step == 6 and resumed.args.ignore_data_skip is False
    # the resume read one window again (16 documents), not the 3 steps x 2 x 4 rows trained before it
    straight_docs = straight.train_dataset.tokenizer.count
    assert counting.count < straight_docs
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    # negative control: the weights at step 3 differ from those at step 6
    assert not torch.equal(first.model.transformer.wte.weight, resumed.model.transformer.wte.weight)
    losses = lambda t: [e["loss"] for e in t.state.log_history if "loss" in e]  # noqa: E731
    assert losses(resumed)[-3:] == losses(straight)[-3:]
    # the logged epoch continues from the checkpoint's instead of restarting at 0
    epochs = lambda t: [e["epoch"] for e in t.state.log_history if "loss" in e]  # noqa: E731
    assert epochs(resumed)[-3:] == pytest.approx(epochs(straight)[-3:]) and epochs(straight)[-1] == 1.0
    assert not any(isinstance(c, ResumedEpochCallback) for c in resumed.callback_handler.callbacks)


@pytest.mark.parametrize("counted_steps,trainer_epochs,expected", [
    # resumed at step 5 of 8 (one micro-batch a step) in the stream's second pass, 2 steps into it: E = 1.25.
    # Skipped nothing: the Trainer counts 1/8, 2/8 in its first pass, then 1 + 1/8 in its next
    (False, [(0.125, False), (0.25, True), (1.125, False)], [1.375, 1.5, 2.125]),
    # its resume hook given the stream (transformers >= 5.25): it counts the 5 steps, 6/8 and 7/8, then 1 + 1/8
    (True, [(0.75, False), (0.875, True), (1.125, False)], [1.375, 1.5, 2.125]),
])
def test_resumed_epoch_is_the_straight_runs(counted_steps, trainer_epochs, expected):
    from types import SimpleNamespace

    state = SimpleNamespace(epoch=1.25, global_step=5, max_steps=8)
    callback = ResumedEpochCallback(counted_steps=counted_steps)
    callback.on_train_begin(None, state, None)
    got = []
    for epoch, pass_ends in trainer_epochs:
        state.epoch = epoch  # as the Trainer sets it before on_step_end
        callback.on_step_end(None, state, None)
        got.append(state.epoch)
        if pass_ends:
            callback.on_epoch_end(None, state, None)
    assert got == expected


class _SkipSeen(TrainerCallback):
    """What the resumed Trainer was told about skipping: ``ignore_data_skip`` as training began, and each call of
    its resume hook (``get_resumed_dataloader``) with the batches to skip and whether the loader came back as is."""

    def __init__(self, trainer):
        self.ignore_data_skip, self.hook_calls, hook = None, [], trainer.get_resumed_dataloader

        def spy(loader, num_batches):
            out = hook(loader, num_batches)
            self.hook_calls.append((num_batches, out is loader))
            return out

        trainer.get_resumed_dataloader = spy

    def on_train_begin(self, args, state, control, **kwargs):
        self.ignore_data_skip = args.ignore_data_skip


def _no_skip_by_reading(*args, **kwargs):
    raise AssertionError("the stream's trained batches were skipped by reading them")


@pytest.mark.slow
@pytest.mark.parametrize("hook", [
    pytest.param(True, marks=pytest.mark.skipif(not RESUME_HOOK, reason="transformers < 5.25 has no resume hook")),
    pytest.param(False, id="before-5.25", marks=pytest.mark.slow),
])
def test_resumed_epoch_continues_across_passes(hook, tiny_tokenizer, tmp_path, monkeypatch):
    """A resume in the stream's first pass whose steps cross into its second: the Trainer's resume hook (given the
    stream as it is, no batch read to skip it) on transformers >= 5.25, ``ignore_data_skip`` before (both here)."""
    import transformers.trainer

    monkeypatch.setattr("hf_fasttrain.trainer.RESUME_HOOK", hook)
    monkeypatch.setattr(transformers.trainer, "skip_first_batches", _no_skip_by_reading)
    _write_docs(tmp_path / "docs.jsonl", n=12)  # the first pass ends in step 6: the resumed steps 5-6 cross it
    straight, _ = _stream_trainer(tiny_tokenizer, tmp_path / "straight", save_steps=4)
    straight.train()
    first, _ = _stream_trainer(tiny_tokenizer, tmp_path / "resumed", save_steps=4)
    first.add_callback(StopAt(4))
    first.train()
    resumed, _ = _stream_trainer(tiny_tokenizer, tmp_path / "resumed", save_steps=4)
    seen = _SkipSeen(resumed)
    resumed.add_callback(seen)
    resumed.train(resume_from_checkpoint=str(tmp_path / "resumed" / "checkpoint-4"))
    if hook:  # 4 steps x 2 micro-batches to skip: the stream, already at its position, is returned as it is
        assert seen.ignore_data_skip is False and seen.hook_calls == [(8, True)]
    else:
        assert seen.ignore_data_skip is True and seen.hook_calls == []
    assert resumed.args.ignore_data_skip is False  # the user's value, after train()
    epochs = lambda t: [e["epoch"] for e in t.state.log_history if "loss" in e]  # noqa: E731
    assert epochs(straight)[-2] < 1 < epochs(straight)[-1]  # the straight run crossed into its second pass
    assert epochs(resumed)[-2:] == pytest.approx(epochs(straight)[-2:])
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_seq_len_warmup_on_a_stream(tiny_tokenizer, tmp_path):
    _write_docs(tmp_path / "docs.jsonl")
    trainer, _ = _stream_trainer(tiny_tokenizer, tmp_path / "warm", seq_len_warmup_min=8, seq_len_warmup_fraction=1.0,
                                 seq_len_warmup_multiple=8, save_strategy="no")
    trainer.train()
    # max_steps 6 is 6 optimizer steps, the warmup over all of them
    assert [e["seq_len"] for e in trainer.state.log_history if "loss" in e] == [8, 8, 16, 16, 24, 24]
    assert trainer.state.global_step == planned_optimizer_steps(trainer.args, 32) == 6


@pytest.mark.parametrize("overrides,field", [
    (dict(max_steps=-1), "max_steps"),
    (dict(length_grouping=True), "length_grouping"),
    (dict(max_tokens_per_batch=256), "max_tokens_per_batch"),
    (dict(curriculum_min_length=8), "curriculum_min_length"),
    (dict(packing="rows", packing_row_length=32), "packing"),
    (dict(max_train_samples=100), "max_train_samples"),
])
def test_what_a_stream_cannot_do_is_refused_in_one_line(overrides, field, capsys, tmp_path):
    from hf_fasttrain.cli import run_recipe

    recipe = tmp_path / "r.yaml"  # no other option that needs max_steps, so the stream's own check speaks
    recipe.write_text("max_steps: 30\ndata:\n  block_size: 32\n  streaming: true\n")
    argv = ["--config", str(recipe), "--dataset", str(tmp_path / "x.jsonl"), "--output_dir", str(tmp_path / "out")]
    for k, v in {"max_steps": 30, **overrides}.items():
        argv += [f"--{k}", str(v).lower() if isinstance(v, bool) else str(v)]
    assert run_recipe(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {field}:") and "stream" in err[0], err


@pytest.mark.slow
def test_map_style_resumed_equals_straight_bit_exact(tiny_lm, tiny_tokenizer, tmp_path):
    """The map-style path for comparison: the Trainer re-iterates its sampler (indices only) to the step."""
    def trainer(out, **kw):
        args = tiny_args(out, max_steps=6, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         save_strategy="steps", save_steps=3, **kw)
        return FastTrainer(model=make_tiny_gpt2(len(tiny_tokenizer)), args=args, train_dataset=tiny_lm["train"],
                           data_collator=DataCollatorForLanguageModeling(tiny_tokenizer, mlm=False),
                           processing_class=tiny_tokenizer)

    straight = trainer(tmp_path / "a")
    straight.train()
    first = trainer(tmp_path / "b")
    first.add_callback(StopAt(3))
    first.train()
    resumed = trainer(tmp_path / "b")
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-3"))
    a, b = straight.model.state_dict(), resumed.model.state_dict()
    assert resumed.stream_position is None and all(torch.equal(a[k], b[k]) for k in a)
    assert not torch.equal(first.model.transformer.wte.weight, resumed.model.transformer.wte.weight)
