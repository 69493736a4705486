"""hf-fasttrain generate: a run's model and tokenizer, offline; the weights it says; one-line refusals."""

import os
import shutil

import pytest
import torch

from conftest import make_tiny_gpt2


@pytest.fixture
def run_dir(tmp_path, tiny_tokenizer):
    """A run's folder as a run leaves it: the final model and tokenizer, and checkpoint-2 with the iterate and a
    weight average (another model's weights) but no tokenizer of its own."""
    run = tmp_path / "run"
    final = make_tiny_gpt2(len(tiny_tokenizer), seed=1)
    final.save_pretrained(run)
    tiny_tokenizer.save_pretrained(run)
    (run / "config.yaml").write_text("weight_averaging: ema\n")
    ckpt = run / "checkpoint-2"
    make_tiny_gpt2(len(tiny_tokenizer), seed=2).save_pretrained(ckpt)
    from hf_fasttrain.stability.averaging import WeightAverage, save_average_file
    from hf_fasttrain.stability.trainables import trainable_parameters

    averaged = make_tiny_gpt2(len(tiny_tokenizer), seed=3)
    save_average_file(WeightAverage(trainable_parameters(averaged), mode="ema").state_dict(),
                      str(ckpt / "weight_average.pt"))
    return run


def _same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.state_dict().values(), b.state_dict().values()))


def test_generate_loads_the_weights_it_says_and_is_deterministic_for_a_seed(run_dir, tiny_tokenizer):
    from hf_fasttrain.run.generate import generate, load_run_model

    model, tok, what = load_run_model(str(run_dir))
    assert what == "the final model, the run's weight average (ema)"
    assert _same_weights(model, make_tiny_gpt2(len(tiny_tokenizer), seed=1))
    ids = generate(model, tok, "def main(", max_new_tokens=12, seed=5)
    assert len(ids) == 12 and all(0 <= i < len(tiny_tokenizer) for i in ids)
    assert generate(model, tok, "def main(", max_new_tokens=12, seed=5) == ids  # the same seed, the same tokens
    assert generate(model, tok, "def main(", max_new_tokens=12, seed=6) != ids
    greedy = generate(model, tok, "", max_new_tokens=6, temperature=0)
    assert greedy == generate(model, tok, "", max_new_tokens=6, temperature=0, seed=99)  # greedy ignores the seed

    # a checkpoint: the tokenizer from the run's folder; the average saved with it, or its own weights on request
    avg, tok2, what = load_run_model(str(run_dir / "checkpoint-2"))
    assert what == "the checkpoint's weight average (ema)" and len(tok2) == len(tiny_tokenizer)
    assert _same_weights(avg, make_tiny_gpt2(len(tiny_tokenizer), seed=3))
    own, _, what = load_run_model(str(run_dir / "checkpoint-2"), weights="iterate")
    assert what == "the checkpoint's own weights (the iterate; its average left out)"
    assert _same_weights(own, make_tiny_gpt2(len(tiny_tokenizer), seed=2))


def test_weights_iterate_on_a_runs_folder_loads_its_last_checkpoints_own_weights(run_dir, tiny_tokenizer, tmp_path):
    from hf_fasttrain.run.generate import load_run_model

    # checkpoint-10 is the last (by step, not by name: checkpoint-2 sorts after it as text)
    make_tiny_gpt2(len(tiny_tokenizer), seed=4).save_pretrained(run_dir / "checkpoint-10")
    model, _, what = load_run_model(str(run_dir), weights="iterate")
    assert what == "the iterate of the run's last checkpoint (checkpoint-10; the final model is the run's weight average, ema)"
    assert _same_weights(model, make_tiny_gpt2(len(tiny_tokenizer), seed=4))
    # a run that did not average: its final model is the iterate
    plain = tmp_path / "plain"
    make_tiny_gpt2(len(tiny_tokenizer), seed=5).save_pretrained(plain)
    tiny_tokenizer.save_pretrained(plain)
    model, _, what = load_run_model(str(plain), weights="iterate")
    assert what == "the final model" and _same_weights(model, make_tiny_gpt2(len(tiny_tokenizer), seed=5))


def test_generate_command_prints_the_prompt_and_its_continuation(run_dir, capsys):
    from hf_fasttrain.cli import main

    argv = ["generate", "--model", str(run_dir), "--prompt", "import ", "--max_new_tokens", "8", "--seed", "1"]
    assert main(argv) == 0
    first = capsys.readouterr()
    assert first.out.startswith("import ") and first.err.strip().endswith("the run's weight average (ema)]")
    assert main(argv) == 0
    assert capsys.readouterr().out == first.out


@pytest.mark.parametrize("case", ["missing", "empty", "no tokenizer", "zero tokens", "negative temperature",
                                  "not a number", "misspelt", "no model flag", "weights", "no iterate"])
def test_generate_refusals_are_one_line_and_exit_2(case, run_dir, tmp_path, capsys):
    from hf_fasttrain.cli import main

    bare = tmp_path / "bare" / "checkpoint-1"
    if case == "no tokenizer":
        shutil.copytree(run_dir / "checkpoint-2", bare)
    if case == "no iterate":  # an averaging run that kept no checkpoint
        shutil.rmtree(run_dir / "checkpoint-2")
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "checkpoint-3").mkdir()
    allowed = "give a run's output_dir or one of its checkpoint-<step> folders"
    argv, expected = {
        "missing": (["--model", str(tmp_path / "nope")], f"model: {tmp_path / 'nope'} does not exist; {allowed}"),
        "empty": (["--model", str(tmp_path / "empty")],
                  f"model: {tmp_path / 'empty'} holds no model (no config.json) (the run has not finished; its latest "
                  f"checkpoint is {tmp_path / 'empty' / 'checkpoint-3'}); {allowed}"),
        "no tokenizer": (["--model", str(bare)], f"model: no tokenizer in {bare} or in {bare.parent}; give a run's "
                         "output_dir (the run saves its tokenizer there) or one of its checkpoints"),
        "zero tokens": (["--model", str(run_dir), "--max_new_tokens", "0"],
                        "max_new_tokens: got 0; must be an integer >= 1"),
        "negative temperature": (["--model", str(run_dir), "--temperature", "-1"],
                                 "temperature: got -1.0; must be a number >= 0 (0: greedy)"),
        "not a number": (["--model", str(run_dir), "--top_k", "x"], "top_k: got 'x'; must be an integer"),
        "misspelt": (["--model", str(run_dir), "--max_new_token", "3"],
                     "--max_new_token: unknown option; did you mean '--max_new_tokens'?"),
        "no model flag": ([], f"model: is required; {allowed}"),
        "weights": (["--model", str(run_dir), "--weights", "ema"],
                    "weights: got 'ema'; allowed: average, iterate"),
        "no iterate": (["--model", str(run_dir), "--weights", "iterate"],
                       f"weights: got 'iterate', but {run_dir} holds only the run's weight average (ema) and no "
                       "checkpoint; use --weights average (the final model), or keep checkpoints (save_strategy) to "
                       "sample an iterate"),
    }[case]
    assert main(["generate", *argv]) == 2
    assert capsys.readouterr().err == f"error: {expected}\n"


@pytest.mark.slow
def test_generate_samples_from_the_tiny_recipe_run(tmp_path, capsys):
    """The tiny recipe trained in-process, then sampled: tokens of the run's own vocabulary, the same for a seed."""
    from hf_fasttrain.run import train as run
    from hf_fasttrain.run.generate import generate, load_run_model
    from hf_fasttrain.config.recipes import parse_config

    out = tmp_path / "run"
    run.train(*parse_config(["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300",
                             "--block_size", "32", "--n_layer", "2", "--n_embd", "32", "--n_head", "2",
                             "--per_device_train_batch_size", "8", "--max_eval_samples", "16", "--disable_tqdm", "true",
                             "--warmup_steps", "1", "--seq_len_warmup_min", "none", "--max_steps", "2",
                             "--save_steps", "2", "--eval_strategy", "no", "--eval_on_start", "false",
                             "--output_dir", str(out)]))
    model, tok, what = load_run_model(str(out))
    assert what == "the final model, the run's weight average (ema)"  # gpt2_tiny averages with an EMA
    assert len(tok) == 300
    ids = generate(model, tok, "def ", max_new_tokens=10, seed=0)
    assert len(ids) == 10 and all(0 <= i < 300 for i in ids)
    assert generate(model, tok, "def ", max_new_tokens=10, seed=0) == ids
    _, _, what = load_run_model(str(out / "checkpoint-2"))
    assert what == "the checkpoint's weight average (ema)"
    assert os.path.isfile(out / "checkpoint-2" / "weight_average.pt")
