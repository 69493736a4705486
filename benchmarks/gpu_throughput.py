"""Training throughput of GPT-2: Trainer defaults, tuned Trainer, FastTrainer and a plain compiled loop.

GPU measurement (GPT-2 small 124M, batch 32 x 1024, bf16, SDPA, synthetic tokens):
    python -m benchmarks.gpu_throughput
CPU smoke run (tiny GPT-2, a few steps; the test suite runs this):
    python -m benchmarks.gpu_throughput --device cpu --tiny

Arms (same model, same data, same batch; each in its own process, one after the other):
    hf-default             transformers.Trainer with its defaults (fp32, eager, fused AdamW)
    hf-bf16                hf-default + bf16=True (isolates what precision alone gives)
    hf-tuned               Trainer + bf16 + torch_compile + tf32 + adamw_torch_fused, SDPA attention
    fasttrain              FastTrainer with recipes/configs/gpt2_small.yaml: precision, compile, optimizer,
                           data loading, stability guard, LR schedule (not its run length, eval, saving)
    torch-loop             plain PyTorch loop over the same HF model: torch.compile, bf16 autocast,
                           fused AdamW, clip 1.0, tf32 (the reference the Trainer arms are held to)
    torch-loop-chunked-ce  torch-loop with the LM head + cross-entropy computed in token chunks
                           (benchmarks._harness.chunked_ce.chunked_lm_head_loss): no full fp32 logits
    fasttrain-<part>       the recipe with one part changed (no-guard, no-record, token-schedule, ema,
                           ns-per-matrix): what each part costs per step (`--arms fast-path` runs them all
                           with hf-default, hf-tuned and fasttrain)

What is measured, per arm: every optimizer step is timed between two `synchronize()` calls (so the
time includes data loading and the host work of the Trainer); the first `--warmup` steps (compile,
allocator warm-up, cuDNN/cuBLAS autotuning) are excluded. tokens/s = batch x seq_len / median step
time. MFU = tokens/s x FLOPs per token / peak FLOP/s, with FLOPs per token = 6 N + 12 L d T
(Kaplan et al. 2020, "Scaling Laws for Neural Language Models", sec. 2.1; attention term as in
Chowdhery et al. 2022, "PaLM", appendix B), N = parameters without the position embedding (the
tied token embedding counts once: it is the LM head's matmul), and the peak is the device's dense
bf16 tensor-core figure for every arm (one scale for all; fp32 arms are compared against it too).
Peak memory: torch.cuda.max_memory_allocated on GPU; on CPU the process's peak RSS (ru_maxrss),
which includes the Python and torch runtime. Trainer arms also report compiles (the most times one
function was compiled; under a fixed shape 1) with compiled graphs in all, and host reads per timed
step (calls of Tensor.item/__float__/__int__/__bool__/tolist: each waits for the device).

Each arm is one process: this script re-invoked with `--worker ARM`, so compile caches, allocator
state and memory counters do not leak between arms. The GPU path imports only torch, transformers
and accelerate (no datasets / evaluate). Results: a table on stdout, JSON (+ PNG when matplotlib
is installed) in benchmarks/results/.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.gpu_throughput [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks._harness import ROOT as _ROOT
from benchmarks._harness import UsageError, run_cli
from benchmarks._harness import display_command, display_path, module_command, subprocess_env
from benchmarks._harness.throughput import (MemoryWatch, SyntheticTokens, aggregate_repeats, build_gpt2,
                                           git_revision, param_count_no_pos, peak_bf16_flops, summarize_steps,
                                           sync_device)

ROOT = str(_ROOT)

__all__ = ["ARMS", "MODEL_SPECS", "peak_bf16_flops", "summarize_steps", "main"]

# name -> one-line description (the runner functions are below, in WORKERS)
ARMS = {
    "hf-default": "Trainer defaults (fp32, eager, fused AdamW)",
    "hf-bf16": "Trainer defaults + bf16",
    "hf-tuned": "Trainer + bf16 + torch_compile + tf32 + fused AdamW + SDPA",
    "fasttrain": "FastTrainer with the gpt2_small recipe (its run settings aside)",
    "torch-loop": "plain compiled PyTorch loop, bf16 autocast, fused AdamW",
    "torch-loop-chunked-ce": "torch-loop + chunked LM-head cross-entropy",
    # the recipe with one part changed: what each part costs per step
    "fasttrain-no-guard": "fasttrain without the divergence guard",
    "fasttrain-no-record": "fasttrain without the run record (throughput meter, logs' extras)",
    "fasttrain-token-schedule": "fasttrain with the lr schedule counted in tokens (schedule_unit='tokens')",
    "fasttrain-ema": "fasttrain with an EMA of the weights (weight_averaging='ema')",
    "fasttrain-ns-per-matrix": "fasttrain with Muon's Newton-Schulz matrix by matrix (ns_batched=False)",
    "fasttrain-lora": "fasttrain with rank-16 LoRA adapters (peft) on every linear layer, the base frozen",
}
# recipe overrides of the fasttrain-* arms
FASTTRAIN_VARIANTS = {
    "fasttrain": {},
    "fasttrain-no-guard": {"divergence_guard": False},
    "fasttrain-no-record": {"run_record": False},
    "fasttrain-token-schedule": {"schedule_unit": "tokens"},
    "fasttrain-ema": {"weight_averaging": "ema", "ema_decay": 0.999},
    "fasttrain-ns-per-matrix": {"optimizer_kwargs": {"ns_batched": False}},
    "fasttrain-lora": {},  # the model is wrapped in LoRA adapters (LORA below)
}
LORA = {"lora_r": 16, "lora_alpha": 32.0, "lora_target_modules": "all-linear"}
DEFAULT_ARMS = {
    "gpu": ["hf-default", "hf-bf16", "hf-tuned", "fasttrain", "torch-loop", "torch-loop-chunked-ce"],
    "tiny": ["hf-default", "hf-tuned", "fasttrain", "torch-loop", "torch-loop-chunked-ce"],
    # the fast-path check (benchmarks/gpu_fast_path_check.sh): the Trainer, the recipe, the recipe's parts
    # (run in this order, so a run cut short still has the three main arms; the table keeps ARMS' order)
    "fast-path": ["fasttrain", "hf-tuned", "hf-default", "fasttrain-no-guard", "fasttrain-no-record",
                  "fasttrain-token-schedule", "fasttrain-ema", "fasttrain-ns-per-matrix", "fasttrain-lora"],
}

# GPT-2 small: 12 layers x 768 wide, 50,257 BPE vocab, 1024 context (Radford et al. 2019).
# 32 sequences x 1024 tokens = 32,768 tokens per step.
MODEL_SPECS = {
    "small": dict(n_layer=12, n_head=12, n_embd=768, vocab_size=50257, n_positions=1024, batch_size=32, seq_len=1024),
    "tiny": dict(n_layer=2, n_head=2, n_embd=32, vocab_size=512, n_positions=64, batch_size=8, seq_len=64),
}

# ------------------------------------------------------------------------------------------------
# Worker side: one arm in this process.
# ------------------------------------------------------------------------------------------------


class ArmUnavailable(RuntimeError):
    """The arm cannot run in this checkout (e.g. FastTrainer not there yet)."""


def _device_and_precision(opts):
    import torch

    from hf_fasttrain.stability.precision import detect_device

    if opts.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    device = torch.device("cuda", 0) if opts.device == "cuda" else torch.device("cpu")
    info = detect_device(use_cpu=opts.device == "cpu")
    return device, info


def _compile_on(opts) -> bool:
    return opts.compile == "on" or (opts.compile == "auto" and opts.device == "cuda")


def trainer_arm_setup(arm, kwargs, info, compile_on, opts=None):
    """(trainer class or None for Trainer, TrainingArguments kwargs, attention, settings) of a Trainer arm.

    Pure apart from the fasttrain arm (which reads the recipe), so the GPU settings of each arm are
    testable with a mocked device.
    """
    from hf_fasttrain.stability.precision import apply_precision, resolve_precision

    kwargs = dict(kwargs)
    settings = {"trainer": "Trainer"}
    if arm == "hf-default":
        return None, kwargs, None, settings  # attention: whatever transformers picks by default
    if arm == "hf-bf16":
        kwargs = apply_precision(kwargs, resolve_precision("bf16", info))
        kwargs.pop("tf32", None)  # bf16 alone: TF32 stays at torch's default
        return None, kwargs, None, settings
    if arm == "hf-tuned":
        kwargs = apply_precision(kwargs, resolve_precision("bf16", info))
        kwargs.update(torch_compile=compile_on, optim="adamw_torch_fused")
        return None, kwargs, "sdpa", settings
    if arm in FASTTRAIN_VARIANTS:
        trainer_cls, kwargs, settings = _fasttrain_setup(kwargs, compile_on, opts, info)
        kwargs.update(FASTTRAIN_VARIANTS[arm])
        settings["changed"] = FASTTRAIN_VARIANTS[arm]
        return trainer_cls, kwargs, "sdpa", settings
    raise ValueError(f"not a Trainer arm: {arm}")


def _trainer_arm(arm, opts, spec, device, info, memory):
    """hf-default, hf-bf16, hf-tuned and fasttrain: the Trainer (or FastTrainer) with a timing callback."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from benchmarks._harness import HostReadCounter
    from hf_fasttrain.throughput import CompileCounter

    reads = HostReadCounter()

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.ends = []
            self.reads_at = []

        def on_step_end(self, args, state, control, **kwargs):
            self.reads_at.append(reads.n)  # before the timing sync, which is the benchmark's own read
            sync_device(device)
            self.ends.append(time.perf_counter())
            if len(self.ends) == opts.warmup:
                memory.warmup_done()

    total_steps = opts.warmup + opts.steps
    out_dir = tempfile.mkdtemp(prefix=f"gpu_throughput_{arm}_")
    kwargs = dict(
        output_dir=out_dir, per_device_train_batch_size=spec["batch_size"], max_steps=total_steps,
        report_to="none", save_strategy="no", logging_strategy="no", disable_tqdm=True, seed=0,
        use_cpu=device.type == "cpu",
    )
    trainer_cls, kwargs, attn, settings = trainer_arm_setup(arm, kwargs, info, _compile_on(opts), opts)
    trainer_cls = trainer_cls or Trainer

    model = build_gpt2(spec, attn) if attn else build_gpt2(spec, attn_implementation=None)
    if arm == "fasttrain-lora":  # step time and memory with adapters only trained (a frozen base, no Hub download)
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ArmUnavailable("peft is not installed (pip install peft)") from None
        from hf_fasttrain import ModelArguments
        from hf_fasttrain.modeling import apply_lora

        model = apply_lora(model, ModelArguments(model_name_or_path="synthetic-base", **LORA))
    dataset = SyntheticTokens(spec["batch_size"] * total_steps, spec["seq_len"], spec["vocab_size"])
    args_cls = kwargs.pop("_args_cls", TrainingArguments)
    args = args_cls(**kwargs)
    timer = StepTimer()
    trainer = trainer_cls(model=model, args=args, train_dataset=dataset, callbacks=[timer])
    if getattr(trainer, "recorder", None) is not None:  # FastTrainer: no metrics.json / loss PNG (matplotlib may be absent)
        trainer.recorder.write_files = False
    sync_device(device)
    compiles = CompileCounter()
    start = time.perf_counter()
    with reads:
        out = trainer.train()
    sync_device(device)
    timed_reads = [b - a for a, b in zip(timer.reads_at[opts.warmup - 1 : -1], timer.reads_at[opts.warmup :])]
    ends = [start] + timer.ends
    step_times = [b - a for a, b in zip(ends[opts.warmup : -1], ends[opts.warmup + 1 :])]
    settings.update(
        precision=args.mixed_precision, torch_compile=bool(args.torch_compile), tf32=args.tf32, optim=str(getattr(args.optim, "value", args.optim)),
        optimizer=getattr(args, "optimizer", None),  # FastTrainer's optimizer (replaces optim when set)
        attn_implementation=model.config._attn_implementation, dataloader_num_workers=args.dataloader_num_workers,
        dataloader_pin_memory=args.dataloader_pin_memory, per_device_train_batch_size=args.per_device_train_batch_size,
    )
    return {
        "step_times_s": step_times,
        "tokens_per_step": args.per_device_train_batch_size * spec["seq_len"],
        "final_loss": float(out.training_loss),
        "n_params_no_pos": param_count_no_pos(model),
        "settings": settings,
        "steps_run": len(timer.ends),
        **compiles.stats(),  # compiles (most of one function) and compiled_graphs (in all, graph-break pieces too)
        # Tensor.item/__float__/__int__/__bool__/tolist calls per timed step (each waits for the device)
        "host_reads_per_step": statistics.median(timed_reads) if timed_reads else None,
    }


# The fasttrain arm takes the whole recipe (precision, compile, optimizer, data loading, but also the
# stability guard and the LR schedule, which run every step) except the keys about the run around
# the steps, which the benchmark sets the same for every arm.
FASTTRAIN_RECIPE = "gpt2_small"
RUN_KEYS = (
    "output_dir", "max_steps", "num_train_epochs", "per_device_train_batch_size", "per_device_eval_batch_size",
    "warmup_steps", "logging_steps", "logging_strategy", "eval_strategy", "eval_steps", "eval_on_start",
    "save_strategy", "save_steps", "save_total_limit", "report_to", "seed", "use_cpu",
)


def _fasttrain_setup(kwargs, compile_on, opts, info):
    """FastTrainer + FastTrainingArguments with the GPT-2 small recipe's settings (RUN_KEYS left out)."""
    if not os.path.exists(os.path.join(ROOT, "hf_fasttrain", "trainer.py")):
        raise ArmUnavailable("FastTrainer is not in this checkout yet (no hf_fasttrain/trainer.py)")
    from hf_fasttrain import FastTrainer, FastTrainingArguments
    from hf_fasttrain.config.recipes import load_recipe, validate_recipe

    recipe = validate_recipe(load_recipe(FASTTRAIN_RECIPE))[None]
    taken = {k: v for k, v in recipe.items() if k not in RUN_KEYS}
    kwargs = dict(kwargs, **taken, auto_resume=False, _args_cls=FastTrainingArguments)
    if "torch_compile" in taken:
        kwargs["torch_compile"] = bool(taken["torch_compile"]) and compile_on
    if info.is_cpu and opts is not None and opts.tiny:  # a 2-core CPU: worker processes would only compete with training
        kwargs["dataloader_num_workers"] = 0
        kwargs.pop("dataloader_persistent_workers", None)
    return FastTrainer, kwargs, {"trainer": "FastTrainer", "recipe": FASTTRAIN_RECIPE, "recipe_settings": taken}


def _loop_arm(arm, opts, spec, device, info, memory):
    """torch-loop and torch-loop-chunked-ce: the same HF model in a hand-written training loop."""
    import torch

    from benchmarks._harness.chunked_ce import chunked_lm_head_loss
    from hf_fasttrain.stability.precision import resolve_precision

    torch.manual_seed(0)
    choice = resolve_precision("bf16", info)
    if choice.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    model = build_gpt2(spec, "sdpa").to(device)
    model.train()
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.0, fused=fused)
    chunked = arm == "torch-loop-chunked-ce"

    def loss_fn(x):
        with torch.autocast(device.type, dtype=torch.bfloat16):
            if chunked:
                hidden = model.transformer(input_ids=x).last_hidden_state
                return chunked_lm_head_loss(hidden, model.lm_head.weight, x, chunk_size=opts.ce_chunk_size)
            return model(input_ids=x, labels=x).loss

    step_loss = torch.compile(loss_fn) if _compile_on(opts) else loss_fn
    total_steps = opts.warmup + opts.steps
    data = SyntheticTokens(spec["batch_size"] * total_steps, spec["seq_len"], spec["vocab_size"]).data
    if device.type == "cuda":
        data = data.pin_memory()
    order = torch.randperm(data.shape[0], generator=torch.Generator().manual_seed(0))
    ends = []
    losses = []
    sync_device(device)
    start = time.perf_counter()
    for step in range(total_steps):
        idx = order[step * spec["batch_size"] : (step + 1) * spec["batch_size"]]
        x = data[idx].to(device, non_blocking=True)
        loss = step_loss(x)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # the Trainer's default max_grad_norm
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        sync_device(device)
        ends.append(time.perf_counter())
        if step + 1 == opts.warmup:
            memory.warmup_done()
    ends = [start] + ends
    step_times = [b - a for a, b in zip(ends[opts.warmup : -1], ends[opts.warmup + 1 :])]
    return {
        "step_times_s": step_times,
        "tokens_per_step": spec["batch_size"] * spec["seq_len"],
        "final_loss": float(torch.stack(losses).float().mean()),
        "n_params_no_pos": param_count_no_pos(model),
        "settings": {
            "trainer": "plain loop", "precision": "bf16", "torch_compile": _compile_on(opts), "tf32": choice.tf32,
            "optim": "torch.optim.AdamW(fused=%s)" % fused, "attn_implementation": model.config._attn_implementation,
            "loss": f"chunked_lm_head_loss(chunk_size={opts.ce_chunk_size})" if chunked else "GPT2LMHeadModel(labels=)",
            "per_device_train_batch_size": spec["batch_size"],
        },
        "steps_run": total_steps,
    }


def run_worker(arm: str, opts) -> dict:
    import torch
    import transformers

    spec = dict(MODEL_SPECS["tiny" if opts.tiny else "small"])
    if opts.batch_size:
        spec["batch_size"] = opts.batch_size
    if opts.seq_len:
        spec["seq_len"] = opts.seq_len
        spec["n_positions"] = max(spec["n_positions"], opts.seq_len)
    spec["dropout"] = opts.dropout
    device, info = _device_and_precision(opts)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    began = time.perf_counter()
    memory = MemoryWatch(device)
    runner = _loop_arm if arm.startswith("torch-loop") else _trainer_arm
    result = runner(arm, opts, spec, device, info, memory)
    result["wall_s"] = time.perf_counter() - began
    result.update(memory.report())
    result["device_name"] = info.name
    result["device"] = dict(kind=info.kind, name=info.name, compute_capability=info.compute_capability)
    result["versions"] = {"torch": torch.__version__, "transformers": transformers.__version__,
                          "cuda": torch.version.cuda}
    result["model"] = spec
    return result


# ------------------------------------------------------------------------------------------------
# Driver side: one process per arm, then the table, JSON and PNG.
# ------------------------------------------------------------------------------------------------


def _run_arm_process(arm, opts, argv_common):
    with tempfile.TemporaryDirectory(prefix="gpu_throughput_") as tmp:
        result_file = os.path.join(tmp, "result.json")
        cmd = module_command("gpu_throughput", "--worker", arm, "--result-file", result_file, *argv_common)
        env = subprocess_env()
        env.setdefault("CUDA_VISIBLE_DEVICES", "0")  # one device: no DataParallel in the Trainer arms
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        began = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=opts.arm_timeout)
        except subprocess.TimeoutExpired:
            return {"status": "error", "error": f"timed out after {opts.arm_timeout} s"}
        if os.path.exists(result_file):
            with open(result_file) as f:
                result = json.load(f)
        else:
            tail = (proc.stderr or proc.stdout or "").strip().splitlines()[-15:]
            result = {"status": "error", "error": f"exit code {proc.returncode}", "stderr_tail": tail}
        result["process_wall_s"] = time.perf_counter() - began
        return result


def _fmt_mem(n):
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB"


def format_table(results: dict) -> str:
    rows = ["| arm | tokens/s | step ms (median) | MFU | peak memory | mean loss | compiles (graphs) | host reads/step | settings |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for arm, r in results["arms"].items():
        if r.get("status") != "ok":
            rows.append(f"| {arm} | {r.get('status')}: {r.get('error', '')} | | | | | | | |")
            continue
        s = r["settings"]
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        knobs = f"{s.get('precision')}, compile={s.get('torch_compile')}, tf32={s.get('tf32')}, {s.get('attn_implementation')}"
        if s.get("changed"):
            knobs += ", " + ", ".join(f"{k}={v}" for k, v in s["changed"].items())
        compiled = "n/a" if r.get("compiles") is None else f"{r['compiles']} ({r['compiled_graphs']})"
        reads = "n/a" if r.get("host_reads_per_step") is None else f"{r['host_reads_per_step']:g}"
        rows.append(
            f"| {arm} | {r['tokens_per_s']:,.0f} | {1000 * r['step_time_median_s']:.1f} | {mfu} | "
            f"{_fmt_mem(r['peak_mem_bytes'])} | {r['final_loss']:.3f} | {compiled} | {reads} | {knobs} |"
        )
    return "\n".join(rows)


def _plot(results: dict, path: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    arms = [a for a, r in results["arms"].items() if r.get("status") == "ok"]
    if not arms:
        return False
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    tps = [results["arms"][a]["tokens_per_s"] for a in arms]
    mem = [results["arms"][a]["peak_mem_bytes"] / 2**30 for a in arms]
    ax1.barh(arms, tps, color="tab:blue")
    ax1.set_xlabel("tokens/s (median step)")
    ax1.invert_yaxis()
    for y, (v, a) in enumerate(zip(tps, arms)):
        mfu = results["arms"][a]["mfu"]
        ax1.text(v, y, f" {v:,.0f}" + (f" ({100 * mfu:.0f}% MFU)" if mfu else ""), va="center", fontsize=8)
    ax2.barh(arms, mem, color="tab:orange")
    ax2.set_xlabel(f"peak memory, GiB ({results['arms'][arms[0]]['peak_mem_kind']})")
    ax2.invert_yaxis()
    cfg = results["config"]
    fig.suptitle(f"{cfg['model_name']} b={cfg['batch_size']}x{cfg['seq_len']} on {results['machine']['device_name']}",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda if available, else cpu")
    p.add_argument("--tiny", action="store_true", help="tiny GPT-2 (2 x 32, vocab 512, 8 x 64 tokens): CPU smoke run")
    p.add_argument("--arms", default=None,
                   help=f"comma-separated subset of {', '.join(ARMS)}; or a named set: {', '.join(DEFAULT_ARMS)}")
    p.add_argument("--steps", type=int, default=None, help="timed steps per arm (default 30 GPU, 4 tiny)")
    p.add_argument("--warmup", type=int, default=None, help="untimed first steps (default 10 GPU, 2 tiny)")
    p.add_argument("--batch-size", type=int, default=None, help="sequences per step (default 32, tiny 8)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default 1024, tiny 64)")
    p.add_argument("--repeats", type=int, default=1, help="processes per arm, run round-robin; medians over them")
    p.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                   help="torch.compile in the arms that use it; auto = on for cuda, off for cpu (inductor takes ~50 s per model on 2 CPU cores)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="GPT-2 dropout in every arm (0.0 as in the recipe and in pretraining; GPT2Config's default is 0.1)")
    p.add_argument("--ce-chunk-size", type=int, default=4096, help="tokens per chunk in torch-loop-chunked-ce")
    p.add_argument("--peak-tflops", type=float, default=None, help="override the device's dense bf16 peak for MFU")
    p.add_argument("--arm-timeout", type=float, default=900.0, help="seconds before an arm's process is killed")
    p.add_argument("--out-dir", default=os.path.join(ROOT, "benchmarks", "results"))
    p.add_argument("--name", default=None, help="output file stem (default gpu_throughput_<device>[_tiny])")
    p.add_argument("--append", action="store_true",
                   help="keep the arms already in the output JSON that this run does not re-run (split a run in parts)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result-file", default=None, help=argparse.SUPPRESS)
    return p


def _resolve_defaults(opts):
    if opts.device is None:
        import torch

        opts.device = "cuda" if torch.cuda.is_available() else "cpu"
    tiny = opts.tiny
    opts.steps = opts.steps if opts.steps is not None else (4 if tiny else 30)
    opts.warmup = opts.warmup if opts.warmup is not None else (2 if tiny else 10)
    if opts.warmup < 1 or opts.steps < 1:
        raise UsageError(f"--warmup and --steps must be >= 1; got warmup={opts.warmup}, steps={opts.steps}")
    if opts.arms in DEFAULT_ARMS:  # a named set: --arms fast-path
        arms = DEFAULT_ARMS[opts.arms]
    else:
        arms = opts.arms.split(",") if opts.arms else DEFAULT_ARMS["tiny" if tiny else "gpu"]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        raise UsageError(f"--arms: unknown {unknown}; known: {', '.join(ARMS)}")
    opts.arm_list = arms
    return opts


def main(argv=None) -> dict | None:
    opts = _resolve_defaults(make_parser().parse_args(argv))
    if opts.worker:
        result = {"arm": opts.worker}
        try:
            result.update(run_worker(opts.worker, opts), status="ok")
        except ArmUnavailable as err:
            result.update(status="unavailable", error=str(err))
        with open(opts.result_file, "w") as f:
            json.dump(result, f)
        return None

    common = ["--device", opts.device, "--steps", str(opts.steps), "--warmup", str(opts.warmup),
              "--compile", opts.compile, "--ce-chunk-size", str(opts.ce_chunk_size), "--dropout", str(opts.dropout)]
    if opts.tiny:
        common.append("--tiny")
    if opts.batch_size:
        common += ["--batch-size", str(opts.batch_size)]
    if opts.seq_len:
        common += ["--seq-len", str(opts.seq_len)]

    stem = opts.name or f"gpu_throughput_{opts.device}{'_tiny' if opts.tiny else ''}"
    json_path = os.path.join(opts.out_dir, stem + ".json")
    earlier = {}
    if opts.append and os.path.exists(json_path):  # keep the arms a previous (split) run measured
        with open(json_path) as f:
            earlier = json.load(f).get("arms", {})
    runs = {arm: [] for arm in opts.arm_list}
    results = None
    for rep in range(opts.repeats):
        order = opts.arm_list[rep % len(opts.arm_list):] + opts.arm_list[: rep % len(opts.arm_list)]
        for arm in order:
            print(f"[{rep + 1}/{opts.repeats}] {arm} ...", file=sys.stderr, flush=True)
            r = _run_arm_process(arm, opts, common)
            print(f"    {r.get('status')} in {r.get('process_wall_s', 0):.1f} s {r.get('error', '')}", file=sys.stderr)
            if r.get("status") == "error" and r.get("stderr_tail"):
                print("    " + "\n    ".join(r["stderr_tail"]), file=sys.stderr)
            runs[arm].append(r)
            # written after every arm, so a run cut short still leaves what it measured
            results = _write_outputs(opts, argv, runs, earlier, json_path, stem, final=False)
    results = _write_outputs(opts, argv, runs, earlier, json_path, stem, final=True)
    spec, device_name = results["config"]["model"], results["machine"]["device_name"]
    print(f"\n{results['config']['model_name']}, batch {spec['batch_size']} x {spec['seq_len']}, "
          f"{opts.steps} timed steps after {opts.warmup} warm-up, on {device_name}\n")
    print(format_table(results))
    print(f"\nwrote {json_path}" + (f" and {results['png']}" if results["png"] else " (no matplotlib: no PNG)"))
    return results


def _write_outputs(opts, argv, runs, earlier, json_path, stem, final):
    done = {arm: rs for arm, rs in runs.items() if rs}
    first_ok = next((r for rs in done.values() for r in rs if r.get("status") == "ok"), {})
    device_name = first_ok.get("device_name")
    peak = opts.peak_tflops * 1e12 if opts.peak_tflops else (peak_bf16_flops(device_name) if opts.device == "cuda" else None)
    spec = first_ok.get("model", MODEL_SPECS["tiny" if opts.tiny else "small"])
    arms = {a: r for a, r in earlier.items() if a not in done}
    arms.update({arm: aggregate_repeats(rs, peak, ARMS) for arm, rs in done.items()})
    arms = {a: arms[a] for a in ARMS if a in arms}  # a fixed order
    results = {
        "benchmark": "gpu_throughput",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "complete": final,
        "command": display_command("python -m benchmarks.gpu_throughput", list(argv if argv is not None else sys.argv[1:])),
        "git_revision": git_revision(),
        "machine": {
            "device": opts.device, "device_name": device_name, "peak_bf16_flops": peak,
            "platform": platform.platform(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
            "versions": first_ok.get("versions"),
        },
        "config": {
            "model_name": "gpt2-tiny" if opts.tiny else "gpt2-small (124M)", "model": spec,
            "batch_size": spec["batch_size"], "seq_len": spec["seq_len"], "steps_timed": opts.steps,
            "warmup_steps": opts.warmup, "repeats": opts.repeats, "compile": opts.compile,
            "data": "synthetic uniform token ids (seed 0)",
        },
        "arms": arms,
    }
    if earlier:
        results["appended_to_earlier_arms"] = sorted(a for a in earlier if a not in done)
    if opts.tiny:
        results["note"] = ("smoke run of the benchmark's code path on a tiny model: per-step overheads dominate and, "
                           "on a shared CPU, so does the machine's load; not a throughput measurement")
    os.makedirs(opts.out_dir, exist_ok=True)
    png_path = os.path.join(opts.out_dir, stem + ".png")
    results["png"] = display_path(os.path.abspath(png_path)) if final and _plot(results, png_path) else None
    with open(json_path, "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(opts.out_dir, stem + ".md"), "w") as f:
        note = f"\n\nNote: {results['note']}." if "note" in results else ""
        f.write(f"`{results['command']}` on {device_name} ({opts.device}), git {results['git_revision']}{note}\n\n"
                f"{format_table(results)}\n")
    return results


if __name__ == "__main__":
    run_cli(main)
