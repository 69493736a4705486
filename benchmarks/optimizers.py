"""Optimizer step time and state memory on GPT-2 small's parameters (124M), side by side.

    python benchmarks/optimizers.py                      # CPU, writes benchmarks/results/optimizers.*
    python benchmarks/optimizers.py --device cuda        # on a GPU

What is measured, with random gradients on `GPT2LMHeadModel(GPT2Config())`:
- AdamW (torch, foreach: the baseline), AdamW / Lion / AdEMAMix through `hf_fasttrain.optim`:
  `optimizer.step()` on all 124M parameters, the arms interleaved round by round so machine load
  hits them alike; median seconds per step and the median of the per-round ratio to the baseline.
- SOAP and Muon (+AdamW) do matrix work per step (several GFLOP per hidden matrix), far too slow to
  repeat on the whole model on two CPU cores. They are timed on the parameters of one transformer
  block and, separately, on the rest (embeddings, final norm), by giving only those parameters a
  gradient (optimizers skip parameters without one); the 12-layer step is rest + 12 x block. The
  same extrapolation is computed for the AdamW baseline and printed next to its direct figure.
- SOAP: its first step only builds the preconditioner (eigendecompositions, one-off), later steps
  are regular, and every `precondition_frequency` (10) steps one also refreshes the eigenbases by
  power iteration + QR. It runs here with frequency 3 to reach refreshes quickly; the amortised
  cost is (9 x regular + 1 x refresh) / 10.
- State: bytes of all optimizer state tensors per model parameter (for SOAP and Muon from the
  measured per-parameter state of the block and the rest, summed over the 12-layer model).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import hf_fasttrain  # noqa: E402
from hf_fasttrain.optim import create_optimizer, soap_preconditioned_dims  # noqa: E402

ELEMENTWISE = ["torch-adamw-foreach", "adamw", "lion", "ademamix"]
MATRIX = ["soap", "muon"]
SOAP_BENCH_FREQUENCY = 3
SOAP_FREQUENCY = 10


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=7, help="timed steps per elementwise arm")
    parser.add_argument("--matrix-rounds", type=int, default=2, help="SOAP cycles of 3 steps (2 regular, 1 refresh)")
    parser.add_argument("--soap-init", action="store_true", help="time SOAP's first step (eigendecompositions)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide GPT-2 for a smoke test")
    return parser


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed_step(opt, device: str) -> float:
    _sync(device)
    start = time.perf_counter()
    opt.step()
    _sync(device)
    return time.perf_counter() - start


def _state_bytes(opt, params) -> int:
    ids = {id(p) for p in params}
    total = 0
    for p, state in opt.state.items():
        if id(p) not in ids:
            continue
        for value in state.values():
            values = value if isinstance(value, (list, tuple)) else [value]
            total += sum(v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor))
    return total


def _build(name: str, model):
    if name == "torch-adamw-foreach":
        return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
    if name == "soap":
        return create_optimizer("soap", model, precondition_frequency=SOAP_BENCH_FREQUENCY)
    return create_optimizer(name, model)


def _prime_soap(opt, params) -> None:
    """Give SOAP's state for `params` identity eigenbases, skipping the eigendecompositions of its
    first step (minutes on 2 CPU cores; `--soap-init` times them). Later steps cost the same."""
    ids = {id(p) for p in params}
    for group in opt.param_groups:
        for p in group["params"]:
            if id(p) not in ids or opt.state[p]:
                continue
            state = opt.state[p]
            state["step"] = torch.tensor(0.0)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
            for d in soap_preconditioned_dims(tuple(p.shape), group["max_precond_dim"], group["precondition_1d"]):
                state[f"GG_{d}"] = torch.zeros(p.shape[d], p.shape[d], device=p.device)
                state[f"Q_{d}"] = torch.eye(p.shape[d], device=p.device)


def _set_grads(model, grads, subset=None) -> None:
    for name, p in model.named_parameters():
        p.grad = grads[name] if subset is None or name in subset else None


def main(args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    device = args.device
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000) if args.tiny else GPT2Config()
    model = GPT2LMHeadModel(config).to(device)
    names = [n for n, _ in model.named_parameters()]
    n_params = sum(p.numel() for p in model.parameters())
    grads = {n: 1e-3 * torch.randn_like(p) for n, p in model.named_parameters()}
    block = {n for n in names if n.startswith("transformer.h.0.")}
    rest = {n for n in names if not n.startswith("transformer.h.")}
    n_layer = model.config.n_layer
    params_by_name = dict(model.named_parameters())
    results: dict[str, dict] = {}
    t_begin = time.perf_counter()

    # 1) Elementwise optimizers on the whole model, interleaved.
    _set_grads(model, grads)
    opts = {name: _build(name, model) for name in ELEMENTWISE}
    first = {name: _timed_step(opt, device) for name, opt in opts.items()}  # allocates the state
    times = {name: [] for name in ELEMENTWISE}
    for _ in range(args.rounds):
        for name, opt in opts.items():
            times[name].append(_timed_step(opt, device))
    base = times["torch-adamw-foreach"]
    for name in ELEMENTWISE:
        ratios = [t / b for t, b in zip(times[name], base)]
        results[name] = {
            "method": "whole model",
            "step_s": statistics.median(times[name]),
            "step_s_all": times[name],
            "first_step_s": first[name],
            "ratio_to_torch_adamw_foreach": statistics.median(ratios),
            "state_bytes_per_param": _state_bytes(opts[name], model.parameters()) / n_params,
        }
    del opts

    # 2) SOAP and Muon on one block and on the rest, interleaved with the baseline on the same part.
    opts = {name: _build(name, model) for name in ["torch-adamw-foreach"] + MATRIX}
    parts: dict[str, dict] = {name: {} for name in opts}
    for part, subset in (("block", block), ("rest", rest)):
        _set_grads(model, grads, subset)
        params = [params_by_name[n] for n in subset]
        if not args.soap_init:
            _prime_soap(opts["soap"], params)
        for name, opt in opts.items():
            parts[name][part] = {"first_s": _timed_step(opt, device), "step_s": [], "regular_s": [], "refresh_s": []}
        for _ in range(args.matrix_rounds):
            for k in range(1, SOAP_BENCH_FREQUENCY + 1):
                for name, opt in opts.items():
                    seconds = _timed_step(opt, device)
                    if name == "soap":
                        parts[name][part]["refresh_s" if k == SOAP_BENCH_FREQUENCY else "regular_s"].append(seconds)
                    else:
                        parts[name][part]["step_s"].append(seconds)
        for name, opt in opts.items():
            parts[name][part]["state_bytes"] = _state_bytes(opt, params)
    del opts

    def extrapolate(name: str, key: str) -> float:
        return statistics.median(parts[name]["rest"][key]) + n_layer * statistics.median(parts[name]["block"][key])

    baseline = results["torch-adamw-foreach"]
    baseline["extrapolated_step_s"] = extrapolate("torch-adamw-foreach", "step_s")
    for name in MATRIX:
        state = (parts[name]["rest"]["state_bytes"] + n_layer * parts[name]["block"]["state_bytes"]) / n_params
        if name == "soap":
            regular, refresh = extrapolate(name, "regular_s"), extrapolate(name, "refresh_s")
            entry = {
                "step_s": ((SOAP_FREQUENCY - 1) * regular + refresh) / SOAP_FREQUENCY,
                "regular_step_s": regular,
                "refresh_step_s": refresh,
                "init_step_s": (
                    parts[name]["rest"]["first_s"] + n_layer * parts[name]["block"]["first_s"] if args.soap_init else None
                ),
                "precondition_frequency": SOAP_FREQUENCY,
            }
        else:
            entry = {"step_s": extrapolate(name, "step_s")}
        entry.update(
            method=f"rest + {n_layer} x block",
            ratio_to_torch_adamw_foreach=entry["step_s"] / baseline["step_s"],
            state_bytes_per_param=state,
            parts=parts[name],
        )
        results[name] = entry
    baseline["parts"] = parts["torch-adamw-foreach"]

    record = {
        "benchmark": "optimizers",
        "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "model": f"GPT2LMHeadModel({'tiny' if args.tiny else 'GPT2Config()'}): {n_params} parameters, random gradients",
        "extrapolation": f"rest + {n_layer} x block",
        "device": device,
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "load_average_at_end": os.getloadavg(),
            "cuda": torch.cuda.get_device_name() if device.startswith("cuda") else None,
        },
        "versions": {"torch": torch.__version__, "hf_fasttrain": hf_fasttrain.__version__, "git": _git_rev()},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rounds": args.rounds,
        "matrix_rounds": args.matrix_rounds,
        "soap_init_timed": args.soap_init,
        "wall_s": time.perf_counter() - t_begin,
        "results": results,
    }
    write_outputs(record, Path(args.out), device)
    return record


def _git_rev() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True, cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(record: dict) -> str:
    rows = [
        "| optimizer | s / step (median) | x torch AdamW foreach | state bytes / param | how |",
        "|---|---:|---:|---:|---|",
    ]
    for name, r in record["results"].items():
        step = f"{r['step_s']:.2f}"
        how = r["method"]
        if name == "soap":
            step += " amortised"
            init = f"{r['init_step_s']:.0f} s" if r["init_step_s"] is not None else "not timed"
            how += (
                f"; regular {r['regular_step_s']:.1f} s, refresh {r['refresh_step_s']:.1f} s every "
                f"{r['precondition_frequency']}, first step (eigh, once) {init}"
            )
        if name == "torch-adamw-foreach":
            how += f"; {record['extrapolation']} gives {r['extrapolated_step_s']:.2f} s"
            ratio = "1.00"
        else:
            ratio = f"{r['ratio_to_torch_adamw_foreach']:.2f}"
        rows.append(f"| {name} | {step} | {ratio} | {r['state_bytes_per_param']:.1f} | {how} |")
    m = record["machine"]
    rows.append("")
    rows.append(
        f"{record['model']}; device {record['device']} ({m['cuda'] or m['processor']}), {m['cpu_count']} CPUs, "
        f"{m['torch_threads']} torch threads, load average {m['load_average_at_end'][0]:.1f} at the end; "
        f"torch {record['versions']['torch']}; {record['rounds']} rounds (matrix optimizers {record['matrix_rounds']})."
    )
    return "\n".join(rows)


def write_outputs(record: dict, out: Path, device: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    stem = "optimizers" if device == "cpu" else f"optimizers_{device.split(':')[0]}"
    (out / f"{stem}.json").write_text(json.dumps(record, indent=2))
    text = table(record)
    (out / f"{stem}.md").write_text(text + "\n")
    print(text)

    names = list(record["results"])
    res = record["results"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax1.barh(names, [res[n]["step_s"] for n in names], color=["#888"] + ["#4c72b0"] * (len(names) - 1))
    ax1.set_xscale("log")
    ax1.set_xlabel("seconds per optimizer step (log; SOAP amortised)")
    ax1.invert_yaxis()
    ax2.barh(names, [res[n]["state_bytes_per_param"] for n in names], color="#55a868")
    ax2.set_xlabel("optimizer state bytes per parameter")
    ax2.invert_yaxis()
    fig.suptitle(f"GPT-2 small (124M) optimizer step, {device}, {record['machine']['torch_threads']} threads")
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=120)


if __name__ == "__main__":
    main(make_parser().parse_args())
