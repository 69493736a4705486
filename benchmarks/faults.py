"""Fault injection: does training survive NaN/inf, gradient blow-ups, loss spikes and corrupt weights?

    python -m benchmarks.faults                  # ~12 minutes on a shared 2-core CPU
    python -m benchmarks.faults --steps 100      # a quick look

Trains a tiny GPT-2 (2 layers, 32 wide, vocab 64, 32 tokens) on learnable sequences
``(a + b*i) mod 64`` for ``--steps`` optimizer steps (AdamW 3e-3, 10 warmup steps then cosine,
batch 16, checkpoint every 25 steps) in six setups:

- ``fasttrainer``: ``FastTrainer`` as the recipes set it (``clip_mode: norm``, ``max_grad_norm: 1``,
  ``divergence_guard: true``, snapshot every 20 steps);
- ``fasttrainer+ema``, ``fasttrainer+lawa``: the same with a weight average (EMA 0.99, or LAWA over the
  last 5 copies 10 steps apart), which the guard rolls back with the weights; the final model is the
  average, and every checkpoint's ``weight_average.pt`` is scanned too;
- ``trainer+mixin``: a plain ``transformers.Trainer`` with ``StabilityTrainerMixin`` mixed in and
  ``DivergenceGuardCallback(snapshot_every=20)`` added, ``max_grad_norm=1``;
- ``trainer+callbacks``: the same without the mixin (the guard reads the loss from the logs,
  ``logging_steps=1``, and sees gradients after the Trainer clipped them);
- ``bare``: the plain Trainer alone, ``max_grad_norm=1``.

and injects one fault per run at step ``--at`` (after the guard's 64-step warm-up unless said):
NaN loss, inf loss, x1e6 gradient (all weights; one matrix), x1e6 gradient inside the warm-up,
x50 loss for 3 and for 5 steps, a NaN written into the weights after an update, and a x50 loss 5 steps
after a resume (the run stops at a checkpoint, a new Trainer resumes from it). ``none`` is the clean run.

Reported per run: survived (``train()`` returned, final weights finite), what the guard did at the
injected steps, held-out loss on 256 unseen rows, and the non-finite tensors in every checkpoint
written (model and optimizer files). A second, small table re-measures the plain-Trainer advice for
value clipping under a x1e6 gradient in the warm-up.

Each run's result is saved under ``--work/runs/<name>.json`` as it ends and reused on rerun
(``--fresh`` starts over). Writes benchmarks/results/faults.{json,md,png}.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.faults [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import json
import math
import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from hf_fasttrain import DivergenceError, DivergenceGuardCallback, FastTrainer, FastTrainingArguments  # noqa: E402
from hf_fasttrain.callbacks import StabilityTrainerMixin, WeightAveragingCallback  # noqa: E402
from hf_fasttrain.callbacks.clipping import GradientClippingCallback  # noqa: E402

from benchmarks._harness import RESULTS, run_cli, UsageError, write_json  # noqa: E402

V, T, BS = 64, 32, 16
SAVE_EVERY, SNAPSHOT_EVERY, RESUME_AT = 25, 20, 75
ONE_MATRIX = "transformer.h.0.mlp.c_fc.weight"

SETUPS = ("fasttrainer", "fasttrainer+ema", "fasttrainer+lawa", "trainer+mixin", "trainer+callbacks", "bare")
INJECTIONS = {
    "none": "clean run",
    "nan_loss": "NaN loss at step {at}",
    "inf_loss": "inf loss at step {at}",
    "grad_x1e6_all": "x1e6 gradient, all weights, step {at}",
    "grad_x1e6_one": "x1e6 gradient, one matrix, step {at}",
    "grad_x1e6_warmup": "x1e6 gradient, all weights, step 30 (guard warm-up)",
    "loss_x50_3": "x50 loss, steps {at}-{at2}",
    "loss_x50_5": "x50 loss, steps {at}-{at4}",
    "nan_weight": "NaN weight after update {at}",
    "spike_after_resume": "x50 loss at step {r5}, 5 steps after a resume at {r}",
}
# the plain-Trainer advice for value clipping, under grad_x1e6_warmup
ADVICE = {
    "value clip, max_grad_norm=0": dict(max_grad_norm=0.0, guard=False),
    "value clip + max_grad_norm=1": dict(max_grad_norm=1.0, guard=False),
    "value clip, max_grad_norm=0, + guard": dict(max_grad_norm=0.0, guard=True),
}


def rows(n: int, seed: int) -> list[dict[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    ids = (torch.randint(0, V, (n, 1), generator=g) + torch.randint(1, 4, (n, 1), generator=g) * torch.arange(T)) % V
    return [{"input_ids": r, "labels": r.clone()} for r in ids]


def fault_steps(injection: str, at: int) -> dict[int, str]:
    """Step (1-based, the optimizer step about to be taken) -> fault."""
    if injection in ("nan_loss", "inf_loss", "grad_x1e6_all", "grad_x1e6_one"):
        return {at: injection}
    if injection == "grad_x1e6_warmup":
        return {30: "grad_x1e6_all"}
    if injection in ("loss_x50_3", "loss_x50_5"):
        return {at + i: "loss_x50" for i in range(int(injection[-1]))}
    if injection == "spike_after_resume":
        return {RESUME_AT + 5: "loss_x50"}
    return {}  # none; nan_weight is written by a callback


class Injector:
    """Trainer mixin: applies the fault of the step being computed (``global_step + 1``)."""

    faults: dict[int, str] = {}

    def _fault(self) -> str | None:
        return self.faults.get(self.state.global_step + 1)

    def training_step(self, model, inputs, num_items_in_batch=None):
        handle = None
        if self._fault() == "grad_x1e6_one":
            param = dict(model.named_parameters())[ONE_MATRIX]
            handle = param.register_hook(lambda g: g * 1e6)
        try:
            return super().training_step(model, inputs, num_items_in_batch)
        finally:
            if handle is not None:
                handle.remove()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss = super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        fault = self._fault() if model.training else None
        if fault == "nan_loss":
            loss = loss * float("nan")
        elif fault == "inf_loss":
            loss = loss * float("inf")
        elif fault == "grad_x1e6_all":
            loss = loss + (1e6 - 1.0) * (loss - loss.detach())  # same value, gradient x 1e6
        elif fault == "loss_x50":
            loss = loss * 50.0
        return loss


class InjectedTrainer(Injector, Trainer):
    pass


class InjectedFastTrainer(Injector, FastTrainer):
    pass


class InjectedMixinTrainer(Injector, StabilityTrainerMixin, Trainer):
    pass


class CorruptWeights(TrainerCallback):
    """A NaN in one weight right after the update of ``step`` (a bad update that reached the weights)."""

    def __init__(self, step: int):
        self.step = step

    def on_optimizer_step(self, args, state, control, model=None, **kwargs):
        if state.global_step + 1 == self.step:
            with torch.no_grad():
                dict(model.named_parameters())[ONE_MATRIX][0, 0] = float("nan")


class StopAt(TrainerCallback):
    """Ends training after ``step`` (its checkpoint is written first): a killed run."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_save = True
            control.should_training_stop = True


def make_trainer(setup: str, out: Path, steps: int, faults: dict[int, str], extra_callbacks=(), clip_value=False, **overrides):
    common = dict(
        output_dir=str(out), max_steps=steps, per_device_train_batch_size=BS, per_device_eval_batch_size=64,
        learning_rate=3e-3, lr_scheduler_type="cosine", warmup_steps=10, weight_decay=0.0, logging_steps=1,
        save_strategy="steps", save_steps=SAVE_EVERY, report_to="none", use_cpu=True, disable_tqdm=True, seed=0,
        dataloader_num_workers=0, max_grad_norm=1.0,
    )
    common.update(overrides)
    callbacks = list(extra_callbacks)
    if setup.startswith("fasttrainer"):
        args = FastTrainingArguments(
            **common, auto_resume=False, clip_mode="norm", divergence_guard=True, guard_snapshot_every=SNAPSHOT_EVERY,
            weight_averaging=setup.partition("+")[2] or "none",
        )
        cls = InjectedFastTrainer
    else:
        args = TrainingArguments(**common)
        cls = InjectedMixinTrainer if setup == "trainer+mixin" else InjectedTrainer
        if setup in ("trainer+mixin", "trainer+callbacks"):
            callbacks.insert(0, DivergenceGuardCallback(snapshot_every=SNAPSHOT_EVERY))
        if clip_value:
            callbacks.append(GradientClippingCallback(mode="value", clip_value=1.0))
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(
        vocab_size=V, n_positions=T, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=0, eos_token_id=0,
    ))
    trainer = cls(model=model, args=args, train_dataset=rows(steps * BS, seed=1), eval_dataset=rows(256, seed=2),
                  callbacks=callbacks)
    trainer.faults = faults
    return trainer


def nonfinite_on_disk(out: Path) -> dict[str, int]:
    """Tensors with a NaN/inf in every checkpoint's model and optimizer files (and how many files)."""
    import safetensors.torch

    tensors = bad_tensors = files = bad_files = 0

    def walk(obj):
        if isinstance(obj, torch.Tensor):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                yield from walk(v)

    for ckpt in sorted(out.glob("checkpoint-*")):
        for f in sorted(ckpt.glob("*.safetensors")) + sorted(ckpt.glob("optimizer.pt")) + sorted(ckpt.glob("weight_average.pt")):
            loaded = safetensors.torch.load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, weights_only=True)
            ts = [t for t in walk(loaded) if t.is_floating_point()]
            n_bad = sum(1 for t in ts if not bool(torch.isfinite(t).all()))
            tensors, bad_tensors, files, bad_files = tensors + len(ts), bad_tensors + n_bad, files + 1, bad_files + (n_bad > 0)
    return {"tensors": tensors, "nonfinite_tensors": bad_tensors, "files": files, "nonfinite_files": bad_files}


def guard_of(trainer) -> DivergenceGuardCallback | None:
    return next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, DivergenceGuardCallback)), None)


def run_one(setup: str, injection: str, steps: int, at: int, work: Path, advice: dict | None = None) -> dict[str, Any]:
    out = work / "out" / f"{setup}__{injection}".replace("+", "_").replace(" ", "_").replace(",", "").replace("=", "")
    shutil.rmtree(out, ignore_errors=True)
    faults = fault_steps(injection, at)
    extra = [CorruptWeights(at)] if injection == "nan_weight" else []
    overrides = {}
    if advice is not None:
        overrides["max_grad_norm"] = advice["max_grad_norm"]
    t0 = time.process_time()
    error = None
    if injection == "spike_after_resume":  # a run that ends at a checkpoint, then the same command resumed
        first = make_trainer(setup, out, steps, faults, extra_callbacks=[StopAt(RESUME_AT)], **overrides)
        first.train()
        trainer = make_trainer(setup, out, steps, faults, **overrides)
        resume = str(out / f"checkpoint-{RESUME_AT}")
    else:
        trainer = make_trainer(setup, out, steps, faults, extra_callbacks=extra, clip_value=advice is not None, **overrides)
        resume = None
    try:
        trainer.train(resume_from_checkpoint=resume)
    except DivergenceError as exc:
        error = f"DivergenceError: {str(exc)[:200]}"
    finite = all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters())
    eval_loss = float(trainer.evaluate()["eval_loss"]) if finite else float("nan")
    guard = guard_of(trainer)
    averager = next((cb for cb in trainer.callback_handler.callbacks if isinstance(cb, WeightAveragingCallback)), None)
    events = [] if guard is None else list(guard.memory.events)
    injected = sorted(faults) or ([at] if injection == "nan_weight" else [])
    # what the guard did about the fault: events at the injected steps or within 2 steps after them
    near = [e for e in events if any(s <= e["step"] <= s + 2 for s in injected)]
    return {
        "setup": setup,
        "injection": injection,
        "injected_steps": injected,
        "survived": error is None and finite and math.isfinite(eval_loss),
        "error": error,
        "final_weights_finite": finite,
        "eval_loss": eval_loss,
        "steps_done": trainer.state.global_step,
        "guard": None if guard is None else {
            "skipped_nonfinite": guard.memory.num_skipped_nonfinite,
            "skipped_spike": guard.memory.num_skipped_spike,
            "rollbacks": guard.memory.num_rollbacks,
            "events": events,
        },
        "detected": None if guard is None else bool(near) if injected else not events,
        "actions": [f"{e['kind']}@{e['step']}" for e in near],
        "disk": nonfinite_on_disk(out),
        # with a weight average: whether the final model is it (a non-finite average is not shipped)
        "final_is_average": None if averager is None or averager.average is None else bool(averager.average.finite()),
        "cpu_seconds": round(time.process_time() - t0, 1),
    }


def fmt_actions(r: dict) -> str:
    if r["guard"] is None:
        return "-"
    acts = r["actions"]
    if not acts and r["setup"] == "trainer+callbacks" and r["injection"].startswith("grad_"):
        return "not judged: clipped by the Trainer first"  # documented: no mixin, max_grad_norm > 0
    if not acts:
        return "none" if r["injection"] == "none" and not r["guard"]["events"] else "missed"
    kinds = {}
    for a in acts:
        k, s = a.split("@")
        kinds.setdefault(k, []).append(s)
    return ", ".join(f"{k} {','.join(v)}" for k, v in kinds.items())


def markdown(result: dict) -> str:
    at = result["config"]["at"]
    desc = {k: v.format(at=at, at2=at + 2, at4=at + 4, r=RESUME_AT, r5=RESUME_AT + 5) for k, v in INJECTIONS.items()}
    lines = [
        f"Fault injection, {result['config']['steps']} steps, tiny GPT-2 (2 layers, 32 wide), held-out loss on 256 rows; "
        f"`{result['config']['command']}` ({result['machine']}).",
        "",
        "| injection | setup | survived | guard did | held-out loss | non-finite tensors on disk |",
        "|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        d = r["disk"]
        surv = "yes" if r["survived"] else ("stopped" if r["error"] else "no (NaN weights)")
        loss = "NaN" if not math.isfinite(r["eval_loss"]) else f"{r['eval_loss']:.3f}"
        lines.append(f"| {desc[r['injection']]} | {r['setup']} | {surv} | {fmt_actions(r)} | {loss} | "
                     f"{d['nonfinite_tensors']} of {d['tensors']} ({d['nonfinite_files']} of {d['files']} files) |")
    if not result["advice"]:
        return "\n".join(lines) + "\n"
    lines += ["", "Plain Trainer with value clipping (clip_value 1.0), x1e6 gradient at step 30 (inside the guard's warm-up):",
              "", "| setup | survived | guard did | held-out loss |", "|---|---|---|---|"]
    for r in result["advice"]:
        loss = "NaN" if not math.isfinite(r["eval_loss"]) else f"{r['eval_loss']:.3f}"
        lines.append(f"| {r['setup']} | {'yes' if r['survived'] else 'no'} | {fmt_actions(r)} | {loss} |")
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    """Left: held-out loss minus the clean run of the same setup (NaN: marked); right: non-finite tensors on disk."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    injections = [i for i in INJECTIONS if i != "none" and any(r["injection"] == i for r in result["runs"])]
    setups = [s for s in SETUPS if any(r["setup"] == s for r in result["runs"])]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(13, 4.6))
    width = 0.8 / max(len(setups), 1)
    colors = {"fasttrainer": "tab:blue", "fasttrainer+ema": "tab:cyan", "fasttrainer+lawa": "tab:olive", "trainer+mixin": "tab:purple", "trainer+callbacks": "tab:orange", "bare": "tab:green"}
    for k, setup in enumerate(setups):
        clean = next((r["eval_loss"] for r in result["runs"] if r["setup"] == setup and r["injection"] == "none"), None)
        xs, deltas, bad = [], [], []
        for i, inj in enumerate(injections):
            r = next((r for r in result["runs"] if r["setup"] == setup and r["injection"] == inj), None)
            if r is None:
                continue
            x = i + (k - (len(setups) - 1) / 2) * width
            xs.append(x)
            finite = math.isfinite(r["eval_loss"]) and clean is not None
            deltas.append(r["eval_loss"] - clean if finite else 0.0)
            bad.append(r["disk"]["nonfinite_tensors"])
            if not finite:
                ax.text(x, 0.0, "NaN", ha="center", va="bottom", rotation=90, fontsize=8, color=colors[setup])
        ax.bar(xs, deltas, width, label=setup, color=colors[setup])
        ax2.bar(xs, bad, width, label=setup, color=colors[setup])
    for a, title in ((ax, "held-out loss minus the clean run (NaN: weights ended NaN)"),
                     (ax2, "non-finite tensors in the checkpoints written")):
        a.set_xticks(range(len(injections)))
        a.set_xticklabels(injections, rotation=30, ha="right", fontsize=8)
        a.set_title(title, fontsize=10)
        a.axhline(0, color="black", lw=0.6)
    ax.legend(fontsize=8, loc="upper left")
    fig.suptitle(f"Fault injection, {result['config']['steps']} steps, tiny GPT-2 (benchmarks/faults.py)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run")
    p.add_argument("--at", type=int, default=100, help="the step of the injections (after the guard's warm-up)")
    p.add_argument("--setups", nargs="+", default=list(SETUPS), choices=SETUPS)
    p.add_argument("--injections", nargs="+", default=list(INJECTIONS), choices=list(INJECTIONS))
    p.add_argument("--no-advice", action="store_true", help="skip the value-clipping advice table")
    p.add_argument("--work", default="runs/faults", help="per-run results and checkpoints (resumable)")
    p.add_argument("--out", default=str(RESULTS), help="where faults.{json,md,png} go")
    p.add_argument("--fresh", action="store_true", help="ignore saved per-run results")
    return p


def main(argv=None) -> dict[str, Any]:
    args = make_parser().parse_args(argv)
    if args.steps <= RESUME_AT + 10 and "spike_after_resume" in args.injections:
        raise UsageError(f"--steps must be > {RESUME_AT + 10} for spike_after_resume")
    torch.set_num_threads(1)
    hf_logging.set_verbosity_error()
    import logging

    logging.getLogger("hf_fasttrain").setLevel(logging.ERROR)
    work = Path(args.work)
    (work / "runs").mkdir(parents=True, exist_ok=True)

    def cached(name: str, fn):
        path = work / "runs" / f"{name}.json"
        key = {"steps": args.steps, "at": args.at}
        if path.exists() and not args.fresh:
            saved = json.loads(path.read_text())
            if saved.get("key") == key:
                return saved["result"]
        result = fn()
        write_json(path, {"key": key, "result": result})  # atomic: a killed run leaves no half file
        acts = fmt_actions(result)
        print(f"{name:45s} survived={result['survived']!s:5s} guard={acts:30s} eval={result['eval_loss']:.3f} "
              f"nonfinite on disk={result['disk']['nonfinite_tensors']}", flush=True)
        return result

    done = {(inj, setup): cached(f"{setup}__{inj}".replace("+", "_"), lambda s=setup, i=inj: run_one(s, i, args.steps, args.at, work))
            for inj in args.injections for setup in args.setups}
    # the other setups' and injections' runs of the same steps stay in the table (a run for a new setup
    # adds its rows to it)
    previous_path, previous = Path(args.out) / "faults.json", {}
    if previous_path.exists() and not args.fresh:
        previous = json.loads(previous_path.read_text())
        if {k: previous.get("config", {}).get(k) for k in ("steps", "at")} != {"steps": args.steps, "at": args.at}:
            previous = {}
        for r in previous.get("runs", []):
            done.setdefault((r["injection"], r["setup"]), r)
    runs = [done[(inj, setup)] for inj in INJECTIONS for setup in SETUPS if (inj, setup) in done]
    advice = []
    if not args.no_advice:
        for name, adv in ADVICE.items():
            setup = "trainer+callbacks" if adv["guard"] else "bare"
            key = "advice__" + name.replace(" ", "_").replace(",", "").replace("=", "").replace("+", "plus")
            r = cached(key, lambda s=setup, a=adv: run_one(s, "grad_x1e6_warmup", args.steps, args.at, work, advice=a))
            advice.append({**r, "setup": name})
    else:
        advice = previous.get("advice", [])
    result = {
        "benchmark": "faults",
        "config": {"steps": args.steps, "at": args.at, "command": "python -m benchmarks.faults"
                   + ("" if args.steps == 200 else f" --steps {args.steps}")},
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
                   f"transformers {transformers.__version__}",
        "runs": runs,
        "advice": advice,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_json(out / "faults.json", result)
    md = markdown(result)
    (out / "faults.md").write_text(md)
    plot(result, out / "faults.png")
    print(md)
    return result


if __name__ == "__main__":
    run_cli(main)
