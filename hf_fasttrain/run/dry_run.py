"""``--dry_run``: the options a run would train with, and where each value came from, without the run.

The recipe is resolved as a run resolves it (``--config`` as a path, a bundled name or ``hf://``, then the
flags), validated by the same dataclasses, and ``budget_aware`` is applied with the run's own rule (its length in
tokens per non-embedding parameter, the model counted on the meta device: no weights are allocated). The result is
printed as YAML, the mapping a run saves as ``config.yaml``, each option followed by a comment naming its source:

    learning_rate: 0.016  # recipe
    max_steps: 20  # flag
    lr_decay: cosine  # budget_aware

The run's own checks come first, as in the run: its data plan (a token budget sets ``max_steps``) and the
comparison with a checkpoint already in ``output_dir``, its options and then its plan field by field, so a rerun
the run would refuse (a changed lr, a longer ``max_steps`` where the schedule spans the run, another global batch)
is refused here in the same line. Nothing is written: no
output_dir, no tokenizer, no data is read.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

__all__ = ["SOURCES", "dry_run", "option_sources", "render"]

#: where a value came from
SOURCES = ("default", "recipe", "flag", "budget_aware", "derived")


def _given_flags(argv: Sequence[str]) -> set[str]:
    """The options set by a flag (``--no_<field>`` counts for ``<field>``)."""
    from ..config.options import flag_names, load_schema, split_flags

    schema = load_schema()
    if schema is None:  # no fast path: the flags as written
        return {a[2:].split("=", 1)[0].replace("-", "_") for a in argv if a.startswith("--")}
    names = flag_names(schema)
    return {names.get(f, f) for f, _ in split_flags(argv, schema, extra=("config", "dry_run", "debug"))}


def _recipe_keys(source: Optional[str]) -> set[str]:
    """The options a recipe sets (its sections' keys included)."""
    if not source:
        return set()
    from ..config.recipes import load_recipe

    keys: set[str] = set()
    for key, value in load_recipe(source).items():
        if key in ("model", "data", "peft") and isinstance(value, dict):
            keys.update(value)
        else:
            keys.add(key)
    return keys


def _non_embedding_parameters(model_args, data_args) -> int:
    """The non-embedding parameters of the run's model, as ``budget_aware`` counts them, built on the meta device."""
    import torch

    from ..config.budget import non_embedding_parameters

    with torch.device("meta"):  # shapes only: no memory for the weights, nothing initialised
        if model_args.model_name_or_path:
            from transformers import AutoConfig, AutoModelForCausalLM

            config = AutoConfig.from_pretrained(model_args.model_name_or_path,
                                                trust_remote_code=model_args.trust_remote_code)
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=model_args.trust_remote_code)
        else:
            from ..modeling import build_model

            model = build_model(model_args, _Vocabulary(data_args.vocab_size), data_args.block_size)
    return non_embedding_parameters(model)


class _Vocabulary:
    """What building a decoder from scratch reads of a tokenizer: its length and special ids (the non-embedding
    parameters, all that budget_aware counts, do not depend on them)."""

    bos_token_id = eos_token_id = 0
    pad_token_id = None

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


def run_plan(model_args, data_args, training_args, data_plan):
    """The run's plan as a run makes it (:class:`~hf_fasttrain.config.plan.RunPlan` of its data plan), with
    ``budget_aware``'s step when it is on (the model counted on the meta device, once the run's length is known)."""
    from ..config.plan import RunPlan

    plan = RunPlan.from_args(training_args, data=data_plan)
    if training_args.budget_aware:  # refuses (one line) before the model is built when the length is unknown
        plan = plan.with_budget(training_args, lambda: _non_embedding_parameters(model_args, data_args))
    return plan


def _field_defaults() -> dict[str, Any]:
    """Option -> its dataclass default, as the saved config writes values."""
    import dataclasses

    from ..config.args import DataArguments, FastTrainingArguments, ModelArguments
    from ..runinfo import plain_value

    out = {}
    for cls in (ModelArguments, DataArguments, FastTrainingArguments):
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                value = f.default
            elif f.default_factory is not dataclasses.MISSING:
                value = f.default_factory()
            else:
                continue
            out[f.name] = plain_value(getattr(value, "value", value))
    return out


def option_sources(config: Mapping[str, Any], argv: Sequence[str], budget: Sequence[str] = ()) -> dict[str, str]:
    """Option -> where its value came from: ``flag``, ``budget_aware``, ``recipe``, ``default``, or ``derived``
    (not given, and set from other options when the arguments were built: ``precision`` sets bf16, a size key
    its other spelling, a recipe's name the output_dir).

    A budget_aware setting wins over the flag or recipe value it replaced (the run trains with the measured one).
    """
    from ..config.model_data_args import SIZE_ALIASES
    from ..config.options import config_source

    flags, recipe = _given_flags(argv), _recipe_keys(config_source(argv))
    for short, long in SIZE_ALIASES.items():  # n_layer and num_hidden_layers are one option
        for given in (flags, recipe):
            if short in given or long in given:
                given.update((short, long))
    # a run length given by a flag in one unit drops the recipe's in the other (parse_config): that one is derived
    replaced = {other for one, other in (("max_steps", "max_tokens"), ("max_tokens", "max_steps"))
                if one in flags and other not in flags and other in recipe}
    defaults = _field_defaults()
    out = {}
    for section, values in config.items():
        names = values if isinstance(values, dict) and section in ("model", "peft", "data") else {section: values}
        for name, value in names.items():
            if name in budget:
                out[name] = "budget_aware"
            elif name in replaced:
                out[name] = "derived"
            elif name in flags:
                out[name] = "flag"
            elif name in recipe:
                out[name] = "recipe"
            else:
                out[name] = "default" if name not in defaults or defaults[name] == value else "derived"
    return out


def render(config: Mapping[str, Any], sources: Mapping[str, str]) -> str:
    """``config`` as YAML, each option followed by ``# <source>``: ``yaml.safe_load`` of the text is ``config``."""
    import yaml

    def dump(key: str, value: Any, indent: str) -> list[str]:
        text = yaml.safe_dump({key: value}, default_flow_style=True, sort_keys=False, width=1 << 20)
        text = text.strip()[1:-1]  # '{key: value}' -> 'key: value', one line whatever the value
        return [f"{indent}{text}  # {sources.get(key, 'default')}"]

    lines = ["# the resolved options; after each, where its value came from: "
             "default, recipe, flag, budget_aware or derived (set from other options)"]
    for key, value in config.items():
        if isinstance(value, dict) and key in ("model", "peft", "data"):
            lines.append(f"{key}:")
            for k, v in value.items():
                lines += dump(k, v, "  ")
        else:
            lines += dump(key, value, "")
    return "\n".join(lines) + "\n"


def dry_run(argv: Sequence[str]) -> tuple[dict[str, Any], dict[str, str]]:
    """Resolve and validate the options of ``argv`` (without ``--dry_run``) as a run would; returns the config a
    run saves (``config.yaml``) and each option's source. Writes nothing."""
    from ..resume_identity import check_resumed_plan
    from ..config.recipes import parse_config, resolved_config
    from ..data.front import run_data
    from ._resume import resume_plan

    model_args, data_args, training_args = parse_config(list(argv))
    # the run's own steps before any work: its data plan (a token budget sets max_steps) and the comparison with
    # a checkpoint in output_dir (a rerun the run refuses is refused here, in the same line)
    data = run_data(data_args, model_args, training_args)
    options = resolved_config(model_args, data.args, training_args)
    decision = None
    if not training_args.overwrite_output_dir:  # which discards the old run: nothing to compare, nothing deleted
        decision = resume_plan(training_args, options, data.plan)
    plan = run_plan(model_args, data_args, training_args, data.plan)
    if decision is not None and decision.checkpoint:  # the run's plan against the checkpoint's, as the run compares
        check_resumed_plan(decision.checkpoint, plan.as_dict(), options, training_args.output_dir)
    config = resolved_config(model_args, data.args, plan.arguments(training_args))  # budget_aware's values
    return config, option_sources(config, argv, list(plan.budget["settings"]) if plan.budget else [])
