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
`create_optimizer` the learning rate is the one given there, not `args.learning_rate`.
"""

from __future__ import annotations

import difflib
import functools
import inspect
import json
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Union

import torch
from torch import nn

from ._common import check_nonnegative
from .adamw import build_adamw
from .groups import regroup
from .ademamix import AdEMAMix
from .lion import Lion
from .hyperball import initial_radius
from .muon import MuonWithAdamW, conv1d_lr_multiplier, expert_param_groups
from .routing import _conv1d_type, muon_routing
from .orthogonalize import _NS_EPS
from .sharding import check_sharding_support, detect_sharding
from .soap import DEFAULT_SKINNY_RATIO, SOAP

__all__ = [
    "OPTIMIZERS",
    "OptimizerFactory",
    "check_optimizer_options",
    "create_optimizer",
    "decay_param_groups",
    "get_optimizer_factory",
    "optimizer_cls_and_kwargs_for",
    "optimizer_option_names",
    "parse_optimizer_kwargs",
    "trainer_optimizer_kwargs",
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


def _defaults(fn: Callable) -> dict[str, Any]:
    return {
        k: v.default
        for k, v in inspect.signature(fn).parameters.items()
        if v.default is not inspect.Parameter.empty
    }


def _build(owner: str, builder: Callable, model: nn.Module, lr, weight_decay, kwargs,
           lr_multipliers=None, weight_decay_on: str = "default") -> torch.optim.Optimizer:
    defaults = _defaults(builder)
    lr = defaults["lr"] if lr is None else lr
    weight_decay = defaults["weight_decay"] if weight_decay is None else weight_decay
    check_nonnegative(owner, "weight_decay", weight_decay)  # also set per group below
    groups = regroup(decay_param_groups(model, weight_decay), model, lr, lr_multipliers, weight_decay_on)
    return builder(groups, lr=lr, weight_decay=weight_decay, **kwargs)


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
) -> torch.optim.Optimizer:
    """torch AdamW (fused on CUDA, foreach otherwise); defaults lr 1e-3, weight decay 0.1.

    `cautious=True`: cautious AdamW (Liang et al. 2024), this package's `AdamW` (no fused kernel)."""
    kwargs = {"betas": betas, "eps": eps, "fused": fused, "cautious": cautious}
    return _build("AdamW", build_adamw, model, lr, weight_decay, kwargs, lr_multipliers, weight_decay_on)


def create_lion(
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    betas: tuple[float, float] = (0.9, 0.99),
    cautious: bool = False,
    lr_multipliers: Optional[Mapping[str, float]] = None,
    weight_decay_on: str = "default",
) -> torch.optim.Optimizer:
    """Lion (Chen et al. 2023); defaults lr 1e-4, weight decay 1.0, betas (0.9, 0.99); `cautious` C-Lion."""
    return _build("Lion", Lion, model, lr, weight_decay, {"betas": betas, "cautious": cautious}, lr_multipliers,
                  weight_decay_on)


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
) -> torch.optim.Optimizer:
    """AdEMAMix (Pagliardini et al. 2024); set T_alpha_beta3 to the run's length, as the paper does."""
    kwargs = {"betas": betas, "alpha": alpha, "T_alpha_beta3": T_alpha_beta3, "eps": eps, "cautious": cautious}
    return _build("AdEMAMix", AdEMAMix, model, lr, weight_decay, kwargs, lr_multipliers, weight_decay_on)


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
    return _build("SOAP", SOAP, model, lr, weight_decay, kwargs, lr_multipliers, weight_decay_on)


def create_muon(
    model: nn.Module,
    lr: Optional[float] = None,
    weight_decay: Optional[float] = None,
    muon_lr: Optional[float] = None,
    momentum: float = 0.95,
    nesterov: bool = True,
    ns_steps: int = 5,
    adjust_lr_fn: str = "match_rms_adamw",
    betas: tuple[float, float] = (0.9, 0.95),
    eps: float = 1e-8,
    adamw_patterns: tuple[str, ...] = (),
    fused: Optional[bool] = None,
    ns_coefficients: Any = "jordan",
    cautious: bool = False,
    ns_sharding: str = "all_gather",
    ns_batched: bool = True,
    normuon_beta2: Optional[float] = None,
    cautious_wd: bool = False,
    hyperball: bool = False,
    ns_dtype: str = "auto",
    adamw_lr_ratio: float = 1.0,
    lr_multipliers: Optional[Mapping[str, float]] = None,
    weight_decay_on: str = "default",
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
    (`hf_fasttrain.budget`). It is a ratio to Muon's lr, so it is refused with an explicit `muon_lr` or with
    ``adjust_lr_fn="original"`` (where Muon's lr is on another scale).
    """
    lr = 1e-3 if lr is None else lr
    weight_decay = 0.1 if weight_decay is None else weight_decay
    check_nonnegative("Muon", "lr", lr)
    check_nonnegative("Muon", "weight_decay", weight_decay)
    explicit_muon_lr = muon_lr is not None
    if muon_lr is None:
        muon_lr = 0.02 if adjust_lr_fn == "original" else lr
    check_nonnegative("Muon", "muon_lr", muon_lr)
    if isinstance(adamw_lr_ratio, bool) or check_nonnegative("Muon", "adamw_lr_ratio", adamw_lr_ratio) == 0:
        raise ValueError(f"Muon: adamw_lr_ratio must be a finite number > 0, got {adamw_lr_ratio!r}")
    if adamw_lr_ratio != 1.0:
        if explicit_muon_lr:
            raise ValueError(f"Muon: adamw_lr_ratio={adamw_lr_ratio!r} sets the AdamW part's lr from Muon's, so it "
                             f"cannot be given with muon_lr={muon_lr!r}: give one of them")
        if adjust_lr_fn == "original":
            raise ValueError(f"Muon: adamw_lr_ratio={adamw_lr_ratio!r} needs adjust_lr_fn='match_rms_adamw' (Muon's "
                             "lr on AdamW's scale), got 'original'")
    adamw_lr = lr * adamw_lr_ratio
    if isinstance(adamw_patterns, str):
        adamw_patterns = (adamw_patterns,)

    routing = muon_routing(model, adamw_patterns)
    named = dict(model.named_parameters())
    conv1d_ids = {id(m.weight) for m in model.modules() if isinstance(m, _conv1d_type())}

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
            initial_radius(p, 1 if conv1d else 0, _NS_EPS, repr(name))
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
    groups = regroup(groups, model, lr, lr_multipliers, weight_decay_on)  # per-role lrs (hf_fasttrain.optim.groups)
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


def _check_options(name: str, kwargs: Mapping[str, Any]) -> None:
    allowed = optimizer_option_names(name)
    for key in kwargs:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise ValueError(f"optimizer_kwargs: {name} has no option {key!r}; allowed: {allowed}.{hint}")


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
            or `"matrices"`: only the hidden matrices decay); see `hf_fasttrain.optim.groups`.

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
    _check_options(name, kwargs)
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


# TrainingArguments' defaults of adam_beta1, adam_beta2 and adam_epsilon.
_TRAINER_ADAM_DEFAULTS = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8}


# the optimizers whose betas begin with Adam's (beta1, beta2), each by its factory (whose defaults are its own)
_ADAM_LIKE = {"muon": create_muon, "soap": create_soap, "ademamix": create_ademamix}


def _adam_kwargs(name: str, args: Any) -> dict[str, Any]:
    """betas / eps of optimizer `name` from the Trainer's adam_beta1, adam_beta2 and adam_epsilon.

    "adamw": all three, as the Trainer's own AdamW. "muon" (its AdamW part), "soap" (Adam run in the
    preconditioner's eigenbasis: its betas and eps are Adam's) and "ademamix" (Adam's two betas, then its
    slow momentum's beta3): each of the three that is set away from the Trainer's default replaces the
    optimizer's own value, the others keep theirs (Muon's AdamW (0.9, 0.95), Moonlight's; SOAP's
    (0.95, 0.95) and AdEMAMix's (0.9, 0.999, 0.9999), the papers'), since a Trainer default says nothing
    about what the user wants for these optimizers. Only what differs from the optimizer's own default
    is returned. SOAP's `shampoo_beta` (the L / R EMA) follows beta2 unless set, as in the paper. Lion's
    betas are not Adam's (sign of an interpolation): it gets nothing here.
    """
    value = {field: getattr(args, field, default) for field, default in _TRAINER_ADAM_DEFAULTS.items()}
    if name == "adamw":
        return {"betas": (value["adam_beta1"], value["adam_beta2"]), "eps": value["adam_epsilon"]}
    if name not in _ADAM_LIKE:
        return {}
    own = _defaults(_ADAM_LIKE[name])
    away = {field: v != _TRAINER_ADAM_DEFAULTS[field] for field, v in value.items()}
    betas = tuple(value[f] if away[f] else b for f, b in zip(("adam_beta1", "adam_beta2"), own["betas"]))
    betas += tuple(own["betas"][2:])  # AdEMAMix's beta3 is not the Trainer's
    kwargs: dict[str, Any] = {}
    if betas != tuple(own["betas"]):
        kwargs["betas"] = betas
    if away["adam_epsilon"] and value["adam_epsilon"] != own["eps"]:
        kwargs["eps"] = value["adam_epsilon"]
    return kwargs


def _kwargs_from_training_args(name: str, args: Any) -> dict[str, Any]:
    """lr, weight decay (and betas/eps, AdEMAMix's warmup length) from a TrainingArguments."""
    kwargs: dict[str, Any] = {}
    for field, key in (("learning_rate", "lr"), ("weight_decay", "weight_decay")):
        if not hasattr(args, field):
            raise ValueError(f"optimizer_cls_and_kwargs_for({name!r}): args has no {field!r}; pass the Trainer's "
                             f"TrainingArguments (or lr= and weight_decay= explicitly)")
        kwargs[key] = getattr(args, field)
    kwargs.update(_adam_kwargs(name, args))
    if name == "ademamix":
        max_steps = getattr(args, "max_steps", -1)
        if isinstance(max_steps, int) and max_steps > 0:
            kwargs["T_alpha_beta3"] = max_steps
    return kwargs


def optimizer_cls_and_kwargs_for(name: str, args: Any = None, **kwargs) -> tuple[OptimizerFactory, dict[str, Any]]:
    """`(factory, kwargs)` for `transformers.Trainer(optimizer_cls_and_kwargs=...)`; checks names now.

    The Trainer hands a factory only the model and these kwargs, never its `learning_rate` or
    `weight_decay`; so pass `args` (the Trainer's TrainingArguments, TRL configs included): `lr` is
    `args.learning_rate`, `weight_decay` `args.weight_decay`, for "adamw" betas/eps are
    `adam_beta1/2`/`adam_epsilon`, for "muon" (its AdamW part) and "soap" those of them set away from
    the Trainer's defaults (0.9, 0.999, 1e-8) replace the optimizer's own (Muon's (0.9, 0.95), SOAP's
    (0.95, 0.95)), and for "ademamix" the alpha/beta3 warmup spans the run
    (`T_alpha_beta3 = args.max_steps`, the paper's choice). `kwargs` override any of these.
    Without `args`, `lr` and `weight_decay` must be given (and `T_alpha_beta3` for "ademamix", None
    for no warmup): nothing falls back to the optimizer's own defaults silently. A DeepSpeed or FSDP
    setting in `args` that the optimizer cannot work under is refused here (see `sharding`).

    Example:
        ```python
        >>> from transformers import TrainingArguments
        >>> from hf_fasttrain.optim import optimizer_cls_and_kwargs_for
        >>> args = TrainingArguments("out", learning_rate=5e-4, weight_decay=0.1, max_steps=1000, report_to=[])
        >>> optimizer_cls_and_kwargs_for("ademamix", args, alpha=8.0)
        (OptimizerFactory('ademamix'), {'lr': 0.0005, 'weight_decay': 0.1, 'T_alpha_beta3': 1000, 'alpha': 8.0})
        >>> optimizer_cls_and_kwargs_for("lion", lr=1e-4, weight_decay=1.0)
        (OptimizerFactory('lion'), {'lr': 0.0001, 'weight_decay': 1.0})
        ```
    """
    get_optimizer_factory(name)
    _check_options(name, kwargs)
    if args is not None:
        merged = _kwargs_from_training_args(name, args)
        merged.update(kwargs)
        if name == "ademamix" and "T_alpha_beta3" not in merged:
            raise ValueError(
                f"optimizer_cls_and_kwargs_for('ademamix'): the alpha/beta3 warmup needs the run length, and "
                f"args.max_steps is {getattr(args, 'max_steps', None)!r}; set max_steps > 0 in the training "
                f"arguments, or pass T_alpha_beta3=<steps> (None: no warmup)"
            )
        # Only the sharding settings (reading args.world_size would set up the process group).
        probe = SimpleNamespace(**{k: getattr(args, k, None) for k in ("deepspeed", "fsdp", "fsdp_config")})
        check_sharding_support(name, detect_sharding(args=probe), cautious=bool(merged.get("cautious", False)),
                               normuon=merged.get("normuon_beta2") is not None,
                               hyperball=merged.get("hyperball") is True)
        return OptimizerFactory(name), merged
    missing = [k for k in ("lr", "weight_decay") if k not in kwargs]
    if name == "ademamix" and "T_alpha_beta3" not in kwargs:
        missing.append("T_alpha_beta3")
    if missing:
        raise ValueError(
            f"optimizer_cls_and_kwargs_for({name!r}): {', '.join(missing)} not set, and the Trainer does not pass "
            f"its learning_rate / weight_decay / max_steps to an optimizer factory; pass the Trainer's "
            f"TrainingArguments as args= (they are taken from it), or set {', '.join(missing)} explicitly"
        )
    return OptimizerFactory(name), dict(kwargs)


def _coerce(value: Any) -> Any:
    if isinstance(value, Mapping):  # lr_multipliers: {"embedding": "16"}
        return {k: _coerce(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_coerce(v) for v in value)
    if isinstance(value, str):
        text = value.strip()
        lowered = text.lower()
        if lowered in ("none", "null"):
            return None
        if lowered in ("true", "false"):
            return lowered == "true"
        for parse in (int, float):
            try:
                return parse(text)
            except ValueError:
                pass
    return value


def parse_optimizer_kwargs(name: str, kwargs: Union[None, str, Mapping[str, Any]]) -> dict[str, Any]:
    """Options for `name` from YAML or a CLI JSON string, with strings like "1e-5" made numbers.

    Also inside lists (betas); "true"/"false"/"null" become True/False/None. Unknown keys raise a
    ValueError listing the allowed ones; `check_optimizer_options` checks the values.

    Example:
        ```python
        >>> from hf_fasttrain.optim import parse_optimizer_kwargs
        >>> parse_optimizer_kwargs("lion", '{"lr": "1e-4", "betas": [0.9, "0.98"]}')
        {'lr': 0.0001, 'betas': [0.9, 0.98]}
        ```
    """
    if kwargs is None:
        return {}
    if isinstance(kwargs, str):
        try:
            kwargs = json.loads(kwargs) if kwargs.strip() else {}
        except json.JSONDecodeError as err:
            raise ValueError(f"optimizer_kwargs must be a JSON object, got {kwargs!r} ({err})") from None
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"optimizer_kwargs must be a mapping of option -> value, got {kwargs!r}")
    _check_options(name, kwargs)
    return {k: _coerce(v) for k, v in kwargs.items()}


def check_optimizer_options(name: str, **kwargs) -> None:
    """Build optimizer `name` with `kwargs` on a 3-parameter probe module, so bad names and values
    raise their ValueError now (e.g. in a config's `__post_init__`) rather than when training starts."""
    probe = nn.Sequential(nn.Linear(2, 2), nn.LayerNorm(2))
    create_optimizer(name, probe, **kwargs)


def trainer_optimizer_kwargs(args: Any, num_training_steps: Optional[int] = None) -> dict[str, Any]:
    """Keyword arguments of `create_optimizer(args.optimizer, model, **kw)` for a Trainer run.

    `lr` is `args.learning_rate` and `weight_decay` is `args.weight_decay`; for "adamw" the Trainer's
    `adam_beta1`, `adam_beta2` and `adam_epsilon` are its betas and eps; for "muon" (the AdamW part
    on embeddings, head, biases and norms), "soap" (Adam in the preconditioner's eigenbasis) and
    "ademamix" (its first two betas), each of them set away from the Trainer's default (0.9, 0.999, 1e-8)
    replaces the optimizer's own value and the others keep theirs: at the Trainer's defaults Muon's AdamW
    keeps (0.9, 0.95) (Moonlight's) and SOAP (0.95, 0.95) (the paper's), and `adam_beta2=0.99` gives Muon
    (0.9, 0.99) and AdEMAMix (0.9, 0.99, 0.9999). A value equal to
    the Trainer's default cannot be told from an unset one; set `optimizer_kwargs={"betas": ...}` for it.
    For "ademamix" the alpha/beta3 warmup spans the whole run (`T_alpha_beta3 = num_training_steps`,
    the paper's choice). `args.optimizer_kwargs` overrides any of these.

    Example:
        ```python
        >>> from types import SimpleNamespace
        >>> args = SimpleNamespace(optimizer="ademamix", optimizer_kwargs={"alpha": 8.0}, learning_rate=1e-3,
        ...                        weight_decay=0.1, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8)
        >>> trainer_optimizer_kwargs(args, num_training_steps=500)
        {'lr': 0.001, 'weight_decay': 0.1, 'T_alpha_beta3': 500, 'alpha': 8.0}
        >>> args.optimizer, args.optimizer_kwargs, args.adam_beta2 = "muon", None, 0.99
        >>> trainer_optimizer_kwargs(args)
        {'lr': 0.001, 'weight_decay': 0.1, 'betas': (0.9, 0.99)}
        ```
    """
    name = args.optimizer
    kwargs: dict[str, Any] = {"lr": args.learning_rate, "weight_decay": args.weight_decay}
    kwargs.update(_adam_kwargs(name, args))
    if name == "ademamix" and num_training_steps is not None and num_training_steps > 0:
        kwargs["T_alpha_beta3"] = int(num_training_steps)
    kwargs.update(parse_optimizer_kwargs(name, args.optimizer_kwargs))
    return kwargs
