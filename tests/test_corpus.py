import hashlib

import pytest

from hf_fasttrain.data import tokenizer as tokenizers_module
from hf_fasttrain.data.corpus import build_stdlib_corpus, is_validation_path, list_stdlib_sources, tokenize_and_chunk
from hf_fasttrain.data.tokenizer import EOS_TOKEN, get_tokenizer


def test_sources_exclude_tests_and_site_packages():
    rels = list_stdlib_sources()
    assert len(rels) > 100
    assert all(r.endswith(".py") for r in rels)
    for r in rels:
        parts = r.split("/")[:-1]
        assert not {"test", "tests", "idle_test", "site-packages"} & set(parts), r
    assert "os.py" in rels and "json/decoder.py" in rels


def test_split_is_identical_across_builds_and_disjoint(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_FASTTRAIN_CACHE", str(tmp_path / "a"))
    a = build_stdlib_corpus(max_files=60)
    monkeypatch.setenv("HF_FASTTRAIN_CACHE", str(tmp_path / "b"))  # a second, independent build
    b = build_stdlib_corpus(max_files=60)
    assert a["train"]["path"] == b["train"]["path"]
    assert a["validation"]["path"] == b["validation"]["path"]
    train, val = set(a["train"]["path"]), set(a["validation"]["path"])
    assert not train & val
    assert len(train) + len(val) == 60 and len(val) >= 1
    # the rule is the path hash, nothing random
    assert all(is_validation_path(p, 0.05) for p in val)
    assert not any(is_validation_path(p, 0.05) for p in train)
    h = int(hashlib.sha1(b"os.py").hexdigest()[:12], 16) / 16**12
    assert is_validation_path("os.py", 0.05) == (h < 0.05)


def test_documents_are_whole_files(tiny_raw):
    from hf_fasttrain.data.corpus import stdlib_root

    path, text = tiny_raw["train"][0]["path"], tiny_raw["train"][0]["text"]
    assert text == (stdlib_root() / path).read_text(encoding="utf-8", errors="replace")


def test_tokenizer_cached_and_rebuilt_on_vocab_change(tiny_raw, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_FASTTRAIN_CACHE", str(tmp_path))
    calls = []
    real = tokenizers_module._train_bpe

    def counting(texts, vocab_size):
        calls.append(vocab_size)
        return real(texts, vocab_size)

    monkeypatch.setattr(tokenizers_module, "_train_bpe", counting)
    t1 = get_tokenizer(vocab_size=300, corpus=tiny_raw)
    t2 = get_tokenizer(vocab_size=300, corpus=tiny_raw)
    assert calls == [300]  # second call read the cache
    assert t1.get_vocab() == t2.get_vocab()
    assert len(t1) == 300
    t3 = get_tokenizer(vocab_size=320, corpus=tiny_raw)
    assert calls == [300, 320] and len(t3) == 320
    assert t1.eos_token == EOS_TOKEN and t1.pad_token_id is not None and t1.pad_token_id != t1.eos_token_id
    text = "def f(x):\n    return x + 1\n"
    assert t1.decode(t1(text)["input_ids"]) == text  # byte-level: lossless


def test_tokenizer_rejects_small_vocab(tiny_raw):
    with pytest.raises(ValueError, match="vocab_size"):
        get_tokenizer(vocab_size=100, corpus=tiny_raw)


def test_chunks_are_the_concatenated_documents(tiny_raw, tiny_tokenizer):
    lm = tokenize_and_chunk(tiny_raw, tiny_tokenizer, block_size=16)
    rows = lm["train"]["input_ids"]
    assert all(len(r) == 16 for r in rows)
    eos = tiny_tokenizer.eos_token_id
    docs = [tiny_tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in tiny_raw["train"]["text"]]
    flat = [t for d in docs for t in d]
    got = [t for r in rows for t in r]
    # chunking works per map batch (1000 docs): with fewer docs, it is one cut of the whole stream
    assert got == flat[: len(got)] and len(flat) - len(got) < 16
