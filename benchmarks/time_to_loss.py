#!/usr/bin/env python
"""Time-to-loss: wall-clock and tokens each arm needs to reach the strongest Trainer baseline's final eval loss.

    python benchmarks/time_to_loss.py                      # hf-default, hf-tuned, hf-best, fasttrain(-budget); 3 seeds
    python benchmarks/time_to_loss.py --arms hf-tuned,fasttrain --seeds 5
    python benchmarks/time_to_loss.py --quick               # a smoke run (the test suite uses it)
    python benchmarks/time_to_loss.py --corpus prose --arms hf-tuned,fasttrain   # the English-prose corpus

Every arm trains the same model (GPT-2 from scratch), on the same data, for the same token budget,
on this machine, evaluating on the same held-out rows every ``--eval-steps``. Seeds run interleaved
(seed 0 of every arm, then seed 1 ...), so slow drifts of the machine hit all arms alike. Wall-clock
is training time only: evaluation and checkpointing are excluded (RunRecorderCallback).

The target is the median over seeds of the reference arm's final eval loss: hf-best when it runs, else hf-tuned. For each run, the time and tokens
to reach it are read off the eval curve by linear interpolation between the two evaluations that
bracket it; a run that never reaches it counts as infinitely slow. Reported per arm: medians over
seeds of final eval loss, time and tokens to target, and time-to-target relative to the reference.

Arms (DESIGN.md): ``hf-default`` (transformers.Trainer with its defaults), ``hf-tuned`` (the Trainer's
built-in options as most people tune them: the peak lr swept, cosine to 10%), ``hf-best`` (every built-in
option that matters searched at this budget: benchmarks/hf_best.py), ``fasttrain`` (FastTrainer with this package's techniques). Other
techniques register more arms or ablations in ``ARMS``.

Each run's result is saved as it ends (``--out/<name>_runs/<arm>-seed<k>.json``, keyed by a hash of the
arm's settings, the setup and the corpus) and a rerun of the same command skips the runs already there,
so a long run that was stopped continues where it was; ``--fresh`` runs everything again.

Writes time_to_loss.json, time_to_loss.md and time_to_loss.png into --out (benchmarks/results).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
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
from hf_fasttrain.run import prepare_data  # noqa: E402
from benchmarks._harness import display_command, machine_info as environment_info  # noqa: E402
from benchmarks._harness import UsageError, run_cli  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
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


# The settings a knowledgeable user reaches with the Trainer's own options (DESIGN.md, hf-tuned).
# Peak lr from a sweep on this setup: `python benchmarks/time_to_loss.py --arms hf-tuned
# --lr-sweep 1e-3,2e-3,4e-3,8e-3,1.6e-2 --seeds 2 --name lr_sweep_hf_tuned` (results/lr_sweep_hf_tuned.md).
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


# The strongest setting found with the Trainer's own options at this budget: hf-tuned's, then every knob the
# literature finds to matter searched one at a time (`python -m benchmarks.hf_best --budget 1`,
# results/hf_best.md): warmup-stable-decay with a linear cooldown to 0 over the last 20% and beta2 0.999 (final
# eval loss 4.506 over 2 seeds against hf-tuned's 4.701 there); weight decay, the peak lr and schedule-free
# AdamW did not gain more than the seed noise.
HF_BEST = dict(
    HF_TUNED,
    lr_scheduler_type="warmup_stable_decay",
    lr_scheduler_kwargs=wsd_linear_cooldown,
    adam_beta2=0.999,
)

# The Muon recipe before the ablation's techniques (its frozen ``base``).
MUON_RECIPE = {**{k: v for k, v in HF_TUNED.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")},
               "optimizer": "muon", "learning_rate": 1.6e-2, "lr_decay": "cosine", "min_lr_ratio": 0.1,
               "divergence_guard": True}
# What the ablation added to it (the techniques that won on tokens; see ``base+*`` arms below).
# EMA + sequence-length warmup: 0.78x base's tokens to hf-tuned's final loss (3 seeds; each alone 0.88x / 0.87x);
# EMA costs +3% time per step; the final loss at the full budget is 0.018 above base's (results/ablation*.md).
FASTTRAIN_EXTRA: dict[str, Any] = {"weight_averaging": "ema", "ema_decay": 0.98, "seq_len_warmup_min": 16,
                                   "seq_len_warmup_fraction": 0.3, "include_num_input_tokens_seen": "all"}
FASTTRAIN_EXTRA_DESCRIPTION = (", EMA of the weights (decay 0.98 with warmup) evaluated and kept, sequence-length warmup "
                               "16 -> block over 30%, token-counted")

ARMS: dict[str, Arm] = {
    "hf-default": Arm("hf-default", "transformers.Trainer defaults (lr 5e-5, linear decay, no warmup)", fast=False),
    "hf-tuned": Arm("hf-tuned", "Trainer, built-in options tuned: lr 2e-3, 2% warmup, cosine to 10%, wd 0.1, clip 1", fast=False, args=HF_TUNED),
    "hf-best": Arm("hf-best", "Trainer, built-in options searched: lr 2e-3, 2% warmup, warmup-stable-decay with a linear "
                   "cooldown to 0 over the last 20%, beta2 0.999, wd 0.1, clip 1", fast=False, args=HF_BEST),
    # The tiny recipe's settings (recipes/configs/gpt2_tiny.yaml): Muon at its swept peak lr (see
    # OPTIMIZER_LRS), hf-tuned's warmup, cosine to 10% through hf_fasttrain.schedules, the divergence guard.
    "fasttrain": Arm("fasttrain", "FastTrainer as the tiny recipe: Muon+AdamW at lr 1.6e-2, 2% warmup, cosine to 10%, "
                     "wd 0.1, clip 1, divergence guard" + FASTTRAIN_EXTRA_DESCRIPTION,
                     fast=True, args={**MUON_RECIPE, **FASTTRAIN_EXTRA}),
    # The recipe with the settings measured best for its length (hf_fasttrain.budget, from the search at 1x):
    # at 1.5 tokens per parameter beta2 0.999 in Muon's AdamW part and NorMuon; the rest as fasttrain.
    "fasttrain-budget": Arm("fasttrain-budget", "the fasttrain arm with budget_aware: true (at 1.5 tokens per "
                            "parameter: beta2 0.999 in Muon's AdamW part, NorMuon with beta2 0.95)",
                            fast=True, args={**MUON_RECIPE, **FASTTRAIN_EXTRA, "budget_aware": True}),
    # The same recipe with the Trainer's AdamW (the tiny recipe before it switched to Muon): isolates the optimizer.
    "fasttrain-adamw": Arm("fasttrain-adamw", "FastTrainer as the tiny recipe but with AdamW at hf-tuned's lr 2e-3",
                           fast=True, args={**{k: v for k, v in HF_TUNED.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")},
                                            "lr_decay": "cosine", "min_lr_ratio": 0.1, "divergence_guard": True}),
    # Sequence-length warmup (Li et al. 2022): rows cut to 16 tokens at first, growing by 8 to the full
    # block over the first 30% of the token budget; the run stops at the same token budget (more,
    # shorter steps at first) and the LR schedule advances with tokens.
    "seq-len-warmup": Arm("seq-len-warmup", "hf-tuned + sequence-length warmup 16 -> block over 30%, token-counted",
                          fast=True, args=dict(HF_TUNED, seq_len_warmup_min=16, seq_len_warmup_fraction=0.3,
                                               include_num_input_tokens_seen="all")),
}


# --- Ablation of the recipe's techniques: each alone on top of the Muon recipe as it stood before them
# (``base``: Muon+AdamW at 1.6e-2, 2% warmup, cosine to 10%, wd 0.1, clip 1, guard), then combined.
# The base is frozen here so that saved runs stay comparable when the headline ``fasttrain`` arm changes.
#   python benchmarks/time_to_loss.py --arms hf-tuned,base,base+ema,... --seeds 3 --name ablation
BASE = dict(MUON_RECIPE)


def token_budget(setup: "Setup") -> int:
    """An arm setting computed from the setup: the run's token budget (max_steps full steps)."""
    return setup.max_steps * setup.tokens_per_step


def quarter_batch(setup: "Setup") -> int:
    """A quarter of the full micro-batch's tokens (4 of 16 rows in the default setup)."""
    return setup.tokens_per_step // 4
ABLATION: dict[str, tuple[str, dict[str, Any]]] = {}


def ablation_arm(name: str, description: str, **extra) -> Arm:
    """Arm ``name``: the frozen Muon recipe (BASE) with ``extra`` settings on top."""
    args = {**BASE, **extra}
    if "optimizer_kwargs" in extra and BASE.get("optimizer_kwargs"):
        args["optimizer_kwargs"] = {**BASE["optimizer_kwargs"], **extra["optimizer_kwargs"]}
    ARMS[name] = Arm(name, description, fast=True, args=args)
    return ARMS[name]


ablation_arm("base", "the Muon recipe before issue 18 (= fasttrain until then)")
ablation_arm("base+ema", "base + an EMA of the weights (decay 0.98, half-life 34 steps, with the (1+t)/(10+t) "
             "warmup) evaluated and kept as the model", weight_averaging="ema", ema_decay=0.98)
ablation_arm("base+lawa", "base + LAWA: the mean of the last 5 copies taken every 10 steps, evaluated and kept",
             weight_averaging="lawa", lawa_checkpoints=5, lawa_interval=10)
ablation_arm("base+bsw", "base + batch-size warmup: 4 -> 16 rows (512 -> 2048 tokens) per step over the first 60 "
             "steps' worth, the lr schedule and the stop counted in tokens (same token budget)",
             batch_warmup_min_tokens=quarter_batch, batch_warmup_fraction=0.2, schedule_unit="tokens",
             schedule_total_tokens=token_budget, include_num_input_tokens_seen="all")
ablation_arm("base+cautious", "base + cautious updates (Liang et al. 2024) in Muon's AdamW part",
             optimizer_kwargs={"cautious": True})
ablation_arm("base+polar", "base + Polar Express Newton-Schulz coefficients (Amsel et al. 2025) in Muon, 5 steps",
             optimizer_kwargs={"ns_coefficients": "polar_express"})
ablation_arm("base+ema+bsw", "the combination: base + EMA (as base+ema) + batch-size warmup (as base+bsw)",
             weight_averaging="ema", ema_decay=0.98, batch_warmup_min_tokens=quarter_batch, batch_warmup_fraction=0.2,
             schedule_unit="tokens", schedule_total_tokens=token_budget, include_num_input_tokens_seen="all")
ablation_arm("base+ema+slw", "the combination: base + EMA (as base+ema) + sequence-length warmup (as base+slw)",
             weight_averaging="ema", ema_decay=0.98, seq_len_warmup_min=16, seq_len_warmup_fraction=0.3,
             include_num_input_tokens_seen="all")
ablation_arm("base+slw", "base + sequence-length warmup 16 -> block over 30% of the tokens, token-counted",
             seq_len_warmup_min=16, seq_len_warmup_fraction=0.3, include_num_input_tokens_seen="all")


# --- LR schedule ablation (hf_fasttrain.schedules): every decay shape at hf-tuned's peak lr, 2% warmup
# from 0 and floor at 10% of the peak, only the shape differs (lr-cosine runs exactly hf-tuned's lrs):
#   python benchmarks/time_to_loss.py --quick --max-steps 300 --seeds 3 --arms lr-cosine,lr-sqrt,lr-linear,lr-1-sqrt,lr-constant --name lr_schedules
_SCHEDULE_BASE = {k: v for k, v in HF_TUNED.items() if k not in ("lr_scheduler_type", "lr_scheduler_kwargs")}
for _decay in ("cosine", "sqrt", "linear", "1-sqrt", "constant"):
    ARMS[f"lr-{_decay}"] = Arm(f"lr-{_decay}", f"FastTrainer, hf-tuned settings, lr_decay={_decay!r}, floor 10% of peak",
                               fast=True, args={**_SCHEDULE_BASE, "lr_decay": _decay, "min_lr_ratio": 0.1})
# --- The recipe with another decay shape (Muon at 1.6e-2, guard on; only lr_decay differs):
#   python benchmarks/time_to_loss.py --arms fasttrain,fasttrain-1-sqrt,fasttrain-sqrt --seeds 3 --name time_to_loss_recipe_decay
for _decay in ("1-sqrt", "sqrt"):
    ARMS[f"fasttrain-{_decay}"] = dataclasses.replace(
        ARMS["fasttrain"], name=f"fasttrain-{_decay}", description=f"the fasttrain arm with lr_decay={_decay!r}",
        args={**MUON_RECIPE, "lr_decay": _decay})
# --- Optimizer ablation (hf_fasttrain.optim) -------------------------------------------------------
# hf-tuned's settings with another optimizer at its own peak lr, each picked by
# benchmarks/optimizer_lr_sweep.py on this setup (results/optimizer_lr_sweep.md, Muon's continued in
# optimizer_lr_sweep_muon_high.md; 2 seeds); AdamW's is hf-tuned's (results/lr_sweep_hf_tuned.md).
OPTIMIZER_LRS = {"lion": 1e-3, "ademamix": 2e-3, "soap": 4e-3, "muon": 1.6e-2}


def optimizer_arm(name: str, lr: float) -> Arm:
    """Arm ``opt-<name>``: FastTrainer with hf-tuned's settings and ``optimizer=name`` at peak ``lr``."""
    args = {**HF_TUNED, "optimizer": name, "learning_rate": lr}
    if name == "lion":  # Chen et al. 2023: a smaller lr with a larger decay, lr * weight_decay as AdamW's
        args["weight_decay"] = HF_TUNED["weight_decay"] * HF_TUNED["learning_rate"] / lr
    if name == "soap":  # the 4096-token embedding stays unrotated on its vocab side, as a 50k one would
        args["optimizer_kwargs"] = {"max_precond_dim": 1024}
    if name == "ademamix":  # the paper's betas, as measured (hf-tuned's beta2 0.95 did not reach AdEMAMix then)
        args["optimizer_kwargs"] = {"betas": [0.9, 0.999, 0.9999]}
    return Arm(f"opt-{name}", f"FastTrainer, hf-tuned settings, optimizer={name} at lr {lr:g}", fast=True, args=args)


ARMS.update({f"opt-{n}": optimizer_arm(n, lr) for n, lr in OPTIMIZER_LRS.items()})


@dataclass
class Setup:
    """Model, data and budget shared by every arm."""

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 128
    model_type: str = "gpt2"  # any family hf_fasttrain.modeling builds (benchmarks/scaling.py adds llama)
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
            checkpoint_dir: Optional[Path] = None, train_rows: int = 0) -> dict[str, Any]:
    """Train one arm for one seed; returns its eval curve (step, tokens, train seconds, eval loss).

    With ``train_rows`` the final model is also evaluated on that many training rows, spread evenly over the
    training set (``final_train_loss``): past one epoch, its gap to the eval loss is how much of the data the
    run has memorised.

    With ``checkpoint_dir`` the run saves a checkpoint there at every eval (the latest one kept) and, when
    one is there already (a run killed part way), resumes from it: a long run cut short loses at most one
    eval interval, and one stopped by SIGTERM or Ctrl-C saves the step it reached and raises
    :class:`~hf_fasttrain.callbacks.TrainingStopped`. The folder is removed once the run has finished."""
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
    args = args_cls(**{**common, **extra, **settings})
    set_seed(seed)
    model = build_model(setup.model_args(), tokenizer, setup.block_size)
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
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False), processing_class=tokenizer,
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


# --- Random restart (hf_fasttrain/restarts.py) ------------------------------------------------------------
def run_best_of_n(arm: Arm, seed: int, setup: Setup, workdir: Path, num_seeds: int = 4,
                  explore_fraction: float = 0.1) -> dict[str, Any]:
    """Best-of-N at equal total compute: N seeds train ``explore_fraction`` of a run of T steps (with that
    run's schedule), the best continues to T; T is chosen so the search trains as many optimizer steps
    as one single-seed run: N*f*T + (1-f)*T = max_steps (N=4, f=0.1, 300 steps: T=231, 4*23 + 208 = 300).
    Its clock counts every trial's training, losers included (``search_time_curve``)."""
    from hf_fasttrain.restarts import search_time_curve
    from hf_fasttrain.recipe_restarts import train_with_restarts

    total = round(setup.max_steps / (1 + (num_seeds - 1) * explore_fraction))
    out = workdir / f"{arm.name}-seed{seed}"
    args = FastTrainingArguments(**{**common_args(setup, seed * num_seeds, out), "auto_resume": False,
                                    **arm.args, "max_steps": total})
    model_args = setup.model_args()
    data_args = data_arguments(setup)
    wall0 = time.perf_counter()
    summary = train_with_restarts(model_args, data_args, args, num_seeds=num_seeds, explore_fraction=explore_fraction)
    wall = time.perf_counter() - wall0
    from hf_fasttrain.callbacks.run_record import checkpoint_log_history

    # the winner's logs with their train_seconds (kept in the checkpoint's run record, not in trainer_state.json)
    curve = search_time_curve(summary, checkpoint_log_history(summary["winner_checkpoint"]), setup.tokens_per_step)
    shutil.rmtree(out, ignore_errors=True)
    rows = [{k: r[k] for k in ("trial_id", "model_seed", "data_seed", "rung_metrics", "final_metric", "status")}
            for r in summary["trials"]]
    return {"arm": arm.name, "seed": seed, "curve": curve, "final_eval_loss": curve[-1]["eval_loss"],
            "train_seconds": curve[-1]["seconds"], "process_seconds": wall,
            "restarts": {"max_steps": total, "rung_steps": summary["rung_steps"], "total_steps": summary["total_steps"],
                         "winner": summary["winner"], "trials": rows}}


ARMS["fasttrain-best-of-4"] = Arm(
    "fasttrain-best-of-4", "FastTrainer, random restart: 4 seeds explore 10% of a shorter run, the best continues; "
    "as many optimizer steps in all as one single-seed run", fast=True, args=dict(HF_TUNED), run=run_best_of_n,
)


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



def _fmt(x: float, digits: int = 3) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "n/a"
    if isinstance(x, float) and math.isinf(x):
        return "not reached"
    return f"{x:.{digits}g}" if isinstance(x, float) else str(x)


def markdown_table(summary: dict[str, Any]) -> str:
    lines = [
        f"Target: eval loss {summary['target_eval_loss']:.4f} "
        + ("(given with --target)." if summary.get("target_given") else
           f"(median final eval loss of {summary['reference']})."),
        "",
        f"| arm | final eval loss | train seconds to target | tokens to target | time vs {summary['reference']} "
        f"| tokens vs {summary['reference']} | seeds reaching target | ms per step |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for a, r in summary["arms"].items():
        lines.append(
            f"| {a} | {r['final_eval_loss']:.4f} | {_fmt(r['seconds_to_target'])} | {_fmt(r['tokens_to_target'])} "
            f"| {_fmt(r['time_ratio_vs_reference'])} | {_fmt(r.get('tokens_ratio_vs_reference', math.nan))} "
            f"| {r['reached']}/{r['seeds']} | {_fmt(1000 * r.get('seconds_per_step', math.nan))} |"
        )
    return "\n".join(lines) + "\n"


def plot(runs: list[dict[str, Any]], summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, arm in enumerate(summary["arms"]):
        for j, r in enumerate(x for x in runs if x["arm"] == arm):
            pts = r["curve"][1:]  # skip the step-0 evaluation (loss ~ ln(vocab)) to keep the scale useful
            ax.plot([p["seconds"] for p in pts], [p["eval_loss"] for p in pts], color=colours[i % len(colours)],
                    alpha=0.8, lw=1.2, label=arm if j == 0 else None)
    ax.axhline(summary["target_eval_loss"], color="k", ls="--", lw=0.8, label=f"target ({summary['reference']} median final)")
    ax.set_xlabel("training wall-clock, seconds (evaluation excluded)")
    ax.set_ylabel("eval loss")
    ax.set_title("Time to loss, one line per seed")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arms", default="hf-default,hf-tuned,hf-best,fasttrain,fasttrain-budget",
                   help=f"comma-separated arms (default: the three main ones); known: {', '.join(ARMS)}")
    p.add_argument("--seeds", type=int, default=3, help="seeds per arm (run interleaved)")
    p.add_argument("--seed-list", default=None,
                   help="comma-separated seeds to run instead of 0..seeds-1 (e.g. one seed per process)")
    p.add_argument("--max-steps", type=int, default=None, help="optimizer steps per run (default 300)")
    p.add_argument("--lr-sweep", default=None,
                   help="comma-separated peak lrs: run each chosen arm at each lr (arms named ARM@LR)")
    p.add_argument("--quick", action="store_true", help="tiny smoke setup (the test suite runs it)")
    p.add_argument("--corpus", default="python", choices=sorted(CORPORA),
                   help="python: the embedded stdlib sources (default); prose: English prose from the stdlib's docs")
    p.add_argument("--reference", default=None,
                   help="arm whose median final eval loss is the target (default: hf-best if run, else hf-tuned if run, else the first)")
    p.add_argument("--target", type=float, default=None,
                   help="eval loss to reach (default: the reference's median final eval loss), e.g. a committed "
                        "hf-tuned figure when hf-tuned is not rerun")
    p.add_argument("--fresh", action="store_true", help="run every (arm, seed) again, ignoring saved runs")
    p.add_argument("--runs-dir", default=None,
                   help="where each run's result is saved and looked up (default: --out/<name>_runs)")
    p.add_argument("--saved-only", action="store_true",
                   help="train nothing: summarise the saved runs (arms or seeds without one are left out)")
    p.add_argument("--out", default=str(RESULTS), help="directory for time_to_loss.{json,md,png}")
    p.add_argument("--name", default="time_to_loss", help="basename of the output files")
    return p


def main(argv=None) -> dict[str, Any]:
    ns = make_parser().parse_args(argv)
    arms = [a.strip() for a in ns.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise UsageError(f"--arms: unknown {unknown}; known: {list(ARMS)}")
    if ns.seeds < 1:
        raise UsageError(f"--seeds must be >= 1, got {ns.seeds}")
    if ns.lr_sweep:
        lrs = [float(x) for x in ns.lr_sweep.split(",") if x.strip()]
        swept = []
        for a in arms:
            for lr in lrs:
                name = f"{a}@{lr:g}"
                ARMS[name] = dataclasses.replace(ARMS[a], name=name, args={**ARMS[a].args, "learning_rate": lr})
                swept.append(name)
        arms = swept
    setup = dataclasses.replace(QUICK if ns.quick else Setup(), corpus=ns.corpus)
    if ns.max_steps:
        setup.max_steps = ns.max_steps
    if ns.reference is not None and ns.reference not in arms:
        raise UsageError(f"--reference {ns.reference!r} is not one of the chosen arms {arms}")
    tokenizer, lm = prepare_data(data_arguments(setup))
    out = Path(ns.out)
    saved_dir = Path(ns.runs_dir) if ns.runs_dir else out / f"{ns.name}_runs"
    saved_dir.mkdir(parents=True, exist_ok=True)
    runs = []
    with tempfile.TemporaryDirectory(prefix="ttl-") as work:
        seeds = [int(x) for x in ns.seed_list.split(",")] if ns.seed_list else list(range(ns.seeds))
        for seed in seeds:
            for arm in arms:
                key = run_key(ARMS[arm], seed, setup)
                path = saved_dir / f"{arm.replace('/', '_')}-seed{seed}.json"
                r = None if ns.fresh else load_saved_run(path, key)
                if r is not None:
                    print(f"[time_to_loss] {arm:>12s} seed {seed}: saved run, skipped", flush=True)
                elif ns.saved_only:
                    print(f"[time_to_loss] {arm:>12s} seed {seed}: no saved run, left out", flush=True)
                    continue
                else:
                    r = run_arm(ARMS[arm], seed, setup, tokenizer, lm, Path(work))
                    r["key"] = key
                    path.write_text(json.dumps(r, indent=1, default=str))  # kept as it ends: reruns skip it
                    print(f"[time_to_loss] {arm:>12s} seed {seed}: final eval loss {r['final_eval_loss']:.4f}, "
                          f"{r['train_seconds']:.1f} s training", flush=True)
                runs.append(r)
    if ns.saved_only:
        arms = [a for a in arms if any(r["arm"] == a for r in runs)]
        if not arms:
            raise UsageError("--saved-only: no saved run for any chosen (arm, seed)")
    reference = ns.reference or next((a for a in ("hf-best", "hf-tuned") if a in arms), arms[0])
    summary = summarise(runs, arms, reference, target=ns.target)
    table = markdown_table(summary)
    print(table)
    env = environment_info()
    machine = env["cuda_devices"][0] if env["cuda_devices"] else f"{env['cpu_count']}-core CPU ({env['processor']})"
    record = {"summary": summary, "setup": dataclasses.asdict(setup), "arms": {a: dataclasses.asdict(ARMS[a]) | {"callbacks": None} for a in arms},
              "machine": machine, "environment": env, "runs": runs,
              "command": display_command("python benchmarks/time_to_loss.py", argv if argv is not None else sys.argv[1:])}
    (out / f"{ns.name}.json").write_text(json.dumps(record, indent=2, default=str))
    (out / f"{ns.name}.md").write_text(f"Machine: {machine}; torch {env['torch']}, transformers {env['transformers']}.\n"
                                      f"Command: `{record['command']}`\n\n" + table)
    plot(runs, summary, out / f"{ns.name}.png")
    return record


if __name__ == "__main__":
    run_cli(main)
