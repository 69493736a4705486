"""The fine-tuning setup the fine-tuning studies share: bases pretrained on part of the stdlib corpus and cached,
instruction pairs from the held-out part, the padded and packed batch plans (each holding the same real tokens per
step), the parts a study turns on one at a time, and one fine-tuning run of a spec (the Trainer, FastTrainer or
TRL's SFTTrainer)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
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
from hf_fasttrain.data.corpus import is_validation_path, list_stdlib_sources, stdlib_root  # noqa: E402
from hf_fasttrain.data.packing import PackedBatchSampler  # noqa: E402
from hf_fasttrain.data.sft import IGNORE_INDEX, CompletionCollator, tokenize_sft  # noqa: E402
from hf_fasttrain.data.sft_sources import function_pairs  # noqa: E402
from hf_fasttrain.data.token_budget import TokenBudgetBatchSampler  # noqa: E402
from hf_fasttrain.modeling import build_model  # noqa: E402
from hf_fasttrain.data.front import prepare_data  # noqa: E402

from benchmarks._harness.lm import HF_TUNED, MUON_RECIPE  # noqa: E402

HOLDOUT = 0.3  # share of stdlib files kept out of the bases' pretraining (and tokenizer): the fine-tuning source
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
    from hf_fasttrain.stability.trainables import trainable_bytes

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
