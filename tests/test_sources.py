"""Every format by path in one ``dataset`` option (hf_fasttrain.data.sources), on a small generated corpus.

resolve_source is a table of (what the user gives) -> (builder, files per split); load_source and
prepare_lm_data are checked to give the same rows from every format, and every data mistake to be one line.
"""

from __future__ import annotations

import gzip
import os
import random
import shutil

import pytest

from hf_fasttrain.config.args import DataArguments
from hf_fasttrain.data.prepare import prepare_lm_data
from hf_fasttrain.data.sources import LOAD_FROM_DISK, DataError, first_non_utf8, load_source, resolve_source

WORDS = ("the kernel maps each page of memory to a frame and the scheduler picks the next thread that may run "
         "while a lock guards the queue of buffers written to disk by the file system").split()
N_DOCS, N_EMPTY = 120, 6


def make_docs(n: int = N_DOCS, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(15, 60))) + "." for _ in range(n)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The same documents in every format (plus N_EMPTY empty ones in the text files)."""
    from datasets import Dataset, DatasetDict

    d = tmp_path_factory.mktemp("corpus")
    docs = make_docs()
    with_empty = list(docs)
    for i in range(N_EMPTY):
        with_empty.insert(10 * i + 3, " " if i % 2 else "")
    ds = Dataset.from_dict({"text": with_empty})
    ds.to_parquet(str(d / "c.parquet"))
    ds.to_csv(str(d / "c.csv"), index=False)
    ds.to_json(str(d / "c.jsonl"))
    with open(d / "c.jsonl", "rb") as f, gzip.open(d / "c.jsonl.gz", "wb") as g:
        g.write(f.read())
    (d / "pq").mkdir()
    for i in range(3):
        ds.shard(3, i, contiguous=True).to_parquet(str(d / "pq" / f"part-{i}.parquet"))
    (d / "pq" / "README.md").write_text("# a card, not data\n")
    ds.save_to_disk(str(d / "saved_ds"))
    shutil.copy(next((d / "saved_ds").glob("*.arrow")), d / "c.arrow")
    DatasetDict({"train": Dataset.from_dict({"text": docs[:100]}),
                 "validation": Dataset.from_dict({"text": docs[100:]})}).save_to_disk(str(d / "saved_dd"))
    (d / "split").mkdir()
    Dataset.from_dict({"text": docs[:100]}).to_parquet(str(d / "split" / "train-00000.parquet"))
    Dataset.from_dict({"text": docs[100:]}).to_parquet(str(d / "split" / "validation-00000.parquet"))
    (d / "c.txt").write_text("\n\n".join(with_empty) + "\n", encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    """A byte-level BPE trained on the corpus, saved with save_pretrained (eos and pad set)."""
    from hf_fasttrain.data.tokenizer import _train_bpe
    from transformers import PreTrainedTokenizerFast

    raw = _train_bpe(make_docs(), 300)
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<|endoftext|>", pad_token="<|pad|>")
    out = tmp_path_factory.mktemp("tok")
    tok.save_pretrained(str(out))
    return out


def other_tokenizer(folder):
    """A second BPE (another vocabulary) as a bare `tokenizers` tokenizer.json: no eos, no pad."""
    from hf_fasttrain.data.tokenizer import _train_bpe

    path = folder / "other.json"
    raw = _train_bpe(make_docs(60, seed=1), 280)
    raw.save(str(path))
    return path


# -- resolution: (what the user gives) -> (builder, files per split) ----------------------------------
@pytest.mark.parametrize("spec, builder, splits", [
    ("c.parquet", "parquet", {"train": ["c.parquet"]}),
    ("c.csv", "csv", {"train": ["c.csv"]}),
    ("c.arrow", "arrow", {"train": ["c.arrow"]}),
    ("c.jsonl.gz", "json", {"train": ["c.jsonl.gz"]}),
    ("c.txt", "text", {"train": ["c.txt"]}),
    ("c.jsonl,c.jsonl.gz", "json", {"train": ["c.jsonl", "c.jsonl.gz"]}),
    ("pq", "parquet", {"train": ["part-0.parquet", "part-1.parquet", "part-2.parquet"]}),  # README.md ignored
    ("pq/*.parquet", "parquet", {"train": ["part-0.parquet", "part-1.parquet", "part-2.parquet"]}),
    ("split", "parquet", {"train": ["train-00000.parquet"], "validation": ["validation-00000.parquet"]}),
])
def test_files_resolve_to_the_builder_of_their_extension(corpus, monkeypatch, spec, builder, splits):
    monkeypatch.chdir(corpus)
    source = resolve_source(spec)
    assert source.builder == builder and source.kind == "files"
    got = {k: [os.path.basename(f) for f in v] for k, v in source.kwargs["data_files"].items()}
    assert got == splits
    assert all(os.path.isabs(f) for f in source.files)


def test_special_sources_resolve(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    assert resolve_source("saved_ds") == (LOAD_FROM_DISK, {"dataset_path": str(corpus / "saved_ds")})
    assert resolve_source("saved_dd").kind == "disk"
    (corpus / "t.tsv").write_text("text\nhello\n")
    assert resolve_source("t.tsv").kwargs["sep"] == "\t" and resolve_source("c.txt").kwargs["sample_by"] == "paragraph"
    # a name that is no local path is the Hub's, with its options passed through; data_files passes through too
    hub = resolve_source("owner/corpus", dataset_config="en", dataset_split="train", dataset_revision="v1")
    assert hub == ("owner/corpus", {"name": "en", "revision": "v1", "split": "train"}) and hub.kind == "hub"
    assert resolve_source("owner/corpus", data_files="data/*.parquet,x.parquet", data_dir="d") == \
        ("owner/corpus", {"data_dir": "d", "data_files": ["data/*.parquet", "x.parquet"]})
    builder, kwargs = resolve_source("c.parquet")  # unpacks as the pair streaming code passes to load_dataset
    assert builder == "parquet" and "data_files" in kwargs


@pytest.mark.parametrize("spec, message", [
    ("missing.parquet", "dataset: file 'missing.parquet' does not exist"),
    ("./missing", "dataset: file './missing' does not exist"),
    ("nope/*.parquet", "dataset: 'nope/*.parquet' matches no file"),
    ("c.parquet,c.csv", "dataset: files of 2 formats (.csv, .parquet)"),
    ("c.csv,t.tsv", "dataset: files of 2 formats (.csv, .tsv)"),
    ("empty_dir", "folder"),
    ("c.parquet.gz", "only the text formats can be compressed"),
])
def test_resolution_refusals_are_one_line(corpus, monkeypatch, spec, message):
    monkeypatch.chdir(corpus)
    (corpus / "t.tsv").write_text("text\nhello\n")
    (corpus / "empty_dir").mkdir(exist_ok=True)
    (corpus / "c.parquet.gz").write_bytes(b"x")
    with pytest.raises(DataError) as e:
        resolve_source(spec)
    assert message in str(e.value) and "\n" not in str(e.value)


# -- loading: the same rows from every format -----------------------------------------------------------
@pytest.mark.parametrize("spec", ["c.parquet", "pq", "c.csv", "c.arrow", "saved_ds", "c.jsonl.gz", "pq/*.parquet",
                                  "c.txt"])
def test_every_format_gives_the_same_documents(corpus, monkeypatch, spec):
    monkeypatch.chdir(corpus)
    dd = load_source(spec)
    texts = [t.rstrip("\n") for t in dd["train"]["text"] if t and t.strip()]  # a .txt's last paragraph keeps its \n
    assert list(dd) == ["train"] and texts == make_docs()


def test_zstd_compressed_jsonl(corpus, monkeypatch):
    zstandard = pytest.importorskip("zstandard")
    monkeypatch.chdir(corpus)
    (corpus / "c.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress((corpus / "c.jsonl").read_bytes()))
    assert [t for t in load_source("c.jsonl.zst")["train"]["text"] if t.strip()] == make_docs()


def test_rows_are_identical_across_formats_and_splits_are_kept(corpus, tok_dir, monkeypatch):
    """prepare_lm_data: the same train rows from parquet, a parquet folder, csv, arrow, jsonl.gz, a glob and a
    save_to_disk Dataset; empty documents dropped and counted; a source's own validation split kept."""
    monkeypatch.chdir(corpus)
    rows = {}
    for spec in ("c.parquet", "pq", "c.csv", "c.arrow", "saved_ds", "c.jsonl.gz", "pq/*.parquet"):
        p = prepare_lm_data(DataArguments(dataset=spec, tokenizer=str(tok_dir), block_size=32))
        dropped = 3 if spec == "c.csv" else N_EMPTY  # pandas skips the blank lines of a csv itself
        assert (p.documents, p.empty_dropped) == (N_DOCS, dropped), spec
        assert f"data {spec}: 120 documents ({dropped} empty dropped) -> " in p.summary()
        rows[spec] = p.lm["train"]["input_ids"]
    first = rows["c.parquet"]
    assert len(first) > 20 and all(len(r) == 32 for r in first)
    assert all(r == first for r in rows.values())
    # a DatasetDict on disk and a folder named by split: their validation split is used, not a cut of train
    tok = prepare_lm_data(DataArguments(dataset="c.parquet", tokenizer=str(tok_dir), block_size=32)).tokenizer
    eos = tok.eos_token_id
    val_docs = make_docs()[100:]
    flat = [t for d in val_docs for t in tok(d, add_special_tokens=False)["input_ids"] + [eos]]
    for spec in ("saved_dd", "split"):
        p = prepare_lm_data(DataArguments(dataset=spec, tokenizer=str(tok_dir), block_size=32))
        got = [t for r in p.lm["validation"]["input_ids"] for t in r]
        assert got == flat[: len(got)] and len(flat) - len(got) < 32 and (p.documents, p.empty_dropped) == (120, 0)


def test_validation_cut_is_deterministic(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    from hf_fasttrain.data.prepare import load_documents

    a, kind, dropped = load_documents(DataArguments(dataset="c.parquet", validation_fraction=0.1))
    b, _, _ = load_documents(DataArguments(dataset="c.jsonl.gz", validation_fraction=0.1))
    assert (kind, dropped) == ("text", N_EMPTY)
    assert a["validation"]["text"] == b["validation"]["text"] and len(a["validation"]) == 12  # 0.1 x 120, rounded up
    assert not set(a["validation"]["text"]) & set(a["train"]["text"])
    assert sorted(list(a["train"]["text"]) + list(a["validation"]["text"])) == sorted(make_docs())


# -- data mistakes: one line, the file named ---------------------------------------------------------------
def test_data_errors_name_the_file(corpus, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.jsonl").write_bytes(b"")
    (tmp_path / "empty.txt").write_bytes(b"")
    (tmp_path / "latin1.txt").write_bytes("caf\u00e9 au lait\n".encode("utf-8") * 3 + "na\u00efve\n".encode("latin-1"))
    (tmp_path / "latin1.jsonl.gz").write_bytes(gzip.compress(b'{"text": "ok"}\n{"text": "caf\xe9"}\n'))
    (tmp_path / "fake.parquet").write_text("not parquet")
    (tmp_path / "void.jsonl.gz").write_bytes(gzip.compress(b""))
    cases = {
        "empty.jsonl": "dataset: file 'empty.jsonl' is empty",
        "empty.txt": "dataset: file 'empty.txt' is empty",
        "latin1.txt": "dataset: 'latin1.txt' is not UTF-8 text: bytes b'\\xef' at byte offset 44 ",
        "latin1.jsonl.gz": "dataset: 'latin1.jsonl.gz' is not UTF-8 text: bytes b'\\xe9' at byte offset 28 ",
        "fake.parquet": "dataset: 'fake.parquet' is not a readable parquet file: ArrowInvalid",
        "void.jsonl.gz": "dataset: file 'void.jsonl.gz' is empty once decompressed",
    }
    for spec, message in cases.items():
        with pytest.raises(DataError) as e:
            load_source(spec)
        assert str(e.value).startswith(message) and "\n" not in str(e.value), (spec, str(e.value))
    assert first_non_utf8(str(tmp_path / "latin1.txt")) == (44, b"\xef")
    os.chmod(tmp_path / "empty.jsonl", 0o000)
    if not os.access(tmp_path / "empty.jsonl", os.R_OK):  # root reads anything
        with pytest.raises(DataError, match="cannot be read"):
            load_source("empty.jsonl")


def test_column_and_row_errors(corpus, tok_dir, tmp_path, monkeypatch):
    from datasets import Dataset

    monkeypatch.chdir(tmp_path)
    Dataset.from_dict({"body": ["a b c"] * 4, "id": [1, 2, 3, 4]}).to_parquet("cols.parquet")
    Dataset.from_dict({"text": ["", "  ", "\n"] * 3}).to_parquet("blank.parquet")
    Dataset.from_dict({"text": [1, 2, 3]}).to_parquet("ints.parquet")
    with pytest.raises(DataError) as e:
        prepare_lm_data(DataArguments(dataset="cols.parquet", block_size=8))
    assert str(e.value) == ("text_column: 'text' is not a column of 'cols.parquet'; its columns are ['body', 'id']; "
                            "name the text column with --text_column, or give pre-tokenized rows in an input_ids column")
    with pytest.raises(DataError, match=r"^dataset: no documents left in 'blank.parquet' after dropping 9 empty ones"):
        prepare_lm_data(DataArguments(dataset="blank.parquet", block_size=8))
    with pytest.raises(DataError, match=r"^text_column: column 'text' of 'ints.parquet' holds int64, not text"):
        prepare_lm_data(DataArguments(dataset="ints.parquet", block_size=8))
    p = prepare_lm_data(DataArguments(dataset="cols.parquet", text_column="body", tokenizer=str(tok_dir), block_size=2))
    assert p.documents == 4 and len(p.lm["train"]) > 0


# -- pre-tokenized rows ------------------------------------------------------------------------------------
def test_tokenize_once_then_train_rows_with_the_manifest_checked(corpus, tok_dir, tmp_path, monkeypatch, capsys):
    from hf_fasttrain.cli import main

    monkeypatch.chdir(corpus)
    out = tmp_path / "tok32"
    assert main(["tokenize", "--dataset", "c.parquet", "--tokenizer", str(tok_dir), "--block_size", "32",
                 "--out", str(out), "--shard_tokens", "256"]) == 0
    assert f"wrote {out}: " in capsys.readouterr().out
    import json

    manifest = json.loads((out / "manifest.json").read_text())
    straight = prepare_lm_data(DataArguments(dataset="c.parquet", tokenizer=str(tok_dir), block_size=32))
    assert manifest["block_size"] == 32 and manifest["rows"]["train"] == len(straight.lm["train"])
    assert manifest["tokens"]["train"] == 32 * len(straight.lm["train"])
    assert len(manifest["shards"]["train"]) == -(-len(straight.lm["train"]) // 8)  # 256 tokens = 8 rows a shard
    assert manifest["source"]["documents"] == N_DOCS and manifest["source"]["empty_dropped"] == N_EMPTY
    # trained on as it is, with its own tokenizer; the same rows as tokenizing on the fly
    pre = prepare_lm_data(DataArguments(dataset=str(out), block_size=32))
    assert pre.pretokenized and pre.lm["train"]["input_ids"] == straight.lm["train"]["input_ids"]
    assert pre.lm["validation"]["input_ids"] == straight.lm["validation"]["input_ids"]
    assert pre.summary().endswith(f"pre-tokenized, {len(pre.lm['train']):,} train rows, "
                                  f"{len(pre.lm['validation']):,} validation rows")
    same_tok = prepare_lm_data(DataArguments(dataset=str(out), tokenizer=str(tok_dir), block_size=32))
    assert same_tok.lm["train"]["input_ids"] == pre.lm["train"]["input_ids"]
    with pytest.raises(DataError, match=r"^block_size: block_size=64 but .* holds rows of 32 tokens .*use --block_size 32"):
        prepare_lm_data(DataArguments(dataset=str(out), block_size=64))
    with pytest.raises(DataError, match=r"^tokenizer: .*not the tokenizer .* was made with"):
        prepare_lm_data(DataArguments(dataset=str(out), block_size=32, tokenizer=str(other_tokenizer(tmp_path))))
    # the command refuses an existing folder, in one line, before any work
    capsys.readouterr()
    assert main(["tokenize", "--dataset", "c.parquet", "--block_size", "32", "--out", str(out)]) == 2
    assert capsys.readouterr().err.startswith("error: out: ")  # nothing loaded before the refusal


def test_an_input_ids_dataset_is_taken_as_it_is(tok_dir, tmp_path, monkeypatch):
    from datasets import Dataset

    monkeypatch.chdir(tmp_path)
    rows = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15]] * 10
    Dataset.from_dict({"input_ids": rows}).to_json("ids.jsonl")
    with pytest.raises(DataError, match=r"^tokenizer: .*holds input_ids .*--tokenizer"):
        prepare_lm_data(DataArguments(dataset="ids.jsonl", block_size=4))
    p = prepare_lm_data(DataArguments(dataset="ids.jsonl", tokenizer=str(tok_dir), block_size=4))
    assert p.pretokenized and sorted(map(tuple, list(p.lm["train"]["input_ids"]) + list(p.lm["validation"]["input_ids"]))) == \
        sorted(map(tuple, rows))
    with pytest.raises(DataError, match=r"^block_size: .*rows of up to 4 tokens, longer than block_size=3"):
        prepare_lm_data(DataArguments(dataset="ids.jsonl", tokenizer=str(tok_dir), block_size=3))
    Dataset.from_dict({"input_ids": [[1, 2], [99999, 3]]}).to_json("big.jsonl")
    with pytest.raises(DataError, match=r"^tokenizer: .*token id 99999, outside this tokenizer's"):
        prepare_lm_data(DataArguments(dataset="big.jsonl", tokenizer=str(tok_dir), block_size=4))


def test_dataset_split_picks_one_split(corpus, monkeypatch):
    monkeypatch.chdir(corpus)
    for spec in ("split", "saved_dd"):
        dd = load_source(spec, dataset_split="validation")
        assert list(dd) == ["train"] and dd["train"]["text"][:] == make_docs()[100:]
        with pytest.raises(DataError, match=r"^dataset_split: 'dev' is not a split of .*; one of \['train', 'validation'\]"):
            load_source(spec, dataset_split="dev")


def test_the_same_resolution_streams(corpus, monkeypatch):
    """load_source(..., streaming=True): an IterableDatasetDict over the same documents (files and save_to_disk)."""
    from datasets import IterableDataset

    monkeypatch.chdir(corpus)
    for spec in ("pq", "c.jsonl.gz", "saved_ds"):
        stream = load_source(spec, streaming=True)["train"]
        assert isinstance(stream, IterableDataset), spec
        assert [r["text"] for r in stream if r["text"].strip()] == make_docs(), spec
