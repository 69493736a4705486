"""The recipe's fine-tuning path: data_format, the embedded functions set, one-line data errors, sft_tiny.yaml."""

import json

import pytest

from hf_fasttrain import DataArguments, ModelArguments
from hf_fasttrain.validation import ConfigError
from hf_fasttrain.data.corpus import is_validation_path
from hf_fasttrain.data.sft import IGNORE_INDEX
from hf_fasttrain.data.sft_sources import build_function_corpus, prepare_sft_data, sft_collator
from hf_fasttrain.config.recipes import load_recipe, validate_recipe
from tests.conftest import TINY_FILES


def test_data_format_is_checked():
    with pytest.raises(ConfigError) as e:
        DataArguments(data_format="chat")
    assert str(e.value) == "data_format: got 'chat'; allowed: 'text', 'prompt_completion', 'messages'"
    with pytest.raises(ConfigError, match="^completion_only_loss: got 'yes'; must be true or false"):
        DataArguments(data_format="messages", completion_only_loss="yes")


def test_embedded_functions_split_by_module():
    dd = build_function_corpus(validation_fraction=0.05, max_files=TINY_FILES)
    train, val = dd["train"], dd["validation"]
    assert len(train) > 20 and len(val) > 20
    assert all(is_validation_path(m, 0.05) for m in val["module"])
    assert not any(is_validation_path(m, 0.05) for m in train["module"])
    row = train[0]
    assert row["prompt"].lstrip().startswith(("def ", "async def ", "@")) and row["completion"].strip()
    assert not row["prompt"].startswith(" ")  # dedented


@pytest.fixture
def tokenizer_dir(tiny_tokenizer, tmp_path):
    path = tmp_path / "tok"
    tiny_tokenizer.save_pretrained(str(path))
    return str(path)


def test_prepare_sft_data_from_jsonl_masks_exactly_the_prompts(tmp_path, tokenizer_dir, tiny_tokenizer):
    rows = [{"prompt": f"def f{i}(x):\n", "completion": f"    return x + {i}\n"} for i in range(10)]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    data = DataArguments(dataset=str(path), data_format="prompt_completion", block_size=64, validation_fraction=0.2)
    tok, lm = prepare_sft_data(data, ModelArguments(model_name_or_path=tokenizer_dir))
    assert (len(lm["train"]), len(lm["validation"])) == (8, 2)
    for ids, labels in zip(lm["train"]["input_ids"], lm["train"]["labels"]):
        text = tok.decode(ids)
        prompt = next(r["prompt"] for r in rows if text.startswith(r["prompt"]))
        n_prompt = len(tiny_tokenizer(prompt, add_special_tokens=False)["input_ids"])
        assert labels[:n_prompt] == [IGNORE_INDEX] * n_prompt
        assert labels[n_prompt:] == ids[n_prompt:] and ids[-1] == tok.eos_token_id
    batch = sft_collator(tok)([lm["train"][0], lm["train"][1]])
    assert batch["labels"].shape == batch["input_ids"].shape


def test_prepare_sft_data_needs_a_tokenizer():
    with pytest.raises(ConfigError, match="^tokenizer: got None; data_format='prompt_completion' fine-tunes a pretrained"):
        prepare_sft_data(DataArguments(dataset="embedded:functions", data_format="prompt_completion"), ModelArguments())


def test_missing_column_is_one_line_and_exit_2_before_training(tmp_path, tokenizer_dir, capsys):
    from hf_fasttrain.cli import run_recipe

    path = tmp_path / "qa.jsonl"
    path.write_text('{"prompt": "q", "answer": "a"}\n' * 5)
    out = tmp_path / "out"
    rc = run_recipe(["--config", "sft_tiny", "--dataset", str(path), "--tokenizer", tokenizer_dir,
                     "--output_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2
    assert err[-1].startswith("error: completion_column: column 'completion' is not in the dataset (columns: "
                              "['prompt', 'answer']); fine-tuning data needs")
    assert not (out / "metrics.json").exists()


def test_sft_tiny_recipe_validates():
    sections = validate_recipe(load_recipe("sft_tiny"))
    assert sections["model"]["model_name_or_path"] == "runs/gpt2_tiny"
    assert sections["data"]["data_format"] == "prompt_completion" and sections["data"]["completion_only_loss"] is True


@pytest.mark.e2e
def test_sft_tiny_recipe_fine_tunes_the_tiny_base(tmp_path):
    """The README's two commands, shortened: pretrain with gpt2_tiny, fine-tune with sft_tiny; eval loss falls."""
    from hf_fasttrain.cli import run_recipe

    base, out = tmp_path / "base", tmp_path / "sft"
    assert run_recipe(["--config", "gpt2_tiny", "--output_dir", str(base), "--max_steps", "40", "--eval_steps", "40",
                       "--save_strategy", "no", "--max_corpus_files", "200"]) == 0
    assert run_recipe(["--config", "sft_tiny", "--model_name_or_path", str(base), "--output_dir", str(out),
                       "--max_steps", "40", "--eval_steps", "20", "--max_corpus_files", "200"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    evals = [h["eval_loss"] for h in metrics["history"] if "eval_loss" in h]
    assert len(evals) >= 3 and evals[-1] < evals[0] - 0.1
    config = (out / "config.yaml").read_text()
    assert "data_format: prompt_completion" in config
