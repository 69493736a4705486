"""An optimizer's options from the Trainer's arguments and from recipes, checked before any training.

`optimizer_cls_and_kwargs_for` and `trainer_optimizer_kwargs` read lr, weight decay, the Adam betas and the run
length from a `TrainingArguments` (TRL's configs included); `parse_optimizer_kwargs` reads `optimizer_kwargs`
from YAML or a CLI JSON string; `check_optimizer_args` validates `optimizer` / `optimizer_kwargs` of
`FastTrainingArguments` in its `__post_init__`. The factories themselves are in `hf_fasttrain.optim.registry`.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any, Mapping, Optional, Union

from .registry import (OptimizerFactory, _check_options, _defaults, check_optimizer_options, create_ademamix,
                       create_muon, create_soap, get_optimizer_factory)
from .sharding import check_sharding_support, detect_sharding

__all__ = ["check_optimizer_args", "optimizer_cls_and_kwargs_for", "parse_optimizer_kwargs", "trainer_optimizer_kwargs"]


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


def check_optimizer_args(args: Any) -> None:
    """Validate ``optimizer`` / ``optimizer_kwargs`` of ``FastTrainingArguments`` now: a bad name or value fails
    before any training. Parses ``args.optimizer_kwargs`` in place (JSON, "1e-5")."""
    import dataclasses

    from transformers import TrainingArguments

    from .._validation import check

    if args.optimizer is None:
        check(not args.optimizer_kwargs, "optimizer_kwargs", args.optimizer_kwargs,
              "only allowed together with `optimizer` (the Trainer's `optim` takes `optim_args`)")
        return
    get_optimizer_factory(args.optimizer)  # ValueError naming the known optimizers
    default_optim = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "optim")
    optim = getattr(args.optim, "value", args.optim)
    check(optim == default_optim, "optim", optim,
          f"set either `optim` or `optimizer` (here {args.optimizer!r}), not both; leave optim at "
          f"{default_optim!r} when `optimizer` is set")
    check(not args.optim_args, "optim_args", args.optim_args,
          f"applies to `optim` only; give options of optimizer={args.optimizer!r} in `optimizer_kwargs`")
    args.optimizer_kwargs = parse_optimizer_kwargs(args.optimizer, args.optimizer_kwargs)
    check_optimizer_options(args.optimizer, **trainer_optimizer_kwargs(args))
