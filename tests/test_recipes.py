from pathlib import Path

import pytest
import yaml

from hf_fasttrain.config.recipes import bundled_recipes, load_recipe, parse_config, resolved_config, validate_recipe

ROOT = Path(__file__).resolve().parent.parent


def _write(tmp_path, data, name="r.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return str(p)


def test_bundled_recipes_validate():
    names = bundled_recipes()
    assert {"gpt2_tiny", "gpt2_small"} <= set(names)
    for name in names:
        sections = validate_recipe(load_recipe(name))
        assert sections["model"] and sections["data"] and sections[None]["output_dir"]


def test_bundled_recipes_found_where_a_wheel_installs_them(tmp_path, monkeypatch):
    import hf_fasttrain.config.recipes as recipes

    installed = tmp_path / "share" / "hf_fasttrain" / "recipes"
    installed.mkdir(parents=True)
    (installed / "gpt2_tiny.yaml").write_text("max_steps: 1\n")
    (installed / "only_installed.yaml").write_text("max_steps: 2\n")
    monkeypatch.setattr(recipes, "INSTALLED_DIR", installed)
    names = recipes.bundled_recipes()
    assert names["gpt2_tiny"] == recipes.BUNDLED_DIR / "gpt2_tiny.yaml"  # the checkout's copy wins
    assert names["only_installed"] == installed / "only_installed.yaml"
    monkeypatch.setattr(recipes, "BUNDLED_DIR", tmp_path / "no_checkout")  # a wheel: no recipes/ beside the package
    assert recipes.recipe_path("gpt2_tiny") == installed / "gpt2_tiny.yaml"


def test_recipe_then_command_line_overrides(tmp_path):
    path = _write(tmp_path, {"model": {"n_layer": 3}, "data": {"block_size": 64}, "learning_rate": "1e-5",
                             "output_dir": str(tmp_path / "out"), "max_steps": 7})
    m, d, t = parse_config(["--config", path, "--max_steps", "9", "--n_embd", "64", "--n_head", "4"])
    assert (m.n_layer, m.n_embd, m.n_head) == (3, 64, 4)
    assert d.block_size == 64
    assert t.learning_rate == 1e-5 and isinstance(t.learning_rate, float)  # YAML '1e-5' is a string
    assert t.max_steps == 9


def test_unknown_key_fails_naming_it_with_a_suggestion(tmp_path):
    path = _write(tmp_path, {"learnig_rate": 1e-3, "output_dir": str(tmp_path / "o")})
    with pytest.raises(ValueError, match=r"learnig_rate: unknown recipe key at the top level; did you mean 'learning_rate'"):
        parse_config(["--config", path])
    path = _write(tmp_path, {"model": {"n_layers": 2}}, "m.yaml")
    with pytest.raises(ValueError, match=r"n_layers: unknown recipe key in section 'model:'; did you mean 'n_layer'"):
        parse_config(["--config", path])
    path = _write(tmp_path, {"block_size": 64}, "b.yaml")
    with pytest.raises(ValueError, match=r"'block_size'.*belongs in the data: section"):
        parse_config(["--config", path])
    assert not (tmp_path / "o").exists()  # nothing was started


@pytest.mark.parametrize(
    "recipe, pattern",
    [
        ({"learning_rate": "fast"}, r"learning_rate: got 'fast'; must be a number"),
        ({"max_steps": 1.5}, r"max_steps: got 1.5; must be an integer"),
        ({"model": {"n_embd": 100, "n_head": 3}}, r"n_head: got 3; must divide n_embd=100"),
        ({"data": {"vocab_size": 10}}, r"vocab_size: got 10; must be an integer >= 260"),
        ({"model": {"dropout": 1.5}}, r"dropout: got 1.5; must be in \[0, 1\)"),
        ({"data": {"block_size": "long"}}, r"data.block_size: got 'long'; must be an integer"),
        ({"mfu_peak_tflops": -1.0}, r"mfu_peak_tflops: got -1.0; must be a finite number > 0 or null"),
    ],
)
def test_invalid_values_fail_before_training(tmp_path, recipe, pattern):
    path = _write(tmp_path, {**recipe, "output_dir": str(tmp_path / "o")})
    with pytest.raises(ValueError, match=pattern):
        parse_config(["--config", path])
    assert not (tmp_path / "o").exists()


def test_python_tags_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = _write(tmp_path, f"learning_rate: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(ValueError, match="not a plain YAML mapping"):
        load_recipe(path)
    assert not marker.exists()


def test_resolved_config_reloads_to_the_same_arguments(tmp_path):
    m, d, t = parse_config(["--config", "gpt2_tiny", "--output_dir", str(tmp_path / "o"), "--max_steps", "41"])
    path = _write(tmp_path, resolved_config(m, d, t), "resolved.yaml")
    m2, d2, t2 = parse_config(["--config", path])
    assert (m2, d2) == (m, d)
    for k in ("learning_rate", "max_steps", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "lr_decay", "min_lr_ratio",
              "per_device_train_batch_size", "eval_strategy", "seed", "output_dir", "use_cpu"):
        assert getattr(t2, k) == getattr(t, k), k


def test_help_all_documents_every_option():
    from hf_fasttrain.config.recipes import make_parser

    text = make_parser().format_help()
    for flag in ("--config", "--learning_rate", "--n_layer", "--block_size", "--dataset", "--tokenizer",
                 "--mfu_peak_tflops", "--auto_resume", "--adam_beta1", "--restart_num_seeds"):
        assert flag in text, flag
    assert "the embedded corpus" in text


@pytest.mark.parametrize("source, stem", [
    ("gpt2_tiny", "gpt2_tiny"),
    ("configs/my.yaml", "my"),
    ("hf://owner/repo", "repo"),
    ("hf://owner/repo@v1", "repo"),
    ("hf://owner/repo/", "repo"),
    ("hf://owner/repo/configs/small.yaml@main", "small"),
])
def test_a_run_is_named_after_its_recipe_source(source, stem):
    from hf_fasttrain.config.recipes import _recipe_stem
    assert _recipe_stem(source) == stem
