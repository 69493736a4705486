"""Parts whose state must roll back with the weights when the divergence guard restores a good state.

A weight average (EMA, LAWA) folds in every update at ``on_step_end``, a bad one included; the guard
notices it one step later and restores the weights. Unless the average comes back too, the run logs a
recovery and then saves an average that still holds the update the guard undid (a non-finite one makes the
saved model NaN). So the guard snapshots and restores its participants with the weights.

Any Trainer: the two callbacks meet through the ``TrainerState`` they share (one per ``train()``), so a
plain ``transformers.Trainer`` with both callbacks added needs no wiring. A participant implements:

- ``rollback_state(model, step)``: its state after optimizer step ``step`` (a copy, taken with a memory
  snapshot of the guard);
- ``rollback_restore(model, saved, checkpoint=None)``: go back to ``saved`` (what ``rollback_state``
  returned), or to what ``checkpoint`` (a Trainer checkpoint directory) holds, or, when neither is there,
  start again from the restored weights.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register_participant", "participants"]

_ATTR = "_hf_fasttrain_rollback_participants"  # not a dataclass field: never written to trainer_state.json


def register_participant(state: Any, participant: Any) -> None:
    """Make ``participant`` roll back with the guard of the run that ``state`` (a TrainerState) belongs to."""
    current = list(getattr(state, _ATTR, []))
    if all(p is not participant for p in current):
        setattr(state, _ATTR, current + [participant])


def participants(state: Any) -> list[Any]:
    return list(getattr(state, _ATTR, [])) if state is not None else []
