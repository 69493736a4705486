"""Optimizers by name: `OPTIMIZERS[name](model, lr=None, weight_decay=None, **kwargs) -> Optimizer`.

Each factory builds the param groups from the model: weight decay only on the parameters the
Trainer decays (`Trainer.get_decay_parameter_names`: not biases, not norms), and for "muon" the
split between Muon (hidden matrices) and AdamW (embeddings, LM head, biases, norms). `lr=None` or
`weight_decay=None` take the optimizer's default from its paper (see each module).

Plain `transformers.Trainer`, one line (lr, weight decay and run length taken from `args`):

    Trainer(model, args, ..., optimizer_cls_and_kwargs=optimizer_cls_and_kwargs_for("lion", args))

or with an optimizer built up front (cannot be combined with `model_init`):

    Trainer(model, args, ..., optimizers=(create_optimizer("soap", model, lr=3e-3, weight_decay=0.01), None))

Either way the Trainer still builds its LR scheduler (`lr_scheduler_type`, warmup) on top. With
`create_optimizer` the learning rate is the one given there, not `args.learning_rate`. How the options come
from the Trainer's arguments and from recipes (`optimizer_cls_and_kwargs_for`, `parse_optimizer_kwargs`) is in
`hf_fasttrain.optim.options`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import re
from typing import Any, Callable, Mapping, Optional

import torch
from torch import nn

from ._common import OptionError, is_real_number, check_nonnegative
from .adamw import build_adamw, check_adamw_options
from .groups import check_group_options, check_parameterization, regroup
from .ademamix import AdEMAMix, check_ademamix_options
from .lion import Lion, check_lion_options
from .hyperball import initial_radius
from .muon import MuonWithAdamW, check_muon_options, conv1d_lr_multiplier, expert_param_groups
from .routing import conv1d_type, muon_routing
from .orthogonalize import NS_EPS
from .sharding import check_sharding_support, detect_sharding
from .soap import DEFAULT_SKINNY_RATIO, SOAP, check_soap_options

__all__ = [
    "OPTIMIZERS",
    "OptimizerFactory",
    "check_option_names",
    "check_option_values",
    "create_optimizer",
    "decay_param_groups",
    "get_optimizer_factory",
    "optimizer_option_names",
    "builder_defaults",
    "options_with_defaults",
]


def decay_param_groups(model: nn.Module, weight_decay: float, names: Optional[set[str]] = None) -> list[dict]:
    """[decay group, no-decay group] of `model`'s trainable params, as the Trainer builds them.

    Params are given as (name, tensor) pairs, so each group records `param_names`. Empty groups are
    left out. `names` restricts the groups to those parameter names.
    """
    from transformers import Trainer  # the Trainer's own rule: no decay on biases and norms

    decay_names = set(Trainer.get_decay_parameter_names(None, model))
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or (names is not None and name not in names):
            continue
        (decay if name in decay_names else no_decay).append((name, p))
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def builder_defaults(fn: Callable) -> dict[str, Any]:
    return {
        k: v.default
        for k, v in inspect.signature(fn).parameters.items()
        if v.default is not inspect.Parameter.empty
    }


def _lr_and_decay(owner: str, builder: Callable, lr, weight_decay) -> tuple[Any, Any]:
    """`lr` and `weight_decay`, None taking the builder's default (the optimizer's own, from its signature)."""
    defaults = builder_defaults(builder)
    lr = defaults["lr"] if lr is None else lr
    weight_decay = defaults["weight_decay"] if weight_decay is None else weight_decay
    check_nonnegative(owner, "weight_decay", weight_decay)  # also set per group by the factory
    return lr, weight_decay


def _build(owner: str, builder: Callable, model: nn.Module, lr, weight_decay, kwargs,
           lr_multipliers=None, weight_decay_on: str = "default", transfer: Optional[Mapping[str, Any]] = None
           ) -> torch.optim.Optimizer:
    lr, weight_decay = _lr_and_decay(owner, builder, lr, weight_decay)
    transfer = dict(transfer or {})
    check_parameterization(**transfer)
    groups = regroup(decay_param_groups(model, weight_decay), model, lr, lr_multipliers, weight_decay_on,
                     transfer["parameterization"], transfer["base_width"], transfer["width"], kwargs.get("eps"))
    return builder(groups, lr=lr, weight_decay=weight_decay, **kwargs)


def _transfer(parameterization, base_width, width, base_depth, base_head_dim) -> dict[str, Any]:
    """The parameterization options of a factory, as one mapping (`hf_fasttrain.optim.groups`)."""
    return {"parameterization": parameterization, "base_width": base_width, "width": width, "base_depth": base_depth,
            "base_head_dim": base_head_dim}


# the parameterization options every factory takes (checked by check_parameterization, applied by regroup and,
# on the model side, by hf_fasttrain.transfer)
TRANSFER_OPTIONS = ("parameterization", "base_width", "width", "base_depth", "base_head_dim")


def create_adamw(
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    betas: tuple[float, float] = (0.9, 0.999),
    eps: float = 1e-8,
    fused: Optional[bool] = None,
    cautious: bool = False,
    lr_multipliers: Optional[Mapping[str, float]] = None,
    weight_decay_on: str = "default",
    parameterization: str = "standard",
    base_width: Optional[float] = None,
    width: Optional[float] = None,
    base_depth: Optional[int] = None,
    base_head_dim: Optional[int] = None,
) -> torch.optim.Optimizer:
    """torch AdamW (fused on CUDA, foreach otherwise); defaults lr 1e-3, weight decay 0.1.

    `cautious=True`: cautious AdamW (Liang et al. 2024), this package's `AdamW` (no fused kernel)."""
    kwargs = {"betas": betas, "eps": eps, "fused": fused, "cautious": cautious}
    return _build("AdamW", build_adamw, model, lr, weight_decay, kwargs, lr_multipliers, weight_decay_on,
                  _transfer(parameterization, base_width, width, base_depth, base_head_dim))


def create_lion(
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    betas: tuple[float, float] = (0.9, 0.99),
    cautious: bool = False,
    lr_multipliers: Optional[Mapping[str, float]] = None,
    weight_decay_on: str = "default",
    parameterization: str = "standard",
    base_width: Optional[float] = None,
    width: Optional[float] = None,
    base_depth: Optional[int] = None,
    base_head_dim: Optional[int] = None,
) -> torch.optim.Optimizer:
    """Lion (Chen et al. 2023); defaults lr 1e-4, weight decay 1.0, betas (0.9, 0.99); `cautious` C-Lion."""
    return _build("Lion", Lion, model, lr, weight_decay, {"betas": betas, "cautious": cautious}, lr_multipliers,
                  weight_decay_on, _transfer(parameterization, base_width, width, base_depth, base_head_dim))


def create_ademamix(
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    betas: tuple[float, float, float] = (0.9, 0.999, 0.9999),
    alpha: float = 5.0,
    T_alpha_beta3: Optional[int] = None,
    eps: float = 1e-8,
    cautious: bool = False,
    lr_multipliers: Optional[Mapping[str, float]] = None,
    weight_decay_on: str = "default",
    parameterization: str = "standard",
    base_width: Optional[float] = None,
    width: Optional[float] = None,
    base_depth: Optional[int] = None,
    base_head_dim: Optional[int] = None,
) -> torch.optim.Optimizer:
    """AdEMAMix (Pagliardini et al. 2024); set T_alpha_beta3 to the run's length, as the paper does."""
    kwargs = {"betas": betas, "alpha": alpha, "T_alpha_beta3": T_alpha_beta3, "eps": eps, "cautious": cautious}
    return _build("AdEMAMix", AdEMAMix, model, lr, weight_decay, kwargs, lr_multipliers, weight_decay_on,
                  _transfer(parameterization, base_width, width, base_depth, base_head_dim))


def create_soap(
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    betas: tuple[float, float] = (0.95, 0.95),
    shampoo_beta: Optional[float] = None,
    eps: float = 1e-8,
    precondition_frequency: int = 10,
    max_precond_dim: int = 10000,
    precondition_1d: bool = False,
    skinny_ratio: Optional[float] = DEFAULT_SKINNY_RATIO,
    lr_multipliers: Optional[Mapping[str, float]] = None,
    weight_decay_on: str = "default",
    parameterization: str = "standard",
    base_width: Optional[float] = None,
    width: Optional[float] = None,
    base_depth: Optional[int] = None,
    base_head_dim: Optional[int] = None,
) -> torch.optim.Optimizer:
    """SOAP (Vyas et al. 2024); defaults lr 3e-3, betas (0.95, 0.95), weight decay 0.01, refresh every 10.

    `skinny_ratio` (default 16, None: off): a side longer than this times the rest of the tensor gets
    no preconditioner, as one over `max_precond_dim`. With peft, a LoRA matrix (r x d_in, d_out x r)
    then keeps only its r x r factor and its state is about AdamW's; with both sides every d x d
    factor would cost far more than the adapter itself (Llama-2-7B, r=8 on every linear layer: about
    44 GiB against AdamW's 0.15 GiB). Square-ish hidden matrices (ratio up to 16) are unchanged.
    """
    kwargs = {
        "betas": betas,
        "shampoo_beta": shampoo_beta,
        "eps": eps,
        "precondition_frequency": precondition_frequency,
        "max_precond_dim": max_precond_dim,
        "precondition_1d": precondition_1d,
        "skinny_ratio": skinny_ratio,
    }
    return _build("SOAP", SOAP, model, lr, weight_decay, kwargs, lr_multipliers, weight_decay_on,
                  _transfer(parameterization, base_width, width, base_depth, base_head_dim))


# Muon's defaults, written once: `MuonWithAdamW`'s signature (the optimizer; `create_muon`'s signature shows them)
_MUON = builder_defaults(MuonWithAdamW)


def _muon_adjust_lr_fn(adjust_lr_fn: Optional[str], parameterization: str) -> str:
    """Muon's update scale: as given, or (None) "match_rms_adamw", and "spectral" under ``parameterization="mup"``,
    where any other scale is refused in one line (it would not keep the update's size across widths)."""
    if adjust_lr_fn is None:
        return "spectral" if parameterization == "mup" else "match_rms_adamw"
    if parameterization == "mup" and adjust_lr_fn != "spectral":
        raise OptionError("Muon", "adjust_lr_fn", adjust_lr_fn, "leave it unset or give 'spectral'",
                          problem=f"got {adjust_lr_fn!r} with parameterization 'mup', which puts Muon's matrices on "
                                  "the spectral scale sqrt(fan_out / fan_in)")
    return adjust_lr_fn


def _muon_lrs(lr, weight_decay, muon_lr, adjust_lr_fn, adamw_lr_ratio) -> tuple[Any, Any, Any, Any]:
    """`create_muon`'s lr, weight decay, Muon's lr and the AdamW part's lr, checked (values alone)."""
    lr = _MUON["lr"] if lr is None else lr
    weight_decay = _MUON["weight_decay"] if weight_decay is None else weight_decay
    check_nonnegative("Muon", "lr", lr)
    check_nonnegative("Muon", "weight_decay", weight_decay)
    explicit_muon_lr = muon_lr is not None
    if muon_lr is None:
        muon_lr = 0.02 if adjust_lr_fn == "original" else lr
    check_nonnegative("Muon", "muon_lr", muon_lr)
    if not is_real_number(adamw_lr_ratio) or adamw_lr_ratio <= 0:
        raise OptionError("Muon", "adamw_lr_ratio", adamw_lr_ratio, "must be a finite number > 0")
    if adamw_lr_ratio != 1.0:
        if explicit_muon_lr:
            raise OptionError("Muon", "adamw_lr_ratio", adamw_lr_ratio, "give adamw_lr_ratio or muon_lr, not both",
                              problem=f"got {adamw_lr_ratio!r} with muon_lr {muon_lr!r}; it sets the AdamW part's lr "
                                      "from Muon's")
        if adjust_lr_fn == "original":
            raise OptionError("Muon", "adamw_lr_ratio", adamw_lr_ratio, "use it with adjust_lr_fn 'match_rms_adamw'",
                              problem=f"got {adamw_lr_ratio!r} with adjust_lr_fn 'original', where Muon's lr is not "
                                      "on AdamW's scale")
    return lr, weight_decay, muon_lr, lr * adamw_lr_ratio


def create_muon(
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    muon_lr: Optional[float] = None,
    momentum: float = _MUON["momentum"],
    nesterov: bool = _MUON["nesterov"],
    ns_steps: int = _MUON["ns_steps"],
    adjust_lr_fn: Optional[str] = None,
    betas: tuple[float, float] = _MUON["betas"],
    eps: float = _MUON["eps"],
    adamw_patterns: tuple[str, ...] = (),
    fused: Optional[bool] = _MUON["fused"],
    ns_coefficients: Any = _MUON["ns_coefficients"],
    cautious: bool = _MUON["cautious"],
    ns_sharding: str = _MUON["ns_sharding"],
    ns_batched: bool = _MUON["ns_batched"],
    normuon_beta2: Optional[float] = _MUON["normuon_beta2"],
    cautious_wd: bool = _MUON["cautious_wd"],
    hyperball: bool = _MUON["hyperball"],
    ns_dtype: str = _MUON["ns_dtype"],
    adamw_lr_ratio: float = 1.0,
    lr_multipliers: Optional[Mapping[str, float]] = None,
    weight_decay_on: str = "default",
    parameterization: str = "standard",
    base_width: Optional[float] = None,
    width: Optional[float] = None,
    base_depth: Optional[int] = None,
    base_head_dim: Optional[int] = None,
) -> MuonWithAdamW:
    """Muon on the hidden matrices, AdamW on the rest (see `muon_routing`), as one optimizer.

    `lr` (default 1e-3) is AdamW's; `muon_lr` is Muon's, defaulting to `lr` with "match_rms_adamw"
    (Liu et al. 2025) and to 0.02 with "original" (Jordan et al. 2024). Weight decay (default 0.1,
    Liu et al. 2025) applies to the Muon matrices and to AdamW's decay group (embeddings included).
    Groups: Muon groups first (one per lr multiplier, see `conv1d_lr_multiplier`), then AdamW's
    decay and no-decay groups; every group carries `use_muon` and `param_names`.
    `ns_coefficients` ("jordan", "polar_express" or (a, b, c) triples) and `ns_steps` set the
    Newton-Schulz iteration; `cautious` makes the AdamW part cautious (Liang et al. 2024);
    `ns_sharding` ("all_gather" or "round_robin") how FSDP2-sharded matrices are orthogonalised;
    `ns_batched` (default True) orthogonalises matrices of one shape in one batched Newton-Schulz.
    `normuon_beta2` (default None: Muon) turns the matrix part into NorMuon (Li et al. 2025; see
    `hf_fasttrain.optim.normuon`, the authors use 0.95): Muon groups are then split by layout too, a
    `Conv1D` weight's group carrying ``normuon_dim=0`` so its neurons are its columns.
    `cautious_wd` decays a Muon matrix's element only where the update has its sign (Chen et al. 2025).
    `hyperball` (Wen et al. 2025; `hf_fasttrain.optim.hyperball`) keeps each Muon matrix's vectors at their
    initial norms instead of decaying them (weight decay then reaches the AdamW part only); groups are split
    by layout, a `Conv1D` weight's carrying ``hyperball_dim=1``. A matrix with a vector of norm 0 (LoRA's
    `lora_B`) is refused here, before any step.
    `ns_dtype` ("auto", the default, "bfloat16" or "float32") is the Newton-Schulz precision (see `MuonWithAdamW`).
    `adamw_lr_ratio` (default 1.0) runs the AdamW part at that multiple of `lr` while Muon keeps `lr`: 0.25 is
    what the long-horizon search at 24.8 tokens per parameter measured with cautious weight decay
    (`hf_fasttrain.config.budget`). It is a ratio to Muon's lr, so it is refused with an explicit `muon_lr` or with
    ``adjust_lr_fn="original"`` (where Muon's lr is on another scale).
    `adjust_lr_fn` (None: "match_rms_adamw", or "spectral" under muP) is the update's scale (see
    `hf_fasttrain.optim.muon`). ``parameterization="mup"`` (with `base_width`, see `hf_fasttrain.optim.groups`) puts
    the Muon matrices and experts on the spectral scale sqrt(fan_out / fan_in) and nothing else (no lr / m on top:
    the scale already keeps the update's spectral norm fixed across widths); the AdamW part follows the muP rule of
    the other optimizers (its hidden matrices, if any, at lr / m).
    """
    transfer = _transfer(parameterization, base_width, width, base_depth, base_head_dim)
    check_parameterization(**transfer)
    adjust_lr_fn = _muon_adjust_lr_fn(adjust_lr_fn, parameterization)
    lr, weight_decay, muon_lr, adamw_lr = _muon_lrs(lr, weight_decay, muon_lr, adjust_lr_fn, adamw_lr_ratio)
    if isinstance(adamw_patterns, str):
        adamw_patterns = (adamw_patterns,)

    routing = muon_routing(model, adamw_patterns)
    named = dict(model.named_parameters())
    conv1d_ids = {id(m.weight) for m in model.modules() if isinstance(m, conv1d_type())}

    by_multiplier: dict[tuple, list] = {}
    for name, route in routing.items():
        if route != "muon":
            continue
        p = named[name]
        conv1d = id(p) in conv1d_ids
        mult = conv1d_lr_multiplier(p.shape, adjust_lr_fn) if conv1d else 1.0
        # NorMuon and Hyperball: a Conv1D's neurons are its columns, its input vectors its rows
        layout = (conv1d,) if normuon_beta2 is not None or hyperball is True else ()
        if hyperball is True:  # refused before any step, naming the matrix (a bad value is refused below)
            initial_radius(p, 1 if conv1d else 0, NS_EPS, repr(name))
        by_multiplier.setdefault((mult, *layout), []).append((name, p))
    groups = [
        {"params": params, "use_muon": True, "lr": muon_lr * key[0], "weight_decay": weight_decay / key[0],
         **({"normuon_dim": 0 if key[1] else 1} if normuon_beta2 is not None else {}),
         **({"hyperball_dim": 1 if key[1] else 0} if hyperball is True else {})}
        for key, params in by_multiplier.items()
    ]
    groups += expert_param_groups(model, routing, muon_lr, weight_decay, hyperball=hyperball is True)
    adamw_names = {n for n, r in routing.items() if r == "adamw"}
    for g in decay_param_groups(model, weight_decay, names=adamw_names):
        groups.append({**g, "use_muon": False, "lr": adamw_lr})
    # per-role lrs and the width parameterization of the AdamW part (hf_fasttrain.optim.groups)
    groups = regroup(groups, model, lr, lr_multipliers, weight_decay_on, parameterization, base_width, width, eps)
    return MuonWithAdamW(
        groups,
        lr=lr,
        weight_decay=weight_decay,
        momentum=momentum,
        nesterov=nesterov,
        ns_steps=ns_steps,
        adjust_lr_fn=adjust_lr_fn,
        betas=betas,
        eps=eps,
        fused=fused,
        ns_coefficients=ns_coefficients,
        cautious=cautious,
        ns_sharding=ns_sharding,
        ns_batched=ns_batched,
        normuon_beta2=normuon_beta2,
        cautious_wd=cautious_wd,
        hyperball=hyperball,
        ns_dtype=ns_dtype,
    )


OPTIMIZERS: dict[str, Callable[..., torch.optim.Optimizer]] = {
    "adamw": create_adamw,
    "lion": create_lion,
    "ademamix": create_ademamix,
    "soap": create_soap,
    "muon": create_muon,
}


def get_optimizer_factory(name: str) -> Callable[..., torch.optim.Optimizer]:
    """`OPTIMIZERS[name]`, or a ValueError that lists the known names."""
    if not isinstance(name, str) or name not in OPTIMIZERS:
        close = difflib.get_close_matches(str(name).lower(), OPTIMIZERS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"optimizer: got {name!r}; allowed: {', '.join(OPTIMIZERS)}{hint}")
    return OPTIMIZERS[name]


def optimizer_option_names(name: str) -> list[str]:
    """The keyword options the factory of `name` accepts (lr and weight_decay included)."""
    params = inspect.signature(get_optimizer_factory(name)).parameters
    return [k for k in params if k != "model"]


def check_option_names(name: str, kwargs: Mapping[str, Any]) -> None:
    """A ValueError naming the first key of `kwargs` that optimizer `name`'s factory does not take."""
    allowed = optimizer_option_names(name)
    for key in kwargs:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"optimizer_kwargs: {name} has no option {key!r}; allowed: {allowed}.{hint}")


def options_with_defaults(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Every option of optimizer `name`'s factory: `kwargs`, and the signature's default for the rest."""
    bound = inspect.signature(OPTIMIZERS[name]).bind_partial(**kwargs)
    bound.apply_defaults()
    return {k: v for k, v in bound.arguments.items() if k != "model"}


def _call_check(check: Callable, options: Mapping[str, Any], **resolved) -> Any:
    """`check` called with the options its signature names (`resolved` replacing some)."""
    values = {**options, **resolved}
    return check(**{k: values[k] for k in inspect.signature(check).parameters})


# name -> (owner in messages, the optimizer its factory builds, that optimizer's check of its arguments)
_BUILT_BY = {
    "adamw": ("AdamW", build_adamw, check_adamw_options),
    "lion": ("Lion", Lion, check_lion_options),
    "ademamix": ("AdEMAMix", AdEMAMix, check_ademamix_options),
    "soap": ("SOAP", SOAP, check_soap_options),
}


def check_option_values(name: str, kwargs: Mapping[str, Any]) -> None:
    """The value checks that building optimizer `name` with `kwargs` would make, in the same order and with the
    same messages, on the values alone: no model, no parameter, no optimizer is made. What depends on a model
    (which matrices Muon takes, a zero-norm matrix under Hyperball) is checked when the optimizer is built.
    The names must already be checked (`get_optimizer_factory`, `check_option_names`)."""
    options = options_with_defaults(name, kwargs)
    transfer = {k: options[k] for k in TRANSFER_OPTIONS}
    if name == "muon":
        check_parameterization(**transfer)
        adjust_lr_fn = _muon_adjust_lr_fn(options["adjust_lr_fn"], options["parameterization"])
        lr, weight_decay, _, _ = _muon_lrs(options["lr"], options["weight_decay"], options["muon_lr"],
                                           adjust_lr_fn, options["adamw_lr_ratio"])
        patterns = options["adamw_patterns"]
        for pattern in (patterns,) if isinstance(patterns, str) else patterns:
            re.compile(pattern)  # as muon_routing does
        check_group_options(options["lr_multipliers"], options["weight_decay_on"])
        _call_check(check_muon_options, options, lr=lr, weight_decay=weight_decay, adjust_lr_fn=adjust_lr_fn)
        return
    owner, builder, check = _BUILT_BY[name]
    lr, weight_decay = _lr_and_decay(owner, builder, options["lr"], options["weight_decay"])
    check_group_options(options["lr_multipliers"], options["weight_decay_on"])
    check_parameterization(**transfer)
    _call_check(check, options, lr=lr, weight_decay=weight_decay)


def create_optimizer(
    name: str,
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    sharding: Optional[str] = None,
    **kwargs,
) -> torch.optim.Optimizer:
    """Build optimizer `name` for `model`, with its param groups made from the model.

    Weight decay goes to matrices only (the Trainer's rule: not to biases and norms); `muon` puts the
    hidden matrices on Muon and the rest (embeddings, LM head, biases, norms) on AdamW, in one optimizer.

    Args:
        name (`str`):
            One of `OPTIMIZERS`: `"adamw"`, `"lion"`, `"ademamix"`, `"soap"` or `"muon"`. An unknown name
            raises a `ValueError` listing the known ones.
        model (`torch.nn.Module`):
            The model whose parameters are optimized.
        lr (`float`, *optional*, defaults to `None`):
            Peak learning rate; `None` takes the optimizer's default from its paper (see each module).
        weight_decay (`float`, *optional*, defaults to `None`):
            Decoupled weight decay of the decay group; `None` takes the optimizer's default.
        sharding (`str`, *optional*, defaults to `None`):
            How the run spreads the model (`hf_fasttrain.optim.sharding.SHARDING_MODES`); `None` detects it
            from the model's parameters and the launcher's environment. A combination that would not give
            the single-process update (Muon or SOAP under DeepSpeed ZeRO or FSDP1, SOAP under FSDP2,
            `cautious` on flattened partitions) raises a one-line `ValueError` here, before training.
        **kwargs:
            The optimizer's other options (e.g. `betas`, `cautious`, `muon_lr`, `ns_coefficients`);
            unknown names and bad values raise a `ValueError` naming them. Every optimizer takes
            `lr_multipliers` (`{group: factor}`, groups `embedding`, `head`, `norm`, `bias`, `matrix`:
            each group's lr is its lr times the factor) and `weight_decay_on` (`"default"`, the rule above,
            or `"matrices"`: only the hidden matrices decay); see `hf_fasttrain.optim.groups`. Every optimizer
            also takes `parameterization` (`"standard"` or `"mup"`) with `base_width` (and optionally `width`,
            `base_depth`, `base_head_dim`): muP's per-group lr, weight decay and eps by the width multiplier, and
            for Muon the spectral scale (see `hf_fasttrain.optim.groups`, `hf_fasttrain.transfer`).

    Returns:
        `torch.optim.Optimizer`: the optimizer; every param group carries `param_names`.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim import create_optimizer
        >>> net = torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.LayerNorm(4))
        >>> opt = create_optimizer("lion", net, lr=1e-4)
        >>> [(g["param_names"], g["weight_decay"]) for g in opt.param_groups]
        [(['0.weight'], 1.0), (['0.bias', '1.weight', '1.bias'], 0.0)]
        ```
    """
    factory = get_optimizer_factory(name)
    check_option_names(name, kwargs)
    mode = detect_sharding(model=model) if sharding is None else sharding
    check_sharding_support(name, mode, cautious=bool(kwargs.get("cautious", False)),
                           normuon=kwargs.get("normuon_beta2") is not None, hyperball=kwargs.get("hyperball") is True)
    return factory(model, lr=lr, weight_decay=weight_decay, **kwargs)


class OptimizerFactory:
    """What `Trainer(optimizer_cls_and_kwargs=(OptimizerFactory(name), kwargs))` needs.

    The Trainer treats a non-`Optimizer` first element as a factory maker and calls
    `OptimizerFactory(name)()(model, **kwargs)`, i.e. `create_optimizer(name, model, **kwargs)`.

    Example:
        ```python
        >>> from hf_fasttrain.optim import OptimizerFactory
        >>> OptimizerFactory("soap")
        OptimizerFactory('soap')
        ```
    """

    def __init__(self, name: str):
        get_optimizer_factory(name)
        self.name = name

    def __call__(self) -> Callable[..., torch.optim.Optimizer]:
        return functools.partial(create_optimizer, self.name)

    def __repr__(self) -> str:
        return f"OptimizerFactory({self.name!r})"

