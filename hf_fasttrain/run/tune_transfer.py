"""Tune small, train big: an lr search on a narrow proxy of the model on the restart engine (successive halving),
then the full-width run at the proxy's best lr, its record naming the search it came from.

The proxy is the target model at ``proxy_width`` with the same head size (``n_head`` scaled with the width) and
everything else as given. Under ``optimizer_kwargs={"parameterization": "mup", ...}`` the proxy is the base width
(``base_width = proxy_width``), so the target trains at the proxy's lr with the muP groups for ``m = width /
proxy_width``; without it the lr is carried as found (the standard parameterization, whose best lr may move with
width).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import os
from typing import Any, Dict, Optional, Sequence

from ..validation import ConfigError
from ..runinfo import update_run_info
from .recipe_restarts import RecipeTrialRunner, train_with_restarts
from .train import train

__all__ = ["SEARCH_FILE", "check_tune_args", "proxy_model_args", "tune_and_train"]

SEARCH_FILE = "proxy_search.json"  # in the target's output_dir: the search its settings came from


def _width(model_args) -> int:
    return model_args.n_embd or model_args.hidden_size or 768


def proxy_model_args(model_args, proxy_width: int):
    """``model_args`` at ``proxy_width``: the same head size (``n_head`` and key/value heads scaled with the
    width), an explicit MLP width scaled by the same factor. Refused in one line where a count would not be whole.

    Example:
        ```python
        >>> from hf_fasttrain import ModelArguments
        >>> p = proxy_model_args(ModelArguments(model_type="gpt2", n_layer=2, n_head=16, n_embd=512), 64)
        >>> (p.n_embd, p.n_head, p.n_layer)
        (64, 2, 2)
        ```
    """
    width = _width(model_args)
    heads = model_args.n_head or model_args.num_attention_heads or 12
    if not isinstance(proxy_width, int) or proxy_width < 1 or proxy_width > width:
        raise ConfigError("proxy_width", proxy_width, f"an integer from 1 to the model's width {width}")
    head = width // heads
    if proxy_width % head:
        raise ConfigError("proxy_width", proxy_width, f"a multiple of the model's head size {head} (width {width} / "
                                                      f"{heads} heads), so the proxy keeps the head size")
    changes: Dict[str, Any] = {"n_embd": proxy_width, "hidden_size": None, "n_head": proxy_width // head,
                               "num_attention_heads": None}
    for field, value in (("num_key_value_heads", model_args.num_key_value_heads),
                         ("intermediate_size", model_args.intermediate_size)):
        if value is not None:
            scaled = value * proxy_width / width
            if scaled != int(scaled) or scaled < 1:
                raise ConfigError("proxy_width", proxy_width, f"a width that scales {field}={value} to a whole number")
            changes[field] = int(scaled)
    return dataclasses.replace(model_args, **changes)


def _optimizer_kwargs(training_args) -> Dict[str, Any]:
    kw = training_args.optimizer_kwargs or {}
    return dict(json.loads(kw) if isinstance(kw, str) else kw)


def _with_base_width(training_args, proxy_width: int, **changes):
    """A copy of ``training_args`` with ``changes``; under muP its base width set to the proxy's."""
    args = copy.deepcopy(training_args)
    kw = _optimizer_kwargs(training_args)
    if kw.get("parameterization", "standard") != "standard":
        kw["base_width"] = proxy_width
        args.optimizer_kwargs = kw
    for k, v in changes.items():
        setattr(args, k, v)
    return args


def check_tune_args(model_args, training_args, proxy_width: int, lrs: Sequence[float]) -> list[float]:
    """The search's refusals, each one line, before anything is read or written: ``lrs`` (at least 2 different
    finite numbers > 0), ``proxy_width`` (a whole number of heads at the model's head size) and a run length in
    optimizer steps (``max_steps`` > 0, which the proxy's rungs divide). Returns the lrs as floats."""
    try:
        lrs = [float(lr) for lr in lrs]
    except (TypeError, ValueError):
        raise ConfigError("lrs", lrs, "at least 2 different peak lrs, each a finite number > 0") from None
    if len(lrs) < 2 or len(set(lrs)) != len(lrs) or not all(math.isfinite(lr) and lr > 0 for lr in lrs):
        raise ConfigError("lrs", lrs, "at least 2 different peak lrs, each a finite number > 0")
    proxy_model_args(model_args, proxy_width)
    if not training_args.max_steps or training_args.max_steps < 1:
        raise ConfigError("max_steps", training_args.max_steps, "an integer > 0: the proxy's rungs are steps of "
                                                               "its run")
    return lrs


def tune_and_train(model_args, data_args, training_args, proxy_width: int, lrs: Sequence[float], rungs: int = 2,
                   keep_fraction: float = 0.5, proxy_dir: Optional[str] = None,
                   callbacks: Optional[Sequence[Any]] = None) -> Dict[str, Any]:
    """Search ``lrs`` on the proxy at ``proxy_width`` (one trial per lr, the same seeds, successive halving over
    ``rungs`` rungs of the proxy's full run), then train ``model_args`` at the winner's lr.

    Both stages resume when called again (the search from its state file, the target run from its checkpoints).
    The target's ``run_info.json`` gets a ``transfer`` entry (the proxy's width and folder, each lr's loss, the
    winner), also written as ``proxy_search.json`` in its ``output_dir``.

    Args:
        model_args, data_args, training_args: the target run (``training_args.max_steps`` > 0; its
            ``learning_rate`` is replaced by the search's).
        proxy_width (`int`): the proxy's width, a multiple of the head size.
        lrs (`Sequence[float]`): the peak lrs searched (at least 2, each > 0).
        rungs (`int`, defaults to 2), keep_fraction (`float`, defaults to 0.5): the successive halving.
        proxy_dir (`str`, *optional*): the search's folder; default ``<output_dir>/proxy-w<proxy_width>``.

    Returns:
        `dict`: ``{"transfer": the record, "metrics": the target's final eval metrics}``.
    """
    lrs = check_tune_args(model_args, training_args, proxy_width, lrs)
    proxy = proxy_model_args(model_args, proxy_width)
    out = training_args.output_dir
    proxy_dir = proxy_dir or os.path.join(out, f"proxy-w{proxy_width}")
    seed, data_seed = training_args.seed, training_args.data_seed or training_args.seed
    proxy_args = _with_base_width(training_args, proxy_width, output_dir=proxy_dir)
    # one trial per lr, every trial on the same seeds: the search compares lrs, not initialisations
    runner = RecipeTrialRunner(proxy, data_args, proxy_args, callbacks=callbacks,
                               trial_overrides={i: {"learning_rate": lr, "seed": seed, "data_seed": data_seed}
                                                for i, lr in enumerate(lrs)})
    summary = train_with_restarts(proxy, data_args, proxy_args, runner=runner, num_seeds=len(lrs),
                                  explore_fraction=1.0, rungs=rungs, keep_fraction=keep_fraction,
                                  replace_diverged=False, parallel=False, backend="local")
    by_index = {row["index"]: row for row in summary["trials"]}
    winner = next(row for row in summary["trials"] if row["chosen"])
    best = lrs[winner["index"]]
    record = {
        "proxy_search": os.path.abspath(proxy_dir), "proxy_width": proxy_width, "target_width": _width(model_args),
        "parameterization": _optimizer_kwargs(training_args).get("parameterization", "standard"),
        "rungs": rungs, "keep_fraction": keep_fraction,
        "lrs": {f"{lr:g}": {"final_metric": by_index[i]["final_metric"], "rung_metrics": by_index[i]["rung_metrics"],
                            "status": by_index[i]["status"]} for i, lr in enumerate(lrs)},
        "metric": summary["metric"], "learning_rate": best, "winner_final_metric": winner["final_metric"],
    }
    target_args = _with_base_width(training_args, proxy_width, learning_rate=best)
    os.makedirs(out, exist_ok=True)
    from .._files import atomic_write_text

    atomic_write_text(os.path.join(out, SEARCH_FILE), json.dumps(record, indent=2))
    metrics = train(model_args, data_args, target_args, callbacks=callbacks)
    update_run_info(out, {"transfer": record})
    return {"transfer": record, "metrics": metrics}
