"""The command line's fast path: the option list, ``--help`` and early refusals without importing torch.

Importing torch and transformers takes seconds; a typo or a bad value should not wait for them. This
module reads the option list (names, types, defaults, help, technique groups) from the *source* of
``hf_fasttrain/config/args.py``, ``hf_fasttrain/config/model_data_args.py`` and the installed
``transformers/training_args.py`` with :mod:`ast` (nothing is imported or executed), and with it:

- renders the grouped ``--help`` (:func:`render_help`),
- refuses unknown flags and recipe keys with a did-you-mean, keys written twice in one YAML mapping, and
  out-of-range numbers (:func:`preflight`), with the same :class:`~hf_fasttrain.validation.ConfigError`
  the full validation raises.

It is only a fast path: whatever it accepts is validated again, completely, by the dataclasses. When the
sources cannot be read (an unusual install), :func:`load_schema` returns ``None`` and callers skip it.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import re
import textwrap
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from ._recipe_files import load_local_recipe, check_duplicate_keys, config_source, default_recipe_dirs, find_recipes
from ..validation import TRAINING_RANGES, ConfigError, check_ranges, unknown_name, unknown_recipe_key

__all__ = ["RECIPE_DEFAULTS", "Option", "load_schema", "find_recipes", "default_recipe_dirs", "preflight", "render_help",
           "check_duplicate_keys", "split_flags", "choices", "allowed_values",
           "config_source", "format_default", "first_sentence", "flag_names"]

_PKG = Path(__file__).resolve().parent.parent  # the package root
MISSING = object()

# The headline options, in the order a new user reaches for them: (group title, Trainer options shown with the
# group). Every other group follows in the order of args.py, then the run's Trainer options, model, peft, data.
HEADLINE = (
    ("Run length", ("max_steps",)),
    ("Optimizer by name", ("learning_rate", "weight_decay")),
    ("LR schedule", ("warmup_steps",)),
    ("Sequence length", ("per_device_train_batch_size", "gradient_accumulation_steps")),
    ("Stability", ("max_grad_norm",)),
    ("Weight averaging", ()),
)
# group -> heading shown (the source's comment titles are the modules' names)
GROUP_TITLES = {"Run length": "run length (optimizer steps or tokens)", "Optimizer by name": "optimizer", "LR schedule": "lr schedule",
                "Sequence length": "batching and sequence length", "Stability": "stability: clipping and the guard",
                "Weight averaging": "weight averaging"}
# a Trainer option's help where the package gives it a sharper meaning
TRAINER_HELP = {"max_steps": "The run's length in optimizer steps (every technique counts these); overrides "
                             "num_train_epochs; max_tokens gives the length in tokens instead"}
# Where the recipe and ``hf-fasttrain train`` differ from FastTrainingArguments' defaults: a stopped run continues
# when its command runs again (in a script, FastTrainingArguments keeps the Trainer's fresh start)
RECIPE_DEFAULTS = {"auto_resume": True}
# the run's Trainer options shown in the short help (all of them: --help-all)
TRAINER_ESSENTIALS = ("output_dir", "eval_steps", "save_steps", "logging_steps", "seed")
# options whose allowed names live in a module of the package: field -> (module file, constant); the names are
# read from there (a registry's keys, a tuple of modes), so a new optimizer or schedule shows up by itself
CHOICES = {
    "optimizer": ("optim/registry.py", "OPTIMIZERS"),
    "lr_decay": ("schedules.py", "DECAY_SHAPES"),
    "schedule_unit": ("schedules.py", "SCHEDULE_UNITS"),
    "clip_mode": ("stability/clipping.py", "CLIP_MODES"),
    "guard_rollback": ("stability/guard.py", "ROLLBACK_MODES"),
    "weight_averaging": ("stability/averaging.py", "AveragingMode"),
    "precision": ("stability/precision.py", "PRECISIONS"),
    "packing": ("data/from_args.py", "PACKING_MODES"),
    "curriculum_pacing": ("data/seqlen.py", "PACINGS"),
    "seq_len_warmup_pacing": ("data/seqlen.py", "PACINGS"),
    "seq_len_warmup_mode": ("data/seqlen.py", "SEQ_LEN_MODES"),
    "restart_direction": ("restarts/config.py", "DIRECTIONS"),
    "restart_vary": ("restarts/config.py", "VARY"),
    "restart_backend": ("restarts/config.py", "BACKENDS"),
    "data_format": ("config/model_data_args.py", "DATA_FORMATS"),
}
# choices checked in place (no constant to read)
INLINE_CHOICES = {"restart_parallel": ("no", "per_gpu")}


def _in_section(opt: "Option", key: str) -> bool:
    """Whether ``opt`` is a key of recipe section ``key``: ``peft:`` holds the LoRA fields of the model."""
    if key == "peft":
        return opt.section == "model" and opt.name.startswith("lora_")
    return opt.section == key and not (key == "model" and opt.name.startswith("lora_"))


@dataclasses.dataclass(frozen=True)
class Option:
    name: str
    section: Optional[str]  # "model", "data" or None (top level)
    annotation: str
    default: Any
    help: str
    group: str
    trainer: bool = False  # a transformers.TrainingArguments field

    @property
    def kind(self) -> str:
        """'bool', 'int', 'float', 'str' or 'other' (Optional[...] / '| None' stripped)."""
        parts = [p.strip() for p in re.split(r"\||,", re.sub(r"^Optional\[(.*)\]$", r"\1", self.annotation))]
        parts = [p for p in parts if p not in ("None", "")]
        if len(parts) == 1 and parts[0] in ("bool", "int", "float", "str"):
            return parts[0]
        return "other"


# -- reading the sources -------------------------------------------------------------------------
def _literal(node: Optional[ast.AST]) -> Any:
    if node is None:
        return MISSING
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return MISSING


def _field_call(value: Optional[ast.AST]) -> tuple[Any, str, bool]:
    """(default, help, init) of a ``field(...)`` call, or of a plain default."""
    if isinstance(value, ast.Call) and getattr(value.func, "id", getattr(value.func, "attr", "")) == "field":
        kw = {k.arg: k.value for k in value.keywords if k.arg}
        help_text = ""
        meta = kw.get("metadata")
        if isinstance(meta, ast.Dict):
            for k, v in zip(meta.keys, meta.values):
                if _literal(k) == "help":
                    h = _literal(v)
                    help_text = h if isinstance(h, str) else ""
        init = _literal(kw.get("init")) is not False
        default = _literal(kw["default"]) if "default" in kw else MISSING
        return default, help_text, init
    return _literal(value), "", True


def _class_fields(tree: ast.Module, source: str, cls_name: str, section: Optional[str], trainer: bool
                  ) -> list[Option]:
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == cls_name:
            break
    else:
        return []
    out = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            if name.startswith("_"):
                continue
            default, help_text, init = _field_call(stmt.value)
            if not init:
                continue
            group = _group_above(lines, stmt.lineno, node.lineno)
            out.append(Option(name, section, ast.unparse(stmt.annotation), default, " ".join(help_text.split()),
                              group, trainer))
    return out


_GROUP_RE = re.compile(r"^\s*# -+ (.+?) -+\s*$")


def _group_above(lines: Sequence[str], lineno: int, class_lineno: int) -> str:
    """The nearest ``# --- Title (...) ---`` comment above line ``lineno`` inside the class."""
    for i in range(lineno - 2, class_lineno - 1, -1):
        m = _GROUP_RE.match(lines[i])
        if m:
            title = m.group(1)
            title = re.split(r" \(|:", title)[0].strip()
            return title
    return ""


def _transformers_training_args() -> Optional[Path]:
    import importlib.util

    spec = importlib.util.find_spec("transformers")  # a top-level find_spec imports nothing
    for base in (spec.submodule_search_locations or []) if spec else []:
        p = Path(base) / "training_args.py"
        if p.is_file():
            return p
    return None


@functools.lru_cache(maxsize=1)
def load_schema() -> Optional[dict[str, Option]]:
    """Every command-line option by name (ours override the Trainer's), or None if a source is unreadable."""
    try:
        ours = {name: (_PKG / name).read_text(encoding="utf-8") for name in ("config/model_data_args.py", "config/args.py")}
        tpath = _transformers_training_args()
        if tpath is None:
            return None
        theirs = tpath.read_text(encoding="utf-8")
        our_trees, their_tree = {name: ast.parse(text) for name, text in ours.items()}, ast.parse(theirs)
    except (OSError, SyntaxError, ValueError):
        return None
    schema: dict[str, Option] = {}
    for opt in _class_fields(their_tree, theirs, "TrainingArguments", None, trainer=True):
        schema[opt.name] = dataclasses.replace(opt, group="Trainer", help=TRAINER_HELP.get(opt.name, opt.help))
    for cls, section, name in (("ModelArguments", "model", "config/model_data_args.py"),
                               ("DataArguments", "data", "config/model_data_args.py"),
                               ("FastTrainingArguments", None, "config/args.py")):
        for opt in _class_fields(our_trees[name], ours[name], cls, section, trainer=False):
            if section is not None:
                opt = dataclasses.replace(opt, group=section)
            if opt.name in RECIPE_DEFAULTS:  # the command line's default
                opt = dataclasses.replace(opt, default=RECIPE_DEFAULTS[opt.name])
            schema[opt.name] = opt
    # a sanity check on what was read: if it fails, the fast path steps aside
    if not all(n in schema for n in ("output_dir", "learning_rate", "max_steps", "n_layer", "block_size",
                                     "optimizer")):
        return None
    return schema


# -- flags -----------------------------------------------------------------------------------------
_BOOL_WORDS = ("true", "false", "yes", "no", "1", "0", "t", "f", "y", "n")


def flag_names(schema: Mapping[str, Option]) -> dict[str, str]:
    """Flag (without dashes) -> field, including argparse's ``--no_<field>`` for bools that default to True."""
    names = {n: n for n in schema}
    for n, opt in schema.items():
        if opt.kind == "bool" and opt.default is True:
            names[f"no_{n}"] = n
    return names


def split_flags(argv: Sequence[str], schema: Mapping[str, Option], extra: Sequence[str] = ()
                ) -> list[tuple[str, list[str]]]:
    """``[(field, [values])]`` from ``--field value`` / ``--field=value`` / ``--flag``; an unknown flag
    (not a field, not in ``extra``; a prefix of one is unknown too) raises the did-you-mean ConfigError."""
    names = flag_names(schema)
    out: list[tuple[str, list[str]]] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        i += 1
        if not tok.startswith("--") or tok == "--":
            continue  # a stray value: argparse reports it
        key, eq, inline = tok[2:].partition("=")
        if key not in extra:
            key = key.replace("-", "_")  # HfArgumentParser accepts --n-layer for --n_layer too
        if key in extra:
            field = key
        elif key in names:
            field = names[key]
        else:  # a prefix of a flag too: --max_step is a mistake, not --max_steps
            raise unknown_name("option", f"--{key}", [f"--{n}" for n in names] + [f"--{e}" for e in extra])
        values: list[str] = []
        if eq:
            values.append(inline)
        else:
            opt = schema.get(field)
            while i < len(argv) and not argv[i].startswith("--"):
                if opt is not None and opt.kind == "bool" and (values or argv[i].lower() not in _BOOL_WORDS):
                    break
                values.append(argv[i])
                i += 1
        out.append((field, values))
    return out


def _no_auto_lr() -> str:
    """Why ``learning_rate: auto`` is refused, in the measured figures of the lr law's leave-one-out check."""
    from .budget import learning_rate_law_check

    def miss(r):
        return max(r["ratio"], 1 / r["ratio"])

    adamw = max(miss(r) for r in learning_rate_law_check("adamw"))
    longest = max(learning_rate_law_check("muon"), key=lambda r: r["tokens_per_param"])
    return (f"'auto' is not offered: the measured lr law missed points left out of its fit by up to {adamw:.2g}x "
            f"for AdamW and by {miss(longest):.2g}x for Muon's longest run (see the schedules page, 'Settings by "
            f"run length')")


def _number(field: str, value: Any, kind: str) -> Any:
    """A range-checked field's raw value as the number it means (YAML '1e-5', CLI '300')."""
    if isinstance(value, str):
        text = value.strip()
        if text.lower() in ("null", "none") :
            return None
        if field == "learning_rate" and text.lower() == "auto":
            raise ConfigError(field, value, "give the peak lr as a number (each bundled recipe has its swept one)",
                              problem=_no_auto_lr())
        try:
            return int(text) if kind == "int" else float(text)
        except ValueError:
            raise ConfigError(field, value, "must be an integer" if kind == "int" else "must be a number") from None
    if kind == "float" and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _misplaced_key(key: str, section: Optional[str], known: Sequence[str], schema: Mapping[str, Option]
                   ) -> ConfigError:
    """An unknown key of a recipe section: where it belongs when it is another section's, else did-you-mean."""
    if key in schema and schema[key].section != section:
        return unknown_recipe_key(key, section, known, home=schema[key].section)
    return unknown_recipe_key(key, section, known)


def preflight(argv: Sequence[str], extra_flags: Sequence[str] = ("config", "help-all", "debug")
              ) -> Optional[dict[str, Any]]:
    """Refuse what can be refused before importing torch: unknown flags and recipe keys, keys written
    twice, out-of-range numbers (recipe values with the flags on top). Returns the merged raw values of
    the range-checked fields, or None when the option list could not be read (nothing was checked)."""
    schema = load_schema()
    if schema is None:
        return None
    flags = split_flags(argv, schema, extra=extra_flags)
    values: dict[str, Any] = {}
    config = [v for f, v in flags if f == "config"]
    if config and config[-1]:
        recipe = load_local_recipe(config[-1][0])
        for key, value in (recipe or {}).items():
            if key in ("model", "data", "peft") and isinstance(value, dict):
                known = [n for n, o in schema.items() if _in_section(o, key) or (key == "model" and o.section == key)]
                for k, v in value.items():
                    if k not in known:
                        raise _misplaced_key(str(k), key, known, schema)
                    values[k] = v
            elif key in schema and schema[key].section is None:
                values[key] = value
            else:
                known = [n for n, o in schema.items() if o.section is None] + ["model", "data", "peft"]
                raise _misplaced_key(str(key), None, known, schema)
    for field, vals in flags:
        if field in schema and vals:
            values[field] = vals[0] if len(vals) == 1 else vals
    checked = {}
    for field, value in values.items():
        if field in TRAINING_RANGES and field in schema:
            kind = schema[field].kind
            if kind in ("int", "float") or (kind == "other" and field in ("eval_steps", "save_total_limit",
                                                                            "data_seed", "mfu_peak_tflops")):
                kind = kind if kind != "other" else ("int" if field in ("save_total_limit", "data_seed") else "float")
                checked[field] = _number(field, value, kind)
    check_ranges(checked)
    return checked


# -- help ------------------------------------------------------------------------------------------
def format_default(v: Any) -> str:
    if v is MISSING:
        return ""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


# a sentence ends at '.' or ';' and a space, except after an abbreviation (e.g., i.e., et al.)
_SENTENCE_END = re.compile(r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\bal\.)(?<=[.;])\s")


def first_sentence(text: str) -> str:
    """The first sentence of a help text, whole (the short help wraps it; it never cuts one mid-phrase).

    >>> first_sentence("Pick one. More text.")
    'Pick one'
    >>> first_sentence("Warmup (Li et al. 2022) for rows, e.g. text. More.")
    'Warmup (Li et al. 2022) for rows, e.g. text'
    >>> first_sentence("Optimizer by name ('adamw', 'lion', 'ademamix', 'soap', 'muon')")
    "Optimizer by name ('adamw', 'lion', 'ademamix', 'soap', 'muon')"
    >>> first_sentence("Rows (cut to fit; then padded) of one length. More.")
    'Rows (cut to fit; then padded) of one length'
    """
    text = text.strip()
    for end in _SENTENCE_END.finditer(text):  # the first end outside brackets
        head = text[:end.start()]
        if sum(head.count(c) for c in "([{") <= sum(head.count(c) for c in ")]}"):
            return head.rstrip(".;")
    return text.rstrip(".;")


def wrap_row(head: str, text: str, col: int, width: int) -> list[str]:
    """``head`` padded to ``col``, then ``text`` wrapped at word boundaries to ``width`` (continuation lines
    indented to ``col``); a head longer than the column gets a line of its own."""
    indent = " " * col
    out = [head] if len(head) > col - 1 else []
    body = textwrap.wrap(" ".join(text.split()), width - col, break_on_hyphens=False, break_long_words=False) or [""]
    out.append((indent if out else f"{head:<{col}}") + body[0])
    return out + [indent + b for b in body[1:]]


@functools.lru_cache(maxsize=None)
def _read_names(module: str, constant: str) -> Optional[tuple[str, ...]]:
    """The string keys of a dict, or the strings of a tuple or a ``Literal[...]``, assigned to ``constant`` in a
    package module's source (read with :mod:`ast`; nothing is imported); None when it cannot be read."""
    try:
        tree = ast.parse((_PKG / module).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        else:
            continue
        if not (isinstance(target, ast.Name) and target.id == constant):
            continue
        if isinstance(value, ast.Dict):
            items = value.keys
        elif isinstance(value, (ast.Tuple, ast.List)):
            items = value.elts
        elif isinstance(value, ast.Subscript) and isinstance(value.value, ast.Name) and value.value.id == "Literal":
            items = value.slice.elts if isinstance(value.slice, ast.Tuple) else [value.slice]  # Literal["a", "b"]
        else:
            return None
        names = tuple(v for v in (_literal(k) for k in items) if isinstance(v, str))
        return names or None
    return None


def choices(name: str) -> Optional[tuple[str, ...]]:
    """The names option ``name`` accepts (``optimizer``: the optimizer registry's), or None for a free value.

    >>> "muon" in choices("optimizer") and "cosine" in choices("lr_decay")
    True
    """
    if name in INLINE_CHOICES:
        return INLINE_CHOICES[name]
    spec = CHOICES.get(name)
    return _read_names(*spec) if spec else None


def _optional(opt: Option) -> bool:
    return "None" in opt.annotation or opt.annotation.startswith("Optional[")


def allowed_values(opt: Option) -> str:
    """What option ``opt`` accepts, in full: its names, true | false, its range, or its type.

    >>> schema = load_schema()
    >>> allowed_values(schema["clip_mode"]), allowed_values(schema["divergence_guard"])
    ('norm | value | agc | none', 'true | false')
    >>> allowed_values(schema["learning_rate"])
    'a finite number > 0'
    """
    names = choices(opt.name)
    if names is not None:
        text = " | ".join(names)
        return text + " | null" if _optional(opt) and "none" not in names else text
    if opt.kind == "bool":
        return "true | false"
    if opt.name in TRAINING_RANGES:
        return TRAINING_RANGES[opt.name][1].removeprefix("must be ")
    interval = re.search(r"\bin ([\[(][-\d.]+, [-\d.]+[\])])", opt.help)  # "in (0, 1)" in the help text
    if interval and opt.kind in ("int", "float"):
        text = f"{'an integer' if opt.kind == 'int' else 'a number'} in {interval.group(1)}"
    elif "dict" in opt.annotation:
        text = "a mapping (YAML) or a JSON string"
    else:
        text = {"int": "an integer", "float": "a number", "str": "a string"}.get(opt.kind)
        if text is None:  # a Trainer field of a union type: its own words
            text = re.sub(r"^Optional\[(.*)\]$", r"\1", opt.annotation).replace("Union[", "").rstrip("]")
            text = " | ".join(p.strip() for p in text.split(",") if p.strip() != "None") if "," in text else text
            text = text.replace(" | None", "")
    return f"{text} or null" if _optional(opt) else text


USAGE_LINES = ("usage: hf-fasttrain train [--config RECIPE] [--<option> VALUE ...]",
               "   or: python recipes/gpt2_small.py [--config RECIPE] [--<option> VALUE ...]")


def render_help(description: str, recipe: Optional[Mapping[str, Any]] = None, recipe_name: Optional[str] = None,
                width: int = 100, full: bool = False) -> Optional[str]:
    """The ``--help`` of ``hf-fasttrain train`` and ``recipes/gpt2_small.py`` (one text for both): description,
    ``--config``, then every option of the package with its allowed values in full, the headline options first
    (optimizer, lr schedule, batching, stability, weight averaging), the run's essential Trainer options, the
    model, peft and data sections; the recipe's values as the defaults shown. ``full`` (``--help-all``): the same
    groups in the same order, every help text whole, and every Trainer option."""
    schema = load_schema()
    if schema is None:
        return None
    values: dict[str, Any] = {}
    for key, value in (recipe or {}).items():
        if key in ("model", "data", "peft") and isinstance(value, dict):
            values.update(value)
        else:
            values[key] = value
    col = 34
    lines = [*USAGE_LINES, ""]
    lines += textwrap.wrap(description, width) + [""]
    bundled = ", ".join(find_recipes(default_recipe_dirs()))
    lines += textwrap.wrap(f"a YAML path, hf://<owner>/<repo> or a bundled name ({bundled}); without it: gpt2_small "
                           "on a GPU, gpt2_tiny on CPU", width, initial_indent=f"  {'--config RECIPE':<{col - 2}}",
                           subsequent_indent=" " * col)
    lines += [
        f"  {'--dry_run':<{col - 2}}print the resolved options and their sources; write nothing",
        f"  {'--help-all':<{col - 2}}this list with whole help texts, and every Trainer option"
        if not full else f"  {'--help':<{col - 2}}the same list, first sentences only, the run's main Trainer options",
        f"  {'--debug':<{col - 2}}a refusal shows its traceback (or HF_FASTTRAIN_DEBUG=1)",
    ]
    indent = " " * col

    def row(opt: Option) -> list[str]:
        dv = values.get(opt.name, opt.default)
        tag = f" [{format_default(dv)}]" if format_default(dv) else ""
        out = wrap_row(f"  --{opt.name}", f"{opt.help if full else first_sentence(opt.help)}{tag}", col, width)
        out += textwrap.wrap(f"values: {allowed_values(opt)}", width, initial_indent=indent, subsequent_indent=indent + "  ",
                             break_on_hyphens=False)
        return out

    def section(title: str, opts: list[Option]) -> None:
        if opts:
            lines.extend(["", f"{title}:"])
            for o in opts:
                lines.extend(row(o))

    off = ("Every option is also a recipe key; one that can be off (null) is switched off with none, None or "
           "null, e.g. --seq_len_warmup_min none.")
    if recipe_name:
        lines += [""] + textwrap.wrap(f"Values in [brackets] are recipe {recipe_name}'s. {off}", width)
    else:
        lines += [""] + textwrap.wrap("Values in [brackets] are the built-in defaults; a run without --config "
                                      f"takes its recipe's (see --help --config gpt2_tiny). {off}", width)
    groups: dict[str, list[Option]] = {}
    for o in schema.values():
        if o.section is None and not o.trainer:  # a run's length in tokens beside its length in steps
            groups.setdefault("Run length" if o.name == "max_tokens" else (o.group or "Other"), []).append(o)
    pulled = {name for _, names in HEADLINE for name in names}
    for title, trainer_names in HEADLINE:
        opts = [schema[n] for n in trainer_names if n in schema] + groups.get(title, [])
        section(GROUP_TITLES.get(title, title), opts)
    # the other groups in the order of args.py; single-option groups share one heading
    merged: list[tuple[str, list[Option], bool]] = []
    heads = {t for t, _ in HEADLINE}
    for title, opts in groups.items():
        if title in heads:
            continue
        if len(opts) == 1 and merged and merged[-1][2]:
            merged[-1] = (f"{merged[-1][0]}, {title.lower()}", merged[-1][1] + opts, True)
        else:
            merged.append((title, opts, len(opts) == 1))
    for title, opts, _ in merged:
        section(title, opts)
    if full:
        trainer = [o for o in schema.values() if o.trainer and o.section is None and o.name not in pulled]
        section("run (every other transformers.TrainingArguments option)", trainer)
    else:
        section("run (Trainer options; all of them: --help-all)", [schema[n] for n in TRAINER_ESSENTIALS if n in schema])
    for name in ("model", "peft", "data"):
        title = "peft (LoRA adapters on a frozen model_name_or_path; recipe section peft:)" if name == "peft" else name
        section(title, [o for o in schema.values() if _in_section(o, name)])
    return "\n".join(lines) + "\n"
