#!/usr/bin/env python
"""Time per training step of each technique of the ablation, side by side in one process.

    python -m benchmarks.technique_overhead                 # the time_to_loss model, 20 rounds
    python -m benchmarks.technique_overhead --rounds 5 --quick

One training step (forward, backward, clip, optimizer step, and the technique's own work) of the
``time_to_loss`` harness's model and batch (GPT-2 2x128, 16 x 128 tokens) is timed for each variant:
the Muon recipe (``base``), with an EMA update after the step, with a LAWA copy (every 10th step, so
its cost is amortised over 10), with cautious updates in Muon's AdamW part, and with Polar Express
coefficients, with NorMuon, and with what ``budget_aware`` adds at 1.5 tokens per parameter (NorMuon, beta2
0.999 and the embeddings at 2x the lr: one more param group). Variants take turns within each round (round-robin), so a loaded machine slows all of
them alike; the table gives the median over rounds and the ratio to ``base``, which is the figure to
read on a shared machine. Batch-size warmup has no per-step cost of its own (its steps are smaller).

Writes technique_overhead.{json,md,png} into --out (benchmarks/results).
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.technique_overhead [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_fasttrain.stability.averaging import WeightAverage
from hf_fasttrain.optim import create_optimizer
from benchmarks._harness import machine_info as environment_info

RESULTS = Path(__file__).resolve().parent / "results"

VARIANTS = {
    "base": ({}, None),
    "+ema": ({}, dict(mode="ema", decay=0.98)),
    "+lawa (every 10)": ({}, dict(mode="lawa", lawa_k=5, lawa_interval=10)),
    "+cautious": ({"cautious": True}, None),
    "+polar": ({"ns_coefficients": "polar_express"}, None),
    "+normuon": ({"normuon_beta2": 0.95}, None),
    # what budget_aware adds at 1.5 tokens per parameter: NorMuon, beta2 0.999 and the embeddings at 2x
    "+budget_aware (short)": ({"normuon_beta2": 0.95, "betas": (0.9, 0.999), "lr_multipliers": {"embedding": 2.0}},
                              None),
}


def make_variant(name: str, vocab: int, embd: int, block: int, seed: int = 0):
    kwargs, avg = VARIANTS[name]
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=vocab, n_positions=block, n_embd=embd, n_layer=2, n_head=4,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0))
    opt = create_optimizer("muon", model, lr=1.6e-2, weight_decay=0.1, **kwargs)
    average = WeightAverage(dict(model.named_parameters()), **avg) if avg else None
    return model, opt, average


def step(model, opt, average, batch, t: int) -> float:
    t0 = time.perf_counter()
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    if average is not None:
        average.update(dict(model.named_parameters()), t)
    return time.perf_counter() - t0


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=20, help="timed steps per variant (after 3 warm-up steps)")
    p.add_argument("--quick", action="store_true", help="a tiny model and batch (the test suite's smoke run)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="technique_overhead")
    ns = p.parse_args(argv)
    vocab, embd, block, rows = (300, 32, 32, 4) if ns.quick else (4096, 128, 128, 16)
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, vocab, (rows, block), generator=g)
    variants = {n: make_variant(n, vocab, embd, block) for n in VARIANTS}
    times: dict[str, list[float]] = {n: [] for n in VARIANTS}
    for t in range(1, ns.rounds + 4):
        for n, (model, opt, average) in variants.items():
            dt = step(model, opt, average, batch, t)
            if t > 3:
                times[n].append(dt)
    base = statistics.median(times["base"])
    rows_out = {n: {"ms_per_step": 1000 * statistics.median(v), "ratio_vs_base": statistics.median(v) / base}
                for n, v in times.items()}
    env = environment_info()
    machine = env["cuda_devices"][0] if env["cuda_devices"] else f"{env['cpu_count']}-core CPU ({env['processor']})"
    command = "python -m benchmarks.technique_overhead " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [f"Machine: {machine}; torch {env['torch']}; {torch.get_num_threads()} thread(s).", f"Command: `{command}`", "",
             "| variant | ms per step (median) | vs base |", "|---|---|---|"]
    lines += [f"| {n} | {r['ms_per_step']:.1f} | {r['ratio_vs_base']:.3f} |" for n, r in rows_out.items()]
    table = "\n".join(lines) + "\n"
    print(table)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    record = {"rows": rows_out, "times": times, "rounds": ns.rounds, "machine": machine, "environment": env,
              "command": command, "threads": torch.get_num_threads()}
    (out / f"{ns.name}.json").write_text(json.dumps(record, indent=2, default=str))
    (out / f"{ns.name}.md").write_text(table)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.boxplot([[1000 * x for x in times[n]] for n in VARIANTS], tick_labels=list(VARIANTS))
    ax.set_ylabel("ms per training step")
    ax.set_title("Per-step cost of each technique (round-robin, one process)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / f"{ns.name}.png", dpi=110)
    plt.close(fig)
    return record


if __name__ == "__main__":
    main()
