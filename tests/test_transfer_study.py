"""benchmarks/transfer.py: the report's math (parabola fit, drift in octaves, carried-lr loss), the grid walk,
the arms it builds, and a resumable quick study."""

import json
import math

import pytest


def tr():
    from benchmarks import transfer

    return transfer


def test_the_best_lr_is_the_vertex_of_the_parabola_in_log2_lr():
    mod = tr()
    # equally spaced in log2: the vertex is (y0 - y2) / (2 (y0 - 2 y1 + y2)) octaves from the middle = 1/6
    assert mod.best_lr({1e-3: 3.0, 2e-3: 2.0, 4e-3: 2.5}) == pytest.approx(2e-3 * 2 ** (1 / 6), rel=1e-12)
    # symmetric neighbours: the middle itself; only the best and its neighbours count
    assert mod.best_lr({5e-4: 9.0, 1e-3: 3.0, 2e-3: 2.0, 4e-3: 3.0}) == pytest.approx(2e-3, rel=1e-12)
    # the best at an edge: unknown
    assert mod.best_lr({1e-3: 3.0, 2e-3: 2.5, 4e-3: 2.0}) is None
    assert mod.best_lr({1e-3: 3.0, 2e-3: 2.5}) is None
    # a diverged neighbour (NaN or inf): the grid's best, no fit
    assert mod.best_lr({1e-3: 3.0, 2e-3: 2.0, 4e-3: math.inf}) == 2e-3


def test_drift_in_octaves_and_the_loss_at_the_carried_lr():
    mod = tr()
    assert mod.drift_octaves(1e-3, 4e-3) == 2.0
    assert mod.drift_octaves(4e-3, 1e-3) == -2.0
    assert mod.drift_octaves(2e-3, 2e-3 * 2 ** 0.25) == pytest.approx(0.25, abs=1e-12)
    assert mod.drift_octaves(None, 1e-3) is None and mod.drift_octaves(1e-3, None) is None
    losses = {1e-3: 4.04, 2e-3: 4.0, 4e-3: 4.2}
    assert mod.carried_loss_pct(losses, 1e-3) == pytest.approx(1.0, abs=1e-12)
    assert mod.carried_loss_pct(losses, 2e-3) == 0.0
    assert mod.carried_loss_pct(losses, 8e-3) is None and mod.carried_loss_pct(losses, None) is None


def test_grid_losses_average_the_seeds_and_count_a_diverged_run_as_infinite():
    mod = tr()
    runs = [{"lr": 1e-3, "final_eval_loss": 4.0}, {"lr": 1e-3, "final_eval_loss": 4.2},
            {"lr": 2e-3, "final_eval_loss": float("nan")}]
    assert mod.grid_losses(runs) == {1e-3: pytest.approx(4.1, abs=1e-12), 2e-3: math.inf}


def test_the_grid_walk_brackets_each_width_and_runs_the_carried_lr():
    mod = tr()
    best = {64: 2.0 ** -6, 128: 2.0 ** -8, 256: 2.0 ** -8}  # the loss is |log2(lr / best)| at each width
    ran = []

    def run(width, lr):
        ran.append((width, math.log2(lr)))
        return abs(math.log2(lr / best[width]))

    mod.sweep_arm([64, 128, 256], 2.0 ** -5, run, max_extend=4)
    assert ran == [(64, -6), (64, -5), (64, -4), (64, -7),  # best at the low edge: one more below
                   (128, -7), (128, -6), (128, -5), (128, -8), (128, -9),  # starts around 64's best
                   (256, -9), (256, -8), (256, -7), (256, -6)]  # 64's best (-6) run as the carried lr
    ran.clear()
    mod.sweep_arm([64], 1.0, lambda w, lr: ran.append(lr) or -lr, max_extend=2)  # always at the top edge
    assert ran == [0.5, 1.0, 2.0, 4.0, 8.0]


def test_summarise_reads_the_drift_and_the_carried_loss_from_the_runs():
    mod = tr()

    def run(width, lr, loss, seed=0):
        return {"corpus": "python", "length": 1.0, "arm": "adamw", "width": width, "lr": lr, "seed": seed,
                "final_eval_loss": loss, "tokens": 1000, "train_seconds": 1.0}

    runs = [run(64, 1e-3, 3.0), run(64, 2e-3, 2.0), run(64, 4e-3, 2.5),
            run(512, 2e-3, 4.04), run(512, 4e-3, 4.0), run(512, 8e-3, 4.04)]
    s = mod.summarise(runs)["transfer"]["python"]["1"]["adamw"]
    assert s["widths"]["64"]["best_lr"] == pytest.approx(2e-3 * 2 ** (1 / 6), rel=1e-12)
    assert s["widths"]["512"]["best_lr"] == pytest.approx(4e-3, rel=1e-12)
    assert s["drift_octaves"] == pytest.approx(1 - 1 / 6, abs=1e-12)
    assert s["widths"]["512"]["carried_lr"] == 2e-3
    assert s["carried_loss_pct"] == pytest.approx(1.0, abs=1e-12)


def test_run_length_exponent_is_the_slope_of_log2_lr_against_log2_tokens():
    mod = tr()
    runs = []
    for tokens, centre in ((1000, 4e-3), (4000, 2e-3), (16000, 1e-3)):  # lr halves per 4x tokens: k = -0.5
        for lr, loss in ((centre / 2, 3.0), (centre, 2.0), (centre * 2, 3.0)):
            runs.append({"corpus": "python", "length": tokens / 4000, "arm": "muon-mup", "width": 64, "lr": lr,
                         "seed": 0, "final_eval_loss": loss, "tokens": tokens, "train_seconds": 1.0})
    row = mod.summarise(runs)["run_length"]["python"]["muon-mup"]["64"]
    assert row["exponent"] == pytest.approx(-0.5, abs=1e-12)
    assert row["best_lr_by_tokens"] == {"1000": pytest.approx(4e-3), "4000": pytest.approx(2e-3),
                                        "16000": pytest.approx(1e-3)}


def test_the_arms_and_their_settings():
    mod = tr()
    emb = mod.transfer_arm("adamw-emb", 256, 4e-3, 64).args
    assert emb["optimizer"] == "adamw" and emb["optimizer_kwargs"] == {"lr_multipliers": {"embedding": 4.0}}
    assert emb["learning_rate"] == 4e-3 and emb["weight_decay"] == 0.1 and emb["warmup_steps"] == 0.02
    assert "optimizer_kwargs" not in mod.transfer_arm("muon", 512, 1e-2, 64).args
    mup = mod.transfer_arm("muon-mup", 512, 1e-2, 64).args
    assert mup["optimizer"] == "muon" and mup["optimizer_kwargs"] == {"parameterization": "mup", "base_width": 64}
    setup = mod.width_setup(512)
    assert (setup.n_embd, setup.n_head, setup.n_layer, setup.max_steps) == (512, 16, 2, 240)
    assert setup.max_steps * setup.tokens_per_step == 122_880


def test_bad_options_fail_in_one_line_before_training(tmp_path):
    mod = tr()
    with pytest.raises(SystemExit, match="--arms: unknown"):
        mod.main(["--arms", "sgd", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="not a multiple of the head size 32"):
        mod.main(["--widths", "64,100", "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="--text"):
        mod.main(["--text", str(tmp_path / "missing.txt"), "--out", str(tmp_path)])
    assert not (tmp_path / "transfer.json").exists() or not json.loads((tmp_path / "transfer.json").read_text())["runs"]


@pytest.mark.bench
def test_quick_study_is_resumable_and_its_report_matches_its_runs(tmp_path):
    mod = tr()
    argv = ["--quick", "--arms", "adamw,muon", "--max-extend", "1", "--out", str(tmp_path)]
    first = mod.main(argv)
    data = json.loads((tmp_path / "transfer.json").read_text())
    runs = list(data["runs"].values())
    assert first["trained"] == len(runs) >= 12  # 2 arms x 2 widths x at least 3 lrs
    for r in runs:  # every run trained: its loss fell from the start
        assert r["curve"][-1]["eval_loss"] < r["curve"][0]["eval_loss"]
        assert r["tokens"] == 12 * 8 * 32
    for arm in ("adamw", "muon"):
        a = data["summary"]["transfer"]["python"]["1"][arm]
        for w in (16, 32):
            mine = {r["lr"]: r["final_eval_loss"] for r in runs if r["arm"] == arm and r["width"] == w}
            row = a["widths"][str(w)]
            assert row["best_grid_lr"] == min(mine, key=mine.get) and row["best_loss"] == min(mine.values())
            assert len(mine) >= 3
        if a["widths"]["16"]["best_lr"] is not None and a["widths"]["32"]["best_lr"] is not None:
            assert a["drift_octaves"] == pytest.approx(
                math.log2(a["widths"]["32"]["best_lr"] / a["widths"]["16"]["best_lr"]))
        carried = a["widths"]["16"]["best_grid_lr"]
        wide = {r["lr"]: r["final_eval_loss"] for r in runs if r["arm"] == arm and r["width"] == 32}
        assert a["carried_loss_pct"] == pytest.approx(100 * (wide[carried] / min(wide.values()) - 1))
    again = mod.main(argv)  # every run read back: nothing trains, the same summary
    assert again["trained"] == 0 and again["transfer"] == first["transfer"]
    md = (tmp_path / "transfer.md").read_text()
    report = mod.main(["--report", "--out", str(tmp_path)])
    assert report["transfer"] == first["transfer"] and (tmp_path / "transfer.md").read_text() == md
    assert "drift 16->32 (octaves)" in md and (tmp_path / "transfer.png").stat().st_size > 0


def test_the_study_page_is_the_reports_output_from_the_results():
    """docs/benchmarks/transfer.md's generated part is page_block of results/transfer.json's last report: every
    number on it is read from the JSON (rerun `python -m benchmarks.transfer --report` after new runs)."""
    from benchmarks._harness import ROOT

    mod = tr()
    data = json.loads((ROOT / "benchmarks" / "results" / "transfer.json").read_text())
    page = (ROOT / "docs" / "benchmarks" / "transfer.md").read_text(encoding="utf-8")
    block = page.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0]
    assert block.strip() == mod.page_block(data).strip()
    # the quoted drift of each arm is the summary's
    for corpus, by_length in data["summary"]["transfer"].items():
        for arm, a in by_length.get("1", {}).items():
            if a["drift_octaves"] is not None and a["widest"] == max(int(w) for x in by_length["1"].values()
                                                                     for w in x["widths"]):
                assert f"`{arm}`: from width {a['base_width']} to {a['widest']} the best lr moves " \
                       f"{a['drift_octaves']:+.2f} octaves" in page


def test_findings_say_plainly_when_the_standard_parameterization_does_not_drift():
    mod = tr()

    grid = {"final_eval_loss_by_lr": {"0.001": 6.1, "0.002": 6.0, "0.004": 6.2}}

    def arm(drift, pct, wide=grid):
        return {"base_width": 64, "widest": 512, "drift_octaves": drift, "carried_loss_pct": pct,
                "widths": {"64": grid, "512": wide}}

    lines = mod.findings({"adamw": arm(0.25, 0.4), "muon-mup": arm(-0.1, 0.2)})
    assert lines[0] == "`adamw`: from width 64 to 512 the best lr moves +0.25 octaves; width 64's lr ends 0.40% " \
                       "above the best loss at width 512."
    assert "cannot tell a transfer rule from no rule" in lines[-1]
    lines = mod.findings({"adamw": arm(-1.5, 6.0)})
    assert lines[-1].startswith("Standard AdamW's best lr drifts by 1.50 octaves")
    # a widest width whose grid is still partial (a study running on) says nothing yet
    partial = {"final_eval_loss_by_lr": {"0.001": 6.1, "0.002": 6.0}}
    assert mod.findings({"muon-mup": arm(None, 0.0, partial)}) == []


@pytest.mark.bench
def test_tune_and_train_command_records_the_search_beside_the_study(tmp_path):
    """`python -m benchmarks.transfer tune-and-train --quick`: the search at width 16 on the restart engine, the
    width-32 run at its winner's lr, the record in the study's JSON and in the target's run_info.json."""
    mod = tr()
    runs = tmp_path / "runs"
    record = mod.main(["tune-and-train", "--quick", "--arm", "adamw", "--proxy-width", "16", "--width", "32",
                       "--lrs", "1e-3,1.6e-2,6.4e-2", "--runs", str(runs), "--out", str(tmp_path), "--walk", "1"])
    search = record["search"]
    finished = {lr: row["final_metric"] for lr, row in search["lrs"].items() if row["final_metric"] is not None}
    assert search["learning_rate"] == float(min(finished, key=finished.get))
    assert (search["proxy_width"], search["target_width"], record["width"]) == (16, 32, 32)
    info = json.loads((runs / "run_info.json").read_text())
    assert info["transfer"]["learning_rate"] == search["learning_rate"]
    assert info["transfer"]["proxy_search"] == str(runs / "proxy-w16")
    saved = json.loads((tmp_path / "transfer.json").read_text())["tune_and_train"]
    assert saved["adamw@16->32x12"]["final_eval_loss"] == record["final_eval_loss"]
    assert record["final_eval_loss"] == json.loads((runs / "metrics.json").read_text())["final_metrics"]["eval_loss"]
    # the walk: the winner's lr / 2 and x 2 through the same code, each its own run folder
    lr = search["learning_rate"]
    assert list(record["walk"]) == [f"{lr / 2:g}", f"{lr:g}", f"{lr * 2:g}"]
    assert record["walk"][f"{lr:g}"] == record["final_eval_loss"]
    for other in (lr / 2, lr * 2):
        final = json.loads((runs / f"walk-lr{other:g}" / "metrics.json").read_text())["final_metrics"]["eval_loss"]
        assert record["walk"][f"{other:g}"] == final
    assert record["loss_above_walk_best_pct"] == pytest.approx(
        100 * (record["final_eval_loss"] / min(record["walk"].values()) - 1))


def test_the_noise_of_one_seed_is_read_at_the_base_width():
    mod = tr()

    def grid(**losses):
        return {"widths": {"64": {"final_eval_loss_by_lr": losses}}}

    arms = {"adamw": grid(**{"0.002": 6.0, "0.004": 6.1}), "adamw-mup": grid(**{"0.002": 5.9, "0.004": 6.2,
                                                                                  "0.008": 6.3})}
    assert mod.base_width_noise(arms) == {"width": 64, "lrs": 2, "mean_abs_diff": pytest.approx(0.1, abs=1e-12)}
    assert mod.base_width_noise({"adamw": arms["adamw"]}) is None


def test_the_best_loss_table_reads_each_grid_s_lowest_loss():
    mod = tr()
    arms = {"adamw": {"widths": {"64": {"best_loss": 6.02}, "128": {"best_loss": 5.618}}},
            "muon": {"widths": {"64": {"best_loss": 5.136}}}}
    assert mod.best_loss_table(arms).splitlines()[2:] == ["| adamw | 6.020 | 5.618 |", "| muon | 5.136 | not run |"]


def test_each_rule_s_loss_is_set_beside_its_standard_optimizer_s():
    mod = tr()

    def arm(**by_width):
        return {"widths": {w[1:]: {"best_loss": v} for w, v in by_width.items()}}

    arms = {"adamw": arm(w64=6.0, w512=5.356), "adamw-mup": arm(w64=5.9, w512=5.787),
            "muon": arm(w64=5.1, w512=4.954), "muon-mup": arm(w64=5.2, w512=4.9)}
    assert mod.rule_vs_standard(arms) == [
        "At width 512 `adamw-mup`'s lowest loss, 5.787, is above `adamw`'s 5.356 at its own best lr.",
        "At width 512 `muon-mup`'s lowest loss, 4.900, is below `muon`'s 4.954 at its own best lr."]
    assert mod.rule_vs_standard({"adamw": arm(w64=6.0), "adamw-mup": arm(w64=5.9)}) == []


def test_the_transfer_card_quotes_the_study():
    """The card's measured-drift table is the study's JSON (embedded corpus, 1x), cell by cell."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    summary = json.loads((root / "benchmarks/results/transfer.json").read_text(encoding="utf-8"))["summary"]
    arms = summary["transfer"]["python"]["1"]
    card = (root / "docs/techniques/transfer.md").read_text(encoding="utf-8")
    for arm in ("adamw", "adamw-emb", "adamw-mup", "muon", "muon-mup"):
        x = arms[arm]
        cells = f"| {x['drift_octaves']:+.2f} | {x['carried_loss_pct']:.2f} | {x['widths']['512']['best_loss']:.3f} |"
        assert f"| `{arm}` |" in card and cells in card, (arm, cells)
    assert f"within {abs(arms['adamw-mup']['drift_octaves']):.2f} octave" in card
    assert f"parameterization's moves {abs(arms['adamw']['drift_octaves']):.2f}" in card
    assert (f"from {abs(arms['muon']['drift_octaves']):.2f} to {abs(arms['muon-mup']['drift_octaves']):.2f} octave"
            in card)
    assert arms["adamw-mup"]["widths"]["512"]["best_loss"] > arms["adamw"]["widths"]["512"]["best_loss"]
    # the setup sentence: every arm's widths and the tokens of a run, one seed
    widths = sorted({int(w) for a in arms.values() for w in a["widths"]})
    tokens = {row["tokens"] for a in arms.values() for row in a["widths"].values()}
    seeds = {row["seeds"] for a in arms.values() for row in a["widths"].values()}
    assert len(tokens) == 1 and seeds == {1}
    named = ", ".join(map(str, widths[:-1])) + f" and {widths[-1]}"
    assert f"widths {named}, {tokens.pop():,} tokens of the embedded corpus per run, one" in card


def test_the_benchmarks_summary_quotes_the_study():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    arms = json.loads((root / "benchmarks/results/transfer.json").read_text(encoding="utf-8"))["summary"]["transfer"][
        "python"]["1"]
    page = (root / "docs/benchmarks.md").read_text(encoding="utf-8")
    d = {a: abs(arms[a]["drift_octaves"]) for a in arms}
    assert (f"under muP: AdamW's moves {d['adamw-mup']:.2f} octave ({d['adamw']:.2f} standard), Muon's "
            f"{d['muon-mup']:.2f} ({d['muon']:.2f} as shipped);") in page
    assert f"at 512 | {arms['adamw']['widths']['512']['seeds']} |" in page  # the row's seeds column
