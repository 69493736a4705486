"""Recipes: YAML files whose keys are exactly the config field names.

Layout of a recipe (see recipes/configs/gpt2_tiny.yaml)::

    model:            # ModelArguments fields
      n_layer: 2
    peft:             # the LoRA fields of ModelArguments (lora_r, lora_alpha, ...), optional
      lora_r: 8
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
import functools
import logging
import os
import re
import sys
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence, Union

import yaml

from .model_data_args import PEFT_FIELDS, SIZE_ALIASES, DataArguments, ModelArguments
from .options import RECIPE_DEFAULTS, check_duplicate_keys, find_recipes
from ..validation import ConfigError, unknown_name, unknown_recipe_key
from .args import FastTrainingArguments
from ..hub import YAML_SUFFIXES, is_hub_uri, resolve_hub_recipe

__all__ = [
    "SECTIONS",
    "BUNDLED_DIR",
    "bundled_recipes",
    "load_recipe",
    "recipe_path",
    "validate_recipe",
    "check_duplicate_keys",
    "make_parser",
    "parse_config",
    "resolved_config",
    "RECIPE_MAX_BYTES",
    "RecipeYAMLError",
    "safe_load_yaml",
    "guard_trust_remote_code",
]

logger = logging.getLogger(__name__)

# recipe section -> dataclass; None is the top level
SECTIONS: dict[Optional[str], type] = {
    None: FastTrainingArguments,
    "model": ModelArguments,
    "data": DataArguments,
}
BUNDLED_DIR = Path(__file__).resolve().parents[2] / "recipes" / "configs"  # a checkout / editable install
# a wheel installs recipes/configs/*.yaml here (setup.cfg [options.data_files])
INSTALLED_DIR = Path(sys.prefix) / "share" / "hf_fasttrain" / "recipes"


# ---------------------------------------------------------------------------------------------
# Safe YAML and the trust_remote_code guard: every recipe source goes through both
# ---------------------------------------------------------------------------------------------

# A recipe is a few dozen lines; anything much larger is not a recipe (and is not parsed).
RECIPE_MAX_BYTES = 1 << 20


class RecipeYAMLError(ValueError):
    """A recipe's YAML text is not plain data (bad syntax, a Python tag, not a mapping, too large)."""


def _yaml_error(source: str, err: yaml.YAMLError) -> RecipeYAMLError:
    mark = getattr(err, "problem_mark", None)
    where = f"{source}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else source
    problem = getattr(err, "problem", None) or str(err)
    tag = re.search(r"tag '([^']*)'", problem) if isinstance(err, yaml.constructor.ConstructorError) else None
    if tag is not None:
        shown = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        return RecipeYAMLError(
            f"config: {where}: not a plain YAML mapping: YAML tag {shown!r} is not allowed in a recipe (recipes are data, "
            "read with yaml.safe_load; nothing was executed); allowed: mappings, lists, strings, numbers, booleans "
            "and null: remove the tag"
        )
    return RecipeYAMLError(f"config: {where}: not valid YAML ({problem}); allowed: a YAML mapping of option names "
                           "to values")


def safe_load_yaml(path_or_text: str | os.PathLike, *, source: str | None = None, allow_empty: bool = False) -> dict:
    """Read a recipe with ``yaml.safe_load`` and return its top-level mapping.

    ``path_or_text`` is a file when it is a ``Path``/``PathLike``, or a string with no newline that
    names an existing file or ends in ``.yaml``/``.yml``; any other string is YAML text.
    Python tags (``!!python/object/apply:...``) are refused by ``safe_load`` before any object is
    built, so nothing executes; the error names the tag, line and column.

    An empty document (or only comments) is an error, or ``{}`` with ``allow_empty=True``.

    Raises:
        RecipeYAMLError: bad YAML, a non-data tag, more than ``RECIPE_MAX_BYTES``, an empty document,
            a top level that is not a mapping, or a top-level key that is not a string.
        FileNotFoundError: a path that does not exist.

    Example:
        ```python
        >>> safe_load_yaml("learning_rate: 0.0006\\nmodel:\\n  n_layer: 2\\n")
        {'learning_rate': 0.0006, 'model': {'n_layer': 2}}
        ```
    """
    is_path = isinstance(path_or_text, os.PathLike) or (
        isinstance(path_or_text, str)
        and "\n" not in path_or_text
        and (os.path.isfile(path_or_text) or path_or_text.endswith(YAML_SUFFIXES))
    )
    if is_path:
        path = Path(path_or_text)
        source = source or str(path)
        if not path.is_file():
            raise FileNotFoundError(f"config: {str(path)!r} does not exist; allowed: a YAML path, a bundled name or "
                                    "hf://<owner>/<repo>")
        size = path.stat().st_size
        if size > RECIPE_MAX_BYTES:
            raise RecipeYAMLError(f"config: {source}: {size} bytes; allowed: a recipe of at most {RECIPE_MAX_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    elif isinstance(path_or_text, str):
        text = path_or_text
        source = source or "<recipe text>"
        if len(text.encode("utf-8")) > RECIPE_MAX_BYTES:
            raise RecipeYAMLError(f"config: {source}: too large; allowed: a recipe of at most {RECIPE_MAX_BYTES} bytes")
    else:
        raise TypeError(f"safe_load_yaml expects a path or YAML text, got {type(path_or_text).__name__}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise _yaml_error(source, err) from None
    if data is None and allow_empty:
        return {}
    if data is None:
        raise RecipeYAMLError(f"config: {source}: the recipe is empty; allowed: a mapping of option names to values")
    if not isinstance(data, dict):
        raise RecipeYAMLError(
            f"config: {source}: the top level is a {type(data).__name__}; allowed: a mapping of option names to values"
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise RecipeYAMLError(f"config: {source}: top-level keys {bad!r}; allowed: option names (strings)")
    return data


# ---------------------------------------------------------------------------------------------
# trust_remote_code
# ---------------------------------------------------------------------------------------------


def guard_trust_remote_code(
    recipe: Mapping[str, Any], *, source: str, trust_remote_code: bool = False
) -> tuple[dict, list[str]]:
    """Drop every ``trust_remote_code`` a recipe sets, unless the user allowed it.

    :func:`load_recipe` applies this to every recipe source (path, bundled name,
    ``hf://``): ``trust_remote_code`` comes from the user's command line only.

    Looks at any depth (top level, ``model:``, ``data:``, nested kwargs). A key set to ``false``
    is harmless and kept. With ``trust_remote_code=True`` (the user's own command-line flag) the
    recipe is returned unchanged.

    Returns:
        ``(recipe_copy, dropped)`` where ``dropped`` lists the dotted keys removed, e.g.
        ``["model.trust_remote_code"]``; a ``UserWarning`` names them.

    Example:
        ```python
        >>> r, dropped = guard_trust_remote_code({"model": {"trust_remote_code": True}}, source="hf://a/b")
        >>> r, dropped
        ({'model': {}}, ['model.trust_remote_code'])
        ```
    """
    dropped: list[str] = []

    def walk(node: Any, prefix: str) -> Any:
        if isinstance(node, Mapping):
            out = {}
            for key, value in node.items():
                dotted = f"{prefix}{key}"
                if key == "trust_remote_code" and value is not False and not trust_remote_code:
                    dropped.append(dotted)
                    continue
                out[key] = walk(value, dotted + ".")
            return out
        if isinstance(node, list):
            return [walk(v, f"{prefix[:-1]}[{i}].") for i, v in enumerate(node)]
        return node

    cleaned = walk(recipe, "")
    if dropped:
        msg = (
            f"{source} sets {', '.join(dropped)}; a recipe never enables trust_remote_code by itself, "
            "so it was ignored. If you trust that code, pass --trust_remote_code true yourself."
        )
        warnings.warn(msg, UserWarning, stacklevel=2)
        logger.warning(msg)
    return cleaned, dropped


# ---------------------------------------------------------------------------------------------
# Sources: path, bundled name, hf://
# ---------------------------------------------------------------------------------------------


def bundled_recipes() -> dict[str, Path]:
    """Name -> path of the recipes shipped in recipes/configs (the checkout's first, then the installed copies)."""
    return find_recipes((BUNDLED_DIR, INSTALLED_DIR))


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
        f"config: got {str(source)!r}, which is neither a file, a bundled recipe nor a hf:// URI; allowed: a YAML "
        f"path, a bundled name ({', '.join(sorted(bundled))}) or hf://<owner>/<repo>"
    )


def load_recipe(source: str | Path, *, trust_remote_code: bool = False) -> dict[str, Any]:
    """Read a recipe from a local path, a bundled name or ``hf://``; returns the raw mapping (validate
    separately). ``yaml.safe_load`` only; any ``trust_remote_code`` the recipe sets is dropped with a
    warning unless ``trust_remote_code=True`` (the user's own flag)."""
    path = recipe_path(source)
    data = safe_load_yaml(path, source=str(source) if is_hub_uri(source) else str(path), allow_empty=True)
    check_duplicate_keys(path.read_text(encoding="utf-8"), str(source) if is_hub_uri(source) else str(path))
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
    if is_null_word(value) and _null_switches_off(key, tp):  # YAML `none` / `None` (a string) as the YAML null
        value = None
    if value is None:
        if type(None) in members or tp is Any:
            return None
        raise ConfigError(where, None, _type_rule(tp))
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
    raise ConfigError(where, value, _type_rule(tp))


_TYPE_RULES = {"int": "must be an integer", "float": "must be a number", "bool": "must be true or false",
               "str": "must be a string", "dict": "must be a mapping", "list": "must be a list"}


def _type_rule(tp) -> str:
    """What a value of type ``tp`` must be, in words (``must be a number``; ``or null`` for an Optional)."""
    members = _union_members(tp)
    plain = [m for m in members if m is not type(None)]
    names = [getattr(typing.get_origin(m) or m, "__name__", str(m)) for m in plain]
    rule = " or ".join(_TYPE_RULES.get(n, f"must be of type {n}").replace("must be ", "") for n in names)
    return f"must be {rule}" + (" or null" if type(None) in members else "")


def _unknown_key_error(section: Optional[str], key: str, valid: Sequence[str]) -> ConfigError:
    for other, cls in SECTIONS.items():
        if other != section and key in _field_types(cls):
            return unknown_recipe_key(key, section, valid, home=other)
    err = unknown_recipe_key(key, section, valid)
    if section == "model" and not err.allowed.startswith("known:"):
        # a short section: list it (other attributes of a family go in model_config)
        err = ConfigError(key, problem=err.problem, allowed=f"{err.allowed}; known: {', '.join(valid)}")
    return err


def validate_recipe(recipe: Mapping[str, Any]) -> dict[Optional[str], dict[str, Any]]:
    """Split a raw recipe into its sections, rejecting unknown keys and mistyped values."""
    out: dict[Optional[str], dict[str, Any]] = {s: {} for s in SECTIONS}
    top_types = _field_types(SECTIONS[None])
    for key, value in recipe.items():
        if key == "peft":  # the LoRA fields of the model: section, grouped
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError("peft", problem=f"a {type(value).__name__}, not a mapping",
                                  allowed="a mapping of LoRA keys, e.g. peft: {lora_r: 8}")
            model_types = _field_types(ModelArguments)
            for k, v in value.items():
                if k not in PEFT_FIELDS:
                    if k in model_types:
                        raise unknown_recipe_key(k, "peft", list(PEFT_FIELDS), home="model")
                    raise _unknown_key_error("peft", k, list(PEFT_FIELDS))
                out["model"][k] = _coerce("peft", k, v, model_types[k])
            continue
        if key in SECTIONS and key is not None:
            if value is None:
                continue
            if not isinstance(value, dict):
                raise ConfigError(key, problem=f"a {type(value).__name__}, not a mapping",
                                  allowed=f"a mapping of {key} keys, e.g. {key}: {{{'n_layer: 2' if key == 'model' else 'block_size: 128'}}}")
            types_ = _field_types(SECTIONS[key])
            for k, v in value.items():
                if k not in types_:
                    raise _unknown_key_error(key, k, list(types_))
                out[key][k] = _coerce(key, k, v, types_[k])
        else:
            if key not in top_types:
                raise _unknown_key_error(None, key, list(top_types) + ["model", "data", "peft"])
            out[None][key] = _coerce("", key, value, top_types[key])
    return out


def _raise_usage_error(message: str):
    """argparse's error(), which prints the 170-line usage and exits, as a one-line ConfigError instead."""
    from ..validation import argparse_error

    raise argparse_error(message)


def make_parser(prog: Optional[str] = None) -> "HfArgumentParser":
    """The command-line parser: ``--config`` plus one flag per field of the three dataclasses.
    Its errors raise ``ValueError`` (one line) instead of printing the usage and exiting."""
    from transformers import HfArgumentParser

    parser = HfArgumentParser(
        (ModelArguments, DataArguments, FastTrainingArguments),
        prog=prog,
        allow_abbrev=False,  # a prefix (--max_step) is a did-you-mean error, never a silent match
        description="Train a causal language model with hf_fasttrain. Options come from --config "
        "(a recipe YAML: path or bundled name) and are overridden by the flags below.",
    )
    parser.error = _raise_usage_error  # type: ignore[method-assign]
    parser.add_argument(
        "--config",
        default=None,
        help="Recipe: a YAML path, a bundled name (" + ", ".join(bundled_recipes()) + ") or "
        "hf://<owner>/<repo>[/<file>.yaml][@<revision>]. "
        "Its keys are the option names below; flags given here override it.",
    )
    # the recipe's own defaults (auto_resume on), with argparse's --no_<field> for each bool among them
    parser.set_defaults(**RECIPE_DEFAULTS)
    known = {s for a in parser._actions for s in a.option_strings}
    for name, value in RECIPE_DEFAULTS.items():
        if value is True and f"--no_{name}" not in known:
            parser.add_argument(f"--no_{name}", action="store_false", dest=name, help=f"Turn {name} off.")
    # Optional fields accept none / None / null on the command line, to switch off a recipe's value.
    optional = {name for section in SECTIONS for name, tp in _field_types(SECTIONS[section]).items()
                if _null_switches_off(name, tp)}
    for action in parser._actions:
        if action.dest in optional and callable(action.type):
            action.type = _nullable(action.type)
            if action.help and NULL_HELP not in action.help:
                action.help = f"{action.help.rstrip()} {NULL_HELP}"
    return parser


NULL_WORDS = ("none", "null")  # compared lower-case: none, None, NONE, null, Null ...
NULL_HELP = "(none or null: off)"


@functools.lru_cache(maxsize=None)
def _trainer_fields() -> frozenset:
    from transformers import TrainingArguments

    return frozenset(f.name for f in dataclasses.fields(TrainingArguments))


def _null_switches_off(name: str, tp: Any) -> bool:
    """Whether none / None / null mean "off" (None) for this field: an optional field, unless it is one of the
    Trainer's that takes strings (``report_to: none`` is the Trainer's own word, not a null)."""
    members = _union_members(tp)
    if type(None) not in members:
        return False
    return name not in _trainer_fields() or str not in members


def is_null_word(value: Any) -> bool:
    """Whether ``value`` is a word that switches an optional option off: none, None, null (any case)."""
    return isinstance(value, str) and value.strip().lower() in NULL_WORDS


def _nullable(convert):
    def parse(text):
        if is_null_word(text):
            return None
        return convert(text)

    parse.__name__ = getattr(convert, "__name__", "value")  # argparse's error messages name the type
    return parse


def parse_config(
    argv: Optional[Sequence[str]] = None,
) -> tuple[ModelArguments, DataArguments, FastTrainingArguments]:
    """Recipe (``--config``) first, then command-line overrides; all validated before returning."""
    from transformers.hf_argparser import string_to_bool

    pre = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    pre.add_argument("--config", default=None)
    # the user's own flag is the only way trust_remote_code becomes true (a recipe's is dropped)
    pre.add_argument("--trust_remote_code", type=string_to_bool, nargs="?", const=True, default=False)
    ns, _ = pre.parse_known_args(argv)
    parser = make_parser()
    _check_flags(argv if argv is not None else sys.argv[1:], parser)
    if ns.config is not None:
        sections = validate_recipe(load_recipe(ns.config, trust_remote_code=ns.trust_remote_code))
        defaults = {**sections[None], **sections["model"], **sections["data"]}
        # a run always has its own folder: runs/<recipe name> unless the recipe or a flag says otherwise
        defaults.setdefault("output_dir", str(Path("runs") / _recipe_stem(ns.config)))
        # a size given on the command line under its other spelling (--hidden_size over a recipe's n_embd) wins
        given = {a.split("=", 1)[0][2:].replace("-", "_") for a in (argv if argv is not None else sys.argv[1:])
                 if isinstance(a, str) and a.startswith("--")}
        # so does a run length given on the command line in the other unit (--max_steps over a recipe's max_tokens)
        for short, long in (*SIZE_ALIASES.items(), ("max_steps", "max_tokens")):
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
    from ..data.streaming import check_stream_args  # what a stream cannot do, refused before any data is read

    check_stream_args(data_args, training_args)
    return model_args, data_args, training_args


def _recipe_stem(source: str) -> str:
    """A run name from a recipe source: ``gpt2_tiny``, ``my.yaml`` -> ``my``, ``hf://o/r@rev`` -> ``r``."""
    text = str(source).split("@")[0].rstrip("/")
    if is_hub_uri(text):
        text = text[len("hf://"):].split("/")[-1]  # the repo's name, or the config file's in it
    return Path(text).stem or "run"


def _check_flags(argv: Sequence[str], parser) -> None:
    """An unknown ``--flag`` gets the same did-you-mean as an unknown recipe key; a prefix of a flag is unknown
    too (``--max_step`` is not taken as ``--max_steps``)."""
    known = {s for a in parser._actions for s in a.option_strings if s.startswith("--")} | {"--config"}
    for tok in argv:
        if tok.startswith("--") and tok != "--":
            key = tok.split("=", 1)[0]
            if key not in known:
                raise unknown_name("option", key, sorted(known))


def resolved_config(
    model_args: ModelArguments, data_args: DataArguments, training_args: FastTrainingArguments
) -> dict[str, Any]:
    """A recipe mapping that reproduces these arguments (secrets dropped); saved with every run."""
    from ..runinfo import training_config

    model = dataclasses.asdict(model_args)
    peft = {k: model.pop(k) for k in PEFT_FIELDS}
    return {
        "model": model,
        **({"peft": peft} if peft["lora_r"] is not None else {}),
        "data": dataclasses.asdict(data_args),
        **training_config(training_args),
    }
