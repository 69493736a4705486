"""Recipes on the Hugging Face Hub: ``hf://`` URIs and fetching into the offline-capable Hub cache.

1. :func:`parse_hub_uri` turns ``hf://<owner>/<repo>[/<path>.yaml][@<revision>]`` into
   ``(repo_id, filename, revision)``. That is the one spelling: the file (default ``recipe.yaml``) comes
   before the revision (default: the repo's default branch). The repo id is checked with
   ``huggingface_hub``'s own ``validate_repo_id``.
2. :func:`resolve_hub_recipe` fetches the file with ``huggingface_hub.hf_hub_download`` into the Hub cache
   (``HF_HUB_CACHE``); with ``HF_HUB_OFFLINE=1`` it only looks in the cache, and says clearly (repo, file,
   revision, cache folder, how to fix) when the file is not there.

Reading the YAML safely and the ``trust_remote_code`` guard serve every recipe, not just Hub ones: they are
in :mod:`hf_fasttrain.config.recipes`. Pushing a recipe with its model card is :mod:`hf_fasttrain.run.push`.

Environment: ``HF_HUB_OFFLINE`` and ``HF_HUB_CACHE`` are read when a function is called, not only when
``huggingface_hub`` was imported (``huggingface_hub.constants`` freezes them at import time), so setting
them in a running process works as users expect.

This module imports nothing of the package (tests load it by file path in a bare interpreter).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

__all__ = [
    "DEFAULT_RECIPE_FILENAME",
    "HUB_URI_PREFIX",
    "YAML_SUFFIXES",
    "HubRecipeRef",
    "HubRecipeUnavailableError",
    "check_recipe_filename",
    "check_repo_id",
    "check_revision",
    "format_hub_uri",
    "hub_offline",
    "is_hub_uri",
    "parse_hub_uri",
    "resolve_hub_recipe",
]

HUB_URI_PREFIX = "hf://"
DEFAULT_RECIPE_FILENAME = "recipe.yaml"
YAML_SUFFIXES = (".yaml", ".yml")
# Repo-type prefixes of huggingface_hub paths; a recipe URI names a model repo without one.
_REPO_TYPE_PREFIXES = {"models": "model", "datasets": "dataset", "spaces": "space", "buckets": "bucket",
                       "kernels": "kernel"}
_TRUE_STRINGS = {"1", "on", "yes", "true"}
_GRAMMAR = (
    "Expected hf://<owner>/<repo>[/<path>.yaml][@<revision>], e.g. hf://my-org/gpt2-recipe, "
    f"hf://my-org/gpt2-recipe/configs/small.yaml@v1 (the file defaults to {DEFAULT_RECIPE_FILENAME!r}, "
    "the revision to the default branch)."
)


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
    return ValueError(f"Invalid Hub recipe URI {uri!r}: {problem}. {_GRAMMAR}")


def check_repo_id(repo_id: Any, uri: str | None = None) -> str:
    """``repo_id`` if it is ``<owner>/<repo>`` and ``huggingface_hub.utils.validate_repo_id`` accepts it.

    >>> check_repo_id("me/my-recipe")
    'me/my-recipe'
    """
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id

    def fail(problem):
        if uri is not None:
            return _uri_error(uri, problem)
        return ValueError(f"repo_id: got {repo_id!r}; {problem}")

    if not isinstance(repo_id, str) or repo_id.count("/") != 1 or "" in repo_id.split("/"):
        raise fail("the repo id must have an owner and a name, '<owner>/<repo>'")
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise fail(f"repo id {repo_id!r} is not a valid Hub name ({err})") from None
    return repo_id


def check_revision(revision: str, uri: str) -> str:
    """A branch, tag or commit name: not empty, no whitespace, no '..', no leading or trailing '/'."""
    if not revision:
        raise _uri_error(uri, "the revision after '@' is empty")
    if any(ch.isspace() for ch in revision) or ".." in revision or revision.startswith("/") or revision.endswith("/"):
        raise _uri_error(uri, f"revision {revision!r} is not a valid branch, tag or commit name")
    if any(part.endswith(YAML_SUFFIXES) for part in revision.split("/")):
        raise _uri_error(uri, f"the file path goes before '@<revision>', not after it (got revision {revision!r})")
    return revision


def check_recipe_filename(path: str, uri: str) -> str:
    """A relative path to a ``.yaml``/``.yml`` file inside the repo."""
    parts = path.split("/")
    if "\\" in path or any(p in ("", ".", "..") for p in parts):
        raise _uri_error(uri, f"path {path!r} inside the repo has an empty, '.' or '..' segment or a backslash")
    if not path.endswith(YAML_SUFFIXES):
        raise _uri_error(
            uri,
            f"path {path!r} inside the repo must name a .yaml or .yml file "
            f"(for a folder, write {path.rstrip('/') + '/' + DEFAULT_RECIPE_FILENAME!r})",
        )
    return path


def parse_hub_uri(uri: str) -> HubRecipeRef:
    """Split ``hf://<owner>/<repo>[/<path>.yaml][@<revision>]`` into ``(repo_id, filename, revision)``.

    The file defaults to ``recipe.yaml`` and the revision to ``None`` (the default branch). A revision may
    contain ``/`` (``refs/pr/3``): everything after the ``@`` is the revision.

    Raises:
        ValueError: the URI is malformed; the message says what is wrong and shows the grammar.

    Example:
        ```python
        >>> parse_hub_uri("hf://me/my-recipe")
        HubRecipeRef(repo_id='me/my-recipe', filename='recipe.yaml', revision=None)
        >>> tuple(parse_hub_uri("hf://me/my-recipe/sub/a.yaml@refs/pr/3"))
        ('me/my-recipe', 'sub/a.yaml', 'refs/pr/3')
        ```
    """
    if not isinstance(uri, str):
        raise _uri_error(repr(uri), f"expected a string, got {type(uri).__name__}")
    if not uri.startswith(HUB_URI_PREFIX):
        raise _uri_error(uri, f"it must start with {HUB_URI_PREFIX!r}")
    body = uri[len(HUB_URI_PREFIX) :]
    if not body:
        raise _uri_error(uri, "nothing follows 'hf://'")
    revision: str | None = None
    if "@" in body:
        body, revision = body.split("@", 1)
        if "@" in revision:
            raise _uri_error(uri, "it has two revisions ('@' appears twice)")
        check_revision(revision, uri)
    segments = body.split("/")
    if segments[0] in _REPO_TYPE_PREFIXES:
        kind = _REPO_TYPE_PREFIXES[segments[0]]
        problem = "recipes are read from model repos only" if kind != "model" else "leave out the 'models/' prefix"
        raise _uri_error(uri, f"it starts with the repo-type prefix {segments[0] + '/'!r}; {problem}")
    repo_id = check_repo_id("/".join(segments[:2]), uri)
    path = "/".join(segments[2:])
    filename = check_recipe_filename(path, uri) if path else DEFAULT_RECIPE_FILENAME
    return HubRecipeRef(repo_id, filename, revision)


# ---------------------------------------------------------------------------------------------
# Fetching into the offline cache
# ---------------------------------------------------------------------------------------------


def hub_offline() -> bool:
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
    offline = hub_offline()
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
