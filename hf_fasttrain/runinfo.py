"""What every output directory records: the resolved config, versions, git revision, machine."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import yaml

from ._files import atomic_write_text  # noqa: F401  (also imported from here by callbacks.run_record)
from ._version import __version__

__all__ = [
    "git_revision",
    "environment_info",
    "write_run_record",
    "update_run_info",
    "training_config",
    "overridden_fields",
    "run_facts",
    "plain_value",
]


def git_revision(path: Optional[Path] = None) -> Optional[str]:
    """The git commit of the checkout holding ``path`` (default: this package), '+dirty' if modified."""
    path = Path(path) if path is not None else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        )
        return rev.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def environment_info() -> dict[str, Any]:
    """Package versions and the machine, for reproducibility and for benchmark tables."""
    import accelerate
    import torch
    import transformers


    info: dict[str, Any] = {
        "hf_fasttrain": __version__,
        "git_revision": git_revision(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "platform": platform.platform(),
        "processor": platform.machine(),
        "cpu_count": os.cpu_count(),
        "cuda_devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else [],
        "argv": sys.argv,
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    try:
        import datasets

        info["datasets"] = datasets.__version__
    except ImportError:
        pass
    return info


def run_facts(model, args, block_size: Optional[int] = None) -> dict[str, Any]:
    """What a run is, in numbers: parameters, processes (world size), global batch, tokens per step (with
    fixed-length rows of ``block_size`` tokens; None when unknown), max steps, device and precision."""
    n_params = sum(p.numel() for p in model.parameters()) if model is not None else None
    n_trainable = sum(p.numel() for p in model.parameters() if p.requires_grad) if model is not None else None
    world = max(int(getattr(args, "world_size", 1) or 1), 1)
    global_batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * world
    choice = getattr(args, "precision_choice", None)
    precision = choice.precision if choice is not None else (
        "bf16" if args.bf16 else "fp16" if args.fp16 else "fp32")
    device = str(args.device)
    if device.startswith("cuda"):
        import torch

        device = f"{device} ({torch.cuda.get_device_name(args.device)})"
    return {
        "parameters": n_params,
        "trainable_parameters": n_trainable,
        "world_size": world,
        "global_batch": global_batch,
        "tokens_per_step": global_batch * block_size if block_size else None,
        "max_steps": args.max_steps,
        "device": device,
        "precision": precision,
    }


def _config_header(config: Mapping[str, Any]) -> str:
    """YAML comments that say what the run actually used: optimizer, schedule, stopping rule."""
    opt = config.get("optimizer")
    optimizer = f"{opt} (hf_fasttrain.optim; replaces the Trainer's optim)" if opt else \
        f"{config.get('optim', 'adamw_torch_fused')} (the Trainer's optim)"
    decay = config.get("lr_decay")
    schedule = (f"{decay} after {config.get('warmup_steps', 0)} warmup steps (hf_fasttrain.schedules; replaces "
                f"lr_scheduler_type)" if decay else f"{config.get('lr_scheduler_type', 'linear')} (the Trainer's)")
    max_steps = config.get("max_steps", -1)
    stop = f"max_steps {max_steps}" if isinstance(max_steps, int) and max_steps > 0 else \
        f"num_train_epochs {config.get('num_train_epochs')}"
    return (f"# The resolved config of this run; load it with --config. Effective optimizer: {optimizer}.\n"
            f"# Schedule: {schedule}. Stops at: {stop}. Trainer fields that these replace are left out.\n")


def write_run_record(output_dir: str | Path, config: Mapping[str, Any],
                     run: Optional[Mapping[str, Any]] = None) -> None:
    """Write ``config.yaml`` (the resolved config, headed by what the run actually used) and
    ``run_info.json`` (versions, machine, and ``run``: e.g. :func:`run_facts`) into ``output_dir``."""
    out = Path(output_dir)
    atomic_write_text(out / "config.yaml", _config_header(config) + yaml.safe_dump(dict(config), sort_keys=False))
    info = environment_info()
    if run:
        info.update(dict(run))
    atomic_write_text(out / "run_info.json", json.dumps(info, indent=2))


def update_run_info(output_dir: str | Path, facts: Mapping[str, Any]) -> None:
    """Add ``facts`` (known only after training, e.g. ``compiled_graphs``) to ``output_dir/run_info.json``."""
    path = Path(output_dir) / "run_info.json"
    info = json.loads(path.read_text()) if path.exists() else {}
    info.update(dict(facts))
    atomic_write_text(path, json.dumps(info, indent=2))


def plain_value(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [plain_value(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain_value(x) for k, x in v.items()}
    return str(v)


def overridden_fields(args) -> tuple[str, ...]:
    """Trainer fields that hf_fasttrain's options replace in this run (so they say nothing about it):
    ``optim``/``optim_args`` under ``optimizer``, ``lr_scheduler_type``/``lr_scheduler_kwargs`` under
    ``lr_decay``, ``num_train_epochs`` when ``max_steps`` is set. They must be at their defaults then, so
    leaving them out of a saved recipe changes nothing when it is loaded again."""
    out: list[str] = []
    if getattr(args, "optimizer", None):
        out += ["optim", "optim_args"]
    if getattr(args, "lr_decay", None):
        out += ["lr_scheduler_type", "lr_scheduler_kwargs"]
    if isinstance(getattr(args, "max_steps", -1), int) and args.max_steps > 0:
        out.append("num_train_epochs")
    return tuple(out)


def training_config(args) -> dict[str, Any]:
    """``TrainingArguments.to_dict()`` as plain YAML-able values, without masked secrets (``<HUB_TOKEN>``)
    and without the Trainer fields that the package's options replace (:func:`overridden_fields`)."""
    d = {k: plain_value(v) for k, v in args.to_dict().items()}
    drop = set(overridden_fields(args))
    return {k: v for k, v in d.items()
            if k not in drop and not (k.endswith("_token") and v == f"<{k.upper()}>")}
