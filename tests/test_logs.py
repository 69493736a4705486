"""add_to_log: which history entry a callback's values land in (the copy Trainer.log appended, or none)."""

from types import SimpleNamespace

import pytest

from hf_fasttrain.callbacks._logs import add_to_log


@pytest.mark.parametrize(
    "history, logs, written",
    [
        ([{"loss": 2.0, "step": 3}], {"loss": 2.0}, True),                       # the copy of this log
        ([{"loss": 2.0, "step": 3}], {"loss": 2.0, "other_cb": 1}, True),        # an earlier callback added to logs only
        ([{"loss": 2.0, "seq_len": 8, "step": 3}], {"loss": 2.0, "seq_len": 8}, True),  # an earlier one of ours
        ([{"loss": 2.0, "step": 2}], {"loss": 2.0}, False),                      # another step's entry
        ([{"eval_loss": 3.0, "step": 3}], {"loss": 2.0}, False),                 # another log at this step
        ([], {"loss": 2.0}, False),                                              # nothing appended
    ],
)
def test_add_to_log_writes_to_the_trainers_copy_only(history, logs, written):
    before = [dict(e) for e in history]
    state = SimpleNamespace(global_step=3, log_history=history)
    add_to_log(state, logs, {"tokens_seen": 7})
    assert logs["tokens_seen"] == 7
    if written:
        assert history[-1] == {**before[-1], "tokens_seen": 7}
    else:
        assert history == before
