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
    "training_config",
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


def write_run_record(output_dir: str | Path, config: Mapping[str, Any]) -> None:
    """Write ``config.yaml`` (the resolved config) and ``run_info.json`` into ``output_dir``."""
    out = Path(output_dir)
    atomic_write_text(out / "config.yaml", yaml.safe_dump(dict(config), sort_keys=False))
    atomic_write_text(out / "run_info.json", json.dumps(environment_info(), indent=2))


def _plain(v: Any) -> Any:
    if isinstance(v, (str, int, float, bool)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return str(v)


def training_config(args) -> dict[str, Any]:
    """``TrainingArguments.to_dict()`` as plain YAML-able values, masked secrets (``<HUB_TOKEN>``) dropped."""
    d = {k: _plain(v) for k, v in args.to_dict().items()}
    return {k: v for k, v in d.items() if not (k.endswith("_token") and v == f"<{k.upper()}>")}
