"""The size ladder (``python -m benchmarks.ladder size``, benchmarks/ladder.py) and the harness pieces it reads a sweep
with: budget rule, grid extension, ratio and trend arithmetic, the shared ledger, and a resumable smoke run through
both of its commands."""

import json
import math

import pytest

from benchmarks._harness import ledger, lm, sweeps


def _load():
    from benchmarks import ladder

    return ladder


@pytest.mark.parametrize("n, expected", [(396_800, 300), (100_096, 156), (25_472, 72), (1_334_976, 552), (10, 12)])
def test_budget_grows_with_the_square_root_of_size(n, expected):
    assert _load().size_steps(n, 396_800) == expected


def test_non_embedding_params_exact():
    # GPT-2 block: qkv 3d^2+3d, proj d^2+d, mlp 8d^2+5d, 2 layer norms 4d; plus the final norm 2d
    d = 64
    assert lm.non_embedding_params(2, d, "gpt2", 2) == 2 * (12 * d * d + 13 * d) + 2 * d
    # Llama (tied, no biases), 2 query heads of 32, 1 kv head, MLP 192: q,o 2d^2 + k,v 2*32d + 3*192d + 2 norms d
    assert lm.non_embedding_params(2, d, "llama", 2, 1) == 2 * (2 * d * d + 2 * 32 * d + 3 * 192 * d + 2 * d) + d


@pytest.mark.parametrize("losses, expected", [
    ({1e-3: 5.0, 2e-3: 4.0, 4e-3: 4.5}, None),
    ({1e-3: 5.0, 2e-3: 4.5, 4e-3: 4.0}, 8e-3),
    ({1e-3: 4.0, 2e-3: 4.5, 4e-3: 5.0}, 5e-4),
    ({1e-3: 4.0}, None),
])
def test_edge_extension(losses, expected):
    assert sweeps.edge_extension(losses) == expected


def _run(opt, lr, seed, losses, rung="r", step_tokens=100):
    curve = [{"step": i, "tokens": i * step_tokens, "seconds": float(i), "eval_loss": v} for i, v in enumerate(losses)]
    return {"rung": rung, "optimizer": opt, "lr": lr, "seed": seed, "curve": curve, "final_eval_loss": losses[-1],
            "max_steps": len(losses) - 1, "tokens_per_step": step_tokens}


def test_summary_best_lr_and_token_ratio():
    sc = _load()
    runs = [
        _run("adamw", 1e-3, 0, [8, 6, 5, 4.5, 4.2]), _run("adamw", 1e-3, 1, [8, 6, 5, 4.5, 4.4]),
        _run("adamw", 2e-3, 0, [8, 6, 5, 4.8, 4.6]), _run("adamw", 2e-3, 1, [8, 6, 5, 4.8, 4.6]),
        _run("muon", 1e-2, 0, [8, 5, 4.1, 3.9, 3.8]), _run("muon", 1e-2, 1, [8, 5, 4.5, 4.0, 3.9]),
    ]
    s = sc.summarise_size(runs, "r")
    assert s["tokens"] == 400 and s["target_eval_loss"] == pytest.approx(4.3)  # median of 4.2, 4.4
    assert s["optimizers"]["adamw"]["best_lr"] == 1e-3 and s["optimizers"]["adamw"]["best_at_edge"]
    # Muon seed 0 crosses 4.3 between 100 (5.0) and 200 (4.1): 100 + 0.7/0.9 * 100; seed 1 between 200 and 300
    seed0, seed1 = 100 + 0.7 / 0.9 * 100, 200 + 0.2 / 0.5 * 100
    assert s["optimizers"]["muon"]["tokens_to_target"] == pytest.approx((seed0 + seed1) / 2)
    assert s["optimizers"]["muon"]["token_ratio_vs_adamw"] == pytest.approx((seed0 + seed1) / 2 / 400)


def test_fit_line_exact():
    line = sweeps.fit_line([0.0, 1.0, 2.0], [1.0, 3.0, 5.0])
    assert line["slope"] == pytest.approx(2.0) and line["intercept"] == pytest.approx(1.0)
    assert sweeps.fit_line([1.0, 1.0], [2.0, 3.0]) is None


@pytest.mark.bench
def test_quick_ladder_writes_results_and_resumes(tmp_path, monkeypatch):
    sc = _load()
    argv = ["--quick", "--out", str(tmp_path), "--seeds", "1", "--max-extend", "1", "--step-time-steps", "2"]
    first = sc.main(["size", *argv])
    data = json.loads((tmp_path / "scaling.json").read_text())
    assert data["command"].startswith("python -m benchmarks.ladder size --quick --out ")
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"scaling.{ext}").exists()
    keys = set(data["runs"])
    assert {"quick-a|adamw|0.002|0", "quick-a|muon|0.01|0", "quick-b|adamw|0.004|0"} <= keys
    assert set(data["step_time"]) == {"quick-a", "quick-b"}
    assert all(r["final_eval_loss"] < r["curve"][0]["eval_loss"] for r in data["runs"].values())
    assert math.isfinite(first["summary"]["quick-a"]["optimizers"]["muon"]["token_ratio_vs_adamw"])

    # a rerun trains nothing: every run is in the JSON already
    from benchmarks import scaling

    monkeypatch.setattr(sc, "_run_one", lambda job: pytest.fail(f"reran {job}"))
    scaling.main(argv)  # the old command is the same one
    again = json.loads((tmp_path / "scaling.json").read_text())
    assert set(again["runs"]) == keys and again["command"].startswith("python -m benchmarks.scaling --quick --out ")


def test_interpolated_best_lr():
    # symmetric neighbours: the vertex is the grid's best; a better right neighbour pulls it right
    assert sweeps.interpolated_best_lr({1e-3: 5.0, 2e-3: 4.0, 4e-3: 5.0}) == pytest.approx(2e-3)
    # y = (x - x*)^2 in log2 lr with x* = log2(2e-3) + 0.25
    x = {lr: math.log2(lr) for lr in (1e-3, 2e-3, 4e-3)}
    star = math.log2(2e-3) + 0.25
    assert sweeps.interpolated_best_lr({lr: (v - star) ** 2 for lr, v in x.items()}) == pytest.approx(2 ** star)
    assert sweeps.interpolated_best_lr({1e-3: 4.0, 2e-3: 4.5, 4e-3: 5.0}) is None  # at an edge


def test_two_ledgers_on_one_file_keep_each_others_runs(tmp_path):
    """Two searches (two budgets) writing one JSON: each save keeps the other's runs and per-budget entries."""
    path = tmp_path / "ledger.json"
    first = ledger.Ledger(path)
    first.data["runs"]["old"] = {"loss": 1.0}
    first.data["progress"] = {"16x": {"step": 0}}
    first.save()
    a, b = ledger.Ledger(path), ledger.Ledger(path)  # both load the same file
    a.data["runs"]["16x|a"] = {"loss": 2.0}
    a.data["progress"]["16x"] = {"step": 1}
    a.save()
    b.data["runs"]["1x|b"] = {"loss": 3.0}
    b.data.setdefault("progress", {})["1x"] = {"step": 5}
    b.data["command"] = "b's command"
    b.save()
    a.data["runs"]["16x|a2"] = {"loss": 4.0}
    a.save()
    disk = json.loads(path.read_text())
    assert disk["runs"] == {"old": {"loss": 1.0}, "16x|a": {"loss": 2.0}, "1x|b": {"loss": 3.0},
                            "16x|a2": {"loss": 4.0}}
    assert disk["progress"] == {"16x": {"step": 1}, "1x": {"step": 5}}  # b's stale 16x copy did not win
    assert disk["command"] == "b's command"
    assert a.data == disk  # a saw b's entries on its save
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ledger.json"]  # no lock or temporary file left
    # an entry both changed takes the later writer's value
    b.data["runs"]["old"] = {"loss": 0.5}
    b.save()
    assert json.loads(path.read_text())["runs"]["old"] == {"loss": 0.5}


def test_merge_changes_applies_only_what_changed():
    disk = {"runs": {"x": 1, "y": 2}, "n": 2, "s": {"k": 0, "j": 5}, "theirs": "t"}
    base = {"runs": {"x": 1}, "n": 1, "s": {"k": 0, "j": 0}}
    mine = {"runs": {"x": 1, "z": 3}, "n": 1, "s": {"k": 9, "j": 0}, "new": [1]}
    runs = mine["runs"]
    merged = ledger.merge_changes(disk, base, mine)
    assert merged is mine and merged["runs"] is runs  # in place: a caller's reference to the runs stays live
    assert merged == {"runs": {"x": 1, "y": 2, "z": 3}, "n": 2, "s": {"k": 9, "j": 5}, "new": [1], "theirs": "t"}
