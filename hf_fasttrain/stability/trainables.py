"""What trains: the parameters that require grad, and whether the Trainer saves the model or an adapter.

With peft (LoRA, QLoRA) most of a model is frozen. Every part that copies, averages, snapshots or budgets
disk for the model asks this module, so a frozen base is neither copied nor counted: a weight average or
a guard snapshot of a LoRA model holds the adapter's tensors only, and the free-space check before a
checkpoint counts what the Trainer writes (``adapter_model.safetensors`` for a peft model).

Example:
    ```python
    >>> import torch
    >>> m = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    >>> _ = m[0].requires_grad_(False)
    >>> list(trainable_parameters(m))
    ['1.weight', '1.bias']
    >>> trainable_bytes(m)
    40
    ```
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["trainable_parameters", "trainable_bytes", "saves_adapter_only", "ADAPTER_WEIGHT_FILES"]

# what peft's save_pretrained writes (safetensors by default, the .bin with safe_serialization=False)
ADAPTER_WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")


def trainable_parameters(model: torch.nn.Module) -> dict[str, torch.nn.Parameter]:
    """name -> parameter, for the parameters that require grad (tied ones once, as ``named_parameters``)."""
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def trainable_bytes(model: torch.nn.Module) -> int:
    """Bytes held by the trainable parameters."""
    return sum(p.numel() * p.element_size() for p in trainable_parameters(model).values())


def saves_adapter_only(model: Any) -> bool:
    """Whether the Trainer's save writes only adapters for ``model``: a ``PeftModel``, or a transformers
    model with peft adapters attached (``load_adapter`` / ``add_adapter``)."""
    model = getattr(model, "module", model)  # DDP
    if getattr(model, "peft_config", None) and hasattr(model, "get_base_model"):
        return True  # peft.PeftModel
    return bool(getattr(model, "_hf_peft_config_loaded", False))
