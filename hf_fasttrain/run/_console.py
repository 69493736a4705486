"""What a recipe run prints: the start line (what trains, for how long, where) and the summary at its end."""

from __future__ import annotations

import math
import os
from typing import Any, Mapping, Optional

from ..console import say  # noqa: F401  (the recipe's console line; defined below the trainer)

__all__ = ["start_line", "end_summary", "say"]


def _fmt_count(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return f"{n:.0f}"


def start_line(name: str, facts: Mapping[str, Any], output_dir: str, data: Optional[str] = None) -> str:
    """``gpt2_tiny: 0.82M parameters; 2,048 tokens/step (16 rows x 128 tokens); 300 steps (614k tokens); ...``

    ``data`` (what was loaded, e.g. ``data c.parquet: 1,998 documents (2 empty dropped) -> ...``) goes before
    the output folder."""
    tps, steps = facts["tokens_per_step"] or 0, facts["max_steps"]
    rows = facts["global_batch"]
    per_row = tps // rows if rows else 0
    procs = f" over {facts['world_size']} processes" if facts["world_size"] > 1 else ""
    tokens = facts.get("tokens") or (steps * tps if steps and steps > 0 else None)
    shorter = ", shorter rows first" if tokens and steps and tokens < steps * tps else ""  # sequence-length warmup
    length = (f"{steps:,} steps ({_fmt_count(tokens)} tokens{shorter})" if steps and steps > 0
              else "by epochs (max_steps not set)")
    if facts.get("max_tokens"):  # the run's length was given in tokens: these are the steps that hold them
        length = f"max_tokens {facts['max_tokens']:,} in {length}"
    trainable = facts.get("trainable_parameters")
    params = _fmt_count(facts["parameters"]) + " parameters"
    if isinstance(trainable, int) and trainable < facts["parameters"]:
        params += f" ({_fmt_count(trainable)} trainable)"
    return (f"{name}: {params}; {tps:,} tokens/step ({rows} rows x "
            f"{per_row} tokens{procs}); {length}; {facts['device']}, {facts['precision']}; "
            + (f"{data}; " if data else "") + f"output {output_dir}")


def end_summary(summary: Mapping[str, Any], output_dir: str, facts: Optional[Mapping[str, Any]] = None,
                steps: Optional[int] = None, adapter: bool = False, merged: Optional[str] = None,
                tokens: Optional[int] = None) -> str:
    """The lines printed when a run ends: eval loss from -> to, perplexity, steps (and the tokens they held, when
    known), time, tokens/s, and the paths."""
    first, last = summary.get("initial_eval_loss"), summary.get("final_eval_loss")
    lines = []
    head = "done"
    if isinstance(last, (int, float)):
        loss = f"eval loss {first:.4g} -> {last:.4g}" if isinstance(first, (int, float)) and summary.get(
            "history") and len([h for h in summary["history"] if "eval_loss" in h]) > 1 else f"eval loss {last:.4g}"
        head += f": {loss} (perplexity {math.exp(min(last, 50.0)):.4g})"
    secs = summary.get("train_seconds")
    if isinstance(secs, (int, float)) and secs > 0:
        held = f" ({_fmt_count(tokens)} tokens)" if steps and tokens else ""
        head += f"; {steps:,} steps{held} in {secs:.1f} s of training" if steps else f"; {secs:.1f} s of training"
        rates = [h["tokens_per_second"] for h in summary.get("history", []) if "tokens_per_second" in h]
        if rates:
            head += f", {sum(rates) / len(rates):,.0f} tokens/s"
    lines.append(head)
    for label, f in (("metrics", "metrics.json"), ("loss curve", "loss_curve.png")):
        lines.append(f"  {label:<11}{os.path.join(output_dir, f)}")
    if adapter:
        lines.append(f"  {'adapter':<11}{output_dir}  (PeftModel.from_pretrained(base, it); tokenizer beside it)")
    else:
        lines.append(f"  {'model':<11}{output_dir}  (from_pretrained-ready: model, config, tokenizer)")
    if merged:
        lines.append(f"  {'merged':<11}{merged}  (the base with the adapter merged in: from_pretrained-ready)")
    return "\n".join(lines)
