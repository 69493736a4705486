"""Memory and time of the LM head + cross-entropy: standard (full logits) vs chunked, on CPU.

    python -m benchmarks.lm_head_loss_memory                 # GPT-2 head: d 768, vocab 50,257, 2 x 1024 tokens
    python -m benchmarks.lm_head_loss_memory --tokens 512    # quicker
    python -m benchmarks.lm_head_loss_memory --quick --out /tmp/x   # a smoke run: a tiny head, one repeat (seconds)

Only the head and the loss are run (hidden states in, loss out, backward to hidden states and
weight), the part whose memory grows with tokens x vocabulary. Each variant runs in its own
process; memory is (a) the bytes autograd keeps for backward (exact, from saved-tensor hooks) and
(b) the process's peak RSS during one forward + backward minus the peak before it. Time is the
median over repeats of one forward + backward. Variants: standard / chunked, each in fp32 and
under bf16 autocast. Writes JSON + PNG + a markdown table into benchmarks/results/.
"""

from __future__ import annotations

if not __package__:  # run as a file: the imported hf_fasttrain might not be this checkout's
    import sys
    print("Run it from the checkout root as a module: python -m benchmarks.lm_head_loss_memory [options]", file=sys.stderr)
    raise SystemExit(2)

import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

from benchmarks._harness import RESULTS, display_command, module_command, subprocess_env

__all__ = ["VARIANTS", "main"]

VARIANTS = ["standard-fp32", "chunked-fp32", "standard-bf16", "chunked-bf16"]
# the smoke run: the same variants and measurements on a head small enough to take seconds
QUICK = {"tokens": 256, "d_model": 64, "vocab": 4096, "chunk_size": 64, "repeats": 1}


def _peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux


def run_variant(name: str, opts) -> dict:
    import torch

    from benchmarks._harness.chunked_ce import chunked_lm_head_loss, lm_head_loss

    torch.manual_seed(0)
    torch.set_num_threads(opts.threads)
    n_tok, d, vocab = opts.tokens, opts.d_model, opts.vocab
    hidden = torch.randn(1, n_tok, d, requires_grad=True)
    weight = (torch.randn(vocab, d) * 0.02).requires_grad_()
    labels = torch.randint(0, vocab, (1, n_tok))
    chunked = name.startswith("chunked")
    bf16 = name.endswith("bf16")

    def step():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            if chunked:
                loss = chunked_lm_head_loss(hidden, weight, labels, chunk_size=opts.chunk_size)
            else:
                loss = lm_head_loss(hidden, weight, labels)
        loss.backward()
        return loss

    # warm up kernels and thread pools on a few tokens, so their one-time allocations are not counted
    # (on small tensors of their own: nothing of the size being measured is allocated before the baseline)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        small_h = torch.randn(1, 64, d, requires_grad=True)
        small_w = torch.randn(512, d, requires_grad=True)
        small_y = torch.randint(0, 512, (1, 64))
        lm_head_loss(small_h, small_w, small_y).backward()
        chunked_lm_head_loss(small_h, small_w, small_y, chunk_size=16).backward()
    del small_h, small_w, small_y
    baseline = _peak_rss_bytes()  # inputs allocated, no full-size loss computed yet
    times = []
    for i in range(opts.repeats):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
        if i == 0:
            peak_after_first = _peak_rss_bytes()
            grads = (hidden.grad.clone(), weight.grad.clone())
        hidden.grad = weight.grad = None
    del loss

    saved = []  # after the timed steps, so this pass does not raise the RSS baseline
    with torch.autograd.graph.saved_tensors_hooks(lambda t: (saved.append(t.numel() * t.element_size()), t)[1],
                                                  lambda t: t):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = chunked_lm_head_loss(hidden, weight, labels, chunk_size=opts.chunk_size) if chunked else \
                lm_head_loss(hidden, weight, labels)
    return {
        "variant": name,
        "loss": float(loss),
        "saved_for_backward_bytes": sum(saved),
        "peak_rss_increase_bytes": peak_after_first - baseline,
        "step_time_median_s": statistics.median(times),
        "step_times_s": times,
        "grad_norms": [float(g.norm()) for g in grads],
    }


def make_parser():
    p = argparse.ArgumentParser(allow_abbrev=False, description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true",
                   help="a smoke run: " + ", ".join(f"{k} {v}" for k, v in QUICK.items()) + "; writes <name>_quick.*")
    p.add_argument("--tokens", type=int, default=2048, help="tokens in the batch (default 2 x 1024)")
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--chunk-size", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", "--out-dir", dest="out_dir", default=str(RESULTS), help="folder for <name>.{json,md,png}")
    p.add_argument("--name", default="lm_head_loss_memory_cpu")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    opts = make_parser().parse_args(argv)
    if opts.quick:
        vars(opts).update(QUICK)
        opts.name += "_quick"
    if opts.worker:
        print(json.dumps(run_variant(opts.worker, opts)))
        return None
    common = ["--tokens", str(opts.tokens), "--d-model", str(opts.d_model), "--vocab", str(opts.vocab),
              "--chunk-size", str(opts.chunk_size), "--repeats", str(opts.repeats), "--threads", str(opts.threads)]
    rows = {}
    for name in VARIANTS:
        print(f"{name} ...", file=sys.stderr, flush=True)
        proc = subprocess.run(module_command("lm_head_loss_memory", "--worker", name, *common),
                              capture_output=True, text=True, check=True, env=subprocess_env())
        rows[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    import torch

    results = {
        "benchmark": "lm_head_loss_memory",
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": display_command("python -m benchmarks.lm_head_loss_memory", argv if argv is not None else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "cpu_count": os.cpu_count(), "processor": platform.processor(),
                    "torch": torch.__version__, "threads": opts.threads},
        "config": {"tokens": opts.tokens, "d_model": opts.d_model, "vocab": opts.vocab, "chunk_size": opts.chunk_size,
                   "repeats": opts.repeats,
                   "fp32_logits_bytes": opts.tokens * opts.vocab * 4},
        "variants": rows,
    }
    mib = 2**20
    lines = ["| variant | loss | kept for backward | peak RSS increase | fwd+bwd time (median) |",
             "|---|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['loss']:.4f} | {r['saved_for_backward_bytes'] / mib:,.1f} MiB | "
                     f"{r['peak_rss_increase_bytes'] / mib:,.0f} MiB | {1000 * r['step_time_median_s']:,.0f} ms |")
    table = "\n".join(lines)
    os.makedirs(opts.out_dir, exist_ok=True)
    stem = os.path.join(opts.out_dir, opts.name)
    with open(stem + ".json", "w") as f:
        json.dump(results, f, indent=2)
    header = (f"{opts.tokens} tokens x d {opts.d_model} x vocab {opts.vocab} (fp32 logits alone: "
              f"{opts.tokens * opts.vocab * 4 / mib:,.0f} MiB), chunk {opts.chunk_size}, {opts.threads} threads, "
              f"{platform.processor() or platform.machine()}, torch {torch.__version__}")
    with open(stem + ".md", "w") as f:
        f.write(f"`{results['command']}`\n\n{header}\n\n{table}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.5))
        names = list(rows)
        a1.barh(names, [rows[n]["peak_rss_increase_bytes"] / mib for n in names], color="tab:orange")
        a1.set_xlabel("peak RSS increase in fwd+bwd, MiB")
        a1.invert_yaxis()
        a2.barh(names, [1000 * rows[n]["step_time_median_s"] for n in names], color="tab:blue")
        a2.set_xlabel("fwd+bwd time, ms (median)")
        a2.invert_yaxis()
        fig.suptitle(header, fontsize=8)
        fig.tight_layout()
        fig.savefig(stem + ".png", dpi=120)
        plt.close(fig)
    except ImportError:
        pass
    print(header + "\n\n" + table)
    return results


if __name__ == "__main__":
    main()
