"""One optimizer, as one typed and checked value: `OptimizerSpec`.

The spec is made once, from the flat options (`OptimizerSpec.from_args` reads what a Trainer run gives: the
learning rate, weight decay, Adam betas, the run length and `optimizer_kwargs`, as budget_aware left them;
`OptimizerSpec.of` takes keyword options), then checked and built in one place each:

- making it checks the name and the option names (against the factory's signature);
- `spec.validate(sharding)`: the sharding mode and every value, on the values alone. No model, no probe module,
  no optimizer is made; the messages are the optimizer's own (each optimizer's `__init__` calls the same pure
  check).
- `spec.build(model, sharding=...)`: the optimizer, with its param groups made from the model.
- `spec.notes(device, max_steps)`: what a run with this optimizer should be told (a slow bf16 Newton-Schulz on
  a CPU, an AdEMAMix slow momentum that outlasts the run).

Defaults are not copied here: an option left out takes its factory's default (`hf_fasttrain.optim.registry`).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, Mapping, Optional, Union, get_args

import torch

from .ademamix import half_life_note
from .orthogonalize import ns_dtype_note
from .registry import (OPTIMIZERS, builder_defaults, options_with_defaults, check_option_names, check_option_values,
                       create_optimizer, get_optimizer_factory)
from .sharding import check_sharding_support, detect_sharding

__all__ = ["OPTIMIZER_NAMES", "OptimizerName", "OptimizerSpec", "check_optimizer_options", "parse_optimizer_kwargs",
           "run_kwargs"]

#: The optimizers by name (the keys of `hf_fasttrain.optim.OPTIMIZERS`).
OptimizerName = Literal["adamw", "lion", "ademamix", "soap", "muon"]
OPTIMIZER_NAMES: tuple[str, ...] = get_args(OptimizerName)


# TrainingArguments' defaults of adam_beta1, adam_beta2 and adam_epsilon.
_TRAINER_ADAM_DEFAULTS = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-8}


# the optimizers whose betas begin with Adam's (beta1, beta2); their own defaults are their factories' signatures
_ADAM_LIKE = ("muon", "soap", "ademamix")


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
    own = builder_defaults(OPTIMIZERS[name])
    away = {field: v != _TRAINER_ADAM_DEFAULTS[field] for field, v in value.items()}
    betas = tuple(value[f] if away[f] else b for f, b in zip(("adam_beta1", "adam_beta2"), own["betas"]))
    betas += tuple(own["betas"][2:])  # AdEMAMix's beta3 is not the Trainer's
    kwargs: dict[str, Any] = {}
    if betas != tuple(own["betas"]):
        kwargs["betas"] = betas
    if away["adam_epsilon"] and value["adam_epsilon"] != own["eps"]:
        kwargs["eps"] = value["adam_epsilon"]
    return kwargs



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
    check_option_names(name, kwargs)
    return {k: _coerce(v) for k, v in kwargs.items()}



def run_kwargs(name: str, args: Any, num_training_steps: Optional[int] = None) -> dict[str, Any]:
    """What a Trainer run gives optimizer `name`: `lr` (`args.learning_rate`), `weight_decay`, the Adam betas and
    eps (`_adam_kwargs`) and, for "ademamix", the alpha/beta3 warmup over the run's `num_training_steps` when
    that is known (> 0)."""
    kwargs: dict[str, Any] = {"lr": args.learning_rate, "weight_decay": args.weight_decay}
    kwargs.update(_adam_kwargs(name, args))
    if (name == "ademamix" and isinstance(num_training_steps, (int, float)) and not isinstance(num_training_steps, bool)
            and num_training_steps > 0):
        kwargs["T_alpha_beta3"] = int(num_training_steps)
    return kwargs


# name -> what a run with that optimizer is told, from its resolved options, the device and the run's length
_NOTES = {
    "muon": lambda options, device, steps: ns_dtype_note(options["ns_dtype"], device),
    "ademamix": lambda options, device, steps: half_life_note(options["betas"], options["T_alpha_beta3"] or steps),
}


@dataclasses.dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer by name with its options: made once, checked in one place, built by `build`.

    Args:
        name (`str`):
            One of `OPTIMIZER_NAMES`: `"adamw"`, `"lion"`, `"ademamix"`, `"soap"` or `"muon"`; another name
            raises a `ValueError` listing them.
        lr (`float`, *optional*, defaults to `None`):
            Peak learning rate; `None` takes the optimizer's default.
        weight_decay (`float`, *optional*, defaults to `None`):
            Decoupled weight decay of the decay group; `None` takes the optimizer's default.
        options (`Mapping[str, Any]`, *optional*):
            The optimizer's other keyword options (`betas`, `cautious`, `muon_lr`, `lr_multipliers`,
            `weight_decay_on`, ...), as its factory takes them; an unknown name raises a `ValueError` naming
            the allowed ones. An option left out takes the factory's default.

    Example:
        ```python
        >>> import torch
        >>> from hf_fasttrain.optim.spec import OptimizerSpec
        >>> spec = OptimizerSpec.of("lion", lr=1e-4, betas=(0.9, 0.98)).validate(sharding="single")
        >>> spec.kwargs
        {'lr': 0.0001, 'weight_decay': None, 'betas': (0.9, 0.98)}
        >>> opt = spec.build(torch.nn.Linear(2, 4), sharding="single")
        >>> [(g["param_names"], g["weight_decay"]) for g in opt.param_groups]
        [(['weight'], 1.0), (['bias'], 0.0)]
        ```
    """

    name: OptimizerName
    lr: Optional[float] = None
    weight_decay: Optional[float] = None
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self):
        get_optimizer_factory(self.name)  # a ValueError naming the known optimizers
        options = dict(self.options)
        for key in ("lr", "weight_decay"):
            if key in options:
                raise ValueError(f"OptimizerSpec: give {key} as its own field, not in options")
        check_option_names(self.name, options)
        object.__setattr__(self, "options", options)

    @classmethod
    def of(cls, name: str, **kwargs) -> "OptimizerSpec":
        """The spec of `create_optimizer(name, model, **kwargs)` (`lr` and `weight_decay` among the kwargs)."""
        options = dict(kwargs)
        return cls(name, options.pop("lr", None), options.pop("weight_decay", None), options)

    @classmethod
    def from_args(cls, args: Any, num_training_steps: Optional[int] = None) -> "OptimizerSpec":
        """The spec of `args.optimizer` for a Trainer run (see `hf_fasttrain.optim.trainer_optimizer_kwargs`).

        `lr` is `args.learning_rate`, `weight_decay` `args.weight_decay`; the Adam betas and eps come from
        `adam_beta1/2`, `adam_epsilon` as `_adam_kwargs` says; AdEMAMix's alpha/beta3 warmup spans
        `num_training_steps` when it is known; `args.optimizer_kwargs` (a mapping or a JSON string) overrides
        any of these.
        """
        name = args.optimizer
        kwargs = run_kwargs(name, args, num_training_steps)
        kwargs.update(parse_optimizer_kwargs(name, args.optimizer_kwargs))
        return cls.of(name, **kwargs)

    @property
    def kwargs(self) -> dict[str, Any]:
        """`create_optimizer(self.name, model, **spec.kwargs)`: lr, weight decay, then the other options."""
        return {"lr": self.lr, "weight_decay": self.weight_decay, **self.options}

    def resolved(self) -> dict[str, Any]:
        """Every option of the factory: those given, and its signature's default for the others."""
        return options_with_defaults(self.name, self.kwargs)

    def check_sharding(self, sharding: str) -> None:
        """A one-line ValueError if this optimizer (with these options) does not work under `sharding`."""
        check_sharding_support(self.name, sharding, cautious=bool(self.options.get("cautious", False)),
                               normuon=self.options.get("normuon_beta2") is not None,
                               hyperball=self.options.get("hyperball") is True)

    def validate(self, sharding: Optional[str] = None) -> "OptimizerSpec":
        """Check the sharding mode (`None`: detected from the launcher's environment) and every value, without
        a model or an optimizer; returns the spec. A ValueError carries the optimizer's own one-line message."""
        self.check_sharding(detect_sharding() if sharding is None else sharding)
        self.check_values()
        return self

    def check_values(self) -> None:
        """Every value, as building the optimizer would check it (same messages, same order), on the values
        alone: no model, no parameter, no optimizer is made (`hf_fasttrain.optim.registry.check_option_values`)."""
        check_option_values(self.name, self.kwargs)

    def build(self, model: torch.nn.Module, sharding: Optional[str] = None) -> torch.optim.Optimizer:
        """The optimizer for `model` (`sharding=None`: detected from the model and the environment)."""
        return create_optimizer(self.name, model, sharding=sharding, **self.kwargs)

    def notes(self, device: Any = "cpu", max_steps: Optional[int] = None) -> list[str]:
        """Warnings for a run on `device` of `max_steps` optimizer steps (AdEMAMix's warmup length first)."""
        note = _NOTES.get(self.name)
        said = note(self.resolved(), device, max_steps) if note is not None else None
        return [said] if said else []


def check_optimizer_options(name: str, **kwargs) -> None:
    """Check optimizer `name` with `kwargs` now (e.g. in a config's `__post_init__`): bad names and values raise
    their ValueError before training starts. Nothing is built (`OptimizerSpec.validate`)."""
    OptimizerSpec.of(name, **kwargs).validate()
