"""Padding and real tokens/s of batching strategies on variable-length code examples.

    python -m benchmarks.padding                      # full run (a few minutes on a 2-core CPU)
    python -m benchmarks.padding --steps 4 --repeats 1 --max-examples 800   # smoke run

Data: top-level functions and classes (`ast`) of the embedded corpus's files (the running Python's
standard library), tokenized with the embedded corpus's cached byte-level BPE (hf_fasttrain.data.corpus,
the tokenizer every recipe uses), truncated to `--max-len` tokens.
Arms, measured side by side in one run, on the same model, data and machine:

- ``random``: `transformers.Trainer` default sampling (`train_sampling_strategy="random"`), batch B.
- ``hf_group_by_length``: `Trainer` with `train_sampling_strategy="group_by_length"`, batch B.
- ``grouped``: our `LengthGroupedBatchSampler`, batch B.
- ``token_budget``: our `TokenBudgetBatchSampler`, ``max_tokens = B * mean length`` (so a step holds
  as many real tokens on average as a random batch).
- ``packed_rows``: `PackedBatchSampler` + `PackedRowsCollator`: R rows of `--max-len` tokens, R chosen
  for the same mean real tokens per step.
- ``packed_flat``: `PackedBatchSampler(rows_per_batch=1)` + `DataCollatorWithFlattening`: one
  padding-free row of up to ``B * mean length`` tokens (attention is one long masked row on CPU).

Padding fraction = 1 - real / computed tokens over a whole epoch's plan. Throughput: a tiny GPT-2
training step (forward, backward, AdamW) on `--steps` batches at evenly spaced quantiles of each
arm's batch sizes (a stratified sample of its epoch); real (non-pad) tokens per second of wall-clock
and per CPU-second of this single-threaded process (steady on a shared machine), per repeat, median
over `--repeats`, arms interleaved step by step. Writes benchmarks/results/padding.json, padding.md
(table) and padding.png.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.padding [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import ast
import json
import os
import pathlib
import platform
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import DataCollatorWithFlattening, GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments  # noqa: E402

from hf_fasttrain.data.corpus import build_stdlib_corpus, list_stdlib_sources, stdlib_root  # noqa: E402
from hf_fasttrain.data.tokenizer import get_tokenizer  # noqa: E402
from hf_fasttrain.data.packing import PackedBatchSampler, PackedRowsCollator  # noqa: E402
from hf_fasttrain.data.samplers import LengthGroupedBatchSampler, TokenBudgetBatchSampler, get_lengths  # noqa: E402

from benchmarks._harness import RESULTS, display_command, display_path  # noqa: E402
PAD_ID = 0  # set from the tokenizer in main()


# ---- data ---------------------------------------------------------------------------------------


def stdlib_examples(max_examples: int, seed: int = 0) -> list[str]:
    """Source of each top-level function and class of the embedded corpus's stdlib files."""
    root = stdlib_root()
    out: list[str] = []
    for rel in list_stdlib_sources(root):
        try:
            source = (root / rel).read_text(encoding="utf-8")
            tree = ast.parse(source)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = source.splitlines(keepends=True)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                start = min([node.lineno] + [d.lineno for d in node.decorator_list]) - 1
                out.append("".join(lines[start : node.end_lineno]))
    rng = np.random.default_rng(seed)
    if len(out) > max_examples:
        out = [out[i] for i in sorted(rng.choice(len(out), max_examples, replace=False))]
    return out


def build_dataset(args):
    """(dataset of variable-length input_ids, pad id, vocabulary size), tokenized by the embedded corpus's cached BPE."""
    texts = stdlib_examples(args.max_examples, seed=args.seed)
    tokenizer = get_tokenizer(vocab_size=args.vocab_size, corpus=build_stdlib_corpus())
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    ids = [x[: args.max_len] for x in ids if len(x) >= 2]
    return datasets.Dataset.from_dict({"input_ids": ids}), tokenizer.pad_token_id, len(tokenizer)


def pad_collate(features):
    """Right-pad to the longest example; labels -100 on padding."""
    width = max(len(f["input_ids"]) for f in features)
    input_ids = torch.full((len(features), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(features), width), dtype=torch.long)
    for r, f in enumerate(features):
        n = len(f["input_ids"])
        input_ids[r, :n] = torch.tensor(f["input_ids"])
        mask[r, :n] = 1
    labels = input_ids.masked_fill(mask == 0, -100)
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


# ---- arms ---------------------------------------------------------------------------------------


def trainer_batches(ds, strategy: str, batch_size: int, seed: int) -> list[list[int]]:
    """Index batches of one epoch from the Trainer's own train dataloader."""
    args = TrainingArguments(
        output_dir="/tmp/padding_bench",
        per_device_train_batch_size=batch_size,
        train_sampling_strategy=strategy,
        length_column_name="length",
        remove_unused_columns=False,  # else the length column is dropped and lengths are recomputed
        seed=seed,
        report_to=[],
        use_cpu=True,
    )
    model = GPT2LMHeadModel(GPT2Config(vocab_size=8, n_positions=8, n_embd=8, n_layer=1, n_head=1))
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=pad_collate)
    loader = trainer.get_train_dataloader()
    return [list(b) for b in loader.batch_sampler]


def make_arms(ds, lengths, args):
    mean_len = float(lengths.mean())
    budget = max(int(args.batch_size * mean_len), int(lengths.max()))
    rows = max(1, round(args.batch_size * mean_len / args.max_len))
    by_length = ds.add_column("length", lengths.tolist())
    return {
        "random": (trainer_batches(by_length, "random", args.batch_size, args.seed), pad_collate, "padded"),
        "hf_group_by_length": (
            trainer_batches(by_length, "group_by_length", args.batch_size, args.seed),
            pad_collate,
            "padded",
        ),
        "grouped": (list(LengthGroupedBatchSampler(lengths, args.batch_size, seed=args.seed)), pad_collate, "padded"),
        "token_budget": (list(TokenBudgetBatchSampler(lengths, budget, seed=args.seed)), pad_collate, "padded"),
        "packed_rows": (
            list(PackedBatchSampler(lengths, args.max_len, rows_per_batch=rows, seed=args.seed)),
            PackedRowsCollator(row_len=args.max_len, num_rows=rows, pad_token_id=PAD_ID),
            ("rows", rows * args.max_len),
        ),
        "packed_flat": (
            list(PackedBatchSampler(lengths, budget, rows_per_batch=1, seed=args.seed)),
            DataCollatorWithFlattening(),
            "flat",
        ),
    }, {"max_tokens": budget, "rows_per_batch": rows, "mean_len": mean_len}


def computed_tokens(batch: list[int], lengths: np.ndarray, kind) -> int:
    if kind == "padded":
        return len(batch) * int(lengths[batch].max())
    if kind == "flat":
        return int(lengths[batch].sum())
    return kind[1]


# ---- timing -------------------------------------------------------------------------------------


def train_step(model, opt, batch) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of this process) of one forward + backward + AdamW step."""
    w0, c0 = time.perf_counter(), time.process_time()
    loss = model(**batch, use_cache=False).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - w0, time.process_time() - c0


def git_rev() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=RESULTS.parent).strip()
    except Exception:
        return "unknown"


def main(args) -> dict:
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    global PAD_ID
    ds, PAD_ID, vocab = build_dataset(args)
    lengths = get_lengths(ds)
    print(f"{len(ds)} examples, lengths: mean {lengths.mean():.1f}, median {np.median(lengths):.0f}, "
          f"max {lengths.max()}, {100 * (lengths == args.max_len).mean():.1f}% truncated at {args.max_len} "
          f"({time.perf_counter() - t0:.1f}s)")
    arms, settings = make_arms(ds, lengths, args)

    results = {}
    for name, (batches, _, kind) in arms.items():
        covered = sorted(i for b in batches for i in b)
        real = int(sum(lengths[b].sum() for b in batches))
        computed = int(sum(computed_tokens(b, lengths, kind) for b in batches))
        results[name] = {
            "batches_per_epoch": len(batches),
            "covers_epoch": covered == list(range(len(ds))),
            "padding_fraction": 1 - real / computed,
            "real_tokens_per_batch": real / len(batches),
            "computed_tokens_per_batch": computed / len(batches),
            "real_tokens_per_s": [],
            "computed_tokens_per_s": [],
            "real_tokens_per_cpu_s": [],
        }

    config = GPT2Config(
        vocab_size=vocab, n_positions=args.max_len, n_embd=args.n_embd,
        n_layer=2, n_head=2, attn_implementation="sdpa",
    )
    torch.manual_seed(args.seed)
    model = GPT2LMHeadModel(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # Time a stratified sample of each arm's epoch: its batches sorted by computed size, `steps`
    # taken at evenly spaced quantiles (plus `warmup` untimed ones), so the sample has the epoch's mix
    # of small and large batches; fixed-count arms range from a few short rows to B x max_len, and a
    # plain random pick of a few dozen would swing the estimate more than the arms differ.
    picked = {}
    for name, (batches, _, kind) in arms.items():
        by_size = sorted(batches, key=lambda b: (computed_tokens(b, lengths, kind), int(lengths[b].sum())))
        at = [int((k + 0.5) * len(by_size) / args.steps) for k in range(args.steps)]
        rng = np.random.default_rng(args.seed)
        warm = [by_size[int(i)] for i in rng.choice(len(by_size), args.warmup, replace=False)]
        picked[name] = warm + [by_size[i] for i in at]
    prepared = {name: [arms[name][1]([ds[int(i)] for i in b]) for b in picked[name]] for name in arms}
    # Arms are interleaved step by step (one batch of each arm in turn, the order rotating), so a
    # change in the machine's load hits every arm alike. Each step is timed twice: wall-clock, and
    # CPU time of this (single-threaded) process, which other users of a shared machine barely move.
    names = list(arms)
    for rep in range(args.repeats):
        for name in names:
            for b in prepared[name][: args.warmup]:
                train_step(model, opt, b)
        wall = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)
        for k in range(args.steps):
            shift = (k + rep) % len(names)
            for name in names[shift:] + names[:shift]:
                w, c = train_step(model, opt, prepared[name][args.warmup + k])
                wall[name] += w
                cpu[name] += c
        for name in names:
            kind = arms[name][2]
            timed = picked[name][args.warmup :]
            real = sum(int(lengths[b].sum()) for b in timed)
            computed = sum(computed_tokens(b, lengths, kind) for b in timed)
            results[name]["real_tokens_per_s"].append(real / wall[name])
            results[name]["computed_tokens_per_s"].append(computed / wall[name])
            results[name]["real_tokens_per_cpu_s"].append(real / cpu[name])
        print(f"repeat {rep + 1}/{args.repeats} done ({time.perf_counter() - t0:.0f}s)")

    base = statistics.median(results["random"]["real_tokens_per_s"])
    base_cpu = statistics.median(results["random"]["real_tokens_per_cpu_s"])
    for r in results.values():
        r["median_real_tokens_per_s"] = statistics.median(r["real_tokens_per_s"])
        r["speedup_vs_random"] = r["median_real_tokens_per_s"] / base
        r["median_real_tokens_per_cpu_s"] = statistics.median(r["real_tokens_per_cpu_s"])
        r["cpu_speedup_vs_random"] = r["median_real_tokens_per_cpu_s"] / base_cpu

    report = {
        "command": display_command(os.path.basename(sys.executable), sys.argv),
        "args": {k: display_path(v) if isinstance(v, str) else v for k, v in vars(args).items()},
        "settings": settings,
        "dataset": {"examples": len(ds), "mean_len": float(lengths.mean()), "median_len": float(np.median(lengths)),
                    "max_len": int(lengths.max()), "truncated_fraction": float((lengths == args.max_len).mean())},
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                    "torch": torch.__version__, "transformers": transformers.__version__},
        "git": git_rev(),
        "seconds": time.perf_counter() - t0,
        "results": results,
    }
    table = format_table(report)
    print(table)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "padding.json").write_text(json.dumps(report, indent=2))
        (out / "padding.md").write_text(table + "\n")
        plot(report, out / "padding.png")
        print(f"wrote {out}/padding.json, padding.md, padding.png")
    return report


def format_table(report) -> str:
    a = report["args"]
    lines = [
        f"Padding and real tokens/s: {report['dataset']['examples']} stdlib functions/classes, "
        f"max_len {a['max_len']}, batch {a['batch_size']}, max_tokens {report['settings']['max_tokens']}, "
        f"tiny GPT-2 (2 layers, {a['n_embd']} wide), {report['machine']['cpus']}-core CPU, "
        f"{report['machine']['torch_threads']} thread(s); median of {a['repeats']} repeats x {a['steps']} steps",
        "",
        "| arm | batches/epoch | padding | real tokens/batch | real tokens per CPU-s | vs random | "
        "real tokens/s (wall) | vs random |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, r in report["results"].items():
        lines.append(
            f"| {name} | {r['batches_per_epoch']} | {100 * r['padding_fraction']:.1f}% | "
            f"{r['real_tokens_per_batch']:.0f} | {r['median_real_tokens_per_cpu_s']:.0f} | "
            f"{r['cpu_speedup_vs_random']:.2f}x | {r['median_real_tokens_per_s']:.0f} | {r['speedup_vs_random']:.2f}x |"
        )
    lines += [
        "",
        f"Load average during the run: {report['machine'].get('load_average', 'n/a')} (shared machine); CPU-seconds "
        "of the single-threaded benchmark process are the steadier measure, wall-clock is shown beside it.",
    ]
    return "\n".join(lines)


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(report["results"])
    res = report["results"]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(6, 8))  # stacked: legible at a page's width
    ax1.bar(names, [100 * res[n]["padding_fraction"] for n in names], color="tab:red")
    ax1.set_ylabel("padding (% of computed tokens)")
    ax1.set_title("Padding per epoch")
    for n_i, n in enumerate(names):
        pts = res[n]["real_tokens_per_cpu_s"]
        ax2.scatter([n_i] * len(pts), pts, color="black", s=10, zorder=3)
    ax2.bar(names, [res[n]["median_real_tokens_per_cpu_s"] for n in names], color="tab:blue")
    ax2.set_ylabel("real (non-pad) tokens per CPU-second")
    ax2.set_title("Tiny GPT-2 training step, 1 thread (median, dots = repeats)")
    for ax in (ax1, ax2):
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"benchmarks/padding.py, {report['machine']['cpus']}-core CPU")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n")[0])
    p.add_argument("--max-examples", type=int, default=4000)
    p.add_argument("--max-len", type=int, default=512)
    p.add_argument("--vocab-size", type=int, default=4096, help="BPE vocabulary (4096: the time-to-loss setup)")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--n-embd", type=int, default=64)
    p.add_argument("--steps", type=int, default=32, help="timed steps per arm per repeat")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per arm per repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(RESULTS), help="directory for JSON/table/PNG ('' = do not write)")
    return p


if __name__ == "__main__":
    main(make_parser().parse_args())
