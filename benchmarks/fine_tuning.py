"""Fine-tuning: which parts speed up supervised fine-tuning (completion-only loss) of a pretrained model.

    python -m benchmarks.fine_tuning                  # bases, sweeps, every arm, 3 seeds (about 10 CPU-minutes)
    python -m benchmarks.fine_tuning --seeds 2        # fewer seeds (the table is rewritten after each seed)
    python -m benchmarks.fine_tuning --quick          # a smoke run (tiny everything)

**Bases.** A tiny GPT-2 (2 layers, 64 wide, vocabulary 4096, 128 positions) pretrained on the embedded
corpus (the running Python's standard library) twice: with hf-tuned AdamW (``benchmarks._harness.lm.HF_TUNED``) and with
the Muon recipe (``benchmarks._harness.lm.MUON_RECIPE``). 30% of the stdlib's files (chosen by a hash of the path, as the
corpus's own split) are held out of pretraining and of the tokenizer. Each base is built once and cached under
the package's cache directory, keyed by its settings; a rerun rebuilds it identically (same seed, same data).

**Task.** Every function or method with a docstring in the held-out files: the prompt is its signature and
docstring, the completion its body (dedented; up to 128 tokens, so lengths vary from a few tokens to the cap).
Fine-tuning examples come from the held-out files outside the corpus's 5% validation files; the evaluation is
on a fixed sample of the functions of those 5% files (other modules). Labels are completion-only
(``hf_fasttrain.data.sft``); the reported loss is the held-out completion loss.

**Arms** (each trained for the same budget of real, non-padding input tokens; seeds interleaved):

- ``hf-tuned``: ``transformers.Trainer`` with hf-tuned's options (AdamW, 2% warmup, cosine to 10%, wd 0.1,
  clip 1), the Trainer's padding (random batches of 8, padded to the longest), peak lr picked by a sweep.
- one part alone on top of hf-tuned (FastTrainer): ``+token-budget`` (batches of up to a token budget),
  ``+packing`` (row packing), ``+ema``, ``+wsd`` (warmup-stable-decay, 1-sqrt cooldown over the last 20%),
  ``+guard`` (divergence guard);
- ``muon@adamw-base``, ``muon@muon-base`` (Muon + AdamW, its lr swept) and ``hf-tuned@muon-base`` (AdamW on the
  Muon base, its comparison);
- ``best``: hf-tuned with every part that beat it on tokens to target (decided on seed 0, then frozen);
- ``trl-sft``: TRL's ``SFTTrainer`` with the best parts as callbacks, when TRL imports (an optional extra).

Each run is saved as it ends (``--out/fine_tuning_runs/<arm>-seed<k>.json``, keyed by its settings); a rerun
skips the saved ones. Writes fine_tuning.json, fine_tuning.md and fine_tuning.png into ``--out``.
"""

from __future__ import annotations

if not __package__:
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.fine_tuning [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import dataclasses
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from hf_fasttrain.data.corpus import cache_root  # noqa: E402
from hf_fasttrain.data.front import prepare_data  # noqa: E402

from benchmarks._harness import RESULTS, machine_info, write_json  # noqa: E402
from benchmarks._harness.finetune import (BASES, PARTS, QUICK, Setup, _key, arm_args, base_data_args, build_base,  # noqa: E402
                                          make_spec, muon_args, plans, run_one, sft_data)
from benchmarks._harness.lm import HF_TUNED, crossing, summarise  # noqa: E402

SWEEP_NAME = re.compile(r"@[0-9.e-]+$")  # arms of the lr sweeps: <arm>@<lr>

DESCRIPTIONS = {
    "hf-tuned": "Trainer, AdamW at the swept lr, 2% warmup, cosine to 10%, wd 0.1, clip 1; random batches padded to the longest",
    "+token-budget": "hf-tuned + token-budget batches (max_tokens_per_batch padded tokens; as many real tokens a step)",
    "+packing": "hf-tuned + row packing (rows of 128 tokens, restarting positions, no cross-attention; as many real "
                "tokens a step)",
    "+ema": "hf-tuned + EMA of the weights (decay 0.98), evaluated and kept",
    "+wsd": "hf-tuned with warmup-stable-decay (1-sqrt cooldown over the last 20%, floor 10%) instead of cosine",
    "+guard": "hf-tuned + the divergence guard (skip or roll back on NaN and loss spikes)",
    "muon@adamw-base": "FastTrainer, Muon+AdamW (hf-tuned's other settings, lr swept), on the AdamW-pretrained base",
    "hf-tuned@muon-base": "hf-tuned (Trainer, AdamW) on the Muon-pretrained base",
    "muon@muon-base": "FastTrainer, Muon+AdamW (lr swept) on the Muon-pretrained base",
    "best": "hf-tuned with every part that beat it on tokens to target (chosen on the first seeds)",
    "trl-sft": "TRL SFTTrainer (completion-only loss, its own padding collator) with the best combination's parts: "
               "callbacks and the optimizer by name (batching left to TRL)",
}



def trl_version() -> Optional[str]:
    try:
        import trl  # noqa: F401
    except Exception:
        return None
    return trl.__version__


def main(argv=None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="tiny smoke setup")
    p.add_argument("--lrs", default="1e-3,3e-3,1e-2", help="AdamW peak lrs swept for hf-tuned (seed 0)")
    p.add_argument("--muon-lrs", default="4e-3,1.6e-2", help="Muon peak lrs swept on each base (seed 0)")
    p.add_argument("--combo-seeds", type=int, default=1, help="seeds of the parts that decide the best combination")
    p.add_argument("--no-trl", action="store_true", help="leave out the TRL arm even when TRL imports")
    p.add_argument("--retime", action="store_true",
                   help="run again the saved runs of the table's arms that have no CPU-seconds clock (saved before it)")
    p.add_argument("--no-train", action="store_true",
                   help="train nothing: write the table from the saved runs (those of seed 0 must be there)")
    p.add_argument("--out", default=str(RESULTS))
    p.add_argument("--name", default="fine_tuning")
    p.add_argument("--cache", default=None, help="where the pretrained bases are kept (default: the package cache)")
    ns = p.parse_args(argv)
    torch.set_num_threads(1)
    setup = QUICK if ns.quick else Setup()
    out = Path(ns.out)
    runs_dir = out / f"{ns.name}_runs"
    runs_dir.mkdir(parents=True, exist_ok=True)
    cache = Path(ns.cache) if ns.cache else cache_root() / "fine_tuning_bases"
    bases_info: dict[str, Any] = {}
    bases = {name: build_base(name, setup, cache, bases_info) for name in BASES}
    tokenizer, _ = prepare_data(base_data_args(setup))
    train, ev, data_info = sft_data(setup, tokenizer)
    plans_, fills = plans(train, setup)
    print(f"[fine_tuning] data: {json.dumps(data_info)}\n[fine_tuning] plans: "
          f"{ {k: dataclasses.asdict(v) for k, v in plans_.items()} } {fills}", flush=True)
    runs: list[dict[str, Any]] = []
    specs: dict[str, dict[str, Any]] = {}
    work = Path(tempfile.mkdtemp(prefix="ft-"))

    done: dict[str, dict[str, Any]] = {}  # key -> result: an arm equal to a sweep point reuses its run

    def run(spec: dict[str, Any], seed: int) -> dict[str, Any]:
        key = _key([{k: v for k, v in spec.items() if k != "arm"}, seed, dataclasses.asdict(setup), data_info])
        path = runs_dir / f"{spec['arm'].replace('/', '_')}-seed{seed}.json"
        try:
            saved = json.loads(path.read_text())
        except (OSError, ValueError):
            saved = None
        if saved and saved.get("key") == key and not (ns.retime and "cpu_seconds" not in saved
                                                        and not SWEEP_NAME.search(spec["arm"])):
            r = saved
        elif ns.no_train and key not in done:
            print(f"[fine_tuning] {spec['arm']:>20s} seed {seed}: no saved run, left out", flush=True)
            return None
        elif key in done and not (ns.retime and "cpu_seconds" not in done[key]):
            r = {**done[key], "arm": spec["arm"], "same_run_as": done[key]["arm"]}
            write_json(path, r)
        else:
            base = bases[spec["base"]]
            r = run_one(spec, seed, setup, base, tokenizer, train, ev, work)
            r["key"] = key
            write_json(path, r)
            print(f"[fine_tuning] {spec['arm']:>20s} seed {seed}: final loss {r['final_eval_loss']:.4f}, "
                  f"{r['train_seconds']:.1f} s, {r['real_tokens_per_s']:.0f} real tokens/s", flush=True)
        done.setdefault(key, r)
        runs.append(r)
        specs[spec["arm"]] = spec
        return r

    # 1. sweeps (seed 0): AdamW's peak lr for hf-tuned, Muon's on each base
    lrs = [float(x) for x in ns.lrs.split(",")]
    sweep = {lr: run(make_spec(f"hf-tuned@{lr:g}", "adamw-base", *arm_args("", lr, fills, [])[:2], "padded", plans_, setup), 0)
             for lr in lrs}
    lr = min(sweep, key=lambda x: sweep[x]["final_eval_loss"])
    muon_lr = {}
    for base in BASES:
        got = {m: run(make_spec(f"muon@{base}@{m:g}", base, True, muon_args(m), "padded", plans_, setup), 0)
               for m in (float(x) for x in ns.muon_lrs.split(","))}
        muon_lr[base] = min(got, key=lambda x: got[x]["final_eval_loss"])
    print(f"[fine_tuning] swept: AdamW lr {lr:g}; Muon lr {muon_lr}", flush=True)

    arm_specs = {"hf-tuned": make_spec("hf-tuned", "adamw-base", False, {**HF_TUNED, "learning_rate": lr}, "padded", plans_, setup)}
    for part in PARTS:
        fast, settings, plan = arm_args(part, lr, fills, [part])
        arm_specs[part] = make_spec(part, "adamw-base", fast, settings, plan, plans_, setup)
    arm_specs["muon@adamw-base"] = make_spec("muon@adamw-base", "adamw-base", True, muon_args(muon_lr["adamw-base"]),
                                             "padded", plans_, setup)
    arm_specs["hf-tuned@muon-base"] = make_spec("hf-tuned@muon-base", "muon-base", False,
                                                {**HF_TUNED, "learning_rate": lr}, "padded", plans_, setup)
    arm_specs["muon@muon-base"] = make_spec("muon@muon-base", "muon-base", True, muon_args(muon_lr["muon-base"]),
                                            "padded", plans_, setup)
    seeds = list(range(ns.seeds))
    decide = seeds[: max(1, min(ns.combo_seeds, len(seeds)))]
    for seed in decide:
        for spec in arm_specs.values():
            run(spec, seed)
    # 2. the best combination: the parts (and Muon) that reached hf-tuned's final loss in fewer tokens
    first = [r for r in runs if r["seed"] in decide]
    early = summarise(first, list(arm_specs), "hf-tuned", target=statistics.median_high(
        r["final_eval_loss"] for r in first if r["arm"] == "hf-tuned"))["arms"]
    winners = [p for p in PARTS if early[p]["tokens_ratio_vs_reference"] < 0.97]
    if "+token-budget" in winners and "+packing" in winners:  # one batching: the one with fewer tokens to target
        winners.remove(max(("+token-budget", "+packing"), key=lambda p: early[p]["tokens_ratio_vs_reference"]))
    use_muon = early["muon@adamw-base"]["tokens_ratio_vs_reference"] < 0.97
    fast, settings, plan = arm_args("best", lr, fills, winners)
    if use_muon:
        fast, settings = True, {**settings, "optimizer": "muon", "learning_rate": muon_lr["adamw-base"]}
    combo = {"parts": winners, "muon": use_muon, "decided_on_seeds": decide}
    arm_specs["best"] = make_spec("best", "adamw-base", True, {**settings}, plan, plans_, setup)
    arm_specs["best"]["fast"] = True
    version = None if ns.no_trl else trl_version()
    if version:
        trl_settings = {k: v for k, v in settings.items() if k not in ("max_tokens_per_batch", "packing",
                                                                        "packing_row_length")}
        if "per_device_train_batch_size" in trl_settings:
            del trl_settings["per_device_train_batch_size"]
        arm_specs["trl-sft"] = make_spec("trl-sft", "adamw-base", False, trl_settings, "padded", plans_, setup, client="trl")
    for seed in decide:
        for name in ("best", "trl-sft"):
            if name in arm_specs:
                run(arm_specs[name], seed)

    def write() -> dict[str, Any]:  # after every round of seeds: a stopped run leaves its table so far
        return report(runs, arm_specs, specs, lr, muon_lr, combo, version, bases_info, data_info, plans_, fills,
                      setup, ns, out, argv)

    record = write()
    for seed in seeds[len(decide):]:
        for spec in arm_specs.values():
            run(spec, seed)
        record = write()
    shutil.rmtree(work, ignore_errors=True)
    return record


def report(runs, arm_specs, specs, lr, muon_lr, combo, version, bases_info, data_info, plans_, fills, setup, ns, out,
           argv) -> dict[str, Any]:
    arms = list(arm_specs)
    main_runs = [r for r in runs if r["arm"] in arms]
    # the target: hf-tuned's median final loss (the higher middle one for an even count of seeds, so that every
    # hf-tuned seed but the worst reaches it and its time to target is finite)
    target = statistics.median_high(r["final_eval_loss"] for r in main_runs if r["arm"] == "hf-tuned")
    summary = summarise(main_runs, arms, "hf-tuned", target=target)
    muon_base = summarise(main_runs, ["hf-tuned@muon-base", "muon@muon-base"], "hf-tuned@muon-base")
    sweeps = {r["arm"]: r["final_eval_loss"] for r in runs if "@" in r["arm"] and r["arm"].count("@") >= 1
              and r["arm"] not in arms}
    target = summary["target_eval_loss"]
    ref_cpu = None
    for a, row in summary["arms"].items():
        rs = [r for r in main_runs if r["arm"] == a]
        timed = all("cpu_seconds" in r for r in rs)  # runs saved before the CPU clock was added have none
        row["cpu_seconds_to_target"] = (statistics.median(crossing(r["curve"], target, "cpu_seconds") for r in rs)
                                        if timed else math.nan)
        row["real_tokens_per_cpu_s"] = statistics.median(r["real_tokens_per_cpu_s"] for r in rs) if timed else math.nan
        row["real_tokens_per_s"] = statistics.median(r["real_tokens_per_s"] for r in rs)
        row["padding"] = arm_specs[a]["padding"]
        row["steps"] = arm_specs[a]["steps"]
    ref_cpu = summary["arms"].get("hf-tuned", {}).get("cpu_seconds_to_target", math.nan)
    for row in summary["arms"].values():
        row["cpu_ratio_vs_reference"] = (row["cpu_seconds_to_target"] / ref_cpu if 0 < ref_cpu < math.inf
                                         else math.nan)
    command = "python -m benchmarks.fine_tuning " + " ".join(argv if argv is not None else sys.argv[1:])
    machine = machine_info()
    record = {"command": command.strip(), "setup": dataclasses.asdict(setup), "data": data_info, "bases": bases_info,
              "plans": {k: dataclasses.asdict(v) for k, v in plans_.items()}, "fills": fills,
              "swept": {"adamw_lr": lr, "muon_lr": muon_lr, "final_losses": sweeps}, "combination": combo,
              "trl": version or "not installed", "summary": summary, "muon_base": muon_base,
              "arms": {a: {**arm_specs[a], "description": DESCRIPTIONS.get(a, "")} for a in arms},
              "machine": machine, "runs": runs}
    table = markdown(record)
    print(table)
    write_json(out / f"{ns.name}.json", record)
    (out / f"{ns.name}.md").write_text(table)
    plot(record, out / f"{ns.name}.png")
    return record


def _f(x, digits=3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "not reached"
    return f"{x:.{digits}g}"


def verdict(row: dict[str, Any]) -> str:
    """Tokens to target against hf-tuned's: within 3% either way is no measurable gain."""
    t = row["tokens_ratio_vs_reference"]
    if not math.isfinite(row["tokens_to_target"]):
        return "does not help (the median seed does not reach the target)"
    if not (isinstance(t, float) and math.isfinite(t)):
        return "n/a"
    if t < 0.97:
        return "helps"
    if t <= 1.03:
        return "no measurable gain"
    return "does not help"


def _verdict_cell(arm: str, row: dict[str, Any]) -> str:
    if arm == "hf-tuned":
        return "reference"
    return "other base: see below" if arm.endswith("@muon-base") else verdict(row)


def markdown(record) -> str:
    s, m = record["summary"], record["machine"]
    d = record["data"]
    lines = [
        f"Command: `{record['command']}`  ",
        f"Machine: a {m.get('cpu_count', '?')}-core x86_64 CPU, 1 torch thread, shared with other jobs (loaded: "
        "wall-clock figures are noisy and runs are sequential, not side by side; CPU seconds of the training process, "
        "evaluation excluded, are the steadier cost; tokens are exact); "
        f"torch {m.get('torch')}, transformers {m.get('transformers')}, TRL {record['trl']}.",
        "",
        f"Task: {d['train_examples']} stdlib functions (signature + docstring -> body) from {d['train_files']} modules "
        f"held out of pretraining; evaluation on {d['eval_examples']} functions of {d['eval_files']} other modules. "
        f"Lengths {d['min_len']}-{d['max_len']} tokens (median {d['median_len']:.0f}, 10-90% "
        f"{d['p10_p90_len'][0]:.0f}-{d['p10_p90_len'][1]:.0f}); completion tokens are "
        f"{100 * d['completion_token_share']:.0f}% of all. Budget: {record['setup']['tokens']:,} real input tokens per run.",
        f"Swept: AdamW lr {record['swept']['adamw_lr']:g} (hf-tuned), Muon lr {record['swept']['muon_lr']}. "
        f"Best combination: {' + '.join(record['combination']['parts']) or 'no part'}"
        f"{' + Muon' if record['combination']['muon'] else ''} (decided on seeds {record['combination']['decided_on_seeds']}).",
        "",
        f"Target: held-out completion loss {s['target_eval_loss']:.4f} (hf-tuned's median final loss; the higher "
        "middle one for an even number of seeds).",
        "",
        "| arm | verdict | tokens to target vs hf-tuned | CPU-s to target vs hf-tuned | final loss | seeds reaching |",
        "|---|---|---|---|---|---|",
    ]

    def cell(a, x, digits=3):  # an arm on the other base has another target: no figure against this one
        return "other base: below" if a.endswith("@muon-base") else _f(x, digits)

    for a, r in s["arms"].items():
        lines.append(f"| {a} | {_verdict_cell(a, r)} | {cell(a, r['tokens_ratio_vs_reference'])} | "
                     f"{cell(a, r['cpu_ratio_vs_reference'])} | {r['final_eval_loss']:.4f} | "
                     f"{r['reached']}/{r['seeds']} |")
    lines += ["", "What each arm cost, over each whole run (the time columns to the same target):", "",
              "| arm | tokens to target | CPU s to target | wall s to target | real tokens per CPU-s | padding | steps |",
              "|---|---|---|---|---|---|---|"]
    for a, r in s["arms"].items():
        lines.append(f"| {a} | {cell(a, r['tokens_to_target'])} | {cell(a, r['cpu_seconds_to_target'])} | "
                     f"{cell(a, r['seconds_to_target'])} | {_f(r['real_tokens_per_cpu_s'], 4)} | "
                     f"{100 * r['padding']:.0f}% | {r['steps']} |")
    mb = record["muon_base"]
    lines += ["", f"On the Muon-pretrained base (target {mb['target_eval_loss']:.4f}, AdamW fine-tuning's median final):",
              "", "| arm | final loss | tokens to target | vs AdamW on that base |", "|---|---|---|---|"]
    for a, r in mb["arms"].items():
        lines.append(f"| {a} | {r['final_eval_loss']:.4f} | {_f(r['tokens_to_target'])} | {_f(r['tokens_ratio_vs_reference'])} |")
    b = record["bases"]
    lines += ["", "Bases: " + "; ".join(f"{k}: {v['description']}, {v['tokens']:,} tokens, pretraining eval loss "
                                         f"{v['pretraining_eval_loss']:.4f}" for k, v in b.items()) + "."]
    lines += ["", "Sweeps (seed 0, final loss): " + ", ".join(f"{k} {v:.4f}" for k, v in record["swept"]["final_losses"].items())]
    return "\n".join(lines) + "\n"


def plot(record, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = record["summary"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(s["arms"]):
        for j, r in enumerate(x for x in record["runs"] if x["arm"] == arm):
            pts = r["curve"]
            ax1.plot([p["tokens"] for p in pts], [p["eval_loss"] for p in pts], color=colours[i % len(colours)],
                     ls="-" if i < len(colours) else "--", alpha=0.8, lw=1.1, label=arm if j == 0 else None)
    ax1.axhline(s["target_eval_loss"], color="k", ls=":", lw=0.8, label="target (hf-tuned final)")
    ax1.set_xlabel("real (non-padding) input tokens")
    ax1.set_ylabel("held-out completion loss")
    ax1.set_title("Fine-tuning curves, one line per seed")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7)
    names = list(s["arms"])
    ratios = [s["arms"][a]["tokens_ratio_vs_reference"] for a in names]
    ax2.barh(names, [r if isinstance(r, float) and math.isfinite(r) else 0 for r in ratios], color="tab:blue")
    ax2.axvline(1.0, color="k", lw=0.8)
    ax2.set_xlabel("tokens to hf-tuned's final loss, relative to hf-tuned (0 = not reached)")
    ax2.invert_yaxis()
    fig.suptitle(f"benchmarks/fine_tuning.py, {record['machine'].get('cpu_count', '?')}-core CPU (shared)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
