"""Tests for hf_fasttrain.hub: hf:// URIs, the offline Hub cache, safe YAML, push with a model card.

No network: the Hub cache is built by hand in a temporary HF_HUB_CACHE exactly as huggingface_hub
lays it out, and HF_HUB_OFFLINE=1 is set both in the environment and in huggingface_hub.constants
(which reads the environment once, at import).
"""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf_fasttrain import hub
from hf_fasttrain.config import recipes
from hf_fasttrain.hub import (
    DEFAULT_RECIPE_FILENAME,
    HubRecipeRef,
    HubRecipeUnavailableError,
    check_repo_id,
    format_hub_uri,
    parse_hub_uri,
    resolve_hub_recipe,
)
from hf_fasttrain.run.push import prepare_recipe_folder, push_recipe, read_run_results
from hf_fasttrain.config.recipes import RecipeYAMLError, guard_trust_remote_code, load_recipe, safe_load_yaml

COMMIT_OLD = "a" * 8 + "0123456789abcdef0123456789abcdef"
COMMIT_NEW = "b" * 8 + "fedcba9876543210fedcba9876543210"
RECIPE_OLD = "# old recipe\nlearning_rate: 0.001\nmodel:\n  model_type: gpt2\n"
RECIPE_NEW = "# new recipe\nlearning_rate: 0.0006\nmax_steps: 20\nmodel:\n  model_type: gpt2\n"
SUB_OLD = "warmup_steps: 5\n"


# ---------------------------------------------------------------------------------------------
# A real Hugging Face cache layout
# ---------------------------------------------------------------------------------------------


def git_blob_sha1(content: bytes) -> str:
    """The etag the Hub gives a regular (non-LFS) file: git's blob hash."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def cache_repo(cache: Path, repo_id: str, snapshots: dict, refs: dict) -> Path:
    """Lay out ``models--<owner>--<repo>`` as huggingface_hub does.

    blobs/<etag> holds the bytes, snapshots/<commit>/<path> is a relative symlink to the blob,
    refs/<name> holds the commit hash with no trailing newline (hf_hub_download reads it verbatim).
    """
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    for commit, files in snapshots.items():
        for rel, text in files.items():
            content = text if isinstance(text, bytes) else text.encode("utf-8")
            blob = storage / "blobs" / git_blob_sha1(content)
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(content)
            pointer = storage / "snapshots" / commit / rel
            pointer.parent.mkdir(parents=True, exist_ok=True)
            pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    for name, commit in refs.items():
        ref = storage / "refs" / name
        ref.parent.mkdir(parents=True, exist_ok=True)
        ref.write_text(commit)
    return storage


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty HF_HUB_CACHE with offline mode on, in the environment and in huggingface_hub.constants."""
    from huggingface_hub import constants

    cache = tmp_path / "hf_cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


@pytest.fixture
def cached_repo(offline_cache):
    """owner/repo with two commits: main -> COMMIT_NEW, tag v1 -> COMMIT_OLD (which also has sub/file.yaml)."""
    cache_repo(
        offline_cache,
        "owner/repo",
        snapshots={
            COMMIT_OLD: {"recipe.yaml": RECIPE_OLD, "sub/file.yaml": SUB_OLD},
            COMMIT_NEW: {"recipe.yaml": RECIPE_NEW},
        },
        refs={"main": COMMIT_NEW, "v1": COMMIT_OLD},
    )
    return offline_cache


def test_cache_layout_is_what_huggingface_hub_scans(cached_repo):
    from huggingface_hub import scan_cache_dir

    info = scan_cache_dir(cached_repo)
    assert info.warnings == []
    (repo,) = info.repos
    assert (repo.repo_id, repo.repo_type) == ("owner/repo", "model")
    revs = {r.commit_hash: (sorted(r.refs), sorted(f.file_name for f in r.files)) for r in repo.revisions}
    assert revs == {
        COMMIT_NEW: (["main"], ["recipe.yaml"]),
        COMMIT_OLD: (["v1"], ["file.yaml", "recipe.yaml"]),
    }


# ---------------------------------------------------------------------------------------------
# parse_hub_uri
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "uri, expected",
    [
        ("hf://owner/repo", ("owner/repo", "recipe.yaml", None)),
        ("hf://owner/repo/", ("owner/repo", "recipe.yaml", None)),
        ("hf://owner/repo@main", ("owner/repo", "recipe.yaml", "main")),
        ("hf://owner/repo/gpt2_small.yaml", ("owner/repo", "gpt2_small.yaml", None)),
        ("hf://owner/repo/sub/file.yml@v1.2", ("owner/repo", "sub/file.yml", "v1.2")),
        (f"hf://owner/repo/sub/file.yaml@{COMMIT_OLD}", ("owner/repo", "sub/file.yaml", COMMIT_OLD)),
        ("hf://owner/repo/a.yaml@refs/pr/3", ("owner/repo", "a.yaml", "refs/pr/3")),
        ("hf://my-org/gpt2.recipe_v2", ("my-org/gpt2.recipe_v2", "recipe.yaml", None)),
        ("hf://o/r@feature/x", ("o/r", "recipe.yaml", "feature/x")),  # a branch with '/': after '@', all of it
    ],
)
def test_parse_hub_uri(uri, expected):
    ref = parse_hub_uri(uri)
    assert tuple(ref) == expected
    assert isinstance(ref, HubRecipeRef)
    assert parse_hub_uri(ref.uri) == ref  # the canonical form parses back to the same thing


@pytest.mark.parametrize(
    "uri, match",
    [
        ("owner/repo", "must start with 'hf://'"),
        ("https://huggingface.co/owner/repo", "must start with 'hf://'"),
        ("hf://", "nothing follows"),
        ("hf://repo", "owner and a name"),
        ("hf://owner/", "owner and a name"),
        ("hf://datasets/owner/repo", "prefix 'datasets/'; recipes are read from model repos only"),
        ("hf://models/owner/repo", "prefix 'models/'; leave out the 'models/' prefix"),
        # one spelling: the file goes before the revision (huggingface_hub's 'repo@rev/path' order is refused)
        ("hf://owner/repo@v1/sub/file.yaml", "the file path goes before '@<revision>'"),
        ("hf://owner/repo@refs/pr/3/a.yaml", "the file path goes before '@<revision>'"),
        ("hf://owner/repo/config", "must name a .yaml or .yml file .*'config/recipe.yaml'"),
        ("hf://owner/repo/a.yaml@", "revision after '@' is empty"),
        ("hf://owner/repo@v1/a.yaml@v2", "two revisions"),
        ("hf://owner/repo/a.yaml@v1@v2", "two revisions"),
        ("hf://owner/repo/../x.yaml", "'..' segment"),
        ("hf://owner/repo//x.yaml", "empty"),
        ("hf://own er/repo", "repo id 'own er/repo' is not a valid Hub name"),
        ("hf://owner/re--po", "repo id 'owner/re--po' is not a valid Hub name .Cannot have -- or .."),
        ("hf://owner/repo.git", "repo id 'owner/repo.git' is not a valid Hub name"),
        ("hf://-owner/repo", "is not a valid Hub name"),
        ("hf://" + "o" * 97 + "/repo", "is not a valid Hub name"),
        ("hf://owner/repo@bad rev", "not a valid branch, tag or commit"),
    ],
)
def test_parse_hub_uri_rejects_malformed(uri, match):
    with pytest.raises(ValueError, match=match) as info:
        parse_hub_uri(uri)
    assert "hf://<owner>/<repo>[/<path>.yaml][@<revision>]" in str(info.value)


@pytest.mark.parametrize(
    "repo_id, ok",
    [("me/r", True), ("my-org/gpt2.recipe_v2", True), ("r", False), ("a/b/c", False), ("/r", False),
     ("me/", False), ("me/re--po", False), ("me/r.git", False), ("me/-r", False), (None, False)],
)
def test_check_repo_id(repo_id, ok):
    if ok:
        assert check_repo_id(repo_id) == repo_id
    else:
        with pytest.raises(ValueError, match=r"repo_id: got .*; (the repo id must have an owner and a name|repo id .* is not a valid Hub name)"):
            check_repo_id(repo_id)


def test_format_hub_uri_leaves_defaults_out():
    assert format_hub_uri("o/r") == "hf://o/r"
    assert format_hub_uri("o/r", "x/y.yaml", "v1") == "hf://o/r/x/y.yaml@v1"
    assert format_hub_uri("o/r", DEFAULT_RECIPE_FILENAME, COMMIT_OLD) == f"hf://o/r@{COMMIT_OLD}"


# ---------------------------------------------------------------------------------------------
# resolve_hub_recipe from the offline cache
# ---------------------------------------------------------------------------------------------


def test_resolve_default_branch_from_cache(cached_repo):
    path = resolve_hub_recipe("hf://owner/repo")
    storage = cached_repo / "models--owner--repo"
    assert path == storage / "snapshots" / COMMIT_NEW / "recipe.yaml"
    assert path.read_text() == RECIPE_NEW


def test_resolve_pinned_commit_and_tag_from_cache(cached_repo):
    pinned = resolve_hub_recipe(f"hf://owner/repo/sub/file.yaml@{COMMIT_OLD}")
    assert pinned == cached_repo / "models--owner--repo" / "snapshots" / COMMIT_OLD / "sub" / "file.yaml"
    assert pinned.read_text() == SUB_OLD
    # the pinned old recipe differs from main's
    assert resolve_hub_recipe(f"hf://owner/repo@{COMMIT_OLD}").read_text() == RECIPE_OLD
    assert resolve_hub_recipe("hf://owner/repo@v1").read_text() == RECIPE_OLD


def test_resolve_honours_env_set_after_import(cached_repo, monkeypatch, tmp_path):
    """HF_HUB_CACHE / HF_HUB_OFFLINE set in a running process are honoured, though constants froze them."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # only the env var says offline now
    assert resolve_hub_recipe("hf://owner/repo").read_text() == RECIPE_NEW
    assert hub.hub_offline() is True


@pytest.mark.parametrize(
    "uri, revision, filename",
    [
        ("hf://owner/repo", "main", "recipe.yaml"),
        (f"hf://owner/repo/sub/file.yaml@{COMMIT_OLD}", COMMIT_OLD, "sub/file.yaml"),
    ],
)
def test_resolve_not_cached_offline_says_so(offline_cache, uri, revision, filename):
    with pytest.raises(HubRecipeUnavailableError) as info:
        resolve_hub_recipe(uri)
    msg = str(info.value)
    assert "is not in the Hugging Face cache" in msg
    assert "HF_HUB_OFFLINE=1 forbids downloading it" in msg
    assert f"repo 'owner/repo', file '{filename}', revision '{revision}'" in msg
    assert str(offline_cache) in msg
    assert "unset HF_HUB_OFFLINE" in msg
    assert isinstance(info.value, FileNotFoundError)


def test_resolve_cached_repo_missing_revision_or_file(cached_repo):
    with pytest.raises(HubRecipeUnavailableError, match="revision 'v9'.*is not in the Hugging Face cache"):
        resolve_hub_recipe("hf://owner/repo@v9")
    # sub/file.yaml exists only in the old commit, not on main
    with pytest.raises(HubRecipeUnavailableError, match="file 'sub/file.yaml', revision 'main'"):
        resolve_hub_recipe("hf://owner/repo/sub/file.yaml")


def test_resolve_online_passes_through_and_explains_no_connection(tmp_path, monkeypatch):
    """Online (offline unset) hf_hub_download may use the network; a failure without cache says so."""
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.errors import LocalEntryNotFoundError

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    seen = []

    def fake_download(**kwargs):
        seen.append(kwargs)
        if kwargs["repo_id"] == "owner/down":
            raise LocalEntryNotFoundError("connection error")
        return str(tmp_path / "x.yaml")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    assert resolve_hub_recipe("hf://owner/repo/x.yaml@v3") == tmp_path / "x.yaml"
    assert {k: seen[0][k] for k in ("repo_id", "filename", "revision", "repo_type", "cache_dir", "local_files_only")} == {
        "repo_id": "owner/repo",
        "filename": "x.yaml",
        "revision": "v3",
        "repo_type": "model",
        "cache_dir": str(tmp_path),
        "local_files_only": False,
    }
    with pytest.raises(HubRecipeUnavailableError, match="could not be fetched from the Hub .no connection.. and is not in the cache"):
        resolve_hub_recipe("hf://owner/down")


def test_resolve_in_fresh_interpreter_with_env_only(tmp_path):
    """End to end: env vars set before huggingface_hub is imported, nothing patched."""
    cache = tmp_path / "cache"
    cache_repo(cache, "owner/repo", {COMMIT_OLD: {"recipe.yaml": RECIPE_OLD}}, {"main": COMMIT_OLD})
    # hub.py is loaded by file path: the package __init__ would import torch and transformers (slow)
    code = (
        "import importlib.util as u, sys\n"
        f"spec = u.spec_from_file_location('hub', {str(Path(hub.__file__))!r})\n"
        "m = sys.modules['hub'] = u.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "resolve_hub_recipe, HubRecipeUnavailableError = m.resolve_hub_recipe, m.HubRecipeUnavailableError\n"
        "print(resolve_hub_recipe('hf://owner/repo').read_text(), end='')\n"
        "try:\n    resolve_hub_recipe('hf://owner/other')\n"
        "except HubRecipeUnavailableError as e:\n    print('MISSING', 'HF_HUB_OFFLINE=1' in str(e))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_HUB_OFFLINE="1", HF_HUB_CACHE=str(cache), PYTHONPATH=str(Path(__file__).parents[1]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == RECIPE_OLD + "MISSING True\n"


# ---------------------------------------------------------------------------------------------
# safe_load_yaml
# ---------------------------------------------------------------------------------------------


def _payload(target: Path) -> str:
    return f'learning_rate: 0.001\nhook: !!python/object/apply:os.system ["touch {target}"]\n'


def test_python_tag_is_rejected_without_executing(tmp_path):
    target = tmp_path / "hacked"
    recipe = tmp_path / "evil.yaml"
    recipe.write_text(_payload(target))
    with pytest.raises(RecipeYAMLError) as info:
        safe_load_yaml(recipe)
    msg = str(info.value)
    assert "'!!python/object/apply:os.system' is not allowed" in msg
    assert f"{recipe}, line 2, column 7" in msg
    assert "nothing was executed" in msg
    with pytest.raises(RecipeYAMLError, match="not allowed"):
        safe_load_yaml(_payload(target))  # as text too
    assert not target.exists()
    # negative control: the payload is live; an unsafe loader would have run it
    control = tmp_path / "control"
    yaml.unsafe_load(_payload(control))
    assert control.exists()


@pytest.mark.parametrize(
    "text, match",
    [
        ("- a\n- b\n", "the top level is a list; allowed: a mapping"),
        ("just a string", "the top level is a str; allowed: a mapping"),
        ("", "the recipe is empty"),
        ("# only a comment\n", "the recipe is empty"),
        ("1: a\nb: 2\n", r"top-level keys \[1\]; allowed: option names \(strings\)"),
        ("a: [1, 2\nb: 3\n", "line 2, column 2: not valid YAML"),
        ("a: !custom 3\n", "'!custom' is not allowed"),
    ],
)
def test_safe_load_yaml_rejects(text, match):
    with pytest.raises(RecipeYAMLError, match=match):
        safe_load_yaml(text + ("\n" if "\n" not in text else ""))


def test_safe_load_yaml_paths_text_and_limits(tmp_path, monkeypatch):
    path = tmp_path / "r.yaml"
    path.write_text(RECIPE_NEW)
    expected = {"learning_rate": 0.0006, "max_steps": 20, "model": {"model_type": "gpt2"}}
    assert safe_load_yaml(path) == expected
    assert safe_load_yaml(str(path)) == expected
    assert safe_load_yaml(RECIPE_NEW) == expected
    with pytest.raises(FileNotFoundError, match="missing.yaml"):
        safe_load_yaml(str(tmp_path / "missing.yaml"))
    monkeypatch.setattr(recipes, "RECIPE_MAX_BYTES", 10)
    with pytest.raises(RecipeYAMLError, match=r"\d+ bytes; allowed: a recipe of at most 10 bytes"):
        safe_load_yaml(path)


# ---------------------------------------------------------------------------------------------
# trust_remote_code
# ---------------------------------------------------------------------------------------------


def test_guard_trust_remote_code_drops_unless_user_allows():
    recipe = {
        "trust_remote_code": True,
        "model": {"trust_remote_code": "yes", "model_type": "gpt2"},
        "data": {"trust_remote_code": False},
        "lists": [{"trust_remote_code": 1}],
    }
    with pytest.warns(UserWarning, match="never enables trust_remote_code by itself"):
        cleaned, dropped = guard_trust_remote_code(recipe, source="hf://o/r")
    assert dropped == ["trust_remote_code", "model.trust_remote_code", "lists[0].trust_remote_code"]
    assert cleaned == {"model": {"model_type": "gpt2"}, "data": {"trust_remote_code": False}, "lists": [{}]}
    assert recipe["model"]["trust_remote_code"] == "yes"  # input untouched
    kept, none = guard_trust_remote_code(recipe, source="hf://o/r", trust_remote_code=True)
    assert (kept, none) == (recipe, [])


def test_load_hub_recipe_never_enables_remote_code(offline_cache):
    text = "learning_rate: 0.001\nmodel:\n  model_type: gpt2\n  trust_remote_code: true\n"
    cache_repo(offline_cache, "owner/remote", {COMMIT_NEW: {"recipe.yaml": text}}, {"main": COMMIT_NEW})
    with pytest.warns(UserWarning, match="hf://owner/remote sets model.trust_remote_code"):
        recipe = load_recipe("hf://owner/remote")
    assert recipe == {"learning_rate": 0.001, "model": {"model_type": "gpt2"}}
    assert load_recipe("hf://owner/remote", trust_remote_code=True)["model"]["trust_remote_code"] is True


def test_load_hub_recipe_rejects_python_tag(offline_cache, tmp_path):
    target = tmp_path / "hacked"
    cache_repo(offline_cache, "owner/evil", {COMMIT_NEW: {"recipe.yaml": _payload(target)}}, {"main": COMMIT_NEW})
    with pytest.raises(RecipeYAMLError, match=r"hf://owner/evil, line 2, column 7: not a plain YAML mapping: YAML tag '!!python"):
        load_recipe("hf://owner/evil")
    assert not target.exists()


# ---------------------------------------------------------------------------------------------
# Push: folder, card, HfApi calls
# ---------------------------------------------------------------------------------------------

METRICS = {
    "eval_loss": 3.2109876,
    "train_runtime": 41.5,
    "train_steps_per_second": 12.0,
    "history": [{"step": 1, "loss": 6.0}, {"step": 2, "loss": 5.0}],
    "final_metrics": {"eval_loss": 3.2109876, "epoch": 0.25},
}
RUN_INFO = {
    "machine": {"cpu": "2-core x86_64", "gpu": None},
    "versions": {"torch": "2.13.0", "transformers": "5.24.0"},
    "cuda_devices": [],
    "argv": ["recipes/gpt2_small.py", "--config", "gpt2_tiny"],
}
RUN_FOLDER = [
    "README.md",
    "recipe.yaml",
    "results/config.yaml",
    "results/loss_curve.png",
    "results/metrics.json",
    "results/run_info.json",
]
PNG = b"\x89PNG\r\n\x1a\n fake"


@pytest.fixture
def recipe_file(tmp_path):
    path = tmp_path / "gpt2_tiny.yaml"
    path.write_text(RECIPE_NEW)
    return path


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "runs" / "gpt2_tiny-seed0"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps(METRICS))
    (run / "run_info.json").write_text(json.dumps(RUN_INFO))
    (run / "loss_curve.png").write_bytes(PNG)
    # resolved config: defaults the recipe leaves out, plus one command-line override of learning_rate
    (run / "config.yaml").write_text(
        yaml.safe_dump({"learning_rate": 0.0003, "max_steps": 20, "seed": 0, "model": {"model_type": "gpt2"}})
    )
    return run


def front_matter(card: str) -> dict:
    assert card.startswith("---\n")
    return yaml.safe_load(card.split("---\n")[1])


def test_prepare_recipe_folder_with_run(recipe_file, run_dir, tmp_path):
    out = tmp_path / "push"
    files = prepare_recipe_folder(recipe_file, out, run_dir, repo_id="owner/repo")
    assert files == RUN_FOLDER
    assert (out / "recipe.yaml").read_text() == RECIPE_NEW  # byte for byte, comment kept
    assert json.loads((out / "results" / "metrics.json").read_text()) == METRICS
    assert (out / "results" / "loss_curve.png").read_bytes() == PNG
    card = (out / "README.md").read_text()
    assert front_matter(card) == {"library_name": "hf_fasttrain", "tags": ["hf-fasttrain", "recipe", "gpt2"]}
    assert "# repo: an hf_fasttrain training recipe" in card
    assert "accelerate launch recipes/gpt2_small.py --config hf://owner/repo\n" in card
    assert "```yaml\n" + RECIPE_NEW + "```" in card
    assert "Measured in run `gpt2_tiny-seed0`; its files are in `results/`." in card
    assert "| eval_loss | 3.21099 |" in card
    assert "| train_steps_per_second | 12 |" in card
    assert "| machine.cpu | 2-core x86_64 |" in card
    assert "| machine.gpu | null |" in card
    assert "| versions.transformers | 5.24.0 |" in card
    assert "| history | 2 entries (in the JSON file) |" in card
    assert "| final_metrics.epoch | 0.25 |" in card
    assert "| cuda_devices | none |" in card
    assert "The run's command line:\n\n```\nrecipes/gpt2_small.py --config gpt2_tiny\n```" in card
    # the note on overrides comes before the numbers it qualifies
    assert card.index("| learning_rate | 0.0006 | 0.0003 |") < card.index("| eval_loss |")
    assert "![loss curve](results/loss_curve.png)" in card
    # the run overrode learning_rate; max_steps agrees; seed is a default, not a difference
    assert "| learning_rate | 0.0006 | 0.0003 |" in card
    assert "max_steps |" not in card and "| seed |" not in card


def test_prepare_recipe_folder_without_run_and_named_file(recipe_file, tmp_path):
    out = tmp_path / "push"
    files = prepare_recipe_folder(
        recipe_file, out, repo_id="owner/repo", filename="configs/tiny.yaml", revision="v2", tags=["cpu"]
    )
    assert files == ["README.md", "configs/tiny.yaml"]
    card = (out / "README.md").read_text()
    assert front_matter(card) == {"library_name": "hf_fasttrain", "tags": ["hf-fasttrain", "recipe", "gpt2", "cpu"]}
    assert "--config hf://owner/repo/configs/tiny.yaml@v2\n" in card
    assert "No measured run was attached to this upload." in card
    # huggingface_hub reads the card back: its card data and its text
    from huggingface_hub import ModelCard

    loaded = ModelCard.load(out / "README.md")
    assert loaded.data.library_name == "hf_fasttrain" and loaded.data.tags == ["hf-fasttrain", "recipe", "gpt2", "cpu"]
    assert loaded.text.startswith("\n# repo: an hf_fasttrain training recipe\n")


@pytest.mark.parametrize(
    "recipe, tags, expected",
    [  # the model family tag comes from the recipe's model section; user tags follow; no duplicates
        ({"model": {"model_type": "gpt2"}}, (), ["hf-fasttrain", "recipe", "gpt2"]),
        ({"model": {"model_name_or_path": "meta-llama/Llama-3.2-1B"}}, ("cpu",), ["hf-fasttrain", "recipe", "llama-3.2-1b", "cpu"]),
        ({"model": {"config_name": "./configs/My Model/"}}, ("recipe",), ["hf-fasttrain", "recipe", "my-model"]),
        ({"learning_rate": 1e-3}, ("gpt2", "gpt2"), ["hf-fasttrain", "recipe", "gpt2"]),
        ({"model": None}, (), ["hf-fasttrain", "recipe"]),
    ],
)
def test_model_card_tags(recipe, tags, expected):
    from huggingface_hub import ModelCard

    from hf_fasttrain.run.push import render_model_card

    card = ModelCard(render_model_card(recipe, "x: 1\n", repo_id="o/r", tags=tags))
    assert card.data.tags == expected and card.data.library_name == "hf_fasttrain"


def test_prepare_recipe_folder_refuses(recipe_file, tmp_path):
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "secret.txt").write_text("x")
    with pytest.raises(ValueError, match="must be a new or empty folder"):
        prepare_recipe_folder(recipe_file, busy, repo_id="owner/repo")
    empty_run = tmp_path / "empty_run"
    empty_run.mkdir()
    with pytest.raises(FileNotFoundError, match="holds none of the result files expected .*metrics.json"):
        prepare_recipe_folder(recipe_file, tmp_path / "a", empty_run, repo_id="owner/repo")
    evil = tmp_path / "evil.yaml"
    evil.write_text(_payload(tmp_path / "hacked"))
    with pytest.raises(RecipeYAMLError):
        prepare_recipe_folder(evil, tmp_path / "b", repo_id="owner/repo")
    assert not (tmp_path / "b").exists() and not (tmp_path / "hacked").exists()
    with pytest.raises(ValueError, match="repo_id: got 'repo'; the repo id must have an owner and a name, '<owner>/<repo>'"):
        prepare_recipe_folder(recipe_file, tmp_path / "c", repo_id="repo")


def test_read_run_results_falls_back_to_trainer_files(tmp_path):
    (tmp_path / "all_results.json").write_text(json.dumps({"eval_loss": 2.5}))
    res = read_run_results(tmp_path)
    assert res["metrics"] == {"eval_loss": 2.5} and res["run_info"] == {} and res["config"] is None
    (tmp_path / "run_info.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match="must hold a JSON object, got list"):
        read_run_results(tmp_path)


class RecordingApi:
    """Stands in for huggingface_hub.HfApi: records each call and what the upload folder held then."""

    def __init__(self):
        self.calls = []

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs))

    def create_branch(self, repo_id, **kwargs):
        self.calls.append(("create_branch", repo_id, kwargs))

    def upload_folder(self, **kwargs):
        folder = Path(kwargs["folder_path"])
        held = {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}
        self.calls.append(("upload_folder", kwargs, held))

        class Info:
            commit_url = f"https://huggingface.co/{kwargs['repo_id']}/commit/{COMMIT_NEW}"

        return Info()


def test_push_dry_run_writes_folder_and_calls_nothing(recipe_file, run_dir, tmp_path, capsys):
    api = RecordingApi()
    out = tmp_path / "dry"
    plan = push_recipe(recipe_file, "owner/repo", dry_run=True, run_dir=run_dir, api=api, out_dir=out)
    assert api.calls == []
    assert plan.files == sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert plan.files == RUN_FOLDER
    printed = capsys.readouterr().out
    assert printed.startswith("Dry run: would push recipe hf://owner/repo\n")
    assert "create_repo('owner/repo', repo_type='model', exist_ok=True)" in printed
    assert "revision='main', commit_message='Upload hf_fasttrain recipe recipe.yaml with run results'" in printed
    assert f"    recipe.yaml ({len(RECIPE_NEW)} bytes)" in printed


def test_push_dry_run_default_folder_in_cwd(recipe_file, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    plan = push_recipe(recipe_file, "owner/repo", dry_run=True)
    assert plan.folder == tmp_path / "push-recipe-owner--repo"
    assert (plan.folder / "README.md").is_file() and (plan.folder / "recipe.yaml").read_text() == RECIPE_NEW


def test_push_calls_hfapi_with_repo_files_and_revision(recipe_file, run_dir, capsys):
    api = RecordingApi()
    plan = push_recipe(recipe_file, "owner/repo", run_dir=run_dir, api=api)
    assert [c[0] for c in api.calls] == ["create_repo", "upload_folder"]
    assert api.calls[0] == ("create_repo", "owner/repo", {"repo_type": "model", "exist_ok": True})
    _, kwargs, held = api.calls[1]
    assert kwargs["repo_id"] == "owner/repo"
    assert kwargs["repo_type"] == "model"
    assert kwargs["revision"] == "main"
    assert kwargs["commit_message"] == "Upload hf_fasttrain recipe recipe.yaml with run results"
    assert sorted(held) == RUN_FOLDER
    assert held["recipe.yaml"] == RECIPE_NEW.encode()
    assert "| eval_loss | 3.21099 |" in held["README.md"].decode()
    assert not Path(kwargs["folder_path"]).exists()  # the temporary folder is cleaned up
    assert plan.commit_url.endswith(COMMIT_NEW) and not plan.dry_run
    assert capsys.readouterr().out == ""


def test_push_to_branch_creates_it(recipe_file):
    api = RecordingApi()
    push_recipe(recipe_file, "owner/repo", revision="v2", api=api, private=True, commit_message="v2 recipe")
    assert api.calls[0] == ("create_repo", "owner/repo", {"repo_type": "model", "exist_ok": True, "private": True})
    assert api.calls[1] == ("create_branch", "owner/repo", {"branch": "v2", "repo_type": "model", "exist_ok": True})
    _, kwargs, held = api.calls[2]
    assert (kwargs["revision"], kwargs["commit_message"]) == ("v2", "v2 recipe")
    assert sorted(held) == ["README.md", "recipe.yaml"]
    assert "--config hf://owner/repo@v2\n" in held["README.md"].decode()


def test_push_refuses_bad_input(recipe_file, offline_cache):
    api = RecordingApi()
    with pytest.raises(ValueError, match="is a commit hash; push to a branch name"):
        push_recipe(recipe_file, "owner/repo", revision=COMMIT_OLD, api=api)
    with pytest.raises(ValueError, match="repo_id: got 'a/b/c'; the repo id must have an owner and a name"):
        push_recipe(recipe_file, "a/b/c", api=api)
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE=1 is set: pushing needs the network"):
        push_recipe(recipe_file, "owner/repo")  # real HfApi, offline
    assert api.calls == []


def test_pushed_folder_loads_back_through_hf_uri(recipe_file, run_dir, offline_cache, tmp_path):
    """Push then pull: the uploaded folder, placed in the cache as a commit, resolves to the same recipe."""
    api = RecordingApi()
    push_recipe(recipe_file, "owner/roundtrip", run_dir=run_dir, api=api)
    _, _, held = api.calls[-1]
    cache_repo(offline_cache, "owner/roundtrip", {COMMIT_NEW: held}, {"main": COMMIT_NEW})
    assert load_recipe("hf://owner/roundtrip") == safe_load_yaml(recipe_file)
    assert load_recipe(f"hf://owner/roundtrip/results/config.yaml@{COMMIT_NEW}")["learning_rate"] == 0.0003


# ---------------------------------------------------------------------------------------------
# Wired into recipes.py and the CLI
# ---------------------------------------------------------------------------------------------

TINY = {
    "model": {"n_layer": 2, "n_head": 2, "n_embd": 32},
    "data": {"vocab_size": 300, "block_size": 32, "max_corpus_files": 40, "max_eval_samples": 32},
    "max_steps": 4,
    "per_device_train_batch_size": 8,
    "learning_rate": 3.0e-3,
    "logging_steps": 2,
    "eval_strategy": "no",
    "save_strategy": "no",
    "use_cpu": True,
    "disable_tqdm": True,
    "report_to": "none",
    "dataloader_num_workers": 0,
}


def test_parse_config_loads_hf_uri_with_overrides_and_pinning(offline_cache, tmp_path):
    from hf_fasttrain.config.recipes import parse_config

    old = yaml.safe_dump({**TINY, "max_steps": 10})
    new = "# tiny\n" + yaml.safe_dump({**TINY, "learning_rate": "1e-3"})  # YAML 1.1 reads 1e-3 as a string
    cache_repo(offline_cache, "owner/tiny", {COMMIT_OLD: {"recipe.yaml": old}, COMMIT_NEW: {"recipe.yaml": new}},
               {"main": COMMIT_NEW})
    out = str(tmp_path / "o")
    m, d, t = parse_config(["--config", "hf://owner/tiny", "--output_dir", out, "--max_steps", "7"])
    assert (m.n_layer, m.n_embd, d.block_size, d.vocab_size) == (2, 32, 32, 300)
    assert (t.learning_rate, t.max_steps, t.use_cpu) == (1e-3, 7, True)  # recipe, then the command line
    _, _, t_old = parse_config(["--config", f"hf://owner/tiny@{COMMIT_OLD}", "--output_dir", out])
    assert (t_old.learning_rate, t_old.max_steps) == (3e-3, 10)
    with pytest.raises(HubRecipeUnavailableError, match="'hf://owner/missing'.*not in the Hugging Face cache"):
        parse_config(["--config", "hf://owner/missing", "--output_dir", out])
    with pytest.raises(ValueError, match="must name a .yaml or .yml file"):
        parse_config(["--config", "hf://owner/tiny/README.md", "--output_dir", out])
    assert not (tmp_path / "o").exists()  # nothing started


def test_no_recipe_turns_on_trust_remote_code(offline_cache, tmp_path):
    from hf_fasttrain.config.recipes import parse_config

    text = yaml.safe_dump({**TINY, "model": {**TINY["model"], "trust_remote_code": True}})
    cache_repo(offline_cache, "owner/remote", {COMMIT_NEW: {"recipe.yaml": text}}, {"main": COMMIT_NEW})
    local = tmp_path / "local.yaml"
    local.write_text(text)
    out = ["--output_dir", str(tmp_path / "o")]
    for source in ("hf://owner/remote", str(local)):
        with pytest.warns(UserWarning, match=f"{source} sets model.trust_remote_code; a recipe never enables"):
            m, _, _ = parse_config(["--config", source, *out])
        assert m.trust_remote_code is False
        m, _, _ = parse_config(["--config", source, "--trust_remote_code", "true", *out])
        assert m.trust_remote_code is True  # the user's flag
        m, _, _ = parse_config(["--config", source, "--trust_remote_code", *out])
        assert m.trust_remote_code is True
        with pytest.warns(UserWarning):
            m, _, _ = parse_config(["--config", source, "--trust_remote_code", "false", *out])
        assert m.trust_remote_code is False


def test_args_yaml_args_round_trip_is_identity(tmp_path):
    """args -> resolved YAML -> args gives equal dataclasses, for every field type a recipe uses."""
    import dataclasses

    from hf_fasttrain.config.recipes import parse_config, resolved_config

    argv = [
        "--config", "gpt2_tiny",
        "--output_dir", str(tmp_path / "o"),
        "--max_steps", "17",  # int
        "--learning_rate", "3e-4",  # float given in YAML-1.1-string form
        "--eval_on_start", "false",  # bool
        "--attn_implementation", "eager",  # str
        "--model_name_or_path", "gpt2",  # Optional[str] set
        "--max_train_samples", "100",  # Optional[int] set (n_positions stays None)
        "--mfu_peak_tflops", "312.5",  # Optional[float]
        "--lr_decay", "none", "--min_lr_ratio", "null",  # hand the schedule back to the Trainer
        "--lr_scheduler_type", "cosine_with_min_lr",
        "--lr_scheduler_kwargs", '{"min_lr_rate": 0.05}',  # dict
        "--report_to", "none",  # list after TrainingArguments.__post_init__
        "--eval_strategy", "epoch",  # enum
        "--dataset", "a.txt,b.txt",
    ]
    m, d, t = parse_config(argv)
    first = tmp_path / "first.yaml"
    first.write_text(yaml.safe_dump(resolved_config(m, d, t), sort_keys=False))
    m2, d2, t2 = parse_config(["--config", str(first)])
    assert (m2, d2) == (m, d)
    for f in dataclasses.fields(t):
        if f.init:
            assert getattr(t2, f.name) == getattr(t, f.name), f.name
    assert t2.to_dict() == t.to_dict()
    # ...and YAML -> args -> YAML is a fixed point, byte for byte
    second = tmp_path / "second.yaml"
    second.write_text(yaml.safe_dump(resolved_config(m2, d2, t2), sort_keys=False))
    m3, d3, t3 = parse_config(["--config", str(second)])
    assert yaml.safe_dump(resolved_config(m3, d3, t3), sort_keys=False) == second.read_text()
    # every value type a recipe can hold was exercised, with non-default values
    kinds = {type(v).__name__ for v in (*dataclasses.asdict(m).values(), *dataclasses.asdict(d).values(), *t.to_dict().values())}
    assert {"NoneType", "bool", "dict", "float", "int", "list", "str"} <= kinds
    assert (t2.max_steps, t2.learning_rate, t2.eval_on_start, t2.mfu_peak_tflops) == (17, 3e-4, False, 312.5)
    assert (t2.lr_scheduler_kwargs, t2.report_to, t2.eval_strategy.value) == ({"min_lr_rate": 0.05}, [], "epoch")
    assert (m2.model_name_or_path, m2.attn_implementation, d2.max_train_samples, m2.n_positions) == ("gpt2", "eager", 100, None)


def test_every_bundled_recipe_validates_and_parses(tmp_path):
    import dataclasses

    from hf_fasttrain.config.recipes import bundled_recipes, load_recipe, parse_config, validate_recipe

    names = bundled_recipes()
    assert {"gpt2_tiny", "gpt2_small"} <= set(names)
    for name in names:
        sections = validate_recipe(load_recipe(name))
        # --use_cpu: bf16 / torch_compile recipes are for GPUs, and this check runs anywhere
        m, d, t = parse_config(["--config", name, "--output_dir", str(tmp_path / name), "--use_cpu", "true"])
        for obj, section in ((m, "model"), (d, "data"), (t, None)):
            for key, value in sections[section].items():
                got = getattr(obj, key)
                got = got.value if hasattr(got, "value") and not dataclasses.is_dataclass(got) else got
                if key == "report_to":
                    assert got == ([] if value == "none" else [value]), name
                # overridden here; and TrainingArguments turns pin memory off under use_cpu
                elif key not in ("use_cpu", "output_dir", "dataloader_pin_memory"):
                    assert got == value, (name, key, got, value)


def test_cli_recipes_list(capsys):
    from hf_fasttrain.cli import main
    from hf_fasttrain.config.recipes import bundled_recipes

    assert main(["recipes", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    names = bundled_recipes()
    for name, path in names.items():
        (line,) = [ln for ln in out if ln.startswith(name + " ")]
        # the first sentence of the recipe's leading comment (it may run over two comment lines)
        assert line.split(None, 1)[1].startswith(path.read_text().splitlines()[0].lstrip("# "))
        assert out[out.index(line) + 1].strip() == str(path)
    assert out[-1].startswith("Run one with: hf-fasttrain train --config <name>")  # a wheel has no recipes/


def test_cli_push_recipe_dry_run(run_dir, tmp_path, capsys):
    from hf_fasttrain.cli import main

    out = tmp_path / "folder"
    rc = main(["push-recipe", "gpt2_tiny", "--repo", "owner/tiny", "--dry-run", "--run-dir", str(run_dir),
               "--out-dir", str(out), "--tag", "cpu"])
    assert rc == 0
    printed = capsys.readouterr().out
    assert printed.startswith("Dry run: would push recipe hf://owner/tiny\n")
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == RUN_FOLDER
    from hf_fasttrain.config.recipes import bundled_recipes

    assert (out / "recipe.yaml").read_text() == bundled_recipes()["gpt2_tiny"].read_text()
    card = (out / "README.md").read_text()
    assert front_matter(card) == {"library_name": "hf_fasttrain", "tags": ["hf-fasttrain", "recipe", "gpt2", "cpu"]}
    assert "accelerate launch recipes/gpt2_small.py --config hf://owner/tiny\n" in card


def test_cli_push_recipe_uploads_through_hfapi(recipe_file, monkeypatch, capsys):
    import huggingface_hub
    from huggingface_hub import constants

    from hf_fasttrain.cli import main

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    made = []

    def fake_hfapi(token=None):
        made.append(RecordingApi())
        return made[-1]

    monkeypatch.setattr(huggingface_hub, "HfApi", fake_hfapi)
    recipe_file.write_text(yaml.safe_dump(TINY))
    assert main(["push-recipe", str(recipe_file), "--repo", "owner/tiny", "--revision", "v1", "--private"]) == 0
    (api,) = made
    assert [c[0] for c in api.calls] == ["create_repo", "create_branch", "upload_folder"]
    assert api.calls[0] == ("create_repo", "owner/tiny", {"repo_type": "model", "exist_ok": True, "private": True})
    _, kwargs, held = api.calls[2]
    assert (kwargs["repo_id"], kwargs["revision"], kwargs["repo_type"]) == ("owner/tiny", "v1", "model")
    assert sorted(held) == ["README.md", "recipe.yaml"]
    assert yaml.safe_load(held["recipe.yaml"]) == TINY
    assert capsys.readouterr().out.startswith("Did push recipe hf://owner/tiny@v1\n")


@pytest.mark.parametrize(
    "recipe, match",
    [
        ({"learnig_rate": 1e-3}, "did you mean 'learning_rate'"),
        ({"model": {"n_embd": 100, "n_head": 3}}, "n_head: got 3; must divide n_embd=100"),
        ({"data": {"vocab_size": 10}}, "vocab_size: got 10; "),
    ],
)
def test_cli_push_recipe_validates_first(tmp_path, recipe, match, capsys):
    from hf_fasttrain.cli import main

    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    # a refusal is one line on stderr and exit status 2
    assert main(["push-recipe", str(path), "--repo", "owner/bad", "--dry-run", "--out-dir", str(tmp_path / "f")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and match in err
    assert not (tmp_path / "f").exists()


@pytest.mark.slow
def test_local_recipe_run_push_then_pull_by_hf_uri(tmp_path, offline_cache, capsys):
    """The whole story on the tiny model: a recipe trains, its run is pushed with the results, and
    ``--config hf://...`` from the cache gives back the same arguments."""
    from hf_fasttrain.cli import main
    from hf_fasttrain.config.recipes import parse_config
    from hf_fasttrain.run.train import train

    recipe = tmp_path / "tiny.yaml"
    recipe.write_text("# tiny GPT-2 for tests\n" + yaml.safe_dump(TINY, sort_keys=False))
    run = tmp_path / "run"
    m, d, t = parse_config(["--config", str(recipe), "--output_dir", str(run)])
    final = train(m, d, t)

    folder = tmp_path / "push"
    assert main(["push-recipe", str(recipe), "--repo", "owner/tiny", "--dry-run", "--run-dir", str(run),
                 "--out-dir", str(folder)]) == 0
    card = (folder / "README.md").read_text()
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["final_eval_loss"] == pytest.approx(final["eval_loss"])
    assert f"| final_eval_loss | {metrics['final_eval_loss']:.6g} |" in card
    assert f"| torch | {json.loads((run / 'run_info.json').read_text())['torch']} |" in card
    # run config.yaml == recipe + defaults: no false "differences" (report_to none -> [], output_dir)
    assert "agrees with every field the recipe sets" in card
    assert "![loss curve](results/loss_curve.png)" in card

    files = {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    cache_repo(offline_cache, "owner/tiny", {COMMIT_NEW: files}, {"main": COMMIT_NEW})
    m2, d2, t2 = parse_config(["--config", "hf://owner/tiny", "--output_dir", str(run)])
    assert (m2, d2) == (m, d) and t2.to_dict() == t.to_dict()
