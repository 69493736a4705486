"""How a callback adds values to a training log in ``on_log``: one function, shared by all of them."""

from __future__ import annotations

from typing import Any, Mapping, Optional

__all__ = ["add_to_log"]


def add_to_log(state: Any, logs: Optional[dict[str, Any]], values: Mapping[str, Any]) -> None:
    """Add `values` to the log being written, in ``on_log``: to `logs` (what the callbacks after this one and
    the reporting integrations see) and to the copy of it that ``Trainer.log`` appended to
    ``state.log_history`` just before calling ``on_log`` (what checkpoints and resumed runs keep).

    That copy is the last entry of the history when it is at this step and every key it has (but ``step``)
    is in `logs` (callbacks before this one may have added keys to `logs` alone); any other last entry is
    left alone.

    Example:
        >>> from types import SimpleNamespace
        >>> state = SimpleNamespace(global_step=3, log_history=[{"loss": 2.0, "step": 3}])
        >>> logs = {"loss": 2.0}
        >>> add_to_log(state, logs, {"seq_len": 64})
        >>> logs, state.log_history[-1]
        ({'loss': 2.0, 'seq_len': 64}, {'loss': 2.0, 'step': 3, 'seq_len': 64})
    """
    last = state.log_history[-1] if state.log_history else None
    is_copy = (last is not None and logs is not None and last.get("step") == state.global_step
               and all(k in logs for k in last if k != "step"))
    if logs is not None:
        logs.update(values)
    if is_copy:
        last.update(values)
