"""Muon with its experts against tuned AdamW on a tiny mixture-of-experts model (Qwen3-MoE, 8 experts, top-2).

    nice -n 10 python -m benchmarks.moe_muon            # writes benchmarks/results/moe_muon.{json,md,png}
    python -m benchmarks.moe_muon --quick --out /tmp/x  # a smoke run (seconds)

Two parts, in one run on one machine:
1. Training: a tiny `Qwen3MoeForCausalLM` (hidden 64, 2 layers, 8 experts of width 64, top-2) on the embedded
   corpus (the standard library's Python sources, byte-level BPE), the same batches for every arm, 2% warmup
   then cosine to 10%, weight decay 0.1, clip 1.0. Arms: "adamw" (AdamW, betas (0.9, 0.95)) and "muon"
   (`create_optimizer("muon")`: every expert's matrix on Muon, routers, embeddings and head on AdamW at the
   same lr, "match_rms_adamw" scale). Each arm's peak lr is swept over 3 points (seed 0; a best at an edge
   of the grid adds a point a factor 2 beyond it, at most twice), then 3 seeds run at each arm's best. One more arm, "muon-dense" (Muon with the experts on AdamW, what the package did
   before it knew experts), runs at Muon's best lr (`--dense-seeds`, default 1), to show what the experts add.
   Reported: final eval loss (median over seeds), and the tokens Muon needs to reach AdamW's median final
   eval loss (interpolated between evals) as a fraction of AdamW's budget.
2. Optimizer step time: the same model with fixed random gradients; `optimizer.step()` of AdamW, of Muon
   with experts and of Muon with the experts on AdamW, interleaved round by round, median CPU time
   (`time.process_time`) over the rounds.

Every training run is saved (benchmarks/results/moe_muon/runs/<arm>-lr<lr>-seed<seed>.json) as it ends and
skipped when the benchmark is run again, so a killed run resumes where it stopped.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.moe_muon [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import dataclasses
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch

from benchmarks._harness import RESULTS, UsageError, display_command, machine_info, markdown_table, run_cli, write_json

ARMS = ("adamw", "muon", "muon-dense")
SWEEP = {"adamw": (2e-3, 4e-3, 8e-3), "muon": (2e-3, 4e-3, 8e-3)}
MAX_EXTEND = 2  # points added beyond an edge of the grid when the best lr sits on it


@dataclasses.dataclass(frozen=True)
class Setup:
    """The model, data and budget every arm shares."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    experts: int = 8
    top_k: int = 2
    expert_width: int = 64
    vocab_size: int = 2048
    block_size: int = 64
    batch_size: int = 16
    steps: int = 200
    eval_every: int = 20
    eval_rows: int = 32
    warmup: float = 0.02
    floor: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    timing_rounds: int = 15

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size


QUICK = Setup(hidden=32, experts=4, expert_width=32, vocab_size=512, block_size=32, batch_size=4, steps=8,
              eval_every=4, eval_rows=8, timing_rounds=3)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3, help="seeds at each arm's best lr (default 3)")
    parser.add_argument("--dense-seeds", type=int, default=1, help="seeds of the muon-dense arm (default 1)")
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (seconds)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--out", default=str(RESULTS), help="folder for moe_muon.{json,md,png} and the runs")
    return parser


def build_model(setup: Setup, seed: int):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    config = Qwen3MoeConfig(
        vocab_size=setup.vocab_size, hidden_size=setup.hidden, intermediate_size=4 * setup.hidden,
        moe_intermediate_size=setup.expert_width, num_hidden_layers=setup.layers,
        num_attention_heads=setup.heads, num_key_value_heads=setup.heads, head_dim=setup.hidden // setup.heads,
        num_experts=setup.experts, num_experts_per_tok=setup.top_k, max_position_embeddings=setup.block_size,
        decoder_sparse_step=1, norm_topk_prob=True, tie_word_embeddings=False, output_router_logits=False,
    )
    return Qwen3MoeForCausalLM(config)


def build_optimizer(arm: str, model, lr: float, setup: Setup):
    from hf_fasttrain.optim import create_optimizer

    if arm == "adamw":
        return create_optimizer("adamw", model, lr=lr, weight_decay=setup.weight_decay, betas=(0.9, 0.95))
    patterns = ("experts",) if arm == "muon-dense" else ()
    return create_optimizer("muon", model, lr=lr, weight_decay=setup.weight_decay, adamw_patterns=patterns)


def lr_factor(step: int, setup: Setup) -> float:
    """Linear warmup from 1/warmup_steps, then cosine to `floor`."""
    warm = max(1, round(setup.warmup * setup.steps))
    if step < warm:
        return (step + 1) / warm
    t = (step - warm) / max(1, setup.steps - warm)
    return setup.floor + (1 - setup.floor) * 0.5 * (1 + math.cos(math.pi * t))


def _batches(train, setup: Setup, seed: int):
    """The same rows for every arm of a seed: a seeded permutation of the training rows."""
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(seed)).tolist()
    for step in range(setup.steps):
        rows = order[step * setup.batch_size:(step + 1) * setup.batch_size]
        yield torch.tensor([train[i]["input_ids"] for i in rows])


@torch.no_grad()
def _eval_loss(model, eval_ids: torch.Tensor) -> float:
    model.eval()
    loss = model(input_ids=eval_ids, labels=eval_ids).loss.item()
    model.train()
    return loss


def train_run(arm: str, lr: float, seed: int, setup: Setup, lm) -> dict[str, Any]:
    """One training run: its eval curve [(step, tokens, eval loss)] and its CPU seconds."""
    model = build_model(setup, seed)
    opt = build_optimizer(arm, model, lr, setup)
    base = [g["lr"] for g in opt.param_groups]
    eval_ids = torch.tensor(lm["validation"]["input_ids"][: setup.eval_rows])
    curve = [(0, 0, _eval_loss(model, eval_ids))]
    cpu = time.process_time()
    for step, ids in enumerate(_batches(lm["train"], setup, seed)):
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * lr_factor(step, setup)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), setup.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if (step + 1) % setup.eval_every == 0 or step + 1 == setup.steps:
            curve.append((step + 1, (step + 1) * setup.tokens_per_step, _eval_loss(model, eval_ids)))
            if not math.isfinite(curve[-1][2]):
                break
    return {"arm": arm, "lr": lr, "seed": seed, "curve": curve, "final": curve[-1][2],
            "cpu_s": time.process_time() - cpu}


def tokens_to(curve: list, target: float) -> Optional[float]:
    """Tokens at which `curve` first reaches `target`, linear between evals; None if it never does.

    >>> tokens_to([(0, 0, 5.0), (1, 100, 4.0), (2, 200, 3.0)], 3.5)
    150.0
    >>> tokens_to([(0, 0, 5.0), (1, 100, 4.0)], 3.5) is None
    True
    """
    for (_, t0, l0), (_, t1, l1) in zip(curve, curve[1:]):
        if l1 <= target:
            return float(t1) if l0 == l1 else t0 + (t1 - t0) * (l0 - target) / (l0 - l1)
    return None


def step_times(setup: Setup) -> dict[str, dict[str, float]]:
    """Median CPU seconds of `optimizer.step()` per arm, with fixed random gradients, interleaved by round."""
    model = build_model(setup, 0)
    gen = torch.Generator().manual_seed(0)
    for p in model.parameters():
        p.grad = 1e-3 * torch.randn(p.shape, generator=gen)
    opts = {arm: build_optimizer(arm, model, 1e-4, setup) for arm in ARMS}
    saved = {n: p.detach().clone() for n, p in model.named_parameters()}
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for opt in opts.values():
        opt.step()  # allocates the state
    for _ in range(setup.timing_rounds):
        for arm, opt in opts.items():
            t = time.process_time()
            opt.step()
            times[arm].append(time.process_time() - t)
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(saved[n])
    muon = opts["muon"].inner_optimizers[0]
    expert_matrices = sum(2 * p.shape[0] if g.get("expert_gate_up") else p.shape[0]
                          for g in muon.param_groups if g.get("experts") for p in g["params"])
    return {arm: {"cpu_s": statistics.median(ts), "ratio": statistics.median(a / b for a, b in zip(ts, times["adamw"])),
                  "rounds": len(ts)} | ({"expert_matrices": expert_matrices} if arm == "muon" else {})
            for arm, ts in times.items()}


class Ledger:
    """Finished runs, one JSON file each, keyed by arm, lr and seed; a rerun skips what is there."""

    def __init__(self, folder: Path, setup: Setup):
        self.folder = folder
        self.setup = dataclasses.asdict(setup)
        folder.mkdir(parents=True, exist_ok=True)

    def _path(self, arm: str, lr: float, seed: int) -> Path:
        return self.folder / f"{arm}-lr{lr:g}-seed{seed}.json"

    def get(self, arm: str, lr: float, seed: int) -> Optional[dict]:
        path = self._path(arm, lr, seed)
        if path.exists():
            run = json.loads(path.read_text())
            if run.get("setup") == self.setup:  # a run of other settings is run again
                return run
        return None

    def put(self, run: dict) -> dict:
        run = {**run, "setup": self.setup}
        write_json(self._path(run["arm"], run["lr"], run["seed"]), run)
        return run


def main(argv=None) -> dict:
    ns = make_parser().parse_args(argv)
    if ns.seeds < 1:
        raise UsageError(f"--seeds: must be at least 1, got {ns.seeds}")
    if ns.dense_seeds < 1:
        raise UsageError(f"--dense-seeds: must be at least 1, got {ns.dense_seeds}")
    if ns.threads < 1:
        raise UsageError(f"--threads: must be at least 1, got {ns.threads}")
    torch.set_num_threads(ns.threads)
    setup = QUICK if ns.quick else Setup()
    out = Path(ns.out)
    stem = "moe_muon_quick" if ns.quick else "moe_muon"
    ledger = Ledger(out / stem / "runs", setup)

    from hf_fasttrain import DataArguments
    from hf_fasttrain.data.front import prepare_data

    _, lm = prepare_data(DataArguments(vocab_size=setup.vocab_size, block_size=setup.block_size,
                                       max_eval_samples=setup.eval_rows, max_corpus_files=40 if ns.quick else None))

    def run(arm: str, lr: float, seed: int) -> dict:
        done = ledger.get(arm, lr, seed)
        if done is None:
            done = ledger.put(train_run(arm, lr, seed, setup, lm))
            print(f"[moe_muon] {arm:>10s} lr {lr:<7g} seed {seed}: final eval loss {done['final']:.4f} "
                  f"({done['cpu_s']:.0f} CPU s)", flush=True)
        return done

    timing = step_times(setup)  # first, so a long training part never leaves the run without it
    sweep, best = {}, {}
    for arm, lrs in SWEEP.items():
        losses = {lr: run(arm, lr, 0)["final"] for lr in lrs}
        for _ in range(MAX_EXTEND):  # a best at an edge of the grid: one more point a factor 2 beyond it
            lr = min(losses, key=lambda x: (not math.isfinite(losses[x]), losses[x]))
            if lr not in (min(losses), max(losses)):
                break
            nxt = lr * 2 if lr == max(losses) else lr / 2
            losses[nxt] = run(arm, nxt, 0)["final"]
        sweep[arm] = dict(sorted(losses.items()))
        best[arm] = min(losses, key=lambda x: (not math.isfinite(losses[x]), losses[x]))
    best["muon-dense"] = best["muon"]
    runs = {arm: [run(arm, best[arm], seed) for seed in range(ns.seeds)] for arm in SWEEP}
    runs["muon-dense"] = [run("muon-dense", best["muon"], seed) for seed in range(ns.dense_seeds)]

    finals = {arm: statistics.median(r["final"] for r in rs) for arm, rs in runs.items()}
    budget = setup.steps * setup.tokens_per_step
    target = finals["adamw"]
    reach = {}
    for arm in ARMS:
        tokens = [tokens_to(r["curve"], target) for r in runs[arm]]
        # a seed that never reaches the target counts as infinitely many tokens
        med = statistics.median(math.inf if t is None else t for t in tokens)
        reach[arm] = {"tokens": tokens, "median_fraction": med / budget if math.isfinite(med) else None}
    record = {
        "benchmark": "moe_muon",
        "command": display_command("python -m benchmarks.moe_muon", sys.argv[1:] if argv is None else argv),
        "setup": dataclasses.asdict(setup),
        "model": "Qwen3MoeForCausalLM, " + f"{sum(p.numel() for p in build_model(setup, 0).parameters())} parameters",
        "budget_tokens": budget,
        "sweep": {arm: {f"{lr:g}": loss for lr, loss in losses.items()} for arm, losses in sweep.items()},
        "best_lr": best,
        "final_eval_loss": {arm: [r["final"] for r in rs] for arm, rs in runs.items()},
        "median_final_eval_loss": finals,
        "target": target,
        "tokens_to_adamw_final": reach,
        "curves": {arm: [r["curve"] for r in rs] for arm, rs in runs.items()},
        "step_time": timing,
        "machine": machine_info(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    write_outputs(record, out, stem)
    return record


def table(record: dict) -> str:
    reach, timing = record["tokens_to_adamw_final"], record["step_time"]
    rows = []
    for arm in ARMS:
        frac = reach[arm]["median_fraction"]
        losses = ", ".join(f"{x:.4f}" for x in record["final_eval_loss"][arm])
        rows.append([arm, f"{record['best_lr'][arm]:g}", f"{record['median_final_eval_loss'][arm]:.4f}", losses,
                     "not reached" if frac is None else f"{frac:.3f}", f"{timing[arm]['cpu_s'] * 1e3:.1f}",
                     f"{timing[arm]['ratio']:.2f}"])
    head = ["arm", "lr", "median final eval loss", "per seed", "tokens to AdamW's final (x budget)",
            "step ms CPU", "step x AdamW"]
    sweep = "; ".join(f"{arm}: " + ", ".join(f"{lr} -> {loss:.4f}" for lr, loss in losses.items())
                      for arm, losses in record["sweep"].items())
    s = record["setup"]
    return "\n".join([
        markdown_table(head, rows), "",
        f"{record['model']} (hidden {s['hidden']}, {s['layers']} layers, {s['experts']} experts of width "
        f"{s['expert_width']}, top-{s['top_k']}); {s['steps']} steps of {s['batch_size']} x {s['block_size']} tokens "
        f"({record['budget_tokens']} tokens) on the embedded corpus; eval loss on {s['eval_rows']} held-out rows. "
        f"lr sweep (seed 0, final eval loss): {sweep}. Step time: median of {s['timing_rounds']} interleaved rounds, "
        f"1 thread; Muon orthogonalises {timing['muon']['expert_matrices']} expert matrices per step. "
        f"Command: `{record['command']}`",
    ])


def write_outputs(record: dict, out: Path, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    write_json(out / f"{stem}.json", record)
    text = table(record)
    (out / f"{stem}.md").write_text(text + "\n")
    print(text)
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(7, 7), height_ratios=(3, 1))  # stacked: legible at a page's width
    colors = {"adamw": "#888", "muon": "#4c72b0", "muon-dense": "#dd8452"}
    for arm in ARMS:
        for i, curve in enumerate(record["curves"][arm]):
            ax1.plot([t for _, t, _ in curve[1:]], [loss for _, _, loss in curve[1:]], color=colors[arm], alpha=0.8,
                     label=f"{arm} (lr {record['best_lr'][arm]:g})" if i == 0 else None)
    ax1.axhline(record["target"], color="#888", ls=":", lw=1)
    ax1.set_xlabel("training tokens")
    ax1.set_ylabel("eval loss")
    ax1.legend(fontsize=8)
    timing = record["step_time"]
    ax2.barh(list(ARMS), [timing[a]["cpu_s"] * 1e3 for a in ARMS], color=[colors[a] for a in ARMS])
    ax2.set_xlabel("optimizer step, CPU ms (median)")
    ax2.invert_yaxis()
    fig.suptitle("Muon with experts vs AdamW, tiny Qwen3-MoE (8 experts, top-2)")
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    run_cli(main)
