"""Muon's optimizer step, Newton-Schulz matrix by matrix vs batched by shape, side by side in one process.

    python -m benchmarks.muon_step                       # GPT-2 2x128 and 4x256 shapes, on this machine's device
    python -m benchmarks.muon_step --models 2x128 --repeats 3

For each model it builds the Muon + AdamW hybrid (``create_optimizer("muon", ...)``) twice, ``ns_batched=False``
and ``ns_batched=True``, gives both the same random gradients and times ``optimizer.step()`` alternately (the
two arms interleaved, so machine load hits both alike), after one warm-up step each. It also counts the aten
operators one step dispatches (matmuls, and all of them): on a GPU each is a kernel launch. Then it compares
the two models' weights: equal bit for bit on CPU; on a GPU batched and single matmuls may round differently,
so the largest difference is reported too. Writes ``results/muon_step_<device>.json`` and ``.md``.
"""

from __future__ import annotations

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


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["2x128", "4x256"], help="GPT-2 <layers>x<width>")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default=None, help="result name (default muon_step_<device>)")
    args = parser.parse_args(argv)
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
