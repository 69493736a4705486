"""Docs that cannot rot: README.md and docs/ are checked against the code.

- Code blocks marked to run are run. The marker is an HTML comment on the line before the fence
  (only blank lines may sit between), invisible on GitHub and on the site:

      <!-- test: run -->                   a self-contained Python block
      <!-- test: run setup=tiny -->        given `model`, `tokenizer`, `train`, `val`, `collator` (tiny GPT-2)
      <!-- test: run setup=tiny_trainer --> the same plus `args` and `trainer` (a plain transformers.Trainer
                                            with lr_scheduler_type="constant")
      <!-- test: run continue -->          runs in the namespace of the file's previous run block
      <!-- test: run slow -->              marked slow;  requires=trl: skipped without that package
      <!-- test: recipe -->                a YAML recipe, validated as `--config` would validate it

  Each block runs in a fresh temporary working directory, offline; training blocks use a few steps.
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
SETUPS = ("none", "tiny", "tiny_trainer")


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
#     <!-- needs: hf_fasttrain.guard -->  ...  <!-- /needs -->
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


def parse_directive(text: str) -> dict:
    words = text.split()
    if not words or words[0] not in ("run", "recipe"):
        raise AssertionError(f"unknown test marker {text!r}: use 'run ...' or 'recipe'")
    out = {"kind": words[0], "setup": "none", "continue": False, "slow": False, "requires": None}
    for word in words[1:]:
        if word in ("continue", "slow"):
            out[word] = True
        elif word.startswith("setup=") and word[6:] in SETUPS:
            out["setup"] = word[6:]
        elif word.startswith("requires="):
            out["requires"] = word[9:]
        else:
            raise AssertionError(f"unknown word {word!r} in test marker {text!r}; setups: {SETUPS}")
    return out


def all_blocks() -> list[Block]:
    return [b for path in markdown_files() for b in extract_blocks(path)]


def run_chains() -> list[list[tuple[Block, dict]]]:
    """Marked Python blocks, grouped: a `continue` block joins the chain before it in the same file."""
    chains: list[list[tuple[Block, dict]]] = []
    for block in all_blocks():
        if block.directive is None:
            continue
        d = parse_directive(block.directive)
        if d["kind"] != "run":
            continue
        assert block.lang == "python", f"{block.where}: only python blocks can run, not {block.lang!r}"
        if d["continue"]:
            assert chains and chains[-1][0][0].path == block.path, f"{block.where}: 'continue' with no run block before"
            chains[-1].append((block, d))
        else:
            chains.append([(block, d)])
    return chains


def _chain_param(chain):
    marks = []
    if any(d["slow"] for _, d in chain):
        marks.append(pytest.mark.slow)
    return pytest.param(chain, id=chain[0][0].where, marks=marks)


def _namespace(setup: str, request) -> dict:
    if setup == "none":
        return {"__name__": "__docs__"}
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments

    from conftest import make_tiny_gpt2

    tokenizer = request.getfixturevalue("tiny_tokenizer")
    lm = request.getfixturevalue("tiny_lm")
    ns = {
        "__name__": "__docs__",
        "model": make_tiny_gpt2(len(tokenizer)),
        "tokenizer": tokenizer,
        "train": lm["train"],
        "val": lm["validation"],
        "collator": DataCollatorForLanguageModeling(tokenizer, mlm=False),
    }
    if setup == "tiny_trainer":
        ns["args"] = TrainingArguments(
            output_dir="runs/plain", max_steps=5, per_device_train_batch_size=8, learning_rate=2e-3,
            lr_scheduler_type="constant", logging_steps=1, save_strategy="no", report_to="none",
            use_cpu=True, disable_tqdm=True, seed=0,
        )
        ns["trainer"] = Trainer(model=ns["model"], args=ns["args"], train_dataset=ns["train"],
                                data_collator=ns["collator"], processing_class=tokenizer)
    return ns


@pytest.mark.parametrize("chain", [_chain_param(c) for c in run_chains()])
def test_doc_snippet_runs(chain, request, tmp_path, monkeypatch):
    first, d0 = chain[0]
    if first.inactive:
        # every branch is merged: a snippet whose module is missing is documentation of code that is not there
        pytest.fail(f"{first.where}: {first.inactive}; the snippet documents code that does not exist")
    for _, d in chain:
        if d["requires"]:
            pytest.importorskip(d["requires"])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("WANDB_DISABLED", "true")
    ns = _namespace(d0["setup"], request)
    for block, _ in chain:
        exec(compile(block.code, block.where, "exec"), ns)  # noqa: S102 - the docs' own code


def test_markers_are_found():
    """The runner sees the blocks it should: a marker typo would silently drop a block."""
    where = {c[0][0].path.name for c in run_chains()}
    assert {"README.md", "getting-started.md", "any-trainer.md", "optimizers.md", "schedules.md"} <= where
    assert len(run_chains()) >= 15


def test_recipe_blocks_validate():
    from hf_fasttrain.recipes import validate_recipe

    blocks = [b for b in all_blocks() if b.directive and parse_directive(b.directive)["kind"] == "recipe"]
    assert blocks, "no recipe block marked in the docs"
    for block in blocks:
        if not block.inactive:
            validate_recipe(yaml.safe_load(block.code))  # raises naming an unknown key or a bad value


# The branches whose documentation waits in needs/until regions, by the name that shows they are merged.
PENDING = {
    "hf_fasttrain._validation": "cli",
    "hf_fasttrain.wiring": "dropin",
    "hf_fasttrain.guard": "guard",
    "hf_fasttrain.push": "reshape",
    "hf_fasttrain.optim.muon.ns_coefficient_schedule": "sharded",
    "hf_fasttrain.averaging": "faster",
    "hf_fasttrain.modeling.check_model_type": "scaling",
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

    from hf_fasttrain.args import DataArguments, FastTrainingArguments, ModelArguments

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
            tables.setdefault(kind, {})
            continue
        if set(cells[0]) <= set("-: "):
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
    "Throughput logging": "getting-started.md#what-fasttrainer-logs",
    "Precision": "techniques/precision-and-scale.md",
    "Run management": "getting-started.md#the-two-one-line-commands",
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

    from hf_fasttrain.args import FastTrainingArguments

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


def render_options_page() -> str:
    header = "| {} | default | what it does |\n|---|---|---|\n"
    parts = [OPTIONS_INTRO]
    for title, fields in _option_groups():
        card = f"Card: [{title}]({CARDS[title]}).\n\n" if title in CARDS else ""
        parts.append(f"## {title}\n\n{card}" + header.format("FastTrainingArguments option") + _option_rows(fields) + "\n")
    fields = own_fields()
    parts.append("## Recipe `model:` section\n\n`ModelArguments`: the model to train, built from scratch or "
                 "loaded.\n\n" + header.format("model: key") + _option_rows(fields["model: key"].values()) + "\n")
    parts.append("## Recipe `data:` section\n\n`DataArguments`: which text, which tokenizer, how it is cut "
                 "([the embedded default](getting-started.md#the-embedded-default-training-with-no-network)).\n\n"
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


def _recipe_keys() -> set[str]:
    from hf_fasttrain.args import DataArguments, FastTrainingArguments, ModelArguments

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
    assert 'python -m pytest -q -m "not slow" tests' in text


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


@pytest.mark.parametrize("page, results_file, header, arms", [
    ("README.md", "time_to_loss.md", "| arm | final eval loss (median) | train seconds to 4.716",
     {"hf-default", "hf-tuned", "fasttrain"}),
    ("docs/benchmarks.md", "time_to_loss.md", "| arm | final eval loss (median) | train seconds to 4.716",
     {"hf-default", "hf-tuned", "fasttrain"}),
    # the earlier run with every optimizer arm (its fasttrain was Muon alone)
    ("docs/benchmarks.md", "time_to_loss_all_arms.md", "| arm | final eval loss (median) | seconds to 4.716",
     {"hf-tuned", "opt-muon", "opt-soap"}),
])
def test_time_to_loss_tables_quote_the_results(page, results_file, header, arms):
    """The headline table (README, benchmarks page) and the optimizer one say what the benchmark wrote."""
    results = _table_rows((ROOT / "benchmarks/results" / results_file).read_text(encoding="utf-8"), "| arm |")
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


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write-options"]:
        (DOCS / "options.md").write_text(render_options_page(), encoding="utf-8")
        print("wrote", DOCS / "options.md")
    else:
        print("usage: python tests/test_docs.py --write-options")
