#!/usr/bin/env python
"""nanoGPT on tinyshakespeare, side by side: nanoGPT's README CPU recipe in a plain Trainer, the Trainer's options
searched at that budget, and the package's recipe, on the same characters.

    nice -n 10 python -m benchmarks.nanogpt --text data/tinyshakespeare/input.txt     # the study (resumable)
    python -m benchmarks.nanogpt --report                                              # tables and plot from the JSON
    python -m benchmarks.nanogpt --text input.txt --quick --out /tmp/x                 # a smoke run (the tests use it)

Data: the text file as nanoGPT's ``data/shakespeare_char/prepare.py`` cuts it (the sorted characters are the
vocabulary, the first 90% train, the last 10% validate), read by the package's ``tokenizer: char``
(``hf_fasttrain.data.chars``). Rows are nanoGPT's windows: 64 characters and the 64 that follow them, so every
position predicts its next character. Training rows start every 64 characters of the train split and are shuffled
each epoch (nanoGPT draws windows at random offsets). Evaluation: every validation window, the whole split (the
peer's rule: ``(n - 1) // 64`` windows, every character of them predicted), every ``--eval-steps`` steps. Each final
model is also scored on every character of the split but the first (the windows plus the last characters no window
covers), and writes 200 characters from a fixed prompt and seed.

Model: nanoGPT's 4 layers x 4 heads x 128 wide, block 64, dropout 0, the 65 characters, as a GPT-2 config.
Budget: 2,000 steps of 12 rows x 64 characters = 1.536M characters for every arm.

Arms:

- ``hf-nanogpt``: nanoGPT's README CPU recipe in ``transformers.Trainer``: AdamW lr 1e-3, betas (0.9, 0.99), weight
  decay 0.1 on matrices and embeddings (the Trainer's default groups, nanoGPT's rule), 100 warmup steps, cosine to
  1e-4, clip 1.0.
- ``hf-best``: the Trainer's options searched at this budget from hf-nanogpt's, one knob at a time (:data:`STAGES`:
  peak lr, embeddings' lr through the package's ``lr_multipliers``, schedule and floor, beta2, warmup, weight decay),
  seed 0 per point; a value is kept where it lowers the final loss by more than :data:`NOISE`. Its winner runs 3
  seeds.
- ``fasttrain``: FastTrainer with the settings of the shipped recipe ``recipes/configs/gpt2_tiny.yaml`` (Muon +
  AdamW, divergence guard, EMA, sequence-length warmup), read from the file.
- ``fasttrain-budget``: the same with ``budget_aware: true``.

Order (one run at a time): hf-nanogpt seed 0, fasttrain seed 0, the search, then the other seeds. Each run is kept
in ``--out/<name>.json`` as it ends and a rerun skips it; ``--stop-at HH:MM`` (UTC) starts no run that would end after
it (a run's length estimated from the finished ones). What has not run is reported as not run.

Reported per arm: the median over seeds of the final whole-split loss; the tokens and training seconds to the
peer's 1.8982 (nanoGPT's own train.py on this file and machine kind), to hf-nanogpt's median final loss and to
hf-best's, read off each eval curve by linear interpolation (a seed that never reaches a target counts as never,
and the median is over all seeds); their ratios to hf-nanogpt's (hf-best's for the last); the milliseconds per
optimizer step beside them. Writes <name>.json, <name>.md and <name>.png.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.nanogpt [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import dataclasses
import datetime as dt
import hashlib
import json
import math
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from benchmarks._harness import RESULTS, ROOT, UsageError, display_command, display_path, fmt, run_cli
from benchmarks._harness import machine_info
from benchmarks._harness.ledger import Ledger

__all__ = ["PEER_LOSS", "SETUP", "QUICK_SETUP", "HF_NANOGPT", "NOISE", "STAGES", "recipe_settings", "arms",
           "hf_config_arm", "settings_key", "staged_search", "plan", "report", "main"]

# nanoGPT's own train.py (karpathy/nanoGPT 3adf61e) with the README's CPU recipe on this file, a 2-core x86_64 CPU,
# torch 2.13: its final model's loss on the whole validation split (shared data folder's README)
PEER_LOSS = 1.8982
PEER_ESTIMATE = 1.8857  # the same run's own estimate (20 random batches)
SAMPLE_PROMPT = "\n"  # nanoGPT's sample.py start
SAMPLE_CHARS = 200
SAMPLE_SEED = 1337
SAMPLE_TEMPERATURE = 0.8  # nanoGPT's sample.py defaults (its top_k 200 keeps all 65 characters)
NOISE = 0.005  # a search step is kept only where it lowers the seed-0 final loss by more than this
RECIPE = ROOT / "recipes" / "configs" / "gpt2_tiny.yaml"
# the technique settings of the shipped recipe (its model, data, length, batch, cadence and output are the study's)
RECIPE_KEYS = ("optimizer", "learning_rate", "weight_decay", "adam_beta2", "warmup_steps", "lr_decay", "min_lr_ratio",
               "max_grad_norm", "clip_mode", "divergence_guard", "weight_averaging", "ema_decay", "seq_len_warmup_min",
               "seq_len_warmup_fraction", "guard_snapshot_every")


def _setup(**kw):
    from benchmarks._harness.lm import Setup

    return Setup(**kw)


# nanoGPT's config/train_shakespeare_char.py with the README's CPU overrides: 4x4x128, block 64, batch 12, 2,000 iters
SETUP = dict(n_layer=4, n_head=4, n_embd=128, vocab_size=65, block_size=64, batch_size=12, max_steps=2000,
             eval_steps=200, eval_rows=0)
QUICK_SETUP = dict(n_layer=1, n_head=2, n_embd=32, vocab_size=0, block_size=16, batch_size=4, max_steps=12,
                   eval_steps=4, eval_rows=0)

# nanoGPT's README CPU recipe as Trainer options (the floor 1e-4 is 10% of the peak)
HF_NANOGPT = dict(learning_rate=1e-3, adam_beta1=0.9, adam_beta2=0.99, weight_decay=0.1, warmup_steps=100,
                  lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1}, max_grad_norm=1.0)
START = {"lr": 1e-3, "emb": 1.0, "schedule": "cosine10", "beta2": 0.99, "warmup": 100, "wd": 0.1}

# The staged walk: each stage tries these values of one knob from the current best (the lr stage walks: x2 while the
# loss falls, else x0.5 while it falls, at most LR_WALK steps)
STAGES: list[tuple[str, list[Any]]] = [
    ("lr", []),
    ("emb", [4.0, 16.0]),
    ("schedule", ["linear0", "wsd-linear"]),
    ("beta2", [0.95, 0.999]),
    ("warmup", [40, 200]),
    ("wd", [0.0, 0.3]),
]
LR_WALK = 3


def schedule_options(name: str, steps: int) -> dict[str, Any]:
    """The Trainer's ``lr_scheduler_type`` and kwargs for a schedule name of the search."""
    return {
        "cosine10": dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1}),
        "linear0": dict(lr_scheduler_type="linear", lr_scheduler_kwargs={}),
        "wsd-linear": dict(lr_scheduler_type="warmup_stable_decay",
                           lr_scheduler_kwargs={"num_decay_steps": round(0.2 * steps), "decay_type": "linear",
                                                "min_lr_ratio": 0.0}),
    }[name]


def hf_config_arm(name: str, config: dict[str, Any], steps: int, warmup_scale: float = 1.0):
    """A plain-Trainer arm for a point of the search. ``emb`` 1 is the Trainer's own AdamW (hf-nanogpt's point
    is the search's start, the same settings); another is the package's AdamW with the embeddings (and the tied head)
    at that multiple of the peak lr: ``optimizer_cls_and_kwargs_for('adamw', args, lr_multipliers=...)``."""
    from benchmarks._harness.lm import Arm

    args = dict(learning_rate=config["lr"], adam_beta1=0.9, adam_beta2=config["beta2"], weight_decay=config["wd"],
                warmup_steps=max(1, round(config["warmup"] * warmup_scale)), max_grad_norm=1.0,
                **schedule_options(config["schedule"], steps))
    optimizer = ("adamw", {"lr_multipliers": {"embedding": float(config["emb"])}}) if config["emb"] != 1.0 else None
    shown = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in config.items())
    return Arm(name, f"transformers.Trainer + AdamW: {shown}", fast=False, args=args, optimizer=optimizer)


def recipe_settings(path: Path = RECIPE) -> dict[str, Any]:
    """The technique settings of the shipped recipe file (:data:`RECIPE_KEYS`), as FastTrainingArguments."""
    import yaml

    recipe = yaml.safe_load(path.read_text())
    missing = [k for k in RECIPE_KEYS if k not in recipe]
    if missing:
        raise UsageError(f"{display_path(path)}: no {', '.join(missing)}; the study reads the recipe's techniques")
    return {k: recipe[k] for k in RECIPE_KEYS}


def arms(setup, hf_best: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """The arms by name; ``hf-best`` at the search's winner (its start, hf-nanogpt's settings, before it runs)."""
    from benchmarks._harness.lm import Arm

    scale = setup.max_steps / SETUP["max_steps"]  # the quick setup's warmup is the same share of its run
    nano = hf_config_arm("hf-nanogpt", START, setup.max_steps, scale)
    nano.description = ("transformers.Trainer, nanoGPT's README CPU recipe: AdamW lr 1e-3, betas (0.9, 0.99), weight "
                        "decay 0.1 (matrices and embeddings), 100 warmup steps, cosine to 1e-4, clip 1.0")
    recipe = {**recipe_settings(), "include_num_input_tokens_seen": "all"}
    out = {
        "hf-nanogpt": nano,
        "hf-best": hf_config_arm("hf-best", hf_best or START, setup.max_steps, scale),
        "fasttrain": Arm("fasttrain", "FastTrainer with the shipped recipe's settings (recipes/configs/gpt2_tiny.yaml): "
                         + ", ".join(f"{k} {v}" for k, v in recipe_settings().items()), fast=True, args=recipe),
        "fasttrain-budget": Arm("fasttrain-budget", "the fasttrain arm with budget_aware: true", fast=True,
                                args={**recipe, "budget_aware": True}),
    }
    return out


def settings_key(arm, seed: int, setup) -> str:
    """What a run's result depends on: the arm's training settings and optimizer (not its name: hf-nanogpt's run
    is the search's start point), the seed and the setup (the text's hash included)."""
    blob = json.dumps({"fast": arm.fast, "args": arm.args, "optimizer": arm.optimizer, "seed": seed,
                       "setup": dataclasses.asdict(setup)}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


# --- the search: a generator of configs to run, sent each one's final loss --------------------------------
def _config_name(config: dict[str, Any]) -> str:
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


def staged_search(start: dict[str, Any], stages=STAGES, noise: float = NOISE, lr_walk: int = LR_WALK,
                  log: Optional[list] = None) -> Iterator[tuple[str, dict[str, Any]]]:
    """The staged walk as a generator: yields ``(stage, config)`` to run and is sent its seed-0 final loss; returns
    (StopIteration.value) ``{"best": config, "loss": loss, "log": [...]}``. A knob's value replaces the current one
    only where it lowers the loss by more than ``noise``. ``log`` (a list) receives each point as it is decided, so a
    walk cut short still says what it tried and kept.

    >>> losses = {1e-3: 2.0, 2e-3: 1.9, 4e-3: 1.95}
    >>> walk = staged_search({"lr": 1e-3, "x": 0}, stages=[("lr", []), ("x", [1])])
    >>> stage, c = next(walk)
    >>> try:
    ...     while True:
    ...         stage, c = walk.send(losses[c["lr"]] - 0.01 * c["x"])
    ... except StopIteration as e:
    ...     result = e.value
    >>> result["best"], [(r["stage"], r["config"]["lr"], r["kept"]) for r in result["log"]]
    ({'lr': 0.002, 'x': 1}, [('start', 0.001, True), ('lr', 0.002, True), ('lr', 0.004, False), ('x', 0.002, True)])
    """
    log = [] if log is None else log
    best = dict(start)
    loss = yield "start", dict(best)
    log.append({"stage": "start", "config": dict(best), "loss": loss, "kept": True})

    def attempt(stage: str, config: dict[str, Any]):
        nonlocal best, loss
        got = yield stage, config
        kept = got < loss - noise
        log.append({"stage": stage, "config": config, "loss": got, "kept": kept})
        if kept:
            best, loss = config, got
        return kept

    for knob, values in stages:
        if knob == "lr":  # a walk: x2 while the loss falls; where the first x2 loses, x0.5 while it falls
            for factor in (2.0, 0.5):
                moved = False
                for _ in range(lr_walk):
                    trial = {**best, "lr": float(f"{best['lr'] * factor:.3g}")}
                    if not (yield from attempt("lr", trial)):
                        break
                    moved = True
                if moved:
                    break
            continue
        for v in values:  # each value from the stage's start; the best of them is kept
            if v != best[knob]:
                yield from attempt(knob, {**best, knob: v})
    return {"best": best, "loss": loss, "log": log}


def plan(seeds: int) -> list[tuple[str, int]]:
    """The runs after the search, in order: seed 0 of fasttrain-budget, then each further seed of every arm.

    >>> plan(2)
    [('fasttrain-budget', 0), ('hf-best', 1), ('hf-nanogpt', 1), ('fasttrain', 1), ('fasttrain-budget', 1)]
    """
    out = [("fasttrain-budget", 0)]
    for seed in range(1, seeds):
        out += [("hf-best", seed), ("hf-nanogpt", seed), ("fasttrain", seed), ("fasttrain-budget", seed)]
    return out


# --- one run ------------------------------------------------------------------------------------------
def whole_split_loss(model, ids, block_size: int, batch: int = 128) -> dict[str, Any]:
    """The model's mean loss on a split's ids: on the ``(n - 1) // block_size`` windows (the peer's rule) and on
    every id but the first (the windows plus one window that ends at the split's end, counting only the ids no
    window predicted). Returns both means and the characters each counts."""
    import numpy as np
    import torch

    n = len(ids)
    k = (n - 1) // block_size
    ids = torch.as_tensor(np.asarray(ids, dtype=np.int64))
    x = ids[: k * block_size].view(k, block_size)
    y = ids[1: k * block_size + 1].view(k, block_size)
    total = 0.0
    model.eval()
    with torch.no_grad():
        for i in range(0, k, batch):
            logits = model(input_ids=x[i:i + batch].to(model.device)).logits.float()
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y[i:i + batch].flatten().to(model.device),
                                                       reduction="sum").item()
        rest = (n - 1) - k * block_size
        tail = 0.0
        if rest:
            logits = model(input_ids=ids[n - 1 - block_size: n - 1][None].to(model.device)).logits.float()[0, -rest:]
            tail = torch.nn.functional.cross_entropy(logits, ids[n - rest:].to(model.device), reduction="sum").item()
    return {"windows_loss": total / (k * block_size), "windows_chars": k * block_size,
            "every_char_loss": (total + tail) / (n - 1), "every_char_count": n - 1}


def sample(model, tokenizer, block_size: int, prompt: str = SAMPLE_PROMPT, chars: int = SAMPLE_CHARS,
           seed: int = SAMPLE_SEED, temperature: float = SAMPLE_TEMPERATURE) -> str:
    """``chars`` characters after ``prompt`` (nanoGPT's sample.py: temperature, the context cut to the block)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    ids = torch.tensor([tokenizer(prompt)["input_ids"]], dtype=torch.long)
    model.eval()
    with torch.no_grad():
        for _ in range(chars):
            logits = model(input_ids=ids[:, -block_size:].to(model.device)).logits[0, -1].float().cpu()
            probs = torch.softmax(logits / temperature, dim=-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)[None]], dim=1)
    return tokenizer.decode(ids[0, len(tokenizer(prompt)["input_ids"]):].tolist())


def train_one(arm, seed: int, setup, data: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """One run of ``arm`` (the harness's run_arm with the window rows' collator), then the final model scored on
    every validation character and a sample of its text."""
    from hf_fasttrain.data.chars import WindowCollator

    from benchmarks._harness.lm import run_arm

    def finish(trainer) -> dict[str, Any]:
        model = trainer.model
        return {"final": whole_split_loss(model, data["val_ids"], setup.block_size),
                "sample": sample(model, data["tokenizer"], setup.block_size),
                "optimizer_steps": trainer.state.global_step}

    return run_arm(arm, seed, setup, data["tokenizer"], data["lm"], workdir, data_collator=WindowCollator(),
                   finish=finish)


# --- the report ---------------------------------------------------------------------------------------
ARM_ORDER = ("hf-nanogpt", "hf-best", "fasttrain", "fasttrain-budget")


def report(runs: list[dict[str, Any]], peer: float = PEER_LOSS, order=ARM_ORDER) -> dict[str, Any]:
    """Per arm, from its runs' curves: the median final loss, tokens and seconds to the peer's loss, to hf-nanogpt's
    median final loss and to hf-best's, their ratios, seeds reaching, ms per step (harness ``summarise``).

    Ratios to the peer's loss divide by hf-nanogpt's median tokens (seconds) to it. Ratios to an arm's own median
    final loss divide by that arm's whole run (its median characters and training seconds): a complete run is what
    ends at that loss, while with two seeds the median crossing of the arm itself is "never" (one seed ends above)."""
    from benchmarks._harness.lm import summarise

    present = [a for a in order if any(r["arm"] == a for r in runs)]
    if not present:
        return {"arms": {}, "targets": {}}
    targets = {"peer": summarise(runs, present, "hf-nanogpt" if "hf-nanogpt" in present else present[0], target=peer)}
    if "hf-nanogpt" in present:
        targets["hf-nanogpt"] = summarise(runs, present, "hf-nanogpt")
    if "hf-best" in present:
        targets["hf-best"] = summarise(runs, present, "hf-best")
    out: dict[str, Any] = {"targets": {k: v["target_eval_loss"] for k, v in targets.items()}, "arms": {}}
    for a in present:
        rs = [r for r in runs if r["arm"] == a]
        row: dict[str, Any] = {
            "seeds": len(rs),
            "final_eval_loss": targets["peer"]["arms"][a]["final_eval_loss"],
            "every_char_loss": statistics.median(r["final"]["every_char_loss"] for r in rs),
            "final_tokens": targets["peer"]["arms"][a]["final_tokens"],
            "train_seconds": targets["peer"]["arms"][a]["train_seconds"],
            "ms_per_step": 1000 * targets["peer"]["arms"][a]["seconds_per_step"],
            "optimizer_steps": statistics.median(r.get("optimizer_steps", r["curve"][-1]["step"]) for r in rs),
        }
        for name, s in targets.items():
            t = s["arms"][a]
            row[f"tokens_to_{name}"] = t["tokens_to_target"]
            row[f"seconds_to_{name}"] = t["seconds_to_target"]
            row[f"reached_{name}"] = t["reached"]
            if name == "peer":  # against hf-nanogpt's own characters and seconds to the peer's loss
                row[f"tokens_ratio_{name}"] = t["tokens_ratio_vs_reference"]
                row[f"time_ratio_{name}"] = t["time_ratio_vs_reference"]
            else:  # an arm's own median final loss: against its whole run, which ends there (the median seed's)
                ref = s["arms"][name]
                row[f"tokens_ratio_{name}"] = t["tokens_to_target"] / ref["final_tokens"]
                row[f"time_ratio_{name}"] = t["seconds_to_target"] / ref["train_seconds"]
        out["arms"][a] = row
    return out


def markdown(summary: dict[str, Any], peer: float = PEER_LOSS) -> str:
    t = summary["targets"]
    lines = [f"Targets: the peer's {peer:.4f} (nanoGPT's train.py, whole validation split)"
             + (f"; hf-nanogpt's median final {t['hf-nanogpt']:.4f}" if "hf-nanogpt" in t else "")
             + (f"; hf-best's median final {t['hf-best']:.4f}" if "hf-best" in t else "") + ".", "",
             "| arm | seeds | final loss (median) | every-char loss | tokens to 1.8982 | vs hf-nanogpt | s to 1.8982 "
             "| vs hf-nanogpt | reached | tokens to hf-nanogpt's final | vs hf-nanogpt | s to it | vs hf-nanogpt "
             "| reached | tokens to hf-best's final | vs hf-best | reached | ms per step |",
             "|" + "---|" * 19]
    for a, r in summary["arms"].items():
        def g(k):
            return r.get(k, math.nan)
        lines.append(
            f"| {a} | {r['seeds']} | {r['final_eval_loss']:.4f} | {r['every_char_loss']:.4f} | {fmt(g('tokens_to_peer'))} "
            f"| {fmt(g('tokens_ratio_peer'))} | {fmt(g('seconds_to_peer'))} | {fmt(g('time_ratio_peer'))} "
            f"| {r.get('reached_peer', 0)}/{r['seeds']} | {fmt(g('tokens_to_hf-nanogpt'))} "
            f"| {fmt(g('tokens_ratio_hf-nanogpt'))} | {fmt(g('seconds_to_hf-nanogpt'))} "
            f"| {fmt(g('time_ratio_hf-nanogpt'))} | {r.get('reached_hf-nanogpt', 0)}/{r['seeds']} "
            f"| {fmt(g('tokens_to_hf-best'))} | {fmt(g('tokens_ratio_hf-best'))} | {r.get('reached_hf-best', 0)}/{r['seeds']} "
            f"| {fmt(r['ms_per_step'])} |")
    return "\n".join(lines) + "\n"


def search_markdown(search: dict[str, Any]) -> str:
    lines = ["| # | stage | settings | final loss (seed 0) | kept |", "|---|---|---|---|---|"]
    for i, r in enumerate(search.get("log", [])):
        lines.append(f"| {i} | {r['stage']} | {_config_name(r['config'])} | "
                     f"{'not run' if r['loss'] is None else format(r['loss'], '.4f')} | {'yes' if r['kept'] else 'no'} |")
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path, peer: float = PEER_LOSS) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.6), sharey=True)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(summary["arms"]):
        for j, r in enumerate(x for x in runs if x["arm"] == arm):
            pts = r["curve"][1:]  # the step-0 evaluation (ln 65) would flatten the scale
            for ax, key, scale in ((axes[0], "tokens", 1e6), (axes[1], "seconds", 1.0)):
                ax.plot([p[key] / scale for p in pts], [p["eval_loss"] for p in pts], color=colours[i % len(colours)],
                        alpha=0.8, lw=1.2, label=arm if j == 0 else None)
    for ax in axes:
        ax.axhline(peer, color="k", ls="--", lw=0.8, label=f"nanoGPT's train.py {peer:.4f}")
        if "hf-nanogpt" in summary["targets"]:
            ax.axhline(summary["targets"]["hf-nanogpt"], color="grey", ls=":", lw=0.8, label="hf-nanogpt's final")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("characters trained, millions")
    axes[1].set_xlabel("training seconds (evaluation excluded), one process, 1 thread")
    axes[0].set_ylabel("loss, whole validation split")
    axes[0].legend(fontsize=8)
    fig.suptitle("nanoGPT's CPU recipe on tinyshakespeare: one line per seed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def arm_runs(data: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of the four arms, one per (arm, seed): ``hf-best``'s only at the search's best point (a search
    continued later may have moved it, leaving runs of the earlier best under that name)."""
    best = (data.get("search") or {}).get("best")
    keys = set()
    if best is not None and data.get("setup"):
        setup = _setup(**data["setup"])
        arm = arms(setup, hf_best=best)["hf-best"]
        keys = {settings_key(arm, seed, setup) for seed in range(100)}
    out = {}
    for r in data["runs"].values():
        if r.get("arm") not in ARM_ORDER or (r["arm"] == "hf-best" and keys and r["key"] not in keys):
            continue
        out[(r["arm"], r["seed"])] = r
    return list(out.values())


def write_report(ledger: Ledger, out: Path, name: str) -> dict[str, Any]:
    runs = arm_runs(ledger.data)
    summary = report(runs)
    search = ledger.data.get("search") or {}
    not_run = ledger.data.get("not_run") or []
    ledger.data["summary"] = summary
    ledger.save()
    env = ledger.data.get("environment") or {}
    text = (f"Machine: {env.get('cpu_count', '?')}-core x86_64 CPU, one run at a time, 1 torch thread; torch "
            f"{env.get('torch', '?')}, transformers {env.get('transformers', '?')}.\n"
            f"Command: `{ledger.data.get('command', 'python -m benchmarks.nanogpt')}`\n\n" + markdown(summary))
    if not_run:
        text += "\nNot run: " + ", ".join(f"{a} seed {s}" for a, s in not_run) + ".\n"
    text += "\n" + search_markdown(search)
    if search.get("not_run"):
        text += "\nSearch points not run: " + "; ".join(search["not_run"]) + ".\n"
    text += "\nSamples (200 characters after a newline, seed 1337, temperature 0.8, seed 0 of each arm):\n"
    for a in summary["arms"]:
        r = next((r for r in runs if r["arm"] == a and r["seed"] == 0), None)
        if r is not None:
            text += f"\n{a}:\n\n```text\n{r['sample']}\n```\n"
    (out / f"{name}.md").write_text(text)
    if runs:
        plot(runs, summary, out / f"{name}.png")
        page = PAGE if out.resolve() == RESULTS.resolve() and name == "nanogpt" else out / f"{name}_page.md"
        page.write_text(page_text(ledger.data))
    print(text, flush=True)
    return summary


# --- the docs page: written from the JSON, so every figure on it is the results' ---------------------
PAGE = ROOT / "docs" / "benchmarks" / "nanogpt.md"


def _x(v: float, word: str, gain: str) -> str:
    """``0.42x the tokens (2.4x fewer)``; "not reached" when the arm never got there."""
    if v is None or not math.isfinite(v):
        return "not reached"
    return f"{v:.2f}x {word} ({1 / v:.1f}x {gain})" if v < 1 else f"{v:.2f}x {word}"


def _cell(v: Any, digits: int = 3) -> str:
    if isinstance(v, float) and math.isfinite(v) and v >= 1000:
        return f"{v / 1e6:.3f}M" if v >= 1e5 else f"{v:,.0f}"
    return fmt(v, digits)


SCHEDULES = {"cosine10": "cosine to 10% of the peak", "linear0": "linear to 0",
             "wsd-linear": "flat, then linear to 0 over the last 20%"}


def describe(config: dict[str, Any]) -> str:
    """A search point in words.

    >>> describe({"lr": 2e-3, "emb": 4.0, "schedule": "linear0", "beta2": 0.99, "warmup": 100, "wd": 0.1})
    "peak lr 0.002, the embeddings' lr x4 (lr_multipliers), linear to 0, beta2 0.99, 100 warmup steps, weight decay 0.1"
    """
    emb = (f"the embeddings' lr x{config['emb']:g} (lr_multipliers)" if config["emb"] != 1.0 else
           "one lr for all parameters")
    return (f"peak lr {config['lr']:g}, {emb}, {SCHEDULES[config['schedule']]}, beta2 {config['beta2']:g}, "
            f"{config['warmup']} warmup steps, weight decay {config['wd']:g}")


def recipe_words(description: str) -> str:
    """The fasttrain arm's recipe settings (as its run recorded them: ``key value, ...``) in words."""
    pairs = dict(p.split(" ", 1) for p in description.split(": ", 1)[1].split(", "))
    g = {k: float(v) for k, v in pairs.items() if re.fullmatch(r"[\d.e-]+", v)}
    return (f"FastTrainer with the techniques of `{display_path(RECIPE)}`. Muon on the hidden matrices and AdamW on "
            f"the rest at lr {g['learning_rate']:g}, beta2 {g['adam_beta2']:g}, weight decay {g['weight_decay']:g}, "
            f"warmup {g['warmup_steps']:.3g} of the run, {pairs['lr_decay']} to {g['min_lr_ratio']:.0%} of the peak, "
            f"clip {g['max_grad_norm']:g}. A divergence guard, an EMA of the weights (decay {g['ema_decay']:g}) "
            f"evaluated and kept, and a sequence-length warmup from {g['seq_len_warmup_min']:g} characters over "
            f"{g['seq_len_warmup_fraction']:.0%} of the run")


def back_to_back(runs: list[dict[str, Any]], peer: float = PEER_LOSS):
    """``(seed, {arm: (seconds to the peer's loss, ratio to hf-nanogpt's, ms per step)})`` for the lowest seed above
    0 that every arm ran (those runs follow one another in the plan); None when there is none."""
    from benchmarks._harness.lm import crossing

    by = {(r["arm"], r["seed"]): r for r in runs}
    present = [a for a in ARM_ORDER if any(r["arm"] == a for r in runs)]
    for seed in sorted({r["seed"] for r in runs} - {0}):
        if "hf-nanogpt" in present and all((a, seed) in by for a in present):
            base = crossing(by[("hf-nanogpt", seed)]["curve"], peer, "seconds")
            rows = {}
            for a in present:
                r = by[(a, seed)]
                sec = crossing(r["curve"], peer, "seconds")
                rows[a] = (sec, sec / base if 0 < base < math.inf else math.nan,
                           1000 * r["train_seconds"] / max(r["curve"][-1]["step"], 1))
            return seed, rows
    return None


def page_text(data: dict[str, Any]) -> str:
    """The study's docs page from its JSON (``data``: the ledger): the claim, the setup, the tables, the command,
    the samples, the search log folded."""
    summary, setup, text = data["summary"], data["setup"], data["text"]
    arms_ = summary["arms"]
    peer = data["peer"]["loss"]
    runs = arm_runs(data)
    seeds = {a: r["seeds"] for a, r in arms_.items()}
    lines = ["# nanoGPT on tinyshakespeare", ""]
    lines += ["nanoGPT's README gives a CPU recipe for a character-level GPT on Shakespeare. This study runs that "
              "recipe in a plain `transformers.Trainer`, the Trainer's options searched at the same budget, and the "
              "package's recipe, on the same characters and the same machine.", ""]
    pairs = back_to_back(runs, peer)
    claim = ["**Result.**"]
    for arm in ("fasttrain", "fasttrain-budget"):
        r = arms_.get(arm)
        if r is None or "hf-nanogpt" not in arms_:
            continue
        name = "The package's recipe (`fasttrain`)" if arm == "fasttrain" else "With `budget_aware` (`fasttrain-budget`) it"
        if math.isfinite(r["tokens_to_peer"]):
            claim.append(f"{name} reaches nanoGPT's {peer:.4f} in {_x(r['tokens_ratio_peer'], 'the characters', 'fewer')}"
                         " of `hf-nanogpt`.")
            if pairs and arm in pairs[1] and math.isfinite(pairs[1][arm][1]):
                claim.append(f"Run back to back with it (seed {pairs[0]}), it takes "
                             f"{_x(pairs[1][arm][1], 'the training time', 'less')}.")
        else:
            claim.append(f"{name} does not reach nanoGPT's {peer:.4f} within the budget.")
        if "hf-best" in arms_ and arm == "fasttrain":
            claim.append(f"It reaches the searched `hf-best`'s final loss, {summary['targets']['hf-best']:.4f}, in "
                         f"{_x(r['tokens_ratio_hf-best'], 'the characters', 'fewer')} of `hf-best`'s run."
                         if math.isfinite(r["tokens_to_hf-best"]) else
                         f"It does not reach the searched `hf-best`'s final loss, {summary['targets']['hf-best']:.4f}.")
    if "hf-nanogpt" in arms_:
        n = arms_["hf-nanogpt"]
        claim.append(f"`hf-nanogpt` itself ends at {n['final_eval_loss']:.4f}, "
                     + ("reaching nanoGPT's own figure" if n["final_eval_loss"] <= peer else
                        f"{n['final_eval_loss'] - peer:+.4f} from nanoGPT's own figure") + ".")
    one = [a for a, k in seeds.items() if k == 1]
    if one:
        claim.append(f"One seed only for {', '.join(f'`{a}`' for a in one)}: the rest did not run in the time given.")
    lines += [" ".join(claim), ""]
    lines += [f"**Setup.** `input.txt` of tinyshakespeare: {text['chars']:,} characters, {text['vocab']} distinct. "
              "The first 90% train and the last 10% validate, as nanoGPT's `prepare.py` splits them. "
              f"GPT-2 with {setup['n_layer']} layers, {setup['n_head']} heads, width {setup['n_embd']}, block "
              f"{setup['block_size']}, dropout 0. Every arm trains {setup['max_steps']:,} steps' worth of "
              f"{setup['batch_size']} x {setup['block_size']} characters "
              f"({setup['max_steps'] * setup['batch_size'] * setup['block_size'] / 1e6:.3f}M).", ""]
    v = next(iter(runs))["final"] if runs else {"windows_chars": 0, "every_char_count": 0}
    windows = v["windows_chars"] // setup["block_size"]
    lines += [f"**Loss.** The mean over the {windows:,} validation windows of {setup['block_size']} characters, each "
              f"position predicting the next. That scores {v['windows_chars']:,} of the split's "
              f"{v['every_char_count'] + 1:,} characters: all but the first and the last "
              f"{v['every_char_count'] - v['windows_chars']}. nanoGPT's {peer:.4f} is by this rule (its own "
              f"20-batch estimate said {data['peer']['estimate']:.4f}). The column *every character* scores the final "
              f"model on all {v['every_char_count']:,} characters after the first.", ""]
    lines += ["**Arms.**", ""]
    for a in arms_:
        r0 = next(r for r in runs if r["arm"] == a)
        shown = re.sub(r"\d+\.\d{5,}", lambda m: f"{float(m.group()):.4g}", r0["description"])
        if a == "hf-best":
            shown = "`transformers.Trainer` at the search's best point: " + describe(data["search"]["best"])
        elif a.startswith("fasttrain"):
            shown = recipe_words(next(r for r in runs if r["arm"] == "fasttrain")["description"]) + (
                " With `budget_aware: true`, which sets the optimizer's settings for the run's length"
                if a == "fasttrain-budget" else "")
        lines.append(f"- `{a}`: {shown}.")
    lines += ["", "Times are training seconds, evaluation excluded, one run at a time with 1 torch thread on a "
              "2-core x86_64 CPU. They compare only within this run. Other jobs shared the machine and its load "
              "changed between runs, so a time ratio also carries that change; the characters do not. The ms per "
              "step of each seed show how much.", ""]

    def row(a, cols):
        return "| " + " | ".join([f"`{a}`", *cols]) + " |"

    lines += [f"## To nanoGPT's {peer:.4f}", "",
              "| arm | seeds | final loss | every character | characters to it | vs `hf-nanogpt` | seconds to it "
              "| vs `hf-nanogpt` | seeds reaching | ms per step |", "|---|---|---|---|---|---|---|---|---|---|"]
    for a, r in arms_.items():
        lines.append(row(a, [str(r["seeds"]), f"{r['final_eval_loss']:.4f}", f"{r['every_char_loss']:.4f}",
                             _cell(r["tokens_to_peer"]), _cell(r["tokens_ratio_peer"]), _cell(r["seconds_to_peer"]),
                             _cell(r["time_ratio_peer"]), f"{r['reached_peer']}/{r['seeds']}",
                             _cell(r["ms_per_step"])]))
    if "hf-nanogpt" in summary["targets"]:
        lines += ["", f"## To `hf-nanogpt`'s final loss, {summary['targets']['hf-nanogpt']:.4f}", "",
                  "The ratios are to `hf-nanogpt`'s whole run, which ends at that loss.", "",
                  "| arm | characters to it | vs `hf-nanogpt` | seconds to it | vs `hf-nanogpt` | seeds reaching "
                  "| ms per step, by seed |", "|---|---|---|---|---|---|---|"]
        for a, r in arms_.items():
            by_seed = ", ".join(f"{1000 * x['train_seconds'] / max(x['curve'][-1]['step'], 1):.0f}"
                                for x in sorted((x for x in runs if x["arm"] == a), key=lambda x: x["seed"]))
            lines.append(row(a, [_cell(r["tokens_to_hf-nanogpt"]), _cell(r["tokens_ratio_hf-nanogpt"]),
                                 _cell(r["seconds_to_hf-nanogpt"]), _cell(r["time_ratio_hf-nanogpt"]),
                                 f"{r['reached_hf-nanogpt']}/{r['seeds']}", by_seed]))
    if "hf-best" in summary["targets"]:
        lines += ["", f"## To `hf-best`'s final loss, {summary['targets']['hf-best']:.4f}", "",
                  "The ratios are to `hf-best`'s whole run, which ends at that loss.", "",
                  "| arm | characters to it | vs `hf-best` | seeds reaching |", "|---|---|---|---|"]
        for a, r in arms_.items():
            lines.append(row(a, [_cell(r["tokens_to_hf-best"]), _cell(r["tokens_ratio_hf-best"]),
                                 f"{r['reached_hf-best']}/{r['seeds']}"]))
    if pairs:
        seed, rows = pairs
        lines += ["", f"## Seed {seed} of each arm, back to back", "",
                  f"These runs ran one after another, under about the same load: their training seconds to "
                  f"{peer:.4f} compare most fairly.", "",
                  f"| arm | seconds to {peer:.4f} | vs `hf-nanogpt` | ms per step |", "|---|---|---|---|"]
        for a, (sec, ratio, ms) in rows.items():
            lines.append(row(a, [_cell(sec), _cell(ratio), _cell(ms)]))
    lines += ["", "Medians over the seeds. A seed that never reaches a loss counts as never, so the median can be "
              "*not reached*. Each crossing is interpolated between the two evaluations around it, one every "
              f"{setup['eval_steps']} steps. The ms per step are training seconds over optimizer steps; the recipe's "
              "short early rows make its steps more and cheaper.", "",
              "![eval loss against characters and seconds](../results/nanogpt.png)", ""]
    not_run = data.get("not_run") or []
    if not_run:
        lines += ["Not run in the time given: " + ", ".join(f"`{a}` seed {s}" for a, s in not_run) + ".", ""]
    lines += [f"Command: `{data['command']}`, where `<input.txt>` is tinyshakespeare's `input.txt` (sha256 "
              f"`{text['sha256'][:16]}...`). Raw table: [results/nanogpt.md](../results/nanogpt.md).", ""]
    lines += ["## Samples", "", f"Seed 0 of each arm, {SAMPLE_CHARS} characters after a newline, sampling seed "
              f"{SAMPLE_SEED}, temperature {SAMPLE_TEMPERATURE}.", ""]
    for a in arms_:
        r = next((r for r in runs if r["arm"] == a and r["seed"] == 0), None)
        if r is not None:
            lines += [f"`{a}`:", "", "```text", r["sample"].rstrip("\n"), "```", ""]
    search = data.get("search") or {}
    lines += ['??? note "The hf-best search (seed 0 per point)"',
              f"    From `hf-nanogpt`'s settings, one knob at a time; a value is kept where it lowers the final loss "
              f"by more than {search.get('noise', NOISE)}. `emb`: the embeddings' lr multiplier (with the tied head); "
              "`schedule`: " + "; ".join(f"`{k}` {v}" for k, v in SCHEDULES.items()) + ".", ""]
    spreads = {a: max(r["final_eval_loss"] for r in runs if r["arm"] == a)
               - min(r["final_eval_loss"] for r in runs if r["arm"] == a) for a in arms_ if seeds[a] > 1}
    if spreads:
        a = max(spreads, key=spreads.get)
        lines += [f"    Seeds of one setting end up to {spreads[a]:.4f} apart here (`{a}`), more than that margin: "
                  "a step kept or refused by less is a call within the noise.", ""]
    lines += ["    " + ln for ln in search_markdown(search).splitlines()]
    if search.get("not_run"):
        lines += ["", "    Next point, not run in the time given: " + "; ".join(p.replace(": ", " stage, ") for p in search["not_run"])
                  + "."]
    return "\n".join(lines).rstrip() + "\n"


# --- the command --------------------------------------------------------------------------------------
def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--text", default=None, help="tinyshakespeare's input.txt (any UTF-8 text file: its characters "
                   "are the vocabulary); needed unless --report")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (the search runs seed 0)")
    p.add_argument("--search-points", type=int, default=None,
                   help="stop the hf-best search after this many runs (default: the whole walk)")
    p.add_argument("--stop-at", default=None, metavar="HH:MM",
                   help="UTC time: start no run that would end after it (estimated from the runs so far)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--quick", action="store_true", help="tiny model and steps (the test suite runs it)")
    p.add_argument("--report", action="store_true", help="only rebuild the tables and the plot from the JSON")
    p.add_argument("--out", default=str(RESULTS), help="folder for <name>.json, .md and .png")
    p.add_argument("--name", default="nanogpt", help="basename of the output files")
    return p


def _deadline(stop_at: Optional[str]) -> Optional[float]:
    if stop_at is None:
        return None
    try:
        hh, mm = (int(x) for x in stop_at.split(":"))
        now = dt.datetime.now(dt.timezone.utc)
        at = now.replace(hour=hh, minute=mm, second=0, microsecond=0)
    except ValueError:
        raise UsageError(f"--stop-at: {stop_at!r}: a UTC time HH:MM") from None
    return time.time() + (at - now).total_seconds()


def load_data(text: str, block_size: int) -> dict[str, Any]:
    """The tokenizer, window rows and raw validation ids of ``text`` (the package's ``tokenizer: char``)."""
    from hf_fasttrain import DataArguments
    from hf_fasttrain.data.chars import split_ids
    from hf_fasttrain.data.prepare import prepare_lm_data
    import numpy as np

    prepared = prepare_lm_data(DataArguments(dataset=text, tokenizer="char", block_size=block_size))
    tok = prepared.tokenizer
    raw = Path(text).read_text(encoding="utf-8")
    ids = np.array(tok(raw)["input_ids"], dtype=np.int64)
    return {"tokenizer": tok, "lm": prepared.lm, "val_ids": split_ids(ids)[1], "summary": prepared.summary(),
            "chars": len(raw), "vocab": len(tok)}


def main(argv=None) -> dict[str, Any]:
    ns = make_parser().parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / f"{ns.name}.json")
    if ns.report:
        if not ledger.data["runs"]:
            raise UsageError(f"--report: {display_path(ledger.path)} holds no runs; run the study first")
        return write_report(ledger, out, ns.name)
    if ns.text is None:
        raise UsageError("--text: the text file to train on (tinyshakespeare's input.txt) is needed unless --report")
    if not Path(ns.text).is_file():
        raise UsageError(f"--text: {ns.text!r} is not a file")
    if ns.seeds < 1 or ns.threads < 1:
        raise UsageError("--seeds and --threads must be >= 1")
    deadline = _deadline(ns.stop_at)
    import torch

    torch.set_num_threads(ns.threads)
    digest = hashlib.sha256(Path(ns.text).read_bytes()).hexdigest()
    base = dict(QUICK_SETUP if ns.quick else SETUP)
    data = load_data(ns.text, base["block_size"])
    setup = _setup(**{**base, "vocab_size": data["vocab"], "corpus": f"text-sha256:{digest[:16]}"})
    env = machine_info()
    ledger.data.update(environment=env, setup=dataclasses.asdict(setup), text={"sha256": digest, "chars": data["chars"],
                       "vocab": data["vocab"], "data": data["summary"].replace(ns.text, display_path(ns.text))},
                       peer={"loss": PEER_LOSS, "estimate": PEER_ESTIMATE},
                       command=display_command("nice -n 10 python -m benchmarks.nanogpt",
                                               argv if argv is not None else sys.argv[1:]))
    runs = ledger.data["runs"]
    not_run: list[tuple[str, int]] = []

    def seconds_per_run() -> float:
        done = [r["process_seconds"] + 10 for r in runs.values() if r.get("setup_key") == setup.corpus]
        return statistics.median(done) if done else 0.0

    def run(arm, seed: int, label: str, work: Path, **extra) -> Optional[dict[str, Any]]:
        """The run of ``arm`` at ``seed``, trained unless the ledger holds it; a run trained under another label
        (hf-nanogpt's is the search's start) is filed under this one too."""
        key = settings_key(arm, seed, setup)
        if key in runs:
            r = runs[key]
            print(f"[nanogpt] {label} seed {seed}: saved run ({r['final_eval_loss']:.4f}), skipped", flush=True)
        elif deadline is not None and time.time() + seconds_per_run() > deadline:
            print(f"[nanogpt] {label} seed {seed}: not started (--stop-at {ns.stop_at})", flush=True)
            return None
        else:
            r = train_one(arm, seed, setup, data, work)
            r.update(arm=label, seed=seed, key=key, setup_key=setup.corpus, description=arm.description,
                     finished=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **extra)
            runs[key] = r
            print(f"[nanogpt] {label} seed {seed}: final loss {r['final_eval_loss']:.4f} (every char "
                  f"{r['final']['every_char_loss']:.4f}), {r['train_seconds']:.1f} s training, "
                  f"{r['process_seconds']:.0f} s in all", flush=True)
        if r["arm"] != label and f"{key}|{label}" not in runs:
            runs[f"{key}|{label}"] = {**r, "arm": label, "description": arm.description, "same_run_as": key}
        ledger.save()
        return r

    with tempfile.TemporaryDirectory(prefix="nanogpt-") as tmp:
        work = Path(tmp)
        arm_set = arms(setup)
        for name in ("hf-nanogpt", "fasttrain"):
            if run(arm_set[name], 0, name, work) is None:
                not_run.append((name, 0))
        # the search from hf-nanogpt's settings (its seed-0 run is the start), seed 0 per point
        scale = setup.max_steps / SETUP["max_steps"]
        log: list[dict[str, Any]] = []
        walk = staged_search(START, log=log)
        pending = None
        points = 0
        try:
            stage, config = next(walk)
            while True:
                arm = hf_config_arm(f"hf-best@{_config_name(config)}", config, setup.max_steps, scale)
                fresh = settings_key(arm, 0, setup) not in runs
                r = None  # --search-points counts the points after the start, saved or not: a rerun stops where it did
                if not (fresh and ns.search_points is not None and points >= ns.search_points):
                    r = run(arm, 0, "hf-nanogpt" if config == START else "hf-best-search", work, config=config,
                            stage=stage)
                if r is None:
                    pending = f"{stage}: {_config_name(config)}"
                    break
                points += config != START
                stage, config = walk.send(r["final_eval_loss"])
        except StopIteration:
            pass
        kept = [e for e in log if e["kept"]]
        best = kept[-1]["config"] if kept else START
        ledger.data["search"] = {"start": START, "stages": [[k, v] for k, v in STAGES], "noise": NOISE, "log": log,
                                 "best": best, "complete": pending is None, "not_run": [pending] if pending else []}
        arm_set = arms(setup, hf_best=best)
        if kept:  # the winner's seed-0 run is the search's
            run(arm_set["hf-best"], 0, "hf-best", work)
        for name, seed in plan(ns.seeds):
            if run(arm_set[name], seed, name, work) is None:
                not_run.append((name, seed))
    ledger.data["not_run"] = not_run
    ledger.save()
    return write_report(ledger, out, ns.name)


if __name__ == "__main__":
    run_cli(main)
