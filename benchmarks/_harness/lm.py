"""The language-model setup every training study shares: the model, corpus and budget (:class:`Setup`), the
arms it compares (:data:`ARMS`: the Trainer baselines and the recipe), one training run of an arm
(:func:`run_arm`), the key a saved run is found by (:func:`run_key`), and what is read off an eval curve
(:func:`crossing`, :func:`summarise`).

Every arm trains the same model (GPT-2 from scratch by default) on the same data for the same token budget,
evaluating on the same held-out rows every ``eval_steps``. Wall-clock is training time only: evaluation and
checkpointing are excluded (RunRecorderCallback).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments, set_seed  # noqa: E402

from hf_fasttrain import DataArguments, DivergenceError, FastTrainer, FastTrainingArguments, ModelArguments  # noqa: E402
from hf_fasttrain.callbacks import GracefulStopCallback, RunRecorderCallback  # noqa: E402
from hf_fasttrain.modeling import build_model  # noqa: E402

__all__ = ["ON_GPU", "Arm", "HF_TUNED", "HF_BEST", "MUON_RECIPE", "FASTTRAIN_EXTRA", "FASTTRAIN_EXTRA_DESCRIPTION",
           "ARMS", "OPTIMIZER_LRS", "optimizer_arm", "wsd_linear_cooldown", "Setup", "CORPORA", "QUICK",
           "non_embedding_params", "common_args", "data_arguments", "run_key", "load_saved_run", "run_arm", "guard_counts", "crossing",
           "summarise"]

ON_GPU = torch.cuda.is_available()

@dataclass
class Arm:
    """One way of training. ``args`` override the common settings; ``fast`` picks FastTrainer."""

    name: str
    description: str
    fast: bool
    args: dict[str, Any] = field(default_factory=dict)
    callbacks: Callable[[], list] = list
    # an arm that is not one training run (e.g. random restart) brings its own: run(arm, seed, setup, workdir)
    run: Optional[Callable[..., dict[str, Any]]] = None
    # a plain Trainer arm's optimizer from the package, as a user's few lines give it:
    # (name, kwargs) -> Trainer(optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for(name, args, **kwargs))
    optimizer: Optional[tuple[str, dict[str, Any]]] = None


# hf-tuned: the settings a knowledgeable user reaches with the Trainer's own options; the peak lr is the best
# of `python -m benchmarks.time_to_loss --arms hf-tuned --lr-sweep 1e-3,2e-3,4e-3,8e-3,1.6e-2 --seeds 2
# --name lr_sweep_hf_tuned` (results/lr_sweep_hf_tuned.md).
HF_TUNED = dict(
    learning_rate=2e-3,
    warmup_steps=0.02,  # a fraction < 1 is a ratio of max_steps in transformers 5
    lr_scheduler_type="cosine_with_min_lr",
    lr_scheduler_kwargs={"min_lr_rate": 0.1},
    weight_decay=0.1,
    adam_beta2=0.95,
    max_grad_norm=1.0,
    **({"bf16": True, "torch_compile": True, "tf32": True} if ON_GPU else {}),
)


def wsd_linear_cooldown(setup: "Setup") -> dict[str, Any]:
    """The Trainer's ``warmup_stable_decay`` kwargs: a linear cooldown to 0 over the run's last 20% of steps."""
    return {"num_decay_steps": round(0.2 * setup.max_steps), "decay_type": "linear", "min_lr_ratio": 0.0}


# hf-best: the winner of `python -m benchmarks.hf_best --budget 1` (results/hf_best.md) at this budget.
HF_BEST = dict(
    HF_TUNED,
    lr_scheduler_type="warmup_stable_decay",
    lr_scheduler_kwargs=wsd_linear_cooldown,
    adam_beta2=0.999,
)

# The Muon recipe without the techniques of FASTTRAIN_EXTRA (the ablation's frozen ``base``).
MUON_RECIPE = {**{k: v for k, v in HF_TUNED.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")},
               "optimizer": "muon", "learning_rate": 1.6e-2, "lr_decay": "cosine", "min_lr_ratio": 0.1,
               "divergence_guard": True}
# The techniques the recipe adds to it (chosen by the time-to-loss ablation, results/ablation*.md).
FASTTRAIN_EXTRA: dict[str, Any] = {"weight_averaging": "ema", "ema_decay": 0.98, "seq_len_warmup_min": 16,
                                   "seq_len_warmup_fraction": 0.3, "include_num_input_tokens_seen": "all"}
FASTTRAIN_EXTRA_DESCRIPTION = (", EMA of the weights (decay 0.98 with warmup) evaluated and kept, sequence-length warmup "
                               "16 -> block over 30%, token-counted")

ARMS: dict[str, Arm] = {
    "hf-default": Arm("hf-default", "transformers.Trainer defaults (lr 5e-5, linear decay, no warmup)", fast=False),
    "hf-tuned": Arm("hf-tuned", "Trainer, built-in options tuned: lr 2e-3, 2% warmup, cosine to 10%, wd 0.1, clip 1", fast=False, args=HF_TUNED),
    "hf-best": Arm("hf-best", "Trainer, built-in options searched: lr 2e-3, 2% warmup, warmup-stable-decay with a linear "
                   "cooldown to 0 over the last 20%, beta2 0.999, wd 0.1, clip 1", fast=False, args=HF_BEST),
    # hf-best with a learning rate per parameter group, the user's few lines: the winner of `python -m
    # benchmarks.hf_best --budget 1 --families hf-best+ --name hf_best_groups` (results/hf_best_groups.md)
    "hf-best+": Arm("hf-best+", "the hf-best arm with the package's AdamW and the embeddings (with the tied head) at "
                    "16x the peak lr: Trainer(optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for('adamw', args, "
                    "lr_multipliers={'embedding': 16}))", fast=False, args=HF_BEST,
                    optimizer=("adamw", {"lr_multipliers": {"embedding": 16.0}})),
    # the tiny recipe's settings (recipes/configs/gpt2_tiny.yaml)
    "fasttrain": Arm("fasttrain", "FastTrainer as the tiny recipe: Muon+AdamW at lr 1.6e-2, 2% warmup, cosine to 10%, "
                     "wd 0.1, clip 1, divergence guard" + FASTTRAIN_EXTRA_DESCRIPTION,
                     fast=True, args={**MUON_RECIPE, **FASTTRAIN_EXTRA}),
    # the recipe with the settings hf_fasttrain.config.budget picks for the run's length
    "fasttrain-budget": Arm("fasttrain-budget", "the fasttrain arm with budget_aware: true (at 1.5 tokens per "
                            "parameter: beta2 0.999 in Muon's AdamW part, NorMuon with beta2 0.95)",
                            fast=True, args={**MUON_RECIPE, **FASTTRAIN_EXTRA, "budget_aware": True}),
}

# Each optimizer's peak lr on this setup, picked by `python -m benchmarks.optimizer_lr_sweep`
# (results/optimizer_lr_sweep.md); AdamW's is hf-tuned's.
OPTIMIZER_LRS = {"lion": 1e-3, "ademamix": 2e-3, "soap": 4e-3, "muon": 1.6e-2}


def optimizer_arm(name: str, lr: float) -> Arm:
    """Arm ``opt-<name>``: FastTrainer with hf-tuned's settings and ``optimizer=name`` at peak ``lr``."""
    args = {**HF_TUNED, "optimizer": name, "learning_rate": lr}
    if name == "lion":  # Chen et al. 2023: a smaller lr with a larger decay, lr * weight_decay as AdamW's
        args["weight_decay"] = HF_TUNED["weight_decay"] * HF_TUNED["learning_rate"] / lr
    if name == "soap":  # the 4096-token embedding stays unrotated on its vocab side, as a 50k one would
        args["optimizer_kwargs"] = {"max_precond_dim": 1024}
    if name == "ademamix":  # the paper's betas
        args["optimizer_kwargs"] = {"betas": [0.9, 0.999, 0.9999]}
    return Arm(f"opt-{name}", f"FastTrainer, hf-tuned settings, optimizer={name} at lr {lr:g}", fast=True, args=args)


ARMS.update({f"opt-{n}": optimizer_arm(n, lr) for n, lr in OPTIMIZER_LRS.items()})


@dataclass
class Setup:
    """Model, data and budget shared by every arm."""

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    model_type: str = "gpt2"  # any family hf_fasttrain.modeling builds (the size ladder adds llama)
    n_kv_head: Optional[int] = None  # grouped-query attention (llama, qwen2, ...); None: n_head
    model_config: dict[str, Any] = field(default_factory=dict)  # other attributes of the family's config
    vocab_size: int = 4096
    block_size: int = 128
    batch_size: int = 16
    max_steps: int = 300
    eval_steps: int = 25
    eval_rows: int = 128
    max_corpus_files: Optional[int] = None
    corpus: str = "python"  # a key of CORPORA

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.block_size

    def model_args(self) -> ModelArguments:
        return ModelArguments(model_type=self.model_type, n_layer=self.n_layer, n_head=self.n_head, n_embd=self.n_embd,
                              num_key_value_heads=self.n_kv_head, model_config=dict(self.model_config))


# The corpora the harness trains on (DataArguments.dataset): the embedded Python sources (the default)
# and English prose from the standard library's docs (hf_fasttrain.data.corpus.build_prose_corpus), so a
# gain can be checked on text that is not code.
CORPORA = {"python": None, "prose": "embedded:prose"}

QUICK = Setup(n_layer=2, n_head=2, n_embd=32, vocab_size=300, block_size=32, batch_size=8, max_steps=24,
              eval_steps=6, eval_rows=32, max_corpus_files=40)


def non_embedding_params(n_layer: int, n_embd: int, model_type: str = "gpt2", n_head: Optional[int] = None,
                         n_kv_head: Optional[int] = None) -> int:
    """Parameters outside the embeddings and head of the from-scratch model (matrices, biases, norms)."""
    from hf_fasttrain.modeling import decoder_config

    from transformers import AutoModelForCausalLM

    cfg = decoder_config(model_type, vocab_size=8, num_hidden_layers=n_layer, num_attention_heads=n_head or 1,
                         hidden_size=n_embd, max_position_embeddings=8, num_key_value_heads=n_kv_head,
                         bos_token_id=0, eos_token_id=0)  # in the tiny vocabulary (GPT-2's default 50256 is not)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    skip = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) for p in m.parameters()}
    skip |= {id(p) for n, p in model.named_parameters() if n.endswith(("wpe.weight", "position_embeddings.weight"))}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def common_args(setup: Setup, seed: int, out: Path) -> dict[str, Any]:
    """Training arguments every arm shares."""
    return dict(
        output_dir=str(out), max_steps=setup.max_steps, per_device_train_batch_size=setup.batch_size,
        per_device_eval_batch_size=64, eval_strategy="steps", eval_steps=setup.eval_steps, eval_on_start=True,
        logging_steps=setup.eval_steps, save_strategy="no", report_to="none", disable_tqdm=True, seed=seed,
        data_seed=seed, use_cpu=not ON_GPU, dataloader_num_workers=0,
    )


def data_arguments(setup: Setup) -> DataArguments:
    return DataArguments(dataset=CORPORA[setup.corpus], vocab_size=setup.vocab_size, block_size=setup.block_size,
                         max_eval_samples=setup.eval_rows, max_corpus_files=setup.max_corpus_files)


# Setup fields added after runs were saved: at these values they leave the key as it was, so those runs stay valid
_LATER_SETUP_FIELDS = {"model_type": "gpt2", "n_kv_head": None, "model_config": {}}


def _key_setup(setup: Setup) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(setup).items()
            if not (k in _LATER_SETUP_FIELDS and v == _LATER_SETUP_FIELDS[k])}


def measured_length(kwargs: dict[str, Any]) -> dict[str, Any]:
    """An arm's training arguments with the run length it was measured with, in today's terms.

    The arms were measured when a token-counted sequence-length warmup, and a batch-size warmup, took more
    optimizer steps than ``max_steps`` to train the tokens of ``max_steps`` full-length steps. ``max_steps`` now
    counts optimizer steps and a token budget is ``max_tokens``: a sequence-length warmup gets that budget (the same
    run exactly), a batch-size warmup the steps it was allowed, its batch ramp kept. A token-counted lr schedule now
    spans the run's steps (360 for a 300-step budget with a 20% ramp, was 300), so the lr warmup is the whole number
    of steps closest to its measured share of the tokens (7 of 360, was 6 of 300). The arm's settings (and the keys
    of its saved runs) stay as they were."""
    steps = kwargs.get("max_steps", -1)
    if steps is None or steps <= 0 or kwargs.get("max_tokens") is not None:
        return kwargs
    out = dict(kwargs)
    rows = out.get("per_device_train_batch_size", 8) * out.get("gradient_accumulation_steps", 1)
    if (out.get("seq_len_warmup_min") is not None and out.get("seq_len_warmup_count_tokens", True)
            and out.get("seq_len_warmup_mode", "truncate") == "truncate"):
        out.update(max_tokens=steps * rows * out.pop("_block_size"), max_steps=-1)
    elif out.get("batch_warmup_min_tokens") is not None:
        ramp = round(out.get("batch_warmup_fraction", 0.2) * steps)
        warmup = out.get("warmup_steps", 0)
        if 0 < warmup < 1:
            out["warmup_steps"] = max(1, round(math.ceil(steps * warmup) * (steps + ramp) / steps))
        out.update(max_steps=steps + ramp, batch_warmup_fraction=ramp / (steps + ramp))
    out.pop("_block_size", None)
    return out


def run_key(arm: Arm, seed: int, setup: Setup) -> str:
    """What a saved run's result depends on: the arm's settings, the seed and the setup (corpus included)."""
    settings = {k: getattr(v, "__qualname__", v) if callable(v) else v for k, v in arm.args.items()}
    blob = json.dumps({"arm": dataclasses.asdict(arm) | {"args": settings,
                                                         "callbacks": getattr(arm.callbacks, "__qualname__", None),
                                                         "run": getattr(arm.run, "__qualname__", None)},
                       "seed": seed, "setup": _key_setup(setup)}, sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:16]


def load_saved_run(path: Path, key: str) -> Optional[dict[str, Any]]:
    """The result saved at ``path`` if it was made with the same settings (``key``), else None."""
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return saved if saved.get("key") == key else None


def run_arm(arm: Arm, seed: int, setup: Setup, tokenizer, lm, workdir: Path,
            checkpoint_dir: Optional[Path] = None, train_rows: int = 0, data_collator=None,
            finish: Optional[Callable[[Any], dict[str, Any]]] = None) -> dict[str, Any]:
    """Train one arm for one seed; returns its eval curve (step, tokens, train seconds, eval loss).

    With ``train_rows`` the final model is also evaluated on that many training rows, spread evenly over the
    training set (``final_train_loss``): past one epoch, its gap to the eval loss is how much of the data the
    run has memorised.

    With ``checkpoint_dir`` the run saves a checkpoint there at every eval (the latest one kept) and, when
    one is there already (a run killed part way), resumes from it: a long run cut short loses at most one
    eval interval, and one stopped by SIGTERM or Ctrl-C saves the step it reached and raises
    :class:`~hf_fasttrain.callbacks.TrainingStopped`. The folder is removed once the run has finished.

    ``data_collator`` replaces the causal-LM collator (e.g. rows that carry their own ``shift_labels``);
    ``finish(trainer)`` is called with the trained trainer and what it returns joins the result (a study's
    own measurement of the final model)."""
    if arm.run is not None:
        return arm.run(arm, seed, setup, workdir)
    out = checkpoint_dir if checkpoint_dir is not None else workdir / f"{arm.name}-seed{seed}"
    common = common_args(setup, seed, out)
    resume = None
    if checkpoint_dir is not None:
        from transformers.trainer_utils import get_last_checkpoint

        common.update(save_strategy="steps", save_steps=setup.eval_steps, save_total_limit=1)
        resume = get_last_checkpoint(str(out)) if out.is_dir() else None
        if resume:  # the eval at the start is in the checkpoint's logs already
            common["eval_on_start"] = False
    args_cls = FastTrainingArguments if arm.fast else TrainingArguments
    extra = {"auto_resume": False} if arm.fast else {}
    settings = {k: v(setup) if callable(v) else v for k, v in arm.args.items()}  # e.g. token_budget
    kwargs = {**common, **extra, **settings}
    args = args_cls(**(measured_length({**kwargs, "_block_size": setup.block_size}) if arm.fast else kwargs))
    set_seed(seed)
    # a fast arm's optimizer options reach the model too: parameterization "mup" draws muP's initialisation
    model = build_model(setup.model_args(), tokenizer, setup.block_size,
                        settings.get("optimizer_kwargs") if arm.fast and settings.get("optimizer") else None)
    callbacks = arm.callbacks()
    recorder = None
    if not arm.fast:
        recorder = RunRecorderCallback(write_files=False)
        callbacks.append(recorder)
    own_optimizer = {}
    if arm.optimizer is not None and not arm.fast:
        from hf_fasttrain.optim import optimizer_cls_and_kwargs_for

        own_optimizer["optimizer_cls_and_kwargs"] = optimizer_cls_and_kwargs_for(arm.optimizer[0], args, **arm.optimizer[1])
    trainer = (FastTrainer if arm.fast else Trainer)(
        model=model, args=args, train_dataset=lm["train"], eval_dataset=lm["validation"],
        data_collator=data_collator or DataCollatorForLanguageModeling(tokenizer, mlm=False), processing_class=tokenizer,
        callbacks=callbacks, **own_optimizer,
    )
    if arm.fast:
        trainer.recorder.write_files = False
        recorder = trainer.recorder
    elif checkpoint_dir is not None:
        # SIGTERM or Ctrl-C: finish the step, save it, raise TrainingStopped (FastTrainer's save_on_signal does
        # the same for the fast arms), so a stopped search keeps every step of its running runs
        trainer.add_callback(GracefulStopCallback(trainer))
    wall0 = time.perf_counter()
    diverged = None
    try:
        trainer.train(resume_from_checkpoint=resume)
    except DivergenceError as exc:  # the guard gave up: a result (the candidate lost), not a crash of the benchmark
        diverged = {"step": trainer.state.global_step, "message": str(exc).split(" The last good state")[0]}
    wall = time.perf_counter() - wall0
    curve = []
    for r in recorder.records:
        if "eval_loss" in r:
            tokens = r.get("tokens_seen", r.get("num_input_tokens_seen", r["step"] * setup.tokens_per_step))
            curve.append({"step": r["step"], "tokens": tokens, "seconds": r["train_seconds"], "eval_loss": r["eval_loss"]})
    if diverged:  # the guard restored its last good state: that model's loss is the run's final one
        last = curve[-1] if curve else {"tokens": 0, "seconds": 0.0}
        curve.append({"step": diverged["step"], "tokens": last["tokens"], "seconds": last["seconds"],
                      "eval_loss": trainer.evaluate()["eval_loss"]})
    result = {"arm": arm.name, "seed": seed, "curve": curve, "final_eval_loss": curve[-1]["eval_loss"],
              "train_seconds": recorder.train_seconds(), "process_seconds": wall}
    if diverged:
        result["diverged"] = diverged
    if train_rows:
        n = len(lm["train"])
        rows = lm["train"].select(range(0, n, max(1, n // train_rows))[:train_rows])
        result["final_train_loss"] = trainer.evaluate(eval_dataset=rows, metric_key_prefix="train_rows")["train_rows_loss"]
        result["epochs"] = curve[-1]["tokens"] / (n * setup.block_size)
    if finish is not None:
        result.update(finish(trainer))
    shutil.rmtree(out, ignore_errors=True)
    if resume:
        result["resumed_from_step"] = int(Path(resume).name.split("-")[-1])
    guard = guard_counts(trainer.state.log_history)
    if guard:
        result["guard"] = guard
    return result



def guard_counts(log_history: list[dict[str, Any]]) -> dict[str, int]:
    """The divergence guard's totals (skipped steps, rollbacks) from a run's last log that holds them."""
    for entry in reversed(log_history):
        found = {k: int(v) for k, v in entry.items() if k.startswith("guard_")}
        if found:
            return found
    return {}



def crossing(curve: list[dict[str, float]], target: float, key: str) -> float:
    """``key`` (seconds or tokens) at which the eval loss first reaches ``target``, interpolated
    linearly between the two evaluations that bracket it; ``inf`` if it never does."""
    prev = None
    for point in curve:
        if point["eval_loss"] <= target:
            if prev is None:
                return float(point[key])
            a, b = prev["eval_loss"], point["eval_loss"]
            frac = (a - target) / (a - b) if a != b else 1.0
            return float(prev[key] + frac * (point[key] - prev[key]))
        prev = point
    return math.inf


def summarise(runs: list[dict[str, Any]], arms: list[str], reference: str = "hf-tuned",
              target: Optional[float] = None) -> dict[str, Any]:
    """Per arm: medians over seeds of the final loss and of the time and tokens to reach ``target``
    (default: the median final eval loss of ``reference``)."""
    by_arm = {a: [r for r in runs if r["arm"] == a] for a in arms}
    ref_runs = by_arm.get(reference) or next(iter(by_arm.values()))
    given = target is not None
    if target is None:
        target = statistics.median(r["final_eval_loss"] for r in ref_runs)
    rows = {}
    for a, rs in by_arm.items():
        secs = [crossing(r["curve"], target, "seconds") for r in rs]
        toks = [crossing(r["curve"], target, "tokens") for r in rs]
        rows[a] = {
            "final_eval_loss": statistics.median(r["final_eval_loss"] for r in rs),
            "seconds_to_target": statistics.median(secs),
            "tokens_to_target": statistics.median(toks),
            "reached": sum(math.isfinite(s) for s in secs),
            "seeds": len(rs),
            "train_seconds": statistics.median(r["train_seconds"] for r in rs),
            # training seconds per optimizer step (median over seeds): what a technique costs per step
            "seconds_per_step": statistics.median(r["train_seconds"] / max(r["curve"][-1].get("step", 0), 1)
                                                  for r in rs),
            "final_tokens": statistics.median(r["curve"][-1]["tokens"] for r in rs),
        }
    ref_time = rows[reference]["seconds_to_target"] if reference in rows else math.nan
    ref_tokens = rows[reference]["tokens_to_target"] if reference in rows else math.nan
    for a, row in rows.items():
        row["time_ratio_vs_reference"] = row["seconds_to_target"] / ref_time if 0 < ref_time < math.inf else math.nan
        row["tokens_ratio_vs_reference"] = (row["tokens_to_target"] / ref_tokens
                                            if 0 < ref_tokens < math.inf else math.nan)
    return {"target_eval_loss": target, "reference": reference, "arms": rows, "target_given": given}

