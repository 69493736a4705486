"""Push a recipe to the Hugging Face Hub: ``recipe.yaml`` plus a model card with the measured results of a run.

:func:`prepare_recipe_folder` writes the folder (the recipe byte for byte after a safe load, a ``README.md``
made with ``huggingface_hub.ModelCard`` / ``ModelCardData``: tags, how to run it, the run's metrics, machine
and versions, and where the run overrode the recipe); :func:`push_recipe` uploads it with
``HfApi.create_repo`` + ``HfApi.upload_folder`` (or, with ``dry_run``, only says what it would do).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from huggingface_hub import ModelCard, ModelCardData

from .._version import __version__
from ..hub import (
    DEFAULT_RECIPE_FILENAME,
    check_recipe_filename,
    check_repo_id,
    check_revision,
    format_hub_uri,
    hub_offline,
)
from ..config.recipes import safe_load_yaml

__all__ = ["RUN_FILES", "PushPlan", "prepare_recipe_folder", "push_recipe", "read_run_results", "render_model_card"]

logger = logging.getLogger(__name__)

# Files read from a run's output directory, in order of preference for each role. The foundation
# writes metrics.json, run_info.json and config.yaml; Trainer.save_metrics writes *_results.json.
RUN_FILES = {
    "metrics": ("metrics.json", "all_results.json", "train_results.json", "eval_results.json"),
    "run_info": ("run_info.json",),
    "config": ("config.yaml", "config.yml"),
    "plot": ("loss_curve.png",),
}
_COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")


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
    all_tags = ["hf-fasttrain", "recipe"]
    model_tag = _model_tag(recipe)
    for tag in ([model_tag] if model_tag else []) + list(tags):
        if tag and tag not in all_tags:
            all_tags.append(tag)
    card_data = ModelCardData(library_name="hf_fasttrain", tags=all_tags)
    uri = format_hub_uri(repo_id, filename, revision)
    name = repo_id.split("/")[-1]

    lines = [
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
        return _card(card_data, lines)
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
    return _card(card_data, lines)


def _card(card_data: ModelCardData, lines: list[str]) -> str:
    """``huggingface_hub.ModelCard`` text: the card data as YAML front matter, then the body."""
    return str(ModelCard(f"---\n{card_data.to_yaml()}\n---\n\n" + "\n".join(lines)))


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
    check_repo_id(repo_id)
    check_recipe_filename(filename, format_hub_uri(repo_id, filename))
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
    check_repo_id(repo_id)
    if revision is not None:
        check_revision(revision, format_hub_uri(repo_id, filename, revision))
        if _COMMIT_RE.match(revision):
            raise ValueError(f"revision {revision!r} is a commit hash; push to a branch name (e.g. 'main' or 'v1').")
    branch = revision or "main"
    message = commit_message or f"Upload hf_fasttrain recipe {filename}" + (" with run results" if run_dir else "")
    uri = format_hub_uri(repo_id, filename, revision if branch != "main" else None)
    if not dry_run and api is None and hub_offline():
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