"""Worker for tests/test_optim_sharded.py: every optimizer under FSDP2 (2 CPU processes, gloo)
against the single-process run, and a sharded checkpoint round trip. Run through
`torch.multiprocessing.spawn(run, args=(world, port, out_dir, names))`; each rank writes a JSON
report to out_dir/rank{r}.json (max |diff| per optimizer and step count, resume exactness)."""

import gc
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

KW = {
    "adamw": {"lr": 1e-2, "weight_decay": 0.1},
    "adamw-cautious": {"lr": 1e-2, "weight_decay": 0.1, "cautious": True},
    "lion": {"lr": 1e-3, "weight_decay": 1.0},
    "lion-cautious": {"lr": 1e-3, "weight_decay": 1.0, "cautious": True},
    "ademamix": {"lr": 1e-2, "weight_decay": 0.1, "T_alpha_beta3": 4},
    "ademamix-cautious": {"lr": 1e-2, "weight_decay": 0.1, "T_alpha_beta3": 4, "cautious": True},
    "muon": {"lr": 2e-2, "weight_decay": 0.1},
    "muon-roundrobin": {"lr": 2e-2, "weight_decay": 0.1, "ns_sharding": "round_robin"},
    "muon-polar-cautious": {"lr": 2e-2, "weight_decay": 0.1, "ns_coefficients": "polar_express", "cautious": True},
    # the long-run row's Muon: cautious weight decay, the AdamW part at a quarter of Muon's lr
    "muon-cautious-wd": {"lr": 2e-2, "weight_decay": 0.5, "cautious_wd": True, "adamw_lr_ratio": 0.25},
}


def _model():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    # Split on dim 0 over 2 ranks: n_embd 45 and vocab 61 are odd, so the Muon matrices (45 x 135,
    # 45 x 45, 45 x 180, 180 x 45) and the embeddings get uneven shards (23 + 22 rows, ...).
    cfg = GPT2Config(vocab_size=61, n_positions=16, n_embd=45, n_layer=2, n_head=3, resid_pdrop=0.0,
                     embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def _batches(n):
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, 61, (4, 16), generator=gen) for _ in range(n)]


def _shard(model):
    from torch.distributed.fsdp import fully_shard

    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    return model


def _step(model, opt, batch):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


def _full_params(model):
    from hf_fasttrain.optim._common import is_dtensor

    return {n: (p.full_tensor() if is_dtensor(p) else p).detach().clone() for n, p in model.named_parameters()}


def _max_diff(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def _name(key):
    return key.split("-")[0]


def run(rank, world, port, out_dir, keys):
    _run(rank, world, port, out_dir, keys)
    # the sharded models, garbage now, hold the process group and its gloo threads: free them before the
    # interpreter's teardown, where a gloo thread that frees tensors can abort the process
    gc.collect()


def _run(rank, world, port, out_dir, keys):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    report = {}
    try:
        from torch.distributed.checkpoint.state_dict import (
            get_model_state_dict,
            get_optimizer_state_dict,
            set_model_state_dict,
            set_optimizer_state_dict,
        )
        import torch.distributed.checkpoint as dcp

        from hf_fasttrain.optim import create_optimizer

        batches = _batches(8)
        for key in [k for k in keys if k != "controls"]:
            name, kw = _name(key), KW[key]
            # single process: the same model, the same batches (every rank computes it)
            ref = _model()
            ref_opt = create_optimizer(name, ref, **kw)
            ref_after = {}
            for i, batch in enumerate(batches[:5], start=1):
                _step(ref, ref_opt, batch)
                if i in (1, 5):
                    ref_after[i] = _full_params(ref)

            model = _shard(_model())
            opt = create_optimizer(name, model, **kw)
            diffs = {}
            for i, batch in enumerate(batches[:5], start=1):
                _step(model, opt, batch)
                if i in (1, 5):
                    diffs[i] = _max_diff(_full_params(model), ref_after[i])
            # the steps moved the params (a control that the comparison is not vacuous)
            moved = _max_diff(ref_after[5], _full_params(_model()))
            report[key] = {"diff_1": diffs[1], "diff_5": diffs[5], "moved": moved}

            if key in ("muon", "ademamix", "lion", "adamw", "muon-roundrobin"):
                # sharded checkpoint after 5 steps, 3 more straight, then resume from it in a fresh pair
                ckpt = os.path.join(out_dir, f"ckpt-{key}")
                dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, opt)},
                         checkpoint_id=ckpt)
                for batch in batches[5:8]:
                    _step(model, opt, batch)
                straight = _full_params(model)

                resumed = _shard(_model())
                ropt = create_optimizer(name, resumed, **kw)
                state = {"model": get_model_state_dict(resumed), "optim": get_optimizer_state_dict(resumed, ropt)}
                dcp.load(state, checkpoint_id=ckpt)
                set_model_state_dict(resumed, state["model"])
                set_optimizer_state_dict(resumed, ropt, state["optim"])
                for batch in batches[5:8]:
                    _step(resumed, ropt, batch)
                report[key]["resume_diff"] = _max_diff(_full_params(resumed), straight)
                report[key]["resume_moved"] = _max_diff(straight, ref_after[5])
        if "controls" in keys:
            # SOAP is refused on a sharded model, naming the mode
            try:
                create_optimizer("soap", _shard(_model()))
                report["soap_refusal"] = None
            except ValueError as err:
                report["soap_refusal"] = str(err)
            # negative control: torch.optim.Muon orthogonalises each shard: not the single-process update
            ref, model = _model(), _shard(_model())
            groups = [g for g in create_optimizer("muon", ref, lr=2e-2).param_groups if g["use_muon"]]
            names = [n for g in groups for n in g["param_names"]]
            named_ref, named = dict(ref.named_parameters()), dict(model.named_parameters())
            ref_opt = torch.optim.Muon([named_ref[n] for n in names], lr=2e-2, adjust_lr_fn="match_rms_adamw")
            opt = torch.optim.Muon([named[n] for n in names], lr=2e-2, adjust_lr_fn="match_rms_adamw")
            _step(ref, ref_opt, batches[0])
            _step(model, opt, batches[0])
            full = _full_params(model)
            # communication of one Muon step (the AdamW part has none): collectives and bytes received
            from torch.distributed.tensor.debug import CommDebugMode

            model = _shard(_model())
            opt = create_optimizer("muon", model, lr=2e-2)
            loss = model(input_ids=batches[0], labels=batches[0]).loss
            loss.backward()
            with CommDebugMode() as comm:
                opt.step()
            muon = [p for g in opt.param_groups if g["use_muon"] for p in g["params"]]
            report["muon_step_comm"] = {
                "counts": {str(k): v for k, v in comm.get_comm_counts().items()},
                "matrices": len(muon),
                "elements": sum(p.numel() for p in muon),
            }
            report["torch_muon_per_shard_diff"] = max(
                float((full[n] - named_ref[n].detach()).abs().max()) for n in names
            )
    except Exception:  # noqa: BLE001 - reported to the test, which fails with the traceback
        report["error"] = traceback.format_exc()
    finally:
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(report, indent=1))
        dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = sys.argv[1]
    keys = sys.argv[2:] or list(KW)
    mp.spawn(run, args=(2, port, out, keys), nprocs=2)
    print(Path(out, "rank0.json").read_text())
