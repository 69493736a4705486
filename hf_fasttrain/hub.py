"""Recipes on the Hugging Face Hub: ``hf://`` URIs, safe YAML, offline cache, push with a model card.

A recipe is data: a small YAML mapping whose keys are ``FastTrainingArguments`` field names plus
``model`` and ``data`` sections. This module does the parts that touch the Hub or untrusted text:

1. ``parse_hub_uri`` turns ``hf://<owner>/<repo>[/<path>.yaml][@<revision>]`` into
   ``(repo_id, filename, revision)``. The ``huggingface_hub`` spelling with the revision right after
   the repo (``hf://<owner>/<repo>@<revision>/<path>.yaml``) is accepted too.
2. ``resolve_hub_recipe`` fetches the file with ``huggingface_hub.hf_hub_download`` into the Hub cache
   (``HF_HUB_CACHE``); with ``HF_HUB_OFFLINE=1`` it only looks in the cache, and says so clearly
   (repo, file, revision, cache folder, how to fix) when the file is not there.
3. ``safe_load_yaml`` reads YAML with ``yaml.safe_load`` only: Python tags such as
   ``!!python/object/apply:os.system`` are refused before anything is constructed.
4. ``guard_trust_remote_code``: a Hub recipe never turns on ``trust_remote_code`` by itself.
   Design: every ``trust_remote_code`` key set to anything but ``false`` in a recipe that came from
   the Hub is *dropped* (with a warning naming the key), unless the caller passes
   ``trust_remote_code=True``, which is the user's own command-line flag. Dropping rather than
   refusing lets a recipe that asks for remote code still be read; if the model then really needs
   remote code, ``transformers`` stops with its own message and the user decides by passing
   ``--trust_remote_code true``.
5. ``prepare_recipe_folder`` / ``push_recipe`` write ``recipe.yaml`` and a ``README.md`` model card
   (what the recipe is, the command to run it, the measured results of a run with machine and
   versions) and upload them with ``HfApi.create_repo`` + ``HfApi.upload_folder``.

Environment: ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` are read when a function is called, not only
when ``huggingface_hub`` was imported (``huggingface_hub.constants`` freezes them at import time), so
setting them in a running process works as users expect.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, NamedTuple

import yaml

__all__ = [
    "DEFAULT_RECIPE_FILENAME",
    "HUB_URI_PREFIX",
    "RECIPE_MAX_BYTES",
    "RUN_FILES",
    "HubRecipeRef",
    "HubRecipeUnavailableError",
    "PushPlan",
    "RecipeYAMLError",
    "format_hub_uri",
    "guard_trust_remote_code",
    "is_hub_uri",
    "load_hub_recipe",
    "parse_hub_uri",
    "prepare_recipe_folder",
    "push_recipe",
    "read_run_results",
    "render_model_card",
    "resolve_hub_recipe",
    "safe_load_yaml",
]

logger = logging.getLogger(__name__)

HUB_URI_PREFIX = "hf://"
DEFAULT_RECIPE_FILENAME = "recipe.yaml"
# A recipe is a few dozen lines; anything much larger is not a recipe (and is not parsed).
RECIPE_MAX_BYTES = 1 << 20
# Files read from a run's output directory, in order of preference for each role. The foundation
# writes metrics.json, run_info.json and config.yaml; Trainer.save_metrics writes *_results.json.
RUN_FILES = {
    "metrics": ("metrics.json", "all_results.json", "train_results.json", "eval_results.json"),
    "run_info": ("run_info.json",),
    "config": ("config.yaml", "config.yml"),
    "plot": ("loss_curve.png",),
}

_YAML_SUFFIXES = (".yaml", ".yml")
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
_REPO_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Repo types that a hf:// URI may name; recipes live in model repos only.
_OTHER_REPO_TYPE_PREFIXES = {"datasets": "dataset", "spaces": "space", "buckets": "bucket", "kernels": "kernel"}
_TRUE_STRINGS = {"1", "on", "yes", "true"}


class RecipeYAMLError(ValueError):
    """A recipe's YAML text is not plain data (bad syntax, a Python tag, not a mapping, too large)."""


class HubRecipeUnavailableError(FileNotFoundError):
    """A ``hf://`` recipe could not be fetched: not cached while offline, or not found on the Hub."""


# ---------------------------------------------------------------------------------------------
# hf:// URIs
# ---------------------------------------------------------------------------------------------


class HubRecipeRef(NamedTuple):
    """Where a recipe lives on the Hub; unpacks as ``(repo_id, filename, revision)``.

    ``revision`` is ``None`` when the URI did not pin one (the Hub's default branch, ``main``).

    Example:
        ```python
        >>> ref = parse_hub_uri("hf://me/my-recipe/configs/small.yaml@v1")
        >>> ref.repo_id, ref.filename, ref.revision
        ('me/my-recipe', 'configs/small.yaml', 'v1')
        >>> ref.uri
        'hf://me/my-recipe/configs/small.yaml@v1'
        ```
    """

    repo_id: str
    filename: str
    revision: str | None

    @property
    def uri(self) -> str:
        return format_hub_uri(self.repo_id, self.filename, self.revision)


def is_hub_uri(value: Any) -> bool:
    """True when ``value`` is a string starting with ``hf://`` (nothing else is checked)."""
    return isinstance(value, str) and value.startswith(HUB_URI_PREFIX)


def format_hub_uri(repo_id: str, filename: str = DEFAULT_RECIPE_FILENAME, revision: str | None = None) -> str:
    """The shortest ``hf://`` URI for a recipe: the default file name and no revision are left out."""
    uri = HUB_URI_PREFIX + repo_id
    if filename != DEFAULT_RECIPE_FILENAME:
        uri += "/" + filename
    if revision:
        uri += "@" + revision
    return uri


def _uri_error(uri: str, problem: str) -> ValueError:
    return ValueError(
        f"Invalid Hub recipe URI {uri!r}: {problem}. Expected hf://<owner>/<repo>[/<path>.yaml][@<revision>], "
        f"e.g. hf://my-org/gpt2-recipe, hf://my-org/gpt2-recipe/configs/small.yaml@v1 "
        f"(the file defaults to {DEFAULT_RECIPE_FILENAME!r}, the revision to the default branch)."
    )


def _check_revision(uri: str, revision: str) -> str:
    if not revision:
        raise _uri_error(uri, "the revision after '@' is empty")
    if any(ch.isspace() for ch in revision) or ".." in revision or revision.startswith("/") or revision.endswith("/"):
        raise _uri_error(uri, f"revision {revision!r} is not a valid branch, tag or commit name")
    return revision


def _check_filename(uri: str, path: str) -> str:
    parts = path.split("/")
    if "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise _uri_error(uri, f"path {path!r} inside the repo has an empty, '.' or '..' segment or a backslash")
    if not path.endswith(_YAML_SUFFIXES):
        raise _uri_error(
            uri,
            f"path {path!r} inside the repo must name a .yaml or .yml file "
            f"(for a folder, write {path.rstrip('/') + '/' + DEFAULT_RECIPE_FILENAME!r})",
        )
    return path


def parse_hub_uri(uri: str) -> HubRecipeRef:
    """Split ``hf://<owner>/<repo>[/<path>.yaml][@<revision>]`` into ``(repo_id, filename, revision)``.

    The file defaults to ``recipe.yaml`` and the revision to ``None`` (the default branch). The
    ``huggingface_hub`` order ``hf://<owner>/<repo>@<revision>[/<path>.yaml]`` is accepted as well,
    and so is a leading ``models/``. Revisions may contain ``/`` (``refs/pr/3``) when written last.

    Raises:
        ValueError: the URI is malformed; the message says what is wrong and shows the grammar.

    Example:
        ```python
        >>> parse_hub_uri("hf://me/my-recipe")
        HubRecipeRef(repo_id='me/my-recipe', filename='recipe.yaml', revision=None)
        >>> tuple(parse_hub_uri("hf://me/my-recipe@3f2c" + "0" * 36 + "/sub/a.yaml"))
        ('me/my-recipe', 'sub/a.yaml', '3f2c000000000000000000000000000000000000')
        ```
    """
    if not isinstance(uri, str):
        raise _uri_error(repr(uri), f"expected a string, got {type(uri).__name__}")
    if not uri.startswith(HUB_URI_PREFIX):
        raise _uri_error(uri, f"it must start with {HUB_URI_PREFIX!r}")
    body = uri[len(HUB_URI_PREFIX) :]
    if not body:
        raise _uri_error(uri, "nothing follows 'hf://'")
    segments = body.split("/")
    if segments[0] == "models":
        segments = segments[1:]
    elif segments[0] in _OTHER_REPO_TYPE_PREFIXES:
        raise _uri_error(
            uri, f"it names a {_OTHER_REPO_TYPE_PREFIXES[segments[0]]} repo; recipes are read from model repos only"
        )
    if len(segments) < 2 or not segments[1]:
        raise _uri_error(uri, "the repo id must have an owner and a name, '<owner>/<repo>'")

    owner, repo_part, rest = segments[0], segments[1], segments[2:]
    revision: str | None = None
    if "@" in repo_part:
        # huggingface_hub order: <owner>/<repo>@<revision>[/<path>]
        repo, revision = repo_part.split("@", 1)
        if rest and rest[0] == "pr" and revision == "refs" and len(rest) >= 2:
            revision, rest = f"refs/pr/{rest[1]}", rest[2:]
        path = "/".join(rest)
        if "@" in path:
            raise _uri_error(uri, "it has two revisions ('@' appears twice)")
    else:
        repo = repo_part
        path = "/".join(rest)
        if "@" in path:
            path, revision = path.split("@", 1)
            if "@" in revision:
                raise _uri_error(uri, "it has two revisions ('@' appears twice)")
    for name, part in (("owner", owner), ("repo name", repo)):
        if not _REPO_PART_RE.match(part) or ".." in part or "--" in part or part.endswith((".git", ".")):
            raise _uri_error(
                uri,
                f"{name} {part!r} is not a valid Hub name (letters, digits, '-', '_', '.'; "
                "no '--' or '..'; not ending in '.' or '.git')",
            )
    if revision is not None:
        revision = _check_revision(uri, revision)
    filename = _check_filename(uri, path) if path else DEFAULT_RECIPE_FILENAME
    return HubRecipeRef(f"{owner}/{repo}", filename, revision)


# ---------------------------------------------------------------------------------------------
# Offline cache
# ---------------------------------------------------------------------------------------------


def _hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` as ``huggingface_hub`` reads it, also when set after import."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return bool(constants.HF_HUB_OFFLINE) or env.strip().lower() in _TRUE_STRINGS


def _hub_cache_dir() -> str:
    """``HF_HUB_CACHE`` if set now, else the cache folder ``huggingface_hub`` resolved at import."""
    from huggingface_hub import constants

    env = os.environ.get("HF_HUB_CACHE")
    return os.path.expanduser(os.path.expandvars(env)) if env else constants.HF_HUB_CACHE


def resolve_hub_recipe(uri: str | HubRecipeRef, *, cache_dir: str | os.PathLike | None = None, token: str | None = None) -> Path:
    """Fetch a ``hf://`` recipe into the Hugging Face cache and return its local path.

    Uses ``huggingface_hub.hf_hub_download(repo_type="model")``, so the file lands in (or is read
    from) the standard cache layout ``models--<owner>--<repo>/snapshots/<commit>/<file>``.
    With ``HF_HUB_OFFLINE=1`` nothing is downloaded (``local_files_only=True``): a branch or tag is
    looked up in ``refs/``, a 40-character commit directly in ``snapshots/``.

    Args:
        uri: ``hf://<owner>/<repo>[/<path>.yaml][@<revision>]`` or a parsed ``HubRecipeRef``.
        cache_dir: overrides ``HF_HUB_CACHE``.
        token: Hub token for private repos (default: the one ``huggingface_hub`` finds).

    Raises:
        ValueError: malformed URI.
        HubRecipeUnavailableError: offline and not cached, or not found on / not reachable from the Hub.

    Example:
        ```python
        >>> path = resolve_hub_recipe("hf://my-org/gpt2-recipe@v1")  # doctest: +SKIP
        >>> path.name  # doctest: +SKIP
        'recipe.yaml'
        ```
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    ref = uri if isinstance(uri, HubRecipeRef) else parse_hub_uri(uri)
    offline = _hub_offline()
    cache = str(cache_dir) if cache_dir is not None else _hub_cache_dir()
    what = (
        f"Hub recipe {ref.uri!r} (repo {ref.repo_id!r}, file {ref.filename!r}, "
        f"revision {ref.revision or 'main'!r})"
    )
    try:
        local = hf_hub_download(
            repo_id=ref.repo_id,
            filename=ref.filename,
            revision=ref.revision,
            repo_type="model",
            cache_dir=cache,
            local_files_only=offline,
            token=token,
            library_name="hf_fasttrain",
        )
    # Order matters: LocalEntryNotFoundError (the cache miss) subclasses EntryNotFoundError, and the
    # remote "not found" errors subclass HfHubHTTPError.
    except (LocalEntryNotFoundError, OfflineModeIsEnabled) as err:
        if offline:
            raise HubRecipeUnavailableError(
                f"{what} is not in the Hugging Face cache at {cache!r}, and HF_HUB_OFFLINE=1 forbids "
                "downloading it. To fix: run once with network access (unset HF_HUB_OFFLINE) so it is "
                f"cached, e.g. `hf download {ref.repo_id} {ref.filename}"
                f"{' --revision ' + ref.revision if ref.revision else ''}`; or point HF_HUB_CACHE at a cache "
                "that holds it; or download the YAML and pass its local path instead."
            ) from err
        raise HubRecipeUnavailableError(
            f"{what} could not be fetched from the Hub (no connection?) and is not in the cache at "
            f"{cache!r}. Check the network, or pass a local path to the YAML instead."
        ) from err
    except RevisionNotFoundError as err:
        raise HubRecipeUnavailableError(
            f"{what}: the revision does not exist on the Hub. Check the branch, tag or commit name."
        ) from err
    except EntryNotFoundError as err:
        raise HubRecipeUnavailableError(
            f"{what}: the repo has no such file. Name the file in the URI, e.g. hf://{ref.repo_id}/<file>.yaml."
        ) from err
    except RepositoryNotFoundError as err:
        raise HubRecipeUnavailableError(
            f"{what}: the repo was not found on the Hub, or it is private or gated and no valid token was "
            "given (log in with `hf auth login` or set HF_TOKEN)."
        ) from err
    return Path(local)


# ---------------------------------------------------------------------------------------------
# Safe YAML
# ---------------------------------------------------------------------------------------------


def _yaml_error(source: str, err: yaml.YAMLError) -> RecipeYAMLError:
    mark = getattr(err, "problem_mark", None)
    where = f"{source}, line {mark.line + 1}, column {mark.column + 1}" if mark is not None else source
    problem = getattr(err, "problem", None) or str(err)
    tag = re.search(r"tag '([^']*)'", problem) if isinstance(err, yaml.constructor.ConstructorError) else None
    if tag is not None:
        shown = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        return RecipeYAMLError(
            f"{where}: not a plain YAML mapping: YAML tag {shown!r} is not allowed in a recipe. Recipes are data, read with "
            "yaml.safe_load: only mappings, lists, strings, numbers, booleans and null are accepted, "
            "and no Python object is ever constructed. Nothing was executed; remove the tag."
        )
    return RecipeYAMLError(f"{where}: not valid YAML: {problem}")


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
        and (os.path.isfile(path_or_text) or path_or_text.endswith(_YAML_SUFFIXES))
    )
    if is_path:
        path = Path(path_or_text)
        source = source or str(path)
        if not path.is_file():
            raise FileNotFoundError(f"Recipe file {str(path)!r} does not exist.")
        size = path.stat().st_size
        if size > RECIPE_MAX_BYTES:
            raise RecipeYAMLError(f"{source}: {size} bytes is more than a recipe's limit of {RECIPE_MAX_BYTES} bytes.")
        text = path.read_text(encoding="utf-8")
    elif isinstance(path_or_text, str):
        text = path_or_text
        source = source or "<recipe text>"
        if len(text.encode("utf-8")) > RECIPE_MAX_BYTES:
            raise RecipeYAMLError(f"{source}: more than a recipe's limit of {RECIPE_MAX_BYTES} bytes.")
    else:
        raise TypeError(f"safe_load_yaml expects a path or YAML text, got {type(path_or_text).__name__}")
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise _yaml_error(source, err) from None
    if data is None and allow_empty:
        return {}
    if data is None:
        raise RecipeYAMLError(f"{source}: the recipe is empty; expected a mapping of field names to values.")
    if not isinstance(data, dict):
        raise RecipeYAMLError(
            f"{source}: the top level of a recipe must be a mapping of field names to values, "
            f"got a {type(data).__name__}."
        )
    bad = [k for k in data if not isinstance(k, str)]
    if bad:
        raise RecipeYAMLError(f"{source}: top-level keys must be field names (strings), got {bad!r}.")
    return data


# ---------------------------------------------------------------------------------------------
# trust_remote_code
# ---------------------------------------------------------------------------------------------


def guard_trust_remote_code(
    recipe: Mapping[str, Any], *, source: str, trust_remote_code: bool = False
) -> tuple[dict, list[str]]:
    """Drop every ``trust_remote_code`` a recipe sets, unless the user allowed it.

    ``hf_fasttrain.recipes.load_recipe`` applies this to every recipe source (path, bundled name,
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


def load_hub_recipe(
    uri: str | HubRecipeRef, *, trust_remote_code: bool = False, cache_dir: str | os.PathLike | None = None, token: str | None = None
) -> dict:
    """``resolve_hub_recipe`` + ``safe_load_yaml`` + ``guard_trust_remote_code`` in one call.

    Example:
        ```python
        >>> recipe = load_hub_recipe("hf://my-org/gpt2-recipe@v1")  # doctest: +SKIP
        ```
    """
    ref = uri if isinstance(uri, HubRecipeRef) else parse_hub_uri(uri)
    path = resolve_hub_recipe(ref, cache_dir=cache_dir, token=token)
    data = safe_load_yaml(path, source=ref.uri)
    data, _ = guard_trust_remote_code(data, source=ref.uri, trust_remote_code=trust_remote_code)
    return data


# ---------------------------------------------------------------------------------------------
# Push: folder + model card
# ---------------------------------------------------------------------------------------------


def _first_existing(run_dir: Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        if (run_dir / name).is_file():
            return run_dir / name
    return None


def read_run_results(run_dir: str | os.PathLike) -> dict[str, Any]:
    """Read what a run left in its output directory, for the model card.

    Returns ``{"metrics": dict, "run_info": dict, "config": dict | None, "files": {role: Path}}``.
    Metrics come from the first of ``RUN_FILES["metrics"]`` present (``metrics.json`` is the
    foundation's); ``run_info.json`` holds machine and versions; ``config.yaml`` the resolved recipe;
    ``loss_curve.png``, when present, is shown on the card.

    Raises:
        FileNotFoundError: ``run_dir`` missing, or it holds neither metrics nor run_info.
        ValueError: a JSON file that is not a JSON object.
    """
    run = Path(run_dir)
    if not run.is_dir():
        raise FileNotFoundError(f"run_dir {str(run)!r} is not a directory.")
    out: dict[str, Any] = {"metrics": {}, "run_info": {}, "config": None, "files": {}}
    for role in ("metrics", "run_info"):
        path = _first_existing(run, RUN_FILES[role])
        if path is None:
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"run_dir file {str(path)!r} is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ValueError(f"run_dir file {str(path)!r} must hold a JSON object, got {type(data).__name__}.")
        out[role] = data
        out["files"][role] = path
    if not out["files"]:
        expected = ", ".join(RUN_FILES["metrics"] + RUN_FILES["run_info"])
        raise FileNotFoundError(f"run_dir {str(run)!r} holds none of the result files expected ({expected}).")
    config_path = _first_existing(run, RUN_FILES["config"])
    if config_path is not None:
        out["config"] = safe_load_yaml(config_path)
        out["files"]["config"] = config_path
    plot = _first_existing(run, RUN_FILES["plot"])
    if plot is not None:
        out["files"]["plot"] = plot
    return out


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _table_rows(flat: Mapping[str, Any]) -> list[str]:
    """Markdown rows for scalars and short lists; a list of records (a loss history) becomes its length."""
    rows = []
    for key, value in flat.items():
        if isinstance(value, list) and any(isinstance(v, (Mapping, list)) for v in value):
            value = f"{len(value)} entries (in the JSON file)"
        rows.append(f"| {_fmt(key)} | {_fmt(value)} |")
    return rows


def _fmt(value: Any) -> str:
    if isinstance(value, (list, tuple)) and not value:
        text = "none"
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float):
        text = f"{value:.6g}"
    elif isinstance(value, (list, tuple)):
        text = ", ".join(_fmt(v) for v in value)
    else:
        text = str(value)
    text = text.replace("|", "\\|").replace("\n", " ")
    return text if len(text) <= 120 else text[:117] + "..."


# Values the resolved config writes differently from how a recipe says them.
_NONE_LIKE = (None, "none", [], ["none"])
# Where the run wrote its files says nothing about the recipe.
_NOT_RECIPE_DIFFERENCES = ("output_dir",)


def _same_value(a: Any, b: Any) -> bool:
    if a == b or (a in _NONE_LIKE and b in _NONE_LIKE):
        return True
    if isinstance(b, list) and len(b) == 1 and not isinstance(a, list):  # report_to: wandb -> [wandb]
        return _same_value(a, b[0])
    try:  # "6e-4" (YAML 1.1 reads it as a string) vs 0.0006
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _run_differences(recipe: Mapping[str, Any], run_config: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """Keys set by the recipe whose value differs in the run's resolved config (defaults are not differences)."""
    recipe_flat, run_flat = _flatten(recipe), _flatten(run_config)
    diffs = []
    for key, value in recipe_flat.items():
        if key in _NOT_RECIPE_DIFFERENCES:
            continue
        if key in run_flat and not _same_value(value, run_flat[key]):
            diffs.append((key, value, run_flat[key]))
    return diffs


def _model_tag(recipe: Mapping[str, Any]) -> str | None:
    """A short model-family tag (``gpt2``) from the recipe's ``model`` section, if one is named."""
    model = recipe.get("model")
    if not isinstance(model, Mapping):
        return None
    for key in ("model_type", "config_name", "model_name_or_path", "tokenizer_name"):
        value = model.get(key)
        if isinstance(value, str) and value:
            name = value.rstrip("/").split("/")[-1].lower()
            name = re.sub(r"[^a-z0-9._-]+", "-", name).strip("-")
            if name:
                return name
    return None


def render_model_card(
    recipe: Mapping[str, Any],
    recipe_text: str,
    *,
    repo_id: str,
    filename: str = DEFAULT_RECIPE_FILENAME,
    revision: str | None = None,
    results: Mapping[str, Any] | None = None,
    run_label: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
    script: str = "recipes/gpt2_small.py",
) -> str:
    """The ``README.md`` for a recipe repo: YAML front matter with tags, what it is, how to run it, results.

    ``results`` is ``read_run_results(run_dir)`` or ``None`` (the card then says no run was attached).
    """
    from hf_fasttrain import __version__

    all_tags = ["hf-fasttrain", "recipe"]
    model_tag = _model_tag(recipe)
    for tag in ([model_tag] if model_tag else []) + list(tags):
        if tag and tag not in all_tags:
            all_tags.append(tag)
    front = yaml.safe_dump({"tags": all_tags}, sort_keys=False).strip()
    uri = format_hub_uri(repo_id, filename, revision)
    name = repo_id.split("/")[-1]

    lines = [
        "---",
        front,
        "---",
        "",
        f"# {name}: an hf_fasttrain training recipe",
        "",
        f"This repo holds a training recipe for hf_fasttrain (this card was written by version {__version__})"
        f": `{filename}`, a YAML file whose keys are `FastTrainingArguments` field names "
        "plus `model` and `data` sections. It holds no weights and no code: it is read with "
        "`yaml.safe_load`, and it never turns on `trust_remote_code` by itself.",
        "",
        "## Run it",
        "",
        "```bash",
        "# in a checkout of hf_fasttrain (pip install -e .)",
        f"accelerate launch {script} --config {uri}",
        "# or, with the package installed",
        f"hf-fasttrain train --config {uri}",
        "```",
        "",
        f"Any field can be overridden after the config, e.g. `--config {uri} --learning_rate 3e-4`. "
        "Pin a revision with `@<commit>` for a run that can be repeated exactly; "
        "with `HF_HUB_OFFLINE=1` the recipe is read from the local Hugging Face cache.",
        "",
        "## The recipe",
        "",
        "```yaml",
        recipe_text.rstrip("\n"),
        "```",
        "",
        "## Results",
        "",
    ]
    if not results:
        lines += ["No measured run was attached to this upload.", ""]
        return "\n".join(lines)
    label = f" `{run_label}`" if run_label else ""
    files = results.get("files", {})
    lines += [f"Measured in run{label}; its files are in `results/`.", ""]
    # 1. how the run differed from the recipe: this qualifies every number below
    if results.get("config") is not None:
        diffs = _run_differences(recipe, results["config"])
        if diffs:
            lines += [
                "**Note:** the measured run overrode the recipe on the command line, so its results are "
                "for these values, not the recipe's:",
                "",
                "| field | recipe | run |",
                "|---|---|---|",
            ]
            lines += [f"| {_fmt(k)} | {_fmt(a)} | {_fmt(b)} |" for k, a, b in diffs]
            lines.append("")
        else:
            lines += ["The run's resolved config (`results/config.yaml`) agrees with every field the recipe sets.", ""]
    # 2. the numbers
    metrics = _flatten(results.get("metrics") or {})
    if metrics:
        name = files["metrics"].name if "metrics" in files else "metrics.json"
        lines += [f"From `{name}`:", "", "| metric | value |", "|---|---|"]
        lines += _table_rows(metrics)
        lines.append("")
    else:
        lines += ["The run recorded no metrics.", ""]
    if "plot" in files:
        lines += [f"![loss curve](results/{files['plot'].name})", ""]
    # 3. where they were measured
    info = _flatten(results.get("run_info") or {})
    argv = info.pop("argv", None)
    if info:
        lines += ["### Machine and versions", "", "| | |", "|---|---|"]
        lines += _table_rows(info)
        lines.append("")
    if isinstance(argv, list) and argv:
        lines += ["The run's command line:", "", "```", " ".join(str(a) for a in argv), "```", ""]
    return "\n".join(lines)


def _check_repo_id(repo_id: str) -> str:
    if not isinstance(repo_id, str) or repo_id.count("/") != 1:
        raise ValueError(f"repo_id must be '<owner>/<repo>', got {repo_id!r}.")
    parse_hub_uri(HUB_URI_PREFIX + repo_id)  # same name rules as a URI
    return repo_id


def prepare_recipe_folder(
    recipe_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    run_dir: str | os.PathLike | None = None,
    *,
    repo_id: str,
    filename: str = DEFAULT_RECIPE_FILENAME,
    revision: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
    script: str = "recipes/gpt2_small.py",
) -> list[str]:
    """Write the folder a push uploads and return its files (relative, sorted).

    Layout::

        <out_dir>/recipe.yaml            the recipe, byte for byte (comments kept), after a safe load
        <out_dir>/README.md              model card (front matter tags, run command, results)
        <out_dir>/results/metrics.json   \\
        <out_dir>/results/run_info.json   } copied from run_dir when given and present
        <out_dir>/results/config.yaml    /

    ``out_dir`` must be new or empty: whatever is in it would be uploaded.

    Example:
        ```python
        >>> prepare_recipe_folder("gpt2_small.yaml", "push/", run_dir="runs/gpt2", repo_id="me/gpt2-recipe")  # doctest: +SKIP
        ['README.md', 'recipe.yaml', 'results/config.yaml', 'results/metrics.json', 'results/run_info.json']
        ```
    """
    _check_repo_id(repo_id)
    _check_filename(format_hub_uri(repo_id, filename), filename)
    src = Path(recipe_path)
    recipe = safe_load_yaml(src)  # refuses unsafe YAML before anything is written
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"out_dir {str(out)!r} must be a new or empty folder: everything in it would be uploaded.")
    results = read_run_results(run_dir) if run_dir is not None else None

    text = src.read_text(encoding="utf-8")
    target = out / filename
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8")
    if results:
        (out / "results").mkdir(exist_ok=True)
        for path in results["files"].values():
            shutil.copyfile(path, out / "results" / path.name)
    card = render_model_card(
        recipe,
        text,
        repo_id=repo_id,
        filename=filename,
        revision=revision,
        results=results,
        run_label=Path(run_dir).name if run_dir is not None else None,
        tags=tags,
        script=script,
    )
    (out / "README.md").write_text(card, encoding="utf-8")
    return sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())


@dataclass
class PushPlan:
    """What ``push_recipe`` did (or, with ``dry_run``, would do).

    Example:
        ```python
        >>> plan = push_recipe("gpt2_small.yaml", "me/gpt2-recipe", dry_run=True, out_dir="push/")  # doctest: +SKIP
        >>> plan.files  # doctest: +SKIP
        ['README.md', 'recipe.yaml']
        ```
    """

    repo_id: str
    revision: str | None
    folder: Path
    files: list[str]
    commit_message: str
    dry_run: bool
    uri: str
    sizes: dict[str, int] = field(default_factory=dict)
    calls: list[str] = field(default_factory=list)
    commit_url: str | None = None

    def describe(self) -> str:
        head = "Dry run: would" if self.dry_run else "Did"
        lines = [f"{head} push recipe {self.uri}"] + [f"  {c}" for c in self.calls]
        lines.append(f"  files from {self.folder}:")
        lines += [f"    {f} ({self.sizes.get(f, 0)} bytes)" for f in self.files]
        if self.commit_url:
            lines.append(f"  commit: {self.commit_url}")
        return "\n".join(lines)


def push_recipe(
    recipe: str | os.PathLike,
    repo_id: str,
    revision: str | None = None,
    dry_run: bool = False,
    run_dir: str | os.PathLike | None = None,
    token: str | None = None,
    api: Any = None,
    *,
    out_dir: str | os.PathLike | None = None,
    filename: str = DEFAULT_RECIPE_FILENAME,
    private: bool | None = None,
    commit_message: str | None = None,
    tags: list[str] | tuple[str, ...] = (),
    script: str = "recipes/gpt2_small.py",
) -> PushPlan:
    """Upload a recipe YAML and its model card to a Hub model repo.

    Calls ``api.create_repo(repo_id, repo_type="model", exist_ok=True)``, then, for a branch other
    than ``main``, ``api.create_branch(repo_id, branch=revision, exist_ok=True)``, then
    ``api.upload_folder(repo_id=..., folder_path=..., repo_type="model", revision=..., commit_message=...)``.
    ``api`` defaults to ``huggingface_hub.HfApi(token=token)``; pass a fake one to record the calls.

    With ``dry_run=True`` the folder is written (to ``out_dir``, default
    ``./push-recipe-<owner>--<repo>``), the planned calls are printed, and the Hub is not touched.

    Raises:
        ValueError: bad ``repo_id``, a commit hash as ``revision`` (one pushes to a branch), a
            non-empty ``out_dir``, or ``HF_HUB_OFFLINE=1`` for a real upload.
    """
    _check_repo_id(repo_id)
    if revision is not None:
        _check_revision(format_hub_uri(repo_id, filename, revision), revision)
        if _COMMIT_RE.match(revision):
            raise ValueError(f"revision {revision!r} is a commit hash; push to a branch name (e.g. 'main' or 'v1').")
    branch = revision or "main"
    message = commit_message or f"Upload hf_fasttrain recipe {filename}" + (" with run results" if run_dir else "")
    uri = format_hub_uri(repo_id, filename, revision if branch != "main" else None)
    if not dry_run and api is None and _hub_offline():
        raise ValueError("HF_HUB_OFFLINE=1 is set: pushing needs the network. Unset it, or use --dry-run.")

    tmp = None
    if out_dir is None:
        if dry_run:
            out_dir = Path.cwd() / f"push-recipe-{repo_id.replace('/', '--')}"
        else:
            tmp = tempfile.TemporaryDirectory(prefix="hf_fasttrain_push_")
            out_dir = tmp.name
    try:
        folder = Path(out_dir)
        files = prepare_recipe_folder(
            recipe, folder, run_dir, repo_id=repo_id, filename=filename,
            revision=revision if branch != "main" else None, tags=tags, script=script,
        )
        calls = [f"create_repo({repo_id!r}, repo_type='model', exist_ok=True" + (f", private={private}" if private is not None else "") + ")"]
        if branch != "main":
            calls.append(f"create_branch({repo_id!r}, branch={branch!r}, exist_ok=True)")
        calls.append(
            f"upload_folder(repo_id={repo_id!r}, folder_path={str(folder)!r}, repo_type='model', "
            f"revision={branch!r}, commit_message={message!r})"
        )
        sizes = {f: (folder / f).stat().st_size for f in files}
        plan = PushPlan(repo_id, revision, folder, files, message, dry_run, uri, sizes=sizes, calls=calls)
        if dry_run:
            print(plan.describe())
            return plan
        if api is None:
            from huggingface_hub import HfApi

            api = HfApi(token=token)
        create_kwargs: dict[str, Any] = {"repo_type": "model", "exist_ok": True}
        if private is not None:
            create_kwargs["private"] = private
        api.create_repo(repo_id, **create_kwargs)
        if branch != "main":
            api.create_branch(repo_id, branch=branch, repo_type="model", exist_ok=True)
        info = api.upload_folder(
            repo_id=repo_id,
            folder_path=str(folder),
            repo_type="model",
            revision=branch,
            commit_message=message,
        )
        plan.commit_url = getattr(info, "commit_url", None) or (str(info) if info is not None else None)
        logger.info(plan.describe())
        return plan
    finally:
        if tmp is not None:
            tmp.cleanup()
