"""The import graph of hf_fasttrain: no circle, and no import from a lower layer to a higher one.

Every module's imports are read with ``ast`` (nothing is imported), lazy imports inside functions
included. ``from .a.b import c`` counts as importing ``a`` (its ``__init__`` runs), ``a.b`` and, when ``c``
is a submodule, ``a.b.c``; a module's own packages (loaded before it) are not counted, and the root package
counts only where names are taken from it. Layers, bottom to top (a module may import its own layer and those below):

0. leaf: ``_version``, ``_files``, ``validation``, ``console`` (standard library only; the one way to refuse a setting)
1. cores: pure parts with no Trainer wiring (schedules, optim, data, clipping, precision, the restart
   search core, throughput, the guard core, metrics, hub URIs, run info)
2. config: ``args`` (FastTrainingArguments builds and checks the cores' configs)
3. adapters: callbacks, the trainer wiring, model building, recipe YAML <-> args, push
4. top: the trainer, run, cli, the restart recipe runner (``recipe_restarts``), the package face

A module under no entry fails the test: place it in ``LAYERS`` when you add it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "hf_fasttrain"
PKG = "hf_fasttrain"

LEAF, CORE, CONFIG, ADAPTER, TOP = range(5)
LAYER_NAMES = ["leaf", "core", "config", "adapter", "top"]

# module or package prefix -> layer; the longest prefix wins
LAYERS = {
    "_version": LEAF,
    "_files": LEAF,
    "console": LEAF,  # the run's console line (standard library only)
    "validation": LEAF,
    # cores
    "schedules": CORE,
    "optim": CORE,
    "data": CORE,
    "stability": CORE,  # clipping, precision, the guard's decision, snapshots, weight averages, trainables
    "restarts": CORE,
    "throughput": CORE,
    "metrics": CORE,
    "hub": CORE,
    "runinfo": CORE,
    "resume_identity": CORE,
    "config.budget": CORE,
    "config.options": CORE,
    "config._recipe_files": CORE,  # recipe files for the fast path (no torch)
    "config.decoders": CORE,
    # config
    "config": CONFIG,  # config/__init__.py (a docstring)
    "config.args": CONFIG,
    "config.model_data_args": CONFIG,  # ModelArguments, DataArguments (re-exported by args)
    # adapters
    "callbacks": ADAPTER,
    "wiring": ADAPTER,
    "modeling": ADAPTER,
    "transfer": ADAPTER,  # muP on a model from the outside (hooks, init) and the coordinate check, over optim
    "config.recipes": ADAPTER,
    "run.push": ADAPTER,
    # top
    "trainer": TOP,
    "cli": TOP,
    "run": TOP,  # run/: the recipe's train(), random restart for a recipe, --dry_run, generate
    "": TOP,  # hf_fasttrain/__init__.py
}

# Cores that import nothing of the package but the leaf: the restart search and the Hub URIs
# (hub.py is also loaded by file path in a bare interpreter by tests/test_hub.py).
SELF_CONTAINED = ["restarts.config", "restarts.ranking", "restarts.state", "restarts.orchestrator",
                  "restarts.ray_backend", "restarts.report", "restarts", "hub"]

# Upward imports allowed for now (none). An entry that no longer matches an import fails the
# test: delete it then.
PENDING = {
}


def _modules() -> dict[str, Path]:
    """Dotted name relative to the package ('' for the root, 'data' for data/__init__.py) -> file."""
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if "next_token_accuracy" in parts:  # an `evaluate` metric script, loaded by path
            continue
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _is_package(name: str) -> bool:
    return (ROOT / Path(*name.split(".")) / "__init__.py").is_file() if name else True


def _targets(dotted: str, names: list[str]) -> set[str]:
    """What importing ``dotted`` (relative name, '' = root) and taking ``names`` from it loads."""
    found = set()
    parts = dotted.split(".") if dotted else []
    for i in range(1, len(parts) + 1):  # every package on the way runs its __init__
        prefix = ".".join(parts[:i])
        if prefix in MODULES:
            found.add(prefix)
    for n in names:
        sub = f"{dotted}.{n}" if dotted else n
        if sub in MODULES:
            found.add(sub)
        elif not dotted:  # a name taken from the package face (hf_fasttrain/__init__.py)
            found.add("")
    return found


def imports_of(name: str) -> set[str]:
    """The package-relative modules that module ``name`` imports, at module level or inside functions."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    package = name if _is_package(name) else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == PKG or alias.name.startswith(PKG + "."):
                    out |= _targets(alias.name[len(PKG) + 1:], [])
        elif isinstance(node, ast.ImportFrom):
            names = [a.name for a in node.names]
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                dotted = ".".join(base + (node.module.split(".") if node.module else []))
                out |= _targets(dotted, names)
            elif node.module and (node.module == PKG or node.module.startswith(PKG + ".")):
                out |= _targets(node.module[len(PKG) + 1:], names)
    # a module's own packages are loaded before it: importing a sibling does not import them again
    parts = name.split(".") if name else []
    return out - {name} - {".".join(parts[:i]) for i in range(1, len(parts))}


GRAPH = {m: imports_of(m) for m in MODULES}


def layer_of(name: str) -> int:
    best = None
    for prefix, layer in LAYERS.items():
        if name == prefix or (prefix and name.startswith(prefix + ".")) or prefix == "":
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, layer)
    if best is None or (best[0] == "" and name != ""):
        raise KeyError(name)
    return best[1]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _name(m: str) -> str:
    return f"{PKG}.{m}" if m else PKG


def test_the_reader_sees_known_imports():
    """A guard against a reader that finds nothing (and so passes everything)."""
    assert {"data.from_args", "restarts", "restarts.config"} <= GRAPH["config.args"]
    assert {"run.train", "config.recipes", "restarts", "_files"} <= GRAPH["run.recipe_restarts"]
    assert "config.recipes" in GRAPH["run.push"] and "hub" in GRAPH["config.recipes"]
    assert "stability.precision" in GRAPH["config.args"]  # a lazy import inside a method
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_module_has_a_layer():
    unplaced = []
    for m in MODULES:
        try:
            layer_of(m)
        except KeyError:
            unplaced.append(_name(m))
    assert not unplaced, f"place these modules in LAYERS of {__file__}: {unplaced}"


def test_no_import_circle():
    cycles = _cycles(GRAPH)
    lines = []
    for comp in cycles:
        edges = [f"{_name(a)} -> {_name(b)}" for a in comp for b in sorted(GRAPH[a]) if b in comp]
        lines.append(", ".join(edges))
    assert not cycles, "import circles:\n" + "\n".join(lines)


def test_no_import_from_a_higher_layer():
    upward, used = [], set()
    for m in sorted(MODULES):
        for target in sorted(GRAPH[m]):
            if layer_of(target) > layer_of(m):
                if (m, target) in PENDING:
                    used.add((m, target))
                    continue
                upward.append(
                    f"{_name(m)} ({LAYER_NAMES[layer_of(m)]}) imports {_name(target)} ({LAYER_NAMES[layer_of(target)]})"
                )
    assert not upward, "imports that run up a layer:\n" + "\n".join(upward)
    stale = sorted(set(PENDING) - used)
    assert not stale, f"these PENDING entries no longer match an import; delete them: {stale}"


@pytest.mark.parametrize("module", SELF_CONTAINED)
def test_self_contained_cores_import_only_the_leaf(module):
    outside = {
        t for t in GRAPH[module]
        if layer_of(t) != LEAF and not (module.startswith("restarts") and t.startswith("restarts") and layer_of(t) == CORE)
    }
    assert not outside, f"{_name(module)} imports {sorted(map(_name, outside))}"


# ---- private names across module borders

# A private name imported from another module (``from .x import _name``), a private module imported from
# outside the package that holds it (``config/_recipe_files.py`` from ``cli.py``; the root's ``_files`` is
# the whole package's), and another library's private names. These are the deliberate ones, each with why;
# any other fails the test (give the name a public spelling in the module whose concern it is), and an entry
# that no longer matches an import fails too.
PRIVATE_IMPORTS = {
    ("trainer", "wiring._row_length"): "the row length the wiring works out, for FastTrainer alone",
    ("throughput", "torch._dynamo.utils.counters"): "torch keeps its compile counters only there",
    ("throughput", "torch._dynamo.convert_frame.FRAME_COMPILE_COUNTER"): "torch keeps its compile counters only there",
}


def _private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def private_imports(name: str, source: str | None = None) -> set[str]:
    """What module ``name`` (its file, or ``source``) imports under a private name across a module border:
    package-relative dotted names, another library's with its full name."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8") if source is None else source)
    package = name if _is_package(name) else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        pairs = []  # (package-relative module, the name taken from it or None)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(PKG + "."):
                    pairs.append((alias.name[len(PKG) + 1:], None))
                elif any(map(_private, alias.name.split("."))):
                    found.add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".") if package else []
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                dotted = ".".join(base + (node.module.split(".") if node.module else []))
            elif node.module and (node.module == PKG or node.module.startswith(PKG + ".")):
                dotted = node.module[len(PKG) + 1:]
            else:
                module = node.module or ""
                found |= {f"{module}.{a.name}" for a in node.names
                          if _private(a.name) or any(map(_private, module.split(".")))}
                continue
            pairs += [(dotted, a.name) for a in node.names]
        for dotted, taken in pairs:
            parts = dotted.split(".") if dotted else []
            if taken and (dotted == package or f"{dotted}.{taken}" in MODULES):
                parts.append(taken)  # a module taken from its package
            elif taken and _private(taken) and dotted != name:
                found.add(f"{dotted}.{taken}")  # a private name of another module
            for i, part in enumerate(parts):
                holder = ".".join(parts[:i])  # the package that holds the private module
                if _private(part) and holder and package != holder and not package.startswith(holder + "."):
                    found.add(".".join(parts[: i + 1]))  # a private module, from outside its package
                    break
    return found


PRIVATE = {(m, t) for m in MODULES for t in private_imports(m)}


def test_the_private_reader_sees_each_kind():
    """A guard against a reader that finds nothing: each kind it must see, and what it must let pass."""
    source = """
from ..config._recipe_files import x       # a private module of config/, from restarts/
from .state import _atomic                  # a private name of a sibling
from .._files import atomic_write_text      # the root's private module: the whole package's
from . import _helpers                      # a private module of its own package
from .ranking import _local as _x           # taken under another name: still private
import torch._dynamo.utils                  # another library's private module
"""
    assert private_imports("restarts.report", source) == {
        "config._recipe_files", "restarts.state._atomic", "restarts.ranking._local", "torch._dynamo.utils"}
    assert private_imports("restarts.report", "from .report import _local") == set()  # its own name
    assert ("throughput", "torch._dynamo.utils.counters") in PRIVATE


def test_private_names_cross_module_borders_only_where_listed():
    unlisted = sorted(PRIVATE - set(PRIVATE_IMPORTS))
    assert not unlisted, "private names imported across a module border (give them public names):\n" + "\n".join(
        f"{_name(m)} imports {t}" for m, t in unlisted)
    stale = sorted(set(PRIVATE_IMPORTS) - PRIVATE)
    assert not stale, f"these PRIVATE_IMPORTS entries no longer match an import; delete them: {stale}"
