"""Docs that cannot rot: README.md and docs/ are checked against the code.

- Every Python block runs, alone, in a fresh interpreter (a subprocess in a temporary working directory,
  offline). A marker, an HTML comment on the line before the fence (only blank lines may sit between,
  invisible on GitHub and on the site), changes that:

      <!-- test: run continue -->          continues the file's previous Python block (the page says so):
                                            the two run together, in one interpreter
      <!-- test: run slow -->              marked slow (a block that calls `.train(` is slow anyway);
                                            requires=trl: skipped without that package
      <!-- test: skip REASON -->           not run, for the reason given (a Hub download, a run's folder)
      <!-- test: recipe -->                a YAML recipe, validated as `--config` would validate it

  A block that only includes a file (`--8<-- "examples/x.py"`) is that file, which has its own test.
- docs/options.md lists every option with its default; they must match the dataclasses both ways.
- Inline names that look like options or package objects must exist; relative links and their anchors
  must resolve; the README stays short, its Layout names what is there, and its headline table and the
  benchmarks page quote benchmarks/results/time_to_loss.md exactly.
- The `>>>` examples in the docstrings of the public API run (doctest).
"""

from __future__ import annotations

import dataclasses
import doctest
import importlib
import math
import os
import re
import unicodedata
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
MARKER = re.compile(r"^\s*<!--\s*test:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)(.*)$")


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for path in sorted(DOCS.rglob("*.md")):
        rel = path.relative_to(DOCS).parts
        if rel[0] in ("_incoming", "results"):  # drafts of other branches; results/ is benchmark output
            continue
        files.append(path)
    return files


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


# Text that documents another branch's work before it is merged sits between
#     <!-- needs: hf_fasttrain.stability.guard -->  ...  <!-- /needs -->
# and is checked (names, links, snippets) only once that module or attribute exists; text that a merge
# will make wrong sits between <!-- until: NAME --> ... <!-- /until --> and is checked only while NAME
# does not exist. Both markers are invisible on GitHub and on the site.
REGION = re.compile(r"^\s*<!--\s*(needs|until):\s*([\w.]+)\s*-->\s*$")
REGION_END = re.compile(r"^\s*<!--\s*/(needs|until)\s*-->\s*$")
_RESOLVES: dict[str, bool] = {}


def resolves(target: str) -> bool:
    """Whether `a.b.c` names an importable module or an attribute of one."""
    if target not in _RESOLVES:
        parts, found = target.split("."), False
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            found = True
            for attr in parts[cut:]:
                if not hasattr(obj, attr):
                    found = False
                    break
                obj = getattr(obj, attr)
            break
        _RESOLVES[target] = found
    return _RESOLVES[target]


def region_of_lines(path: Path) -> list[str | None]:
    """For each line: None where it is checked, else the reason it is not (a branch not merged yet)."""
    out, region = [], None
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = REGION.match(line)
        if m:
            assert region is None, f"{rel(path)}:{number}: regions do not nest"
            kind, target = m.groups()
            live = resolves(target) if kind == "needs" else not resolves(target)
            region = (kind, None if live else f"{kind} {target}")
            out.append(region[1])
            continue
        if REGION_END.match(line):
            assert region is not None, f"{rel(path)}:{number}: region end without a start"
            out.append(region[1])
            region = None
            continue
        out.append(region[1] if region else None)
    assert region is None, f"{rel(path)}: region not closed"
    return out


def checked_text(path: Path) -> str:
    """The file with the lines of inactive regions blanked (line numbers kept)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return "\n".join("" if why else line for line, why in zip(lines, region_of_lines(path)))


# ------------------------------------------------------------------------------------------------
# Code blocks
# ------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    directive: str | None  # the marker's text, None when unmarked
    inactive: str | None = None  # why it is not checked yet (see REGION), None when it is

    @property
    def where(self) -> str:
        return f"{rel(self.path)}:{self.line}"


def extract_blocks(path: Path) -> list[Block]:
    """Every fenced block of a Markdown file, with the marker that precedes it (if any)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    regions = region_of_lines(path)
    blocks, pending, i = [], None, 0
    while i < len(lines):
        line = lines[i]
        m = MARKER.match(line)
        if m:
            if pending is not None:
                raise AssertionError(f"{rel(path)}:{pending[1]}: marker not followed by a code block")
            pending = (m.group(1), i + 1)
            i += 1
            continue
        f = FENCE.match(line)
        if f:
            indent, ticks, lang = f.group(1), f.group(2), f.group(3)
            body, j = [], i + 1
            while j < len(lines) and not re.match(rf"^\s*{re.escape(ticks)}\s*$", lines[j]):
                text = lines[j]
                body.append(text[len(indent):] if text.startswith(indent) else text.lstrip())
                j += 1
            blocks.append(Block(path, i + 1, lang, "\n".join(body) + "\n", pending[0] if pending else None,
                                regions[i]))
            pending, i = None, j + 1
            continue
        if pending is not None and line.strip():
            raise AssertionError(f"{rel(path)}:{pending[1]}: marker not followed by a code block")
        i += 1
    if pending is not None:
        raise AssertionError(f"{rel(path)}:{pending[1]}: marker at the end of the file")
    return blocks


def parse_directive(text: str | None) -> dict:
    out = {"kind": "run", "continue": False, "slow": False, "requires": None, "skip": None}
    if text is None:
        return out
    words = text.split()
    if not words or words[0] not in ("run", "recipe", "skip"):
        raise AssertionError(f"unknown test marker {text!r}: use 'run ...', 'skip REASON' or 'recipe'")
    out["kind"] = words[0]
    if words[0] == "skip":
        if len(words) < 3:
            raise AssertionError(f"test marker {text!r}: say why the block cannot run (a few words)")
        out["skip"] = " ".join(words[1:])
        return out
    for word in words[1:]:
        if word in ("continue", "slow"):
            out[word] = True
        elif word.startswith("requires="):
            out["requires"] = word[9:]
        else:
            raise AssertionError(f"unknown word {word!r} in test marker {text!r}")
    return out


def all_blocks() -> list[Block]:
    return [b for path in markdown_files() for b in extract_blocks(path)]


INCLUDE = re.compile(r'^--8<--\s+"([^"]+)"\s*$')
# The files a docs block may include instead of showing code, each run by its own test below.
TESTED_INCLUDES = {"examples/switch_trainer.py": "test_the_switch_trainer_example_runs"}


def run_chains() -> list[list[tuple[Block, dict]]]:
    """Every Python block, grouped: a `continue` block joins the chain before it in the same file."""
    chains: list[list[tuple[Block, dict]]] = []
    for block in all_blocks():
        d = parse_directive(block.directive)
        if d["kind"] == "recipe":
            continue
        if block.lang not in ("python", "py"):
            assert block.directive is None, f"{block.where}: only python blocks can run, not {block.lang!r}"
            continue
        include = INCLUDE.match(block.code.strip())
        if include:
            assert include.group(1) in TESTED_INCLUDES, f"{block.where}: includes {include.group(1)}, which no test runs"
            continue
        if d["continue"]:
            assert chains and chains[-1][0][0].path == block.path, f"{block.where}: 'continue' with no block before"
            chains[-1].append((block, d))
        else:
            chains.append([(block, d)])
    return chains


def _chain_param(chain):
    marks = []
    # an example that trains a model runs in the slow tier; the others (imports, settings, checks) in the unit tier
    if any(d["slow"] for _, d in chain) or any(".train(" in block.code for block, _ in chain):
        marks.append(pytest.mark.slow)
    return pytest.param(chain, id=chain[0][0].where, marks=marks)


# Runs the blocks of one chain, in order, in one namespace, each compiled under its page and line.
_DRIVER = """
import json, sys
ns = {"__name__": "__main__"}
for where, code in json.load(sys.stdin):
    exec(compile(code, where, "exec"), ns)
"""


@pytest.mark.parametrize("chain", [_chain_param(c) for c in run_chains()])
def test_doc_snippet_runs(chain, tmp_path):
    """Each Python block runs as pasted into a fresh interpreter (with the blocks it says it continues)."""
    import json
    import subprocess
    import sys

    first, d0 = chain[0]
    if first.inactive:
        # every branch is merged: a snippet whose module is missing is documentation of code that is not there
        pytest.fail(f"{first.where}: {first.inactive}; the snippet documents code that does not exist")
    for block, d in chain:
        if d["skip"]:
            assert block is first and len(chain) == 1, f"{block.where}: a skipped block cannot be continued"
            pytest.skip(f"{block.where}: {d['skip']}")
        if d["requires"]:
            pytest.importorskip(d["requires"])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_DISABLED": "true", "PYTHONPATH": str(ROOT),
           "TOKENIZERS_PARALLELISM": "false"}
    payload = json.dumps([(block.where, block.code) for block, _ in chain])
    done = subprocess.run([sys.executable, "-c", _DRIVER], input=payload, text=True, capture_output=True,
                          cwd=tmp_path, env=env, timeout=900)
    assert done.returncode == 0, f"{first.where} fails as pasted:\n{done.stderr[-3000:]}"


def test_every_python_block_is_run_or_says_why():
    """The runner sees every Python block: each is in a chain, and the few it skips give their reason."""
    blocks = [b for b in all_blocks() if b.lang in ("python", "py") and not INCLUDE.match(b.code.strip())]
    chained = {block.where for chain in run_chains() for block, _ in chain}
    assert {b.where for b in blocks} == chained
    skipped = [c[0][0].where for c in run_chains() if c[0][1]["skip"]]
    assert len(skipped) <= 3, f"skipped blocks: {skipped}"
    where = {c[0][0].path.name for c in run_chains()}
    assert {"README.md", "getting-started.md", "any-trainer.md", "optimizers.md", "schedules.md", "api.md"} <= where


def test_directives_parse():
    assert parse_directive(None) == {"kind": "run", "continue": False, "slow": False, "requires": None, "skip": None}
    assert parse_directive("run continue slow")["continue"] and parse_directive("run continue slow")["slow"]
    assert parse_directive("skip needs a Hub download")["skip"] == "needs a Hub download"
    for bad in ("run setup=tiny", "skip", "runs"):
        with pytest.raises(AssertionError):
            parse_directive(bad)


def test_recipe_blocks_validate():
    from hf_fasttrain.config.recipes import validate_recipe

    blocks = [b for b in all_blocks() if parse_directive(b.directive)["kind"] == "recipe"]
    assert blocks, "no recipe block marked in the docs"
    for block in blocks:
        if not block.inactive:
            validate_recipe(yaml.safe_load(block.code))  # raises naming an unknown key or a bad value


# The branches whose documentation waits in needs/until regions, by the name that shows they are merged.
PENDING = {
    "hf_fasttrain.validation": "cli",
    "hf_fasttrain.wiring": "dropin",
    "hf_fasttrain.stability.guard": "guard",
    "hf_fasttrain.run.push": "reshape",
    "hf_fasttrain.optim.muon.ns_coefficient_schedule": "sharded",
    "hf_fasttrain.stability.averaging": "faster",
    "hf_fasttrain.modeling.check_model_type": "scaling",
    "benchmarks.transfer": "transfer",
}


def test_regions_name_known_branches_and_until_regions_go_once_merged():
    """A misspelt target would hide its text from every check forever; an `until` region whose branch is
    merged holds text that is now wrong (it still shows on the site): delete it."""
    problems = []
    for path in markdown_files():
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = REGION.match(line)
            if not m:
                continue
            kind, target = m.groups()
            if target not in PENDING:
                problems.append(f"{rel(path)}:{number}: {kind}: {target} is not in PENDING {sorted(PENDING)}")
            elif kind == "until" and resolves(target):
                problems.append(f"{rel(path)}:{number}: branch {PENDING[target]} is merged ({target} exists): "
                                f"delete this until-region, whose text it made wrong")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------
# Options
# ------------------------------------------------------------------------------------------------


def own_fields() -> dict[str, dict[str, dataclasses.Field]]:
    from transformers import TrainingArguments

    from hf_fasttrain.config.args import DataArguments, FastTrainingArguments, ModelArguments

    base = {f.name for f in dataclasses.fields(TrainingArguments)}
    return {
        "FastTrainingArguments option": {f.name: f for f in dataclasses.fields(FastTrainingArguments) if f.name not in base},
        "model: key": {f.name: f for f in dataclasses.fields(ModelArguments)},
        "data: key": {f.name: f for f in dataclasses.fields(DataArguments)},
    }


def option_tables(text: str) -> dict[str, dict[str, str]]:
    """{table kind: {option: default cell}} from the tables of docs/options.md."""
    tables: dict[str, dict[str, str]] = {}
    kind = None
    for line in text.splitlines():
        if not line.startswith("|"):
            kind = None
            continue
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        if kind is None:
            kind = cells[0]
            if kind.endswith(("option", "key")):  # an option table (not the table of what a rerun may change)
                tables.setdefault(kind, {})
            continue
        if set(cells[0]) <= set("-: ") or kind not in tables:
            continue
        m = re.fullmatch(r"`([a-z_0-9]+)`", cells[0])
        assert m, f"docs/options.md: option cell {cells[0]!r} is not a `name`"
        assert m.group(1) not in tables[kind], f"docs/options.md: {m.group(1)} listed twice"
        tables[kind][m.group(1)] = cells[1]
    return tables


def _default(field: dataclasses.Field):
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


# docs/options.md is generated from the dataclasses (names, defaults, help texts), grouped by the
# `# --- Group ---` comments of FastTrainingArguments; `python tests/test_docs.py --write-options` rewrites it.
CARDS = {
    "Throughput logging": "runs.md#what-fasttrainer-logs",
    "Precision": "techniques/precision-and-scale.md",
    "Run management": "runs.md",
    "LR schedule": "techniques/schedules.md",
    "Sequence length": "techniques/sequence-length.md",
    "Stability": "techniques/stability.md",
    "Random restart": "techniques/random-restart.md",
    "Optimizer by name": "techniques/optimizers.md",
}
OPTIONS_INTRO = """# All options

Every option hf_fasttrain adds to `transformers.TrainingArguments`, grouped by technique. Each is a
field of `FastTrainingArguments`, a recipe key of the same name (top level), and a command-line flag
`--<name> <value>` of `recipes/gpt2_small.py` and `hf-fasttrain train`. Every `TrainingArguments`
field works as usual beside them; with all of these at their defaults `FastTrainer` behaves as
`transformers.Trainer`. Defaults are written as in YAML (`null` for None); the texts are the fields'
`--help` texts.

This page is generated from the dataclasses (`python tests/test_docs.py --write-options`), and
`tests/test_docs.py` fails when it is out of date.
"""


def _yaml_value(value) -> str:
    if value is dataclasses.MISSING:
        return "required"
    text = yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
    return "`" + text.removesuffix("\n...").strip() + "`"


def _markdown_text(text: str) -> str:
    """Plain help text as Markdown: `<` outside inline code escaped (`checkpoint-<step>` is not an HTML tag).

    >>> _markdown_text("saves checkpoint-<step> if x >= 1 (see `a<b>`)")
    'saves checkpoint-&lt;step> if x >= 1 (see `a<b>`)'
    """
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the parts outside backticks
        parts[i] = parts[i].replace("<", "&lt;")
    return "`".join(parts)


def _option_rows(fields) -> str:
    rows = []
    for f in fields:
        help_text = _markdown_text(" ".join(str(f.metadata.get("help", "")).split()).replace("|", "\\|"))
        rows.append(f"| `{f.name}` | {_yaml_value(_default(f))} | {help_text} |")
    return "\n".join(rows)


def _option_groups() -> list[tuple[str, list[dataclasses.Field]]]:
    """FastTrainingArguments' own fields in source order, grouped by the `# --- Title ---` comments."""
    import inspect

    from hf_fasttrain.config.args import FastTrainingArguments

    own = own_fields()["FastTrainingArguments option"]
    group_of, title = {}, "Other"
    for line in inspect.getsource(FastTrainingArguments).splitlines():
        m = re.match(r"^\s+# ---\s*(.+?)\s*-*\s*$", line)
        if m:
            title = re.split(r" \(|:", m.group(1))[0].strip()
            continue
        m = re.match(r"^    (\w+)\s*:", line)
        if m and m.group(1) in own:
            group_of[m.group(1)] = title
    groups: dict[str, list[dataclasses.Field]] = {}
    for name, f in own.items():
        groups.setdefault(group_of.get(name, "Other"), []).append(f)
    return list(groups.items())


def _rerun_section() -> str:
    """What a rerun into an output_dir with a checkpoint may change: hf_fasttrain.resume_identity's one table."""
    from hf_fasttrain.resume_identity import MAY_CHANGE_ON_RESUME

    by_reason: dict[str, list[str]] = {}
    for name, reason in MAY_CHANGE_ON_RESUME.items():
        by_reason.setdefault(reason, []).append(f"`{name}`")
    rows = "\n".join(f"| {', '.join(names)} | {reason} |" for reason, names in by_reason.items())
    return ("## What a rerun may change\n\n"
            "A run resumes from the last checkpoint of its output_dir with `auto_resume`: on by default in the recipe "
            "and `hf-fasttrain train`, and `auto_resume=True` in a script (with the default, `FastTrainer.train()` "
            "starts fresh as the Trainer does, unless given `resume_from_checkpoint`). It first compares its options "
            "with those the checkpoint holds (`run_options.json`; an older checkpoint: the output_dir's "
            "`config.yaml`). The options below are applied and recorded: a new logging, evaluation or save cadence "
            "is the one the resumed run keeps. Any other difference (lr, schedule, optimizer and its kwargs, batch, "
            "model, data, seeds, ...) is refused before any work, in one line naming each field with its old and new "
            "value: use a new `--output_dir`, or `--overwrite_output_dir` to discard the old run. `--dry_run` makes "
            "the same comparison. A longer or shorter `max_steps` (or `max_tokens`) continues the run only when "
            "nothing is laid out over its length (a constant lr, a warmup given in steps, no sequence-length, "
            "curriculum or batch-size warmup, no AdEMAMix warmup over the run, no `budget_aware`); otherwise the "
            "refusal says which part spans it. A finished run rerun unchanged trains nothing and says so."
            "\n\n| may change on resume | why |\n|---|---|\n" + rows + "\n")


def render_options_page() -> str:
    header = "| {} | default | what it does |\n|---|---|---|\n"
    parts = [OPTIONS_INTRO]
    for title, fields in _option_groups():
        card = f"Card: [{title}]({CARDS[title]}).\n\n" if title in CARDS else ""
        parts.append(f"## {title}\n\n{card}" + header.format("FastTrainingArguments option") + _option_rows(fields) + "\n")
    parts.append(_rerun_section())
    fields = own_fields()
    parts.append("## Recipe `model:` section\n\n`ModelArguments`: the model to train, built from scratch or "
                 "loaded.\n\n" + header.format("model: key") + _option_rows(fields["model: key"].values()) + "\n")
    parts.append("## Recipe `data:` section\n\n`DataArguments`: which text, which tokenizer, how it is cut "
                 "([the embedded default](runs.md#the-embedded-default-training-with-no-network)).\n\n"
                 + header.format("data: key") + _option_rows(fields["data: key"].values()) + "\n")
    return "\n".join(parts)


def test_options_page_matches_the_dataclasses():
    """Read back from the page: every option is there once with its default, and nothing else is."""
    tables = option_tables((DOCS / "options.md").read_text(encoding="utf-8"))
    fields = own_fields()
    assert set(tables) == set(fields), f"option tables found: {sorted(tables)}"
    for kind, documented in tables.items():
        missing = sorted(set(fields[kind]) - set(documented))
        unknown = sorted(set(documented) - set(fields[kind]))
        assert not missing, f"docs/options.md: options of {kind!r} not documented: {missing}"
        assert not unknown, f"docs/options.md: documented under {kind!r} but not fields: {unknown}"
        for name, cell in documented.items():
            m = re.fullmatch(r"`(.*)`", cell)
            assert m, f"docs/options.md: default of {name} must be `value`, got {cell!r}"
            assert yaml.safe_load(m.group(1)) == _default(fields[kind][name]), (
                f"docs/options.md: {name} documented default {cell} != {_default(fields[kind][name])!r}")


def test_options_page_is_generated_from_the_dataclasses():
    assert (DOCS / "options.md").read_text(encoding="utf-8") == render_options_page(), (
        "docs/options.md is out of date: run `PYTHONPATH=$PWD python tests/test_docs.py --write-options`")


# ------------------------------------------------------------------------------------------------
# Command-line reference
# ------------------------------------------------------------------------------------------------

# docs/cli.md is the commands' own help output, captured in-process; `python tests/test_docs.py --write-cli`
# rewrites it and tests/test_docs.py fails when it is out of date (a flag added or a help text changed).
CLI_COMMANDS = [
    ("hf-fasttrain --help", ["--help"], "The commands."),
    ("hf-fasttrain train --help", ["train", "--help"],
     "Train from a recipe: the package's options grouped by technique, then the essential Trainer options. "
     "`python recipes/gpt2_small.py` and `accelerate launch recipes/gpt2_small.py` take the same flags; "
     "`--help --config <recipe>` shows that recipe's values, and `--help-all` lists every "
     "`TrainingArguments` field as well (about 110). Every option is described on [All options](options.md)."),
    ("hf-fasttrain generate --help", ["generate", "--help"],
     "Sample text from a run's model, offline (see *Before and after a run* above)."),
    ("hf-fasttrain restarts --help", ["restarts", "--help"],
     "Random restart from the command line ([Random restart](techniques/random-restart.md))."),
    ("hf-fasttrain tokenize --help", ["tokenize", "--help"],
     "Tokenize a dataset once into packed parquet shards with a manifest; train on the folder with "
     "`--dataset <out>` ([Your own data](own-data.md#pre-tokenized-data))."),
    ("hf-fasttrain recipes list", ["recipes", "list"],
     "The bundled recipes (paths shown relative to a checkout; an installed wheel shows its own)."),
    ("hf-fasttrain push-recipe --help", ["push-recipe", "--help"],
     "Upload a recipe with a model card ([Recipes and the Hub](techniques/recipes-and-hub.md))."),
    ("hf-fasttrain coord-check --help", ["coord-check", "--help"],
     "The coordinate check of a parameterization on your model ([Transfer](techniques/transfer.md))."),
    ("hf-fasttrain tune-transfer --help", ["tune-transfer", "--help"],
     "Tune small, train big: an lr search on a narrow proxy, then the full model at the winner "
     "([Transfer](techniques/transfer.md#tune-small-train-big))."),
    ("hf-fasttrain version", ["version"], "The package version."),
]
CLI_INTRO = """# Command line

`pip install -e .` installs the `hf-fasttrain` command; `python -m hf_fasttrain.cli` is the same.
A configuration error prints one line, `error: <field>: <what is wrong>; <what is allowed>`, and exits with
status 2 before any training (`--debug`, or `HF_FASTTRAIN_DEBUG=1`, shows the traceback).

## Before and after a run

`hf-fasttrain train --config gpt2_tiny --max_steps 100 --dry_run` prints the options the run would train with
as YAML (the `config.yaml` it would save), each followed by where its value came from: `default`, `recipe`,
`flag`, `budget_aware` (what `--budget_aware true` picks for the run's length) or `derived` (set from other
options, such as the precision). It validates as a run does, writes nothing and exits 0.

`hf-fasttrain generate --model runs/gpt2_tiny --prompt "def " --max_new_tokens 40` samples from a run's
final model, offline; `--model runs/gpt2_tiny/checkpoint-150` samples from a checkpoint. With weight averaging
the final model is the average; a checkpoint gives the average saved with it (`--weights iterate`: its own
weights). On a run's folder, `--weights iterate` samples the last checkpoint's own weights. The same `--seed` gives
the same text; `--temperature 0` is greedy.

This page is the commands' own output (`python tests/test_docs.py --write-cli`), and
`tests/test_docs.py` fails when it is out of date.
"""


def _cli_output(argv: list[str]) -> str:
    import contextlib
    import io

    from hf_fasttrain.cli import main

    out = io.StringIO()
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps to the terminal's width
    try:
        with contextlib.redirect_stdout(out):
            try:
                main(list(argv))
            except SystemExit:  # argparse's --help
                pass
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old
    text = out.getvalue().replace(str(ROOT) + os.sep, "")
    return "\n".join(line.rstrip() for line in text.splitlines()).strip("\n") + "\n"


def render_cli_page() -> str:
    parts = [CLI_INTRO]
    for title, argv, what in CLI_COMMANDS:
        parts.append(f"## `{title}`\n\n{what}\n\n```text\n{_cli_output(argv)}```\n")
    return "\n".join(parts)


def test_cli_page_is_the_commands_output():
    assert (DOCS / "cli.md").read_text(encoding="utf-8") == render_cli_page(), (
        "docs/cli.md is out of date: run `PYTHONPATH=$PWD python tests/test_docs.py --write-cli`")


def test_every_command_is_on_the_cli_page():
    from hf_fasttrain.cli import COMMANDS

    titled = {argv[0] for _, argv, _ in CLI_COMMANDS if not argv[0].startswith("-")}
    assert titled == set(COMMANDS), f"docs/cli.md: commands without a section: {sorted(set(COMMANDS) - titled)}"


def _recipe_keys() -> set[str]:
    from hf_fasttrain.config.args import DataArguments, FastTrainingArguments, ModelArguments

    return {f.name for cls in (FastTrainingArguments, ModelArguments, DataArguments) for f in dataclasses.fields(cls)}


INLINE_CODE = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")


def _prose(path: Path) -> str:
    """The text of a Markdown file without its fenced blocks."""
    out, fence = [], None
    for line in checked_text(path).splitlines():
        f = FENCE.match(line)
        if f and fence is None:
            fence = f.group(2)
        elif fence is not None and line.strip() == fence:
            fence = None
        elif fence is None:
            out.append(line)
    return "\n".join(out)


def test_names_in_the_docs_exist():
    """`key: value` must be a recipe key; `hf_fasttrain.x.y` must import; `...Callback` must exist;
    `--flag` of a recipe command must be an option."""
    import transformers

    import hf_fasttrain.callbacks

    keys = _recipe_keys()
    problems = []
    for path in markdown_files():
        for code in INLINE_CODE.findall(_prose(path)):
            m = re.match(r"^([a-z][a-z0-9_]*): [^<>]+$", code)  # `key: value`, not a `form: <placeholder>`
            if m and m.group(1) not in keys:
                problems.append(f"{rel(path)}: `{code}` names no option")
            m = re.match(r"^(hf_fasttrain(?:\.\w+)+)", code)
            if m:
                parts = m.group(1).split(".")
                for cut in range(len(parts), 0, -1):  # longest importable module, then attributes
                    try:
                        obj = importlib.import_module(".".join(parts[:cut]))
                        break
                    except ImportError:
                        continue
                for attr in parts[cut:]:
                    if not hasattr(obj, attr):
                        problems.append(f"{rel(path)}: `{code}`: {'.'.join(parts)} does not exist")
                        break
                    obj = getattr(obj, attr)
            for name in re.findall(r"\b([A-Z]\w*Callback)\b", code):
                if not (hasattr(hf_fasttrain.callbacks, name) or hasattr(transformers, name)):
                    problems.append(f"{rel(path)}: `{code}`: no callback {name}")
        for block in extract_blocks(path):
            if block.lang != "bash" or block.inactive:
                continue
            for line in block.code.splitlines():
                m = re.search(r"(gpt2_small\.py|hf-fasttrain train)(.*)", line.split("#")[0])
                if m:  # the flags after the script (those before it are accelerate's)
                    for flag in re.findall(r"\s--([A-Za-z_][\w-]*)", m.group(2)):
                        if flag not in keys | {"config", "help"}:
                            problems.append(f"{block.where}: --{flag} is no option of the recipe")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------
# Links
# ------------------------------------------------------------------------------------------------

LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def _slug_mkdocs(text: str) -> str:  # Python-Markdown's toc slugify (MkDocs)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _slug_github(text: str) -> str:
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> tuple[set[str], set[str]]:
    heads = [re.sub(r"\s+#+\s*$", "", m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+)$", _prose(path), re.M)]
    plain = [re.sub(r"[`*_]", "", re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", h)) for h in heads]
    return {_slug_mkdocs(h) for h in plain}, {_slug_github(h) for h in plain}


def test_relative_links_resolve():
    problems = []
    for path in markdown_files():
        for target in LINK.findall(_prose(path)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            file_part, _, anchor = target.partition("#")
            dest = (path.parent / file_part) if file_part else path
            if not dest.exists():
                problems.append(f"{rel(path)}: link {target!r}: {file_part} does not exist")
                continue
            if path.is_relative_to(DOCS) and not Path(os.path.normpath(dest)).is_relative_to(DOCS):
                problems.append(f"{rel(path)}: link {target!r} leaves docs/ (the site cannot serve it)")
            if anchor and dest.suffix == ".md":
                mk, gh = _anchors(dest)
                if anchor not in mk or anchor not in gh:
                    problems.append(f"{rel(path)}: link {target!r}: no heading #{anchor} in {dest.name}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------
# README
# ------------------------------------------------------------------------------------------------


def test_readme_is_short_and_keeps_the_two_commands():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "python recipes/gpt2_small.py --config recipes/configs/gpt2_tiny.yaml" in text
    # the unit tier: what CI runs first, and the tiers CI runs after it are the others
    unit = 'python -m pytest -q -m "not slow and not e2e and not bench" tests'
    assert unit in text
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    runs = [line for line in ci.splitlines() if line.startswith("python -m pytest")]
    assert runs == [unit, 'python -m pytest -q -m "slow or e2e or bench" tests']


def _layout_block() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## Layout", 1)[1]
    return section.split("```", 2)[1]


def test_readme_layout_names_what_is_there():
    """Every path the Layout names exists, and every public module of the package is named."""
    block = _layout_block()
    package = ROOT / "hf_fasttrain"
    named_in_package = set(re.findall(r"^  ([\w.]+/?)\s", block, re.M))
    named_top = set(re.findall(r"^([\w.]+/?)\s", block, re.M))
    for name in named_top:
        assert (ROOT / name.rstrip("/")).exists(), f"README Layout names {name}, which does not exist"
    for name in named_in_package:
        assert (package / name.rstrip("/")).exists(), f"README Layout names hf_fasttrain/{name}, which does not exist"
    stems = {n.rstrip("/").removesuffix(".py") for n in named_in_package}
    for entry in package.iterdir():
        public = not entry.name.startswith("_") and (entry.suffix == ".py" or (entry / "__init__.py").exists())
        if public:
            assert entry.name.removesuffix(".py") in stems, f"README Layout does not name hf_fasttrain/{entry.name}"


def _table_rows(text: str, header_start: str) -> dict[str, list[str]]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip().strip("*") for c in line.strip().strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _same_cell(doc: str, result: str) -> bool:
    if doc == result or {doc, result} <= {"n/a", "not reached"}:
        return True
    try:
        return round(float(doc), 2) == round(float(result), 2)
    except ValueError:
        return False


_HEADLINE_ARMS = {"hf-default", "hf-tuned", "hf-best", "hf-best+", "fasttrain", "fasttrain-budget"}
_HEADLINE = "| arm | final eval loss (median) | train seconds to 4.513"


@pytest.mark.parametrize("page, results_file, header, arms, after", [
    ("README.md", "time_to_loss.md", _HEADLINE, _HEADLINE_ARMS, ""),
    ("docs/benchmarks.md", "time_to_loss.md", _HEADLINE, _HEADLINE_ARMS, ""),
    ("docs/index.md", "time_to_loss.md", _HEADLINE, _HEADLINE_ARMS, ""),
    ("docs/benchmarks/time-to-loss.md", "time_to_loss.md", _HEADLINE, _HEADLINE_ARMS | {"fasttrain-emb-2e-3"}, ""),
    # the same runs against hf-best+'s final loss: the results' second table
    ("docs/benchmarks/time-to-loss.md", "time_to_loss.md", "| arm | final eval loss (median) | train seconds to 4.220",
     {"hf-best", "hf-best+", "fasttrain", "fasttrain-budget"}, "(median final eval loss of hf-best+)"),
    # the earlier run with every optimizer arm (its fasttrain was Muon alone)
    ("docs/benchmarks/time-to-loss.md", "time_to_loss_all_arms.md", "| arm | final eval loss (median) | seconds to 4.716",
     {"hf-tuned", "opt-muon", "opt-soap"}, ""),
])
def test_time_to_loss_tables_quote_the_results(page, results_file, header, arms, after):
    """The headline tables (README, home, the benchmarks pages) and the optimizer one say what the benchmark wrote
    (``after``: the results' table after that text)."""
    text = (ROOT / "benchmarks/results" / results_file).read_text(encoding="utf-8")
    results = _table_rows(text[text.index(after):], "| arm |")
    quoted = _table_rows((ROOT / page).read_text(encoding="utf-8"), header)
    assert arms <= set(quoted)
    for arm, cells in quoted.items():
        assert arm in results, f"{page}: arm {arm} is not in benchmarks/results/time_to_loss.md"
        for doc, res in zip(cells, results[arm]):
            assert _same_cell(doc, res), f"{page}: {arm}: {cells} != results {results[arm]}"


# ------------------------------------------------------------------------------------------------
# Docstring examples of the public API
# ------------------------------------------------------------------------------------------------


def _public_objects():
    """What `hf_fasttrain` exports, plus every object the API reference page renders (`::: path`)."""
    import hf_fasttrain

    found = {name: getattr(hf_fasttrain, name) for name in hf_fasttrain.__all__ if not name.startswith("__")}
    for path in re.findall(r"^::: ([\w.]+)", (DOCS / "api.md").read_text(encoding="utf-8"), re.M):
        module, _, attr = path.rpartition(".")
        found.setdefault(path, getattr(importlib.import_module(module), attr))
    return sorted(found.items())


def test_api_reference_renders_the_exports():
    """Every name `hf_fasttrain` exports has a section on the API page (by any of its paths)."""
    import hf_fasttrain

    text = (DOCS / "api.md").read_text(encoding="utf-8")
    rendered = {path.rpartition(".")[2] for path in re.findall(r"^::: ([\w.]+)", text, re.M)}
    missing = [n for n in hf_fasttrain.__all__ if not n.startswith("__") and n not in rendered]
    assert not missing, f"docs/api.md renders no section for {missing}"


# The packages whose exports the API page documents: the top level and the parts for any Trainer.
API_PACKAGES = ("hf_fasttrain", "hf_fasttrain.callbacks", "hf_fasttrain.schedules", "hf_fasttrain.optim",
                "hf_fasttrain.data")


def _api_page_objects() -> dict[str, object]:
    """Each `::: path` of the API page: its last name -> the object it renders."""
    out = {}
    for path in re.findall(r"^::: ([\w.]+)", (DOCS / "api.md").read_text(encoding="utf-8"), re.M):
        module, _, name = path.rpartition(".")
        out.setdefault(name, []).append(getattr(importlib.import_module(module), name))
    return out


def _names_the_snippets_import() -> set[tuple[str, str]]:
    import ast

    found = set()
    for block in all_blocks():
        if block.lang in ("python", "py") and not block.inactive and not INCLUDE.match(block.code.strip()):
            for node in ast.walk(ast.parse(block.code)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("hf_fasttrain"):
                    found |= {(node.module, a.name) for a in node.names}
    return found


def test_api_page_lists_every_export_and_every_name_the_docs_import():
    """Every name in the `__all__` of the documented packages, and every hf_fasttrain name a docs snippet
    imports, is rendered on the API page (as that very object)."""
    rendered = _api_page_objects()
    wanted = {(pkg, name) for pkg in API_PACKAGES for name in importlib.import_module(pkg).__all__
              if not name.startswith("__")} | {x for x in _names_the_snippets_import() if not x[1].startswith("__")}
    assert len(wanted) > 60
    missing = []
    for module, name in sorted(wanted):
        obj = getattr(importlib.import_module(module), name)
        if not any(o is obj for o in rendered.get(name, [])):
            missing.append(f"{module}.{name}")
    assert not missing, "docs/api.md does not render: " + ", ".join(missing)


@pytest.mark.parametrize("name,obj", _public_objects(), ids=lambda x: x if isinstance(x, str) else "")
def test_public_docstring_examples_run(name, obj, tmp_path, monkeypatch):
    doc = getattr(obj, "__doc__", None) or ""
    if isinstance(obj, dict):  # OPTIMIZERS: a plain dict has dict's docstring
        return
    doc = re.sub(r"^\s*```\w*\s*$", "", doc, flags=re.M)  # HF style fences the examples
    module = importlib.import_module(getattr(obj, "__module__", "hf_fasttrain"))
    test = doctest.DocTestParser().get_doctest(doc, dict(vars(module)), name, None, 0)  # as doctest does
    if not test.examples:
        return
    monkeypatch.chdir(tmp_path)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    runner.run(test, out=lambda s: None)
    failed = runner.summarize(verbose=False).failed
    if failed:
        report = []
        runner.run(test, out=report.append)
        pytest.fail("".join(report))


# ------------------------------------------------------------------------------------------------
# Pages speak of the package and its measurements only
# ------------------------------------------------------------------------------------------------

# Words of how the package was made, not of what it does: issue numbers, work sessions, machines that
# were (not) available, version-control chatter. The machine a figure ran on is "a 2-core x86_64 CPU".
PROCESS_WORDS = re.compile(
    r"\bissue[- ]?#?\d+|(?<![\w/#&])#\d{1,4}\b|\bsessions?\b|\bagents?\b|\breshape\b|development box|\blent\b"
    r"|\bthis branch\b|\bother branch(?:es)?\b|\bbranch (?:is|was) merged|\bthis project'?s?\b"
    r"|\bnot installed here\b|\bmachine here\b|<this repository>|\bno GPU so far\b"
    # the package's own past: "`fasttrain` until now", "the arm of that time", "an earlier version" (of the
    # package; a dependency's earlier versions are a fact about that dependency)
    r"|\buntil now\b|\bof that time\b"
    r"|\bearlier versions?\b(?! of (?:transformers|torch|pytorch|accelerate|trl|peft|datasets|tokenizers|python)\b)",
    re.I)
# A command pinned to one commit (`--before dea2a7c`) reads as a record of how the figure was made; a page
# writes `--before <revision>` and says what that revision is. Flagged in code as well as in prose.
PINNED = re.compile(r"--before[ =]+[0-9a-f]{7,40}\b")
ABSOLUTE_PATH = re.compile(r"(?<![\w.~/])/(?:work|root|home|Users)/")
HASH = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")


def process_problems(text: str, where: str, prose: bool = True) -> list[str]:
    """Process words, absolute machine paths, commands pinned to a commit and (in prose, outside code) commit
    hashes in `text`.

    >>> process_problems("Measured before this session's reshape (commit dea2a7c), issue-18, /work/x.", "x")  # doctest: +NORMALIZE_WHITESPACE
    ["x: 'session' ...", "x: 'reshape' ...", "x: 'issue-18' ...", "x: '/work/' (an absolute path of one machine)",
     "x: 'dea2a7c' (a commit hash in prose)"]
    >>> process_problems("On a 2-core x86_64 CPU, `git rev-parse dea2a7c`; push to a branch; 124439808 parameters.", "x")
    []
    """
    problems = [f"{where}: {m.group(0)!r} ..." for m in PROCESS_WORDS.finditer(text)]
    problems += [f"{where}: {m.group(0)!r} (an absolute path of one machine)" for m in ABSOLUTE_PATH.finditer(text)]
    problems += [f"{where}: {m.group(0)!r} (a command pinned to a commit)" for m in PINNED.finditer(text)]
    if prose:
        plain = re.sub(r"`[^`\n]*`", "", text)
        problems += [f"{where}: {m.group(0)!r} (a commit hash in prose)" for m in HASH.finditer(plain)]
    return problems


def test_the_checks_own_examples():
    """The doctests of this file's helpers (the negative controls of the process-word check)."""
    import sys

    module = sys.modules[__name__]
    runner = doctest.DocTestRunner()
    for obj in (process_problems, _markdown_text, _lr_text):
        for test in doctest.DocTestFinder().find(obj, globs=vars(module)):
            runner.run(test)
    assert runner.summarize(verbose=False).failed == 0


# (text, what the check reports in it or None). Prose is checked as prose; a command pinned to a commit is
# flagged inside code too, a hash in code is not (`git rev-parse <hash>` shows a command, not a record).
PROCESS_CASES = [
    ("the recipe's optimizer = `fasttrain` until now", "'until now'"),
    ("Until now the guard never fired.", "'Until now'"),
    ("the `fasttrain` arm of that time, before the recipe moved", "'of that time'"),
    ("The same run against an earlier version of the package found 99 failures", "'earlier version'"),
    ("Earlier versions wrote the clock into trainer_state.json.", "'Earlier versions'"),
    ("`python -m benchmarks.startup --before dea2a7c --repeats 3`", "'--before dea2a7c' (a command pinned"),
    ("run `startup.py --before=3f9c2ab1e0`", "'--before=3f9c2ab1e0' (a command pinned"),
    ("measured at 3f9c2ab on a 2-core CPU", "'3f9c2ab' (a commit hash in prose)"),
    ("the committed figure of 0123456789abcdef0123456789abcdef01234567", "(a commit hash in prose)"),
    # near misses
    ("trains until the loss reaches 4.716, or until nothing is left", None),
    ("the clock of that timer restarts at each resume", None),
    ("earlier versions of transformers lack `processing_class`", None),
    ("an earlier checkpoint, the earlier rung, a version earlier than 5.0", None),
    ("`python -m benchmarks.startup --before <revision> --repeats 3`; `--before main`", None),
    ("`git rev-parse dea2a7c` prints the full hash", None),
    ("124439808 parameters, 1.89e+05 tokens, a deadbeef pattern, 6.14e5, x86_64, sha256", None),
]


@pytest.mark.parametrize("text, found", PROCESS_CASES, ids=[t[:40] for t, _ in PROCESS_CASES])
def test_process_check_table(text, found):
    problems = process_problems(text, "x")
    if found is None:
        assert problems == []
    else:
        assert len(problems) == 1 and found in problems[0], problems


# A page reports what was measured, not what someone aimed for: no goals, no targets met or missed.
AIM_WORDS = re.compile(r"\bgoals?\b|\b(?:is|are|was|not) met\b", re.I)


def test_pages_state_results_not_aims():
    problems = []
    for path in markdown_files() + [ROOT / "CHANGELOG.md"]:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if AIM_WORDS.search(line):
                problems.append(f"{rel(path)}:{number}: {line.strip()[:80]}")
    assert not problems, "aims on public pages (say what was measured):\n" + "\n".join(problems)


def test_pages_speak_only_of_the_package():
    problems = []
    for path in markdown_files() + [ROOT / "CHANGELOG.md"]:
        problems += process_problems(path.read_text(encoding="utf-8"), rel(path), prose=False)
        problems += [p for p in process_problems(_prose(path), rel(path)) if "commit hash" in p]
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.md")):  # raw results: paths only
        problems += [p for p in process_problems(path.read_text(encoding="utf-8"), rel(path), prose=False)
                     if "absolute path" in p]
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------------
# The built site (tests/test_docs.py --check-site SITE_DIR, run by .ci/run after mkdocs build)
# ------------------------------------------------------------------------------------------------

ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj):")
HTML_TAGS = set("""a abbr article aside b blockquote body br button caption circle cite code col colgroup dd
    defs del details div dl dt em figcaption figure footer form g h1 h2 h3 h4 h5 h6 head header hr html i img
    input ins kbd label li line link main mark meta nav noscript ol option p path picture polygon polyline pre
    q rect s samp script section select small source span strong style sub summary sup svg symbol table tbody
    td template textarea tfoot th thead time title tr u ul use var video clippath""".split())


def check_site(site: Path) -> list[str]:
    """What a reader must not meet in the built site: a `>>>` example outside a code block (or turned into a
    blockquote), a raw Sphinx role, a Markdown placeholder read as an HTML tag (`checkpoint-<step>`),
    process words, absolute machine paths."""
    from html.parser import HTMLParser

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.stack, self.text, self.tags = [], [], set()

        def handle_starttag(self, tag, attrs):
            self.tags.add(tag)
            if tag not in ("br", "hr", "img", "input", "meta", "link", "col", "source", "path", "use"):
                self.stack.append(tag)

        def handle_endtag(self, tag):
            if tag in self.stack:
                while self.stack.pop() != tag:
                    pass

        def handle_data(self, data):
            if not {"pre", "code", "script", "style"} & set(self.stack):
                self.text.append(data)

    problems = []
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 20, f"{site}: no built site there"
    for path in pages:
        where = str(path.relative_to(site))
        page = Page()
        page.feed(path.read_text(encoding="utf-8"))
        text = " ".join(page.text)
        if ">>>" in text:
            problems.append(f"{where}: a >>> example outside a code block")
        if "blockquote" in page.tags:
            problems.append(f"{where}: a blockquote (a >>> example or a line starting with '>' read as one)")
        for m in ROLE.finditer(text):
            problems.append(f"{where}: raw role {text[m.start():m.end() + 30]!r}")
        unknown = page.tags - HTML_TAGS
        if unknown:
            problems.append(f"{where}: unknown HTML tags {sorted(unknown)} (a <placeholder> outside code?)")
        html = path.read_text(encoding="utf-8")
        if not where.startswith("results"):
            problems += process_problems(text, where)
            # code included: a command pinned to a commit in a code block (tags dropped, so a highlighted
            # `--before <hash>` reads whole)
            problems += [p for p in process_problems(re.sub(r"<[^>]+>", "", html), where, prose=False)
                         if "pinned to a commit" in p and p not in problems]
        problems += [p for p in process_problems(html, where, prose=False) if "absolute path" in p]
    return problems


@pytest.mark.slow
def test_built_site_is_clean(tmp_path):
    """Builds the site (about 5 s) and checks it; .ci/run does the same on its own build."""
    pytest.importorskip("mkdocs")
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "NO_MKDOCS_2_WARNING": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    problems = check_site(tmp_path / "site")
    assert not problems, "\n".join(problems)
    import shutil

    if shutil.which("chromium") or shutil.which("google-chrome"):  # the layout at 1280 x 800, where a browser is
        out = subprocess.run([sys.executable, str(DOCS / "check_layout.py"), str(tmp_path / "site")],
                             capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]


def test_site_check_finds_each_kind_of_problem(tmp_path):
    """The negative control: the check is not blind."""
    for i in range(21):
        (tmp_path / f"p{i}.html").write_text("<html><body><p>fine</p></body></html>", encoding="utf-8")
    (tmp_path / "bad.html").write_text(
        "<html><body><pre><code>&gt;&gt;&gt; ok()</code></pre><p>&gt;&gt;&gt; bad()</p>"
        "<blockquote><blockquote><p>from x import y</p></blockquote></blockquote>"
        "<p>see :func:<code>f</code>, saved as checkpoint-<step>, in /work/main by an agent</p>"
        "<p>the arm of that time, `fasttrain` until now, an earlier version, measured at 3f9c2ab</p>"
        '<pre><code><span class="o">--</span><span>before</span> <span>dea2a7c</span></code></pre>'
        "</body></html>",
        encoding="utf-8")
    (tmp_path / "fine.html").write_text(
        "<html><body><p>until the loss is reached, an earlier checkpoint</p>"
        "<pre><code>git rev-parse dea2a7c; startup.py --before &lt;revision&gt;</code></pre></body></html>",
        encoding="utf-8")
    found = "\n".join(check_site(tmp_path))
    for what in (">>> example outside", "blockquote", "raw role", "unknown HTML tags ['step']", "'agent'",
                 "absolute path", "'of that time'", "'until now'", "'earlier version'",
                 "'3f9c2ab' (a commit hash in prose)", "'--before dea2a7c' (a command pinned to a commit)"):
        assert what in found, what
    assert "p0.html" not in found and "fine.html" not in found


def test_results_pages_keep_machine_and_command_lines_and_leave_search():
    """docs/_hooks.py: a raw results page's first `Machine:` / `Command:` lines stay visible text."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("_hooks", DOCS / "_hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    text = hooks.results_page_source("padding", "Machine: 2-core CPU.\nCommand: `python x`\n\n| a |\n|---|\n| 1 |\n")
    assert text.startswith("---\nsearch:\n  exclude: true\n---\n")
    body = text.split("---\n", 2)[2]
    assert "# Raw results: padding\n\nMachine: 2-core CPU.\n\nCommand: `python x`\n\n" in body
    markdown = pytest.importorskip("markdown")  # the docs extra
    html = markdown.Markdown(extensions=["meta", "tables"]).convert(body)
    assert "Machine: 2-core CPU." in html and "Command:" in html
    titled = hooks.results_page_source("x", "# Own title\n\ntext\n")
    assert "Raw results" not in titled and "# Own title" in titled


def test_sphinx_roles_become_code_on_the_site():
    import importlib.util

    spec = importlib.util.spec_from_file_location("_griffe_roles", DOCS / "_griffe_roles.py")
    roles = importlib.util.module_from_spec(spec)
    pytest.importorskip("griffe")
    spec.loader.exec_module(roles)
    assert roles.roles_to_code("see :func:`hf_fasttrain.a.b` and :class:`~X`, ``y``") == "see `hf_fasttrain.a.b` and `X`, ``y``"
    assert roles.roles_to_code(":meth:``Trainer.train``") == "`Trainer.train`"
    text = ("    Args:\n        min_lr (`float` or `Sequence[float]`, *optional*, defaults to `None`):\n            floor.\n"
            "        run_config (`dict`, *optional*):\n            more.\n        plain (int): kept\n")
    assert roles.hf_args_to_google(text) == ("    Args:\n        min_lr (float | Sequence[float]):\n            floor.\n"
                                             "        run_config (dict):\n            more.\n        plain (int): kept\n")


def test_docstring_examples_are_fenced():
    """Every `>>>` example in a docstring the API page renders sits in a ``` fence (else Markdown reads it
    as a nested blockquote)."""
    problems = []
    for name, obj in _public_objects():
        doc = getattr(obj, "__doc__", None) or ""
        if isinstance(obj, dict) or ">>>" not in doc:
            continue
        fenced = False
        for line in doc.splitlines():
            if line.strip().startswith("```"):
                fenced = not fenced
            elif line.strip().startswith(">>>") and not fenced:
                problems.append(f"{name}: {line.strip()[:60]}")
                break
    assert not problems, "examples outside a ```python fence:\n" + "\n".join(problems)


def test_home_page_diff_really_swaps_the_trainer():
    """The home page's two-line diff: the `-` line and the `+` line both run, and each name the `+` line
    binds is a subclass of the one the `-` line binds (FastTrainer is a Trainer, FastTrainingArguments are
    TrainingArguments)."""
    diffs = [b for b in extract_blocks(DOCS / "index.md") if b.lang == "diff"]
    assert len(diffs) == 1, "docs/index.md: one ```diff block (Trainer -> FastTrainer) expected"
    lines = diffs[0].code.splitlines()
    before = "\n".join(line[2:] for line in lines if line.startswith("- "))
    after = "\n".join(line[2:] for line in lines if line.startswith("+ "))
    assert before and after and len(lines) == 2
    old, new = {}, {}
    exec(before, old)  # noqa: S102 - the docs' own code
    exec(after, new)  # noqa: S102
    names = [n for n in old if not n.startswith("__")]
    assert names == [n for n in new if not n.startswith("__")], "the + line must bind the names the - line binds"
    for name in names:
        assert issubclass(new[name], old[name]) and new[name] is not old[name], name


def test_layout_check_reports_scrolling_tables_and_the_first_screen():
    """docs/check_layout.py's verdict on a page's measurements (Chromium measures; this is the judgement)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("check_layout", DOCS / "check_layout.py")
    layout = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(layout)
    report = {"width": 1280, "height": 800,
              "tables": [{"heading": "Time to loss", "header": "arm | loss", "scroll_width": 720, "client_width": 720},
                         {"heading": "Scaling", "header": "rung | params", "scroll_width": 1152, "client_width": 720},
                         {"heading": "Padding", "header": "batching", "scroll_width": 721, "client_width": 720}],
              "code": [{"heading": "Recipe", "first_line": "model:", "scroll_width": 777, "client_width": 688},
                       {"heading": "Quick start", "first_line": "args = (", "scroll_width": 700, "client_width": 688}],
              "images": [{"src": "wide.png", "heading": "Scaling", "natural_width": 1210, "shown_width": 720},
                         {"src": "fits.png", "heading": "Time", "natural_width": 880, "shown_width": 720}],
              "first_screen": [{"name": "result sentence", "found": True, "top": 272, "bottom": 349, "inside": True},
                               {"name": "install line", "found": True, "top": 760, "bottom": 830, "inside": False},
                               {"name": "diff", "found": False, "top": None, "bottom": None, "inside": False}]}
    problems, info = layout.problems_of("index.html", report, home=True)
    assert problems == [
        "index.html: table under 'Scaling' (rung | params ...) scrolls sideways: 1152 px of content in 720 px",
        "index.html: figure wide.png under 'Scaling' is shown at 60% of its width (720 of 1210 px)",
        "index.html: quick-start code block under 'Quick start' scrolls sideways (700 px in 688 px): 'args = ('",
        "index.html: the install line is not on the first screen (it spans 760-830 px of 800)",
        "index.html: no diff on the page",
    ]
    assert any("code block under 'Recipe' scrolls" in line for line in info)  # information, not a problem
    assert any("result sentence is on the first screen" in line for line in info)
    problems, _ = layout.problems_of("benchmarks/index.html", report, home=False)
    assert len(problems) == 3  # the first screen is judged on the home page only


# ------------------------------------------------------------------------------------------------
# Figures quoted in prose, checked against benchmarks/results/*.json
# ------------------------------------------------------------------------------------------------


def _result(name: str) -> dict:
    import json

    return json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text(encoding="utf-8"))


def _arm(name: str, arm: str) -> dict:
    return _result(name)["summary"]["arms"][arm]


def _x(value: float) -> str:
    return f"{value:.2f}x"


def _headline_minutes() -> str:
    """The six default arms' run times in the headline's JSON, in minutes (what `--fresh` runs)."""
    default = {"hf-default", "hf-tuned", "hf-best", "hf-best+", "fasttrain", "fasttrain-budget"}
    seconds = sum(r["process_seconds"] for r in _result("time_to_loss")["runs"] if r["arm"] in default)
    return f"about {seconds / 60:.0f} min"


def _padding_range(baseline: str) -> str:
    """Token budgets' and row packing's real tokens per CPU-second over ``baseline``'s, as ``1.0x-1.1x``."""
    rows = _result("padding")["results"]
    ratios = [rows[a]["median_real_tokens_per_cpu_s"] / rows[baseline]["median_real_tokens_per_cpu_s"]
              for a in ("token_budget", "packed_rows")]
    return f"{min(ratios):.1f}x-{max(ratios):.1f}x"


def _faults_injected() -> str:
    kinds = {r["injection"] for r in _result("faults")["runs"]} - {"none"}
    return ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven"][len(kinds)]


def _overhead(variant: str) -> str:
    return f"{100 * (_result('technique_overhead')['rows'][variant]['ratio_vs_base'] - 1):+.1f}%"


def _bundled_recipes() -> str:
    from hf_fasttrain.config.options import default_recipe_dirs, find_recipes

    return ", ".join(find_recipes(default_recipe_dirs()))


# (page, a regex whose group 1 is the figure as written, what the results say it must be)
FIGURES = [
    ("docs/techniques/weight-averaging.md", r"in (\d\.\d{3}x) the recipe's tokens",
     lambda: f'{_arm("ablation_to_hf_tuned_target", "base+ema")["tokens_ratio_vs_reference"]:.3f}x'),
    ("docs/techniques/weight-averaging.md", r"LAWA in (\d\.\d{3}x)",
     lambda: f'{_arm("ablation_to_hf_tuned_target", "base+lawa")["tokens_ratio_vs_reference"]:.3f}x'),
    ("docs/techniques/weight-averaging.md", r"\((\d) seeds each",
     lambda: str(min(_arm("ablation_to_hf_tuned_target", a)["seeds"] for a in ("base+ema", "base+lawa")))),
    ("docs/benchmarks/sequence-length.md", r"\((\d\.\d\dx) the tokens alone",
     lambda: _x(_arm("ablation_to_hf_tuned_target", "base+slw")["tokens_ratio_vs_reference"])),
    ("docs/benchmarks/sequence-length.md", r"(\d\.\d\dx) with the EMA\)",
     lambda: _x(_arm("ablation_to_hf_tuned_target", "base+ema+slw")["tokens_ratio_vs_reference"])),
    ("docs/techniques/sequence-length.md", r"take the Muon recipe to (\d\.\d\dx) the tokens",
     lambda: _x(_arm("ablation_to_hf_tuned_target", "base+ema+slw")["tokens_ratio_vs_reference"])),
    ("docs/techniques/sequence-length.md", r"the warmup alone, (\d\.\d\dx)",
     lambda: _x(_arm("ablation_to_hf_tuned_target", "base+slw")["tokens_ratio_vs_reference"])),
    # padding: the fair baseline (the Trainer's group_by_length) and random batching, CPU-seconds
    *[(page, pattern, lambda: _padding_range("hf_group_by_length")) for page, pattern in (
        ("docs/techniques/sequence-length.md", r"`group_by_length` they\s+train (\d\.\dx-\d\.\dx) the real"),
        ("docs/benchmarks/sequence-length.md", r"They train (\d\.\dx-\d\.\dx) the real tokens per second of the Trainer's"),
        ("docs/benchmarks.md", r"under 1% padding, (\d\.\dx-\d\.\dx) the real tokens per second of the Trainer's"))],
    *[(page, pattern, lambda: _padding_range("random")) for page, pattern in (
        ("docs/techniques/sequence-length.md", r"against random batching, (\d\.\dx-\d\.\dx)"),
        ("docs/benchmarks/sequence-length.md", r"and (\d\.\dx-\d\.\dx) those of random batching"),
        ("docs/benchmarks.md", r"\((\d\.\dx-\d\.\dx) those of random batching\)"))],
    # the fault injection: injected faults, the clean run aside
    *[(page, pattern, _faults_injected) for page, pattern in (
        ("docs/benchmarks.md", r"survive all (\w+) injected faults"),
        ("docs/techniques/stability.md", r"survived all (\w+) injected faults"))],
    ("docs/benchmarks/stability.md", r"\n(\w+) injected faults and a clean run", lambda: _faults_injected().capitalize()),
    # the cost of a weight average per step, from the side-by-side rerun
    ("docs/techniques/weight-averaging.md", r"a step with the EMA costs ([+-]\d\.\d%)", lambda: _overhead("+ema")),
    ("docs/techniques/weight-averaging.md", r"with LAWA ([+-]\d\.\d%), inside", lambda: _overhead("+lawa (every 10)")),
    # Muon alone against tuned AdamW: the all-arms run's opt-muon
    *[(page, pattern, lambda: _x(_arm("time_to_loss_all_arms", "opt-muon")["tokens_to_target"] / 614400))
      for page, pattern in (("docs/techniques/optimizers.md", r"Muon at its swept lr\s+reaches tuned AdamW's final loss in (\d\.\d\dx) the"),
                            ("docs/benchmarks/ablation.md", r"\(Muon alone: (\d\.\d\dx)\)"),
                            ("docs/benchmarks.md", r"Muon is most of it: (\d\.\d\dx) hf-tuned's tokens alone"))],
    # the recipe's searched winner at 1x against hf-best (0.405 of the budget: 0.40x)
    ("docs/benchmarks/hf-best-plus.md", r"\| the recipe's searched winner \| [\d.]+ \| \d \| (\d\.\d\dx)",
     lambda: _x(_result("budget_ladder")["versus_hf_best"]["1x"]["fastest_one_run"]["token_ratio"])),
    ("docs/benchmarks/time-to-loss.md", r"AdamW to (\d+\.\d+M) non-embedding parameters",
     lambda: f"{max(r['non_embedding_params'] for r in _result('scaling')['summary'].values()) / 1e6:.2f}M"),
    ("docs/benchmarks/scaling.md", r"1\.33M, (\d+\.\d+M) non-embedding",
     lambda: f"{max(r['non_embedding_params'] for r in _result('scaling')['summary'].values()) / 1e6:.2f}M"),
    ("docs/index.md", r"AdamW up to (\d+\.\d+M)",
     lambda: f"{max(r['non_embedding_params'] for r in _result('scaling')['summary'].values()) / 1e6:.2f}M"),
    ("docs/benchmarks.md", r"yes: (\d\.\d\dx-\d\.\d\dx) of tuned AdamW's tokens", lambda: "{:.2f}x-{:.2f}x".format(
        *(f(r["optimizers"]["muon"]["token_ratio_vs_adamw"] for r in _result("scaling")["summary"].values())
          for f in (min, max)))),
    ("docs/index.md", r"final loss in (\d\.\d\dx-\d\.\d\dx) the tokens", lambda: "{:.2f}x-{:.2f}x".format(
        *(f(r["optimizers"]["muon"]["token_ratio_vs_adamw"] for r in _result("scaling")["summary"].values())
          for f in (min, max)))),
    ("docs/techniques/recipes-and-hub.md", r"final loss in (\d\.\d\dx the tokens \(\d\.\dx fewer\))",
     lambda: _ratio(_arm("time_to_loss", "fasttrain")["tokens_ratio_vs_reference"], "the tokens", "fewer")),
    ("docs/techniques/recipes-and-hub.md", r"hf-fasttrain recipes list\s+# ([\w, ]+)\n", _bundled_recipes),
]


def _train_rows_loss(family: str, rung: str = "54x-3x192") -> str:
    """The final loss on training rows of ``family``'s best setting at ``rung`` (seed 0), from hf_best.json."""
    ledger = _result("hf_best")
    best = ledger["summary"][rung][family]["best"]
    run = next(r for r in ledger["runs"].values()
               if (r["rung"], r["family"], r["seed"]) == (rung, family, 0) and r["config"] == best)
    return f"{run['final_train_loss']:.3f}"


FIGURES += [
    ("docs/index.md", r"2 layers x 128 \(([\d.]+M) non-embedding parameters\)",
     lambda: f"{_result('budget_ladder')['summary']['1x']['non_embedding_params'] / 1e6:.1f}M"),
    # 64x is off the ladder: its ratios are the lr-swept recipe's against hf-best's
    ("docs/benchmarks/64x.md", r"By complete runs\s+it needs (\d\.\d\d\d) of the budget\*\*, interpolated",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['64x']['recipe_complete_run_ratio']:.3f}"),
    ("docs/benchmarks/hf-best.md", r"n/a \(not on the ladder\) \| \*\*(\d\.\d\d\d)\*\* \(the searched recipe's\)",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['64x']['recipe_complete_run_ratio']:.3f}"),
    # the 16x winner as complete runs at 32x, between the 16x and 64x runs the 64x figure interpolates over
    ("docs/benchmarks/64x.md", r"and at 32x, (\d\.\d{3})\. The 32x runs",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['64x']['complete_runs']['32']:.3f}"),
    # the 16x combination at 6x, 0.375 of the budget (its lr that ended lowest there)
    ("docs/benchmarks/hf-best.md", r"budget\) at (\d\.\d{3}) / \d\.\d{3} / \d\.\d{3} at a half",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['16x']['fastest_one_run']['complete_runs']['6']:.3f}"),
    # the 16x combination at 64x (cautious weight decay: only the combination has it there)
    ("docs/benchmarks/64x.md", r"seed 0, Muon's iteration in fp32\), it ended at (\d\.\d{3}) against",
     lambda: "%.3f" % next(r["final_eval_loss"] for r in _result("hf_best")["runs"].values()
                           if r["rung"] == "64x" and r["config"].get("cautious_wd") and r["seed"] == 0)),
    # the larger model (3x192 at 25 tokens per parameter), each family at its best lr
    ("docs/benchmarks/larger-model.md", r"recipe's best\s+reaches hf-best's final loss inside one run in\s+\*\*(\d\.\d\d\d)\*\*",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['54x-3x192']['long_horizon_token_ratio']:.3f}"),
    # the larger model by complete runs: the recipe at a quarter and half its budget, and the ratio they give
    ("docs/benchmarks/larger-model.md", r"reaches hf-best's 2.501 at \*\*(\d\.\d\d\d)\*\* of the budget",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['54x-3x192']['recipe_complete_run_ratio']:.3f}"),
    ("docs/benchmarks/larger-model.md", r"Muon's iteration in fp32\)\. They ended at (\d\.\d{3}) \(median of",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['54x-3x192']['complete_runs']['13']:.3f}"),
    ("docs/benchmarks/larger-model.md", r"2\.547\) and \*\*(\d\.\d{3})\*\* \(seed 0\), the half-length run",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['54x-3x192']['complete_runs']['27']:.3f}"),
    # hf-best's own winner as a complete run at half the larger model's budget
    ("docs/benchmarks/larger-model.md", r"seed 0\) ended at\s+\*\*(\d\.\d{3})\*\* at twice its 54x lr",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['54x-3x192']['hf_best_complete_runs']['27']:.3f}"),
    # the larger model memorises the repeated corpus: its final loss on training rows, at each family's best
    ("docs/benchmarks/larger-model.md", r"training rows as eval rows hf-best ends at (\d\.\d{3})", lambda: _train_rows_loss("hf-best")),
    ("docs/benchmarks/larger-model.md", r"best lr\) and the recipe at (\d\.\d{3})", lambda: _train_rows_loss("recipe")),
    # random restart at equal compute (AdamW): how much higher best-of-4 ends than one seed
    *[(page, pattern, lambda: "%.2f" % (_arm("time_to_loss_restarts", "fasttrain-best-of-4")["final_eval_loss"]
                                        - _arm("time_to_loss_restarts", "fasttrain")["final_eval_loss"]))
      for page, pattern in (("docs/benchmarks/random-restart.md", r"best-of-4\s+ended (\d\.\d\d) higher"),
                            ("docs/techniques/random-restart.md", r"best-of-4 ended (\d\.\d\d) higher"),
                            ("docs/benchmarks.md", r"with AdamW on this stable setup: it ends (\d\.\d\d) higher"))],
    ("docs/benchmarks/random-restart.md", r"\| AdamW, single seed \(`fasttrain` in the JSON\) \| (\d\.\d{4}) \|",
     lambda: f'{_arm("time_to_loss_restarts", "fasttrain")["final_eval_loss"]:.4f}'),
    ("docs/benchmarks/random-restart.md", r"\| fasttrain-best-of-4 \| (\d\.\d{4}) \|",
     lambda: f'{_arm("time_to_loss_restarts", "fasttrain-best-of-4")["final_eval_loss"]:.4f}'),
    # the headline command's own run time: the six default arms' processes, from the JSON
    *[(page, r"time_to_loss --fresh`? *(?:#|\()[^\n]*?runs(?: take)?\s+(about \d+ min)", lambda: _headline_minutes())
      for page in ("README.md", "docs/index.md", "docs/benchmarks.md", "docs/benchmarks/time-to-loss.md")],
    # the cards' and the summary's other figures
    *[(page, r"[Tt]he guard costs (\d\.\d\dx)", lambda: _x(next(r["relative"] for r in _result("stability_overhead")["rows"]
                                                                  if r["arm"] == "+ guard (mixin)")))
      for page in ("docs/techniques/stability.md", "docs/benchmarks.md")],
    ("docs/techniques/stability.md", r"That run ended at held-out loss\s+(\d\.\d{3}) instead of",
     lambda: "%.3f" % next(r["eval_loss"] for r in _result("faults")["advice"] if r["setup"] == "value clip, max_grad_norm=0")),
    ("docs/techniques/stability.md", r"it ended\s+at (\d\.\d{3} / \d\.\d{3})", lambda: "%.3f / %.3f" % tuple(
        next(r["eval_loss"] for r in _result("faults")["advice"] if r["setup"] == name)
        for name in ("value clip + max_grad_norm=1", "value clip, max_grad_norm=0, + guard"))),
    ("docs/techniques/optimizers.md", r"Qwen3-MoE, Muon reaches tuned AdamW's final loss in (\d\.\d\dx) the tokens",
     lambda: _x(_result("moe_muon")["tokens_to_adamw_final"]["muon"]["median_fraction"])),
    ("docs/techniques/optimizers.md", r"at 16x the lr\s+ends at (\d\.\d{3} against \d\.\d{3}) \(2 seeds each\)", lambda: "%.3f against %.3f" % (
        _result("hf_best_groups")["summary"]["1x"]["hf-best+"]["final_eval_loss"],
        _result("hf_best")["summary"]["1x"]["hf-best"]["final_eval_loss"])),
    # the budget-ladder figure's searched-recipe line, read in the caption under it
    ("docs/benchmarks/budget-ladder.md", r"grows with the budget: (\d\.\d{3}, \d\.\d{3}, \d\.\d{3} and \d\.\d{3}) at",
     lambda: "{}, {}, {} and {}".format(*(f"{_result('budget_ladder')['versus_hf_best'][k]['fastest_one_run']['token_ratio']:.3f}"
                                          for k in ("1x", "4x", "16x", "64x")))),
]


# ------------------------------------------------------------------------------------------------
# Every other figure of README, home, the benchmarks summary and the technique cards, read from its JSON
# (or, where it is a count of the code's own, computed from the code) the way the page says it is rounded
# ------------------------------------------------------------------------------------------------


def _lr_text(lr: float) -> str:
    """A peak lr as the docs write it: 0.002 -> 2e-3, 0.016 -> 1.6e-2.

    >>> _lr_text(0.002), _lr_text(0.016), _lr_text(0.0024)
    ('2e-3', '1.6e-2', '2.4e-3')
    """
    mantissa, exponent = f"{lr:.1e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _sweep(optimizer: str) -> dict[float, float]:
    """Final eval loss (median of 2 seeds) by peak lr on the tiny time-to-loss setup: AdamW from hf-tuned's sweep,
    the others from the optimizer sweeps (Muon's extended upwards)."""
    if optimizer == "adamw":
        return {float(a.split("@")[1]): r["final_eval_loss"] for a, r in _result("lr_sweep_hf_tuned")["summary"]["arms"].items()}
    out = {float(k): v for k, v in _result("optimizer_lr_sweep")["summary"][optimizer]["final_eval_loss_by_lr"].items()}
    if optimizer == "muon":
        out.update({float(k): v for k, v in _result("optimizer_lr_sweep_muon_high")["summary"]["muon"]["final_eval_loss_by_lr"].items()})
    return out


def _best_lr(optimizer: str) -> float:
    losses = _sweep(optimizer)
    return min(losses, key=losses.get)


def _recipe(name: str) -> dict:
    return yaml.safe_load((ROOT / "recipes" / "configs" / f"{name}.yaml").read_text(encoding="utf-8"))


def _recipe_minutes(one: str = "1 minute") -> str:
    """The tiny recipe's run time: the headline's `fasttrain` arm (the tiny recipe's settings), median process
    seconds over its seeds, in whole minutes ("about a minute" where the page says it in words)."""
    import statistics

    seconds = statistics.median(r["process_seconds"] for r in _result("time_to_loss")["runs"] if r["arm"] == "fasttrain")
    minutes = round(seconds / 60)
    return f"about {one}" if minutes == 1 else f"about {minutes} minutes"


def _to_hf_tuned(arm: str) -> float:
    """An ablation arm's median tokens to hf-tuned's final loss over hf-tuned's own tokens to it."""
    return _arm("ablation_to_hf_tuned_target", arm)["tokens_to_target"] / _arm("time_to_loss_all_arms", "hf-tuned")["tokens_to_target"]


def _muon_step(model: str, arm: str) -> float:
    return next(r["train_step_vs_adamw"] for r in _result("muon_precision_cpu")["rows"]
                if r["model"] == model and r["optimizer"] == arm)


def _step_range(arm: str) -> str:
    ratios = [r["train_step_vs_adamw"] for r in _result("muon_precision_cpu")["rows"] if r["optimizer"] == arm]
    return f"{min(ratios):.2f}x-{max(ratios):.2f}x"


def _tpp(key: str) -> float:
    row = _result("budget_ladder")["versus_hf_best"][key]
    return row.get("tokens_per_param") or _result("budget_ladder")["summary"][key]["tokens_per_param"]


def _reads() -> dict[str, int]:
    """The host reads per step that tests/test_host_reads.py asserts: the Trainer's, its loss filter's (on the device
    in FastTrainer) and the divergence guard's."""
    import test_host_reads as reads

    return {"trainer": reads.TRAINER_READS, "filter": reads.FILTER_READS, "guard": reads.GUARD_READS}


_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]


def _mib(variant: str) -> str:
    return f"{_result('lm_head_loss_memory_cpu')['variants'][variant]['saved_for_backward_bytes'] / 2**20:.0f} MiB"


def _backends() -> dict[str, dict]:
    return {r["backend"]: r for r in _result("restarts_backends")["runs"]}


def _search_arg(flag: str) -> str:
    args = _result("restarts_backends")["search"]
    return args[args.index(flag) + 1]


def _non_embedding(recipe: str, decimals: int) -> str:
    """A bundled recipe's model, built on the meta device, in millions of non-embedding parameters."""
    import types

    import torch

    from hf_fasttrain.config.args import ModelArguments
    from hf_fasttrain.config.budget import non_embedding_parameters
    from hf_fasttrain.config.recipes import validate_recipe
    from hf_fasttrain.modeling import build_model

    sections = validate_recipe(_recipe(recipe))
    data = sections.get("data", {})

    class Tokenizer(types.SimpleNamespace):
        def __len__(self):
            return data.get("vocab_size", 4096)

    with torch.device("meta"):
        model = build_model(ModelArguments(**sections.get("model", {})), Tokenizer(bos_token_id=0, eos_token_id=0,
                            pad_token_id=None), data.get("block_size", 128))
    return f"{non_embedding_parameters(model) / 1e6:.{decimals}f}M"


def _singular_values(name: str, steps: int) -> str:
    """Muon's Newton-Schulz (bf16, the default) on a 64 x 128 Gaussian (seed 0): its smallest and largest singular value."""
    import torch

    from hf_fasttrain.optim.orthogonalize import newton_schulz

    x = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    s = torch.linalg.svdvals(newton_schulz(x, name, steps).float())
    return f"[{float(s.min()):.2f}, {float(s.max()):.2f}]"


def _setting(name: str, key: str):
    return _result(name)["setup"][key]


def _headline_setup() -> dict:
    """The headline run's setup, its token budget in millions and its seeds per arm."""
    setup = _result("time_to_loss")["setup"]
    seeds = {r["seeds"] for r in _result("time_to_loss")["summary"]["arms"].values()}
    assert len(seeds) == 1, seeds
    return {**setup, "tokens": setup["max_steps"] * setup["batch_size"] * setup["block_size"] / 1e6, "seeds": seeds.pop()}


FIGURES += [
    # README's first command and the recipes card: the tiny recipe's run time
    ("README.md", r"train a small GPT-2 on the embedded corpus \(offline; (about \d+ minutes?) on 2 CPU cores\)",
     lambda: _recipe_minutes()),
    ("docs/techniques/recipes-and-hub.md", r"an EMA: (about a minute|about \d+ minutes) on 2 CPU cores",
     lambda: _recipe_minutes("a minute")),
    # the headline's setup
    ("README.md", r"A tiny GPT-2 \((\d layers x \d+, [\d.]+M tokens\), \d seeds), side by side",
     lambda: "{n_layer} layers x {n_embd}, {tokens:.2f}M tokens), {seeds} seeds".format(**_headline_setup())),
    ("docs/benchmarks.md", r"The tiny GPT-2 \((\d layers x \d+, vocab \d+, block \d+, batch \d+, \d+ steps = [\d.]+M tokens)\)",
     lambda: "{n_layer} layers x {n_embd}, vocab {vocab_size}, block {block_size}, batch {batch_size}, {max_steps} steps = "
             "{tokens:.2f}M tokens".format(**_headline_setup())),
    ("docs/index.md", r"token budget \(([\d.]+M tokens\), \d seeds) each",
     lambda: "{tokens:.2f}M tokens), {seeds} seeds".format(**_headline_setup())),
    ("docs/index.md", r"The target is hf-best's median final loss, (\d\.\d{3})\.",
     lambda: f"{_result('time_to_loss')['summary']['target_eval_loss']:.3f}"),
    # hf-best's winner at the headline's length: warmup-stable-decay to 0 (a linear cooldown) and its beta2
    ("docs/index.md", r"searched; (warmup-stable-decay to 0 and beta2 [\d.]+) won", lambda: "warmup-stable-decay to 0 and beta2 {:g}".format(
        _result("hf_best")["summary"]["1x"]["hf-best"]["best"]["beta2"])
     if _result("hf_best")["summary"]["1x"]["hf-best"]["best"]["schedule"].startswith("wsd") else "not warmup-stable-decay"),
    # the summary's own figures
    ("docs/benchmarks.md", r"small GPT-2s \((\d\.\d\dM to \d\.\d\dM) non-embedding parameters\)", lambda: "{:.2f}M to {:.2f}M".format(
        *(f(r["non_embedding_params"] for r in _result("scaling")["summary"].values()) / 1e6 for f in (min, max)))),
    ("docs/benchmarks.md", r'A ratio below 1 is a speed-up: "(\d\.\d\dx the tokens \(\d\.\dx fewer\))"',
     lambda: _ratio(_arm("time_to_loss", "fasttrain")["tokens_ratio_vs_reference"], "the tokens", "fewer")),
    ("docs/benchmarks.md", r"the recipe still needs only (\d\.\d\dx hf-best's tokens \(\d\.\dx fewer\))",
     lambda: _ratio(_arm("time_to_loss", "fasttrain-emb-2e-3")["tokens_ratio_vs_reference"], "hf-best's tokens", "fewer")),
    ("docs/benchmarks.md", r"takes it the rest of the way, to (\d\.\d\dx)\.",
     lambda: _x(_arm("time_to_loss", "fasttrain")["tokens_ratio_vs_reference"])),
    ("docs/benchmarks.md", r"The embeddings' lr alone takes AdamW to (\d\.\d\dx \(\d\.\dx fewer\))", lambda: "{:.2f}x ({:.1f}x fewer)".format(
        _arm("time_to_loss", "hf-best+")["tokens_ratio_vs_reference"], 1 / _arm("time_to_loss", "hf-best+")["tokens_ratio_vs_reference"])),
    ("docs/benchmarks.md", r"The ladder's model is GPT-2 2x128 \(([\d.]+M) non-embedding parameters\)",
     lambda: f"{_result('budget_ladder')['summary']['1x']['non_embedding_params'] / 1e6:.2f}M"),
    ("docs/benchmarks.md", r"the larger model is GPT-2 3x192\s+\(([\d.]+M)\)",
     lambda: f"{_result('budget_ladder')['versus_hf_best']['54x-3x192']['non_embedding_params'] / 1e6:.2f}M"),
    ("docs/benchmarks.md", r"A (\d\.\dx) larger model at 25 tokens per parameter\?", lambda: "{:.1f}x".format(
        _result("budget_ladder")["versus_hf_best"]["54x-3x192"]["non_embedding_params"] / _result("budget_ladder")["summary"]["1x"]["non_embedding_params"])),
    # how often the long runs read the stdlib corpus (its training tokens: hf_best.json's corpora)
    ("docs/benchmarks.md", r"From (\d+x) on the stdlib corpus repeats", lambda: next(
        k for k in ("1x", "2x", "4x", "8x", "16x") if _result("budget_ladder")["summary"][k]["tokens"]
        > _result("hf_best")["corpora"]["16x"]["train_tokens"])),
    *[("docs/benchmarks.md", pattern, lambda key=key: str(round(
        (_result("budget_ladder")["versus_hf_best"][key].get("tokens") or _result("budget_ladder")["summary"][key]["tokens"])
        / _result("hf_best")["corpora"]["16x"]["train_tokens"])))
      for pattern, key in ((r"16x reads it about (\d+) times", "16x"), (r"64x about (\d+) and the larger", "64x"),
                           (r"the larger\s+model about (\d+)\.", "54x-3x192"))],
    # the reproduce section: the GPU check's time limits (the unindented `timeout` lines are its GPU steps)
    ("docs/benchmarks.md", r"its time limits stop it\s+within (\d+ minutes) on one H100-class GPU", lambda: "%d minutes" % (sum(
        int(m) for m in re.findall(r"^timeout (\d+) ", (ROOT / "benchmarks/gpu_fast_path_check.sh").read_text(), re.M)) / 60)),
    # the optimizers card: the best peak lr of each sweep, the cost of a step, SOAP's on GPT-2 small's shapes
    ("docs/techniques/optimizers.md", r"learning_rate: 1\.6e-2    # the tiny recipe's best; AdamW's best was (\S+)",
     lambda: _lr_text(_best_lr("adamw"))),
    ("docs/techniques/optimizers.md", r"\*\*Muon\*\*: well above AdamW's; (\S+ here, \d+x AdamW's \S+)\.",
     lambda: f"{_lr_text(_best_lr('muon'))} here, {_best_lr('muon') / _best_lr('adamw'):.0f}x AdamW's {_lr_text(_best_lr('adamw'))}"),
    ("docs/techniques/optimizers.md", r"`gpt2_small\.yaml` uses (\S+), from\s+the scaling ladder's trend",
     lambda: _lr_text(float(_recipe("gpt2_small")["learning_rate"]))),
    ("docs/techniques/optimizers.md", r"\*\*Lion\*\*: 3-10x below AdamW's, with weight decay as much above; (\S+) here\.",
     lambda: _lr_text(_best_lr("lion"))),
    ("docs/techniques/optimizers.md", r"\*\*SOAP\*\*: (about \d+x AdamW's; \S+) here\.",
     lambda: f"about {_best_lr('soap') / _best_lr('adamw'):.0f}x AdamW's; {_lr_text(_best_lr('soap'))}"),
    ("docs/techniques/optimizers.md", r"\*\*AdEMAMix\*\*: (AdamW's; \S+) here\.", lambda: (
        "AdamW's; " if _best_lr("ademamix") == _best_lr("adamw") else "not AdamW's; ") + _lr_text(_best_lr("ademamix"))),
    ("docs/techniques/optimizers.md", r"\(half-life about ([\d,]+) steps\)", lambda: "{:,.0f}".format(
        round(math.log(0.5) / math.log(0.9999), -2))),
    ("docs/techniques/optimizers.md", r"\(GPT-2 2x128, 0\.61M tokens, (\d) seeds, 2-core CPU\), Muon at its swept lr",
     lambda: str(_arm("time_to_loss_all_arms", "opt-muon")["seeds"])),
    ("docs/techniques/optimizers.md", r"reaches tuned AdamW's final loss in (\d\.\d\dx the tokens \(\d\.\dx fewer\))",
     lambda: _ratio(_arm("time_to_loss_all_arms", "opt-muon")["tokens_to_target"]
                    / _arm("time_to_loss_all_arms", "hf-tuned")["tokens_to_target"], "the tokens", "fewer")),
    ("docs/techniques/optimizers.md", r"with the bf16 iteration forced: a step costs (\d\.\d\dx-\d\.\d\dx) AdamW's",
     lambda: _step_range("muon-bf16")),
    ("docs/techniques/optimizers.md", r"The default `auto` picks fp32 there \((\d\.\d\dx-\d\.\d\dx)\)", lambda: _step_range("muon-fp32")),
    ("docs/techniques/optimizers.md", r"SOAP on large matrices: its step costs (\d+x) AdamW's on GPT-2 small's shapes",
     lambda: f"{_result('optimizers')['results']['soap']['ratio']:.0f}x"),
    ("docs/techniques/optimizers.md", r"took (\d\.\d\dx) AdamW's with bf16", lambda: _x(_muon_step("gpt2-2x128", "muon-bf16"))),
    ("docs/techniques/optimizers.md", r"with bf16 and (\d\.\d\dx) with fp32", lambda: _x(_muon_step("gpt2-2x128", "muon-fp32"))),
    ("docs/techniques/optimizers.md", r"torch\.optim\.Muon's \| (\[\d\.\d\d, \d\.\d\d\]) \|", lambda: _singular_values("jordan", 5)),
    ("docs/techniques/optimizers.md", r"\| (\[\d\.\d\d, \d\.\d\d\] \(6 steps: \[\d\.\d\d, \d\.\d\d\]\)) \|",
     lambda: f"{_singular_values('polar_express', 5)} (6 steps: {_singular_values('polar_express', 6)})"),
    # per-group lrs: hf-best+ (hf_best_groups.json) against hf-best (budget_ladder.json) at 1x, 4x and 16x
    ("docs/techniques/optimizers.md", r"On GPT-2 2x128 at (\d+\.\d) tokens per parameter, hf-best's AdamW", lambda: f"{_tpp('1x'):.1f}"),
    ("docs/techniques/optimizers.md", r"the embeddings \(tied head\) at (\d+x) the lr\s+ends at",
     lambda: "%gx" % _result("hf_best_groups")["summary"]["1x"]["hf-best+"]["best"]["emb_lr"]),
    ("docs/techniques/optimizers.md", r"At (\d+\.\d)\s+tokens per parameter the embeddings at", lambda: f"{_tpp('4x'):.1f}"),
    ("docs/techniques/optimizers.md", r"tokens per parameter (the embeddings at \d+x, the norms at \d+x and weight decay on the matrices)",
     lambda: "the embeddings at {emb_lr:g}x, the norms at {norm_lr:g}x and weight decay on the {wd_on}".format(
         **_result("hf_best_groups")["summary"]["4x"]["hf-best+"]["best"])),
    ("docs/techniques/optimizers.md", r"matrices only end at (\d\.\d{3}\s+against \d\.\d{3})", lambda: "%.3f against %.3f" % (
        _result("hf_best_groups")["summary"]["4x"]["hf-best+"]["final_eval_loss"], _long_run("4x")["target_eval_loss"])),
    ("docs/techniques/optimizers.md", r"At (\d+\.\d) tokens per\s+parameter they win only", lambda: f"{_tpp('16x'):.1f}"),
    ("docs/techniques/optimizers.md", r"they win only with the peak lr at (\d\.\d+x: \d\.\d{3} against \d\.\d{3})", lambda: "%gx: %.3f against %.3f" % (
        _result("hf_best_groups")["summary"]["16x"]["hf-best+"]["best"]["lr_scale"],
        _result("hf_best_groups")["summary"]["16x"]["hf-best+"]["final_eval_loss"], _long_run("16x")["target_eval_loss"])),
    # the schedules card
    ("docs/techniques/schedules.md", r"\(\[LR decay shapes\]\([^)]*\); (GPT-2 \dx\d+, \d seeds)\)", lambda: "GPT-2 {}x{}, {} seeds".format(
        _setting("lr_schedules", "n_layer"), _setting("lr_schedules", "n_embd"),
        min(r["seeds"] for r in _result("lr_schedules")["summary"]["arms"].values()))),
    ("docs/techniques/schedules.md", r"predicts a left-out point\s+(within \d\.\dx at \d of \d Muon points, but only at \d of \d AdamW points)",
     lambda: "within 1.5x at {} of {} Muon points, but only at {} of {} AdamW points".format(*_law_within(1.5))),
    ("docs/techniques/schedules.md", r"At (\d+ tokens per parameter the recipe's best lr\s+was \d+x below) its lr at 24\.8",
     lambda: "{:.0f} tokens per parameter the recipe's best lr was {:.0f}x below".format(_tpp("64x"), _lr_of(
         _result("hf_best")["summary"]["16x"]["recipe"]["best"]) / _lr_of(_result("hf_best")["summary"]["64x"]["recipe"]["best"]))),
    ("docs/techniques/schedules.md", r"Past (\d+\.\d) tokens per parameter the last row", lambda: f"{_tpp('64x'):.1f}"),
    # the stability card
    ("docs/techniques/stability.md", r"\(tiny GPT-2, (\d+) steps, 2-core CPU\)", lambda: str(_result("faults")["config"]["steps"])),
    ("docs/techniques/stability.md", r"instead of (\d\.\d{3}); with the norm clip kept",
     lambda: "%.3f" % next(r["eval_loss"] for r in _result("faults")["advice"] if r["setup"] == "value clip + max_grad_norm=1")),
    ("docs/techniques/stability.md", r"That is (\w+) host read per step\.", lambda: _WORDS[_reads()["guard"]]),
    ("docs/techniques/stability.md", r"the Trainer's loss filter \((\d of its \d) reads per step\)",
     lambda: "{filter} of its {trainer}".format(**_reads())),
    ("docs/techniques/stability.md", r"a guarded FastTrainer step reads (\d times against the plain Trainer's \d)",
     lambda: "{} times against the plain Trainer's {}".format(_reads()["trainer"] - _reads()["filter"] + _reads()["guard"],
                                                              _reads()["trainer"])),
    # the precision card
    ("docs/techniques/precision-and-scale.md", r"the chunked LM-head loss keeps (\d+ MiB for backward instead of \d+ MiB)",
     lambda: f"{_mib('chunked-fp32')} for backward instead of {_mib('standard-fp32')}"),
    ("docs/techniques/precision-and-scale.md", r"(\d+ x \d+ tokens x 8 GPUs = [\d,]+) tokens per step", lambda: "{} x {} tokens x 8 GPUs = {:,}".format(
        _recipe("gpt2_small")["per_device_train_batch_size"], _recipe("gpt2_small")["data"]["block_size"],
        8 * _recipe("gpt2_small")["per_device_train_batch_size"] * _recipe("gpt2_small")["data"]["block_size"])),
    # the random-restart card: the equal-compute run and the two backends side by side
    ("docs/techniques/random-restart.md", r"\(hf-tuned's settings, (\d+ optimizer steps per arm, \d seeds)\)",
     lambda: "{} optimizer steps per arm, {} seeds".format(_setting("time_to_loss_restarts", "max_steps"),
                                                          _arm("time_to_loss_restarts", "fasttrain")["seeds"])),
    ("docs/techniques/random-restart.md", r"the tiny recipe shortened to (\d+ steps, \d seeds, \d rungs)",
     lambda: "{} steps, {} seeds, {} rungs".format(_search_arg("--max_steps"), _search_arg("--num-seeds"), _search_arg("--rungs"))),
    ("docs/techniques/random-restart.md", r"shared with other jobs \(load average (\d+-\d+)\)",
     lambda: re.search(r"Load average (\d+-\d+)", _result("restarts_backends")["machine_note"]).group(1)),
    # peak RSS: the JSON's peak_rss_mb is bytes / 2**20, so GiB are it / 1024
    ("docs/techniques/random-restart.md", r"used (\d\.\d GiB) more peak memory", lambda: "%.1f GiB" % (
        (_backends()["ray"]["peak_rss_mb"] - _backends()["local"]["peak_rss_mb"]) / 1024)),
    ("docs/techniques/random-restart.md", r"more peak memory \((\d\.\d\d GiB against \d\.\d\d GiB)", lambda: "%.2f GiB against %.2f GiB" % (
        _backends()["ray"]["peak_rss_mb"] / 1024, _backends()["local"]["peak_rss_mb"] / 1024)),
    ("docs/techniques/random-restart.md", r"finished in (\d+ s against \d+ s, with \d+ CPU-s against \d+)\.",
     lambda: "%.0f s against %.0f s, with %.0f CPU-s against %.0f" % (
         _backends()["ray"]["wall_s"], _backends()["local"]["wall_s"], _backends()["ray"]["cpu_s"], _backends()["local"]["cpu_s"])),
    ("docs/techniques/random-restart.md", r"differs in the 4th decimal \((\d\.\d{4} against \d\.\d{4})\)", lambda: "%.4f against %.4f" % (
        _backends()["ray"]["winner_final_metric"], _backends()["local"]["winner_final_metric"])),
    # the weight-averaging card: both averages' final loss over the recipe's at the end of the budget
    ("docs/techniques/weight-averaging.md", r"both averages ended about (\d\.\d\d) above the recipe", lambda: " / ".join(sorted({
        "%.2f" % (_arm("ablation", a)["final_eval_loss"] - _arm("ablation", "base")["final_eval_loss"]) for a in ("base+ema", "base+lawa")}))),
    # the sequence-length card
    ("docs/techniques/sequence-length.md", r"Token budgets and row packing keep padding under (\d+%)", lambda: _padding_under()),
    ("docs/benchmarks.md", r"token budgets and packing: under (\d+%) padding", lambda: _padding_under()),
    ("docs/techniques/sequence-length.md", r"attention is dense there, (\d\.\d\dx) the speed of random batching",
     lambda: _x(_result("padding")["results"]["packed_flat"]["cpu_speedup_vs_random"])),
    ("docs/techniques/sequence-length.md", r"spread over (\d+) optimizer steps", lambda: str(max(
        r["curve"][-1]["step"] for r in _result("time_to_loss")["runs"] if r["arm"] == "fasttrain"))),
    ("docs/techniques/sequence-length.md", r"`gpt2_tiny` has it on \((\d+ -> \d+ over \d+%)\)", lambda: "{} -> {} over {:.0f}%".format(
        _recipe("gpt2_tiny")["seq_len_warmup_min"], _recipe("gpt2_tiny")["data"]["block_size"],
        100 * _recipe("gpt2_tiny")["seq_len_warmup_fraction"])),
    # the recipes card: the bundled recipes' models and the command line's help
    ("docs/techniques/recipes-and-hub.md", r"\| `gpt2_tiny` \| GPT-2 2x128, ([\d.]+M tokens, Muon at \S+),", lambda: "{:.2f}M tokens, Muon at {}".format(
        _recipe("gpt2_tiny")["max_tokens"] / 1e6, _lr_text(float(_recipe("gpt2_tiny")["learning_rate"])))),
    ("docs/techniques/recipes-and-hub.md", r"GPT-2 (\d+M) at context 1024",
     lambda: "%.0fM" % (int(re.search(r"(\d+) parameters", _result("optimizers")["model"]).group(1)) / 1e6)),
    ("docs/techniques/recipes-and-hub.md", r"Muon at (\S+) \(from the scaling ladder's trend\)",
     lambda: _lr_text(float(_recipe("gpt2_small")["learning_rate"]))),
    ("docs/techniques/recipes-and-hub.md", r"vocab 4096: ([\d.]+M) non-embedding parameters", lambda: _non_embedding("llama_tiny", 2)),
    ("docs/techniques/recipes-and-hub.md", r"tied; ([\d.]+M) non-embedding parameters", lambda: _non_embedding("llama_small", 1)),
    ("docs/techniques/recipes-and-hub.md", r"That is (about \d+ lines) at 100 columns",
     lambda: "about %d lines" % round(len(_cli_output(["train", "--help"]).splitlines()), -1)),
    *[(page, pattern, lambda: "%d" % round(len(dataclasses.fields(importlib.import_module("transformers").TrainingArguments)), -1))
      for page, pattern in (("docs/techniques/recipes-and-hub.md", r"the Trainer's ~(\d+) included"),
                            ("docs/cli.md", r"field as well \(about (\d+)\)"))],
    # the transfer card: the coordinate check's pass mark, as a slope and as a factor per doubling of the width
    ("docs/techniques/transfer.md", r"when every \|slope\| is (at most \d\.\d+ \(at most \d\.\d\dx) per doubling", lambda: "at most {0:g} (at most "
     "{1:.2f}x".format(importlib.import_module("hf_fasttrain.transfer.coord_check").DEFAULT_TOLERANCE,
                       2 ** importlib.import_module("hf_fasttrain.transfer.coord_check").DEFAULT_TOLERANCE)),
    # README: nanoGPT's model, counted as nanoGPT's train.py counts it (all parameters but the position table)
    ("README.md", r"on tinyshakespeare \(([\d.]+M) parameters,", lambda: _nanogpt_parameters()),
]


def _lr_of(config: dict) -> float:
    """The peak lr a search configuration ran at: its lr times its lr_scale."""
    return config["lr"] * config.get("lr_scale", 1.0)


def _law_within(factor: float) -> tuple[int, int, int, int]:
    """How many of the lr law's measured points, each left out of the fit, it predicts within ``factor``: Muon's, AdamW's."""
    from hf_fasttrain.config.budget import learning_rate_law_check

    out = []
    for optimizer in ("muon", "adamw"):
        ratios = [r["ratio"] for r in learning_rate_law_check(optimizer)]
        out += [sum(1 / factor <= x <= factor for x in ratios), len(ratios)]
    return tuple(out)


def _padding_under() -> str:
    """The padding of token budgets and row packing, as a bound in whole percent (the next percent above the larger)."""
    rows = _result("padding")["results"]
    return f"{math.floor(100 * max(rows[a]['padding_fraction'] for a in ('token_budget', 'packed_rows'))) + 1}%"


def _nanogpt_parameters() -> str:
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    s = _result("nanogpt")["setup"]
    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config(vocab_size=s["vocab_size"], n_positions=s["block_size"], n_embd=s["n_embd"],
                                           n_layer=s["n_layer"], n_head=s["n_head"]))
    return f"{(sum(p.numel() for p in model.parameters()) - model.transformer.wpe.weight.numel()) / 1e6:.2f}M"


@pytest.mark.parametrize("page, pattern, expected", FIGURES, ids=[f"{p}:{r[:24]}" for p, r, _ in FIGURES])
def test_quoted_figures_match_the_results(page, pattern, expected):
    found = re.findall(pattern, (ROOT / page).read_text(encoding="utf-8"))
    assert found, f"{page}: the figure /{pattern}/ is gone; update FIGURES in tests/test_docs.py with the page"
    for value in found:  # a figure may break across lines: compared with its whitespace as one space
        assert " ".join(value.split()) == expected(), (
            f"{page}: /{pattern}/ says {value!r}, benchmarks/results say {expected()!r}")


# ------------------------------------------------------------------------------------------------
# The headline numbers in one style: "0.42x the tokens (2.4x fewer)", from the results JSON
# ------------------------------------------------------------------------------------------------


def _ratio(value: float, word: str, gain: str) -> str:
    """A ratio in the docs' one number style: ``0.42x the tokens (2.4x fewer)``."""
    return f"{value:.2f}x {word} ({1 / value:.1f}x {gain})"


def _headline(arm: str) -> str:
    row = _arm("time_to_loss", arm)
    return (_ratio(row["time_ratio_vs_reference"], "the time", "faster") + " and "
            + _ratio(row["tokens_ratio_vs_reference"], "the tokens", "fewer"))


_TIME_AND_TOKENS = r"(\d\.\d\dx the time \(\d\.\dx faster\) and \d\.\d\dx the tokens \(\d\.\dx fewer\))"
HEADLINES = [
    (page, pattern, expected)
    for page in ("README.md", "docs/index.md", "docs/benchmarks.md")
    for pattern, expected in (
        (r"reaches hf-best's final loss in " + _TIME_AND_TOKENS, lambda: _headline("fasttrain")),
        # budget_aware's steps cost what the recipe's do (technique_overhead): its tokens only, its time left out
        (r"With `budget_aware` it takes (\d\.\d\dx the tokens \(\d\.\dx fewer\))\. Its time is not quoted",
         lambda: _ratio(_arm("time_to_loss", "fasttrain-budget")["tokens_ratio_vs_reference"], "the tokens", "fewer")),
        (r"its steps took\s+(\d+ ms) here", lambda: "%.0f ms" % (1000 * _arm("time_to_loss", "fasttrain-budget")["seconds_per_step"])),
        (r"against the recipe's (\d+ ms), yet", lambda: "%.0f ms" % (1000 * _arm("time_to_loss", "fasttrain")["seconds_per_step"])),
        (r"timed side by side they cost (\d\.\d{3}x) the recipe's",
         lambda: "%.3fx" % _result("technique_overhead")["rows"]["+budget_aware (short)"]["ratio_vs_base"]),
    )
]


def _moe(arm: str) -> str:
    return _ratio(_result("moe_muon")["tokens_to_adamw_final"][arm]["median_fraction"], "the tokens", "fewer")


def test_moe_study_quotes_its_results():
    """The MoE study page and the summary row quote moe_muon.json's ratios in the one number style."""
    page = (ROOT / "docs/benchmarks/moe-muon.md").read_text(encoding="utf-8")
    assert f"reaches AdamW's final loss in {_moe('muon')}" in page
    dense = _result("moe_muon")["tokens_to_adamw_final"]["muon-dense"]["median_fraction"]
    assert f"it needs {dense:.2f}x" in page
    summary = (ROOT / "docs/benchmarks.md").read_text(encoding="utf-8")
    muon = _result("moe_muon")["tokens_to_adamw_final"]["muon"]["median_fraction"]
    assert f"yes: {muon:.2f}x tuned AdamW's tokens ({1 / muon:.1f}x fewer); {dense:.2f}x with the experts on AdamW" in summary


def _groups_ratio(row_label: str, budget: str = "1x", to: str = "hf-best+") -> float:
    """An arm's median tokens to hf-best+'s loss (or to hf-best's) over the budget, read off hf_best_groups.md's table at
    ``budget``."""
    text = (ROOT / "benchmarks/results/hf_best_groups.md").read_text(encoding="utf-8")
    section = text.split(f"## Budget {budget}\n", 1)[1].split("## Budget", 1)[0]
    table = section.split("| arm | final eval loss |", 1)[1]  # the table of each arm's tokens to each baseline
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells and cells[0] == row_label:
            return float(cells[-1 if to == "hf-best+" else -2].split()[0])
    raise AssertionError(f"no row {row_label!r} in hf_best_groups.md's {budget} table")


def test_hf_best_plus_figures_are_the_results():
    """hf-best+'s 1x loss and the recipe's tokens to it: on README, home and the summary from the headline's
    side-by-side run (its second table), on the study page from the group search too."""
    also = _result("time_to_loss")["also"]
    assert also["reference"] == "hf-best+"
    side = f"Against its final loss in this run, {also['target_eval_loss']:.3f}, the recipe (`fasttrain`) needs " + _ratio(
        also["arms"]["fasttrain"]["tokens_ratio_vs_reference"], "the tokens", "fewer")
    budget = also["arms"]["fasttrain-budget"]["tokens_ratio_vs_reference"]
    side += f", and {budget:.2f}x ({1 / budget:.1f}x fewer) with `budget_aware` (`fasttrain-budget`)"
    for page in ("README.md", "docs/index.md", "docs/benchmarks.md"):
        text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
        assert side in text, page
    plus = _result("hf_best_groups")["summary"]["1x"]
    loss = f"{plus['hf-best+']['final_eval_loss']:.3f}"
    recipe = _ratio(_groups_ratio("recipe (the budget ladder's, at its best lr)"), "the tokens", "fewer")
    own = _ratio(_groups_ratio("recipe+groups"), "the tokens", "fewer")
    text = " ".join((ROOT / "docs/benchmarks/hf-best-plus.md").read_text(encoding="utf-8").split())
    assert loss in text and recipe in text
    study = " ".join((ROOT / "docs/benchmarks/hf-best-plus.md").read_text(encoding="utf-8").split())
    assert f"ends at {loss}" in study and own.split(" the tokens")[0] in study
    summary = " ".join((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8").split())
    assert f"| 1x | 1.5 | {_result('hf_best')['summary']['1x']['hf-best']['final_eval_loss']:.3f} | {loss} |" in summary


def test_cost_per_step_table_is_the_results():
    """The ablation page's cost-per-step table quotes technique_overhead.md row for row."""
    results = _table_rows((ROOT / "benchmarks/results/technique_overhead.md").read_text(encoding="utf-8"), "| variant |")
    quoted = _table_rows((ROOT / "docs/benchmarks/ablation.md").read_text(encoding="utf-8"), "| variant | ms per step")
    assert quoted == results


def test_hf_best_plus_split_table_is_the_headline_run():
    """The study page's table of how the recipe's gain splits quotes the headline run's losses and ratios."""
    rows = _table_rows((ROOT / "docs/benchmarks/hf-best-plus.md").read_text(encoding="utf-8"),
                       "| arm | what differs from hf-best |")
    assert set(rows) == {"hf-best+", "fasttrain-emb-2e-3", "fasttrain"}
    for arm, (_, loss, tokens) in rows.items():
        row = _arm("time_to_loss", arm)
        assert loss == f"{row['final_eval_loss']:.4f}", arm
        assert tokens == _ratio(row["tokens_ratio_vs_reference"], "", "fewer").replace("x  (", "x (").strip(), arm


def _long_run(key: str) -> dict:
    return _result("budget_ladder")["versus_hf_best"][key]


def _one_run(key: str) -> str:
    return _ratio(_long_run(key)["fastest_one_run"]["token_ratio"], "the tokens", "fewer")


def _complete_runs(key: str) -> str:
    row = _long_run(key)
    ratio = row["fastest_one_run"].get("complete_run_ratio") or row["recipe_complete_run_ratio"]
    return _ratio(ratio, "by complete runs", "fewer")


LONG_RUN_ROWS = {"1x": "1x", "4x": "4x", "16x": "16x", "64x": "64x", "larger model, 3x192": "54x-3x192"}
# the studies' rows of the summary table: (row's link, key in budget_ladder.json's versus_hf_best)
STUDY_ROWS = {"[64x](benchmarks/64x.md)": "64x", "[Larger model](benchmarks/larger-model.md)": "54x-3x192",
              "[hf-best](benchmarks/hf-best.md)": "16x"}


@pytest.mark.parametrize("page, pattern, expected", HEADLINES, ids=[f"{p}:{r[:20]}" for p, r, _ in HEADLINES])
def test_headline_in_the_one_number_style(page, pattern, expected):
    """README, home and the benchmarks summary quote the headline as the results JSON says, in one style."""
    found = re.findall(pattern, (ROOT / page).read_text(encoding="utf-8"))
    assert found, f"{page}: the headline /{pattern}/ is gone; update HEADLINES in tests/test_docs.py with the page"
    for value in found:
        assert value == expected(), f"{page}: says {value!r}, benchmarks/results say {expected()!r}"


def test_long_run_table_quotes_the_results():
    """The benchmarks summary's long-run table: one row per budget, every cell from budget_ladder.json."""
    rows = _table_rows((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8"), "| budget | tokens per parameter |")
    assert set(rows) == set(LONG_RUN_ROWS)
    for name, key in LONG_RUN_ROWS.items():
        row, tpp, hf_best, hf_best_plus, recipe, one_run, to_plus, complete = _long_run(key), *rows[name]
        assert float(tpp) == round(row.get("tokens_per_param") or _result("budget_ladder")["summary"][key]["tokens_per_param"], 1), name
        assert hf_best == f"{row['target_eval_loss']:.3f}", name
        assert recipe == f"{row['fastest_one_run']['eval_loss']:.3f}", name
        assert one_run == _one_run(key).replace(" the tokens", ""), (name, one_run)
        plus = _result("hf_best_groups")["summary"].get(key, {}).get("hf-best+")
        if plus is None:
            assert hf_best_plus == to_plus == "not measured yet", name
        else:  # the recipe's searched winner (the recipe column's arm) against hf-best+, from the group study
            assert hf_best_plus == f"{plus['final_eval_loss']:.3f}", name
            try:  # where the search's winner is not the fastest setting, the report gives the fastest its own row
                ratio = _groups_ratio("recipe (the setting that reaches hf-best's loss soonest)", key)
            except AssertionError:
                ratio = _groups_ratio("recipe (its searched winner)", key)
            assert to_plus == _ratio(ratio, "the tokens", "fewer").replace(" the tokens", ""), (name, to_plus)
        extrapolated = ", extrapolated" if row["recipe_complete_run_extrapolated"] else ""
        assert complete == _complete_runs(key).replace(" by complete runs", "") + extrapolated, (name, complete)


@pytest.mark.parametrize("link, key", STUDY_ROWS.items())
def test_summary_rows_of_the_long_run_studies_quote_the_results(link, key):
    """The summary table's rows for hf-best, 64x and the larger model say what the results JSON says."""
    rows = _table_rows((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8"), "| study | question |")
    answer = rows[link][1]
    if key == "16x":  # hf-best's row quotes the recipe's one-run ratio at 16x
        assert f"needs {_long_run(key)['fastest_one_run']['token_ratio']:.2f}x its tokens" in answer, answer
        return
    assert _one_run(key).replace(" (", " in one run (") in answer, answer
    assert _complete_runs(key) in answer, answer


# README's and the home page's short long-run table: (row's first two cells, key in versus_hf_best)
SHORT_LONG_RUN_ROWS = {("24.8 tokens per parameter", "GPT-2 2x128"): "16x",
                       ("99.1 tokens per parameter", "GPT-2 2x128"): "64x",
                       ("24.9 tokens per parameter", "GPT-2 3x192"): "54x-3x192"}


@pytest.mark.parametrize("page", ["README.md", "docs/index.md"])
def test_short_long_run_table_quotes_the_results(page):
    """README's and home's three long-run rows: the tokens per parameter and both ratios from the JSON."""
    lines = (ROOT / page).read_text(encoding="utf-8").splitlines()
    start = lines.index("| run length | model | one run: tokens to hf-best's loss | complete runs: budget to hf-best's loss |")
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in lines[start + 2:start + 5]]
    assert [tuple(r[:2]) for r in rows] == list(SHORT_LONG_RUN_ROWS), rows
    for (length, _), one_run, complete in ((tuple(r[:2]), r[2], r[3]) for r in rows):
        key = SHORT_LONG_RUN_ROWS[(length, _)]
        row = _long_run(key)
        tpp = row.get("tokens_per_param") or _result("budget_ladder")["summary"][key]["tokens_per_param"]
        assert length == f"{tpp:.1f} tokens per parameter", (page, length)
        assert one_run == _one_run(key).replace(" the tokens", ""), (page, one_run)
        assert complete == _complete_runs(key).replace(" by complete runs", ""), (page, complete)


def test_the_1x_row_names_the_run_it_comes_from():
    """The summary's 1x row is the search's runs: the paragraph under the table gives the search's baselines beside
    the headline run's, and each recipe's ratios against them under its own name, so that one name is one number."""
    summary = " ".join((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8").split())
    head, plus = _result("time_to_loss")["summary"]["target_eval_loss"], _result("time_to_loss")["also"]["target_eval_loss"]
    # to hf-best: budget_ladder.json where it holds the ratio (the report's table rounds to 3 decimals), else the report
    cells = {"winner": (_x(_long_run("1x")["fastest_one_run"]["token_ratio"]), _x(_groups_ratio("recipe (its searched winner)"))),
             "tiny": (_x(_long_run("1x")["recipe_token_ratio"]), _x(_groups_ratio("recipe (the budget ladder's, at its best lr)"))),
             "groups": tuple(_x(_groups_ratio("recipe+groups", "1x", to)) for to in ("hf-best", "hf-best+"))}
    expected = (f"there hf-best ends at {_long_run('1x')['target_eval_loss']:.3f} and hf-best+ at "
                f"{_result('hf_best_groups')['summary']['1x']['hf-best+']['final_eval_loss']:.3f} ({head:.3f} and {plus:.3f} "
                f"side by side). Against those two losses the searched winner needs {cells['winner'][0]} and "
                f"{cells['winner'][1]} the tokens, `gpt2_tiny` {cells['tiny'][0]} and {cells['tiny'][1]}. With the embeddings "
                f"at {_result('hf_best_groups')['summary']['1x']['recipe+groups']['best']['emb_lr']:g}x the lr, the setting "
                f"`budget_aware` takes at 1x, the group search's winner (`recipe+groups`) needs {cells['groups'][0]} and "
                f"{cells['groups'][1]}.")
    assert expected in summary, expected
    # the table's 1x row is this searched winner (the long-run table test reads the same fields)
    assert _long_run("1x")["fastest_one_run"]["config"] == _result("hf_best")["summary"]["1x"]["recipe"]["best"]
    # the names hold: gpt2_tiny is the ladder's recipe at the yaml's lr, recipe+groups the settings budget_aware takes
    from hf_fasttrain.config.budget import budget_settings

    assert _result("budget_ladder")["summary"]["1x"]["optimizers"]["recipe"]["best_lr"] == float(_recipe("gpt2_tiny")["learning_rate"])
    groups = _result("hf_best_groups")["summary"]["1x"]["recipe+groups"]["best"]
    muon = budget_settings(_tpp("1x"), "muon")["settings"]
    assert muon["optimizer_kwargs"]["lr_multipliers"] == {"embedding": groups["emb_lr"]}
    assert (muon["adam_beta2"], muon["optimizer_kwargs"]["normuon_beta2"]) == (groups["beta2"], groups["normuon"])
    winner = _result("hf_best")["summary"]["1x"]["recipe"]["best"]
    assert {k: v for k, v in groups.items() if k != "emb_lr"} == winner  # the group search starts at the winner


def _study_answers() -> dict[str, tuple[list[str], str]]:
    """The summary's study table: each row's link -> (what its answer must contain, its seeds cell), from the JSON."""
    import statistics

    def seeds(values) -> str:
        values = set(values)
        return str(min(values)) if len(values) == 1 else f"{min(values)}-{max(values)}"

    tl = _result("time_to_loss")["summary"]["arms"]
    ladder = _result("budget_ladder")["summary"]
    hf_best = _result("hf_best")["summary"]
    vs = _result("budget_ladder")["versus_hf_best"]
    groups = _result("hf_best_groups")["summary"]
    ft, lora = _result("fine_tuning")["summary"]["arms"], _result("lora_fine_tuning")["summary"]["arms"]
    reads = _reads()
    scaling = _result("scaling")["summary"]

    def soonest(key):
        try:
            return _groups_ratio("recipe (the setting that reaches hf-best's loss soonest)", key)
        except AssertionError:
            return _groups_ratio("recipe (its searched winner)", key)

    lower = [vs[k]["hf_tuned_eval_loss"] - vs[k]["target_eval_loss"] for k in ("1x", "4x", "16x")]
    return {
        "[Time to loss](benchmarks/time-to-loss.md)": ([
            "yes: " + _ratio(tl["fasttrain"]["time_ratio_vs_reference"], "the time", "faster") + " and "
            + _ratio(tl["fasttrain"]["tokens_ratio_vs_reference"], "the tokens", "fewer")
            + f"; with `budget_aware` {_x(tl['fasttrain-budget']['tokens_ratio_vs_reference'])} the tokens"],
            seeds(r["seeds"] for r in tl.values())),
        "[Technique ablation](benchmarks/ablation.md)": ([
            "with the EMA and sequence-length warmup " + _ratio(_to_hf_tuned("base+ema+slw"), "", "fewer").replace("x  (", "x (")],
            seeds(r["seeds"] for r in _result("ablation_to_hf_tuned_target")["summary"]["arms"].values())),
        "[Optimizers](benchmarks/optimizers.md)": ([
            f"Muon at {_lr_text(_best_lr('muon'))} ends {_sweep('adamw')[_best_lr('adamw')] - _sweep('muon')[_best_lr('muon')]:.2f}"
            f" below AdamW; a step of the tiny model costs {_x(_muon_step('gpt2-2x128', 'muon-fp32'))} AdamW's on this CPU"],
            seeds(r["seeds"] for r in _result("lr_sweep_hf_tuned")["summary"]["arms"].values())),
        "[Schedules](benchmarks/schedules.md)": ([], seeds(r["seeds"] for name in ("lr_schedules", "lr_schedules_lr1e-2",
                                                   "time_to_loss_recipe_decay") for r in _result(name)["summary"]["arms"].values())),
        "[Sequence length](benchmarks/sequence-length.md)": ([], seeds(
            [_result("padding")["args"]["repeats"]] + [r["seeds"] for r in _result("time_to_loss_seq_len_warmup")["summary"]["arms"].values()])),
        "[Stability](benchmarks/stability.md)": ([], seeds([1])),  # each fault injected once, each setup one run
        "[Random restart](benchmarks/random-restart.md)": ([], seeds(
            r["seeds"] for r in _result("time_to_loss_restarts")["summary"]["arms"].values())),
        "[Scaling ladder](benchmarks/scaling.md)": ([
            "from {:.2f}M to {:.2f}M parameters".format(*(f(r["non_embedding_params"] for r in scaling.values()) / 1e6
                                                         for f in (min, max)))],
            seeds(o["seeds_at_best"] for r in scaling.values() for o in r["optimizers"].values())),
        "[Budget ladder](benchmarks/budget-ladder.md)": ([
            f"{_x(ladder['1x']['optimizers']['recipe']['token_ratio_vs_adamw'])} the tokens at {ladder['1x']['tokens_per_param']:.1f} "
            f"tokens per parameter, {_x(ladder['16x']['optimizers']['recipe']['token_ratio_vs_adamw'])} at "
            f"{ladder['16x']['tokens_per_param']:.0f}"],
            seeds(o["seeds_at_best"] for k in ("1x", "2x", "4x", "8x", "16x") for o in ladder[k]["optimizers"].values())),
        "[hf-best](benchmarks/hf-best.md)": ([f"{min(lower):.2f}-{max(lower):.2f} lower in loss than hf-tuned",
                                              f"at {_tpp('16x'):.0f} tokens per parameter"],
                                             seeds(r["seeds"] for k in ("1x", "4x", "16x") for r in hf_best[k].values())),
        "[64x](benchmarks/64x.md)": ([f"at {_tpp('64x'):.0f} tokens per parameter"],
                                     seeds(r["seeds"] for r in hf_best["64x"].values())),
        "[Larger model](benchmarks/larger-model.md)": ([f"at {_tpp('54x-3x192'):.0f} tokens per parameter"],
                                                       seeds(r["seeds"] for r in hf_best["54x-3x192"].values())),
        "[Muon on MoE](benchmarks/moe-muon.md)": ([], seeds(len(v) for v in _result("moe_muon")["final_eval_loss"].values())),
        "[hf-best+](benchmarks/hf-best-plus.md)": ([
            f"much at 1x: hf-best+ ends at {groups['1x']['hf-best+']['final_eval_loss']:.3f} against "
            f"{vs['1x']['target_eval_loss']:.3f}; `gpt2_tiny` needs "
            + _ratio(_groups_ratio("recipe (the budget ladder's, at its best lr)"), "its tokens", "fewer")
            + f", `recipe+groups` {_x(_groups_ratio('recipe+groups'))}; at 4x {groups['4x']['hf-best+']['final_eval_loss']:.3f} "
            f"against {vs['4x']['target_eval_loss']:.3f}, the searched recipe {_x(soonest('4x'))}; at 16x "
            f"{groups['16x']['hf-best+']['final_eval_loss']:.3f} against {vs['16x']['target_eval_loss']:.3f}, the searched "
            f"recipe {_x(soonest('16x'))}"],
            seeds([r["seeds"] for k in groups for r in groups[k].values()]
                  + [_arm("time_to_loss", "fasttrain")["seeds"]])),  # the budget ladder's recipe row: its 3 seeds
        "[Fine-tuning](fine-tuning.md#what-helps-the-benchmark)": ([
            f"Muon {_x(ft['muon@adamw-base']['tokens_ratio_vs_reference'])} hf-tuned's tokens, WSD "
            f"{_x(ft['+wsd']['tokens_ratio_vs_reference'])}; token budgets, packing and the EMA do not help"],
            seeds(r["seeds"] for r in ft.values())),
        "[LoRA](fine-tuning.md#lora)": ([
            f"Muon {_x(lora['lora-muon']['tokens_ratio_vs_reference'])} LoRA-AdamW's tokens "
            f"({_x(lora['lora-muon+ema']['tokens_ratio_vs_reference'])} with the EMA), half the optimizer state"],
            seeds(r["seeds"] for r in lora.values())),
        "[GPU fast path](benchmarks/gpu-fast-path.md)": ([
            f"no: {reads['trainer'] - reads['filter'] + reads['guard']} reads per step with the guard, "
            f"{reads['trainer'] - reads['filter']} without, against the Trainer's {reads['trainer']} (a test counts them)"], "-"),
        "[Startup](benchmarks/startup.md)": ([f"under {math.floor(max(r['after_s'] for r in _result('startup')['rows'])) + 1} s"],
                                             str(_result("startup")["meta"]["repeats"])),
        "[Memory](benchmarks/memory.md)": ([f"{_mib('chunked-fp32')} kept for backward instead of {_mib('standard-fp32')}"],
                                           str(_result("lm_head_loss_memory_cpu")["config"]["repeats"])),
    }


# the study rows tested here; the transfer and nanoGPT rows are their studies' own tests
STUDY_LINKS = [
    "[Time to loss](benchmarks/time-to-loss.md)", "[Technique ablation](benchmarks/ablation.md)",
    "[Optimizers](benchmarks/optimizers.md)", "[Schedules](benchmarks/schedules.md)",
    "[Sequence length](benchmarks/sequence-length.md)", "[Stability](benchmarks/stability.md)",
    "[Random restart](benchmarks/random-restart.md)", "[Scaling ladder](benchmarks/scaling.md)",
    "[Budget ladder](benchmarks/budget-ladder.md)", "[hf-best](benchmarks/hf-best.md)", "[64x](benchmarks/64x.md)",
    "[Larger model](benchmarks/larger-model.md)", "[Muon on MoE](benchmarks/moe-muon.md)",
    "[hf-best+](benchmarks/hf-best-plus.md)", "[Fine-tuning](fine-tuning.md#what-helps-the-benchmark)",
    "[LoRA](fine-tuning.md#lora)", "[GPU fast path](benchmarks/gpu-fast-path.md)", "[Startup](benchmarks/startup.md)",
    "[Memory](benchmarks/memory.md)"]


def test_every_study_row_is_tested():
    rows = _table_rows((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8"), "| study | question |")
    own = {"[Transfer across width](benchmarks/transfer.md)", "[nanoGPT on tinyshakespeare](benchmarks/nanogpt.md)"}
    assert set(rows) == set(STUDY_LINKS) | own and set(_study_answers()) == set(STUDY_LINKS)


@pytest.mark.parametrize("link", STUDY_LINKS)
def test_every_study_row_of_the_summary_quotes_the_results(link):
    """Each row of the summary's study table: the figures of its answer and its seeds cell, from the results JSON
    (the rows' other figures are in FIGURES, and the transfer and nanoGPT rows in their own study's tests)."""
    rows = _table_rows((ROOT / "docs/benchmarks.md").read_text(encoding="utf-8"), "| study | question |")
    question, answer, seeds = rows[link]
    wanted, seeds_expected = _study_answers()[link]
    for text in wanted:
        assert text in question + " " + answer, f"{link}: {text!r} not in {answer!r}"
    assert seeds == seeds_expected, f"{link}: seeds {seeds!r}, the results say {seeds_expected!r}"


def test_the_summary_s_claims_hold_in_the_results():
    """The words of the summary and the cards that are claims about the results, not numbers: checked on the JSON."""
    # hf-best's search picked warmup-stable-decay to 0 and a high beta2 at every searched budget
    for key in ("1x", "4x", "16x"):
        best = _result("hf_best")["summary"][key]["hf-best"]["best"]
        assert best["schedule"].startswith("wsd") and best["beta2"] >= 0.99, (key, best)
    # schedules: on short runs constant and 1-sqrt end lowest, at both peak lrs; with the recipe the shapes lie
    # within the seed spread (the medians closer together than any one shape's seeds)
    for name in ("lr_schedules", "lr_schedules_lr1e-2"):
        arms = _result(name)["summary"]["arms"]
        lowest = sorted(arms, key=lambda a: arms[a]["final_eval_loss"])[:2]
        assert {a.split("@")[0] for a in lowest} == {"lr-constant", "lr-1-sqrt"}, (name, lowest)
    by_arm: dict[str, list[float]] = {}
    for r in _result("time_to_loss_recipe_decay")["runs"]:
        by_arm.setdefault(r["arm"], []).append(r["final_eval_loss"])
    import statistics

    medians = [statistics.median(v) for v in by_arm.values()]
    assert max(medians) - min(medians) < min(max(v) - min(v) for v in by_arm.values())
    # fine-tuning: token budgets, packing and the EMA never reach hf-tuned's loss sooner
    arms = _result("fine_tuning")["summary"]["arms"]
    assert all(not arms[a]["tokens_ratio_vs_reference"] < 1 for a in ("+token-budget", "+packing", "+ema"))
    # LoRA: Muon keeps half AdamW's optimizer state
    lora = _result("lora_fine_tuning")["summary"]["arms"]
    assert round(lora["lora-muon"]["optimizer_state_bytes"] / lora["lora-adamw"]["optimizer_state_bytes"], 2) == 0.5
    # startup: every command answers under the second quoted, and without importing torch (the study's own test)
    assert all(r["after_s"] < 1 for r in _result("startup")["rows"])


def test_the_stability_card_s_claims_hold_in_the_fault_injection():
    """Every guarded setup survived every fault with no non-finite tensor on disk; the bare Trainer ended with NaN
    weights after exactly a NaN loss, an inf loss and a NaN weight (the stability card and the summary)."""
    runs = [r for r in _result("faults")["runs"] if r["injection"] != "none"]
    guarded = [r for r in runs if r["setup"] != "bare"]
    assert {r["setup"] for r in guarded} >= {"fasttrainer", "trainer+mixin", "trainer+callbacks"}
    assert all(r["survived"] and r["final_weights_finite"] and r["disk"]["nonfinite_tensors"] == 0 for r in guarded)
    lost = {r["injection"] for r in runs if r["setup"] == "bare" and not r["final_weights_finite"]}
    assert lost == {"nan_loss", "inf_loss", "nan_weight"}, lost


def test_every_averaged_seed_lands_below_the_recipe_s_range():
    """The weight-averaging card: each seed of EMA and of LAWA reached hf-tuned's final loss in fewer tokens than
    every seed of the recipe without them (tokens to the target, read off each run's curve)."""
    from benchmarks._harness.lm import crossing

    record = _result("ablation_to_hf_tuned_target")
    target = record["summary"]["target_eval_loss"]
    tokens: dict[str, list[float]] = {}
    for r in record["runs"]:
        tokens.setdefault(r["arm"], []).append(crossing(r["curve"], target, "tokens"))
    assert len(tokens["base"]) == 3
    assert max(tokens["base+ema"] + tokens["base+lawa"]) < min(tokens["base"])


def test_the_budget_table_on_the_schedules_card_is_the_package_s():
    """The schedules card's settings by run length: each row's bounds are budget_aware's, each lr factor and
    multiplier is the table's, and each length it was measured at is the ladder's (tokens per parameter)."""
    from hf_fasttrain.config.budget import LONGEST_MEASURED, REGIMES

    rows = _table_rows((ROOT / "docs/techniques/schedules.md").read_text(encoding="utf-8"), "| tokens per parameter | AdamW |")
    bounds = [r.max_tokens_per_param for r in REGIMES]
    names = [f"up to {bounds[0]:g}"] + [f"{a:g} to {b:g}" for a, b in zip(bounds, bounds[1:-1])] + [f"above {bounds[-2]:g}"]
    assert list(rows) == names
    for name, regime in zip(names, REGIMES):
        adamw, muon, measured = rows[name]
        for family, cell in (("adamw", adamw), ("muon", muon)):
            if regime.lr_factor.get(family) is not None:
                assert f"{regime.lr_factor[family]:g}x" in cell, (name, family)
            settings = regime.settings[family]
            kwargs = settings.get("optimizer_kwargs") or {}
            if cell.startswith(("as ", "the search's winner")):  # a row given as another's settings
                continue
            assert f"wd {settings['weight_decay']:g}" in cell and f"beta2 {settings['adam_beta2']:g}" in cell, (name, family)
            for group, factor in (kwargs.get("lr_multipliers") or {}).items():
                assert f"{'embeddings' if group == 'embedding' else group + 's'} at {factor:g}x" in cell, (name, family, group)
            if kwargs.get("adamw_lr_ratio", 1.0) != 1.0:
                assert f"the AdamW part at {kwargs['adamw_lr_ratio']:g}x Muon's lr" in cell, name
        for key, tpp in (("1x", "1.5"), ("4x", "6.2"), ("16x", "24.8"), ("64x", "99.1")):
            if f"at {tpp}" in measured:
                assert f"{_tpp(key):.1f}" == tpp, (name, key)
    assert "with wd 0.2" in rows["8.8 to 12.4"][1] and REGIMES[2].settings["muon"]["weight_decay"] == 0.2
    assert LONGEST_MEASURED == round(_tpp("64x"), 1)
    # the optimizers card: budget_aware takes hf-best+'s group multipliers for AdamW at 1x and 4x
    for key, regime in (("1x", REGIMES[0]), ("4x", REGIMES[1])):
        best = _result("hf_best_groups")["summary"][key]["hf-best+"]["best"]
        kwargs = regime.settings["adamw"]["optimizer_kwargs"]
        assert kwargs["lr_multipliers"] == {g: best[k] for g, k in (("embedding", "emb_lr"), ("norm", "norm_lr")) if k in best}
        assert kwargs.get("weight_decay_on") == best.get("wd_on")


def test_muon_s_traffic_under_fsdp2_is_the_package_s_estimate():
    """The precision card's table of bytes per rank and step: GPT-2 small's Muon matrices (the package's routing, on
    the meta device) through hf_fasttrain.optim.muon_communication_bytes, and FSDP2's own 3 P (W-1)/W."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    from hf_fasttrain.optim import muon_communication_bytes
    from hf_fasttrain.optim.routing import muon_routing

    with torch.device("meta"):
        model = GPT2LMHeadModel(GPT2Config())
    params = dict(model.named_parameters())
    matrices = [n for n, route in muon_routing(model).items() if route == "muon"]
    elements = sum(params[n].numel() for n in matrices)
    total = sum(p.numel() for p in model.parameters())
    page = " ".join((ROOT / "docs/techniques/precision-and-scale.md").read_text(encoding="utf-8").split())
    assert f"| GPT-2 small ({len(matrices)} Muon matrices, {elements / 1e6:.1f}M elements, fp32) |" in page

    def mb(x: float) -> str:
        return f"{x / 1e6:,.0f} MB" if x >= 1e8 else f"{x / 1e6:.3g} MB"  # whole MB, or 3 significant digits

    worlds = (2, 8, 64)
    est = {w: muon_communication_bytes(elements, w) for w in worlds}
    fsdp = {w: 3 * total * 4 * (w - 1) / w for w in worlds}
    assert "| gather (default): N (W-1)/W | " + " | ".join(mb(est[w]["gather"]) for w in worlds) + " |" in page
    assert "| round-robin: 2 N (W-1)/W^2 | " + " | ".join(mb(est[w]["round_robin"]) for w in worlds) + " |" in page
    assert " | ".join(mb(fsdp[w]) for w in worlds) + " |" in page
    assert (f"at 8 ranks the gather adds ~{100 * est[8]['gather'] / fsdp[8]:.0f}% to FSDP2's traffic, round-robin "
            f"~{100 * est[8]['round_robin'] / fsdp[8]:.0f}%") in page


@pytest.mark.slow  # a short training run, about 10 s on a quiet machine
def test_each_own_data_command_has_its_own_output_dir():
    """A recipe command on the reader's data writes its own run folder: after the README's first command
    runs/gpt2_tiny holds a finished run, and a rerun there with other data is refused."""
    dirs, found = {}, 0
    for path in (DOCS / "own-data.md", DOCS / "runs.md"):
        for block in extract_blocks(path):
            if block.lang != "bash":
                continue
            for command in re.sub(r"\\\n\s*", " ", block.code).splitlines():
                if "recipes/gpt2_small.py" in command and "--dataset" in command:
                    found += 1
                    m = re.search(r"--output_dir (\S+)", command)
                    assert m, f"{block.where}: no --output_dir in {command!r}"
                    assert m.group(1) not in dirs, f"{block.where}: {m.group(1)} also used at {dirs[m.group(1)]}"
                    dirs[m.group(1)] = block.where
    assert found >= 7


def test_the_switch_trainer_example_runs(tmp_path, monkeypatch, capfd):
    """examples/switch_trainer.py, linked from README and the quickstart, runs offline and trains, and
    transformers says nothing about the special-token ids of its model config (they are the tokenizer's)."""
    import runpy

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    script = runpy.run_path(str(ROOT / "examples" / "switch_trainer.py"))
    assert script["Trainer"].__module__.startswith("hf_fasttrain")  # the switched import line
    losses = script["main"](output_dir=str(tmp_path / "run"), max_steps=4)
    err = capfd.readouterr().err
    for warning in ("bos_token_id must be", "eos_token_id must be", "new PAD/BOS/EOS tokens"):
        assert warning not in err, err[-2000:]
    assert losses["after"] < losses["before"]
    assert (tmp_path / "run" / "metrics.json").exists() and (tmp_path / "run" / "checkpoint-4").is_dir()


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write-options"]:
        (DOCS / "options.md").write_text(render_options_page(), encoding="utf-8")
        print("wrote", DOCS / "options.md")
    elif sys.argv[1:] == ["--write-cli"]:
        (DOCS / "cli.md").write_text(render_cli_page(), encoding="utf-8")
        print("wrote", DOCS / "cli.md")
    elif sys.argv[1:2] == ["--check-site"] and len(sys.argv) == 3:
        problems = check_site(Path(sys.argv[2]))
        print("\n".join(problems) or f"site {sys.argv[2]}: clean")
        sys.exit(1 if problems else 0)
    else:
        print("usage: python tests/test_docs.py --write-options | --write-cli | --check-site SITE_DIR")
