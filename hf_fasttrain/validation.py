"""One way to refuse bad configuration: :class:`ConfigError` and the range checks of the options.

Every refusal reads ``<field>: <what is wrong>; <what is allowed>``, naming the field as the user wrote
it (the YAML key, the ``--<field>`` flag, the dataclass field). The command line prints it as one line,
``error: <field>: ...``, and exits with status 2.

:data:`TRAINING_RANGES` is the one table of range checks for the numeric training options (the Trainer's
and the package's); :func:`check_ranges` applies it. It runs in ``FastTrainingArguments.__post_init__``
and, on the command line, on the raw recipe and flag values before anything heavy is imported.

This module imports nothing of the package and nothing outside the standard library: cores (schedules,
guard, restarts, ...) raise through it too.

Example:
    >>> from hf_fasttrain.validation import check_ranges
    >>> check_ranges({"learning_rate": 0.0})
    Traceback (most recent call last):
    ...
    hf_fasttrain.validation.ConfigError: learning_rate: got 0.0; must be a finite number > 0
"""

from __future__ import annotations

import difflib
import errno
import math
import os
import tempfile
from typing import Any, Callable, Iterable, Mapping, Optional

__all__ = [
    "ConfigError",
    "check",
    "check_ranges",
    "unknown_name",
    "ALIASES",
    "unknown_recipe_key",
    "argparse_error",
    "check_output_dir",
    "remove_made_folders",
    "TRAINING_RANGES",
    "is_int",
    "finite",
]

_UNSET = object()


class ConfigError(ValueError):
    """A configuration value that is refused: ``<field>: <what is wrong>; <what is allowed>``.

    A ``ValueError``, so code that catches those keeps working. ``field``, ``value`` and ``allowed``
    are kept as attributes for tools that want them.
    """

    def __init__(self, field: str, value: Any = _UNSET, allowed: str = "", problem: Optional[str] = None):
        self.field = field
        self.value = None if value is _UNSET else value
        self.allowed = allowed
        if problem is None:
            problem = "is required" if value is _UNSET else f"got {value!r}"
        self.problem = problem
        super().__init__(f"{field}: {problem}; {allowed}" if allowed else f"{field}: {problem}")

    def renamed(self, names: Mapping[str, str]) -> "ConfigError":
        """This refusal in the words of the options that set its fields: ``names`` maps a function's argument
        (``max_tokens``) to the option a user gives (``max_tokens_per_batch``), in the field and the text.

        Example:
            >>> str(ConfigError("min_tokens", 64, "must be <= max_tokens (32)").renamed(
            ...     {"min_tokens": "batch_warmup_min_tokens", "max_tokens": "max_tokens_per_batch"}))
            'batch_warmup_min_tokens: got 64; must be <= max_tokens_per_batch (32)'
        """
        import re

        if not names:
            return self
        pattern = re.compile(r"\b(" + "|".join(re.escape(k) for k in names) + r")\b")

        def say(text: str) -> str:
            return pattern.sub(lambda m: names[m.group(1)], text)

        return ConfigError(names.get(self.field, self.field), self.value, say(self.allowed), say(self.problem))


def check(cond: bool, field: str, value: Any, allowed: str, problem: Optional[str] = None) -> None:
    """Raise :class:`ConfigError` naming ``field`` unless ``cond``."""
    if not cond:
        raise ConfigError(field, value, allowed, problem)


# Names users bring from other trainers (nanoGPT, TRL, axolotl, the Trainer's own short words) -> the option
# they mean. A suggestion is made only from here or when the name is close to a known one.
ALIASES = {
    "lr": "learning_rate", "learning-rate": "learning_rate", "wd": "weight_decay",
    "bs": "per_device_train_batch_size", "batch_size": "per_device_train_batch_size",
    "micro_batch_size": "per_device_train_batch_size", "train_batch_size": "per_device_train_batch_size",
    "grad_accum": "gradient_accumulation_steps", "gradient_accumulation": "gradient_accumulation_steps",
    "gradient_accumulation_iters": "gradient_accumulation_steps",
    "epochs": "num_train_epochs", "num_epochs": "num_train_epochs",
    "steps": "max_steps", "max_iters": "max_steps", "total_steps": "max_steps", "train_steps": "max_steps",
    "warmup": "warmup_steps", "warmup_iters": "warmup_steps", "warmup_ratio": "warmup_steps",
    "grad_clip": "max_grad_norm", "clip_grad_norm": "max_grad_norm", "clip": "max_grad_norm",
    "beta1": "adam_beta1", "beta2": "adam_beta2", "eps": "adam_epsilon",
    "scheduler": "lr_decay", "lr_scheduler": "lr_decay", "decay_lr": "lr_decay", "schedule": "lr_decay",
    "optim": "optimizer", "opt": "optimizer",
    "model": "model_name_or_path", "model_name": "model_name_or_path", "base_model": "model_name_or_path",
    "dataset_name": "dataset", "data": "dataset", "data_path": "dataset", "tokenizer_name": "tokenizer",
    "seq_len": "block_size", "seq_length": "block_size", "max_seq_length": "block_size", "max_length": "block_size",
    "context_length": "block_size", "sequence_len": "block_size",
    "n_layers": "n_layer", "num_layers": "n_layer", "n_heads": "n_head", "num_heads": "n_head",
    "d_model": "n_embd", "hidden_dim": "n_embd", "ema": "weight_averaging",
    "out": "output_dir", "out_dir": "output_dir", "output": "output_dir",
    "eval_interval": "eval_steps", "log_interval": "logging_steps", "save_interval": "save_steps",
    "dry-run": "dry_run",
}


def unknown_name(kind: str, name: str, known: Iterable[str], where: str = "") -> ConfigError:
    """``<name>: unknown <kind>[ where]; did you mean '<suggestion>'?`` (or the list when nothing is close).

    The suggestion is the option :data:`ALIASES` maps the name to, else the closest known name compared without
    leading dashes (so ``--lr`` is not taken for ``--min_lr``).

    Example:
        >>> str(unknown_name("option", "--lr", ["--learning_rate", "--min_lr"]))
        "--lr: unknown option; did you mean '--learning_rate'?"
        >>> str(unknown_name("option", "--learnig_rate", ["--learning_rate", "--min_lr"]))
        "--learnig_rate: unknown option; did you mean '--learning_rate'?"
    """
    known = list(known)
    bare = {k.lstrip("-"): k for k in known}
    target = ALIASES.get(name.lstrip("-").replace("-", "_")) or ALIASES.get(name.lstrip("-"))
    if target in bare:
        close = [bare[target]]
    else:
        close = [bare[c] for c in difflib.get_close_matches(name.lstrip("-"), list(bare), n=1, cutoff=0.6)]
    if close:
        allowed = f"did you mean '{close[0]}'?"
    elif len(known) <= 12:
        allowed = "known: " + ", ".join(sorted(known))
    else:
        allowed = "see --help for the options"
    return ConfigError(name, problem=f"unknown {kind}{(' ' + where) if where else ''}", allowed=allowed)


def unknown_recipe_key(key: str, section: Optional[str], valid: Iterable[str], home: Any = _UNSET) -> ConfigError:
    """A recipe key that is not a field of its section. ``home``: the section it belongs to (``"model"``,
    ``"data"``, or None for the top level) when it is a key of another section; then the error says where it
    goes, not which name of this section it is closest to (``n_layer`` at the top level is a model key,
    not a misspelt ``min_lr``).

    Example:
        >>> str(unknown_recipe_key("block_size", "model", ["n_layer"], home="data"))
        "block_size: unknown recipe key in section 'model:'; 'block_size' belongs in the data: section"
    """
    where = f"in section '{section}:'" if section else "at the top level"
    if home is not _UNSET:
        place = "at the top level" if home is None else f"in the {home}: section"
        return ConfigError(key, problem=f"unknown recipe key {where}", allowed=f"'{key}' belongs {place}")
    return unknown_name("recipe key", key, valid, where)


_TYPE_WORDS = {"int": "must be an integer", "float": "must be a number"}


def argparse_error(message: str, flags: Iterable[str] = ()) -> ConfigError:
    """An ``argparse`` error message as the one-line :class:`ConfigError` (for ``parser.error``, which would print
    the usage and exit): ``argument --top_k: invalid int value: 'x'`` -> ``top_k: got 'x'; must be an integer``.
    ``flags``: the parser's options, for the did-you-mean of an unrecognized one.

    Example:
        >>> str(argparse_error("argument --weights: invalid choice: 'ema' (choose from 'average', 'iterate')"))
        "weights: got 'ema'; allowed: average, iterate"
        >>> str(argparse_error("unrecognized arguments: --max_new_token 3", ["--max_new_tokens", "--seed"]))
        "--max_new_token: unknown option; did you mean '--max_new_tokens'?"
    """
    import re

    m = re.match(r"argument (?:--)?([\w-]+)(?:/[^:]*)?: (.*)", message)
    if m:
        field, problem = m.group(1), m.group(2)
        bad = re.match(r"invalid (\w+) value: (.*)", problem)
        if bad:
            return ConfigError(field, problem=f"got {bad.group(2)}", allowed=_TYPE_WORDS.get(bad.group(1), f"expected {bad.group(1)}"))
        choice = re.match(r"invalid choice: (.*) \(choose from (.*)\)", problem)
        if choice:
            names = ", ".join(n.strip().strip("'") for n in choice.group(2).split(","))
            return ConfigError(field, problem=f"got {choice.group(1)}", allowed=f"allowed: {names}")
        if problem.startswith("expected one argument"):
            return ConfigError(field, problem="has no value", allowed=f"give --{field} <value>")
        return ConfigError(field, problem=problem)
    m = re.match(r"the following arguments are required: (.*)", message)
    if m:
        first = m.group(1).split(",")[0].strip().lstrip("-")
        return ConfigError(first, problem="is required")
    m = re.match(r"unrecognized arguments: (\S+)", message)
    if m:
        return unknown_name("option", m.group(1).split("=")[0], list(flags))
    return ConfigError("arguments", problem=message)


def check_output_dir(output_dir: Any, field: str = "output_dir") -> Optional[str]:
    """Make ``output_dir`` (and its parents) and check that a file can be written in it; else raise a one-line
    ``ConfigError``: the path is a file, lies under a file, is on a read-only file system, or is not writable.
    Returns the topmost folder it made (None when ``output_dir`` was there): a run refused later removes what it
    made (:func:`remove_made_folders`).

    Runs before any data work, so a run never prepares its data only to fail at its first save.

    Example:
        >>> import tempfile, pathlib
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "notes.txt"; _ = f.write_text("x")
        >>> check_output_dir(f / "run")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        ...
        hf_fasttrain.validation.ConfigError: output_dir: ... is under the file ...; give a folder path ...
    """
    path = os.path.abspath(os.fspath(output_dir))
    allowed = "give a folder path (new or existing) that you can write to"
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(field, problem=f"{path} is a file, not a folder", allowed=allowed)
    parent = os.path.dirname(path)
    while parent and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if parent and not os.path.isdir(parent):
        raise ConfigError(field, problem=f"{path} is under the file {parent}", allowed=allowed)

    def refuse(err: OSError) -> ConfigError:
        if err.errno == errno.EROFS:
            problem = f"{path} is on a read-only file system"
        elif err.errno in (errno.EACCES, errno.EPERM):
            problem = f"{path} is not writable (permission denied)"
        elif err.errno in (errno.ENOTDIR, errno.EEXIST):
            problem = f"{path} is not a folder ({err.strerror})"
        else:
            problem = f"{path} cannot be written ({err.strerror or err})"
        return ConfigError(field, problem=problem, allowed=allowed)

    made = path
    while not os.path.exists(os.path.dirname(made)) and os.path.dirname(made) != made:
        made = os.path.dirname(made)
    made = None if os.path.exists(path) else made
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-check-", dir=path)
        os.close(fd)
        os.remove(probe)
    except OSError as err:
        raise refuse(err) from None
    return made


def remove_made_folders(output_dir: Any, made: Optional[str]) -> None:
    """Remove the folders :func:`check_output_dir` made for ``output_dir`` (up to ``made``, its topmost), where they
    are still empty: a refused run leaves nothing behind. Anything written into them stays."""
    if not made:
        return
    path = os.path.abspath(os.fspath(output_dir))
    while True:
        try:
            os.rmdir(path)
        except OSError:  # not empty (or gone): stop here
            return
        if path == made or os.path.dirname(path) == path:
            return
        path = os.path.dirname(path)


# -- predicates ----------------------------------------------------------------------------------
def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# A rule is (predicate, what is allowed): the text a refusal shows is written where the predicate is.
Rule = tuple[Callable[[Any], bool], str]


def _int_at_least(low: int) -> Rule:
    return lambda v: is_int(v) and v >= low, f"must be an integer >= {low}"


def _number_above(low: float) -> Rule:
    return lambda v: finite(v) and v > low, f"must be a finite number > {low}"


def _number_at_least(low: float) -> Rule:
    return lambda v: finite(v) and v >= low, f"must be a finite number >= {low}"


def _unit_interval(low: str, high: str) -> Rule:
    """Between 0 and 1; `low` "[" or "(" and `high` "]" or ")" say whether that end is allowed."""
    return (lambda v: finite(v) and (v >= 0 if low == "[" else v > 0) and (v <= 1 if high == "]" else v < 1),
            f"must be in {low}0, 1{high}")


def _optional(rule: Rule) -> Rule:
    pred, allowed = rule
    return lambda v: v is None or pred(v), f"{allowed} or null"


def _noted(rule: Rule, note: str) -> Rule:
    return rule[0], f"{rule[1]} {note}"


def _steps_or_fraction(v: Any) -> bool:
    """An interval in steps (integer >= 1) or, as the Trainer allows, a fraction of the run in (0, 1)."""
    return (is_int(v) and v >= 1) or (finite(v) and 0 < v < 1) or (finite(v) and v >= 1 and float(v).is_integer())


_INTERVAL: Rule = (_steps_or_fraction, "must be an integer >= 1 (or a fraction of the run in (0, 1))")

# field -> (predicate, what is allowed). Fields missing from the values checked are skipped. Choices
# (names such as optimizer or clip_mode) are checked by the part that owns the list of names.
TRAINING_RANGES: dict[str, Rule] = {
    # run length and batch
    "max_steps": (lambda v: is_int(v) and (v >= 1 or v == -1),
                  "must be an integer >= 1 (or -1, the default, to train for num_train_epochs)"),
    "num_train_epochs": _number_above(0),
    "per_device_train_batch_size": _int_at_least(1),
    "per_device_eval_batch_size": _int_at_least(1),
    "gradient_accumulation_steps": _int_at_least(1),
    # optimizer
    "learning_rate": _number_above(0),
    "weight_decay": _number_at_least(0),
    "adam_beta1": _unit_interval("[", ")"),
    "adam_beta2": _unit_interval("[", ")"),
    "adam_epsilon": _number_above(0),
    "max_grad_norm": _noted(_number_at_least(0), "(0 turns norm clipping off)"),
    "warmup_steps": (_number_at_least(0)[0], "must be a number >= 0 (steps, or a fraction < 1 of the run)"),
    # intervals
    "save_steps": _INTERVAL,
    "eval_steps": (lambda v: v is None or _steps_or_fraction(v),
                   "must be an integer >= 1, a fraction of the run in (0, 1), or null (= logging_steps)"),
    "logging_steps": _INTERVAL,
    "save_total_limit": _noted(_optional(_int_at_least(1)), "(keep all)"),
    # misc
    "seed": _int_at_least(0),
    "data_seed": _optional(_int_at_least(0)),
    "dataloader_num_workers": _int_at_least(0),
    # hf_fasttrain's own numeric options
    "mfu_peak_tflops": _optional(_number_above(0)),
    "clip_value": _number_above(0),
    "agc_lambda": _number_above(0),
    "guard_spike_sigma": _number_above(0),
    "guard_snapshot_every": _int_at_least(1),
    "guard_spike_window": _int_at_least(2),
    "guard_max_rollbacks": _int_at_least(0),
    "guard_grad_norm_ceiling": _optional(_number_above(0)),
    "restart_stop_at_step": _optional(_int_at_least(1)),
    "restart_max_concurrent": _optional(_int_at_least(1)),
    "warmup_start_factor": _unit_interval("[", "]"),
    "min_lr": _optional(_number_at_least(0)),
    "min_lr_ratio": _optional(_unit_interval("[", "]")),
    "decay_fraction": _optional(_unit_interval("(", "]")),
}


def check_ranges(values: Mapping[str, Any], table: Mapping[str, Rule] = TRAINING_RANGES) -> None:
    """Check every field of ``values`` that ``table`` knows; the first bad one raises :class:`ConfigError`."""
    for name, (ok, allowed) in table.items():
        if name in values:
            value = values[name]
            try:
                good = bool(ok(value))
            except TypeError:
                good = False
            if not good:
                raise ConfigError(name, value, allowed)
