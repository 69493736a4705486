"""Worker for tests/test_muon_experts.py: Muon on 3-D expert tensors as FSDP2-style DTensors (2 CPU processes,
gloo), sharded on dim 0 (the experts) or dim 1, against the single-process step. Run through
`torch.multiprocessing.spawn(run, args=(world, port, out_dir))`; each rank writes out_dir/rank{r}.json."""

import json
import os
import sys
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def run(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    report = {}
    try:
        from torch import nn
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import Shard, distribute_tensor

        from hf_fasttrain.optim import MuonWithAdamW
        from hf_fasttrain.optim.experts import ExpertLayout

        mesh = init_device_mesh("cpu", (world,))
        gen = torch.Generator().manual_seed(0)
        w = torch.randn(5, 14, 9, generator=gen)  # 5 experts: uneven shards on dim 0 (3 + 2) and dim 1 (7 + 7)
        grads = [torch.randn(5, 14, 9, generator=gen) for _ in range(3)]
        layout = ExpertLayout(gate_up="concatenated")
        kw = dict(lr=0.05, weight_decay=0.1, ns_dtype="float32", cautious_wd=True)

        single = nn.Parameter(w.clone())
        opt = MuonWithAdamW([{"params": [single], "use_muon": True, **layout.group_keys()}], **kw)
        for g in grads:
            single.grad = g.clone()
            opt.step()

        for dim in (0, 1):
            for sharding in ("all_gather", "round_robin"):
                p = nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(dim)]))
                opt = MuonWithAdamW([{"params": [p], "use_muon": True, **layout.group_keys()}], ns_sharding=sharding,
                                    **kw)
                for g in grads:
                    p.grad = distribute_tensor(g.clone(), mesh, [Shard(dim)])
                    opt.step()
                full = p.detach().full_tensor()
                report[f"dim{dim}-{sharding}"] = {"diff": (full - single.detach()).abs().max().item(),
                                                  "moved": (full - w).abs().max().item(),
                                                  "local_rows": p.to_local().shape[dim]}
        p = nn.Parameter(distribute_tensor(w.clone(), mesh, [Shard(0)]))
        opt = MuonWithAdamW([{"params": [p], "use_muon": True, **layout.group_keys()}], normuon_beta2=0.95, **kw)
        p.grad = distribute_tensor(grads[0].clone(), mesh, [Shard(0)])
        try:
            opt.step()
            report["normuon_refusal"] = None
        except ValueError as exc:
            report["normuon_refusal"] = str(exc)
    except Exception:
        report["error"] = traceback.format_exc()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report))
        dist.destroy_process_group()
