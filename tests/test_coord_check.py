"""The coordinate check: flat under muP, growing under the standard parameterization; its command's exit status."""

import json
import math

import pytest

from hf_fasttrain.cli import main
from hf_fasttrain.transfer import CoordCheckModel, coord_check, log_log_slope

TINY = CoordCheckModel(n_layer=2, head_dim=8, vocab_size=64, n_positions=16)
WIDTHS = (32, 64, 128)


def test_log_log_slope_is_the_exponent():
    assert log_log_slope([32, 64, 128], [1.0, 2.0, 4.0]) == pytest.approx(1.0)
    assert log_log_slope([32, 64, 128], [8.0, 4.0, 2.0]) == pytest.approx(-1.0)
    assert log_log_slope([32, 128], [3.0, 6.0]) == pytest.approx(0.5)
    assert math.isnan(log_log_slope([32, 64], [1.0, 0.0]))


def test_adamw_is_flat_under_mup_and_grows_under_standard():
    mup = coord_check(TINY, WIDTHS, parameterization="mup", optimizer="adamw", lr=3e-3, steps=3)
    assert mup.flat, mup.table()
    assert max(abs(s) for s in mup.slopes.values()) <= 0.25
    assert len(mup.slopes) == 4 + 9  # embedding, 2 blocks, logits; 8 hidden matrices and the head
    standard = coord_check(TINY, WIDTHS, parameterization="standard", optimizer="adamw", lr=3e-3, steps=3)
    assert not standard.flat
    s = standard.slopes
    hidden = [v for k, v in s.items() if k.startswith("update/h.")]
    assert len(hidden) == 8 and min(hidden) > 0.5  # Adam's hidden updates grow about as the width
    assert min(s["activation change/block.0"], s["activation change/block.1"], s["activation change/logits"]) > 0.5
    assert abs(s["activation change/embedding"]) < 0.25  # the embedding's lr is the same in both: flat in both
    # the same batch and init at every width: the losses at step 0 are those of the same model family
    assert mup.losses[0][0] == pytest.approx(math.log(64), rel=0.05)


def test_muon_is_flat_with_the_spectral_scale_and_grows_with_match_rms_adamw():
    spectral = coord_check(TINY, WIDTHS, parameterization="mup", optimizer="muon", lr=1e-2, steps=2)
    assert spectral.flat, spectral.table()
    shipped = coord_check(TINY, WIDTHS, parameterization="standard", optimizer="muon", lr=1e-2, steps=2)
    hidden = [v for k, v in shipped.slopes.items() if k.startswith("update/h.")]
    assert not shipped.flat and min(hidden) > 0.3  # 0.2 sqrt(max(A, B)) grows as sqrt(width)


def test_the_command_writes_its_outputs_and_exits_1_when_not_flat(tmp_path, capsys):
    out = tmp_path / "cc"
    code = main(["coord-check", "--widths", "32,64,128", "--head_dim", "8", "--vocab_size", "64", "--parameterization",
                 "standard", "--steps", "2", "--output_dir", str(out)])
    assert code == 1
    text = capsys.readouterr().out
    assert "| update | h.0.mlp.c_fc |" in text and ": not flat; the largest |slope| is" in text
    saved = json.loads((out / "coord_check.json").read_text())
    assert saved["flat"] is False and saved["widths"] == [32, 64, 128] and saved["parameterization"] == "standard"
    assert (out / "coord_check.png").stat().st_size > 10_000
    assert (out / "coord_check.md").read_text().startswith("coord check (standard, adamw, lr 0.003, 2 steps")


@pytest.mark.parametrize("argv, message", [
    (["--widths", "64,32"], "error: widths: got [64, 32]; increasing and distinct"),
    (["--widths", "32,40", "--head_dim", "16"], "error: widths: got 40; multiples of head_dim=16"),
    (["--parameterization", "mu"], "error: parameterization: got 'mu'; one of standard, mup"),
    (["--optimizer", "muon", "--optimizer_kwargs", '{"adjust_lr_fn": "original"}', "--widths", "32,64"],
     "error: adjust_lr_fn: got 'original' with parameterization 'mup'"),
])
def test_the_command_refuses_bad_options_in_one_line(argv, message, capsys):
    assert main(["coord-check", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message) and "\n" not in err


def test_a_recipe_gives_the_model_and_the_optimizer(tmp_path):
    out = tmp_path / "cc"
    main(["coord-check", "--config", "llama_tiny", "--widths", "32,64", "--vocab_size", "64", "--steps", "1",
          "--output_dir", str(out)])
    saved = json.loads((out / "coord_check.json").read_text())
    model = saved["settings"]["model"]
    assert (model["model_type"], model["n_layer"], model["head_dim"], model["kv_heads_ratio"]) == ("llama", 2, 32, 0.5)
    assert model["model_config"] == {"tie_word_embeddings": True} and model["vocab_size"] == 64  # the flag wins
    assert (saved["optimizer"], saved["lr"]) == ("muon", 1.6e-2)  # the recipe's
    assert "update/layers.1.mlp.down_proj" in saved["slopes"]
