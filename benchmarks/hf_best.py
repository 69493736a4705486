#!/usr/bin/env python
"""Long horizons: the strongest Trainer-only baseline (``hf-best``) and the recipe's long-run candidates,
each found by coordinate descent at one budget of the budget ladder.

    nice -n 10 python -m benchmarks.hf_best --budget 16 --jobs 2     # the search (resumable: rerun to continue)
    nice -n 10 python -m benchmarks.hf_best --budget 1 --jobs 1      # another budget, same file, at the same time
    nice -n 10 python -m benchmarks.hf_best --budget 64 --transfer-from 16 --jobs 2   # 16x's winners, lr swept
    nice -n 10 python -m benchmarks.hf_best --budget 54 --model 3x192 --transfer-from 16 --jobs 2  # a larger model
    nice -n 10 python -m benchmarks.hf_best --budget 64 --corpus unique --transfer-from 16 --jobs 2  # no repeats
    python -m benchmarks.hf_best --budget 16 --report                # every budget's tables from the JSON
    nice -n 15 python -m benchmarks.hf_best --budget 1 --families hf-best+ --name hf_best_groups   # per-group lrs
    python -m benchmarks.hf_best --quick --out /tmp/x                # a smoke run (the test suite uses it)

Model, data and budget are the budget ladder's (GPT-2 2x128 on the stdlib corpus, ``multiple x 300`` steps of
16 x 128 tokens, 2% warmup, 12 evals). Families and their knobs are in ``benchmarks/_harness/long_runs.py``:

- ``hf-best``: plain ``transformers.Trainer`` with AdamW and the Trainer's own options, from ``hf-tuned``'s best
  at the budget (cosine to 10%, weight decay 0.1, beta2 0.95, its swept lr).
- ``recipe``: FastTrainer as the ladder's recipe (Muon + AdamW, divergence guard, EMA, sequence-length warmup)
  from its best lr at the budget.
- ``hf-best+`` and ``recipe+groups``: per-group learning rates (``hf_fasttrain.optim.groups``) from a base
  family's winner at the same budget (``--base``, default results/hf_best.json).

Coordinate descent: knob by knob from the current best, every other value of the knob runs (seed 0); the best
replaces the current setting only if it lowers the final eval loss by more than the family's seed noise
(``NOISE``). A relative knob (the peak lr) multiplies the current value; a joint knob (``a+b``) sets two settings
at once. A second seed then runs at the winner. The search is a generator that is sent its batches' losses, so a
rerun replays its decisions from the JSON and runs only what is missing; the families share the ``--jobs``
workers.

``--transfer-from`` starts each family at a searched budget's winner (a per-group family: its base family's
winner at the new budget with the searched group knobs) and walks only the peak lr, one run at a
time (x0.5 first, on down while the loss falls, else x2 and up; at most ``TRANSFER_STEPS`` steps one way).
``--model 3x192`` (rung ``<budget>x-3x192``) starts each family at the measured lr law's lr; ``--corpus unique``
(rung ``<budget>x-unique``) trains on the ladder's corpus that does not repeat. From budget 32 on
(``--checkpoints auto``) every run saves a checkpoint at each eval into ``<out>/<name>_partial/`` and a killed run
resumes from it; SIGTERM or Ctrl-C lets each running run save its step, starts no queued run, and exits 143
(130 for Ctrl-C). The same command resumes.

Writes hf_best.json (every run, every decision), hf_best.md and, where a per-group family ran, hf_best.png into
--out (benchmarks/results); the budget ladder's report reads hf_best.json for its hf-best rows.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.hf_best [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import contextlib
import dataclasses
import hashlib
import json
import math
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from hf_fasttrain.callbacks.graceful_stop import TrainingStopped, stop_exit_code
from hf_fasttrain.runinfo import environment_info

from benchmarks._harness import RESULTS, UsageError, display_command, display_path, run_cli
from benchmarks._harness.budget import BASE_STEPS, budget_setup, data_args, unique_corpus_data
from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import ARMS, QUICK, Arm, crossing, non_embedding_params, run_arm
from benchmarks._harness.long_runs import (BASE_OF, CHECKPOINT_FROM_BUDGET, CORPORA, FAMILIES, GROUP_KNOBS, KNOBS,
                                          KNOB_DEFAULTS, carried_groups, LADDER_MODEL, MODELS, NOISE, OPTIMIZER_OF,
                                          SEARCHED_BY_DEFAULT, TRANSFER_STEPS, WARMUP, config_key, fastest_one_run,
                                          knob_value, ladder_best_lr, rung_multiple, rung_name, run_key, run_search,
                                          searched_rungs, start_config, summarise)
from benchmarks._harness import processes
from benchmarks._harness.processes import as_finished, stops_forwarded, worker_pool

def trainer_schedule(schedule: str, steps: int) -> dict[str, Any]:
    """The Trainer's own ``lr_scheduler_type`` (and kwargs) for a schedule name."""
    decay = round(0.2 * steps)
    return {
        "cosine10": dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.1}),
        "cosine1": dict(lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": 0.01}),
        "linear0": dict(lr_scheduler_type="linear", lr_scheduler_kwargs={}),
        "wsd-linear": dict(lr_scheduler_type="warmup_stable_decay",
                           lr_scheduler_kwargs={"num_decay_steps": decay, "decay_type": "linear", "min_lr_ratio": 0.0}),
        "wsd-1-sqrt": dict(lr_scheduler_type="warmup_stable_decay",
                           lr_scheduler_kwargs={"num_decay_steps": decay, "decay_type": "1-sqrt", "min_lr_ratio": 0.0}),
    }[schedule]


def recipe_schedule(schedule: str) -> dict[str, Any]:
    """hf_fasttrain.schedules settings (FastTrainingArguments) for a schedule name."""
    return {"cosine10": dict(lr_decay="cosine", min_lr_ratio=0.1),
            "linear0": dict(lr_decay="linear", min_lr_ratio=0.0),
            "wsd-1-sqrt": dict(lr_decay="1-sqrt", min_lr_ratio=0.0, decay_fraction=0.2)}[schedule]


def group_options(config: dict[str, Any]) -> dict[str, Any]:
    """The per-group options (``lr_multipliers``, ``weight_decay_on``) ``config`` sets; empty at their defaults."""
    mult = {GROUP_KNOBS[k]: float(knob_value(config, k)) for k in GROUP_KNOBS if knob_value(config, k) != 1.0}
    out: dict[str, Any] = {"lr_multipliers": mult} if mult else {}
    if knob_value(config, "wd_on") != "default":
        out["weight_decay_on"] = knob_value(config, "wd_on")
    return out


def arm_for(family: str, config: dict[str, Any], steps: int) -> Arm:
    """The time-to-loss arm that trains ``config``. The per-group options at their defaults train exactly as the
    base family's arm (the same settings, the same code path)."""
    lr = config["lr"] * config["lr_scale"]
    wd = config["wd_timescale"] / (lr * steps)
    name = f"{family}@" + ",".join(f"{k}={v}" for k, v in sorted(config.items()))
    groups = group_options(config)
    if BASE_OF[family] == "hf-best":
        args: dict[str, Any] = dict(learning_rate=lr, warmup_steps=WARMUP, weight_decay=wd, adam_beta2=config["beta2"],
                                    max_grad_norm=1.0)
        if config["optim"] == "schedule_free_adamw":
            # schedule-free keeps its own warmup (the Trainer hands it warmup_steps as given: whole steps here)
            args.update(optim="schedule_free_adamw", lr_scheduler_type="constant", warmup_steps=round(WARMUP * steps))
        else:
            args.update(trainer_schedule(config["schedule"], steps))
        if groups:
            if config["optim"] != "adamw_torch":
                raise ValueError(f"{name}: the per-group options need the package's AdamW, not optim={config['optim']!r}")
            # the user's few lines: Trainer(optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for("adamw", args, ...))
            return Arm(name, "Trainer + AdamW with per-group lrs, " + name, fast=False, args=args,
                       optimizer=("adamw", groups))
        return Arm(name, "Trainer + AdamW, " + name, fast=False, args=args)
    base = ARMS["fasttrain"].args
    args = {k: v for k, v in base.items() if k not in ("lr_decay", "min_lr_ratio", "weight_averaging", "ema_decay",
                                                        "seq_len_warmup_min", "seq_len_warmup_fraction")}
    if knob_value(config, "optimizer") == "ademamix":  # the whole model on AdEMAMix, the paper's beta3 and alpha
        args.update(optimizer="ademamix", learning_rate=lr, weight_decay=wd, adam_beta2=config["beta2"],
                    optimizer_kwargs={"betas": [0.9, config["beta2"], knob_value(config, "beta3")], "alpha": 5.0},
                    **recipe_schedule(config["schedule"]))
        return _recipe_arm(name, args, config, base)
    optimizer_kwargs: dict[str, Any] = {"betas": [0.9, config["beta2"]]}
    if knob_value(config, "normuon") is not None:  # NorMuon: Muon's update normalised per neuron
        optimizer_kwargs["normuon_beta2"] = config["normuon"]
    if knob_value(config, "hyperball"):  # Muon's matrices held at their norms, not decayed
        optimizer_kwargs["hyperball"] = True
    elif knob_value(config, "cautious_wd"):  # Muon's matrices decay only where the update has their sign
        optimizer_kwargs["cautious_wd"] = True
    adamw_scale = knob_value(config, "adamw_lr_scale")
    if adamw_scale != 1.0:  # the AdamW part (embeddings, head, norms) at its own lr; Muon's stays
        optimizer_kwargs["muon_lr"] = lr
    optimizer_kwargs.update(groups)
    args.update(learning_rate=lr * adamw_scale, weight_decay=wd, adam_beta2=config["beta2"], optimizer_kwargs=optimizer_kwargs,
                **recipe_schedule(config["schedule"]))
    return _recipe_arm(name, args, config, base)


def _recipe_arm(name: str, args: dict[str, Any], config: dict[str, Any], base: dict[str, Any]) -> Arm:
    """The recipe's arm: ``args`` with its EMA and sequence-length warmup as ``config`` sets them."""
    if config["ema"]:
        args.update(weight_averaging="ema", ema_decay=base["ema_decay"])
    if config["seq_len_warmup"]:
        args.update(seq_len_warmup_min=base["seq_len_warmup_min"], seq_len_warmup_fraction=base["seq_len_warmup_fraction"])
    return Arm(name, "FastTrainer recipe, " + name, fast=True, args=args)


# --- Runs ----------------------------------------------------------------------------------------------
_SHARED: dict[str, Any] = {}


# Muon's Newton-Schulz precision in the recipe's runs: torch's bf16, as every ladder run (given explicitly: Muon's
# default, "auto", is fp32 on a CPU without native bf16). ``--ns-dtype float32``
# runs it in fp32 (2-4x faster on a CPU without native bf16 matmuls); such a run records ``ns_dtype``, and
# ``--precision-check`` measures what the precision does to a finished run's result (same settings, same seed).
NS_DTYPE = "bfloat16"
NS_DTYPES = ("bfloat16", "float32")  # not "auto": it would name a different precision on each machine


def _run_one(job: tuple[str, str, dict[str, Any], int]) -> dict[str, Any]:
    """One run (in a pool worker or here). A run stopped by a signal raises TrainingStopped to the search; in a
    worker whose search has died (the parent-death SIGTERM) there is no one to tell, so the worker exits."""
    parent = os.getppid()
    try:
        return _run_job(job)
    except TrainingStopped as exc:
        # the parent-death signal comes as the search's first thread exits, before the worker is reparented:
        # give the exit a moment to finish (a stop the search forwarded waits this long for nothing)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            if os.getppid() != parent:
                os._exit(exc.code)
            time.sleep(0.02)
        raise


def _run_job(job: tuple[str, str, dict[str, Any], int]) -> dict[str, Any]:
    rung, family, config, seed = job
    setup = _SHARED["setup"]
    tokenizer, lm = _SHARED["data"]
    cpu0 = time.process_time()
    partial = _SHARED.get("partial")  # a checkpoint folder per run: a killed run resumes where it was
    ckpt = Path(partial) / hashlib.sha1(run_key(*job).encode()).hexdigest()[:16] if partial else None
    arm = arm_for(family, config, setup.max_steps)
    ns_dtype = None  # recorded only where Muon runs and its iteration is not the ladder's bf16
    if BASE_OF[family] == "recipe" and knob_value(config, "optimizer") == "muon":
        # given always: Muon's default ("auto") would run fp32 on a CPU without native bf16, and every run of
        # the ladder ran bf16
        given = _SHARED.get("ns_dtype", NS_DTYPE)
        arm.args["optimizer_kwargs"] = {**arm.args["optimizer_kwargs"], "ns_dtype": given}
        if given != NS_DTYPE:
            ns_dtype = given
            if ckpt is not None:  # a checkpoint left by a bf16 run is not this run's
                ckpt = ckpt.with_name(f"{ckpt.name}-ns-{given}")
    r = run_arm(arm, seed, setup, tokenizer, lm, Path(_SHARED["work"]), checkpoint_dir=ckpt, train_rows=setup.eval_rows)
    r.update(rung=rung, family=family, config=config, cpu_seconds=time.process_time() - cpu0,
             max_steps=setup.max_steps, tokens_per_step=setup.tokens_per_step)
    if ns_dtype:  # how Muon's iteration ran, not what was trained: the run key stays the config's
        r["ns_dtype"] = ns_dtype
    return r


def import_ladder_starts(ledger: Ledger, ladder: dict[str, Any], rung: str, starts: dict[str, dict[str, Any]]) -> int:
    """The ladder's runs of hf-tuned / the recipe at the start lr are the searches' start points (the same
    settings): taken over with ``imported_from``, so they are not trained twice."""
    added = 0
    for family, opt in (("hf-best", "adamw"), ("recipe", "recipe")):
        if family not in starts:
            continue
        for r in ladder.get("runs", {}).values():
            if r["rung"] == rung and r["optimizer"] == opt and r["lr"] == starts[family]["lr"]:
                key = run_key(rung, family, starts[family], r["seed"])
                if key not in ledger.data["runs"]:
                    ledger.data["runs"][key] = {**r, "family": family, "config": starts[family],
                                                "imported_from": "budget_ladder.json"}
                    added += 1
    return added


def search(ledger: Ledger, rung: str, starts: dict[str, dict[str, Any]], pool, seeds: int, log=print,
           workers: Optional[int] = None, transfer_from: Optional[str] = None) -> dict[str, Any]:
    """The families' searches at ``rung`` over ``pool`` (``long_runs.run_search``), each run by ``_run_one``."""
    return run_search(ledger, rung, starts, pool, seeds, _run_one, KNOBS, NOISE, TRANSFER_STEPS, log=log,
                      workers=workers, transfer_from=transfer_from)


def _shown(value: Any) -> str:
    """A knob's value as the table shows it (a joint knob's parts as a tuple, also after a JSON round trip)."""
    return str(tuple(value)) if isinstance(value, list) else str(value)


def markdown(summary: dict[str, Any]) -> str:
    lines = ["| family | knob | from | tried: final eval loss (seed 0) | kept |", "|---|---|---|---|---|"]
    for family, s in summary.items():
        for d in s["decisions"]:
            tried = ", ".join(f"{v}: {loss:.3f}" for v, loss in d["tried"].items())
            lines.append(f"| {family} | {d['knob']} | {_shown(d['from'])} ({d['current_loss']:.3f}) | {tried} | "
                         f"{_shown(d['best_value']) if d['accepted'] else 'no change'} |")
    for family, s in summary.items():
        t = s.get("trying")
        if t and t.get("knob"):
            tried = ", ".join(f"{v}: {'running' if loss is None else f'{loss:.3f}'}" for v, loss in t["finished"].items())
            lines.append(f"| {family} | {t['knob']} | {t.get('from', knob_value(s['best'], t['knob']))} ({t['from_loss']:.3f}) | {tried} | "
                         "deciding |")
        for knob, got in (s.get("ahead") or {}).items():
            tried = ", ".join(f"{v}: {loss:.3f}" for v, loss in got.items())
            lines.append(f"| {family} | {knob} | {knob_value(s['best'], knob)} ({s['final_eval_loss']:.3f}) | {tried} | "
                         "finished ahead of its turn |")
    lines += ["", "| family | winner (best so far while the search runs) | final eval loss (median) | seeds |",
              "|---|---|---|---|"]
    for family, s in summary.items():
        settings = ", ".join(f"{k} {v}" for k, v in s["best"].items())
        state = "" if s.get("complete", True) else " (search running)"
        seeds = f"{s['seeds']} ({s['seeds_ns_other']} with Muon's Newton-Schulz in fp32)" if s.get("seeds_ns_other") else s["seeds"]
        lines.append(f"| {family}{state} | {settings} | {s['final_eval_loss']:.3f} | {seeds} |")
    return "\n".join(lines) + "\n"


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                allow_abbrev=False)
    p.add_argument("--budget", type=int, default=16, help="multiple of the 1x budget (300 steps) to search at")
    p.add_argument("--families", default=",".join(SEARCHED_BY_DEFAULT),
                   help=f"comma-separated, of {', '.join(FAMILIES)}; hf-best+ and recipe+groups start at hf-best's and "
                        "the recipe's winners at the same budget (in --base, else the quick start) and search the "
                        "per-group lrs")
    p.add_argument("--base", default=None, metavar="JSON",
                   help="the hf_best ledger whose finished searches give hf-best+ and recipe+groups their starts "
                        "(default: results/hf_best.json); the winner's runs there are taken over as the start's")
    p.add_argument("--model", default=LADDER_MODEL,
                   help=f"LAYERSxWIDTH, one of {', '.join(MODELS)}; another than {LADDER_MODEL} needs --transfer-from "
                        "and starts at the law's lr for its width and tokens per parameter")
    p.add_argument("--corpus", choices=CORPORA, default="stdlib",
                   help="stdlib: the ladder's corpus (about 3.3M training tokens, so 64x reads it about 12 times); "
                        "unique: the same plus Python sources of the installed packages until the budget is covered "
                        "without repeats (the stdlib's tokenizer and held-out rows; rung <budget>x-unique); needs "
                        "--transfer-from")
    p.add_argument("--transfer-from", type=int, default=None, metavar="BUDGET",
                   help="start each family at its winner of the search at this (shorter, searched) budget and sweep "
                        f"only the peak lr, one run at a time: x0.5, on down while the loss falls, else x2 and up (at most "
                        f"{TRANSFER_STEPS} steps one way), for a budget too long to search")
    p.add_argument("--checkpoints", choices=("auto", "on", "off"), default="auto",
                   help=f"save a checkpoint at every eval into <out>/<name>_partial/ and resume a killed run from it "
                        f"(auto: from budget {CHECKPOINT_FROM_BUDGET} on); with checkpoints, SIGTERM or Ctrl-C makes each "
                        "running run save the step it reached, and the search exits 143 (130) once they have")
    p.add_argument("--seeds", type=int, default=2, help="seeds at each family's winner (the search runs seed 0)")
    p.add_argument("--jobs", type=int, default=1, help="runs in parallel processes (results do not depend on it)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per run")
    p.add_argument("--config", default=None, metavar="JSON",
                   help="no search: run these settings (a JSON object of the family's knobs, as the report's winner "
                        "rows show them; exactly one of --families) at seeds 0 .. --seeds - 1, skipping finished runs, "
                        "e.g. more seeds of a candidate that did not win on its final loss")
    p.add_argument("--ns-dtype", choices=NS_DTYPES, default=NS_DTYPE,
                   help="the precision of Muon's Newton-Schulz iteration in the recipe's new runs (bfloat16: as every "
                        "ladder run; float32 runs 2-4x faster on a CPU without native bf16 matmuls); a run that is not "
                        "bfloat16 records it and the report marks it")
    p.add_argument("--precision-check", action="store_true",
                   help="with --config and --ns-dtype other than bfloat16: rerun finished runs of those settings at "
                        "that precision and keep them apart (the JSON's precision_check), for the report's table of "
                        "what the precision changes at the same seed")
    p.add_argument("--report", action="store_true", help="only rebuild the table from the JSON")
    p.add_argument("--quick", action="store_true", help="tiny smoke search (the quick setup, 2-step budget)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="hf_best", help="basename of the output files")
    return p


def main(argv=None) -> dict[str, Any]:
    ns = make_parser().parse_args(argv)
    families = [f for f in ns.families.split(",") if f]
    bad = [f for f in families if f not in FAMILIES]
    if bad or not families:
        raise UsageError(f"--families: {ns.families!r}: each of {', '.join(FAMILIES)}")
    if ns.budget < 1 or ns.seeds < 1 or ns.jobs < 1 or ns.threads < 1:
        raise UsageError("--budget, --seeds, --jobs and --threads must be >= 1")
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    ledger = Ledger(out / f"{ns.name}.json")
    if ns.model not in MODELS:
        raise UsageError(f"--model: {ns.model!r}: one of {', '.join(MODELS)}")
    if ns.model != LADDER_MODEL and not ns.transfer_from and not ns.report:
        raise UsageError(f"--model: {ns.model}: another model than the ladder's is not searched; give "
                         "--transfer-from <budget> (its winners there, the lr from the measured law, swept)")
    if ns.corpus != "stdlib" and not ns.transfer_from and not ns.report:
        raise UsageError(f"--corpus: {ns.corpus}: a corpus other than the ladder's is not searched; give "
                         "--transfer-from <budget> (its winners there, the lr swept)")
    rung = rung_name(ns.budget, ns.model, ns.corpus)
    given = parse_config(ns.config, families) if ns.config is not None else None
    if ns.precision_check and (given is None or ns.ns_dtype == NS_DTYPE):
        raise UsageError(f"--precision-check: needs --config and --ns-dtype other than {NS_DTYPE} "
                         f"(got --ns-dtype {ns.ns_dtype}{'' if given else ', no --config'})")
    if not ns.report:
        base_steps = 2 if ns.quick else BASE_STEPS
        setup = budget_setup(ns.budget, ns.quick, base_steps)
        if ns.model != LADDER_MODEL:
            shape = MODELS[ns.model]
            if ns.quick:  # the quick setup's width, one layer more: the same code path in seconds
                shape = dict(n_layer=QUICK.n_layer + 1, n_head=QUICK.n_head, n_embd=QUICK.n_embd)
            setup = dataclasses.replace(setup, **shape)
        ladder_path = RESULTS / "budget_ladder.json"
        ladder = json.loads(ladder_path.read_text()) if ladder_path.exists() and not ns.quick else {}
        transfer = f"{ns.transfer_from}x" if ns.transfer_from else None
        if given is not None:
            starts = {}
        elif transfer:
            starts = transfer_starts(ledger, transfer, rung, families)
            if any(BASE_OF[f] != f for f in families):  # per-group families: only their group knobs carry over
                base_path = Path(ns.base) if ns.base else RESULTS / "hf_best.json"
                base = json.loads(base_path.read_text()) if base_path.exists() and not ns.quick else {}
                starts = {f: carried_groups(c, base, rung, f) if BASE_OF[f] != f else c for f, c in starts.items()}
            if ns.model != LADDER_MODEL:
                starts = {f: at_law_lr(c, f, setup) for f, c in starts.items()}
        else:
            firsts = {"hf-best": ladder_best_lr(ladder, rung, "adamw") or 2e-3,
                      "recipe": ladder_best_lr(ladder, rung, "recipe") or 1.6e-2}
            starts = {f: start_config(f, firsts[f], setup.max_steps) for f in families if BASE_OF[f] == f}
            base_path = Path(ns.base) if ns.base else RESULTS / "hf_best.json"
            base = (json.loads(base_path.read_text()) if base_path.exists() and not ns.quick else
                    {"runs": {}, "searches": {}})
            for f in families:
                if BASE_OF[f] != f:
                    starts[f] = group_start(ledger, base, rung, f, firsts[BASE_OF[f]], setup.max_steps)
        if given is None and not transfer and import_ladder_starts(ledger, ladder, rung, starts):
            print(f"[hf_best] the budget ladder's {rung} runs at the start lrs are the start points", flush=True)
        env = environment_info()
        env["argv"] = [display_path(a) if Path(a).is_absolute() else a for a in env.get("argv", [])]
        ledger.data["environment"] = env
        command = display_command("python -m benchmarks.hf_best", argv if argv is not None else sys.argv[1:])
        known = rung_commands(ledger, rung)
        ledger.data.setdefault("commands", {})[rung] = known + [command] * (command not in known)
        ledger.data.setdefault("setups", {})[rung] = dataclasses.asdict(setup)
        from hf_fasttrain.data.front import prepare_data

        # runs of 64x and longer keep checkpoints next to the JSON (cheap at this model size), so a killed
        # search loses at most one eval interval of its running runs
        keep = ns.checkpoints == "on" or (ns.checkpoints == "auto" and ns.budget >= CHECKPOINT_FROM_BUDGET)
        partial = out / f"{ns.name}_partial" if keep else None
        data = (unique_corpus_data(setup, setup.max_steps * setup.tokens_per_step) if ns.corpus == "unique"
                else prepare_data(data_args(setup)))
        ledger.data.setdefault("corpora", {})[rung] = {"corpus": ns.corpus,
                                                       "train_tokens": len(data[1]["train"]) * setup.block_size}
        _SHARED.update(setup=setup, data=data, partial=partial, ns_dtype=ns.ns_dtype)
        with tempfile.TemporaryDirectory(prefix="hf-best-") as work:
            _SHARED["work"] = work  # before the pool forks: its workers inherit it
            with worker_pool(ns.jobs, ns.threads) as pool:
                forwarded = stops_forwarded(pool) if pool is not None and partial is not None else contextlib.nullcontext()
                with forwarded:
                    if given is not None:
                        run_config(ledger, rung, families[0], given, ns.seeds, pool,
                                   log=lambda m: print(m, flush=True), check=ns.ns_dtype if ns.precision_check else None)
                    else:
                        search(ledger, rung, starts, pool, ns.seeds, log=lambda m: print(m, flush=True),
                               workers=ns.jobs, transfer_from=transfer)
                    if pool:  # the stop's forwarding lasts while the stopped runs save
                        pool.shutdown(wait=True, cancel_futures=True)
        if processes.STOP:  # each run that was running saved its checkpoint (FastTrainer's save_on_signal or run_arm's callback)
            kept = (f"the running runs saved their checkpoints in {display_path(str(partial))}" if partial is not None
                    else f"below budget {CHECKPOINT_FROM_BUDGET} runs keep no checkpoint: the running runs start over")
            print(f"[hf_best] stopped by {signal.Signals(processes.STOP[0]).name}: {kept}; rerun the same command to resume",
                  flush=True)
            raise SystemExit(stop_exit_code(processes.STOP[0]))
    if ns.report and not searched_rungs(ledger):
        raise UsageError(f"--report: {display_path(str(ledger.path))}: no search recorded there; run one first "
                         "(e.g. `python -m benchmarks.hf_best --budget 16 --jobs 2`)")
    for r in searched_rungs(ledger):  # a report rebuilds every budget's summary from the runs
        ledger.data.setdefault("summary", {})[r] = summarise(ledger, r)
    summary = ledger.data.get("summary", {}).get(rung) or summarise(ledger, rung)
    ledger.save()
    text = report_text(ledger)
    (out / f"{ns.name}.md").write_text(text)
    group_plot(ledger, out / f"{ns.name}.png")
    print(text)
    return {"summary": summary}


def group_start(ledger: Ledger, base: dict[str, Any], rung: str, family: str, lr: float, steps: int) -> dict[str, Any]:
    """The start of a per-group search (``hf-best+``, ``recipe+groups``): its base family's winner at ``rung`` in
    ``base`` (an hf_best ledger), whose runs there are taken over as this family's (``imported_from``: the same
    settings train the same); without a finished search there, the base's start (a smoke run)."""
    source = BASE_OF[family]
    won = ((base.get("searches") or {}).get(rung) or {}).get(source)
    if won is None:
        return start_config(source, lr, steps)
    start = dict(won["best"])
    for r in (base.get("runs") or {}).values():
        if r["rung"] == rung and r["family"] == source and config_key(r["config"]) == config_key(start):
            key = run_key(rung, family, start, r["seed"])
            if key not in ledger.data["runs"]:
                ledger.data["runs"][key] = {**r, "family": family, "imported_from": f"{source}'s winner in hf_best.json"}
    return start


def parse_config(text: str, families: list[str]) -> dict[str, Any]:
    """``--config``: a JSON object of one family's settings, every knob given (as the JSON's run keys show
    them), so it names the same runs as the search's."""
    if len(families) != 1:
        raise UsageError(f"--families: {','.join(families)}: --config runs one family's settings; give one of "
                         f"{', '.join(FAMILIES)}")
    try:
        config = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--config: {text!r}: not JSON ({e.msg}); a JSON object of knob: value") from None
    required = set(start_config(BASE_OF[families[0]], 1.0, 1))
    if not isinstance(config, dict) or not required <= set(config):
        missing = ", ".join(sorted(required - set(config))) if isinstance(config, dict) else "all"
        raise UsageError(f"--config: {text!r}: a JSON object of every {families[0]} knob (missing: {missing})")
    known = required | set(KNOB_DEFAULTS) | {"adamw_lr_scale"}
    unknown = sorted(set(config) - known)
    if unknown:
        raise UsageError(f"--config: {', '.join(unknown)}: not a knob of {families[0]}; knobs: {', '.join(sorted(known))}")
    return dict(sorted(config.items()))  # one order, whatever the JSON's: the report lists settings by name


def run_config(ledger: Ledger, rung: str, family: str, config: dict[str, Any], seeds: int, pool, log=print,
               check: Optional[str] = None) -> list[dict[str, Any]]:
    """Seeds 0 .. ``seeds`` - 1 of one setting, the finished ones skipped; with ``check`` (a precision) each is a
    rerun of a finished run at that Newton-Schulz precision, kept in ``precision_check``, not among the runs."""
    runs = ledger.data["runs"]
    store = ledger.data.setdefault("precision_check", {}) if check else runs
    jobs = []
    for seed in range(seeds):
        key = run_key(rung, family, config, seed)
        if check and key not in runs:
            raise UsageError(f"--precision-check: {key}: no finished run to compare with; run it first")
        if (f"{key}|{check}" if check else key) not in store:
            jobs.append((rung, family, config, seed))
    finished = as_finished(pool if len(jobs) > 1 else None, _run_one, jobs)  # one run: here
    out = []
    for job, r in finished:  # each kept as soon as it ends
        key = run_key(*job)
        store[f"{key}|{check}" if check else key] = r
        ledger.save()
        log(f"[hf_best] {rung} {family:>7s} {config_key(config)} seed {job[3]}"
            f"{' ns ' + r['ns_dtype'] if r.get('ns_dtype') else ''}: final eval loss {r['final_eval_loss']:.4f} "
            f"({r['cpu_seconds']:.0f} CPU-s)")
        out.append(r)
    return out


def transfer_starts(ledger: Ledger, source: str, rung: str, families: list[str]) -> dict[str, dict[str, Any]]:
    """Each family's winner of the finished search at ``source``: the starts of a lr-only sweep at ``rung``.
    The winner's weight-decay timescale is in units of the run (lr x wd x steps), so it carries over as is."""
    done = (ledger.data.get("searches") or {}).get(source) or {}
    missing = [f for f in families if f not in done]
    if missing:
        have = ", ".join(searched_rungs(ledger)) or "none"
        raise UsageError(f"--transfer-from: {source[:-1]}: no finished search of {', '.join(missing)} there "
                         f"(searched budgets: {have}); run `python -m benchmarks.hf_best --budget {source[:-1]}` first")
    if rung_multiple(source) >= rung_multiple(rung):
        raise UsageError(f"--transfer-from: {source[:-1]}: must be a shorter budget than --budget {rung_multiple(rung)}")
    return {f: dict(done[f]["best"]) for f in families}


def tokens_per_param(setup) -> float:
    n = non_embedding_params(setup.n_layer, setup.n_embd, setup.model_type, setup.n_head)
    return setup.max_steps * setup.tokens_per_step / n


def at_law_lr(config: dict[str, Any], family: str, setup) -> dict[str, Any]:
    """A winner moved to another model: its peak lr the measured law's (hf_fasttrain.config.budget, the one
    ``learning_rate: auto`` uses) for the model's width and the run's tokens per parameter, 3 significant
    digits; the other settings as they are. The lr sweep around it checks the law at a point outside its fit."""
    from hf_fasttrain.config.budget import predict_learning_rate

    lr = predict_learning_rate(OPTIMIZER_OF[family], setup.n_embd, tokens_per_param(setup))
    return {**config, "lr": float(f"{lr:.3g}"), "lr_scale": 1.0}


def rung_commands(ledger: Ledger, rung: str) -> list[str]:
    """Every command that added runs to ``rung``, in order (an older file holds one string)."""
    known = (ledger.data.get("commands") or {}).get(rung) or []
    return [known] if isinstance(known, str) else list(known)


def report_text(ledger: Ledger) -> str:
    """The markdown of every budget searched in the ledger, shortest first (two budgets may be searched by
    two processes sharing the file: each rung's table is rebuilt from the runs)."""
    env = ledger.data.get("environment") or {}
    rungs = searched_rungs(ledger)
    text = (f"Machine: {env.get('cpu_count', '?')}-core x86_64 CPU (token counts and losses do not depend on load). "
            f"Seed noise thresholds {NOISE}.\n")
    for r in rungs:
        given = rung_commands(ledger, r) or [f"nice -n 10 python -m benchmarks.hf_best --budget {rung_multiple(r)} --jobs 2"]
        shown = "; then ".join(f"`{c}`" for c in given)
        summary = summarise(ledger, r)
        source = next((f["transfer_from"] for f in summary.values() if f.get("transfer_from")), None)
        how = (f"Not searched: each family starts at its {source} winner and only the peak lr is walked, one run at "
               "a time: x0.5 first, on down while the final loss falls, x2 and on up where the first step down loses, "
               f"at most {TRANSFER_STEPS} steps one way. A sweep begun before the walk ran x0.5 and x2 side by side, extended "
               "while its best was at an edge (its rows list two values).\n\n" if source else "")
        setup = (ledger.data.get("setups") or {}).get(r)
        corpus = ((ledger.data.get("corpora") or {}).get(r) or {})
        if corpus.get("corpus", "stdlib") != "stdlib":
            how += (f"Corpus: the stdlib corpus plus Python sources of the installed packages, "
                    f"{corpus['train_tokens'] / 1e6:.1f}M training tokens, so no row repeats (the stdlib corpus's "
                    "tokenizer and held-out rows: losses compare within this budget, not with the stdlib budgets).\n\n")
        if setup and (setup["n_layer"], setup["n_embd"]) != tuple(MODELS[LADDER_MODEL][k] for k in ("n_layer", "n_embd")):
            shape = type("Shape", (), {**setup, "tokens_per_step": setup["batch_size"] * setup["block_size"]})
            how += (f"Model: GPT-2 {setup['n_layer']}x{setup['n_embd']}, {tokens_per_param(shape):.1f} tokens per "
                    "non-embedding parameter; the starting lr of each family is the measured law's for this width "
                    "and length (`learning_rate: auto`, hf_fasttrain/config/budget.py), so the sweep checks the law at a "
                    "point outside its fit.\n\n")
        text += (f"\n## Budget {r}\n\nCommand: {shown}.\n\n" + how + markdown(summary) + memorisation(ledger, r)
                 + one_run_table(ledger, r, summary) + precision_table(ledger, r, summary)
                 + group_ratio_table(group_ratios(ledger, r, summary, ladder_ledger(), base_ledger())))
    return text


# --- The tables read from the ledger -----------------------------------------------------------------
def base_ledger() -> dict[str, Any]:
    """hf_best's own ledger in the results folder (empty where it has none): the per-group families' bases."""
    path = RESULTS / "hf_best.json"
    return json.loads(path.read_text()) if path.exists() else {}


def ladder_ledger() -> dict[str, Any]:
    """The budget ladder's ledger in the results folder (empty where it has none)."""
    path = RESULTS / "budget_ladder.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _start_runs(ledger: Ledger, rung: str, family: str) -> list[dict[str, Any]]:
    """The runs a per-group search took over from its base family's winner (its start, every seed)."""
    return [r for r in ledger.data["runs"].values()
            if r["rung"] == rung and r["family"] == family and r.get("imported_from")]


def _winner_runs(base: Optional[dict[str, Any]], rung: str, family: str) -> list[dict[str, Any]]:
    """The runs of ``family``'s searched winner at ``rung`` in ``base`` (an hf_best ledger), every seed."""
    won = (((base or {}).get("searches") or {}).get(rung) or {}).get(family)
    if won is None:
        return []
    return [r for r in base["runs"].values() if r["rung"] == rung and r["family"] == family
            and config_key(r["config"]) == config_key(won["best"])]


def group_ratios(ledger: Ledger, rung: str, summary: dict[str, Any],
                 ladder: Optional[dict[str, Any]] = None, base: Optional[dict[str, Any]] = None) -> dict[str, Any]:
    """Where the per-group searches ran (``hf-best+``, ``recipe+groups``): each baseline's final loss (hf-best: the
    winner hf-best+ started from; hf-best+: its winner), and for the recipe (the budget ladder's runs at its best
    lr, from ``ladder``, the headline's; the searched winner, recipe+groups' start; recipe+groups' winner), each
    seed's tokens to that loss over the budget (the one-run measure, interpolated between evaluations) and their
    median; empty where neither search ran. Where the per-group family was carried to ``rung`` rather than
    searched there, hf-best and the recipe's searched winner are the base ledger's (``base``) winners."""
    baselines: dict[str, float] = {}
    carried = "hf-best+" in summary or "recipe+groups" in summary
    start = _start_runs(ledger, rung, "hf-best+") or (_winner_runs(base, rung, "hf-best") if carried else [])
    if start:
        baselines["hf-best"] = statistics.median(r["final_eval_loss"] for r in start)
    if "hf-best+" in summary:
        baselines["hf-best+"] = summary["hf-best+"]["final_eval_loss"]
    if not baselines:
        return {}
    arms = {}
    if "hf-best+" in summary:  # an AdamW user's own gain: hf-best+'s tokens to hf-best's loss
        plus = summary["hf-best+"]["best"]
        arms[PLUS_ARM] = [r for r in ledger.data["runs"].values() if r["rung"] == rung and r["family"] == "hf-best+"
                          and config_key(r["config"]) == config_key(plus)]
    best_lr = ladder_best_lr(ladder or {}, rung, "recipe")
    headline = [r for r in (ladder or {}).get("runs", {}).values()
                if r["rung"] == rung and r["optimizer"] == "recipe" and r["lr"] == best_lr]
    if headline:
        arms["recipe (the budget ladder's, at its best lr)"] = headline
    recipe_start = _start_runs(ledger, rung, "recipe+groups") or _winner_runs(base, rung, "recipe")
    if recipe_start:
        arms["recipe (its searched winner)"] = recipe_start
    fastest = _fastest_runs(base, rung, baselines.get("hf-best"))
    if fastest and not (recipe_start and config_key(fastest[0]["config"]) == config_key(recipe_start[0]["config"])):
        arms[FASTEST_ARM] = fastest
    if "recipe+groups" in summary and not (recipe_start and config_key(summary["recipe+groups"]["best"])
                                           == config_key(recipe_start[0]["config"])):  # not the start again
        best = summary["recipe+groups"]["best"]
        arms["recipe+groups"] = [r for r in ledger.data["runs"].values() if r["rung"] == rung
                                 and r["family"] == "recipe+groups" and config_key(r["config"]) == config_key(best)]
    rows = {}
    for arm, runs in arms.items():
        runs = sorted(runs, key=lambda r: r["seed"])
        per = {}
        for baseline, target in baselines.items():
            if arm == PLUS_ARM and baseline == "hf-best+":  # its own loss: 1 by definition
                continue
            ratios = [crossing(r["curve"], target, "tokens") / (r["max_steps"] * r["tokens_per_step"]) for r in runs]
            per[baseline] = {"per_seed": ratios, "median": statistics.median(ratios)}
        rows[arm] = {"seeds": [r["seed"] for r in runs], "config": runs[0].get("config", {"lr": runs[0].get("lr")}),
                     "final_eval_loss": statistics.median(r["final_eval_loss"] for r in runs), "to": per}
    return {"baselines": baselines, "rows": rows}


PLUS_ARM = "hf-best+ (AdamW with per-group lrs)"
# the long-run summary's recipe (budget_ladder's ``fastest_one_run``): where it is not the searched winner
FASTEST_ARM = "recipe (the setting that reaches hf-best's loss soonest)"


def _fastest_runs(base: Optional[dict[str, Any]], rung: str, target: Optional[float]) -> list[dict[str, Any]]:
    """The runs (every seed) of the recipe setting in ``base`` (an hf_best ledger) that reaches ``target``, hf-best's
    loss, soonest inside a run at ``rung`` (:func:`fastest_one_run`, the long-run summary's recipe); empty without
    one."""
    runs = [r for r in ((base or {}).get("runs") or {}).values() if r["rung"] == rung and r["family"] == "recipe"]
    if target is None or not runs:
        return []
    fastest = fastest_one_run(base, rung, target, runs[0]["max_steps"] * runs[0]["tokens_per_step"])
    if fastest is None:
        return []
    return [r for r in runs if config_key(r["config"]) == config_key(fastest["config"])]


def group_ratio_table(ratios: dict[str, Any]) -> str:
    """The markdown of :func:`group_ratios`."""
    if not ratios:
        return ""
    bases = ratios["baselines"]
    out = ["", "Against both baselines: each one's final eval loss (median of its seeds) and each arm's tokens to it "
           "over the budget (median of the seeds; each seed in brackets):", "",
           "| baseline | final eval loss |", "|---|---|"]
    out += [f"| {b} | {loss:.3f} |" for b, loss in bases.items()]
    if ratios["rows"]:
        out += ["", "| arm | final eval loss | seeds | " + " | ".join(f"tokens to {b}'s loss / budget" for b in bases)
                + " |", "|---|---|---|" + "---|" * len(bases)]
        for arm, row in ratios["rows"].items():
            cells = []
            for b in bases:
                to = row["to"].get(b)
                if to is None:
                    cells.append("-")
                    continue
                each = ", ".join("never" if math.isinf(x) else f"{x:.3f}" for x in to["per_seed"])
                cells.append(("never" if math.isinf(to["median"]) else f"{to['median']:.3f}") + f" ({each})")
            out.append(f"| {arm} | {row['final_eval_loss']:.3f} | {len(row['seeds'])} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def group_plot(ledger: Ledger, path: Path, base: Optional[dict[str, Any]] = None) -> Optional[Path]:
    """Eval loss against tokens of each per-group search's start and winner (seed 0), one panel per budget. Where a
    family was carried to a budget (no start of its own), its base family's winner there comes from ``base`` (an
    hf_best ledger, default results/hf_best.json), and the recipe setting that reaches hf-best's loss soonest is
    drawn where it is not the searched winner."""
    base = base_ledger() if base is None else base
    rungs = [r for r in searched_rungs(ledger) if any(f in (ledger.data.get("summary", {}).get(r) or {})
                                                    for f in ("hf-best+", "recipe+groups"))]
    if not rungs:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rungs), figsize=(6 * len(rungs), 4.2), squeeze=False)
    for ax, rung in zip(axes[0], rungs):
        summary = ledger.data["summary"][rung]
        for family, label in (("hf-best+", "hf-best"), ("recipe+groups", "recipe")):
            if family not in summary:
                continue
            start = [r for r in _start_runs(ledger, rung, family) or _winner_runs(base, rung, label) if r["seed"] == 0]
            best = [r for r in ledger.data["runs"].values() if r["rung"] == rung and r["family"] == family
                    and r["seed"] == 0 and config_key(r["config"]) == config_key(summary[family]["best"])]
            if start and best and config_key(best[0]["config"]) == config_key(start[0]["config"]):
                best = []  # the search kept the start
            for runs, name, style in ((start, label, "--"), (best, family, "-")):
                if runs:
                    c = runs[0]["curve"]
                    ax.plot([p["tokens"] / 1e6 for p in c], [p["eval_loss"] for p in c], style, label=name)
        hf_best = _winner_runs(base, rung, "hf-best")
        winner = _winner_runs(base, rung, "recipe")
        fastest = [r for r in _fastest_runs(base, rung, statistics.median(r["final_eval_loss"] for r in hf_best)
                                            if hf_best else None) if r["seed"] == 0]
        if fastest and not (winner and config_key(winner[0]["config"]) == config_key(fastest[0]["config"])):
            c = fastest[0]["curve"]
            ax.plot([p["tokens"] / 1e6 for p in c], [p["eval_loss"] for p in c], "-.",
                    label="recipe (soonest to hf-best's loss)")
        ladder = ladder_ledger()
        best_lr = ladder_best_lr(ladder, rung, "recipe")
        headline = [r for r in (ladder.get("runs") or {}).values() if r["rung"] == rung and r["optimizer"] == "recipe"
                    and r["lr"] == best_lr and r["seed"] == 0]
        if headline:
            c = headline[0]["curve"]
            ax.plot([p["tokens"] / 1e6 for p in c], [p["eval_loss"] for p in c], ":", label="recipe (budget ladder)")
        ax.set_title(f"budget {rung}, seed 0")
        ax.set_xlabel("training tokens (M)")
        ax.set_ylabel("eval loss")
        ax.set_ylim(top=min(6.0, ax.get_ylim()[1]))
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def one_run_ratios(ledger: Ledger, rung: str, summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Each recipe run at ``rung``: its tokens to hf-best's final loss (median of its seeds) inside the run,
    over the budget (the budget ladder's one-run measure), beside its final loss, best first; empty without
    hf-best's result there. A candidate can tie on the final loss and still get there much sooner."""
    target = (summary.get("hf-best") or {}).get("final_eval_loss")
    if target is None:
        return []
    rows = []
    for r in ledger.data["runs"].values():
        if r["rung"] == rung and r["family"] == "recipe" and r.get("curve"):
            budget = r["max_steps"] * r["tokens_per_step"]
            rows.append({"config": r["config"], "seed": r["seed"], "final_eval_loss": r["final_eval_loss"],
                         "ratio": crossing(r["curve"], target, "tokens") / budget, "target": target,
                         "diverged_at": (r.get("diverged") or {}).get("step"), "ns_dtype": r.get("ns_dtype")})
    return sorted(rows, key=lambda x: (x["ratio"], x["final_eval_loss"]))


def one_run_table(ledger: Ledger, rung: str, summary: dict[str, Any]) -> str:
    """The markdown of :func:`one_run_ratios` (the settings as they differ from the recipe's start)."""
    rows = one_run_ratios(ledger, rung, summary)
    if not rows:
        return ""
    start = recipe_start(ledger, rung)
    out = ["", f"Inside one run: each recipe run's tokens to hf-best's final loss ({rows[0]['target']:.3f}) over the "
           "budget (the budget ladder's one-run measure; interpolated between evaluations), beside its final loss:",
           "", "| settings (as they differ from the recipe's start) | seed | tokens to hf-best's loss / budget | final eval loss |",
           "|---|---|---|---|"]
    for x in rows:
        diff = ", ".join(f"{k} {v}" for k, v in sorted(x["config"].items()) if start.get(k, KNOB_DEFAULTS.get(k)) != v)
        ratio = "never" if math.isinf(x["ratio"]) else f"{x['ratio']:.3f}"
        if x["diverged_at"] is not None:
            ratio += f" (the guard stopped it at step {x['diverged_at']})"
        seed = f"{x['seed']} (Newton-Schulz in {x['ns_dtype']})" if x.get("ns_dtype") else str(x["seed"])
        out.append(f"| {diff or 'the start'} | {seed} | {ratio} | {x['final_eval_loss']:.3f} |")
    return "\n".join(out) + "\n"


def recipe_start(ledger: Ledger, rung: str) -> dict[str, Any]:
    """The recipe's settings the search at ``rung`` started from (the tables show each run's difference)."""
    start = ((ledger.data.get("progress") or {}).get(rung, {}).get("recipe") or {}).get("start")
    if not start:  # a search that began from the budget ladder's run: that run's settings
        first = [r for r in ledger.data["runs"].values()
                 if r["rung"] == rung and r["family"] == "recipe" and r.get("imported_from")]
        start = first[0]["config"] if first else {}
    return start


def precision_table(ledger: Ledger, rung: str, summary: dict[str, Any]) -> str:
    """``--precision-check``'s reruns at ``rung`` beside the runs they repeat (same settings, same seed, Muon's
    Newton-Schulz iteration at another precision): what the precision alone moves, against the seed noise."""
    checks = {k: r for k, r in (ledger.data.get("precision_check") or {}).items() if r["rung"] == rung}
    if not checks:
        return ""
    target = (summary.get("hf-best") or {}).get("final_eval_loss")
    start = recipe_start(ledger, rung)
    out = ["", ("The same run with Muon's Newton-Schulz iteration at another precision (`--precision-check`: same "
                "settings, same seed; every other run here is bfloat16 unless its seed says otherwise), against the "
                f"seed noise threshold {NOISE.get('recipe')}:"), "",
           "| settings | seed | precision | final eval loss: bfloat16 / it | difference | tokens to hf-best's loss / budget: bfloat16 / it |",
           "|---|---|---|---|---|---|"]
    for key, r in sorted(checks.items()):
        base = ledger.data["runs"].get(key.rsplit("|", 1)[0])
        if base is None:
            continue
        diff = ", ".join(f"{k} {v}" for k, v in r["config"].items() if start.get(k, KNOB_DEFAULTS.get(k)) != v)
        ratios = "n/a"
        if target is not None and base.get("curve") and r.get("curve"):
            budget = r["max_steps"] * r["tokens_per_step"]
            ratios = " / ".join(f"{crossing(x['curve'], target, 'tokens') / budget:.3f}" for x in (base, r))
        out.append(f"| {diff or 'the start'} | {r['seed']} | {r['ns_dtype']} | {base['final_eval_loss']:.3f} / "
                   f"{r['final_eval_loss']:.3f} | {r['final_eval_loss'] - base['final_eval_loss']:+.3f} | {ratios} |")
    return "\n".join(out) + "\n"


def memorisation(ledger: Ledger, rung: str) -> str:
    """The runs that measured their loss on training rows (``final_train_loss``): epochs read, that loss and its
    gap to the eval loss (past one epoch, the share of the gain that is memorised data); empty if none."""
    runs = [r for r in ledger.data["runs"].values() if r["rung"] == rung and "final_train_loss" in r]
    if not runs:
        return ""
    rows = ["", "Loss on training rows (as many as the eval rows, spread over the training set) at the end of each "
            "run that measured it:", "", "| family | settings | seed | epochs read | eval loss | training-rows loss | gap |",
            "|---|---|---|---|---|---|---|"]
    for r in sorted(runs, key=lambda r: (r["family"], r["final_eval_loss"])):
        settings = ", ".join(f"{k} {v}" for k, v in sorted(r["config"].items()))
        rows.append(f"| {r['family']} | {settings} | {r['seed']} | {r['epochs']:.2f} | "
                    f"{r['final_eval_loss']:.3f} | {r['final_train_loss']:.3f} | "
                    f"{r['final_eval_loss'] - r['final_train_loss']:+.3f} |")
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    run_cli(main)
