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
