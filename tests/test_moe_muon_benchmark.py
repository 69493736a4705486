"""benchmarks/moe_muon.py: tokens-to-target, the lr schedule, and a smoke run that resumes from its ledger."""

import json

import pytest

from benchmarks import moe_muon as mm


@pytest.mark.parametrize("curve, target, expected", [
    ([(0, 0, 5.0), (1, 100, 4.0), (2, 200, 3.0)], 3.5, 150.0),
    ([(0, 0, 5.0), (1, 100, 4.0), (2, 200, 3.0)], 4.0, 100.0),
    ([(0, 0, 5.0), (1, 100, 4.0)], 3.9, None),
])
def test_tokens_to(curve, target, expected):
    assert mm.tokens_to(curve, target) == expected


def test_lr_factor_warms_up_then_decays_to_the_floor():
    s = mm.Setup(steps=100, warmup=0.02, floor=0.1)
    assert [mm.lr_factor(i, s) for i in (0, 1)] == [0.5, 1.0]
    assert mm.lr_factor(100, s) == pytest.approx(0.1) and mm.lr_factor(51, s) == pytest.approx(0.55)


def test_arms_route_the_experts():
    model = mm.build_model(mm.QUICK, 0)
    muon = mm.build_optimizer("muon", model, 1e-3, mm.QUICK)
    dense = mm.build_optimizer("muon-dense", model, 1e-3, mm.QUICK)
    assert any(g.get("experts") for g in muon.param_groups)
    assert not any(g.get("experts") for g in dense.param_groups)


@pytest.mark.slow
def test_quick_run_writes_the_outputs_and_resumes(tmp_path):
    args = ["--quick", "--seeds", "2", "--out", str(tmp_path)]
    record = mm.main(args)
    assert set(record["final_eval_loss"]) == {"adamw", "muon", "muon-dense"}
    assert len(record["final_eval_loss"]["adamw"]) == 2 and len(record["final_eval_loss"]["muon-dense"]) == 1
    assert record["step_time"]["muon"]["expert_matrices"] == 2 * (2 * 4 + 4)  # 2 layers: 4 experts x (gate, up, down)
    for stem in ("json", "md", "png"):
        assert (tmp_path / f"moe_muon_quick.{stem}").exists()
    runs = sorted(p.name for p in (tmp_path / "moe_muon_quick" / "runs").iterdir())
    again = mm.main(args)  # every run saved: nothing trains again, the same results
    assert again["final_eval_loss"] == record["final_eval_loss"] and again["sweep"] == record["sweep"]
    assert sorted(p.name for p in (tmp_path / "moe_muon_quick" / "runs").iterdir()) == runs
    assert json.loads((tmp_path / "moe_muon_quick.json").read_text())["best_lr"] == record["best_lr"]
