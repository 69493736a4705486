"""Fine-tuning: which parts speed up supervised fine-tuning (completion-only loss) of a pretrained model.

    python -m benchmarks.fine_tuning                  # bases, sweeps, every arm, 3 seeds (about 10 CPU-minutes)
    python -m benchmarks.fine_tuning --seeds 2        # fewer seeds (the table is rewritten after each seed)
    python -m benchmarks.fine_tuning --quick          # a smoke run (tiny everything)

**Bases.** A tiny GPT-2 (2 layers, 64 wide, vocabulary 4096, 128 positions) pretrained on the embedded
corpus (the running Python's standard library) twice: with hf-tuned AdamW (``time_to_loss.HF_TUNED``) and with
the Muon recipe (``time_to_loss.MUON_RECIPE``). 30% of the stdlib's files (chosen by a hash of the path, as the
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
import hashlib
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import datasets  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import (  # noqa: E402
    AutoModelForCausalLM, DataCollatorForLanguageModeling, Trainer, TrainerCallback, TrainingArguments, set_seed)

from hf_fasttrain import DataArguments, FastTrainer, FastTrainingArguments, ModelArguments  # noqa: E402
from hf_fasttrain.callbacks import RunRecorderCallback  # noqa: E402
from hf_fasttrain.data.corpus import cache_root, is_validation_path, list_stdlib_sources, stdlib_root  # noqa: E402
from hf_fasttrain.data.packing import PackedBatchSampler  # noqa: E402
from hf_fasttrain.data.sft import IGNORE_INDEX, CompletionCollator, tokenize_sft  # noqa: E402
from hf_fasttrain.data.sft_sources import function_pairs  # noqa: E402
from hf_fasttrain.data.token_budget import TokenBudgetBatchSampler  # noqa: E402
from hf_fasttrain.modeling import build_model  # noqa: E402
from hf_fasttrain.run import prepare_data  # noqa: E402

from benchmarks._harness import RESULTS, machine_info, write_json  # noqa: E402
from benchmarks.time_to_loss import HF_TUNED, MUON_RECIPE, crossing, summarise  # noqa: E402

HOLDOUT = 0.3  # share of stdlib files kept out of the bases' pretraining (and tokenizer): the fine-tuning source
SWEEP_NAME = re.compile(r"@[0-9.e-]+$")  # arms of the lr sweeps: <arm>@<lr>
EVAL_FILES = 0.05  # of those, the corpus's own validation files: the fine-tuning evaluation modules


@dataclass
class Setup:
    # sized for a 2-core CPU shared with other jobs: a base in about 20 CPU-seconds, a fine-tuning run in 5-10
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 64
    vocab_size: int = 4096
    max_length: int = 128  # positions of the model; fine-tuning examples are cut here
    base_steps: int = 120  # pretraining steps of each base (16 rows x 128 tokens = 2,048 tokens a step)
    base_batch: int = 16
    batch_size: int = 8  # fine-tuning examples per step for the padded arms
    tokens: int = 30_000  # fine-tuning budget: real (non-padding) input tokens per run
    evals: int = 5  # evaluations per run (plus one at the start)
    eval_examples: int = 96
    max_corpus_files: Optional[int] = None


QUICK = Setup(n_layer=1, n_head=2, n_embd=32, vocab_size=300, max_length=64, base_steps=10, base_batch=4,
              batch_size=4, tokens=3000, evals=2, eval_examples=16)


# ---- data -----------------------------------------------------------------------------------------


def sft_data(setup: Setup, tokenizer) -> tuple[datasets.Dataset, datasets.Dataset, dict[str, Any]]:
    files = list_stdlib_sources(stdlib_root(), max_files=setup.max_corpus_files)
    held = [f for f in files if is_validation_path(f, HOLDOUT)]
    eval_files = [f for f in held if is_validation_path(f, EVAL_FILES)]
    train_files = [f for f in held if not is_validation_path(f, EVAL_FILES)]
    if not eval_files:  # the quick setup's few files: any held-out file will do
        eval_files, train_files = held[:1], held[1:]
    train = tokenize_sft(datasets.Dataset.from_list(function_pairs(train_files)).remove_columns("module"),
                         tokenizer, max_length=setup.max_length)
    ev = tokenize_sft(datasets.Dataset.from_list(function_pairs(eval_files)).remove_columns("module"),
                      tokenizer, max_length=setup.max_length)
    rng = np.random.default_rng(0)
    if len(ev) > setup.eval_examples:
        ev = ev.select(sorted(rng.choice(len(ev), setup.eval_examples, replace=False).tolist()))
    lengths = np.array([len(x) for x in train["input_ids"]])
    completion = np.array([sum(1 for t in y if t != IGNORE_INDEX) for y in train["labels"]])
    info = {"train_files": len(train_files), "eval_files": len(eval_files), "train_examples": len(train),
            "eval_examples": len(ev), "mean_len": float(lengths.mean()), "median_len": float(np.median(lengths)),
            "min_len": int(lengths.min()), "max_len": int(lengths.max()),
            "p10_p90_len": [float(np.percentile(lengths, 10)), float(np.percentile(lengths, 90))],
            "truncated_fraction": float((lengths == setup.max_length).mean()),
            "completion_token_share": float(completion.sum() / lengths.sum())}
    return train, ev, info


# ---- bases ----------------------------------------------------------------------------------------

BASES = {
    "adamw-base": ("Trainer, hf-tuned AdamW (lr 2e-3, 2% warmup, cosine to 10%, wd 0.1, clip 1)", False, dict(HF_TUNED)),
    "muon-base": ("FastTrainer, the Muon recipe (Muon+AdamW lr 1.6e-2, cosine to 10%, guard)", True, dict(MUON_RECIPE)),
}


def _key(obj: Any) -> str:
    return hashlib.sha1(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:12]


def base_data_args(setup: Setup) -> DataArguments:
    return DataArguments(vocab_size=setup.vocab_size, block_size=setup.max_length, validation_fraction=HOLDOUT,
                         max_eval_samples=64, max_corpus_files=setup.max_corpus_files)


def build_base(name: str, setup: Setup, cache: Path, log: dict[str, Any]) -> Path:
    """Pretrain base ``name`` (or find it in ``cache``); returns its from_pretrained directory."""
    description, fast, settings = BASES[name]
    setup_key = {k: v for k, v in dataclasses.asdict(setup).items() if k not in ("tokens", "evals", "eval_examples", "batch_size")}
    path = cache / f"{name}-{_key([name, settings, setup_key])}"
    info_path = path / "base_info.json"
    if info_path.exists():
        log[name] = json.loads(info_path.read_text())
        print(f"[fine_tuning] {name}: cached at {path}", flush=True)
        return path
    tokenizer, lm = prepare_data(base_data_args(setup))
    set_seed(0)
    model = build_model(ModelArguments(n_layer=setup.n_layer, n_head=setup.n_head, n_embd=setup.n_embd), tokenizer,
                        setup.max_length)
    work = Path(tempfile.mkdtemp(prefix="ft-base-"))
    common = dict(output_dir=str(work), max_steps=setup.base_steps, per_device_train_batch_size=setup.base_batch,
                  per_device_eval_batch_size=32, eval_strategy="no", save_strategy="no", report_to="none",
                  disable_tqdm=True, seed=0, data_seed=0, use_cpu=True, logging_steps=50)
    args = (FastTrainingArguments(**common, auto_resume=False, run_record=False, **settings) if fast
            else TrainingArguments(**common, **settings))
    trainer = (FastTrainer if fast else Trainer)(
        model=model, args=args, train_dataset=lm["train"], eval_dataset=lm["validation"],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False), processing_class=tokenizer)
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    metrics = trainer.evaluate()
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    trainer.save_model(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    info = {"description": description, "steps": setup.base_steps, "tokens": setup.base_steps * setup.base_batch * setup.max_length,
            "train_seconds": seconds, "pretraining_eval_loss": metrics["eval_loss"]}
    (tmp / "base_info.json").write_text(json.dumps(info, indent=1))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    shutil.rmtree(work, ignore_errors=True)
    log[name] = info
    print(f"[fine_tuning] {name}: pretrained in {seconds:.0f} s, eval loss {metrics['eval_loss']:.4f}", flush=True)
    return path


# ---- arms -----------------------------------------------------------------------------------------

SCHEDULE_FREE = {k: v for k, v in HF_TUNED.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")}
PARTS = {  # each alone on top of hf-tuned; the values that are not plain settings are filled in by `arm_args`
    "+token-budget": {"max_tokens_per_batch": ("fill", "budget")},
    "+packing": {"packing": "rows", "packing_row_length": ("fill", "max_length"),
                 "per_device_train_batch_size": ("fill", "rows")},
    "+ema": {"weight_averaging": "ema", "ema_decay": 0.98},
    "+wsd": {"lr_decay": "1-sqrt", "min_lr_ratio": 0.1},
    "+guard": {"divergence_guard": True},
}
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


@dataclass
class Plan:
    """What an arm's batching gives per optimizer step, over one epoch's plan."""

    real_per_step: float
    padding: float


def plans(train: datasets.Dataset, setup: Setup, seed: int = 0) -> tuple[dict[str, Plan], dict[str, int]]:
    lengths = np.array([len(x) for x in train["input_ids"]])
    mean = float(lengths.mean())
    B = setup.batch_size
    perm = np.random.default_rng(seed).permutation(len(lengths))
    batches = [perm[i : i + B] for i in range(0, len(perm) - B + 1, B)]
    real = sum(int(lengths[b].sum()) for b in batches)
    computed = sum(len(b) * int(lengths[b].max()) for b in batches)
    out = {"padded": Plan(real / len(batches), 1 - real / computed)}
    # Token budget and packing hold as many real tokens per step as a padded random batch (the same number of
    # optimizer steps over the budget, so the optimisation is alike) and compute fewer padded ones: what they change
    # is the cost of a step. The budget is corrected once for the padding the sampler still leaves.
    target = out["padded"].real_per_step

    def token_budget_plan(budget: int) -> Plan:
        tb = list(TokenBudgetBatchSampler(lengths, budget, seed=seed))
        real = sum(int(lengths[b].sum()) for b in tb)
        return Plan(real / len(tb), 1 - real / sum(len(b) * int(lengths[b].max()) for b in tb))

    budget = max(round(target), int(lengths.max()))
    budget = max(round(budget * target / token_budget_plan(budget).real_per_step), int(lengths.max()))
    out["token_budget"] = token_budget_plan(budget)
    rows = max(1, round(target / setup.max_length / 0.98))  # packed rows are ~98% full
    pk = list(PackedBatchSampler(lengths, setup.max_length, rows_per_batch=rows, seed=seed))
    real = sum(int(lengths[b].sum()) for b in pk)
    out["packed"] = Plan(real / len(pk), 1 - real / (len(pk) * rows * setup.max_length))
    return out, {"budget": budget, "rows": rows, "max_length": setup.max_length, "mean_len": mean}


def arm_args(name: str, lr: float, fills: dict[str, int], parts: list[str]) -> tuple[bool, dict[str, Any], str]:
    """(FastTrainer?, training settings, batching plan) of hf-tuned at ``lr`` with ``parts`` on top."""
    if not parts:
        return False, {**HF_TUNED, "learning_rate": lr}, "padded"
    settings: dict[str, Any] = {**HF_TUNED, "learning_rate": lr}
    plan = "padded"
    for p in parts:
        extra = {k: fills[v[1]] if isinstance(v, tuple) else v for k, v in PARTS[p].items()}
        if "lr_decay" in extra:
            settings = {k: v for k, v in settings.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")}
        settings.update(extra)
        plan = {"+token-budget": "token_budget", "+packing": "packed"}.get(p, plan)
    return True, settings, plan


def muon_args(lr: float) -> dict[str, Any]:
    return {**HF_TUNED, "optimizer": "muon", "learning_rate": lr}


def common_args(setup: Setup, seed: int, out: Path, steps: int) -> dict[str, Any]:
    every = max(1, steps // setup.evals)
    return dict(output_dir=str(out), max_steps=steps, per_device_train_batch_size=setup.batch_size,
                per_device_eval_batch_size=32, eval_strategy="steps", eval_steps=every, eval_on_start=True,
                logging_steps=every, save_strategy="no", report_to="none", disable_tqdm=True, seed=seed, data_seed=seed,
                use_cpu=True, dataloader_num_workers=0, include_num_input_tokens_seen="non_padding",
                remove_unused_columns=False)


class CpuClock(TrainerCallback):
    """CPU seconds of this (single-threaded) process spent training, evaluation excluded, at each evaluation:
    on a machine shared with other jobs, steadier than wall-clock (which other jobs' load stretches)."""

    def __init__(self):
        self.at_evals: list[float] = []

    def on_train_begin(self, args, state, control, **kwargs):
        self.start = self.mark = time.process_time()
        self.eval_cpu = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        self.mark = time.process_time()

    def on_evaluate(self, args, state, control, **kwargs):
        now = time.process_time()
        self.eval_cpu += now - self.mark  # evaluation ran since the last step ended
        self.mark = now
        self.at_evals.append(now - self.start - self.eval_cpu)


def run_one(spec: dict[str, Any], seed: int, setup: Setup, base: Path, tokenizer, train, ev, workdir: Path) -> dict[str, Any]:
    """Fine-tune ``base`` as ``spec`` says; returns the held-out completion-loss curve."""
    out = workdir / f"{spec['arm']}-seed{seed}"
    steps = spec["steps"]
    common = common_args(setup, seed, out, steps)
    set_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base))
    if spec.get("lora"):  # LoRA adapters on the frozen base (benchmarks/lora_fine_tuning.py)
        from hf_fasttrain.modeling import apply_lora

        model = apply_lora(model, ModelArguments(model_name_or_path=str(base), **spec["lora"]))
    collator = CompletionCollator(tokenizer.pad_token_id)
    clock = CpuClock()
    if spec["client"] == "trl":
        return run_trl(spec, seed, setup, model, tokenizer, train, ev, common, clock)
    if spec["fast"]:
        args = FastTrainingArguments(**{**common, "auto_resume": False, **spec["settings"]})
        trainer = FastTrainer(model=model, args=args, train_dataset=train, eval_dataset=ev, data_collator=collator,
                              processing_class=tokenizer, callbacks=[clock])
        trainer.recorder.write_files = False
        recorder = trainer.recorder
    else:
        recorder = RunRecorderCallback(write_files=False)
        args = TrainingArguments(**{**common, **spec["settings"]})
        trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=ev, data_collator=collator,
                          processing_class=tokenizer, callbacks=[recorder, clock])
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return {**_result(spec, seed, recorder, wall, clock), **state_sizes(trainer)}


def state_sizes(trainer) -> dict[str, int]:
    """Bytes of the trained parameters, the optimizer's state and the weight average (exact, not sampled)."""
    from hf_fasttrain.trainables import trainable_bytes

    opt = sum(t.numel() * t.element_size() for s in trainer.optimizer.state.values() for t in s.values()
              if torch.is_tensor(t))
    avg = getattr(trainer, "weight_averaging", None)
    return {"trainable_bytes": trainable_bytes(trainer.model), "optimizer_state_bytes": opt,
            "average_bytes": avg.average.nbytes() if avg is not None and avg.average is not None else 0}


def _result(spec, seed, recorder, wall, clock) -> dict[str, Any]:
    curve = [{"step": r["step"], "tokens": r.get("num_input_tokens_seen", 0), "seconds": r["train_seconds"],
              "eval_loss": r["eval_loss"]} for r in recorder.records if "eval_loss" in r]
    if len(clock.at_evals) != len(curve):
        raise RuntimeError(f"{len(clock.at_evals)} CPU-clock readings for {len(curve)} evaluations")
    for point, cpu in zip(curve, clock.at_evals):
        point["cpu_seconds"] = cpu
    secs = recorder.train_seconds()
    return {"cpu_seconds": clock.at_evals[-1], "real_tokens_per_cpu_s": curve[-1]["tokens"] / clock.at_evals[-1],
            "arm": spec["arm"], "seed": seed, "curve": curve, "final_eval_loss": curve[-1]["eval_loss"],
            "train_seconds": secs, "process_seconds": wall, "real_tokens": curve[-1]["tokens"],
            "real_tokens_per_s": curve[-1]["tokens"] / secs if secs else math.nan, "padding": spec["padding"]}


def trl_version() -> Optional[str]:
    try:
        import trl  # noqa: F401
    except Exception:
        return None
    return trl.__version__


def run_trl(spec, seed, setup, model, tokenizer, train, ev, common, clock) -> dict[str, Any]:
    """TRL's SFTTrainer on the same tokenized data (``completion_mask`` from the labels), its own collator
    (completion-only loss, padding to the longest), the best combination's parts added as our callbacks."""
    from trl import SFTConfig, SFTTrainer

    from hf_fasttrain.callbacks import DivergenceGuardCallback, LRScheduleCallback, WeightAveragingCallback

    def with_mask(ds):
        return ds.map(lambda r: {"completion_mask": [int(x != IGNORE_INDEX) for x in r["labels"]]},
                      remove_columns=["labels"])

    settings = dict(spec["settings"])
    callbacks: list = [RunRecorderCallback(write_files=False), clock]
    recorder = callbacks[0]
    if settings.pop("weight_averaging", None) == "ema":
        callbacks.append(WeightAveragingCallback("ema", decay=settings.pop("ema_decay", 0.98)))
    if settings.pop("divergence_guard", False):
        callbacks.append(DivergenceGuardCallback())
    optimizer = settings.pop("optimizer", None)
    if "lr_decay" in settings:  # our schedule over the Trainer's constant one
        callbacks.append(LRScheduleCallback(settings.pop("lr_decay"), min_lr_ratio=settings.pop("min_lr_ratio", 0.0),
                                            warmup_steps=settings.pop("warmup_steps")))
        settings["lr_scheduler_type"] = "constant"
    args = SFTConfig(**{**common, **settings, "completion_only_loss": True, "max_length": setup.max_length,
                        "remove_unused_columns": True})
    extra = {}
    if optimizer is not None:  # e.g. Muon: the package's optimizer by name, in TRL's trainer
        from hf_fasttrain.optim import optimizer_cls_and_kwargs_for

        extra["optimizer_cls_and_kwargs"] = optimizer_cls_and_kwargs_for(optimizer, args)
    trainer = SFTTrainer(model=model, args=args, train_dataset=with_mask(train), eval_dataset=with_mask(ev),
                         processing_class=tokenizer, callbacks=callbacks, **extra)
    t0 = time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    shutil.rmtree(common["output_dir"], ignore_errors=True)
    return _result(spec, seed, recorder, wall, clock)


# ---- driver -------------------------------------------------------------------------------------


def make_spec(arm: str, base: str, fast: bool, settings: dict[str, Any], plan_name: str, plans_: dict[str, Plan],
              setup: Setup, client: str = "hf") -> dict[str, Any]:
    plan = plans_[plan_name]
    steps = max(1, round(setup.tokens / plan.real_per_step))
    return {"arm": arm, "base": base, "fast": fast, "settings": settings, "plan": plan_name, "steps": steps,
            "padding": plan.padding, "client": client}


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
