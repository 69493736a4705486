"""An optimizer's options from the Trainer's arguments and from recipes, checked before any training.

`optimizer_cls_and_kwargs_for` and `trainer_optimizer_kwargs` read lr, weight decay, the Adam betas and the run
length from a `TrainingArguments` (TRL's configs included); `parse_optimizer_kwargs` reads `optimizer_kwargs`
from YAML or a CLI JSON string; `check_optimizer_args` validates `optimizer` / `optimizer_kwargs` of
`FastTrainingArguments` in its `__post_init__`. Each reads the options into one `OptimizerSpec`
(`hf_fasttrain.optim.spec`), which checks them without building anything; the factories themselves are in
`hf_fasttrain.optim.registry`.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable, Optional

from .registry import OptimizerFactory, get_optimizer_factory
from .sharding import detect_sharding
from .spec import OptimizerSpec, parse_optimizer_kwargs, run_kwargs

__all__ = ["check_optimizer_args", "optimizer_cls_and_kwargs_for", "parse_optimizer_kwargs", "trainer_optimizer_kwargs"]


def _kwargs_from_training_args(name: str, args: Any) -> dict[str, Any]:
    """lr, weight decay (and betas/eps, AdEMAMix's warmup length) from a TrainingArguments."""
    for field in ("learning_rate", "weight_decay"):
        if not hasattr(args, field):
            raise ValueError(f"optimizer_cls_and_kwargs_for({name!r}): args has no {field!r}; pass the Trainer's "
                             f"TrainingArguments (or lr= and weight_decay= explicitly)")
    return run_kwargs(name, args, getattr(args, "max_steps", -1))


def optimizer_cls_and_kwargs_for(name: str, args: Any = None, **kwargs) -> tuple[OptimizerFactory, dict[str, Any]]:
    """`(factory, kwargs)` for `transformers.Trainer(optimizer_cls_and_kwargs=...)`; checks names and values now.

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
    OptimizerSpec.of(name, **kwargs)  # the name and the option names
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
        settings = SimpleNamespace(**{k: getattr(args, k, None) for k in ("deepspeed", "fsdp", "fsdp_config")})
        OptimizerSpec.of(name, **merged).validate(sharding=detect_sharding(args=settings))
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
    OptimizerSpec.of(name, **kwargs).check_values()
    return OptimizerFactory(name), dict(kwargs)


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
    return OptimizerSpec.from_args(args, num_training_steps).kwargs


def check_optimizer_args(args: Any, spec: Optional[Callable[[Any], Any]] = None) -> None:
    """Validate ``optimizer`` / ``optimizer_kwargs`` of ``FastTrainingArguments`` now: a bad name or value fails
    before any training. Parses ``args.optimizer_kwargs`` in place (JSON, "1e-5"). ``spec``: how the spec checked
    is made from the arguments (default ``OptimizerSpec.from_args``; the arguments pass the one their run keeps)."""
    import dataclasses

    from transformers import TrainingArguments

    from ..validation import check

    if args.optimizer is None:
        check(not args.optimizer_kwargs, "optimizer_kwargs", args.optimizer_kwargs,
              "only allowed together with `optimizer` (the Trainer's `optim` takes `optim_args`)")
        return
    get_optimizer_factory(args.optimizer)  # ValueError naming the known optimizers, before the other checks
    default_optim = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "optim")
    optim = getattr(args.optim, "value", args.optim)
    check(optim == default_optim, "optim", optim,
          f"set either `optim` or `optimizer` (here {args.optimizer!r}), not both; leave optim at "
          f"{default_optim!r} when `optimizer` is set")
    check(not args.optim_args, "optim_args", args.optim_args,
          f"applies to `optim` only; give options of optimizer={args.optimizer!r} in `optimizer_kwargs`")
    args.optimizer_kwargs = parse_optimizer_kwargs(args.optimizer, args.optimizer_kwargs)
    (spec or OptimizerSpec.from_args)(args).validate()  # every value, under the launcher's sharding; nothing is built
