"""Input tokens/s one data worker delivers, per path, against what one GPU consumes; peak RSS of a stream.

    python -m benchmarks.data_pipeline                 # full run (a few minutes on a 2-core CPU)
    python -m benchmarks.data_pipeline --tiny          # smoke run (seconds; the test suite runs it)

Data: documents of the embedded corpus (the running Python's standard-library sources), written as
`.jsonl` shards, the user's files; the tokenizer is the embedded byte-level BPE (vocabulary 4096, cached).
Three paths, measured side by side in one process, each delivering the same batches (`--batch-size` rows of
`--block-size` tokens, `DataCollatorForLanguageModeling`) through a `torch.utils.data.DataLoader` with
`num_workers=0`. The rate per worker is tokens per CPU-second of that one process (what a worker with a
core of its own delivers; the wall-clock rate on a shared machine is recorded beside it):

- (a) ``pretokenized``: the folder `hf-fasttrain tokenize` writes (parquet shards + manifest), read as training
  does (`--dataset DIR`: rows loaded, no tokenizer work). The one-off tokenization is timed apart
  (``tokenize_once``, one process, `datasets.map`).
- (b) ``streaming``: the `.jsonl` shards read by `datasets.load_dataset(..., streaming=True)`, tokenized and packed
  into rows on the fly (`IterableDataset.map`, the concatenate-and-cut of the map-style path).
- (c) ``map_style``: the recipe's embedded path: rows made up front by `tokenize_and_chunk` (timed:
  ``map_style_prepare``), then served from the memory-mapped Arrow table.

Each rate is set against what one H200 consumes on GPT-2 small (about 350k tokens/s measured with
torch.compile, about 900k at the hardware limit): workers needed = ceil(consumption / rate).

Memory: the streaming path (b) is run to the end in a fresh process over the corpus and over a corpus
`--factor` times larger (written as `--factor` times as many shards of the same size, as large corpora are
sharded); its peak RSS must stay flat (within 20%): a stream holds a shard's block and a map batch, never
the corpus.

Writes benchmarks/results/data_pipeline.json, .md (table) and .png. The machine is shared: figures are
from one run, paths interleaved in one process; rates on a quiet machine are higher.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.data_pipeline [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from benchmarks._harness import RESULTS, machine_info, markdown_table, module_command, subprocess_env, write_json  # noqa: E402

GPU_MEASURED = 350_000  # tokens/s one H200 consumes on GPT-2 small, compiled (HF_TRAINER_5X.md: 349k-355k)
GPU_LIMIT = 900_000  # the same at the hardware limit
RSS_TOLERANCE = 1.2
STREAM_BATCH = 32  # documents per map batch of the stream


def write_corpus(folder: Path, docs: list[str], copies: int, shards: int) -> list[str]:
    """``docs`` repeated ``copies`` times, as ``shards`` .jsonl files; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = [folder / f"part-{i:03d}.jsonl" for i in range(shards)]
    handles = [open(p, "w", encoding="utf-8") for p in paths]
    try:
        n = 0
        for c in range(copies):
            for d in docs:
                handles[n % shards].write(json.dumps({"text": d}) + "\n")
                n += 1
    finally:
        for h in handles:
            h.close()
    return [str(p) for p in paths]


def stream_rows(files: list[str], tokenizer, block_size: int):
    """(b): the files streamed, tokenized (EOS appended) and packed into rows of ``block_size`` on the fly."""
    import datasets

    from hf_fasttrain.data.corpus import _group_fn, _tokenize_fn

    stream = datasets.load_dataset("json", data_files={"train": files}, streaming=True)["train"]
    # a map batch of STREAM_BATCH documents bounds what the stream holds (datasets' default, 1000 documents,
    # would hold the whole small corpus at once and hide any growth)
    tokenized = stream.map(_tokenize_fn(tokenizer, add_eos=True), batched=True, batch_size=STREAM_BATCH,
                           remove_columns=["text"])
    return tokenized.map(_group_fn(block_size), batched=True, batch_size=STREAM_BATCH)


def time_loader(dataset, collator, batch_size: int, max_batches: int) -> dict:
    """Tokens/s of a one-process DataLoader over ``dataset`` (map-style or iterable), up to ``max_batches``."""
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, collate_fn=collator, num_workers=0,
                                         shuffle=not isinstance(dataset, torch.utils.data.IterableDataset))
    tokens, batches, start, cpu = 0, 0, time.perf_counter(), time.process_time()
    for batch in loader:
        tokens += batch["input_ids"].numel()
        batches += 1
        if batches >= max_batches:
            break
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    # per worker = per CPU-second of this one process: what a worker with a core of its own delivers (the
    # wall-clock rate on a shared machine depends on what else runs)
    return {"tokens": tokens, "batches": batches, "seconds": seconds, "cpu_seconds": cpu_seconds,
            "wall_tokens_per_s": tokens / seconds, "tokens_per_s": tokens / cpu_seconds}


def _worker_stream(args) -> None:
    """A fresh process that streams ``args.files`` to the end; prints its peak RSS and tokens."""
    from hf_fasttrain.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.tokenizer_dir)
    rows = stream_rows(args.files.split(","), tokenizer, args.block_size)
    tokens = 0
    for row in rows:
        tokens += len(row["input_ids"])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"tokens": tokens, "peak_rss_mib": peak_kib / 1024}))


def measure_rss(files: list[str], tokenizer_dir: str, block_size: int) -> dict:
    cmd = module_command("data_pipeline", "--worker", "stream", "--files", ",".join(files), "--tokenizer-dir",
                         tokenizer_dir, "--block-size", str(block_size))
    proc = subprocess.run(cmd, env=subprocess_env(), capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


TINY = {"max_files": 40, "vocab_size": 300, "block_size": 64, "batch_size": 4, "max_batches": 4, "repeats": 1,
        "shards": 2, "factor": 3}


def main(args) -> dict:
    """Measure, write the results (unless ``args.out`` is empty) and return them."""
    import datasets
    from transformers import DataCollatorForLanguageModeling

    from hf_fasttrain.config.args import DataArguments
    from hf_fasttrain.data.corpus import build_stdlib_corpus, tokenize_and_chunk
    from hf_fasttrain.data.tokenizer import get_tokenizer
    from hf_fasttrain.data.prepare import prepare_lm_data, pretokenize

    if args.tiny:
        for k, v in TINY.items():
            setattr(args, k, v)
    work = Path(tempfile.mkdtemp(prefix="data_pipeline_"))
    os.environ["HF_DATASETS_CACHE"] = str(work / "hf_cache")  # every map is computed, none read from a cache
    datasets.config.HF_DATASETS_CACHE = Path(os.environ["HF_DATASETS_CACHE"])
    corpus = build_stdlib_corpus(max_files=args.max_files)
    docs = [t for split in ("train", "validation") for t in corpus[split]["text"] if t.strip()]
    tokenizer = get_tokenizer(vocab_size=args.vocab_size, corpus=build_stdlib_corpus() if not args.tiny else corpus)
    tok_dir = str(work / "tokenizer")
    tokenizer.save_pretrained(tok_dir)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm=False)
    files = write_corpus(work / "corpus", docs, 1, args.shards)
    big = write_corpus(work / "corpus_x", docs, args.factor, args.shards * args.factor)  # shards of the same size
    text_mb = sum(os.path.getsize(f) for f in files) / 1e6
    block, batch = args.block_size, args.batch_size
    data_args = DataArguments(dataset=",".join(files), tokenizer=tok_dir, block_size=block, validation_fraction=0.01)

    # (c) map-style: rows made up front (timed), then served from Arrow
    raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": docs})})
    t0 = time.process_time()
    lm = tokenize_and_chunk(raw, tokenizer, block)
    prep_s = time.process_time() - t0
    corpus_tokens = len(lm["train"]) * block
    max_batches = max(2, min(args.max_batches, len(lm["train"]) // batch))
    # (a) pre-tokenized: hf-fasttrain tokenize (timed once), then the folder as --dataset
    t0 = time.process_time()
    pretokenize(data_args, str(work / "rows"))  # one process (num_proc unset), so its CPU time is the work
    tokenize_s = time.process_time() - t0
    rows = prepare_lm_data(DataArguments(dataset=str(work / "rows"), block_size=block)).lm["train"]

    results = {}
    for _ in range(args.repeats):  # the paths interleaved, best of the repeats (the machine is shared)
        for name, ds in (("pretokenized", rows), ("streaming", None), ("map_style", lm["train"])):
            if ds is None:
                ds = stream_rows(files, tokenizer, block).with_format("torch")
            r = time_loader(ds, collator, batch, max_batches)
            if name not in results or r["tokens_per_s"] > results[name]["tokens_per_s"]:
                results[name] = r
    once = {"tokenize_once": corpus_tokens / tokenize_s, "map_style_prepare": corpus_tokens / prep_s}

    rss_1 = measure_rss(files, tok_dir, block)
    rss_x = measure_rss(big, tok_dir, block)
    ratio = rss_x["peak_rss_mib"] / rss_1["peak_rss_mib"]
    table = []
    for name, what in (("pretokenized", "(a) parquet shards from hf-fasttrain tokenize, as --dataset DIR"),
                       ("streaming", "(b) .jsonl streamed, tokenized and packed on the fly"),
                       ("map_style", "(c) rows made up front by tokenize_and_chunk, served from Arrow")):
        rate = results[name]["tokens_per_s"]
        table.append({"path": name, "what": what, "tokens_per_s": rate,
                      "wall_tokens_per_s": results[name]["wall_tokens_per_s"],
                      "workers_for_350k": math.ceil(GPU_MEASURED / rate), "workers_for_900k": math.ceil(GPU_LIMIT / rate)})
    for name, what in (("tokenize_once", "one-off: hf-fasttrain tokenize, one process (a)"),
                       ("map_style_prepare", "one-off: tokenize_and_chunk, one process (c)")):
        rate = once[name]
        table.append({"path": name, "what": what, "tokens_per_s": rate, "wall_tokens_per_s": None,
                      "workers_for_350k": math.ceil(GPU_MEASURED / rate), "workers_for_900k": math.ceil(GPU_LIMIT / rate)})
    out = {
        "setting": {"docs": len(docs), "text_mb": round(text_mb, 2), "corpus_tokens": corpus_tokens, "block_size": block,
                    "batch_size": batch, "batches_timed": max_batches, "repeats": args.repeats, "factor": args.factor,
                    "vocab_size": len(tokenizer), "tiny": args.tiny},
        "gpu_tokens_per_s": {"h200_gpt2_small_compiled": GPU_MEASURED, "h200_hardware_limit": GPU_LIMIT},
        "rates": table,
        "streaming_rss": {"corpus_tokens": rss_1["tokens"], "corpus_peak_rss_mib": rss_1["peak_rss_mib"],
                          "larger_tokens": rss_x["tokens"], "larger_peak_rss_mib": rss_x["peak_rss_mib"],
                          "ratio": ratio, "flat": ratio <= RSS_TOLERANCE},
        "machine": machine_info(),
        "note": "measured on a shared, loaded 2-core x86_64 CPU; paths interleaved in one process, best of the repeats",
    }
    if args.out:
        stem = Path(args.out) / args.name
        write_json(f"{stem}.json", out)
        Path(f"{stem}.md").write_text(render_md(out), encoding="utf-8")
        plot(out, f"{stem}.png")
    print(render_md(out))
    return out


def render_md(out: dict) -> str:
    s, rss = out["setting"], out["streaming_rss"]
    rows = [[r["path"], r["what"], f"{r['tokens_per_s']:,.0f}",
             f"{r['wall_tokens_per_s']:,.0f}" if r.get("wall_tokens_per_s") else "",
             r["workers_for_350k"], r["workers_for_900k"]] for r in out["rates"]]
    head = (f"Input tokens per CPU-second of one data worker (one process, DataLoader num_workers=0), "
            f"{s['docs']:,} documents ({s['text_mb']} MB of text, {s['corpus_tokens']:,} tokens), rows of "
            f"{s['block_size']}, batches of {s['batch_size']}; best of {s['repeats']} interleaved repeats. Measured on a "
            "shared, heavily loaded 2-core x86_64 CPU: the wall-clock column is what this process got there.\n\n")
    table = markdown_table(["path", "what", "tokens/s per worker (CPU)", "tokens/s wall (loaded)",
                            "workers for 350k tok/s (H200, GPT-2 small, compiled)",
                            "workers for 900k tok/s (H200 limit)"], rows)
    mem = (f"\n\nStreaming (b) to the end in a fresh process: peak RSS {rss['corpus_peak_rss_mib']:.0f} MiB over "
           f"{rss['corpus_tokens']:,} tokens, {rss['larger_peak_rss_mib']:.0f} MiB over {rss['larger_tokens']:,} "
           f"tokens ({s['factor']}x): ratio {rss['ratio']:.2f} ({'flat, within 20%' if rss['flat'] else 'NOT flat'}).\n")
    return head + table + mem


def plot(out: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = out["rates"]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh([r["path"] for r in rates], [r["tokens_per_s"] for r in rates], color="tab:blue")
    for x, label in ((GPU_MEASURED, "H200, GPT-2 small, compiled (350k)"), (GPU_LIMIT, "H200 limit (900k)")):
        ax.axvline(x, color="tab:red", ls="--" if x == GPU_MEASURED else ":", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("input tokens per CPU-second of one worker (log)")
    ax.set_title("Data pipeline: tokens/s one worker delivers (loaded 2-core CPU)")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tiny", action="store_true", help="a smoke run: small corpus, short rows, few batches")
    p.add_argument("--max-files", type=int, default=200, help="stdlib files in the corpus")
    p.add_argument("--vocab-size", type=int, default=4096)
    p.add_argument("--block-size", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--max-batches", type=int, default=60, help="batches timed per path per repeat")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--shards", type=int, default=8, help=".jsonl files the corpus is written as")
    p.add_argument("--factor", type=int, default=10, help="the larger streamed corpus is this many times the corpus")
    p.add_argument("--out", default=str(RESULTS), help="directory for JSON/table/PNG ('' = do not write)")
    p.add_argument("--name", default="data_pipeline")
    p.add_argument("--worker", choices=["stream"], help=argparse.SUPPRESS)
    p.add_argument("--files", help=argparse.SUPPRESS)
    p.add_argument("--tokenizer-dir", help=argparse.SUPPRESS)
    return p


if __name__ == "__main__":
    a = make_parser().parse_args()
    if a.worker == "stream":
        _worker_stream(a)
    else:
        main(a)
