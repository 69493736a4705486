"""A user's own data through the recipe: tokenizers in every form, refusals as one line with exit 2, a
finished output_dir met by another run, and (slow) whole recipe runs on a parquet folder and on a
pre-tokenized folder."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hf_fasttrain.data.tokenizer import EOS_TOKEN, PAD_TOKEN, _train_bpe, load_tokenizer, tokenizer_fingerprint
from hf_fasttrain.data.sources import DataError

from test_sources import make_docs

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def bare_bpe(tmp_path_factory):
    """A byte-level BPE from `tokenizers` with no special tokens, saved three ways."""
    d = tmp_path_factory.mktemp("tokenizers")
    raw = _train_bpe(make_docs(), 300)
    from tokenizers import Tokenizer

    bare = Tokenizer.from_str(raw.to_str())
    # drop the specials _train_bpe adds: a tokenizer as users train it with `tokenizers` alone
    spec = json.loads(bare.to_str())
    spec["added_tokens"] = []
    for t in (EOS_TOKEN, PAD_TOKEN):
        spec["model"]["vocab"].pop(t, None)
    vocab = {tok: i for i, tok in enumerate(sorted(spec["model"]["vocab"], key=spec["model"]["vocab"].get))}
    spec["model"]["vocab"] = vocab
    bare = Tokenizer.from_str(json.dumps(spec))
    (d / "json_only").mkdir()
    bare.save(str(d / "json_only" / "tokenizer.json"))
    bare.save(str(d / "bare.json"))
    (d / "vm").mkdir()
    bare.model.save(str(d / "vm"))
    return d


def test_tokenizer_forms(bare_bpe, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="hf_fasttrain")
    text = "the kernel maps each page"
    forms = [bare_bpe / "bare.json", bare_bpe / "json_only", bare_bpe / "vm", bare_bpe / "vm" / "vocab.json"]
    toks = [load_tokenizer(str(p)) for p in forms]
    n = len(toks[0])
    for tok in toks:
        assert (tok.eos_token, tok.pad_token) == (EOS_TOKEN, PAD_TOKEN)
        assert (tok.eos_token_id, tok.pad_token_id, len(tok)) == (n - 2, n - 1, n)  # appended after the vocabulary
        assert tok(text, add_special_tokens=False)["input_ids"] == toks[0](text, add_special_tokens=False)["input_ids"]
    added = [r.getMessage() for r in caplog.records if "has no eos or pad token" in r.getMessage()]
    assert len(added) == 4 and f"added eos '{EOS_TOKEN}' (id {n - 2}) and pad '{PAD_TOKEN}' (id {n - 1})" in added[0]
    # a save_pretrained copy loads as the same tokenizer (same fingerprint), with no warning
    toks[0].save_pretrained(str(tmp_path / "saved"))
    caplog.clear()
    again = load_tokenizer(str(tmp_path / "saved"))
    assert tokenizer_fingerprint(again) == tokenizer_fingerprint(toks[0]) and not caplog.records
    assert tokenizer_fingerprint(again) != tokenizer_fingerprint(load_tokenizer(str(bare_bpe / "vm")).__class__(
        tokenizer_object=_train_bpe(make_docs(50, seed=3), 280)))
    # anything else: one line naming the forms that work
    (tmp_path / "notes.txt").write_text("not a tokenizer")
    for bad, problem in ((tmp_path / "notes.txt", "could not be loaded ("),
                         (tmp_path / "missing_dir", "does not exist")):  # a path: not the Hub's answer
        with pytest.raises(DataError) as e:
            load_tokenizer(str(bad))
        msg = str(e.value)
        assert problem in msg and msg.startswith("tokenizer: ") and "\n" not in msg
        assert msg.endswith("give a save_pretrained folder, a tokenizer.json file (or a folder holding one), a folder "
                            "with vocab.json + merges.txt (byte-level BPE), or a Hub tokenizer name")


# -- the command line: data mistakes are one line and exit 2, before any training ------------------------
TINY = ["--config", "gpt2_tiny", "--n_layer", "1", "--n_embd", "32", "--n_head", "2", "--block_size", "32",
        "--vocab_size", "300", "--max_steps", "2", "--warmup_steps", "1", "--report_to", "none"]


@pytest.fixture(scope="module")
def bad_data(tmp_path_factory):
    from datasets import Dataset

    d = tmp_path_factory.mktemp("bad")
    (d / "empty.jsonl").write_bytes(b"")
    (d / "latin1.txt").write_bytes("na\u00efve\n".encode("latin-1"))
    Dataset.from_dict({"body": ["a b"] * 4}).to_parquet(str(d / "cols.parquet"))
    Dataset.from_dict({"text": ["", " "] * 4}).to_parquet(str(d / "blank.parquet"))
    return d


@pytest.mark.parametrize("dataset, extra, first", [
    ("empty.jsonl", [], "error: dataset: file 'empty.jsonl' is empty ("),
    ("latin1.txt", [], "error: dataset: 'latin1.txt' is not UTF-8 text: bytes b'\\xef' at byte offset 2 ("),
    ("cols.parquet", [], "error: text_column: 'text' is not a column of 'cols.parquet'; its columns are ['body']; "
                         "name the text column with --text_column (e.g. --text_column body)"),
    ("blank.parquet", [], "error: dataset: no documents left in 'blank.parquet' after dropping 8 empty ones"),
    ("missing.csv", [], "error: dataset: file 'missing.csv' does not exist"),
    ("cols.parquet", ["--text_column", "body", "--tokenizer", "nowhere/tok.json"],
     "error: tokenizer: 'nowhere/tok.json' could not be loaded ("),
])
def test_data_mistakes_are_one_line_and_exit_2(bad_data, tmp_path, monkeypatch, capsys, dataset, extra, first):
    from hf_fasttrain.cli import main

    monkeypatch.chdir(bad_data)
    code = main(["train", *TINY, "--dataset", dataset, *extra, "--output_dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1].split("\r")[-1]  # after any progress bar of the loading
    assert code == 2 and last.startswith(first), err
    assert "Traceback" not in err and not (tmp_path / "run" / "config.yaml").exists()  # no training started


def _finished_run(out: Path, dataset: str, n_layer: int = 1, tokenizer=None) -> None:
    """The files a finished 2-step run leaves (what train() reads to tell it is complete)."""
    import yaml

    from hf_fasttrain.callbacks.averaging import AVERAGE_FILE

    (out / "checkpoint-2").mkdir(parents=True)  # max_steps 2: two optimizer steps
    (out / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    (out / "checkpoint-2" / AVERAGE_FILE).write_bytes(b"")  # gpt2_tiny keeps an EMA in every checkpoint
    (out / "model.safetensors").write_bytes(b"")
    (out / "metrics.json").write_text(json.dumps({"final_metrics": {"eval_loss": 3.5}}))
    (out / "config.yaml").write_text(yaml.safe_dump({
        "model": {"model_type": "gpt2", "n_layer": n_layer, "n_head": 2, "n_embd": 32},
        "data": {"dataset": dataset, "tokenizer": tokenizer, "vocab_size": 300, "block_size": 32},
        "max_steps": 2}))


@pytest.mark.parametrize("change, expected", [
    (["--dataset", "b.parquet"], "dataset 'a.parquet' -> 'b.parquet'"),
    (["--dataset", "a.parquet", "--tokenizer", "gpt2"], "tokenizer None -> 'gpt2'"),
    (["--dataset", "a.parquet", "--n_layer", "2"], "n_layer 1 -> 2"),
])
def test_a_finished_run_met_by_another_is_refused(tmp_path, capsys, change, expected):
    from hf_fasttrain.cli import main

    out = tmp_path / "run"
    _finished_run(out, "a.parquet")
    code = main(["train", *TINY, *change, "--output_dir", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and err == (f"error: output_dir: {out} holds a finished run (checkpoint-2) trained with other "
                                 f"options: {expected}; use a new --output_dir for this run, or add "
                                 "--overwrite_output_dir to discard the old run (its checkpoints are deleted)\n")


def test_the_same_finished_run_is_still_a_noop(tmp_path, capsys):
    from hf_fasttrain.run import train as run
    from hf_fasttrain.config.recipes import parse_config

    out = tmp_path / "run"
    _finished_run(out, "a.parquet")
    assert run.train(*parse_config([*TINY, "--dataset", "a.parquet", "--output_dir", str(out)])) == {"eval_loss": 3.5}
    assert "is complete" in capsys.readouterr().err  # on the console, whatever the logging setup


# -- whole recipe runs ------------------------------------------------------------------------------------------
@pytest.mark.e2e
def test_recipe_trains_on_a_parquet_folder_then_on_its_pretokenized_rows(tmp_path):
    """`python recipes/gpt2_small.py --config gpt2_tiny --dataset <x> --max_steps 30` on a generated corpus: a
    folder of parquet shards (tokenizer trained on it), then the same data written by `hf-fasttrain tokenize`."""
    from datasets import Dataset

    docs = make_docs(1500, seed=4)
    (tmp_path / "pq").mkdir()
    for i in range(3):
        Dataset.from_dict({"text": docs[i::3] + [""]}).to_parquet(str(tmp_path / "pq" / f"part-{i}.parquet"))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "HF_FASTTRAIN_CACHE": str(tmp_path / "cache"),
           "HF_DATASETS_CACHE": str(tmp_path / "hf")}
    common = ["--config", "gpt2_tiny", "--max_steps", "30", "--eval_steps", "15", "--save_steps", "30",
              "--vocab_size", "512", "--max_eval_samples", "16", "--disable_tqdm", "true", "--n_layer", "1",
              "--n_embd", "64", "--n_head", "2", "--per_device_train_batch_size", "8", "--block_size", "64"]

    def train(dataset: str, out: str) -> dict:
        proc = subprocess.run([sys.executable, "recipes/gpt2_small.py", *common, "--dataset", dataset,
                               "--output_dir", out], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
        assert proc.returncode == 0, proc.stderr[-3000:]
        metrics = json.loads((Path(out) / "metrics.json").read_text())
        evals = [h["eval_loss"] for h in metrics["history"] if "eval_loss" in h]
        assert evals[-1] < evals[0] - 1.0, evals  # it learned
        return {"stderr": proc.stderr, "evals": evals}

    text_run = train(str(tmp_path / "pq"), str(tmp_path / "run_text"))
    assert "documents (3 empty dropped) -> " in text_run["stderr"]
    tok = subprocess.run([sys.executable, "-m", "hf_fasttrain.cli", "tokenize", "--dataset", str(tmp_path / "pq"),
                          "--tokenizer", str(tmp_path / "run_text"), "--block_size", "64", "--out",
                          str(tmp_path / "rows")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert tok.returncode == 0, tok.stderr[-3000:]
    rows_run = train(str(tmp_path / "rows"), str(tmp_path / "run_rows"))
    assert "pre-tokenized" in rows_run["stderr"] and "Tokenizing" not in rows_run["stderr"]
    # the same rows, tokenizer and seed: the same run
    assert rows_run["evals"] == pytest.approx(text_run["evals"], abs=1e-4)
