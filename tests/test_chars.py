"""Character-level data as nanoGPT keeps it: a train.bin / val.bin / meta.pkl folder read as it is (the pickle
without running code), a text file with tokenizer: char, nanoGPT's 90/10 split and its windows."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest
import torch

from hf_fasttrain import DataArguments
from hf_fasttrain.data.chars import (WindowCollator, char_tokenizer, read_ids, read_meta, split_ids, window_rows,
                                     write_nanogpt_folder)
from hf_fasttrain.data.prepare import prepare_lm_data
from hf_fasttrain.data.sources import DataError, resolve_source

TEXT = ("First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n\n"
        "First Citizen:\nYou are all resolved rather to die than to famish?\n") * 6  # 888 characters, 33 distinct


@pytest.fixture
def folder(tmp_path):
    """A nanoGPT data folder as its prepare.py writes it: uint16 ids with tofile, the vocabulary pickled."""
    chars = sorted(set(TEXT))
    stoi = {c: i for i, c in enumerate(chars)}
    ids = np.array([stoi[c] for c in TEXT], dtype=np.uint16)
    n = len(ids)
    ids[: int(n * 0.9)].tofile(tmp_path / "train.bin")
    ids[int(n * 0.9):].tofile(tmp_path / "val.bin")
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": len(chars), "itos": {i: c for i, c in enumerate(chars)}, "stoi": stoi}, f)
    return tmp_path, ids, chars


def test_ids_and_vocabulary_round_trip_exactly(folder):
    path, ids, chars = folder
    assert read_ids(path / "train.bin").tolist() + read_ids(path / "val.bin").tolist() == ids.tolist()
    meta = read_meta(path)
    assert meta["vocab_size"] == len(chars) == 33 and meta["itos"][0] == "\n" and meta["stoi"]["z"] == 32
    tok = char_tokenizer(meta["itos"])
    assert tok(TEXT)["input_ids"] == ids.tolist()
    assert tok.decode(ids.tolist()) == TEXT  # newlines, double spaces and punctuation come back as they were
    assert len(tok) == 33  # no special tokens added: the ids are the folder's


def test_the_saved_tokenizer_is_a_real_one(folder, tmp_path):
    from transformers import AutoTokenizer

    path, ids, _ = folder
    tok = char_tokenizer(read_meta(path)["itos"])
    tok.save_pretrained(str(tmp_path / "tok"))
    again = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    assert again(TEXT)["input_ids"] == ids.tolist() and again.decode(ids[:40].tolist()) == TEXT[:40]


def test_a_pickle_that_names_a_function_is_refused_and_runs_nothing(tmp_path):
    marker = tmp_path / "ran"

    class Exploit:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"vocab_size": 1, "itos": {0: "a"}, "stoi": {"a": 0}, "x": Exploit()}, f)
    with pytest.raises(DataError) as e:
        read_meta(tmp_path)
    assert "asks for posix.mkdir" in str(e.value) and "\n" not in str(e.value)
    assert not marker.exists()
    # a class (not a function) is refused the same way
    from collections import OrderedDict

    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump({"itos": OrderedDict({0: "a"}), "stoi": {"a": 0}}, f)
    with pytest.raises(DataError, match="asks for collections.OrderedDict"):
        read_meta(tmp_path)


@pytest.mark.parametrize("meta, message", [
    ({"vocab_size": 2, "itos": {0: "a"}, "stoi": {"a": 0}}, "must map every id 0..1"),
    ({"vocab_size": 1, "itos": {0: "a"}, "stoi": {"b": 0}}, "stoi is not the inverse of itos"),
    ({"itos": {0: "a"}}, "not itos and stoi"),
    ([1, 2], "holds list without itos and stoi"),
])
def test_a_meta_of_another_shape_is_refused_in_one_line(tmp_path, meta, message):
    with open(tmp_path / "meta.pkl", "wb") as f:
        pickle.dump(meta, f)
    with pytest.raises(DataError, match=message) as e:
        read_meta(tmp_path)
    assert str(e.value).startswith("dataset: ") and "\n" not in str(e.value)


def test_nanogpt_split_sizes():
    assert [len(s) for s in split_ids(np.arange(1_115_394))] == [1_003_854, 111_540]  # tinyshakespeare's
    train, val = split_ids(np.arange(888))
    assert (len(train), len(val), val[0]) == (799, 89, 799)


def test_windows_predict_every_character_of_them():
    rows = window_rows(np.arange(100), 16)
    assert len(rows) == 6  # (100 - 1) // 16: the ids 1..96 predicted, 97..99 left out
    assert rows[5]["input_ids"] == list(range(80, 96)) and rows[5]["labels"] == list(range(81, 97))
    assert len(window_rows(np.arange(16), 16)) == 0  # 16 ids: no window has its 16 next ids


def test_the_folder_and_the_text_file_give_the_same_rows(folder, tmp_path):
    path, ids, _ = folder
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    a = prepare_lm_data(DataArguments(dataset=str(path), block_size=16))
    b = prepare_lm_data(DataArguments(dataset=str(text), tokenizer="char", block_size=16))
    for split, n in (("train", (799 - 1) // 16), ("validation", (89 - 1) // 16)):
        assert len(a.lm[split]) == len(b.lm[split]) == n
        assert a.lm[split]["input_ids"] == b.lm[split]["input_ids"] and a.lm[split]["labels"] == b.lm[split]["labels"]
    assert a.lm["validation"][0]["input_ids"] == ids[799:815].tolist()
    assert "nanoGPT folder, 33 ids; 799 train and 89 validation ids -> 49 train rows, 5 validation rows" in a.summary()
    assert "888 characters, 33 distinct" in b.summary()


def test_every_position_of_a_window_is_scored():
    """The collator hands the next ids as shift_labels: the model's loss is the mean over all 16 positions."""
    from transformers import GPT2Config, GPT2LMHeadModel

    rows = window_rows(np.arange(40) % 7, 16)
    batch = WindowCollator()([rows[0], rows[1]])
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=7, n_positions=16, n_embd=16, n_layer=1, n_head=2)).eval()
    logits = model(input_ids=batch["input_ids"]).logits
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 7), batch["labels"].reshape(-1))
    assert model(**batch).loss.item() == pytest.approx(expected.item(), rel=1e-6)
    assert batch["labels"][0, -1].item() == 16 % 7  # the last position predicts the id after the window


def test_refusals_name_the_field(folder, tmp_path):
    path, _, _ = folder
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "train.bin").write_bytes(b"\x01\x00\x02")
    (tmp_path / "odd" / "val.bin").write_bytes(b"\x01\x00")
    (tmp_path / "odd" / "meta.pkl").write_bytes((path / "meta.pkl").read_bytes())
    with pytest.raises(DataError, match="3 bytes, not whole uint16 ids"):
        prepare_lm_data(DataArguments(dataset=str(tmp_path / "odd"), block_size=2))
    (tmp_path / "odd" / "meta.pkl").unlink()
    with pytest.raises(DataError, match="^tokenizer: .*no meta.pkl names their vocabulary"):
        prepare_lm_data(DataArguments(dataset=str(tmp_path / "odd"), block_size=2))
    np.array([0, 1, 99], dtype=np.uint16).tofile(path / "val.bin")
    with pytest.raises(DataError, match="holds token id 99, outside the vocabulary's 33 ids"):
        prepare_lm_data(DataArguments(dataset=str(path), block_size=2))
    with pytest.raises(DataError, match="tokenizer: char reads one text file"):
        prepare_lm_data(DataArguments(dataset=str(tmp_path / "none.txt"), tokenizer="char", block_size=2))
    with pytest.raises(DataError, match="is a nanoGPT folder .* read whole"):
        resolve_source(str(path))  # a stream or fine-tuning set cannot read it


def test_write_nanogpt_folder_is_prepare_py(tmp_path, folder):
    path, ids, chars = folder
    meta = write_nanogpt_folder(TEXT, tmp_path / "out")
    assert meta == read_meta(path)
    for name in ("train.bin", "val.bin", "meta.pkl"):
        assert (tmp_path / "out" / name).read_bytes() == (path / name).read_bytes() or name == "meta.pkl"
    assert read_meta(tmp_path / "out") == read_meta(path)


def test_a_run_on_the_folder_gets_the_window_collator(folder, tmp_path):
    from hf_fasttrain import FastTrainingArguments, ModelArguments
    from hf_fasttrain.data.front import run_data

    path, _, _ = folder
    training = FastTrainingArguments(output_dir=str(tmp_path / "run"), max_steps=2, report_to="none", use_cpu=True)
    data = run_data(DataArguments(dataset=str(path), block_size=16), ModelArguments(n_layer=1, n_embd=16, n_head=2),
                    training).load()
    assert isinstance(data.collator, WindowCollator) and len(data.tokenizer) == 33
    assert data.summary.startswith(f"data {path}: nanoGPT folder, 33 ids")


def test_generate_past_the_block_crops_the_context():
    """A GPT-2 of 8 positions writes 20 tokens: each from the last 8 (nanoGPT's sample.py), greedy = argmax of that."""
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_fasttrain.run.generate import generate

    tok = char_tokenizer(sorted(set(TEXT)))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tok), n_positions=8, n_embd=16, n_layer=1, n_head=2)).eval()
    out = generate(model, tok, prompt="First", max_new_tokens=20, temperature=0)
    ids = tok("First")["input_ids"]
    with torch.no_grad():
        for _ in range(20):
            ids.append(int(model(input_ids=torch.tensor([ids[-8:]])).logits[0, -1].argmax()))
    assert out == ids[5:] and len(out) == 20
    sampled = [generate(model, tok, prompt="First", max_new_tokens=20, temperature=0.8, seed=3) for _ in range(2)]
    assert sampled[0] == sampled[1] and len(sampled[0]) == 20


def test_tokenize_refuses_character_data(folder, tmp_path):
    from hf_fasttrain.data.prepare import pretokenize

    path, _, _ = folder
    text = tmp_path / "input.txt"
    text.write_text(TEXT, encoding="utf-8")
    with pytest.raises(DataError, match="already pre-tokenized"):
        pretokenize(DataArguments(dataset=str(path), block_size=16), str(tmp_path / "out"))
    with pytest.raises(DataError, match="^tokenizer: tokenizer: char cuts its rows from the text at each run"):
        pretokenize(DataArguments(dataset=str(text), tokenizer="char", block_size=16), str(tmp_path / "out"))
