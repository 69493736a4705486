"""hf_fasttrain._files: the one atomic write and the one checkpoint discovery (run resume and restart trials)."""

import json
import os
import threading

import pytest

from hf_fasttrain._files import atomic_write_text, checkpoint_step, last_complete_checkpoint


def _ckpt(root, step, state="ok"):
    """A checkpoint folder: ``ok`` (state file parses), ``torn`` (cut short) or ``none`` (no state file)."""
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if state == "ok":
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    elif state == "torn":
        (path / "trainer_state.json").write_text('{"global_st')
    return path


@pytest.mark.parametrize(
    "layout, before_step, expected",
    [
        ({}, None, None),
        ({5: "ok"}, None, 5),
        ({5: "ok", 10: "ok"}, None, 10),
        ({5: "ok", 10: "torn"}, None, 5),  # a kill while saving: the one before
        ({5: "ok", 10: "none"}, None, 5),
        ({5: "torn", 10: "none"}, None, None),
        ({5: "ok", 9: "ok", 10: "ok"}, 10, 9),  # a restart stage ending at 10 never resumes from 10
        ({5: "ok", 10: "ok"}, 5, None),
        ({2: "ok", 10: "ok"}, 11, 10),  # numeric order, not by name
    ],
)
def test_last_complete_checkpoint(tmp_path, layout, before_step, expected):
    for step, state in layout.items():
        _ckpt(tmp_path, step, state)
    (tmp_path / "checkpoint-x").mkdir()  # not a checkpoint name
    (tmp_path / "checkpoint-99").write_text("a file, not a folder")
    found = last_complete_checkpoint(tmp_path, before_step=before_step)
    assert found == (None if expected is None else os.path.join(str(tmp_path), f"checkpoint-{expected}"))


def test_last_complete_checkpoint_missing_dir_and_extra_paths(tmp_path):
    assert last_complete_checkpoint(tmp_path / "missing") is None
    elsewhere = _ckpt(tmp_path / "other", 7)
    # an extra path (the orchestrator's record) counts like one found in the folder, newest wins
    assert last_complete_checkpoint(tmp_path / "missing", extra=[None, str(elsewhere)]) == str(elsewhere)
    _ckpt(tmp_path / "run", 8)
    assert last_complete_checkpoint(tmp_path / "run", extra=[str(elsewhere)]) == str(tmp_path / "run" / "checkpoint-8")
    assert last_complete_checkpoint(tmp_path / "run", before_step=8, extra=[str(elsewhere)]) == str(elsewhere)


@pytest.mark.parametrize(
    "path, step",
    [("checkpoint-40", 40), ("out/checkpoint-40/", 40), ("out/checkpoint-", None), ("checkpoint-4a", None),
     ("out/final", None), ("checkpoint-007", 7)],
)
def test_checkpoint_step(path, step):
    assert checkpoint_step(path) == step


def test_atomic_write_text_replaces_whole_files_from_threads(tmp_path):
    target = tmp_path / "sub" / "state.json"  # the parent is made
    atomic_write_text(target, "old")
    assert target.read_text() == "old"
    texts = [str(i) * 10000 for i in range(8)]
    threads = [threading.Thread(target=atomic_write_text, args=(str(target), t)) for t in texts]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert target.read_text() in texts  # one whole write, never a mix
    assert sorted(os.listdir(tmp_path / "sub")) == ["state.json"]  # no temporary file left


def test_last_complete_checkpoint_requires_the_files_callbacks_add_after_the_state(tmp_path):
    # the weight average is written in on_save, after trainer_state.json: a kill in between leaves it out
    _ckpt(tmp_path, 5)
    _ckpt(tmp_path, 10)
    (tmp_path / "checkpoint-5" / "weight_average.pt").write_bytes(b"x")
    assert last_complete_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert last_complete_checkpoint(tmp_path, required=["weight_average.pt"]) == str(tmp_path / "checkpoint-5")
    (tmp_path / "checkpoint-5" / "weight_average.pt").unlink()
    assert last_complete_checkpoint(tmp_path, required=["weight_average.pt"]) is None


def test_weight_average_file_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    import torch

    from hf_fasttrain.stability import averaging

    path = str(tmp_path / "weight_average.pt")
    averaging.save_average_file({"w": torch.ones(3)}, path)
    assert torch.equal(averaging.load_average_file(path)["w"], torch.ones(3))

    def killed(obj, f):  # torch.save dies half-way through the file
        with open(f, "wb") as fh:
            fh.write(b"PK\x03\x04 half a zip")
        raise KeyboardInterrupt

    monkeypatch.setattr(averaging.torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        averaging.save_average_file({"w": torch.zeros(3)}, path)
    assert torch.equal(averaging.load_average_file(path)["w"], torch.ones(3))  # the old file, whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["weight_average.pt"]  # no temporary left


def test_a_run_with_weight_averaging_resumes_only_from_a_checkpoint_with_its_average(tmp_path):
    from hf_fasttrain.config.args import FastTrainingArguments
    from hf_fasttrain.run._resume import find_resume_checkpoint

    _ckpt(tmp_path, 5)
    _ckpt(tmp_path, 10)
    (tmp_path / "checkpoint-5" / "weight_average.pt").write_bytes(b"x")
    ema = FastTrainingArguments(output_dir=str(tmp_path), weight_averaging="ema", report_to="none", use_cpu=True,
                                auto_resume=True)
    plain = FastTrainingArguments(output_dir=str(tmp_path), report_to="none", use_cpu=True, auto_resume=True)
    assert find_resume_checkpoint(ema) == str(tmp_path / "checkpoint-5")
    assert find_resume_checkpoint(plain) == str(tmp_path / "checkpoint-10")
