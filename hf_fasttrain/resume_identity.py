"""A run knows what it is: the options a checkpoint was trained with, and what a rerun may change.

Every checkpoint FastTrainer writes holds its run's options (:data:`OPTIONS_FILE`, beside
``trainer_state.json``). A run that resumes from a checkpoint of its ``output_dir`` on its own (``auto_resume``:
the recipe, or ``FastTrainer.train()`` with no ``resume_from_checkpoint``) compares its options with the
checkpoint's first, before any work:

- an option of :data:`MAY_CHANGE_ON_RESUME` (logging, evaluation and save cadence, output and loader options) that
  differs is applied, and the run's record (``config.yaml``, ``run_info.json``) says the new value;
- ``max_steps`` (and ``max_tokens``) may change only when nothing of the run is laid out over its length (no
  decaying lr schedule, no warmup given as a fraction, no length or batch warmup): :func:`length_blocker` says what;
- any other difference (lr, schedule, optimizer and its kwargs, batch, model, data, seeds, ...) is refused in one
  line naming each field with its old and new value (:class:`RunOptionsChanged`).

Pure functions over plain mappings (the ``config.yaml`` shape: training fields at the top level, ``model``,
``data`` and ``peft`` sections), plus :func:`plan_resume`, which reads the files of an ``output_dir``. Checkpoints
written before :data:`OPTIONS_FILE` existed are compared with the ``output_dir``'s ``config.yaml``.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional

from ._files import atomic_write_text, last_complete_checkpoint, read_json_dict as _read_json
from .validation import ConfigError

__all__ = ["OPTIONS_FILE", "PLAN_FILE", "DISCARD_FLAG", "MAY_CHANGE_ON_RESUME", "LENGTH_FIELDS", "Change", "flat_options",
           "option_changes", "length_blocker", "split_changes", "PLAN_CADENCES", "PLAN_LENGTHS", "PLAN_FIXED",
           "plan_changes", "check_resumed_plan", "RunOptionsChanged", "read_recorded_options",
           "write_options", "ResumePlan", "plan_resume", "discard_previous_run"]

# In every checkpoint: {"options": <the run's options, config.yaml's shape>}
OPTIONS_FILE = "run_options.json"
# In every checkpoint FastTrainer writes with the run record on: {"plan": RunPlan.as_dict()}
PLAN_FILE = "run_plan.json"
# the one flag that discards the old run in output_dir instead of resuming it
DISCARD_FLAG = "overwrite_output_dir"

_LOGGING = "what is logged and shown, not what trains"
_EVAL = "evaluation reads the model and changes no weight"
_SAVE = "when and how checkpoints are written, not what trains"
_HUB = "where the results are published"
_LOADER = "how batches are loaded, not which batches"
_RUN = "how this process runs, not what it trains"

# The options a rerun may change when it resumes: each is applied (and recorded) instead of refused. Any option
# not here that differs from the checkpoint's is refused. max_steps and max_tokens follow length_blocker.
MAY_CHANGE_ON_RESUME: dict[str, str] = {
    "max_steps": "a longer or shorter run, when nothing is laid out over its length (see above)",
    "max_tokens": "a longer or shorter run, when nothing is laid out over its length (see above)",
    "output_dir": "the folder itself (a run copied elsewhere resumes there)",
    "logging_strategy": _LOGGING, "logging_steps": _LOGGING, "logging_first_step": _LOGGING,
    "logging_nan_inf_filter": _LOGGING, "log_level": _LOGGING, "log_level_replica": _LOGGING,
    "log_on_each_node": _LOGGING, "disable_tqdm": _LOGGING, "include_num_input_tokens_seen": _LOGGING,
    "report_to": _LOGGING, "run_name": _LOGGING, "project": _LOGGING, "trackio_space_id": _LOGGING,
    "trackio_bucket_id": _LOGGING, "trackio_static_space_id": _LOGGING, "mfu_peak_tflops": _LOGGING,
    "skip_memory_metrics": _LOGGING, "run_record": _LOGGING,
    "eval_strategy": _EVAL, "eval_steps": _EVAL, "eval_delay": _EVAL, "eval_on_start": _EVAL,
    "per_device_eval_batch_size": _EVAL, "eval_accumulation_steps": _EVAL, "eval_do_concat_batches": _EVAL,
    "eval_use_gather_object": _EVAL, "batch_eval_metrics": _EVAL, "prediction_loss_only": _EVAL,
    "include_for_metrics": _EVAL, "max_eval_samples": _EVAL, "do_eval": _EVAL, "do_predict": _EVAL,
    "save_strategy": _SAVE, "save_steps": _SAVE, "save_total_limit": _SAVE, "save_only_model": _SAVE,
    "save_on_each_node": _SAVE, "enable_jit_checkpoint": _SAVE, "save_on_signal": _SAVE,
    "lora_merge": "an extra output written at the end",
    "push_to_hub": _HUB, "hub_private_repo": _HUB, "hub_model_id": _HUB, "hub_strategy": _HUB,
    "hub_always_push": _HUB, "hub_revision": _HUB,
    "dataloader_num_workers": _LOADER, "dataloader_prefetch_factor": _LOADER,
    "dataloader_persistent_workers": _LOADER, "dataloader_pin_memory": _LOADER,
    "dataloader_multiprocessing_context": _LOADER, "preprocessing_num_workers": _LOADER,
    "auto_resume": _RUN, "resume_from_checkpoint": _RUN, DISCARD_FLAG: _RUN, "do_train": _RUN,
    "local_rank": "the process's rank, not the run", "ddp_timeout": _RUN, "debug": _RUN,
    "restart_stop_at_step": "a random-restart stage's stop (the schedule stays the full run's)",
}

LENGTH_FIELDS = ("max_steps", "max_tokens")
# applied without a word: where the run is and how this process was started
_UNSAID = ("output_dir", "local_rank", "resume_from_checkpoint", DISCARD_FLAG)


class Change(tuple):
    """``(field, old, new)``."""

    def __new__(cls, name: str, old: Any, new: Any):
        return super().__new__(cls, (name, old, new))

    name = property(lambda self: self[0])
    old = property(lambda self: self[1])
    new = property(lambda self: self[2])

    def __str__(self) -> str:
        return f"{self.name} {_shown(self.old)!r} -> {_shown(self.new)!r}"


def _shown(value: Any) -> Any:
    """A whole float as the integer it is (``eval_steps 2 -> 1``: the command line reads a float, a recipe an int)."""
    return int(value) if isinstance(value, float) and value.is_integer() and abs(value) < 1e15 else value


def flat_options(config: Mapping[str, Any]) -> dict[str, Any]:
    """One level of ``{field: value}`` from a config (training fields at the top, ``model``/``data``/``peft``
    sections inside). A config with a ``model`` section and no ``peft`` one records a full-training run:
    ``lora_r`` reads None."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if key in ("model", "data", "peft") and isinstance(value, Mapping):
            out.update(value)
        elif key not in ("model", "data", "peft"):
            out[key] = value
    if isinstance(config.get("model"), Mapping) and "peft" not in config:
        out.setdefault("lora_r", None)
    return out


def _same(a: Any, b: Any) -> bool:
    if a in (None, {}, []) and b in (None, {}, []):
        return True
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        return set(a) == set(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b or a == b and type(a) is type(b)
    return a == b


def option_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[Change]:
    """Every field whose value differs between two configs, in the current config's order. A field the
    recorded config lacks (written by a version without that option) or the current one lacks (a script that
    records no model or data section) is no evidence either way."""
    before, now = flat_options(recorded), flat_options(current)
    if now.get("tokenizer") or before.get("tokenizer"):  # only the trained BPE reads vocab_size
        before.pop("vocab_size", None)
    return [Change(k, before[k], v) for k, v in now.items() if k in before and not _same(before[k], v)]


def _fraction(v: Any) -> bool:
    return isinstance(v, float) and 0 < v < 1


def length_blocker(options: Mapping[str, Any]) -> Optional[str]:
    """Why the run's length (``max_steps``, ``max_tokens``) cannot change on resume, or None when it can.

    The length can change when nothing is laid out over it: the lr holds (``lr_decay='constant'`` or the
    Trainer's ``constant``/``constant_with_warmup``), or a token-counted schedule ends at a fixed
    ``schedule_total_tokens``; the lr warmup is a number of steps, not a fraction; and no sequence-length,
    curriculum or batch-size warmup, nor AdEMAMix's alpha/beta3 warmup (unless ``optimizer_kwargs`` fixes its
    ``T_alpha_beta3``), nor ``budget_aware``, reads the length.

    >>> length_blocker({"lr_decay": "constant", "warmup_steps": 20})
    >>> length_blocker({"lr_decay": "cosine", "warmup_steps": 20})
    "the lr schedule (lr_decay 'cosine') decays over the run's length"
    """
    o = flat_options(options)
    decay = o.get("lr_decay")
    if decay:
        fixed_tokens = o.get("schedule_unit") == "tokens" and o.get("schedule_total_tokens")
        if decay != "constant" and not fixed_tokens:
            return f"the lr schedule (lr_decay {decay!r}) decays over the run's length"
    else:
        kind = o.get("lr_scheduler_type", "linear")
        if kind not in ("constant", "constant_with_warmup"):
            return f"the lr schedule (lr_scheduler_type {kind!r}) spans the run's length"
    if _fraction(o.get("warmup_steps")):
        return f"warmup_steps {o['warmup_steps']!r} is a fraction of the run's length"
    for name, what in (("seq_len_warmup_min", "the sequence-length warmup"), ("curriculum_min_length", "the curriculum"),
                       ("batch_warmup_min_tokens", "the batch-size warmup")):
        if o.get(name) is not None:
            return f"{what} ({name} {o[name]!r}) spans a fraction of the run's length"
    if o.get("optimizer") == "ademamix" and "T_alpha_beta3" not in _mapping(o.get("optimizer_kwargs")):
        return "AdEMAMix warms alpha and beta3 up over the run's length (T_alpha_beta3 = max_steps)"
    if o.get("budget_aware"):
        return "budget_aware chose its settings for the run's length"
    return None


def _mapping(value: Any) -> Mapping[str, Any]:
    """``optimizer_kwargs`` as recorded: a mapping, a JSON string (the command line) or nothing."""
    if isinstance(value, str) and value.strip():
        try:
            value = json.loads(value)
        except ValueError:
            return {}
    return value if isinstance(value, Mapping) else {}


def split_changes(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> tuple[list[Change], list[Change], Optional[str]]:
    """``(applied, refused, why)``: the changes a resume applies, those it refuses, and why a length change is
    refused (None when it is not)."""
    applied, refused, why = [], [], None
    for change in option_changes(recorded, current):
        if change.name in LENGTH_FIELDS:
            blocker = length_blocker(recorded)
            if blocker is not None:
                refused.append(change)
                why = blocker
                continue
        (applied if change.name in MAY_CHANGE_ON_RESUME else refused).append(change)
    return applied, refused, why


# A plan's length fields (hf_fasttrain.config.plan.RunLength) and what a resume does when one differs from the
# checkpoint's plan: the cadences are applied; the run's length follows length_blocker; the rest is refused, why.
PLAN_CADENCES = ("logging_steps", "eval_steps", "save_steps")
PLAN_LENGTHS = ("optimizer_steps", "schedule_steps", "tokens", "max_tokens")
PLAN_FIXED = {
    "global_batch": "the rows per optimizer step (per-device batch x accumulation x processes) are the run's: "
                    "resume with the processes, per_device_train_batch_size and gradient_accumulation_steps it was "
                    "trained with",
    "row_length": "the tokens per row are the run's: resume with its block_size",
    "seq_len_warmup": "the sequence-length warmup is the run's: resume with its seq_len_warmup_* options",
}
_DERIVED = "settings derived from the options differ from those it was trained with"


def plan_changes(saved: Mapping[str, Any], current: Mapping[str, Any],
                 options: Mapping[str, Any]) -> tuple[list[Change], list[Change], Optional[str]]:
    """``(applied, refused, why)`` between a checkpoint's plan and this run's (``RunPlan.as_dict`` values), field by
    field. The technique specs must agree (a ``budget_aware`` table or a default changed since: refused); of the
    run's length (``plan.length``) the cadences are applied, the optimizer steps, schedule steps and tokens follow
    the rule for ``max_steps`` (:func:`length_blocker` of ``options``), and the global batch, row length and
    sequence-length warmup are refused. ``why`` joins the reasons of the refused ones."""
    applied: list[Change] = []
    refused: list[Change] = []
    whys: list[str] = []

    def refuse(change: Change, why: str) -> None:
        refused.append(change)
        if why not in whys:
            whys.append(why)

    for section in ("optimizer", "schedule", "averaging", "guard", "budget"):
        old, new = saved.get(section), current.get(section)
        if isinstance(old, Mapping) and isinstance(new, Mapping):
            for k in dict.fromkeys([*old, *new]):
                if old.get(k) != new.get(k):
                    refuse(Change(f"plan.{section}.{k}", old.get(k), new.get(k)), _DERIVED)
        elif old != new:
            refuse(Change(f"plan.{section}", old, new), _DERIVED)
    old_length, new_length = saved.get("length"), current.get("length")
    if isinstance(old_length, Mapping) and isinstance(new_length, Mapping):
        blocker = length_blocker(options)
        for k in new_length:
            if k not in old_length or _same(old_length[k], new_length[k]):
                continue  # a field the checkpoint's plan lacks (an older version) is no evidence either way
            change = Change(f"plan.length.{k}", old_length[k], new_length[k])
            if k in PLAN_CADENCES or (k in PLAN_LENGTHS and blocker is None):
                applied.append(change)
            else:
                refuse(change, PLAN_FIXED.get(k) or blocker or _DERIVED)
    return applied, refused, "; ".join(whys) or None


def check_resumed_plan(checkpoint: str, plan: Mapping[str, Any], options: Mapping[str, Any],
                       output_dir: str) -> list[Change]:
    """Compare ``checkpoint``'s plan (:data:`PLAN_FILE`) with the resuming run's ``plan`` (``RunPlan.as_dict``)
    by :func:`plan_changes`: raises :class:`RunOptionsChanged` (one line) for a refused change, else returns the
    changes applied. A checkpoint without a plan (an older version) passes. ``FastTrainer.train()`` and
    ``--dry_run`` take this one decision."""
    saved = (_read_json(os.path.join(checkpoint, PLAN_FILE)) or {}).get("plan")
    if not isinstance(saved, dict):
        return []
    applied, refused, why = plan_changes(saved, json.loads(json.dumps(dict(plan), default=str)), options)
    if refused:
        raise RunOptionsChanged(output_dir, checkpoint, refused, why)
    return applied


class RunOptionsChanged(ConfigError):
    """A rerun whose options differ from its checkpoint's where a resume may not change them: one line."""

    def __init__(self, output_dir: str, checkpoint: str, refused: Iterable[Change], why: Optional[str] = None,
                 finished: bool = False):
        self.changes = list(refused)
        listed = ", ".join(str(c) for c in self.changes)
        state = "a finished run" if finished else "a run"
        because = f" ({why})" if why else ""
        super().__init__(
            "output_dir", output_dir,
            problem=f"{output_dir} holds {state} ({os.path.basename(os.path.normpath(checkpoint))}) trained with other "
                    f"options: {listed}{because}",
            allowed=f"use a new --output_dir for this run, or add --{DISCARD_FLAG} to discard the old run (its "
                    f"checkpoints are deleted)")


def read_recorded_options(checkpoint: Optional[str], output_dir: Optional[str] = None) -> Optional[dict]:
    """A checkpoint's options (its :data:`OPTIONS_FILE`), else those of ``output_dir/config.yaml`` (older
    checkpoints), else None."""
    if checkpoint:
        try:
            with open(os.path.join(checkpoint, OPTIONS_FILE), encoding="utf-8") as f:
                data = json.load(f)
            if isinstance(data, dict) and isinstance(data.get("options"), dict):
                return data["options"]
        except (OSError, ValueError):
            pass
    if output_dir:
        import yaml

        try:
            with open(os.path.join(output_dir, "config.yaml"), encoding="utf-8") as f:
                recorded = yaml.safe_load(f)
        except (OSError, ValueError, yaml.YAMLError):
            return None
        return recorded if isinstance(recorded, dict) else None
    return None


def write_options(checkpoint: str, options: Mapping[str, Any]) -> None:
    """Save ``options`` into ``checkpoint`` (:data:`OPTIONS_FILE`)."""
    atomic_write_text(os.path.join(checkpoint, OPTIONS_FILE), json.dumps({"options": dict(options)}, indent=1,
                                                                         default=str))


@dataclass
class ResumePlan:
    """What a run does with its ``output_dir``: resume ``checkpoint`` (None: start from scratch), or nothing when
    ``finished_at`` (the step at which the run already ended); ``applied`` lists the options it changes."""

    checkpoint: Optional[str] = None
    finished_at: Optional[int] = None
    applied: list[Change] = field(default_factory=list)

    def describe(self, name: str) -> str:
        """The one line a run prints about it."""
        said = [str(c) for c in self.applied if c.name not in _UNSAID]
        changed = f"; applying {', '.join(said)}" if said else ""
        if self.finished_at is not None:
            return (f"{name} is complete: {self.checkpoint} reached step {self.finished_at}, the run's last; nothing "
                    f"to train{changed}")
        if self.checkpoint:
            return f"resuming {name} from {self.checkpoint}{changed}"
        return f"starting {name} from scratch"


def finished_step(checkpoint: Optional[str], output_dir: str, max_steps: int,
                  planned_steps: Callable[[], Optional[int]], recorded_max_steps: Any = None) -> Optional[int]:
    """The step at which the run of ``checkpoint`` already ended, or None when there is training left to do.

    Over when the checkpoint is at the run's planned optimizer steps (``planned_steps()``; the Trainer's own total
    for an epoch-based run), or when the run ended earlier by its own rule (a token budget) and wrote its final
    ``metrics.json`` after that checkpoint, with the same ``max_steps``. Resuming such a checkpoint would make the
    Trainer take one more step.
    """
    if not checkpoint:
        return None
    state = _read_json(os.path.join(checkpoint, "trainer_state.json"))
    if not state or not isinstance(state.get("global_step"), int):
        return None
    step = state["global_step"]
    target = planned_steps() if max_steps > 0 else state.get("max_steps")
    if isinstance(target, int) and target > 0 and step >= target:
        return step
    metrics_path = os.path.join(output_dir, "metrics.json")
    metrics = _read_json(metrics_path)
    if metrics and metrics.get("final_metrics") and recorded_max_steps == max_steps:
        try:
            newer = os.path.getmtime(metrics_path) >= os.path.getmtime(os.path.join(checkpoint, "trainer_state.json"))
        except OSError:
            return None
        if newer:
            return step
    return None


def plan_resume(output_dir: str, options: Mapping[str, Any], *, max_steps: int,
                planned_steps: Callable[[], Optional[int]], required: Iterable[str] = (),
                stop_at_step: Optional[int] = None) -> ResumePlan:
    """The auto-resume decision for a run with ``options`` (config.yaml's shape) in ``output_dir``.

    Finds the last complete checkpoint (one holding the ``required`` files too), compares its options with
    ``options`` and returns the plan, or raises :class:`RunOptionsChanged` (before any work) when an option
    differs that a resume may not change. ``max_steps`` and ``planned_steps()`` (the run's optimizer steps)
    decide whether the checkpoint is the run's last; a random-restart stage (``stop_at_step``) is never finished
    here (its search decides).
    """
    checkpoint = last_complete_checkpoint(output_dir, required=tuple(required))
    if checkpoint is None:
        return ResumePlan()
    recorded = read_recorded_options(checkpoint, output_dir)
    applied, refused, why = split_changes(recorded, options) if recorded else ([], [], None)
    recorded_steps = (recorded or {}).get("max_steps")
    done = None if stop_at_step else finished_step(checkpoint, output_dir, max_steps, planned_steps, recorded_steps)
    if refused:
        raise RunOptionsChanged(output_dir, checkpoint, refused, why, finished=done is not None)
    return ResumePlan(checkpoint=checkpoint, finished_at=done, applied=applied)


def discard_previous_run(output_dir: str) -> list[str]:
    """Delete the checkpoints and end-of-run records of the run in ``output_dir`` (``--overwrite_output_dir``);
    returns what was deleted. The final model files are overwritten by the new run's final save."""
    import shutil

    from ._files import checkpoint_step

    gone = []
    if not os.path.isdir(output_dir):
        return gone
    for name in sorted(os.listdir(output_dir)):
        path = os.path.join(output_dir, name)
        if checkpoint_step(path) is not None and os.path.isdir(path):
            shutil.rmtree(path)
            gone.append(name)
        elif name in ("metrics.json", "loss_curve.png"):
            os.remove(path)
            gone.append(name)
    return gone
