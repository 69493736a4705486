"""Which optimizer gives the single-process update under which way of spreading a model over processes.

Modes (`detect_sharding`):
- "single": one process.
- "ddp": data parallel (DDP, also several machines): every rank holds whole parameters.
- "fsdp2": FSDP2 (`torch.distributed.fsdp.fully_shard`): parameters are DTensors sharded on dim 0.
- "fsdp1": FSDP1 (`FullyShardedDataParallel`): the optimizer gets flattened parameters, or with
  `use_orig_params` 1-D slices of them.
- "deepspeed": DeepSpeed (ZeRO): the optimizer gets flattened partitions of fp32 master weights.

Support (checked by `tests/test_optim_sharded.py` for single/ddp/fsdp2 on 2 CPU processes):

| optimizer | single, ddp | fsdp2 | fsdp1, deepspeed |
|---|---|---|---|
| adamw, lion, ademamix | yes | yes (element-wise; equal to 1 process) | yes (element-wise), but not `cautious` |
| muon | yes | yes (each matrix gathered for Newton-Schulz) | refused |
| muon on mixture-of-experts tensors (3-D) | yes | yes (each tensor gathered whole, sharded on any dim, for its batched Newton-Schulz; also under `ns_sharding="round_robin"`) | refused |
| muon with `normuon_beta2` (NorMuon) | yes | refused (per-neuron norms span shards) | refused |
| muon with `cautious_wd` | yes | yes (element-wise) | refused |
| muon with `hyperball` | yes | refused (a vector's norm spans shards) | refused |
| soap | yes | refused (preconditioners per shard) | refused |

`cautious` rescales per tensor (numel / kept); on flattened partitions that count spans a partition,
not a tensor, so it is refused there. Element-wise optimizers under DeepSpeed are expected to match
(each element's update depends on that element only) but are not tested here (DeepSpeed is not a
dependency).
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

__all__ = [
    "SHARDING_MODES",
    "check_sharding_support",
    "detect_sharding",
    "muon_communication_bytes",
    "sharding_support",
]

SHARDING_MODES = ("single", "ddp", "fsdp2", "fsdp1", "deepspeed")

_ELEMENTWISE = ("adamw", "lion", "ademamix")
_INSTEAD = {
    "muon": "use DDP (recipes/accelerate/multi_gpu_ddp.yaml) or FSDP2 (recipes/accelerate/fsdp.yaml), "
    "or an element-wise optimizer (adamw, lion, ademamix)",
    "soap": "use DDP (recipes/accelerate/multi_gpu_ddp.yaml), or under sharding an element-wise optimizer "
    "(adamw, lion, ademamix) or muon with FSDP2",
    "cautious": "use DDP or FSDP2 (recipes/accelerate/fsdp.yaml), or cautious=False",
    "normuon": "use DDP (recipes/accelerate/multi_gpu_ddp.yaml), or under FSDP2 plain muon (normuon_beta2: null)",
    "hyperball": "use DDP (recipes/accelerate/multi_gpu_ddp.yaml), or under FSDP2 plain muon (hyperball: false)",
}
_MODE_TEXT = {
    "fsdp2": "FSDP2 (parameters sharded on dim 0; SOAP's preconditioners would be built per shard)",
    "fsdp1": "FSDP1 (the optimizer is handed flattened parameters)",
    "deepspeed": "DeepSpeed ZeRO (the optimizer is handed flattened partitions)",
}


def _truthy(value: Any) -> bool:
    return str(value).strip().lower() in ("1", "true", "yes")


def _fsdp_version_from(args: Any, accelerator: Any, environ: Mapping[str, str]) -> Optional[int]:
    plugin = getattr(getattr(accelerator, "state", None), "fsdp_plugin", None)
    if plugin is not None:
        return int(getattr(plugin, "fsdp_version", 1) or 1)
    fsdp = getattr(args, "fsdp", None)
    if fsdp:  # TrainingArguments: a non-empty list of FSDP options; transformers defaults to version 2
        config = getattr(args, "fsdp_config", None) or {}
        return int(config.get("version", config.get("fsdp_version", 2)))
    if _truthy(environ.get("ACCELERATE_USE_FSDP", "false")):  # accelerate launch with an FSDP config
        return int(environ.get("FSDP_VERSION", "1"))
    return None


def _model_mode(model: Any) -> Optional[str]:
    if model is None:
        return None
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:  # torch without distributed
        return None
    from ._common import is_dtensor

    if isinstance(model, FullyShardedDataParallel) or any(
        isinstance(m, FullyShardedDataParallel) for m in model.modules()
    ):
        return "fsdp1"
    for p in model.parameters():
        if getattr(p, "_is_flat_param", False) or type(p).__name__ == "FlatParameter":
            return "fsdp1"
        if is_dtensor(p):
            return "fsdp2"
    return None


def detect_sharding(
    args: Any = None, accelerator: Any = None, model: Any = None, environ: Optional[Mapping[str, str]] = None
) -> str:
    """The mode (one of `SHARDING_MODES`) a run is in, from whatever is at hand.

    An accelerator with a `state.distributed_type` decides (that is what runs: with `use_cpu`,
    accelerate 1.15 ignores FSDP and DeepSpeed configs and runs plain data parallel). Otherwise
    looks at, in order: DeepSpeed (`args.deepspeed`, `accelerator.state.deepspeed_plugin`, the
    `ACCELERATE_USE_DEEPSPEED` variable that `accelerate launch` and `TrainingArguments(deepspeed=...)`
    set); the model's parameters (FSDP1 flat parameters or wrapper, DTensors); FSDP from
    `accelerator.state.fsdp_plugin.fsdp_version`, `args.fsdp` / `args.fsdp_config["version"]` or
    `ACCELERATE_USE_FSDP` + `FSDP_VERSION`; then "ddp" when more than one process
    (`accelerator.num_processes`, `args.world_size` or `WORLD_SIZE`), else "single".

    Example:
        >>> from types import SimpleNamespace
        >>> from hf_fasttrain.optim import detect_sharding
        >>> detect_sharding(args=SimpleNamespace(deepspeed="ds_zero2.json"), environ={})
        'deepspeed'
        >>> detect_sharding(args=SimpleNamespace(fsdp=["full_shard"], fsdp_config={"version": 2}), environ={})
        'fsdp2'
        >>> detect_sharding(environ={"WORLD_SIZE": "2"})
        'ddp'
    """
    environ = os.environ if environ is None else environ
    state = getattr(accelerator, "state", None)
    kind = str(getattr(state, "distributed_type", "") or "").rsplit(".", 1)[-1].upper()
    if kind:
        # An accelerator's state is what actually happens: e.g. with use_cpu accelerate ignores an FSDP
        # or DeepSpeed config and runs plain data parallel (MULTI_CPU).
        if kind == "DEEPSPEED":
            return "deepspeed"
        if kind == "FSDP":
            version = int(getattr(getattr(state, "fsdp_plugin", None), "fsdp_version", 1) or 1)
            return "fsdp2" if version >= 2 else "fsdp1"
        from_model = _model_mode(model)
        if from_model is not None:
            return from_model
        return "ddp" if int(getattr(accelerator, "num_processes", 1) or 1) > 1 else "single"
    on_cpu = _truthy(environ.get("ACCELERATE_USE_CPU", "false"))  # accelerate then ignores FSDP/DeepSpeed
    if (
        getattr(args, "deepspeed", None)
        or getattr(state, "deepspeed_plugin", None) is not None
        or getattr(accelerator, "is_deepspeed_enabled", False) is True
        or (_truthy(environ.get("ACCELERATE_USE_DEEPSPEED", "false")) and not on_cpu)
    ):
        return "deepspeed"
    from_model = _model_mode(model)
    if from_model is not None:
        return from_model
    version = _fsdp_version_from(args, accelerator, {} if on_cpu else environ)
    if version is not None:
        return "fsdp2" if version >= 2 else "fsdp1"
    world = getattr(accelerator, "num_processes", None)
    if not isinstance(world, int):
        world = getattr(args, "world_size", None)
    if not isinstance(world, int):
        try:
            world = int(environ.get("WORLD_SIZE", "1"))
        except ValueError:
            world = 1
    return "ddp" if world > 1 else "single"


def sharding_support(name: str, mode: str, cautious: bool = False, normuon: bool = False,
                     hyperball: bool = False) -> Optional[str]:
    """None when optimizer `name` gives the single-process update under `mode`; else why not (one line).
    `normuon`: Muon with ``normuon_beta2`` set (NorMuon); `hyperball`: Muon with ``hyperball`` on."""
    if mode not in SHARDING_MODES:
        raise ValueError(f"sharding mode must be one of {list(SHARDING_MODES)}, got {mode!r}")
    if mode in ("single", "ddp"):
        return None
    if name == "muon" and normuon and mode == "fsdp2":
        return (f"optimizer_kwargs: normuon_beta2 (NorMuon) does not work under {_MODE_TEXT[mode]}: its "
                f"per-neuron normalisation and norms span shards; {_INSTEAD['normuon']}")
    if name == "muon" and hyperball and mode == "fsdp2":
        return (f"optimizer_kwargs: hyperball does not work under {_MODE_TEXT[mode]}: the norm of each weight "
                f"vector spans shards; {_INSTEAD['hyperball']}")
    if name == "muon" and mode == "fsdp2":
        return None
    if name in ("muon", "soap"):
        return f"optimizer: {name!r} does not work under {_MODE_TEXT[mode]}; {_INSTEAD[name]}"
    if cautious and mode in ("fsdp1", "deepspeed"):
        return (
            f"optimizer_kwargs: cautious=True with {name!r} does not work under {_MODE_TEXT[mode]}: its rescale "
            f"would count a flattened partition, not a tensor; {_INSTEAD['cautious']}"
        )
    return None


def check_sharding_support(name: str, mode: str, cautious: bool = False, normuon: bool = False,
                           hyperball: bool = False) -> None:
    """Raise ValueError (one line: optimizer, mode, what works instead) if `name` is wrong under `mode`.

    Example:
        >>> from hf_fasttrain.optim import check_sharding_support
        >>> check_sharding_support("muon", "fsdp2")  # supported: nothing happens
        >>> check_sharding_support("muon", "deepspeed")
        Traceback (most recent call last):
        ...
        ValueError: optimizer: 'muon' does not work under DeepSpeed ZeRO (the optimizer is handed flattened partitions); use DDP (recipes/accelerate/multi_gpu_ddp.yaml) or FSDP2 (recipes/accelerate/fsdp.yaml), or an element-wise optimizer (adamw, lion, ademamix)
    """
    reason = sharding_support(name, mode, cautious, normuon, hyperball)
    if reason is not None:
        raise ValueError(reason)


def muon_communication_bytes(elements: int, world_size: int, bytes_per_element: int = 4) -> dict[str, float]:
    """Bytes each rank receives per step for Muon's matrices (`elements` in all) under FSDP2.

    - "gather" (what `Muon` does): every matrix's update input is all-gathered to every rank, which
      orthogonalises all of them: (W - 1) / W of the elements per rank (ring all-gather).
    - "round_robin" (modded-nanogpt's / Moonlight-style alternative): each matrix is gathered to one
      owner rank, orthogonalised there, and the rows scattered back: per rank 2 (W - 1) / W^2 of the
      elements (the same at W = 2, W / 2 times less above; also 1/W of the Newton-Schulz work).

    Example:
        >>> from hf_fasttrain.optim import muon_communication_bytes
        >>> muon_communication_bytes(1000, 4)
        {'gather': 3000.0, 'round_robin': 1500.0}
    """
    w = world_size
    return {
        "gather": elements * bytes_per_element * (w - 1) / w,
        "round_robin": 2 * elements * bytes_per_element * (w - 1) / w**2,
    }
