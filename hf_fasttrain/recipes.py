"""Recipes: YAML files whose keys are exactly the config field names.

Layout of a recipe (see recipes/configs/gpt2_tiny.yaml)::

    model:            # ModelArguments fields
      n_layer: 2
    data:             # DataArguments fields
      block_size: 128
    learning_rate: 1.0e-3   # FastTrainingArguments fields at the top level
    max_steps: 300

Loading is ``yaml.safe_load`` only (no Python tags, nothing executed). Unknown keys are errors that
suggest the closest valid name; values are checked against the field's type (a YAML ``1e-5``, which
YAML reads as a string, becomes the float it means) before anything trains. On the command line,
``--config <recipe>`` is applied first and every ``--<field> <value>`` overrides it.

Sources: a local path, a bundled name (``gpt2_tiny``, ``gpt2_small``: the files in recipes/configs), or
the Hub, ``hf://<owner>/<repo>[/<file>.yaml][@<revision>]`` (see :mod:`hf_fasttrain.hub`; honours
``HF_HUB_OFFLINE`` and the Hub cache). No recipe, from any source, turns on ``trust_remote_code``:
only the user's ``--trust_remote_code true`` does.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import sys
import types
import typing
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

from .args import SIZE_ALIASES, DataArguments, FastTrainingArguments, ModelArguments
from .hub import guard_trust_remote_code, is_hub_uri, resolve_hub_recipe, safe_load_yaml

__all__ = [
    "SECTIONS",
    "BUNDLED_DIR",
    "bundled_recipes",
    "load_recipe",
    "recipe_path",
    "validate_recipe",
    "make_parser",
    "parse_config",
    "resolved_config",
]

# recipe section -> dataclass; None is the top level
SECTIONS: dict[Optional[str], type] = {
    None: FastTrainingArguments,
    "model": ModelArguments,
    "data": DataArguments,
}
BUNDLED_DIR = Path(__file__).resolve().parent.parent / "recipes" / "configs"  # a checkout / editable install
# a wheel installs recipes/configs/*.yaml here (setup.cfg [options.data_files])
INSTALLED_DIR = Path(sys.prefix) / "share" / "hf_fasttrain" / "recipes"


def bundled_recipes() -> dict[str, Path]:
    """Name -> path of the recipes shipped in recipes/configs (the checkout's first, then the installed copies)."""
    found: dict[str, Path] = {}
    for directory in (BUNDLED_DIR, INSTALLED_DIR):
        if directory.is_dir():
            for p in sorted(directory.glob("*.yaml")):
                found.setdefault(p.stem, p)
    return found


def recipe_path(source: str | Path) -> Path:
    """The local file of a recipe: a path, a bundled name, or ``hf://...`` (fetched into the Hub cache)."""
    if is_hub_uri(source):
        return resolve_hub_recipe(str(source))
    path = Path(source)
    if path.is_file():
        return path
    bundled = bundled_recipes()
    if str(source) in bundled:
        return bundled[str(source)]
    raise FileNotFoundError(
        f"recipe {str(source)!r} is neither a file, a bundled recipe nor a hf://<owner>/<repo> URI; "
        f"bundled: {sorted(bundled)}"
    )


def load_recipe(source: str | Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Read a recipe from a local path, a bundled name or ``hf://``; returns the raw mapping (validate
    separately). ``yaml.safe_load`` only; any ``trust_remote_code`` the recipe sets is dropped with a
    warning unless ``trust_remote_code=True`` (the user's own flag)."""
    path = recipe_path(source)
    data = safe_load_yaml(path, source=str(source) if is_hub_uri(source) else str(path), allow_empty=True)
    data, _ = guard_trust_remote_code(data, source=str(source), trust_remote_code=trust_remote_code)
    return data


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints.get(f.name, Any) for f in dataclasses.fields(cls) if f.init}


def _union_members(tp) -> tuple:
    origin = typing.get_origin(tp)
    if origin is Union or (hasattr(types, "UnionType") and isinstance(tp, types.UnionType)):
        return typing.get_args(tp)
    return (tp,)


def _coerce(section: str, key: str, value: Any, tp: Any) -> Any:
    """Check ``value`` against the field type and convert the harmless cases (YAML '1e-5' -> 1e-5)."""
    where = f"{section}.{key}" if section else key
    members = _union_members(tp)
    if value is None:
        if type(None) in members or tp is Any:
            return None
        raise ValueError(f"{where}=None is invalid: a value of type {_type_name(tp)} is required")
    plain = [m for m in members if m is not type(None)]
    if len(plain) != 1:  # unions like `str | bool` or `dict | str`: the Trainer sorts them out
        return value
    (t,) = plain
    origin = typing.get_origin(t) or t
    if t is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "yes", "no"):
            return value.lower() in ("true", "yes")
    elif t is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif t is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
    elif t is str:
        if isinstance(value, str):
            return value
    elif origin in (dict, list, tuple):
        if isinstance(value, (dict, list, tuple)):
            return value
    else:  # enums and other types: the dataclass validates
        return value
    raise ValueError(f"{where}={value!r} is invalid: expected {_type_name(tp)}")


def _type_name(tp) -> str:
    return " | ".join(getattr(m, "__name__", str(m)) for m in _union_members(tp))


def _unknown_key_error(section: Optional[str], key: str, valid: Sequence[str]) -> ValueError:
    where = f"in section '{section}:'" if section else "at the top level"
    msg = f"unknown recipe key '{key}' {where}"
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    if close:
        msg += f"; did you mean '{close[0]}'?"
    for other, cls in SECTIONS.items():
        if other != section and key in _field_types(cls):
            msg += f" ('{key}' belongs {'at the top level' if other is None else f'in the {other}: section'})"
    if section == "model":  # a short section: list it (other attributes of a family go in model_config)
        msg += f"; known: {', '.join(valid)}"
    return ValueError(msg)


def validate_recipe(recipe: Mapping[str, Any]) -> dict[Optional[str], dict[str, Any]]:
    """Split a raw recipe into its sections, rejecting unknown keys and mistyped values."""
    out: dict[Optional[str], dict[str, Any]] = {s: {} for s in SECTIONS}
    top_types = _field_types(SECTIONS[None])
    for key, value in recipe.items():
        if key in SECTIONS and key is not None:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ValueError(f"recipe section '{key}:' must be a mapping, got {type(value).__name__}")
            types_ = _field_types(SECTIONS[key])
            for k, v in value.items():
                if k not in types_:
                    raise _unknown_key_error(key, k, list(types_))
                out[key][k] = _coerce(key, k, v, types_[k])
        else:
            if key not in top_types:
                raise _unknown_key_error(None, key, list(top_types) + ["model", "data"])
            out[None][key] = _coerce("", key, value, top_types[key])
    return out


def make_parser() -> "HfArgumentParser":
    """The command-line parser: ``--config`` plus one flag per field of the three dataclasses."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(
        (ModelArguments, DataArguments, FastTrainingArguments),
        description="Train a causal language model with hf_fasttrain. Options come from --config "
        "(a recipe YAML: path or bundled name) and are overridden by the flags below.",
    )
    parser.add_argument(
        "--config",
        default=None,
        help="Recipe: a YAML path, a bundled name (" + ", ".join(bundled_recipes()) + ") or "
        "hf://<owner>/<repo>[/<file>.yaml][@<revision>]. "
        "Its keys are the option names below; flags given here override it.",
    )
    # Optional fields accept "null" on the command line, to undo a recipe's value.
    optional = set()
    for cls in SECTIONS.values():
        for name, tp in _field_types(cls).items():
            if type(None) in _union_members(tp):
                optional.add(name)
    for action in parser._actions:
        if action.dest in optional and callable(action.type):
            action.type = _nullable(action.type)
    return parser


def _nullable(convert):
    def parse(text):
        if isinstance(text, str) and text.strip().lower() == "null":
            return None
        return convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse's error messages name the type
    return parse


def parse_config(
    argv: Optional[Sequence[str]] = None,
) -> tuple[ModelArguments, DataArguments, FastTrainingArguments]:
    """Recipe (``--config``) first, then command-line overrides; all validated before returning."""
    from transformers.hf_argparser import string_to_bool

    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config", default=None)
    # the user's own flag is the only way trust_remote_code becomes true (a recipe's is dropped)
    pre.add_argument("--trust_remote_code", type=string_to_bool, nargs="?", const=True, default=False)
    ns, _ = pre.parse_known_args(argv)
    parser = make_parser()
    if ns.config is not None:
        sections = validate_recipe(load_recipe(ns.config, trust_remote_code=ns.trust_remote_code))
        defaults = {**sections[None], **sections["model"], **sections["data"]}
        # a size given on the command line under its other spelling (--hidden_size over a recipe's n_embd) wins
        given = {a.split("=", 1)[0][2:].replace("-", "_") for a in (argv if argv is not None else sys.argv[1:])
                 if isinstance(a, str) and a.startswith("--")}
        for short, long in SIZE_ALIASES.items():
            for flag, other in ((short, long), (long, short)):
                if flag in given and other not in given:
                    defaults.pop(other, None)
        parser.set_defaults(**defaults)
        # a recipe may supply what a dataclass would otherwise require on the command line
        for action in parser._actions:
            if action.dest in defaults:
                action.required = False
    outputs = parser.parse_args_into_dataclasses(args=argv)
    model_args, data_args, training_args = outputs[:3]
    return model_args, data_args, training_args


def resolved_config(
    model_args: ModelArguments, data_args: DataArguments, training_args: FastTrainingArguments
) -> dict[str, Any]:
    """A recipe mapping that reproduces these arguments (secrets dropped); saved with every run."""
    from .runinfo import training_config

    return {
        "model": dataclasses.asdict(model_args),
        "data": dataclasses.asdict(data_args),
        **training_config(training_args),
    }
