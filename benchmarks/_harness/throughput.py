"""What a throughput study measures with: step times summarised, device peaks, memory watched, a GPT-2 built from a
spec, synthetic tokens, and the checkout's revision."""

from __future__ import annotations

import resource
import statistics
import subprocess

from benchmarks._harness import ROOT

__all__ = ["peak_bf16_flops", "summarize_steps", "sync_device", "MemoryWatch", "build_gpt2", "param_count_no_pos",
           "SyntheticTokens", "git_revision", "aggregate_repeats"]


def peak_bf16_flops(device_name: str | None) -> float | None:
    """Dense bf16 peak FLOP/s for a known GPU name (hf_fasttrain.throughput's table), else None."""
    from hf_fasttrain.throughput import PEAK_BF16_FLOPS

    if not device_name:
        return None
    for key, peak in PEAK_BF16_FLOPS.items():  # first match wins: specific names come first
        if key in device_name:
            return peak
    return None


def summarize_steps(step_times: list[float], tokens_per_step: int) -> dict:
    """Median / p10 / p90 step time and the throughputs they give.

    Example:
        ```python
        >>> s = summarize_steps([0.1, 0.2, 0.1, 0.1], tokens_per_step=1000)
        >>> (s["step_time_median_s"], s["tokens_per_s"], s["tokens_per_s_window"])
        (0.1, 10000.0, 8000.0)
        ```
    """
    if not step_times:
        raise ValueError("step_times must not be empty (were all steps warm-up?)")
    ordered = sorted(step_times)

    def q(p):
        return ordered[min(len(ordered) - 1, max(0, int(round(p * (len(ordered) - 1)))))]

    median = statistics.median(step_times)
    return {
        "step_time_median_s": median,
        "step_time_p10_s": q(0.1),
        "step_time_p90_s": q(0.9),
        "tokens_per_s": tokens_per_step / median,
        "tokens_per_s_window": tokens_per_step * len(step_times) / sum(step_times),
    }


def aggregate_repeats(arm_runs: list[dict], peak_flops: float | None, descriptions: dict[str, str]) -> dict:
    """Median over repeats of each repeat's median step time, MFU against ``peak_flops``, the arm's description
    from ``descriptions``; everything per repeat kept too."""
    ok = [r for r in arm_runs if r.get("status") == "ok"]
    if not ok:
        return dict(arm_runs[0], repeats=arm_runs)
    per_repeat = [summarize_steps(r["step_times_s"], r["tokens_per_step"]) for r in ok]
    first = ok[0]
    median_step = statistics.median(s["step_time_median_s"] for s in per_repeat)
    tokens_per_s = first["tokens_per_step"] / median_step
    from hf_fasttrain.throughput import flops_per_token

    fpt = flops_per_token(first["n_params_no_pos"], first["model"]["n_layer"], first["model"]["n_embd"],
                          first["model"]["seq_len"])
    out = {
        "status": "ok",
        "description": descriptions[first["arm"]],
        "tokens_per_s": tokens_per_s,
        "step_time_median_s": median_step,
        "tokens_per_s_window": statistics.median(s["tokens_per_s_window"] for s in per_repeat),
        "step_time_p10_s": statistics.median(s["step_time_p10_s"] for s in per_repeat),
        "step_time_p90_s": statistics.median(s["step_time_p90_s"] for s in per_repeat),
        "mfu": tokens_per_s * fpt / peak_flops if peak_flops else None,
        "flops_per_token": fpt,
        "peak_mem_bytes": max(r["peak_mem_bytes"] for r in ok),
        "peak_mem_timed_bytes": first.get("peak_mem_timed_bytes"),
        "peak_mem_kind": first["peak_mem_kind"],
        "final_loss": statistics.median(r["final_loss"] for r in ok),
        "settings": first["settings"],
        "compiles": first.get("compiles"),
        "compiled_graphs": first.get("compiled_graphs"),
        "host_reads_per_step": first.get("host_reads_per_step"),
        "tokens_per_step": first["tokens_per_step"],
        "n_repeats": len(ok),
        "repeats": arm_runs,
    }
    return out


def sync_device(device):
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


class MemoryWatch:
    """Peak device memory of the whole run and of the timed steps alone (CUDA only)."""

    def __init__(self, device):
        self.device = device
        self.warmup_peak = None

    def warmup_done(self):
        import torch

        if self.device.type == "cuda":
            self.warmup_peak = int(torch.cuda.max_memory_allocated(self.device))
            torch.cuda.reset_peak_memory_stats(self.device)

    def report(self) -> dict:
        import torch

        if self.device.type != "cuda":
            return {"peak_mem_bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024,  # KiB on Linux
                    "peak_mem_timed_bytes": None, "peak_mem_kind": "cpu peak RSS (whole process)"}
        timed = int(torch.cuda.max_memory_allocated(self.device))
        return {"peak_mem_bytes": max(timed, self.warmup_peak or 0), "peak_mem_timed_bytes": timed,
                "peak_mem_reserved_bytes": int(torch.cuda.max_memory_reserved(self.device)),
                "peak_mem_kind": "cuda max_memory_allocated",
                "tf32_matmul_effective": bool(torch.backends.cuda.matmul.allow_tf32)}


def build_gpt2(spec, attn_implementation="sdpa"):
    from transformers import GPT2Config, GPT2LMHeadModel

    p = spec.get("dropout", 0.0)
    config = GPT2Config(
        n_layer=spec["n_layer"], n_head=spec["n_head"], n_embd=spec["n_embd"], vocab_size=spec["vocab_size"],
        n_positions=spec["n_positions"], bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM",
        attn_implementation=attn_implementation, resid_pdrop=p, embd_pdrop=p, attn_pdrop=p,
    )
    return GPT2LMHeadModel(config)


def param_count_no_pos(model) -> int:
    n = sum(p.numel() for p in model.parameters())  # tied wte/lm_head counted once
    return n - model.transformer.wpe.weight.numel()


class SyntheticTokens:
    """Uniform random token ids, fixed by seed: a map-style dataset of {input_ids, labels}."""

    def __init__(self, n_rows, seq_len, vocab_size, seed=0):
        import torch

        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab_size, (n_rows, seq_len), generator=g)

    def __len__(self):
        return self.data.shape[0]

    def __getitem__(self, i):
        row = self.data[i]
        return {"input_ids": row, "labels": row}


def git_revision():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
