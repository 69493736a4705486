"""The import graph of hf_fasttrain: no circle, and no import from a lower layer to a higher one.

Every module's imports are read with ``ast`` (nothing is imported), lazy imports inside functions
included. ``from .a.b import c`` counts as importing ``a`` (its ``__init__`` runs), ``a.b`` and, when ``c``
is a submodule, ``a.b.c``; a module's own packages (loaded before it) are not counted, and the root package
counts only where names are taken from it. Layers, bottom to top (a module may import its own layer and those below):

0. leaf: ``_version``, ``_files``, ``_validation``, ``console`` (standard library only; the one way to refuse a setting)
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
    "_validation": LEAF,
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
    "_resume_identity": CORE,
    "config.budget": CORE,
    "config._options": CORE,
    "config._recipe_files": CORE,  # recipe files for the fast path (no torch)
    "config.decoders": CORE,
    # config
    "config": CONFIG,  # config/__init__.py (a docstring)
    "config.args": CONFIG,
    "config._model_data_args": CONFIG,  # ModelArguments, DataArguments (re-exported by args)
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
