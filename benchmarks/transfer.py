#!/usr/bin/env python
"""Hyperparameter transfer across width: does each optimizer's best peak lr stay put from width 64 to 512?

    nice -n 10 python -m benchmarks.transfer --arms adamw,adamw-emb,muon --widths 64,128,256   # a screen
    nice -n 10 python -m benchmarks.transfer                                  # every arm, every width
    nice -n 10 python -m benchmarks.transfer --text /path/to/tinyshakespeare/input.txt     # natural text
    nice -n 10 python -m benchmarks.transfer --arms adamw-mup,muon-mup --widths 64,128 --lengths 0.25,1,4
    python -m benchmarks.transfer --report                                    # tables from the JSON only
    python -m benchmarks.transfer tune-and-train --help                      # tune at a proxy width, train wide

The model is a 2-layer GPT-2 with a fixed head size of 32 (``n_head = width / 32``), widths 64, 128, 256 and 512,
trained on the same tokens at every width (``--steps`` x 8 rows x 64 tokens; the default 240 steps are 122,880
tokens), with hf-tuned's settings: 2% warmup, cosine to 10%, weight decay 0.1, beta2 0.95, clip 1.0. The arms:

- ``adamw``: AdamW, the standard parameterization.
- ``adamw-emb``: AdamW with the embeddings' lr x m (``lr_multipliers={"embedding": m}``), m = width / 64.
- ``adamw-mup``: AdamW with ``parameterization: mup`` (base width 64).
- ``muon``: the package's Muon as shipped (its default ``adjust_lr_fn``, AdamW's update size).
- ``muon-mup``: Muon with ``parameterization: mup`` (base width 64: the spectral scale on hidden matrices).

Each arm's lrs lie on one factor-2 grid. At the base width three lrs run around the arm's starting lr; at each
wider width three run around the previous width's best (every arm at one width before the next); while the best
is at an edge, the grid grows by one lr that way (at most ``--max-extend`` times). Every width also runs the base width's best lr (the carried lr) when its grid
lacks it. Reported per width: the best lr (the vertex of a parabola in log2 lr through the best grid point and its
neighbours), the drift in octaves from the base width, and the loss at the carried lr in % above the best.

Each run is saved into ``<out>/<name>.json`` as it ends, keyed by its settings: rerun the command to continue.
Torch runs on ``--threads`` threads (default 1), one run at a time. ``--report`` rebuilds ``<name>.md``,
``<name>.png`` and the generated part of the study page (docs/benchmarks/transfer.md) from the JSON without
training; each study run ends with the same report.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.transfer [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import dataclasses
import hashlib
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from benchmarks._harness import RESULTS, ROOT, UsageError, display_command, display_path, fmt, machine_info, run_cli
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import HF_TUNED, Arm, Setup, run_key
from benchmarks._harness.sweeps import fit_line, interpolated_best_lr

__all__ = ["HEAD_SIZE", "WIDTHS", "ARM_NAMES", "START_LR", "width_setup", "transfer_arm", "grid_losses",
           "best_lr", "drift_octaves", "carried_loss_pct", "summarise", "main"]

HEAD_SIZE = 32  # n_head = width / 32: the attention scale 1/sqrt(32) is the same at every width
WIDTHS = (64, 128, 256, 512)
STEPS = 240  # x 8 rows x 64 tokens = 122,880 tokens at every width
BATCH = 8  # rows per step, and BLOCK tokens per row: 240 steps for the tokens a 2-core CPU trains in the time
BLOCK = 64  # (at 120 steps of 16 x 128, width 64 is still on its unigram plateau)
EVALS = 2  # evaluations per run after the one at the start (the final one is what the study reads)
MAX_EXTEND = 4
ARM_NAMES = ("adamw", "adamw-emb", "adamw-mup", "muon", "muon-mup")
# the first grid's centre at the base width: hf-tuned's AdamW lr doubled for a run of 240 short steps (shorter runs
# take larger lrs), the recipe's Muon lr, and twice that for Muon's spectral scale (at width 64 about half the
# shipped scale 0.2 sqrt(max(A, B)) on these matrices)
START_LR = {"adamw": 4e-3, "adamw-emb": 4e-3, "adamw-mup": 4e-3, "muon": 1.6e-2, "muon-mup": 3.2e-2}
MUP_ARMS = ("adamw-mup", "muon-mup")

# The quick setup (tests, smoke runs): the harness's tiny model at widths 16 and 32, head size 8
QUICK_WIDTHS = (16, 32)
QUICK_HEAD_SIZE = 8


# --- Setup and arms ---------------------------------------------------------------------------------------
def width_setup(width: int, steps: int = STEPS, corpus: str = "python", quick: bool = False) -> Setup:
    """The harness's setup at ``width`` (``n_head = width / head size``), ``steps`` long, on ``corpus``."""
    head = QUICK_HEAD_SIZE if quick else HEAD_SIZE
    if width % head:
        raise UsageError(f"--widths: {width} is not a multiple of the head size {head}")
    base = (Setup(n_layer=2, n_head=2, n_embd=32, vocab_size=300, block_size=32, batch_size=8, eval_rows=32,
                  max_corpus_files=40) if quick else Setup(batch_size=BATCH, block_size=BLOCK))
    return dataclasses.replace(base, n_embd=width, n_head=width // head, max_steps=steps,
                               eval_steps=max(1, steps // EVALS), corpus=corpus)


def transfer_arm(name: str, width: int, lr: float, base_width: int) -> Arm:
    """The FastTrainer arm ``name`` at ``width`` and peak ``lr`` (hf-tuned's settings otherwise)."""
    m = width / base_width
    args: dict[str, Any] = {**HF_TUNED, "learning_rate": lr}
    if name in ("adamw", "adamw-emb", "adamw-mup"):
        args["optimizer"] = "adamw"
    elif name in ("muon", "muon-mup"):
        args["optimizer"] = "muon"
    else:
        raise UsageError(f"--arms: unknown arm {name!r}; known: {', '.join(ARM_NAMES)}")
    if name == "adamw-emb":
        args["optimizer_kwargs"] = {"lr_multipliers": {"embedding": m}}
    if name in MUP_ARMS:
        args["optimizer_kwargs"] = {"parameterization": "mup", "base_width": base_width}
    return Arm(f"{name}@w{width}", f"{name} at width {width}, lr {lr:g}", fast=True, args=args)


# --- The report's math (pure) ------------------------------------------------------------------------------
def _finite(x: float) -> float:
    return x if math.isfinite(x) else math.inf


def grid_losses(runs: Iterable[dict[str, Any]]) -> dict[float, float]:
    """lr -> mean final eval loss over the seeds run at that lr (a diverged run, NaN, counts as infinite)."""
    by_lr: dict[float, list[float]] = {}
    for r in runs:
        by_lr.setdefault(float(r["lr"]), []).append(_finite(float(r["final_eval_loss"])))
    return {lr: statistics.fmean(v) for lr, v in sorted(by_lr.items())}


def best_lr(losses: dict[float, float]) -> Optional[float]:
    """The vertex of the parabola in log2 lr through the best grid lr and its two neighbours (clipped to them);
    the best grid lr itself when a neighbour diverged; None when the best is at an edge of the grid."""
    lrs = sorted(losses)
    if len(lrs) < 3:
        return None
    best = min(lrs, key=lambda lr: losses[lr])
    i = lrs.index(best)
    if i in (0, len(lrs) - 1) or not math.isfinite(losses[best]):
        return None
    if not (math.isfinite(losses[lrs[i - 1]]) and math.isfinite(losses[lrs[i + 1]])):
        return best
    return interpolated_best_lr({lr: losses[lr] for lr in lrs[i - 1:i + 2]})


def drift_octaves(base_lr: Optional[float], wide_lr: Optional[float]) -> Optional[float]:
    """log2(wide / base): how many factors of 2 the best lr moved; None when either is unknown."""
    if base_lr is None or wide_lr is None:
        return None
    return math.log2(wide_lr / base_lr)


def carried_loss_pct(losses: dict[float, float], carried_lr: Optional[float]) -> Optional[float]:
    """The loss at ``carried_lr`` in % above the grid's lowest loss; None when it was not run."""
    if carried_lr is None or carried_lr not in losses:
        return None
    best = min(losses.values())
    return 100.0 * (losses[carried_lr] / best - 1.0)


def _group(runs: Iterable[dict[str, Any]], *fields: str) -> dict[tuple, list[dict[str, Any]]]:
    out: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        out.setdefault(tuple(r[f] for f in fields), []).append(r)
    return out


def summarise(runs: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """Per corpus, run length and arm: each width's grid, best lrs, drift from the base width and the carried-lr
    loss; per corpus and arm over lengths: the exponent of the best lr against the tokens."""
    runs = list(runs)
    out: dict[str, Any] = {}
    for (corpus, length, arm), rs in sorted(_group(runs, "corpus", "length", "arm").items()):
        widths = sorted({r["width"] for r in rs})
        base = widths[0]
        base_losses = grid_losses(r for r in rs if r["width"] == base)
        carried = min(base_losses, key=base_losses.get) if base_losses else None
        base_best = best_lr(base_losses)
        rows = {}
        for w in widths:
            wr = [r for r in rs if r["width"] == w]
            losses = grid_losses(wr)
            grid_best = min(losses, key=losses.get)
            fitted = best_lr(losses)
            rows[str(w)] = {
                "final_eval_loss_by_lr": {f"{lr:g}": loss for lr, loss in losses.items()},
                "seeds": len({r["seed"] for r in wr}), "best_grid_lr": grid_best, "best_loss": losses[grid_best],
                "best_lr": fitted, "best_at_edge": fitted is None,
                "drift_octaves": drift_octaves(base_best, fitted),
                "carried_lr": carried, "carried_loss_pct": carried_loss_pct(losses, carried),
                "tokens": wr[0]["tokens"], "train_seconds": statistics.median(r["train_seconds"] for r in wr),
            }
        widest = str(widths[-1])
        out.setdefault(corpus, {}).setdefault(f"{length:g}", {})[arm] = {
            "base_width": base, "widest": widths[-1], "widths": rows,
            "drift_octaves": rows[widest]["drift_octaves"] if len(widths) > 1 else None,
            "carried_loss_pct": rows[widest]["carried_loss_pct"] if len(widths) > 1 else None}
    lengths: dict[str, Any] = {}
    for corpus, by_length in out.items():
        for arm in sorted({a for arms in by_length.values() for a in arms}):
            for w in sorted({int(w) for arms in by_length.values() if arm in arms for w in arms[arm]["widths"]}):
                pts = [(arms[arm]["widths"][str(w)]["tokens"], arms[arm]["widths"][str(w)]["best_lr"])
                       for arms in by_length.values() if arm in arms and str(w) in arms[arm]["widths"]]
                pts = sorted((t, lr) for t, lr in pts if lr is not None)
                if len(pts) < 2:
                    continue
                line = fit_line([math.log2(t) for t, _ in pts], [math.log2(lr) for _, lr in pts])
                lengths.setdefault(corpus, {}).setdefault(arm, {})[str(w)] = {
                    "best_lr_by_tokens": {str(t): lr for t, lr in pts}, "exponent": line["slope"] if line else None}
    return {"transfer": out, "run_length": lengths}


# --- The sweep -------------------------------------------------------------------------------------------------
class ArmSweep:
    """One arm's walk over the widths, one width at a time (the first is the base): three grid lrs (``start_lr`` x
    2^k) around the previous width's best (the base width: around ``start_lr``), grown at an edge while the best is
    there, plus the base width's best (carried) lr. ``run(width, lr)`` returns the loss (the mean over seeds),
    trained or read back."""

    def __init__(self, start_lr: float, run: Callable[[int, float], float], max_extend: int = MAX_EXTEND):
        self.start_lr, self.run, self.max_extend = start_lr, run, max_extend
        self.centre, self.carried = 0, None

    def width(self, w: int) -> None:
        lr = lambda k: self.start_lr * 2.0 ** k  # noqa: E731
        losses = {k: self.run(w, lr(k)) for k in (self.centre - 1, self.centre, self.centre + 1)}
        for _ in range(self.max_extend):
            best = min(losses, key=losses.get)
            if not math.isfinite(losses[best]) or min(losses) < best < max(losses):
                break
            k = best + 1 if best == max(losses) else best - 1
            losses[k] = self.run(w, lr(k))
        if self.carried is not None and self.carried not in losses:
            losses[self.carried] = self.run(w, lr(self.carried))
        self.centre = min(losses, key=losses.get)
        if self.carried is None:
            self.carried = self.centre


def sweep_arm(widths: list[int], start_lr: float, run: Callable[[int, float], float],
              max_extend: int = MAX_EXTEND) -> None:
    """One arm over ``widths`` (:class:`ArmSweep`)."""
    sweep = ArmSweep(start_lr, run, max_extend)
    for w in widths:
        sweep.width(w)


class Study:
    """The ledger and the data: trains a run or reads it back by its key."""

    def __init__(self, ns: argparse.Namespace, ledger: Ledger):
        self.ns, self.ledger, self.trained = ns, ledger, 0
        self.corpus, self._data = corpus_name(ns.text), None

    def data(self, setup: Setup):
        if self._data is None:
            from hf_fasttrain import DataArguments
            from hf_fasttrain.data.front import prepare_data

            from benchmarks._harness.lm import data_arguments

            if self.ns.text:
                args = DataArguments(dataset=self.ns.text, vocab_size=setup.vocab_size, block_size=setup.block_size,
                                     max_eval_samples=setup.eval_rows)
            else:
                args = data_arguments(setup)
            self._data = prepare_data(args)
        return self._data

    def run(self, arm_name: str, width: int, lr: float, length: float, seed: int) -> dict[str, Any]:
        from benchmarks._harness.lm import run_arm

        steps = max(1, round(self.ns.steps * length))
        setup = width_setup(width, steps, self.corpus, self.ns.quick)
        arm = transfer_arm(arm_name, width, lr, self.ns.widths[0])
        key = run_key(arm, seed, setup)
        if key in self.ledger.data["runs"]:
            return self.ledger.data["runs"][key]
        tokenizer, lm = self.data(setup)
        with tempfile.TemporaryDirectory(prefix="transfer-") as work:
            r = run_arm(arm, seed, setup, tokenizer, lm, Path(work))
        r.update(arm=arm_name, corpus=self.corpus, length=length, width=width, lr=lr, steps=steps,
                 tokens=steps * setup.tokens_per_step, non_embedding_params=_non_embedding(width), key=key)
        self.ledger.data["runs"][key] = r
        self.ledger.save()
        self.trained += 1
        print(f"[transfer] {self.corpus} x{length:g} {arm_name:>9s} w{width:<4d} lr {lr:<9.3g} seed {seed}: "
              f"loss {r['final_eval_loss']:.4f}, {r['train_seconds']:.0f} s", flush=True)
        return r


def _non_embedding(width: int) -> int:
    return 2 * (12 * width * width + 13 * width) + 2 * width  # GPT-2 blocks (matrices, biases, norms) + final norm


def corpus_name(text: Optional[str]) -> str:
    """The corpus a run is keyed and reported by: ``python`` (the embedded corpus) or ``text:<folder>/<file>``."""
    if not text:
        return "python"
    path = Path(text)
    return f"text:{path.parent.name}/{path.name}"


# --- Report ------------------------------------------------------------------------------------------------
def _octaves(x: Optional[float]) -> str:
    return "n/a" if x is None else f"{x:+.2f}"


def _widths_of(arms: dict[str, Any]) -> list[int]:
    return sorted({int(w) for a in arms.values() for w in a["widths"]})


def best_lr_table(arms: dict[str, Any]) -> str:
    """One corpus and length: each arm's best lr per width, its drift and the carried-lr loss at the widest."""
    widths = _widths_of(arms)
    base, widest = widths[0], widths[-1]
    head = ["arm"] + [f"best lr, width {w}" for w in widths]
    if base != widest:
        head += [f"drift {base}->{widest} (octaves)", f"loss at width {base}'s lr, width {widest} (% above best)"]
    rows = []
    for arm, a in arms.items():
        cells = []
        for w in widths:
            row = a["widths"].get(str(w))
            if row is None:
                cells.append("not run")
            elif len(row["final_eval_loss_by_lr"]) < 3:
                cells.append(f"partial ({len(row['final_eval_loss_by_lr'])} lr)")
            elif row["best_lr"] is None:
                cells.append(f"edge ({row['best_grid_lr']:.3g})")
            else:
                cells.append(f"{row['best_lr']:.3g}")
        complete = a["widest"] == widest and a["base_width"] == base
        if complete and len(a["widths"][str(widest)]["final_eval_loss_by_lr"]) < 3:
            rows.append([arm, *cells, *(["partial", "partial"] if base != widest else [])])
            continue
        pct = a["carried_loss_pct"] if complete else None
        tail = [_octaves(a["drift_octaves"]) if complete else "not run",
                "not run" if not complete else ("n/a" if pct is None else f"{pct:.2f}")]
        rows.append([arm, *cells, *(tail if base != widest else [])])
    return _md(head, rows)


def best_loss_table(arms: dict[str, Any]) -> str:
    """One corpus and length: each arm's lowest final eval loss per width (what the width buys under each rule)."""
    widths = _widths_of(arms)
    rows = [[arm] + [f"{a['widths'][str(w)]['best_loss']:.3f}" if str(w) in a["widths"] else "not run" for w in widths]
            for arm, a in arms.items()]
    return _md(["arm"] + [f"best loss, width {w}" for w in widths], rows)


def search_log(arms: dict[str, Any]) -> str:
    """One corpus and length: the final eval loss at every lr run, per arm and width."""
    rows = []
    for arm, a in arms.items():
        for w, row in a["widths"].items():
            grid = ", ".join(f"{lr}: {loss:.4f}" + (" **" if float(lr) == row["best_grid_lr"] else "")
                             for lr, loss in row["final_eval_loss_by_lr"].items())
            rows.append([arm, w, grid, row["seeds"], f"{row['train_seconds']:.0f}"])
    return _md(["arm", "width", "lr: final eval loss (** the grid's best)", "seeds", "train s (median)"], rows)


def length_table(arms: dict[str, Any]) -> str:
    rows = []
    for arm, by_width in arms.items():
        for w, row in by_width.items():
            pts = ", ".join(f"{int(t):,}: {lr:.3g}" for t, lr in row["best_lr_by_tokens"].items())
            rows.append([arm, w, pts, "n/a" if row["exponent"] is None else f"{row['exponent']:+.2f}"])
    return _md(["arm", "width", "tokens per run: best lr", "exponent k (lr ~ tokens^k)"], rows)


def length_findings(arms: dict[str, Any]) -> list[str]:
    """One sentence per arm: its exponent at each width, and whether the best lr moves one way with the tokens."""
    lines = []
    for arm, by_width in arms.items():
        ks = ", ".join(("n/a" if row["exponent"] is None else f"{row['exponent']:+.2f}") + f" at width {w}"
                       for w, row in by_width.items())
        steps = [math.copysign(1, b - a) for row in by_width.values() if len(row["best_lr_by_tokens"]) >= 3
                 for a, b in zip(list(row["best_lr_by_tokens"].values()), list(row["best_lr_by_tokens"].values())[1:])]
        if steps and all(x < 0 for x in steps):
            trend = "its best lr falls at every longer run"
        elif steps and all(x > 0 for x in steps):
            trend = "its best lr rises at every longer run"
        elif steps:
            trend = "its best lr does not move one way with the tokens, so this grid fixes no exponent"
        else:
            trend = "two lengths only"
        lines.append(f"`{arm}`: k = {ks}; {trend}.")
    return lines


def _tokens(arms: dict[str, Any]) -> int:
    return next(iter(next(iter(arms.values()))["widths"].values()))["tokens"]


def tables(summary: dict[str, Any]) -> str:
    """The Markdown tables of a summary: per corpus and length, the best lr per width and the drift, and the loss at
    every lr; then the run-length exponents."""
    parts = []
    for corpus, by_length in summary["transfer"].items():
        for length, arms in by_length.items():
            parts.append(f"Corpus {corpus}, {_tokens(arms):,} tokens per run ({length}x):\n\n" + best_lr_table(arms))
            parts.append(f"Final eval loss at each peak lr (corpus {corpus}, {length}x):\n\n" + search_log(arms))
    for corpus, arms in summary["run_length"].items():
        parts.append(f"Best lr against the tokens per run (corpus {corpus}):\n\n" + length_table(arms))
    return "\n\n".join(parts) + "\n"


def _md(head: list[str], rows: list[list[Any]]) -> str:
    from benchmarks._harness import markdown_table

    return markdown_table(head, rows)


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(c, length, arms) for c, by_length in summary["transfer"].items() for length, arms in by_length.items()]
    if not panels:
        return
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), squeeze=False)
    for ax, (corpus, length, arms) in zip(axes[0], panels):
        for arm, a in arms.items():
            ws = [int(w) for w, row in a["widths"].items() if row["best_lr"] is not None]
            ax.plot(ws, [a["widths"][str(w)]["best_lr"] for w in ws], marker="o", label=arm)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_xlabel("width")
        ax.set_ylabel("best peak lr (parabola in log2 lr)")
        ax.set_title(f"{corpus}, {length}x tokens")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PAGE = ROOT / "docs" / "benchmarks" / "transfer.md"
GAIN_NAME = "transfer_gain.json"  # the gain across width's results, beside the study's
BEGIN, END = "<!-- begin: python -m benchmarks.transfer --report -->", "<!-- end: python -m benchmarks.transfer --report -->"
PLANNED_CORPORA = ("python", "text:tinyshakespeare/input.txt")
CORPUS_TITLES = {"python": "the embedded corpus (Python sources)", "text:tinyshakespeare/input.txt": "tinyshakespeare"}
RULES = ("adamw-mup", "muon-mup")  # the package's transfer rules


def _indent(text: str) -> str:
    return "\n".join("    " + line if line else "" for line in text.splitlines())


def findings(arms: dict[str, Any]) -> list[str]:
    """One sentence per arm that reached the widest width; then whether standard AdamW drifts at all."""
    widths = _widths_of(arms)
    base, widest = widths[0], widths[-1]
    out: list[str] = []
    if base == widest:
        return out
    for arm, a in arms.items():
        if a["widest"] != widest or a["base_width"] != base or len(a["widths"][str(widest)]["final_eval_loss_by_lr"]) < 3:
            continue  # not run to the widest width, or its grid still partial
        drift, pct = a["drift_octaves"], a["carried_loss_pct"]
        move = "is at an edge of its grid" if drift is None else f"moves {drift:+.2f} octaves"
        cost = "" if pct is None else f"; width {base}'s lr ends {pct:.2f}% above the best loss at width {widest}"
        out.append(f"`{arm}`: from width {base} to {widest} the best lr {move}{cost}.")
    std = arms.get("adamw")
    if std is not None and std["widest"] == widest and std["drift_octaves"] is not None:
        if abs(std["drift_octaves"]) <= 0.5:
            out.append(f"Standard AdamW drifts by at most half an octave here, so at widths {base}-{widest} this "
                       "study cannot tell a transfer rule from no rule.")
        else:
            out.append(f"Standard AdamW's best lr drifts by {abs(std['drift_octaves']):.2f} octaves, so these "
                       "widths can tell a rule that holds the lr from one that does not.")
    return out


STANDARD_OF = {"adamw-mup": "adamw", "muon-mup": "muon"}


def rule_vs_standard(arms: dict[str, Any]) -> list[str]:
    """At the widest width: each rule's lowest loss beside its optimizer's in the standard parameterization."""
    widths = _widths_of(arms)
    widest = str(widths[-1])
    out = []
    for rule, std in STANDARD_OF.items():
        a, b = arms.get(rule, {}).get("widths", {}).get(widest), arms.get(std, {}).get("widths", {}).get(widest)
        if a is None or b is None or len(widths) < 2:
            continue
        side = "below" if a["best_loss"] < b["best_loss"] else "above"
        out.append(f"At width {widest} `{rule}`'s lowest loss, {a['best_loss']:.3f}, is {side} `{std}`'s "
                   f"{b['best_loss']:.3f} at its own best lr.")
    return out


def base_width_noise(arms: dict[str, Any]) -> Optional[dict[str, Any]]:
    """At the base width ``adamw-mup`` is ``adamw`` (m = 1) with its own draw of the hidden matrices: the mean
    absolute difference of their losses at the lrs both ran measures the noise of one seed."""
    if "adamw" not in arms or "adamw-mup" not in arms:
        return None
    base = str(min(int(w) for w in arms["adamw"]["widths"]))
    a = arms["adamw"]["widths"].get(base, {}).get("final_eval_loss_by_lr", {})
    b = arms["adamw-mup"]["widths"].get(base, {}).get("final_eval_loss_by_lr", {})
    both = sorted(set(a) & set(b), key=float)
    if not both:
        return None
    return {"width": int(base), "lrs": len(both), "mean_abs_diff": statistics.fmean(abs(a[k] - b[k]) for k in both)}


def not_run(data: dict[str, Any]) -> list[str]:
    """What the study's plan holds and the JSON does not."""
    summary = data["summary"]["transfer"]
    out = []
    for corpus in PLANNED_CORPORA:
        arms = summary.get(corpus, {}).get("1", {})
        missing = []
        for arm in ARM_NAMES:
            have = {int(w) for w in arms.get(arm, {}).get("widths", {})}
            gone = [w for w in WIDTHS if w not in have]
            if gone:
                missing.append(f"`{arm}` at width {', '.join(map(str, gone))}")
        if missing:
            out.append(f"On {CORPUS_TITLES[corpus]}: " + "; ".join(missing) + ".")
    lengths = data["summary"]["run_length"].get("python", {})
    if not any(len(row["best_lr_by_tokens"]) >= 3 for arm in RULES for row in lengths.get(arm, {}).values()):
        out.append("Run length (the best lr at 0.25x and 4x the tokens) for `adamw-mup` and `muon-mup`: not run "
                   "to completion" + (" (the table above holds what ran)." if lengths else "."))
    gain = data["summary"].get("gain") or {}
    rows = gain.get("widths") or {}
    if len(rows) < 2:
        out.append("The gain across width (the recipe against hf-best at the same tokens per parameter): not run "
                   "at two widths.")
    elif not any("walk" in r for r in rows.values()):
        out.append("The gain across width: the lr walk at the widest width did not run.")
    else:
        for w, r in rows.items():
            for arm, lrs in (r.get("walk_missing") or {}).items():
                if lrs:
                    out.append(f"The gain across width: `{arm}`'s walk at width {w}, lr {', '.join(lrs)}.")
    if not data["summary"].get("tune_and_train"):
        out.append("Tune small, train big (`tune-and-train`): not run at the study's widths.")
    return out


def page_block(data: dict[str, Any]) -> str:
    """The page's generated part: setup, findings, tables, what did not run and the search log (folded)."""
    summary = data["summary"]
    env = data.get("environment") or {}
    rows = [row for by_length in summary["transfer"].values() for arms in by_length.values() for a in arms.values()
            for row in a["widths"].values()]
    widths = sorted({int(w) for by_length in summary["transfer"].values() for arms in by_length.values()
                     for a in arms.values() for w in a["widths"]})
    one = [a for by_length in summary["transfer"].values() for arms in [by_length.get("1", {})] for a in arms.values()]
    tokens = next(iter(one[0]["widths"].values()))["tokens"] if one else rows[0]["tokens"]
    seeds = sorted({row["seeds"] for row in rows})
    parts = [f"**Setup.** A 2-layer GPT-2 with head size {HEAD_SIZE} (n_head = width / {HEAD_SIZE}), vocabulary "
             f"4096, at widths {', '.join(map(str, widths))}. Every run at 1x trains {tokens:,} tokens "
             f"({tokens // (BATCH * BLOCK)} steps of {BATCH} x {BLOCK}) at every width, with hf-tuned's settings. "
             f"{'One seed' if seeds == [1] else ' or '.join(map(str, seeds)) + ' seeds'} per lr, the tokens and seeds a "
             f"shared CPU trains in the time the study had. The machine is a shared {env.get('cpu_count', '?')}-core "
             f"{env.get('processor', '')} CPU (torch {env.get('torch', '?')})."]
    for corpus, by_length in summary["transfer"].items():
        arms = by_length.get("1")
        if not arms:
            continue
        title = CORPUS_TITLES.get(corpus, corpus)
        parts.append(f"## {title[:1].upper() + title[1:]}")
        lines = findings(arms) + rule_vs_standard(arms)
        noise = base_width_noise(arms)
        if noise:
            lines.append(f"At width {noise['width']} `adamw-mup` is `adamw` with another draw of the hidden matrices; "
                         f"their final losses differ by {noise['mean_abs_diff']:.3f} on average over "
                         f"{noise['lrs']} lrs, the noise of one seed.")
        if lines:
            parts.append("\n".join(lines))
        parts.append(best_lr_table(arms))
        parts.append("The lowest final eval loss of each arm's grid at each width:")
        parts.append(best_loss_table(arms))
    lengths = summary["run_length"]
    for corpus, arms in lengths.items():
        parts.append(f"## Run length ({CORPUS_TITLES.get(corpus, corpus)})")
        parts.append("The best lr at each run length; k is the slope of log2 lr against log2 tokens.\n"
                     + "\n".join(length_findings(arms)))
        parts.append(length_table(arms))
    tuned = summary.get("tune_and_train") or {}
    if tuned:
        parts.append("## Tune small, train big")
        parts.append("The target run goes through the recipe's code (`hf_fasttrain.run.train`), whose model draw "
                     "differs from the study's at the same seed; its lr walk runs through that same code.")
        rows = [[t["arm"], t["proxy_width"], t["width"], f"{t['search']['learning_rate']:.3g}",
                 f"{t['final_eval_loss']:.4f}", _pct(t.get("loss_above_study_best_pct")),
                 ", ".join(f"{lr}: {v:.4f}" for lr, v in t["walk"].items()) if t.get("walk") else "not run",
                 _pct(t.get("loss_above_walk_best_pct"))] for t in tuned.values()]
        parts.append(_md(["arm", "searched at width", "trained at width", "lr", "final eval loss",
                          "% above the study's best there", "its lr walk: final eval loss",
                          "% above the walk's best"], rows))
    gain = summary.get("gain") or {}
    if gain.get("widths"):
        parts.append(gain_block(gain))
    parts.append("## Not run\n\n" + "\n".join(f"- {line}" for line in not_run(data)))
    for corpus, by_length in summary["transfer"].items():
        for length, arms in by_length.items():
            parts.append(f'??? note "Search log: {CORPUS_TITLES.get(corpus, corpus)}, {length}x tokens"\n'
                         + _indent(search_log(arms)))
    parts.append("??? note \"Commands\"\n" + _indent("\n".join(f"`{c}`\n" for c in summary.get("commands", []))))
    return "\n\n".join(parts)


GAIN_ARMS = ("recipe", "hf-best")  # benchmarks.transfer_gain's arms


def _f(x: Optional[float], fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def gain_tables(summary: dict[str, Any]) -> str:
    head = ["width", "tokens", "hf-best lr", "hf-best loss", "recipe lr", "recipe loss",
            "recipe tokens to hf-best's loss", "token ratio"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for w, r in summary["widths"].items():
        lines.append(f"| {w} | {r['tokens']:,} | {r['hf-best_lr']:.3g} | {r['hf-best_final_eval_loss']:.4f} | "
                     f"{r['recipe_lr']:.3g} | {r['recipe_final_eval_loss']:.4f} | "
                     f"{_f(r['recipe_tokens_to_target'], ',.0f')} | {_f(r['tokens_ratio'], '.2f')}x |")
    out = "\n".join(lines)
    walked = {w: r for w, r in summary["widths"].items() if "walk" in r}
    if walked:
        wl = ["| width | arm | lr walk: final eval loss | carried lr above the walk's best |", "|---|---|---|---|"]
        for w, r in walked.items():
            for arm in GAIN_ARMS:
                missing = r.get("walk_missing", {}).get(arm)
                wl.append(f"| {w} | {arm} | " + ", ".join(f"{lr}: {v:.4f}" for lr, v in r["walk"][arm].items())
                          + (f" ({', '.join(missing)}: not run)" if missing else "")
                          + f" | {r['carried_above_walk_best_pct'][arm]:+.2f}% |")
        out += "\n\n" + "\n".join(wl)
    return out


def gain_block(gain: dict[str, Any]) -> str:
    """The page's section on the gain across width (``benchmarks.transfer_gain``'s summary)."""
    rows = gain["widths"]
    widths = sorted(int(w) for w in rows)
    lrs = gain.get("base_lrs") or {}
    k = gain.get("recipe_tokens_exponent") or 0.0
    lines = [f"The recipe (muP based at width {widths[0]}, its lr scaled by the run's tokens^{k:.2f}, the mean "
             f"exponent of the run-length table) against hf-best (the Trainer's options, its lr scaled "
             f"by width^{gain['hf_exponent']:.2f}, the slope of standard AdamW's best lr against width on the embedded "
             f"corpus), each tuned at "
             f"width {widths[0]} (recipe lr {lrs.get('recipe', float('nan')):.3g}, hf-best lr "
             f"{lrs.get('hf-best', float('nan')):.3g}), every width at {gain['tokens_per_param']:g} tokens per "
             "non-embedding parameter, one seed. The token ratio is the recipe's tokens to hf-best's final loss "
             "over hf-best's tokens."]
    ratios = [(w, rows[str(w)]["tokens_ratio"]) for w in widths if rows[str(w)]["tokens_ratio"] is not None]
    if len(ratios) > 1:
        (w0, r0), (w1, r1) = ratios[0], ratios[-1]
        lines.append(f"The ratio is {r0:.2f}x at width {w0} and {r1:.2f}x at width {w1}, a change of "
                     f"{r1 - r0:+.2f}: {abs(r1 - r0) - 0.05:.2f} more than the 0.05 of a gain that holds across "
                     "width." if abs(r1 - r0) > 0.05 else
                     f"The ratio is {r0:.2f}x at width {w0} and {r1:.2f}x at width {w1}, a change of "
                     f"{r1 - r0:+.2f}: the gain holds across width within 0.05.")
    for w, u in sorted((gain.get("recipe_lr_unchanged") or {}).items(), key=lambda kv: int(kv[0])):
        lines.append(f"With the lr unchanged ({u['lr']:.3g}, muP alone) the recipe ends at {u['final_eval_loss']:.4f} "
                     f"at width {w}, token ratio {_ratio_text(u['tokens_ratio'])}.")
    widest = rows[str(widths[-1])]
    if "walk" in widest:
        above = widest["carried_above_walk_best_pct"]
        lines.append(f"At width {widths[-1]} the carried lr ends {above['recipe']:+.2f}% (recipe) and "
                     f"{above['hf-best']:+.2f}% (hf-best) above the best run of its lr walk.")
        if widest.get("walk_best"):
            lines.append(f"Between the two walks' best runs the ratio is "
                         f"{_ratio_text(widest['walk_best'].get('tokens_ratio'))}.")
    return ("## The gain across width\n\n" + "\n".join(lines) + "\n\n" + gain_tables(gain))


def _ratio_text(x: Optional[float]) -> str:
    return "n/a (the recipe does not reach hf-best's loss)" if x is None else f"{x:.2f}x"


def _pct(x: Optional[float]) -> str:
    """A percentage as the page states it: two decimals, signed; "n/a" where it was not measured."""
    return "n/a" if x is None else f"{x:+.2f}"


def write_page(data: dict[str, Any], page: Path) -> None:
    """Replace the generated part of ``page`` (between its markers) by :func:`page_block`."""
    text = page.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise UsageError(f"--page: {display_path(page)} lacks the markers {BEGIN!r} and {END!r}")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    page.write_text(head + BEGIN + "\n\n" + page_block(data) + "\n\n" + END + tail, encoding="utf-8")


def report(ledger: Ledger, out: Path, name: str, page: Optional[Path] = None) -> dict[str, Any]:
    summary = summarise(ledger.data["runs"].values())
    # what the page quotes besides the runs, as of this report (a study running on adds commands and runs)
    summary["commands"] = list(ledger.data.get("commands", []))
    summary["tune_and_train"] = dict(ledger.data.get("tune_and_train") or {})
    gain = out / GAIN_NAME
    if gain.exists():  # the gain across width (benchmarks.transfer_gain) as of this report
        summary["gain"] = json.loads(gain.read_text()).get("summary") or {}
        gain_commands = json.loads(gain.read_text()).get("commands", [])
        summary["commands"] += [c for c in gain_commands if c not in summary["commands"]]
    ledger.data["summary"] = summary
    ledger.save()
    env = ledger.data.get("environment") or {}
    machine = (env.get("cuda_devices") or [None])[0] or f"{env.get('cpu_count', '?')}-core CPU ({env.get('processor', '?')})"
    commands = "\n".join(f"- `{c}`" for c in ledger.data.get("commands", []))
    text = (f"Machine: {machine}; torch {env.get('torch', '?')}. Commands:\n\n{commands}\n\n" + tables(summary))
    (out / f"{name}.md").write_text(text)
    plot(summary, out / f"{name}.png")
    if page is not None and ledger.data["runs"]:
        write_page(ledger.data, page)
    print(tables(summary))
    return summary


# --- Command line ---------------------------------------------------------------------------------------------
def _list(text: str, cast, field: str) -> list:
    try:
        values = [cast(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values:
        raise UsageError(f"{field}: {text!r} is not a comma-separated list of numbers")
    return values


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.transfer", allow_abbrev=False, description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default=",".join(ARM_NAMES), help=f"comma-separated arms; known: {', '.join(ARM_NAMES)}")
    p.add_argument("--widths", default=",".join(map(str, WIDTHS)),
                   help="comma-separated widths, the first is the base width (muP's base_width, the carried lr's "
                        "source); each a multiple of the head size 32 (quick: 8)")
    p.add_argument("--seeds", type=int, default=1, help="seeds per lr (the loss of an lr is their mean)")
    p.add_argument("--steps", type=int, default=STEPS,
                   help="optimizer steps of a 1x run (8 rows x 64 tokens each; quick: 8 x 32)")
    p.add_argument("--lengths", default="1",
                   help="run lengths as multiples of --steps, e.g. 0.25,1,4 (each has its own grids)")
    p.add_argument("--text", default=None,
                   help="a plain text file to train on (e.g. tinyshakespeare's input.txt), with a byte-level BPE "
                        "tokenizer trained on it (vocabulary 4096); default: the embedded corpus")
    p.add_argument("--max-extend", type=int, default=MAX_EXTEND,
                   help="lrs added per width while the best is at an edge of the grid")
    p.add_argument("--start-lr", action="append", default=[], metavar="ARM=LR",
                   help="the base width's first grid centre for an arm (repeatable); defaults: "
                        + ", ".join(f"{a}={lr:g}" for a, lr in START_LR.items()))
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (one run at a time)")
    p.add_argument("--quick", action="store_true", help="tiny smoke setup (widths 16,32, head size 8, 12 steps)")
    p.add_argument("--report", action="store_true", help="rebuild the tables, the PNG and the page from the JSON; no training")
    p.add_argument("--out", default=str(RESULTS), help="folder of <name>.json, .md, .png")
    p.add_argument("--name", default="transfer", help="basename of the output files")
    p.add_argument("--page", default=None,
                   help="the study page whose generated part the report rewrites; default: docs/benchmarks/"
                        "transfer.md when --out is benchmarks/results, else none")
    return p


def main(argv: Optional[list[str]] = None) -> dict[str, Any]:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["tune-and-train"]:
        return tune_and_train_main(argv[1:])
    ns = make_parser().parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / f"{ns.name}.json")
    page = Path(ns.page) if ns.page else (PAGE if out.resolve() == RESULTS.resolve() and ns.name == "transfer" else None)
    if ns.report:
        return report(ledger, out, ns.name, page)
    arms = [a.strip() for a in ns.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARM_NAMES]
    if unknown:
        raise UsageError(f"--arms: unknown {unknown}; known: {', '.join(ARM_NAMES)}")
    if ns.quick and ns.widths == make_parser().get_default("widths"):
        ns.widths = ",".join(map(str, QUICK_WIDTHS))
    if ns.quick and ns.steps == STEPS:
        ns.steps = 12
    ns.widths = sorted(_list(ns.widths, int, "--widths"))
    lengths = _list(ns.lengths, float, "--lengths")
    if ns.seeds < 1 or ns.steps < 1 or ns.threads < 1:
        raise UsageError("--seeds, --steps and --threads must be integers >= 1")
    if ns.text and not Path(ns.text).is_file():
        raise UsageError(f"--text: {ns.text!r} is not a file")
    start = dict(START_LR)
    for item in ns.start_lr:
        arm, _, lr = item.partition("=")
        try:
            start[arm] = float(lr)
        except ValueError:
            arm = ""
        if arm not in ARM_NAMES or start[arm] <= 0:
            raise UsageError(f"--start-lr {item!r}: expected ARM=LR with ARM one of {', '.join(ARM_NAMES)}, LR > 0")
    for w in ns.widths:
        width_setup(w, quick=ns.quick)  # a width off the head size fails here, before any training
    import torch

    torch.set_num_threads(ns.threads)
    ledger.data["environment"] = machine_info()
    command = display_command("python -m benchmarks.transfer", argv)
    ledger.data.setdefault("commands", [])
    if command not in ledger.data["commands"]:
        ledger.data["commands"].append(command)
    if ns.text:
        digest = hashlib.sha1(Path(ns.text).read_bytes()).hexdigest()[:12]
        ledger.data.setdefault("corpora", {})[corpus_name(ns.text)] = {"path": display_path(ns.text), "sha1": digest}
    ledger.save()
    study = Study(ns, ledger)
    for length in lengths:  # width by width, every arm at one width before the next: a study cut short is even
        sweeps = {}
        for arm in arms:
            def run(width: int, lr: float, arm=arm, length=length) -> float:
                rs = [study.run(arm, width, lr, length, seed) for seed in range(ns.seeds)]
                return grid_losses(rs)[lr]

            sweeps[arm] = ArmSweep(start[arm], run, ns.max_extend)
        for w in ns.widths:
            for arm in arms:
                sweeps[arm].width(w)
    print(f"[transfer] {study.trained} run(s) trained, the others read from {display_path(ledger.path)}")
    summary = report(ledger, out, ns.name, page)
    summary["trained"] = study.trained
    return summary


# --- Tune small, train big ----------------------------------------------------------------------------------
def make_tune_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.transfer tune-and-train", allow_abbrev=False,
        description="An lr search at a proxy width on the restart engine (hf_fasttrain.run.tune_transfer: one "
                    "trial per lr, successive halving), then the target width trained at the winner's lr with the "
                    "arm's transfer rule; the target's run_info.json names the search. The study's model, data "
                    "and settings; the target's loss is compared with the study's best at that width where the "
                    "JSON has it.")
    p.add_argument("--arm", default="muon-mup", help=f"the arm's settings; one of {', '.join(ARM_NAMES)}")
    p.add_argument("--proxy-width", type=int, default=64, help="the width searched (a multiple of 32)")
    p.add_argument("--width", type=int, default=512, help="the width trained at the transferred lr")
    p.add_argument("--lrs", default=None, help="comma-separated peak lrs searched; default: the arm's starting lr "
                                               "x 1/4, 1/2, 1, 2, 4")
    p.add_argument("--rungs", type=int, default=2, help="successive-halving rungs of the proxy's run")
    p.add_argument("--steps", type=int, default=STEPS, help="optimizer steps of both runs (8 rows x 64 tokens)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--walk", type=int, default=0, help="also train the target at the winner's lr x 2^-k and x 2^k "
                   "for k = 1..WALK, through the same code and seed, in <runs>/walk-lr<lr>/: the lr walk the carried "
                   "lr is judged against (default 0: none)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--quick", action="store_true", help="tiny smoke setup (head size 8, 12 steps)")
    p.add_argument("--runs", default="runs/transfer-tune", help="the runs' folder (the target's output_dir)")
    p.add_argument("--out", default=str(RESULTS), help="folder of <name>.json (the study's, read and added to)")
    p.add_argument("--name", default="transfer", help="basename of the study's JSON")
    return p


def tune_and_train_main(argv: list[str]) -> dict[str, Any]:
    import torch

    from hf_fasttrain import DataArguments, FastTrainingArguments
    from hf_fasttrain.run.tune_transfer import tune_and_train

    from benchmarks._harness.lm import common_args

    ns = make_tune_parser().parse_args(argv)
    if ns.arm not in ARM_NAMES:
        raise UsageError(f"--arm: unknown {ns.arm!r}; known: {', '.join(ARM_NAMES)}")
    steps = 12 if ns.quick and ns.steps == STEPS else ns.steps
    lrs = (_list(ns.lrs, float, "--lrs") if ns.lrs else [START_LR[ns.arm] * 2.0 ** k for k in (-2, -1, 0, 1, 2)])
    torch.set_num_threads(ns.threads)
    setup = width_setup(ns.width, steps, "python", ns.quick)
    width_setup(ns.proxy_width, steps, "python", ns.quick)  # a proxy off the head size fails here
    out = Path(ns.runs)
    arm = transfer_arm(ns.arm, ns.width, START_LR[ns.arm], ns.proxy_width)
    common = common_args(setup, ns.seed, out)
    common.update(eval_on_start=False, per_device_eval_batch_size=32)
    training_args = FastTrainingArguments(**{**common, **arm.args, "auto_resume": True})
    data_args = DataArguments(vocab_size=setup.vocab_size, block_size=setup.block_size,
                              max_eval_samples=setup.eval_rows, max_corpus_files=setup.max_corpus_files)
    result = tune_and_train(setup.model_args(), data_args, training_args, ns.proxy_width, lrs, rungs=ns.rungs)
    record = {"arm": ns.arm, "proxy_width": ns.proxy_width, "width": ns.width, "steps": steps,
              "tokens": steps * setup.tokens_per_step, "search": result["transfer"],
              "final_eval_loss": result["metrics"]["eval_loss"],
              "command": display_command("python -m benchmarks.transfer tune-and-train", argv)}
    if ns.walk > 0:  # the target's own lr walk: the same code, data and seed as the target run, other lrs
        from hf_fasttrain.run.train import train
        from hf_fasttrain.run.tune_transfer import _with_base_width

        best = result["transfer"]["learning_rate"]
        walk = {f"{best:g}": record["final_eval_loss"]}
        for k in [k for j in range(1, ns.walk + 1) for k in (-j, j)]:
            lr = best * 2.0 ** k
            args = _with_base_width(training_args, ns.proxy_width, learning_rate=lr,
                                    output_dir=str(out / f"walk-lr{lr:g}"))
            walk[f"{lr:g}"] = train(setup.model_args(), data_args, args)["eval_loss"]
        record["walk"] = dict(sorted(walk.items(), key=lambda kv: float(kv[0])))
        record["walk_best_loss"] = min(walk.values())
        record["loss_above_walk_best_pct"] = 100 * (record["final_eval_loss"] / record["walk_best_loss"] - 1)
    # beside the study's grid at the target width (same arm, corpus and length), where it ran
    ledger = Ledger(Path(ns.out) / f"{ns.name}.json")
    grid = grid_losses(r for r in ledger.data["runs"].values()
                       if (r["arm"], r["width"], r["corpus"], r["steps"]) == (ns.arm, ns.width, "python", steps))
    if grid:
        record["study_best_loss"] = min(grid.values())
        record["loss_above_study_best_pct"] = 100 * (record["final_eval_loss"] / record["study_best_loss"] - 1)
    record["search"]["proxy_search"] = display_path(record["search"]["proxy_search"])
    ledger.data.setdefault("tune_and_train", {})[f"{ns.arm}@{ns.proxy_width}->{ns.width}x{steps}"] = record
    ledger.save()
    print(f"[transfer] tune-and-train {ns.arm}: lr {record['search']['learning_rate']:g} from width "
          f"{ns.proxy_width}, width {ns.width} ends at {record['final_eval_loss']:.4f}"
          + (f" ({record['loss_above_study_best_pct']:+.2f}% against the study's best there)" if grid else "")
          + (f"; {record['loss_above_walk_best_pct']:+.2f}% against the best of its own lr walk "
             f"({', '.join(f'{lr}: {v:.4f}' for lr, v in record['walk'].items())})" if "walk" in record else ""))
    return record


if __name__ == "__main__":
    run_cli(main)
