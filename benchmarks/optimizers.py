"""Optimizer step time and state memory on GPT-2 small's parameters (124M), side by side.

    python -m benchmarks.optimizers --soap-init        # CPU; writes benchmarks/results/optimizers.{json,md,png}
    python -m benchmarks.optimizers --device cuda      # on a GPU (writes optimizers_cuda.*)

What is measured, with fixed random gradients on `GPT2LMHeadModel(GPT2Config())`:
- torch AdamW (foreach; the baseline) and AdamW / Lion / AdEMAMix of `hf_fasttrain.optim`:
  `optimizer.step()` on all 124M parameters, the arms interleaved round by round so that changes in
  machine load hit them alike. Per arm: median wall-clock and median CPU time (`time.process_time`)
  per step, and the median over rounds of the ratio to the baseline's time in the same round. On a
  CPU the ratio uses CPU time, which other tenants of a shared machine disturb far less than
  wall-clock; on a GPU it uses wall-clock (synchronised).
- SOAP and Muon (+AdamW) do matrix work every step (several GFLOP per hidden matrix), too slow to
  repeat on the whole model on a CPU. They are timed on the parameters of one transformer block
  and, separately, on the rest (embeddings, final norm), by giving only those parameters a gradient
  (optimizers skip parameters without one), interleaved with the baseline on the same parameters;
  the 12-layer step is rest + 12 x block. Their ratio is to the baseline's whole-model step. The
  baseline's own rest + 12 x block figure is printed as a check: it comes out lower than its
  whole-model step, because one block's state fits in cache, so the extrapolation flatters the
  elementwise part of SOAP and Muon a little.
- SOAP: the first step only builds the preconditioner (eigendecompositions; once per run; timed
  with --soap-init, otherwise skipped by giving the state identity eigenbases, which costs the
  same afterwards), later steps are regular, and every `precondition_frequency` (10) steps one also
  refreshes the eigenbases (power iteration + QR). It runs here with frequency 3 to reach
  refreshes quickly; the amortised cost is (9 x regular + 1 x refresh) / 10.
- State: bytes of all optimizer state tensors per model parameter (SOAP and Muon: rest + 12 x
  block, exact since the blocks are alike).

Threads: one by default on a CPU. On the shared 2-core machine this was written on, two OpenMP
threads competing with other tenants made a torch AdamW step 4-8x slower (6-12 s) than one thread
(1.6 s); `--threads 2` measures that setting.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.optimizers [options]", file=sys.stderr)
    raise SystemExit(2)

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

import hf_fasttrain  # noqa: E402
from hf_fasttrain.optim import create_optimizer, soap_preconditioned_dims  # noqa: E402

BASELINE = "torch-adamw-foreach"
ELEMENTWISE = [BASELINE, "adamw", "lion", "ademamix"]
MATRIX = ["soap", "muon"]
SOAP_BENCH_FREQUENCY = 3
SOAP_FREQUENCY = 10


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=7, help="timed whole-model steps per elementwise arm")
    parser.add_argument("--matrix-rounds", type=int, default=2,
                        help="SOAP cycles of 3 steps (2 regular, 1 refresh); Muon and the baseline step alongside")
    parser.add_argument("--soap-init", action="store_true", help="time SOAP's first step (eigendecompositions)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: 1 on CPU)")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    parser.add_argument("--tiny", action="store_true", help="a 2-layer, 64-wide GPT-2 for a smoke test")
    return parser


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _timed_step(opt, device: str) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one `opt.step()`."""
    _sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    opt.step()
    _sync(device)
    return time.perf_counter() - wall, time.process_time() - cpu


def _state_bytes(opt, params) -> int:
    ids = {id(p) for p in params}
    total = 0
    for p, state in opt.state.items():
        if id(p) in ids:
            total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total


def _build(name: str, model):
    if name == BASELINE:
        return torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1, foreach=True)
    if name == "soap":
        return create_optimizer("soap", model, precondition_frequency=SOAP_BENCH_FREQUENCY)
    return create_optimizer(name, model)


def _prime_soap(opt, params) -> None:
    """Give SOAP's state for `params` identity eigenbases, skipping the eigendecompositions of its
    first step (minutes on a CPU; `--soap-init` times them). Later steps cost the same."""
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


def _median_ratio(times, base) -> float:
    return statistics.median(t / b for t, b in zip(times, base))


def main(args) -> dict:
    device = args.device
    threads = args.threads or (1 if device == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    key = 1 if device == "cpu" else 0  # index of the time the ratios use: CPU time on CPU, wall on GPU
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=1000) if args.tiny else GPT2Config()
    model = GPT2LMHeadModel(config).to(device)
    n_layer = model.config.n_layer
    n_params = sum(p.numel() for p in model.parameters())
    params_by_name = dict(model.named_parameters())
    grads = {n: 1e-3 * torch.randn_like(p) for n, p in model.named_parameters()}
    block = {n for n in params_by_name if n.startswith("transformer.h.0.")}
    rest = {n for n in params_by_name if not n.startswith("transformer.h.")}
    results: dict[str, dict] = {}
    t_begin = time.perf_counter()

    # 1) Elementwise optimizers on the whole model, interleaved round by round.
    _set_grads(model, grads)
    opts = {name: _build(name, model) for name in ELEMENTWISE}
    first = {name: _timed_step(opt, device) for name, opt in opts.items()}  # allocates the state
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in ELEMENTWISE}
    for _ in range(args.rounds):
        for name, opt in opts.items():
            times[name].append(_timed_step(opt, device))
    for name in ELEMENTWISE:
        results[name] = {
            "method": "whole model",
            "wall_s": statistics.median(t[0] for t in times[name]),
            "cpu_s": statistics.median(t[1] for t in times[name]),
            "ratio": _median_ratio([t[key] for t in times[name]], [t[key] for t in times[BASELINE]]),
            "state_bytes_per_param": _state_bytes(opts[name], model.parameters()) / n_params,
            "first_step": first[name],
            "steps": times[name],
        }
    del opts

    # 2) SOAP and Muon on one block and on the rest, interleaved with the baseline on the same part.
    opts = {name: _build(name, model) for name in [BASELINE] + MATRIX}
    parts: dict[str, dict] = {name: {} for name in opts}
    for part, subset in (("block", block), ("rest", rest)):
        _set_grads(model, grads, subset)
        params = [params_by_name[n] for n in subset]
        if not args.soap_init:
            _prime_soap(opts["soap"], params)
        for name, opt in opts.items():
            parts[name][part] = {"first_step": _timed_step(opt, device), "steps": [], "regular": [], "refresh": []}
        for _ in range(args.matrix_rounds):
            for k in range(1, SOAP_BENCH_FREQUENCY + 1):
                for name, opt in opts.items():
                    t = _timed_step(opt, device)
                    if name == "soap":
                        parts[name][part]["refresh" if k == SOAP_BENCH_FREQUENCY else "regular"].append(t)
                    else:
                        parts[name][part]["steps"].append(t)
        for name, opt in opts.items():
            parts[name][part]["state_bytes"] = _state_bytes(opt, params)
    del opts

    def whole(name: str, series: str, i: int) -> float:
        """rest + n_layer x block, from the medians of `series` (wall: i=0, CPU: i=1)."""
        med = {part: statistics.median(t[i] for t in parts[name][part][series]) for part in ("rest", "block")}
        return med["rest"] + n_layer * med["block"]

    base = results[BASELINE]
    base["extrapolated"] = {"wall_s": whole(BASELINE, "steps", 0), "cpu_s": whole(BASELINE, "steps", 1)}
    base["parts"] = parts[BASELINE]
    for name in MATRIX:
        if name == "soap":
            per = {i: ((SOAP_FREQUENCY - 1) * whole(name, "regular", i) + whole(name, "refresh", i)) / SOAP_FREQUENCY
                   for i in (0, 1)}
            entry = {
                "regular_step": {"wall_s": whole(name, "regular", 0), "cpu_s": whole(name, "regular", 1)},
                "refresh_step": {"wall_s": whole(name, "refresh", 0), "cpu_s": whole(name, "refresh", 1)},
                "precondition_frequency": SOAP_FREQUENCY,
                "init_step": (
                    {"wall_s": parts[name]["rest"]["first_step"][0] + n_layer * parts[name]["block"]["first_step"][0],
                     "cpu_s": parts[name]["rest"]["first_step"][1] + n_layer * parts[name]["block"]["first_step"][1]}
                    if args.soap_init else None
                ),
            }
        else:
            per = {i: whole(name, "steps", i) for i in (0, 1)}
            entry = {}
        state = (parts[name]["rest"]["state_bytes"] + n_layer * parts[name]["block"]["state_bytes"]) / n_params
        results[name] = {
            "method": f"rest + {n_layer} x block",
            "wall_s": per[0],
            "cpu_s": per[1],
            "ratio": per[key] / (base["cpu_s"] if key else base["wall_s"]),
            "state_bytes_per_param": state,
            **entry,
            "parts": parts[name],
        }

    m = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": os.getloadavg(),
        "cuda": torch.cuda.get_device_name() if device.startswith("cuda") else None,
    }
    record = {
        "benchmark": "optimizers",
        "command": "python -m benchmarks.optimizers " + " ".join(sys.argv[1:]),
        "model": f"GPT2LMHeadModel({'tiny' if args.tiny else 'GPT2Config()'}), {n_params} parameters, random gradients",
        "device": device,
        "n_layer": n_layer,
        "ratio_uses": "cpu_s" if key else "wall_s",
        "machine": m,
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
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                       cwd=Path(__file__).parent).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def table(record: dict) -> str:
    uses = "CPU time" if record["ratio_uses"] == "cpu_s" else "wall-clock"
    rows = [
        f"| optimizer | wall s / step | CPU s / step | x torch AdamW foreach ({uses}) | state bytes / param | how |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for name, r in record["results"].items():
        how = r["method"]
        if name == "soap":
            init = r["init_step"]
            how += (
                f"; amortised: regular {r['regular_step']['cpu_s']:.1f} s CPU, refresh "
                f"{r['refresh_step']['cpu_s']:.1f} s CPU every {r['precondition_frequency']} steps; first step "
                + (f"(eigh, once) {init['cpu_s']:.0f} s CPU" if init else "(eigh, once) not timed")
            )
        if name == BASELINE:
            ext = r["extrapolated"]
            how += f"; rest + {record['n_layer']} x block: {ext['wall_s']:.3g} s wall, {ext['cpu_s']:.3g} s CPU"
        rows.append(
            f"| {name} | {r['wall_s']:.3g} | {r['cpu_s']:.3g} | {r['ratio']:.2f} | {r['state_bytes_per_param']:.1f} | {how} |"
        )
    m = record["machine"]
    rows.append("")
    rows.append(
        f"{record['model']}; {record['device']} ({m['cuda'] or m['processor']}), {m['cpu_count']} CPUs shared, "
        f"{m['torch_threads']} torch thread(s), load average {m['load_average_at_end'][0]:.1f} at the end; "
        f"torch {record['versions']['torch']}; medians of {record['rounds']} rounds "
        f"(SOAP/Muon: {record['matrix_rounds']} cycles of 3 steps). Command: `{record['command']}`"
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

    res = record["results"]
    names = list(res)
    field = record["ratio_uses"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 3.8))
    ax1.barh(names, [res[n][field] for n in names], color=["#888"] + ["#4c72b0"] * (len(names) - 1))
    ax1.set_xscale("log")
    ax1.set_xlabel(f"{'CPU' if field == 'cpu_s' else 'wall'} seconds per step (log; SOAP amortised)")
    ax1.invert_yaxis()
    for i, n in enumerate(names):
        ax1.text(res[n][field], i, f" {res[n]['ratio']:.2f}x", va="center", fontsize=8)
    ax2.barh(names, [res[n]["state_bytes_per_param"] for n in names], color="#55a868")
    ax2.set_xlabel("optimizer state bytes per parameter")
    ax2.invert_yaxis()
    threads = record["machine"]["torch_threads"]
    fig.suptitle(f"Optimizer step on GPT-2 small's 124M parameters, {device}, {threads} thread(s)")
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main(make_parser().parse_args())
