"""Settings that depend on how long a run is, taken from measurements: tokens per parameter in, settings out.

The measured tables live in ``data_files/budget_table.json``, each row with the study, command, results page and
date it comes from: the budget ladder (``python -m benchmarks.budget_ladder``) and the long-horizon search
(``python -m benchmarks.hf_best``) trained the same model for several lengths, and the best settings moved with
the length. :func:`budget_settings` returns, for a run's tokens per parameter, the settings measured best in
that regime, each with the measurement it comes from. :func:`fit_learning_rate_law` fits
``log lr = a + b log(width) + c log(tokens per parameter)`` to the measured best peak lrs (the scaling ladder's
widths and the budget ladder's lengths), and
:func:`learning_rate_law_check` says how well it predicts each point left out of its fit: the reason the
package does not set a peak lr for you (see the docs' budget page).

Example:
    ```python
    >>> tokens_per_parameter(tokens=9_830_400, non_embedding_parameters=396_800)
    24.77...
    >>> budget_settings(8.7, "muon")["regime"]
    'middle'
    ```
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

from ..validation import ConfigError

__all__ = ["tokens_per_parameter", "non_embedding_parameters", "BudgetRegime", "REGIMES", "budget_settings",
           "merge_optimizer_kwargs", "LONGEST_MEASURED", "MEASURED_BEST_LR", "fit_learning_rate_law", "predict_learning_rate", "learning_rate_law_check", "LR_BY_TOKENS", "lr_by_tokens",
           "MEASURED_OPTIMIZERS", "run_tokens", "length_tokens", "choose_budget_settings", "budget_arguments",
           "describe_budget"]


def tokens_per_parameter(tokens: float, non_embedding_parameters: int) -> float:
    """Training tokens per non-embedding parameter (Chinchilla's compute-optimal length is about 20)."""
    if non_embedding_parameters <= 0:
        raise ConfigError("non_embedding_parameters", non_embedding_parameters, "must be > 0")
    return tokens / non_embedding_parameters


def non_embedding_parameters(model) -> int:
    """Parameters of ``model`` outside its input embeddings, output head and position embeddings."""
    skip = set()
    for getter in ("get_input_embeddings", "get_output_embeddings"):
        module = getattr(model, getter, lambda: None)()
        if module is not None:
            skip |= {id(p) for p in module.parameters()}
    skip |= {id(p) for n, p in model.named_parameters() if n.endswith(("wpe.weight", "position_embeddings.weight"))}
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


@dataclass(frozen=True)
class BudgetRegime:
    """The settings measured best for runs up to ``max_tokens_per_param`` tokens per parameter."""

    name: str
    max_tokens_per_param: float
    # optimizer family ("adamw", "muon") -> FastTrainingArguments fields; ``optimizer_kwargs`` holds options of
    # the optimizer that go into the given optimizer_kwargs (each replacing the given one of its name). Muon's
    # AdamW part takes its betas from there: an adam_beta2 of 0.999 is the Trainer's default, which Muon reads
    # as "not given" (hf_fasttrain.optim.registry), so the measured beta2 would not reach it
    settings: dict[str, dict[str, Any]]
    source: str
    # optimizer family -> the peak lr these settings were measured best at, over the best lr of the longest
    # searched budget's winner: the lr stays the user's, the log says how far the measured best moved
    lr_factor: dict[str, float] = field(default_factory=dict)
    # the study, command, results page and date the row comes from
    provenance: dict[str, str] = field(default_factory=dict)


TABLE_FILE = "budget_table.json"


def _load_table() -> dict[str, Any]:
    """The measured tables (``data_files/budget_table.json``: each row with its provenance and what was measured)."""
    from importlib.resources import files

    return json.loads(files("hf_fasttrain").joinpath("data_files", TABLE_FILE).read_text(encoding="utf-8"))


_TABLE = _load_table()

# Each row is one length where the settings were searched, reaching halfway (geometrically) to the next; the last
# has no upper bound.
REGIMES: tuple[BudgetRegime, ...] = tuple(
    BudgetRegime(r["name"], math.inf if r["max_tokens_per_param"] is None else float(r["max_tokens_per_param"]),
                 r["settings"], r["source"], lr_factor=dict(r["lr_factor"]), provenance=dict(r["provenance"]))
    for r in _TABLE["regimes"]
)


def budget_settings(tokens_per_param: float, optimizer: str) -> dict[str, Any]:
    """The measured settings for a run of ``tokens_per_param`` tokens per parameter with ``optimizer``
    ("muon" for Muon, anything else AdamW-like): ``{"regime", "settings", "source", "extrapolated",
    "lr_factor"}``; ``extrapolated`` is True beyond the longest measured run (:data:`LONGEST_MEASURED`);
    ``lr_factor`` (None where not measured) is the peak lr the settings were measured best at in that regime,
    over the best lr of the longest searched budget's winner: a hint for the lr sweep, not applied.

    Example:
        ```python
        >>> s = budget_settings(50, "adamw")
        >>> s["regime"], s["extrapolated"], s["lr_factor"]
        ('over-training', False, 0.5)
        ```
    """
    if not (isinstance(tokens_per_param, (int, float)) and tokens_per_param > 0):
        raise ConfigError("tokens_per_param", tokens_per_param, "must be a number > 0")
    family = "muon" if optimizer == "muon" else "adamw"
    regime = next(r for r in REGIMES if tokens_per_param <= r.max_tokens_per_param)
    return {"regime": regime.name, "settings": copy.deepcopy(regime.settings[family]), "source": regime.source,
            "extrapolated": tokens_per_param > LONGEST_MEASURED, "lr_factor": regime.lr_factor.get(family)}


def merge_optimizer_kwargs(given: dict[str, Any], measured: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A regime's optimizer options over the user's ``given`` ones, by name; returns the merged options and the
    measured ones left out, each with why. Left out: ``adamw_lr_ratio`` where the user set Muon's lr apart
    (``muon_lr``, or ``adjust_lr_fn="original"``), and NorMuon and cautious weight decay with ``hyperball``,
    which replaces both (Muon refuses them together).

    Example:
        ```python
        >>> merge_optimizer_kwargs({"muon_lr": 0.02}, {"cautious_wd": True, "adamw_lr_ratio": 0.25})
        ({'muon_lr': 0.02, 'cautious_wd': True}, ['adamw_lr_ratio (muon_lr given: the lrs stay yours)'])
        ```
    """
    skipped = []
    measured = dict(measured)
    if measured.get("adamw_lr_ratio", 1.0) != 1.0:
        why = ("muon_lr given" if given.get("muon_lr") is not None
               else "adjust_lr_fn 'original'" if given.get("adjust_lr_fn") == "original" else None)
        if why:
            del measured["adamw_lr_ratio"]
            skipped.append(f"adamw_lr_ratio ({why}: the lrs stay yours)")
    if given.get("hyperball") is True:
        for name, off in (("normuon_beta2", None), ("cautious_wd", False)):
            if name in measured and measured[name] != off:
                del measured[name]
                skipped.append(f"{name} (hyperball given, which replaces it)")
    return {**given, **measured}, skipped


#: how the best peak lr moved with a run's tokens under muP (the transfer study's run length), by optimizer family
LR_BY_TOKENS: dict[str, Any] = _TABLE["lr_by_tokens"]
LONGEST_MEASURED = float(_TABLE["longest_measured_tokens_per_param"])  # tokens per parameter of the longest run

# family -> (width, tokens per non-embedding parameter, best peak lr, source): the points the lr law is fit to
MEASURED_BEST_LR: dict[str, tuple[tuple[int, float, float, str], ...]] = {
    family: tuple((int(w), float(t), float(lr), str(src)) for w, t, lr, src in points)
    for family, points in _TABLE["learning_rate_law"]["points"].items()
}


def _solve3(a: list[list[float]], b: list[float]) -> list[float]:
    """Solve a 3x3 linear system (Gaussian elimination with partial pivoting)."""
    m = [row[:] + [v] for row, v in zip(a, b)]
    for i in range(3):
        p = max(range(i, 3), key=lambda r: abs(m[r][i]))
        m[i], m[p] = m[p], m[i]
        if abs(m[i][i]) < 1e-12:
            raise ValueError("the points do not determine the law (too few distinct widths or lengths)")
        for r in range(3):
            if r != i:
                f = m[r][i] / m[i][i]
                m[r] = [x - f * y for x, y in zip(m[r], m[i])]
    return [m[i][3] / m[i][i] for i in range(3)]


def fit_learning_rate_law(points) -> tuple[float, float, float]:
    """Least squares ``log lr = a + b log(width) + c log(tokens per parameter)`` over ``(width, tpp, lr, ...)``
    points; returns ``(a, b, c)``."""
    rows = [(1.0, math.log(w), math.log(t)) for w, t, *_ in points]
    ys = [math.log(p[2]) for p in points]
    ata = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    aty = [sum(r[i] * y for r, y in zip(rows, ys)) for i in range(3)]
    a, b, c = _solve3(ata, aty)
    return a, b, c


def predict_learning_rate(optimizer: str, width: int, tokens_per_param: float,
                          points: Optional[tuple] = None) -> float:
    """The law's peak lr for a model of ``width`` trained for ``tokens_per_param`` (fit on ``points``, default
    the measured ones of ``optimizer``'s family)."""
    family = "muon" if optimizer == "muon" else "adamw"
    a, b, c = fit_learning_rate_law(points if points is not None else MEASURED_BEST_LR[family])
    return math.exp(a + b * math.log(width) + c * math.log(tokens_per_param))


def learning_rate_law_check(optimizer: str) -> list[dict[str, Any]]:
    """Leave one out: each measured point predicted by the law fit on the others (predicted / measured)."""
    family = "muon" if optimizer == "muon" else "adamw"
    pts = MEASURED_BEST_LR[family]
    out = []
    for i, (w, t, lr, source) in enumerate(pts):
        rest = pts[:i] + pts[i + 1:]
        pred = predict_learning_rate(family, w, t, rest)
        out.append({"source": source, "width": w, "tokens_per_param": t, "measured": lr, "predicted": pred,
                    "ratio": pred / lr})
    return out


# -- applying the settings to a run ------------------------------------------------------------------------------
#: the optimizers the regimes' optimizer options were measured with; any other keeps its own
MEASURED_OPTIMIZERS = ("adamw", "muon")


def run_tokens(args, row_length: Optional[int]) -> int:
    """A run's length in tokens, as ``budget_aware`` counts it: ``schedule_total_tokens`` (or ``max_tokens``) when
    given, else max_steps x global batch x ``row_length`` (the tokens in one row)."""
    steps = args.max_steps if args.max_steps > 0 else None
    return length_tokens(getattr(args, "schedule_total_tokens", None), getattr(args, "max_tokens", None), steps,
                         args.per_device_train_batch_size * args.gradient_accumulation_steps * max(args.world_size, 1),
                         row_length)


def length_tokens(schedule_total_tokens: Optional[int], max_tokens: Optional[int], optimizer_steps: Optional[int],
                  global_batch: int, row_length: Optional[int]) -> int:
    """The tokens ``budget_aware`` reads a run's length as, from its length (a plan's ``RunLength``): the
    schedule's token total or the token budget when given, else optimizer steps x global batch x row length."""
    if schedule_total_tokens or max_tokens:
        return schedule_total_tokens or max_tokens
    if row_length is None or optimizer_steps is None:
        raise ConfigError("budget_aware", True, allowed="needs the run's tokens: max_steps and rows of a known "
                          "length (input_ids rows, or block_size), or schedule_unit='tokens' with "
                          "schedule_total_tokens")
    return optimizer_steps * global_batch * row_length


def lr_by_tokens(optimizer: Optional[str]) -> str:
    """What is measured of how the best peak lr moves with a run's tokens for ``optimizer`` (None: the Trainer's
    optim), as one clause of ``budget_aware``'s log line; it says so where nothing is known. The lr stays the user's.

        >>> lr_by_tokens("lion")
        "lr by tokens: not measured for 'lion'; the lr stays yours"
    """
    family = LR_BY_TOKENS["families"].get(optimizer or "")
    if family is None:
        who = "the Trainer optim" if optimizer is None else repr(optimizer)
        return f"lr by tokens: not measured for {who}; the lr stays yours"
    widths = sorted(family["exponents"], key=int)
    ks = " and ".join(f"tokens^{family['exponents'][w]:+.2f} (width {w})" for w in widths)
    lo = min(LR_BY_TOKENS["tokens_per_param"][w][0] for w in widths)
    hi = max(LR_BY_TOKENS["tokens_per_param"][w][1] for w in widths)
    span = f"{lo:g}-{hi:g} tokens per parameter, parameterization mup"
    if family["trend"] == "falls":
        return (f"lr by tokens: the best peak lr fell as {ks} at {span}: the lr stays yours; lower it for a longer "
                "run")
    return f"lr by tokens: not known for {optimizer!r} (the best lr moved as {ks} at {span}, not one way)"


def choose_budget_settings(args, tokens: int, non_embedding_params: int) -> dict[str, Any]:
    """``budget_aware``'s choice for a run with ``args`` of ``tokens`` over ``non_embedding_params``: the settings
    measured best (:func:`budget_settings`), the arguments untouched. The optimizer's own options merge into the
    given ones by name (:func:`merge_optimizer_kwargs`), and only for an optimizer they were measured with
    (:data:`MEASURED_OPTIMIZERS`). Returns :func:`budget_settings`' dict with ``settings`` narrowed to what the
    run takes (the table's values), ``values`` (each field as the run reads it: optimizer options merged),
    ``tokens_per_param`` and ``not_applied`` (each option left out, with why)."""
    from ..optim import parse_optimizer_kwargs

    optimizer = getattr(args, "optimizer", None)
    tpp = tokens_per_parameter(tokens, non_embedding_params)
    chosen = budget_settings(tpp, optimizer or "adamw")
    applied: dict[str, Any] = {}
    values: dict[str, Any] = {}
    not_applied: list[str] = []
    for name, value in chosen["settings"].items():
        if name == "optimizer_kwargs":
            if optimizer not in MEASURED_OPTIMIZERS:
                who = "the Trainer optim" if optimizer is None else repr(optimizer)
                not_applied.append(f"{', '.join(value)} (measured with optimizer 'adamw'; {who} keeps its own)")
                continue
            given = parse_optimizer_kwargs(optimizer, args.optimizer_kwargs)
            value, skipped = merge_optimizer_kwargs(given, value)
            not_applied += skipped
        values[name] = value
        applied[name] = chosen["settings"][name]
    return {**chosen, "settings": applied, "values": values, "tokens_per_param": tpp, "not_applied": not_applied,
            "lr_by_tokens": lr_by_tokens(optimizer)}


def budget_arguments(args, values: dict[str, Any]):
    """A copy of ``args`` with ``budget_aware``'s ``values`` (:func:`choose_budget_settings`) in place of the
    given ones: what the run's record shows and the Trainer's own optimizer reads. ``args`` stay as given."""
    view = copy.copy(args)
    for name, value in values.items():
        setattr(view, name, copy.deepcopy(value))
    return view


def describe_budget(applied: dict[str, Any]) -> str:
    """One line for the log: what :func:`choose_budget_settings` chose, from which measurement, and what it left."""
    settings = ", ".join(f"{k}={v}" for k, v in applied["settings"].items())
    hint = ""
    if applied["lr_factor"]:  # the lr stays the user's; the line says how far the measured best moved
        hint = (f"; these settings were measured best at {applied['lr_factor']:g}x the peak lr that was best for the "
                "longest search's winner: sweep the lr down from a shorter run's")
    kept = f"; not applied: {', '.join(applied['not_applied'])}" if applied["not_applied"] else ""
    beyond = f"; beyond the longest run measured ({LONGEST_MEASURED})" if applied["extrapolated"] else ""
    by_tokens = f"; {applied['lr_by_tokens']}" if applied.get("lr_by_tokens") else ""
    return (f"budget_aware: {applied['tokens_per_param']:.1f} tokens per non-embedding parameter -> the "
            f"{applied['regime']}-run settings {settings} ({applied['source']}){hint}{kept}{beyond}{by_tokens}")
