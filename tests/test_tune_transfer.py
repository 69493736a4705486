"""Tune small, train big (hf_fasttrain.run.tune_transfer): the proxy's shape, one-line refusals, and a real tiny
search at width 16 whose best lr trains the width-32 model, the target's record naming the search."""

import json
import math

import pytest

from hf_fasttrain import ModelArguments
from hf_fasttrain.validation import ConfigError
from hf_fasttrain.config.recipes import parse_config
from hf_fasttrain.run.tune_transfer import SEARCH_FILE, proxy_model_args, tune_and_train


def test_the_proxy_keeps_the_head_size_and_scales_the_counts():
    p = proxy_model_args(ModelArguments(model_type="gpt2", n_layer=2, n_head=16, n_embd=512), 64)
    assert (p.n_embd, p.n_head, p.n_layer) == (64, 2, 2)
    gqa = ModelArguments(model_type="llama", n_layer=2, n_head=8, n_embd=256, num_key_value_heads=4,
                         intermediate_size=1024)
    p = proxy_model_args(gqa, 64)
    assert (p.n_embd, p.n_head, p.num_key_value_heads, p.intermediate_size) == (64, 2, 1, 256)
    with pytest.raises(ConfigError, match="proxy_width.*multiple of the model's head size 32"):
        proxy_model_args(ModelArguments(model_type="gpt2", n_layer=2, n_head=16, n_embd=512), 48)
    with pytest.raises(ConfigError, match="proxy_width.*from 1 to the model's width 512"):
        proxy_model_args(ModelArguments(model_type="gpt2", n_layer=2, n_head=16, n_embd=512), 1024)
    with pytest.raises(ConfigError, match="num_key_value_heads=4 to a whole number"):
        proxy_model_args(gqa, 32)


TINY = ["--config", "gpt2_tiny", "--max_corpus_files", "40", "--vocab_size", "300", "--block_size", "32",
        "--n_layer", "2", "--n_embd", "32", "--n_head", "4", "--per_device_train_batch_size", "8",
        "--max_eval_samples", "32", "--per_device_eval_batch_size", "32", "--logging_steps", "1",
        "--disable_tqdm", "true", "--warmup_steps", "1", "--eval_steps", "2", "--eval_on_start", "false",
        "--save_strategy", "no", "--max_steps", "4", "--seed", "42", "--seq_len_warmup_min", "null",
        "--weight_averaging", "none"]


def test_bad_lrs_are_refused_before_any_training(tmp_path):
    model_args, data_args, training_args = parse_config(TINY + ["--output_dir", str(tmp_path / "t")])
    with pytest.raises(ConfigError, match="lrs"):
        tune_and_train(model_args, data_args, training_args, 16, [1e-3])
    with pytest.raises(ConfigError, match="lrs"):
        tune_and_train(model_args, data_args, training_args, 16, [1e-3, -1.0])
    assert not (tmp_path / "t").exists()


@pytest.mark.slow  # four tiny training runs
def test_the_proxy_search_picks_the_lr_and_the_target_record_names_it(tmp_path):
    out = tmp_path / "target"
    model_args, data_args, training_args = parse_config(TINY + ["--output_dir", str(out)])
    lrs = [1e-4, 3e-3, 3e-2]
    result = tune_and_train(model_args, data_args, training_args, 16, lrs, rungs=2)
    search = json.loads((out / "proxy-w16" / "restarts_summary.json").read_text())
    rows = {r["index"]: r for r in search["trials"]}
    assert sorted(rows) == [0, 1, 2]
    # successive halving: the rung at step 2 keeps the better half (1 of 3 dropped), the rest train to step 4
    finished = {i: r["final_metric"] for i, r in rows.items() if r["final_metric"] is not None}
    assert len(finished) == 2 and all(math.isfinite(v) for v in finished.values())
    best = min(finished, key=finished.get)
    record = result["transfer"]
    assert record["learning_rate"] == lrs[best] and record["winner_final_metric"] == finished[best]
    assert record["proxy_width"] == 16 and record["target_width"] == 32
    assert record["proxy_search"] == str(out / "proxy-w16")
    assert json.loads((out / SEARCH_FILE).read_text()) == record
    info = json.loads((out / "run_info.json").read_text())
    assert info["transfer"] == record
    config = (out / "config.yaml").read_text()
    assert f"learning_rate: {lrs[best]}" in config and "n_embd: 32" in config
    # every proxy trial trained at its own lr on the same seeds
    for i, lr in enumerate(lrs):
        trial = (out / "proxy-w16" / "trials" / rows[i]["trial_id"] / "config.yaml").read_text()
        assert f"learning_rate: {lr}" in trial and "n_embd: 16" in trial and "seed: 42" in trial
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["final_metrics"]["eval_loss"] == pytest.approx(result["metrics"]["eval_loss"])
    # called again: the search and the target are complete; nothing trains, the same record
    again = tune_and_train(model_args, data_args, training_args, 16, lrs, rungs=2)
    assert again["transfer"] == record


def test_the_cli_help_names_every_search_flag(capsys):
    from hf_fasttrain.cli import TUNE_FLAGS, main

    assert main(["tune-transfer", "--help"]) == 0
    out = capsys.readouterr().out
    for name in TUNE_FLAGS:
        assert f"  --{name}" in out
    assert "proxy-w<W>" in out and "parameterization" in out
    assert all(len(line) <= 100 for line in out.splitlines())


@pytest.mark.parametrize("flags, field", [
    (["--lrs", "1e-3,2e-3"], "proxy-width: got None; required"),
    (["--proxy-width", "16"], "lrs: got None; required"),
    (["--proxy-width", "sixteen", "--lrs", "1e-3,2e-3"], "proxy-width: got 'sixteen'; an integer"),
    (["--proxy-width", "16", "--lrs", "1e-3,x"], "lrs: got '1e-3,x'; comma-separated numbers"),
    (["--proxy-width", "16", "--lrs", "1e-3"], "lrs: got [0.001]; at least 2 different"),
    (["--proxy-width", "20", "--lrs", "1e-3,2e-3"], "proxy_width: got 20; a multiple of the model's head size 8"),
    (["--proxy-width", "16", "--lrs", "1e-3,2e-3", "--rungs", "0"], "rungs: got 0; an integer >= 1"),
    (["--proxy-width", "16", "--lrs", "1e-3,2e-3", "--keep-fraction", "1.5"], "keep-fraction: got 1.5; a number in"),
])
def test_the_cli_refuses_in_one_line_and_leaves_no_folder(tmp_path, capsys, flags, field):
    from hf_fasttrain.cli import main

    out = tmp_path / "t"
    assert main(["tune-transfer", *TINY, "--output_dir", str(out), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and field in err[0], err
    assert not out.exists()


@pytest.mark.slow  # three tiny proxy runs and the target
def test_the_cli_runs_the_search_and_the_target(tmp_path, capsys):
    from hf_fasttrain.cli import main

    out = tmp_path / "target"
    assert main(["tune-transfer", *TINY, "--output_dir", str(out), "--proxy-width", "16", "--lrs",
                 "1e-4,3e-3,3e-2", "--rungs", "1"]) == 0
    record = json.loads((out / SEARCH_FILE).read_text())
    losses = {lr: row["final_metric"] for lr, row in record["lrs"].items()}
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses.values())  # rungs 1: every lr to the end
    assert f"{record['learning_rate']:g}" == min(losses, key=losses.get)
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith(f"tune-transfer: lr {record['learning_rate']:g} from the proxy at width 16 (3 lrs")
    final = json.loads((out / "metrics.json").read_text())["final_metrics"]["eval_loss"]
    assert line.endswith(f"eval_loss {final:.4f}")
