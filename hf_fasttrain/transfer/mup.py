"""Hyperparameter transfer across width: muP applied to a model from the outside, without editing its code.

muP (Yang et al. 2022, "Tensor Programs V", arXiv:2203.03466) makes the best learning rate of a small proxy the
best one of a wider model of the same shape. With m = width / base width it changes three things:

1. the optimizer: hidden matrices at lr / m (weight decay x m, Adam's eps / m), embeddings, head, norms and biases
   unchanged; Muon's matrices on the spectral scale sqrt(fan_out / fan_in) instead (Yang, Simon & Bernstein 2023,
   arXiv:2310.17813). That is the optimizer side, `parameterization="mup"` of every optimizer
   (`hf_fasttrain.optim.groups`, `hf_fasttrain.optim.registry`).
2. the output: the logits multiplied by 1/m, so the head's contribution does not grow with the width of its input.
   :func:`apply_mup` installs it as a forward hook on the model's output head (tied or not).
3. the initialisation: hidden matrices drawn with std sigma / sqrt(m) (:func:`mup_init_`), sigma the model's own.

Depth (:func:`apply_depth_scaling`): CompleteP (Dey et al. 2025, arXiv:2505.01618, alpha = 1) multiplies each
residual branch (attention and MLP outputs) by (L / L_base)^-1, so a deeper model keeps the base depth's lr.

FastTrainer does 2 (and 3 where it builds the model) when `optimizer_kwargs` sets ``parameterization: mup``; with a
plain `transformers.Trainer`, call :func:`apply_mup` (and :func:`mup_init_` on a fresh model) before training.
The multipliers are hooks, not weights: the model's config records them, and :func:`restore_mup` puts them back on
a model loaded with `from_pretrained` (``hf-fasttrain generate`` does).

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(n_embd=128, n_head=4, n_layer=2, vocab_size=64, n_positions=16))
    >>> apply_mup(model, base_width=64)
    2.0
    >>> from hf_fasttrain.optim import create_optimizer
    >>> opt = create_optimizer("adamw", model, lr=1e-3, parameterization="mup", base_width=64)
    >>> sorted({(g["lr_group"], g["lr"]) for g in opt.param_groups})
    [('bias', 0.001), ('embedding', 0.001), ('matrix', 0.0005), ('norm', 0.001)]
"""

from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

from ..validation import ConfigError
from ..optim.groups import (OUTPUT_MULTIPLIER_ATTR, check_parameterization, model_depth, model_width, param_roles,
                           width_multiplier)

__all__ = ["apply_mup", "restore_mup", "mup_init_", "remove_mup", "apply_depth_scaling", "apply_transfer", "transfer_options",
           "check_config_mup", "check_head_dim", "model_head_dim"]

_HOOK_ATTR = "_hf_fasttrain_mup_hook"
# the attribute of the model's config that records apply_mup's settings: saved in config.json with the weights, so
# a model loaded for evaluation or sampling gets its multipliers back (restore_mup)
CONFIG_ATTR = "hf_fasttrain_mup"


def _output_head(model: nn.Module) -> nn.Module:
    getter = getattr(model, "get_output_embeddings", None)
    head = None
    if callable(getter):
        try:
            head = getter()
        except NotImplementedError:
            head = None
    if not isinstance(head, nn.Module):
        raise ConfigError("parameterization", "mup", "a model with an output head (get_output_embeddings(), e.g. a "
                          "transformers ...ForCausalLM)",
                          problem=f"{type(model).__name__} has no output head to carry muP's 1/m output multiplier")
    return head


def _scale_output(multiplier: float):
    def hook(module: nn.Module, inputs: Any, output: Any) -> Any:
        return output * multiplier

    return hook


def apply_mup(model: nn.Module, base_width: float, width: Optional[float] = None, base_depth: Optional[int] = None,
              base_head_dim: Optional[int] = None) -> float:
    """Install muP's output multiplier 1/m on `model`'s output head; returns m (width / `base_width`).

    With `base_head_dim`, the model's head size must be that one (:func:`check_head_dim`); with `base_depth`, the
    residual branches are scaled by CompleteP's (L / base_depth)^-1 too (:func:`apply_depth_scaling`).

    The head (`model.get_output_embeddings()`) gets a forward hook that multiplies its output, the logits, by 1/m.
    A head tied to the input embeddings is the same module: the hook scales the logits only, never the input
    embeddings (the tied weight stays one tensor, trained as the ``embedding`` group). Idempotent: a second call
    with the same m does nothing, with another m it replaces the hook (one hook at most). The width is read from the
    model's config (`hf_fasttrain.optim.groups.model_width`) unless `width` is given; a model whose width cannot be
    read is refused in one line. The optimizer side (lr / m on hidden matrices) comes from
    ``parameterization="mup"`` of the optimizer, which checks that this multiplier is in place.
    """
    check_parameterization("mup", base_width, width, base_depth, base_head_dim)
    m = width_multiplier(model, base_width, width)
    if base_head_dim is not None:
        check_head_dim(model, base_head_dim)
    head = _output_head(model)
    if base_depth is not None:
        apply_depth_scaling(model, base_depth)
    config = getattr(model, "config", None)
    if config is not None:  # saved with the model: restore_mup puts the multipliers back after loading
        setattr(config, CONFIG_ATTR, {"base_width": base_width, "width": width, "base_depth": base_depth})
    have = getattr(head, OUTPUT_MULTIPLIER_ATTR, None)
    if have is not None and math.isclose(have, m, rel_tol=1e-12):
        return m
    handle = getattr(head, _HOOK_ATTR, None)
    if handle is not None:
        handle.remove()
    handle = head.register_forward_hook(_scale_output(1.0 / m))
    setattr(head, _HOOK_ATTR, handle)
    setattr(head, OUTPUT_MULTIPLIER_ATTR, m)
    return m


def restore_mup(model: nn.Module) -> Optional[float]:
    """Put back the multipliers a model was trained with (`apply_mup`'s settings, which its saved config records);
    returns m, or None for a model trained without muP. The multipliers are hooks, not weights: a model loaded with
    `from_pretrained` needs this call before its logits are those it was trained with."""
    settings = getattr(getattr(model, "config", None), CONFIG_ATTR, None)
    if not isinstance(settings, dict):
        return None
    return apply_mup(model, settings["base_width"], settings.get("width"), settings.get("base_depth"))


def remove_mup(model: nn.Module) -> None:
    """Take `apply_mup`'s multipliers off `model`: the head's and the residual branches' (nothing happens when none
    is installed)."""
    config = getattr(model, "config", None)
    if config is not None and hasattr(config, CONFIG_ATTR):
        delattr(config, CONFIG_ATTR)
    for module in model.modules():
        for handle in module.__dict__.pop(_DEPTH_ATTR, ()):
            handle.remove()
    head = _output_head(model)
    handle = getattr(head, _HOOK_ATTR, None)
    if handle is not None:
        handle.remove()
    for attr in (_HOOK_ATTR, OUTPUT_MULTIPLIER_ATTR):
        if hasattr(head, attr):
            delattr(head, attr)


@torch.no_grad()
def mup_init_(model: nn.Module, base_width: float, width: Optional[float] = None, std: Optional[float] = None) -> float:
    """Re-initialise `model`'s hidden matrices with muP's std sigma / sqrt(m); returns m.

    The hidden matrices are the ``matrix`` role of `hf_fasttrain.optim.groups.param_roles` (attention and MLP
    weights; not embeddings, the head, norms or biases, which keep their values). sigma is the model's own
    initialisation: a transformers model is re-initialised by its `initialize_weights` (GPT-2's residual projections
    keep their 1/sqrt(2 n_layer)) and the matrices are then multiplied by 1/sqrt(m). With `std` given, every hidden
    matrix is drawn from N(0, (std / sqrt(m))^2) instead (the only way for a model without `initialize_weights`).
    Calling it twice gives the same distribution (it re-draws, it does not rescale what is there).
    """
    check_parameterization("mup", base_width, width)
    m = width_multiplier(model, base_width, width)
    roles = param_roles(model)
    named = dict(model.named_parameters())
    matrices = [named[n] for n, role in roles.items() if role == "matrix"]
    if std is not None:
        if isinstance(std, bool) or not isinstance(std, (int, float)) or not math.isfinite(std) or std <= 0:
            raise ConfigError("std", std, "a finite number > 0")
        for p in matrices:
            p.normal_(0.0, std / math.sqrt(m))
        return m
    if not callable(getattr(model, "initialize_weights", None)):
        raise ConfigError("std", allowed=f"give std=<the init std>: {type(model).__name__} has no initialize_weights "
                          "to re-draw its own initialisation")
    ids = {id(p) for p in matrices}
    keep = {id(t): (t, t.detach().clone()) for t in [*model.parameters(), *model.buffers()] if id(t) not in ids}
    flags = [(m_, m_.__dict__.pop("_is_hf_initialized")) for m_ in model.modules() if "_is_hf_initialized" in m_.__dict__]
    tensor_flags = [(t, t.__dict__.pop("_is_hf_initialized")) for t in [*model.parameters(), *model.buffers()]
                    if "_is_hf_initialized" in getattr(t, "__dict__", {})]
    try:
        model.initialize_weights()
    finally:
        for module, value in flags:
            module._is_hf_initialized = value
        for tensor, value in tensor_flags:
            tensor._is_hf_initialized = value
    for tensor, saved in keep.values():  # only the hidden matrices are re-drawn
        tensor.copy_(saved)
    for p in matrices:
        p.mul_(1.0 / math.sqrt(m))
    return m


# residual blocks whose branches the depth rule scales: (attention, MLP) child names and the block's norms, which
# must be exactly these (a norm after a branch, as Gemma 2's or OLMo 2's, would undo the multiplier)
_BLOCK_LAYOUTS = (
    ("attn", "mlp", frozenset({"ln_1", "ln_2"})),  # GPT-2
    ("self_attn", "mlp", frozenset({"input_layernorm", "post_attention_layernorm"})),  # Llama, Mistral, Qwen2/3
)
_DEPTH_ATTR = "_hf_fasttrain_depth_hooks"


def _residual_blocks(model: nn.Module) -> Optional[list[tuple[nn.Module, nn.Module]]]:
    """(attention, MLP) of each residual block, in order, where the model's blocks have a recognised layout."""
    for module in model.modules():
        if not isinstance(module, nn.ModuleList) or len(module) == 0:
            continue
        found = []
        for block in module:
            children = dict(block.named_children())
            norms = frozenset(n for n, c in children.items() if "norm" in type(c).__name__.lower() or
                              isinstance(c, nn.LayerNorm))
            layout = next(((a, f) for a, f, ns in _BLOCK_LAYOUTS if a in children and f in children and norms == ns),
                          None)
            if layout is None:
                break
            found.append((children[layout[0]], children[layout[1]]))
        else:
            return found
    return None


def _scale_branch(multiplier: float):
    def hook(module: nn.Module, inputs: Any, output: Any) -> Any:
        if isinstance(output, tuple):  # attention: (output, weights, ...)
            return (output[0] * multiplier, *output[1:])
        return output * multiplier

    return hook


def apply_depth_scaling(model: nn.Module, base_depth: int) -> float:
    """CompleteP's depth rule (Dey et al. 2025, arXiv:2505.01618, alpha = 1): each residual branch, the output of
    every block's attention and MLP, multiplied by (L / `base_depth`)^-1; returns that multiplier.

    With alpha = 1 each block's contribution to the residual stream shrinks as 1 / L, so that the sum over blocks
    stays the same size and each block keeps learning features (not only their linearisation) at any depth, which
    is what lets the base depth's lr hold. L is the model's number of blocks (`model_depth`), which must match the
    blocks found. Recognised blocks: GPT-2's (``attn``, ``mlp``) and Llama-like ones (``self_attn``, ``mlp``, with
    only the two pre-norms); any other model is refused in one line, as is a model whose depth cannot be read.
    Idempotent: a second call replaces the hooks.
    """
    if isinstance(base_depth, bool) or not isinstance(base_depth, int) or base_depth <= 0:
        raise ConfigError("base_depth", base_depth, "an integer > 0")
    blocks = _residual_blocks(model)
    if blocks is None:
        raise ConfigError("base_depth", base_depth, "leave it unset for this model, or use GPT-2 or a Llama-like model",
                          problem=f"the depth rule scales residual branches by hooks on GPT-2 blocks (attn, mlp) and "
                                  f"Llama-like blocks (self_attn, mlp, two pre-norms); {type(model).__name__} has "
                                  f"neither")
    depth = model_depth(model)
    if depth is None or depth != len(blocks):
        raise ConfigError("base_depth", base_depth, "a model whose config's num_hidden_layers / n_layer counts its "
                          "blocks", problem=f"the config says {depth} layers, the model has {len(blocks)} blocks")
    multiplier = base_depth / depth
    for attn, mlp in blocks:
        for branch in (attn, mlp):
            for handle in getattr(branch, _DEPTH_ATTR, ()):
                handle.remove()
            setattr(branch, _DEPTH_ATTR, (branch.register_forward_hook(_scale_branch(multiplier)),))
    return multiplier


def model_head_dim(model: nn.Module) -> Optional[int]:
    """The attention head size of `model`: its config's ``head_dim``, else width / number of heads; None if unknown."""
    config = getattr(model, "config", None)
    getter = getattr(config, "get_text_config", None)
    config = getter() if callable(getter) else config
    head_dim = getattr(config, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    width = model_width(model)
    heads = next((getattr(config, f) for f in ("num_attention_heads", "n_head")
                  if isinstance(getattr(config, f, None), int)), None)
    return width // heads if width and heads else None


def check_head_dim(model: nn.Module, base_head_dim: int) -> None:
    """A one-line refusal unless `model`'s head size is `base_head_dim`: muP by heads at a fixed head size keeps the
    attention's 1/sqrt(d_head) right; a head size that grows would need 1/d_head, which hooks do not reach."""
    if isinstance(base_head_dim, bool) or not isinstance(base_head_dim, int) or base_head_dim <= 0:
        raise ConfigError("base_head_dim", base_head_dim, "an integer > 0")
    have = model_head_dim(model)
    if have is None:
        raise ConfigError("base_head_dim", base_head_dim, "a model whose config gives head_dim or a number of heads",
                          problem=f"cannot read the head size of {type(model).__name__}")
    if have != base_head_dim:
        raise ConfigError("base_head_dim", base_head_dim, "widen by heads at a fixed head size (more heads, the same "
                          "head_dim)", problem=f"the model's heads are {have} wide, the base's {base_head_dim}: the "
                                               "attention scale would not transfer")


def transfer_options(options: Any) -> dict[str, Any]:
    """The parameterization options (`parameterization`, `base_width`, `width`, `base_depth`, `base_head_dim`) of a
    mapping of optimizer options, with their defaults; checked (one line for a bad value)."""
    options = dict(options or {})
    out = {"parameterization": options.get("parameterization", "standard"), "base_width": options.get("base_width"),
           "width": options.get("width"), "base_depth": options.get("base_depth"),
           "base_head_dim": options.get("base_head_dim")}
    check_parameterization(**out)
    return out


def apply_transfer(model: nn.Module, options: Any, init: bool = False) -> Optional[float]:
    """The model side of the parameterization that `options` (optimizer options) set: under ``"mup"``, with `init`
    muP's initialisation (:func:`mup_init_`), then :func:`apply_mup` (the output multiplier, the head-size check,
    the depth rule); returns m, or None under ``"standard"`` (nothing is done)."""
    opts = transfer_options(options)
    if opts["parameterization"] != "mup":
        return None
    if init:
        mup_init_(model, opts["base_width"], opts["width"])
    return apply_mup(model, opts["base_width"], opts["width"], opts["base_depth"], opts["base_head_dim"])


def check_config_mup(model: nn.Module) -> None:
    """A one-line refusal for a model config that carries its own muP setting (``config.mup``, which a transformers
    Trainer may read to build muP groups) when hf_fasttrain builds the optimizer: its groups would replace the ones
    that setting asks for, so it is refused rather than dropped. Nothing happens when the config has none."""
    config = getattr(model, "config", None)
    value = getattr(config, "mup", None)
    if value is None or value is False or (hasattr(value, "__len__") and len(value) == 0):
        return
    raise ConfigError("config.mup", value, "set config.mup to None and give optimizer_kwargs {'parameterization': 'mup', "
                      "'base_width': <the base width>} (hf_fasttrain builds the optimizer), or leave `optimizer` unset "
                      "to let the Trainer read config.mup", problem=f"got {value!r} with `optimizer` set, whose param "
                      "groups would replace the ones config.mup asks for")
