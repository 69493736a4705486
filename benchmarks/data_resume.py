#!/usr/bin/env python
"""Time to the first batch of a resumed streaming run: the saved stream position against the Trainer's skip.

    python -m benchmarks.data_resume                       # steps 10, 1,000, 100,000; writes results/data_resume.{json,md,png}
    python -m benchmarks.data_resume --steps 10 1000 --out /tmp/x

The data: parquet shards of generated text (2,000 documents each, as a Hub corpus ships them), streamed
with ``streaming: true``, tokenized and packed into rows of 64 tokens, 2 rows a step. The model is a
stand-in (a 1-layer, 16-wide GPT-2): what is timed is the data, not the model.

For each step S a checkpoint is made at S (one real step trained and saved, its ``global_step`` set to S),
and FastTrainer resumes from it twice, side by side in one process:

- ``position``: the checkpoint holds the stream's position at S (taken once, untimed, by reading the
  stream up to S); FastTrainer restores it and the Trainer skips nothing;
- ``trainer skip``: the same checkpoint without it; the Trainer re-reads the stream and drops the
  S x 2 rows trained before (``accelerate.skip_first_batches``), as it does for any IterableDataset.

Each arm is timed 3 times (median; interleaved) up to step 1,000 and once beyond. The time is from ``train(resume_from_checkpoint=...)`` to the first batch the training loop takes (the
model, optimizer and RNG loads included, in both arms). Both arms must take the same first batch: the
script checks that they do. Measured on a loaded 2-core x86_64 CPU shared with other jobs: absolute
times are slow, the two arms are measured back to back.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.data_resume [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import hashlib
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from benchmarks._harness import RESULTS, machine_info, markdown_table, write_json

BLOCK, ROWS_PER_STEP, DOCS_PER_SHARD = 64, 2, 2000
WORDS = ("the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there one all we their time data model train stream resume step token").split()


def write_corpus(folder: Path, rows_needed: int, seed: int = 0) -> int:
    """Parquet shards holding at least ``rows_needed`` rows of BLOCK tokens (about one token a word); returns
    the number of shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(seed)
    words_needed, words, shard = int(rows_needed * BLOCK * 1.1) + 1000, 0, 0
    while words < words_needed:
        docs = []
        for _ in range(DOCS_PER_SHARD):
            n = rng.randint(10, 110)
            docs.append(" ".join(rng.choice(WORDS) for _ in range(n)))
            words += n
        pq.write_table(pa.table({"text": docs}), folder / f"shard-{shard:05d}.parquet")
        shard += 1
    return shard


def _tokenizer(corpus: Path):
    from hf_fasttrain.data.tokenizer import get_tokenizer
    from hf_fasttrain.data.streaming import _tokenizer_sample, open_stream

    return get_tokenizer(None, 300, corpus=_tokenizer_sample(open_stream(str(corpus)), "text", n=500))


def _trainer(corpus: Path, tokenizer, out: Path, max_steps: int):
    import torch
    from transformers import DataCollatorForLanguageModeling, GPT2Config, GPT2LMHeadModel, TrainerCallback

    from hf_fasttrain import FastTrainer, FastTrainingArguments
    from hf_fasttrain.data.streaming import TokenStream, open_stream

    class FirstBatch(TrainerCallback):
        """Stops the run as soon as the loop has taken (and trained on) its first batch."""

        def __init__(self):
            self.at = None

        def on_step_begin(self, args, state, control, **kwargs):
            if self.at is None:
                self.at = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            control.should_training_stop = True
            control.should_save = False

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_positions=BLOCK, n_embd=16, n_layer=1, n_head=2))
    args = FastTrainingArguments(output_dir=str(out), max_steps=max_steps, per_device_train_batch_size=ROWS_PER_STEP,
                                 learning_rate=1e-3, logging_steps=10**9, save_strategy="no", report_to="none",
                                 use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0, run_record=False)
    stream = TokenStream(open_stream(str(corpus)), tokenizer, BLOCK)
    first = FirstBatch()
    trainer = FastTrainer(model=model, args=args, train_dataset=stream, processing_class=tokenizer,
                          data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False), callbacks=[first])
    seen = []
    take = trainer.get_batch_samples

    def recording(epoch_iterator, num_batches, device):
        batches, n = take(epoch_iterator, num_batches, device)
        seen.extend(hashlib.sha1(b["input_ids"].numpy().tobytes()).hexdigest()[:12] for b in batches)
        return batches, n

    trainer.get_batch_samples = recording
    return trainer, first, seen


def make_checkpoint(corpus: Path, tokenizer, out: Path, step: int) -> Path:
    """A checkpoint at ``step``: one step trained and saved, relabelled as ``step``, with the stream's true
    position after ``step`` steps (read once, untimed)."""
    from itertools import islice

    from hf_fasttrain.callbacks.data_position import position_file
    from hf_fasttrain.data.streaming import STREAM_KEY, StreamPosition, TokenStream, open_stream

    trainer, _, _ = _trainer(corpus, tokenizer, out, max_steps=step + 10)
    trainer.train()
    trainer._save_checkpoint(trainer.model, trial=None)
    saved = out / "checkpoint-1"
    state = json.loads((saved / "trainer_state.json").read_text())
    state["global_step"] = step
    (saved / "trainer_state.json").write_text(json.dumps(state))
    stream = TokenStream(open_stream(str(corpus)), tokenizer, BLOCK)
    row = next(islice(iter(stream), step * ROWS_PER_STEP - 1, None))
    position = StreamPosition(stream)
    position.take({STREAM_KEY: row[STREAM_KEY]})
    Path(position_file(str(saved), 0)).write_text(json.dumps(position.state_dict()))
    return saved


def time_resume(corpus: Path, tokenizer, checkpoint: Path, out: Path, step: int, with_position: bool) -> dict:
    from hf_fasttrain.callbacks.data_position import position_file

    ckpt = out / f"checkpoint-{step}"
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(checkpoint, ckpt)
    if not with_position:
        os.remove(position_file(str(ckpt), 0))
    trainer, first, seen = _trainer(corpus, tokenizer, out, max_steps=step + 10)
    start = time.perf_counter()
    trainer.train(resume_from_checkpoint=str(ckpt))
    return {"seconds": first.at - start, "first_batch": seen[0], "resumed_at": step}


def run(steps: list[int], work: Path, repeats: int = 3) -> dict:
    corpus = work / "corpus"
    shards = write_corpus(corpus, max(steps) * ROWS_PER_STEP + 64)
    tokenizer = _tokenizer(corpus)
    rows = []
    for step in steps:
        checkpoint = make_checkpoint(corpus, tokenizer, work / f"make-{step}", step)
        ours, skip = [], []
        for _ in range(repeats if step <= 1000 else 1):  # interleaved; the long skips once
            ours.append(time_resume(corpus, tokenizer, checkpoint, work / "resume", step, with_position=True))
            skip.append(time_resume(corpus, tokenizer, checkpoint, work / "resume", step, with_position=False))
        firsts = {r["first_batch"] for r in ours + skip}
        if len(firsts) != 1:
            raise RuntimeError(f"step {step}: the arms resumed at different batches ({ours} vs {skip})")
        t_ours = statistics.median(r["seconds"] for r in ours)
        t_skip = statistics.median(r["seconds"] for r in skip)
        rows.append({"step": step, "position_s": t_ours, "trainer_skip_s": t_skip, "ratio": t_skip / t_ours,
                     "first_batch": firsts.pop(), "rows_skipped": step * ROWS_PER_STEP, "repeats": len(ours),
                     "position_all_s": [r["seconds"] for r in ours], "trainer_skip_all_s": [r["seconds"] for r in skip]})
        print(f"step {step:>7,}: position {t_ours:.2f} s, trainer skip {t_skip:.2f} s", flush=True)
    return {"benchmark": "data_resume", "block_size": BLOCK, "rows_per_step": ROWS_PER_STEP,
            "docs_per_shard": DOCS_PER_SHARD, "shards": shards, "rows": rows,
            "load_average": os.getloadavg(), "machine": machine_info(),
            "note": "loaded 2-core x86_64 CPU shared with other jobs; the arms ran back to back at each step"}


def table(result: dict) -> str:
    return markdown_table(
        ["resumed at step", "rows before it", "saved position (s)", "Trainer's skip (s)", "skip / position"],
        [[f"{r['step']:,}", f"{r['rows_skipped']:,}", r["position_s"], r["trainer_skip_s"], r["ratio"]]
         for r in result["rows"]])


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [r["step"] for r in result["rows"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(steps, [r["trainer_skip_s"] for r in result["rows"]], "o-", label="Trainer's skip (re-read and drop)")
    ax.plot(steps, [r["position_s"] for r in result["rows"]], "s-", label="saved stream position")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("step resumed at")
    ax.set_ylabel("seconds to the first resumed batch")
    ax.set_title("Resuming a stream (loaded 2-core CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.data_resume", description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 1_000, 100_000])
    parser.add_argument("--out", default=str(RESULTS), help="folder for data_resume.{json,md,png}")
    parser.add_argument("--name", default="data_resume")
    parser.add_argument("--repeats", type=int, default=3, help="timings per arm (median) for steps <= 1,000")
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="data_resume_") as work:
        result = run(sorted(ns.steps), Path(work), repeats=ns.repeats)
    md = table(result)
    write_json(out / f"{ns.name}.json", result)
    (out / f"{ns.name}.md").write_text(md + "\n", encoding="utf-8")
    plot(result, out / f"{ns.name}.png")
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
