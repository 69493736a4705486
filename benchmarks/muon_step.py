"""Muon's optimizer step, Newton-Schulz matrix by matrix vs batched by shape, side by side in one process.

    python -m benchmarks.muon_step                       # GPT-2 2x128 and 4x256 shapes, on this machine's device
    python -m benchmarks.muon_step --models 2x128 --repeats 3
    python -m benchmarks.muon_step --compare precision   # the whole training step: AdamW, Muon bf16, Muon fp32

For each model it builds the Muon + AdamW hybrid (``create_optimizer("muon", ...)``) twice, ``ns_batched=False``
and ``ns_batched=True``, gives both the same random gradients and times ``optimizer.step()`` alternately (the
two arms interleaved, so machine load hits both alike), after one warm-up step each. It also counts the aten
operators one step dispatches (matmuls, and all of them): on a GPU each is a kernel launch. Then it compares
the two models' weights: equal bit for bit on CPU; on a GPU batched and single matmuls may round differently,
so the largest difference is reported too. Writes ``results/muon_step_<device>.json`` and ``.md``.

``--compare precision`` times what a training step costs with each optimizer on one model: a forward and
backward pass on a batch of 16 x 128 tokens (the budget ladder's), then the step of AdamW (the Trainer's
``adamw_torch``), of Muon with Newton-Schulz in bf16 (the default) and in fp32 (``ns_dtype``), each arm's
passes and steps interleaved with the others'. On a CPU without native bf16 matmuls the bf16 iteration is
emulated; the table says whether this one has them. Writes ``results/muon_precision_<device>.json`` and ``.md``.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.muon_step [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import os
import statistics
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from benchmarks._harness import RESULTS, machine_info, markdown_table, write_json

MATMULS = {"mm", "addmm", "bmm", "baddbmm", "matmul"}


class _OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.matmuls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        self.ops += 1
        self.matmuls += name in MATMULS
        return func(*args, **(kwargs or {}))


def _model(spec: str, device: str):
    from transformers import GPT2Config, GPT2LMHeadModel

    n_layer, width = (int(x) for x in spec.split("x"))
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=n_layer, n_embd=width, n_head=max(width // 64, 2), vocab_size=1024, n_positions=128)
    return GPT2LMHeadModel(cfg).to(device)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(spec: str, device: str, repeats: int) -> list[dict]:
    from hf_fasttrain.optim import create_optimizer

    arms = {}
    for batched in (False, True):
        model = _model(spec, device)
        g = torch.Generator(device="cpu").manual_seed(1)
        for p in model.parameters():
            p.grad = torch.randn(p.shape, generator=g).to(device) * 1e-2
        opt = create_optimizer("muon", model, lr=1e-3, ns_batched=batched)
        opt.step()  # warm-up: state allocation
        counter = _OpCounter()
        with counter:
            opt.step()
        muon = opt.inner_optimizers[0]
        n_mat = sum(len(gr["params"]) for gr in muon.param_groups)
        shapes = len({tuple(p.shape) for gr in muon.param_groups for p in gr["params"]})
        arms[batched] = dict(model=model, opt=opt, ops=counter.ops, matmuls=counter.matmuls, matrices=n_mat,
                             shapes=shapes, times=[])
    for _ in range(repeats):
        for batched in (False, True):
            arm = arms[batched]
            _sync(device)
            t0 = time.perf_counter()
            arm["opt"].step()
            _sync(device)
            arm["times"].append(time.perf_counter() - t0)
    pairs = list(zip(arms[False]["model"].parameters(), arms[True]["model"].parameters()))
    same = all(torch.equal(a, b) for a, b in pairs)
    max_diff = max(float((a.detach().float() - b.detach().float()).abs().max()) for a, b in pairs)
    rows = []
    for batched in (False, True):
        arm = arms[batched]
        rows.append({
            "model": f"gpt2-{spec}", "ns": "batched" if batched else "per-matrix", "muon_matrices": arm["matrices"],
            "shapes": arm["shapes"], "aten_ops_per_step": arm["ops"], "matmuls_per_step": arm["matmuls"],
            "step_ms_median": 1e3 * statistics.median(arm["times"]), "step_ms_min": 1e3 * min(arm["times"]),
            "repeats": repeats, "weights_equal_after": same, "weights_max_abs_diff": max_diff,
        })
    return rows


PRECISION_ARMS = ("adamw", "muon-bf16", "muon-fp32")


def _ladder_model(spec: str, device: str):
    """The budget ladder's GPT-2 (vocab 4096, block 128, head size 32) at ``<layers>x<width>``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    n_layer, width = (int(x) for x in spec.split("x"))
    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=n_layer, n_embd=width, n_head=width // 32, vocab_size=4096, n_positions=128,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(cfg).to(device)


def measure_precision(spec: str, device: str, repeats: int) -> list[dict]:
    """Forward + backward and each optimizer's step, interleaved arm by arm, ``repeats`` times after a warm-up."""
    from hf_fasttrain.optim import create_optimizer
    from hf_fasttrain.optim.orthogonalize import native_bf16_matmul

    batch = torch.randint(0, 4096, (16, 128), generator=torch.Generator().manual_seed(0)).to(device)
    arms = {}
    for name in PRECISION_ARMS:
        model = _ladder_model(spec, device)
        opt = (torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.1) if name == "adamw" else
               create_optimizer("muon", model, lr=1e-3, ns_dtype="bfloat16" if name == "muon-bf16" else "float32"))
        arms[name] = dict(model=model, opt=opt, fwd_bwd=[], step=[])
    for i in range(repeats + 1):
        for name in PRECISION_ARMS:
            arm = arms[name]
            _sync(device)
            t0 = time.perf_counter()
            arm["model"](input_ids=batch, labels=batch).loss.backward()
            _sync(device)
            t1 = time.perf_counter()
            arm["opt"].step()
            arm["opt"].zero_grad()
            _sync(device)
            t2 = time.perf_counter()
            if i:  # the first round allocates the state
                arm["fwd_bwd"].append(t1 - t0)
                arm["step"].append(t2 - t1)
    rows = []
    base = statistics.median(a + b for a, b in zip(arms["adamw"]["fwd_bwd"], arms["adamw"]["step"]))
    for name in PRECISION_ARMS:
        arm = arms[name]
        total = statistics.median(a + b for a, b in zip(arm["fwd_bwd"], arm["step"]))
        rows.append({"model": f"gpt2-{spec}", "optimizer": name, "native_bf16_matmul": native_bf16_matmul(device),
                     "fwd_bwd_ms_median": 1e3 * statistics.median(arm["fwd_bwd"]),
                     "optimizer_step_ms_median": 1e3 * statistics.median(arm["step"]),
                     "train_step_ms_median": 1e3 * total, "train_step_vs_adamw": total / base, "repeats": repeats})
    return rows


def main_precision(args) -> dict:
    rows = [r for spec in args.models for r in measure_precision(spec, args.device, args.repeats)]
    headers = ["model", "optimizer", "native_bf16_matmul", "fwd_bwd_ms_median", "optimizer_step_ms_median",
               "train_step_ms_median", "train_step_vs_adamw"]
    table = markdown_table(headers, [[r[h] for h in headers] for r in rows])
    print(table)
    name = args.out or f"muon_precision_{args.device.split(':')[0]}"
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result = {"rows": rows, "machine": machine_info(), "device": args.device, "threads": torch.get_num_threads(),
              "load_average_at_end": load, "command": "python -m benchmarks.muon_step " + " ".join(args.argv)}
    note = (f"A training step (forward + backward on 16 x 128 tokens, then the optimizer step) with AdamW, Muon with "
            f"Newton-Schulz in bf16 (the default) and in fp32 (`ns_dtype` float32), the three arms interleaved, "
            f"{args.repeats} rounds after a warm-up, medians; device {args.device}, {torch.get_num_threads()} "
            f"thread(s), load average {load:.1f} at the end (one thread here; the other core may have been busy: "
            f"the arms share whatever load there was, so read the ratios). `native_bf16_matmul`: whether this "
            f"device multiplies bf16 in hardware (`ns_dtype: auto` picks bf16 only then).\n\n"
            f"`{result['command']}`\n\n")
    write_json(RESULTS / f"{name}.json", result)
    (RESULTS / f"{name}.md").write_text(note + table + "\n")
    _plot_precision(rows, RESULTS / f"{name}.png")
    return result


def _plot_precision(rows: list[dict], path) -> None:
    """Stacked bars per model: forward + backward, then the optimizer step, for each optimizer."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    # one model per row: legible at a page's width
    fig, axes = plt.subplots(len(models), 1, figsize=(6, 3.6 * len(models)), squeeze=False)
    for ax, model in zip(axes[:, 0], models):
        mine = [r for r in rows if r["model"] == model]
        names = [r["optimizer"] for r in mine]
        fb = [r["fwd_bwd_ms_median"] for r in mine]
        st = [r["optimizer_step_ms_median"] for r in mine]
        ax.bar(names, fb, label="forward + backward")
        ax.bar(names, st, bottom=fb, label="optimizer step")
        for i, r in enumerate(mine):
            ax.text(i, fb[i] + st[i], f"{r['train_step_vs_adamw']:.2f}x", ha="center", va="bottom", fontsize=9)
        ax.set_title(f"{model} (native bf16: {mine[0]['native_bf16_matmul']})", fontsize=10)
        ax.set_ylabel("ms per training step (median)")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=None,
                        help="GPT-2 <layers>x<width> (default 2x128 4x256; with --compare precision 2x128 3x192)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compare", choices=("batching", "precision"), default="batching",
                        help="batching: Newton-Schulz per matrix vs batched; precision: AdamW vs Muon bf16 vs fp32")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--out", default=None, help="result name (default muon_step_<device> / muon_precision_<device>)")
    args = parser.parse_args(argv)
    args.argv = list(argv if argv is not None else __import__("sys").argv[1:])
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare == "precision":
        args.models = args.models or ["2x128", "3x192"]
        return main_precision(args)
    args.models = args.models or ["2x128", "4x256"]
    rows = [r for spec in args.models for r in measure(spec, args.device, args.repeats)]
    headers = ["model", "ns", "muon_matrices", "shapes", "aten_ops_per_step", "matmuls_per_step",
               "step_ms_median", "step_ms_min", "weights_equal_after", "weights_max_abs_diff"]
    table = markdown_table(headers, [[r[h] for h in headers] for r in rows])
    print(table)
    name = args.out or f"muon_step_{args.device.split(':')[0]}"
    result = {"rows": rows, "machine": machine_info(), "device": args.device, "threads": torch.get_num_threads()}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    result["load_average_at_end"] = load
    note = (f"Muon optimizer step (Muon + AdamW hybrid), Newton-Schulz per matrix vs batched by shape, "
            f"{args.repeats} interleaved steps each after a warm-up, device {args.device}, "
            f"{torch.get_num_threads()} threads, load average {load:.1f} at the end.\n\n"
            f"`python -m benchmarks.muon_step`\n\n")
    write_json(RESULTS / f"{name}.json", result)
    (RESULTS / f"{name}.md").write_text(note + table + "\n")
    return result


if __name__ == "__main__":
    main()
