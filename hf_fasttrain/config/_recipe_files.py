"""Recipe files for the command line's fast path: where the bundled recipes are, which file a ``--config`` names,
and a first read of it (a key written twice in one mapping is refused). No torch, no transformers: the fast path
(:mod:`hf_fasttrain.config.options`) reads recipes before either is imported; the full path
(:mod:`hf_fasttrain.config.recipes`) reads them again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

from ..validation import ConfigError

__all__ = ["default_recipe_dirs", "find_recipes", "check_duplicate_keys", "config_source", "load_local_recipe"]

_PKG = Path(__file__).resolve().parent.parent  # the package root


def default_recipe_dirs() -> tuple[Path, Path]:
    import sys

    return (_PKG.parent / "recipes" / "configs", Path(sys.prefix) / "share" / "hf_fasttrain" / "recipes")


def find_recipes(dirs: Iterable[Path]) -> dict[str, Path]:
    """Name -> path of the ``*.yaml`` in ``dirs``, the first directory winning."""
    found: dict[str, Path] = {}
    for directory in dirs:
        directory = Path(directory)
        if directory.is_dir():
            for p in sorted(directory.glob("*.yaml")):
                found.setdefault(p.stem, p)
    return found


def check_duplicate_keys(text: str, source: str = "<recipe>") -> None:
    """Refuse a key written twice in one mapping (YAML keeps the last one silently).

    Works on the composed node tree (``yaml.compose`` with the safe loader): nothing is constructed.
    """
    import yaml

    root = yaml.compose(text, Loader=yaml.SafeLoader)
    stack = [(root, "")]
    while stack:
        node, prefix = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key_node, value_node in node.value:
                key = key_node.value if isinstance(key_node, yaml.ScalarNode) else None
                if key is not None:
                    line = key_node.start_mark.line + 1
                    if key in seen:
                        raise ConfigError(prefix + key, problem=f"written twice in {source} (lines {seen[key]} "
                                          f"and {line})", allowed="keep one of them")
                    seen[key] = line
                    stack.append((value_node, f"{prefix}{key}."))
        elif isinstance(node, yaml.SequenceNode):
            stack.extend((n, prefix) for n in node.value)


def load_local_recipe(source: str) -> Optional[dict[str, Any]]:
    """The raw mapping of a local or bundled recipe; None for hf:// URIs and anything unreadable here
    (the full path reports those)."""
    if source.startswith("hf://"):
        return None
    path = Path(source)
    if not path.is_file():
        path = find_recipes(default_recipe_dirs()).get(source)  # type: ignore[assignment]
        if path is None:
            return None
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text)
    except (OSError, yaml.YAMLError):
        return None
    check_duplicate_keys(text, str(path))
    return data if isinstance(data, dict) else None


def config_source(argv: Sequence[str]) -> Optional[str]:
    """The value of ``--config`` in ``argv`` (the last one given), or None."""
    found = None
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            found = argv[i + 1]
        elif a.startswith("--config="):
            found = a.split("=", 1)[1]
    return found
