"""Settings that depend on how long a run is, taken from measurements: tokens per parameter in, settings out.

The budget ladder (``python -m benchmarks.budget_ladder``) and the long-horizon search
(``python -m benchmarks.hf_best``) trained the same GPT-2 2x128 for 1.5, 6.2 and 24.8 tokens per
non-embedding parameter; the best settings moved with the length (NorMuon, for one, won at 1.5 and lost at
24.8). :func:`budget_settings` returns, for a
run's tokens per parameter, the settings measured best in that regime, each with the measurement it comes
from. :func:`fit_learning_rate_law` fits ``log lr = a + b log(width) + c log(tokens per parameter)`` to the
measured best peak lrs (the scaling ladder's widths 32-256 and the budget ladder's lengths), and
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
import math
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["tokens_per_parameter", "non_embedding_parameters", "BudgetRegime", "REGIMES", "budget_settings",
           "merge_optimizer_kwargs", "MEASURED_BEST_LR", "fit_learning_rate_law", "predict_learning_rate", "learning_rate_law_check"]


def tokens_per_parameter(tokens: float, non_embedding_parameters: int) -> float:
    """Training tokens per non-embedding parameter (Chinchilla's compute-optimal length is about 20)."""
    if non_embedding_parameters <= 0:
        raise ValueError(f"non_embedding_parameters={non_embedding_parameters!r} is invalid: it must be > 0")
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
    # optimizer family -> the peak lr these settings were measured best at, over the best lr of the 16x search's
    # winner (24.8 tokens per parameter; AdamW 4e-3, the recipe 1.6e-2 on the ladder's model): the lr stays the
    # user's, the log says how far the measured best moved
    lr_factor: dict[str, float] = field(default_factory=dict)


# Muon's options that only the long row turns on (every row names them, so a given value is replaced)
_NOT_LONG = {"cautious_wd": False, "adamw_lr_ratio": 1.0}

# AdamW at 4x (the middle row; also the middle-long row's, where AdamW was not measured)
_MIDDLE_ADAMW = {"lr_decay": "linear", "min_lr_ratio": 0.0, "decay_fraction": 0.2, "weight_decay": 0.1,
                 "adam_beta2": 0.999}
# Muon's long-run settings (the long row's; the middle-long row's with the weight decay of the timescale that ran)
_LONG_MUON = {"lr_decay": "cosine", "min_lr_ratio": 0.1, "decay_fraction": None, "weight_decay": 0.1,
              "adam_beta2": 0.99, "optimizer_kwargs": {"betas": [0.9, 0.99], "normuon_beta2": None,
                                                       "cautious_wd": True, "adamw_lr_ratio": 0.25}}


# The measured table: each row is one length where the settings were searched, reaching halfway (geometrically)
# to the next. Short runs (1.5 tokens per parameter): what the long-horizon search at 1x kept over hf-tuned's
# settings. Middle (6.2): what the search at 4x kept (for Muon: beta2 0.99 of its AdamW part, now also the bundled
# GPU recipes' setting).
# Middle-long (12.4): for Muon the long row's settings, which ran as complete runs at 8x and beat the budget
# ladder's recipe and the middle row's settings there.
# Long runs (24.8): what the search at 16x kept, and for Muon the four knobs that were level one at a time and
# together reached the target sooner. Over-training (99): nothing searched; the 16x search's winners with only the
# peak lr swept at 64x, so the settings are those winners' and the row records how far the best lr moved.
REGIMES: tuple[BudgetRegime, ...] = (
    BudgetRegime(
        "short", 3.1,
        # AdamW at 1x: warmup-stable-decay with a linear cooldown to 0 over the last 20% ended at 4.532 against
        # cosine to 10%'s 4.685 (1-sqrt cooldown 4.543, linear to 0 4.707, cosine to 1% 4.728); then beta2 0.999:
        # 4.499 (0.99: 4.510); 2 seeds at the winner: 4.506 against hf-tuned's 4.701. Then per-group lrs
        # (hf-best+, benchmarks/results/hf_best_groups.md): the embeddings (tied head) at 16x the lr 4.220 (x8
        # 4.306, x32 4.283), 2 seeds 4.220 / 4.203; weight decay on the matrices only 4.209, the norms' lr x0.25 /
        # x4 4.232 / 4.217, the peak lr x0.5 / x2 4.231 / 4.260, all within the seed noise (0.015). Applied with
        # optimizer="adamw" only (the package's AdamW takes per-group lrs; it was measured there); the other rows
        # did not search it, so a given lr_multipliers stays there
        {"adamw": {"lr_decay": "linear", "min_lr_ratio": 0.0, "decay_fraction": 0.2, "weight_decay": 0.1,
                   "adam_beta2": 0.999, "optimizer_kwargs": {"lr_multipliers": {"embedding": 16.0}}},
         # the recipe (Muon) at 1x: cosine to 10% stays (3.973; linear to 0 3.981, WSD 4.021); beta2 0.999 of
         # Muon's AdamW part 3.947 (0.99: 3.948); then NorMuon (beta2 0.95) 3.900; 2 seeds at the winner 3.903.
         # Then per-group lrs of Muon's AdamW part (hf_best_groups.md): the embeddings (tied head) at 2x 3.869
         # (x0.5 3.967), 2 seeds 3.869 / 3.871, median 3.870 (0.033 below 3.903, past the 0.025 seed noise); the
         # norms' lr x0.25 / x4 3.884 / 3.879 and weight decay on the matrices only 3.896 did not gain
         "muon": {"lr_decay": "cosine", "min_lr_ratio": 0.1, "decay_fraction": None, "weight_decay": 0.1,
                  "adam_beta2": 0.999, "optimizer_kwargs": {"betas": [0.9, 0.999], "normuon_beta2": 0.95,
                                                            "lr_multipliers": {"embedding": 2.0}, **_NOT_LONG}}},
        "long-horizon search at 1x (benchmarks/results/hf_best.md; per-group lrs: hf_best_groups.md)"),
    BudgetRegime(
        "middle", 8.8,
        # AdamW at 4x: warmup-stable-decay with a linear cooldown to 0 over the last 20% ended at 3.600 against
        # cosine to 10%'s 3.733 (1-sqrt cooldown 3.602, linear to 0 3.748, cosine to 1% 3.770); then beta2 0.999:
        # 3.505 (0.99: 3.514); weight decay timescales 0.5-8, lr x0.5 / x2 and schedule-free lost; 2 seeds at the
        # winner: 3.515 against hf-tuned's 3.746
        {"adamw": _MIDDLE_ADAMW,
         # the recipe (Muon) at 4x, from the budget ladder's best (lr 8e-3, cosine to 10%, beta2 0.95: 3.243 and
         # 3.246): cosine to 10% stays (linear to 0 3.265, WSD 1-sqrt 3.307); beta2 0.99 of Muon's AdamW part 3.178
         # (0.999: 3.188); then NorMuon 3.178 (3.203 at half the lr), cautious weight decay 3.184, the AdamW part at
         # 0.25x 3.384, weight decay timescale 4 / 16 3.188 / 3.496, the lr x0.5 / x2 3.201 / 3.197, EMA off 3.194,
         # sequence-length warmup off 3.218, Hyperball and AdEMAMix lost; 2 seeds at the winner: 3.184 (3.178, 3.190)
         "muon": {"lr_decay": "cosine", "min_lr_ratio": 0.1, "decay_fraction": None, "weight_decay": 0.1,
                  "adam_beta2": 0.99, "optimizer_kwargs": {"betas": [0.9, 0.99], "normuon_beta2": None, **_NOT_LONG}}},
        "long-horizon search at 4x (benchmarks/results/hf_best.md)"),
    BudgetRegime(
        "middle-long", 12.4,
        # AdamW: the middle row's settings (nothing measured at 12.4: its 6.2 and 24.8 rows meet here, as before).
        # Muon at 8x (12.4 tokens per parameter): the long row's combination (below) as complete runs, at 0.5x the
        # 16x winner's lr (8e-3, also the budget ladder recipe's best lr at 8x) and weight decay timescale 4.0,
        # ended at 2.913 and 2.929 against the budget ladder recipe's (beta2 0.95; lr 8e-3) 3.005 and 3.057 and
        # the middle row's (the 4x search's winner, beta2 0.99, weight decay 0.1 at 8e-3) 2.970 and 2.961;
        # at 4x (6.2) the combination lost (3.379 and 3.346 against 3.243 and 3.246; the 4x search's winner 3.184),
        # so the rows meet halfway between, at 8.8. Weight decay 0.2 at that lr over 2,400 steps is timescale 3.84
        # (the long row's 0.1 over 4,800)
        {"adamw": _MIDDLE_ADAMW, "muon": {**_LONG_MUON, "weight_decay": 0.2}},
        "budget ladder 8x (AdamW: the long-horizon search at 4x) and the 16x combination's complete runs at 8x "
        "(benchmarks/results/hf_best.md, budget_ladder.md)",
        lr_factor={"muon": 0.5}),
    BudgetRegime(
        "long", 49.6,
        # AdamW at 16x: warmup-stable-decay with a 1-sqrt cooldown to 0 over the last 20% ended at 3.006 against
        # cosine to 10%'s 3.093 (linear to 0: 3.080, cosine to 1%: 3.089, WSD with a linear cooldown: 3.018); then
        # beta2 0.99: 2.949 (0.999: 2.957); 2 seeds at the winner: 2.953
        {"adamw": {"lr_decay": "1-sqrt", "min_lr_ratio": 0.0, "decay_fraction": 0.2, "weight_decay": 0.1,
                   "adam_beta2": 0.99},
         # the recipe (Muon) at 16x: cosine to 10% stays (2.832); linear to 0 ended at 2.823 and the 1-sqrt WSD
         # cooldown to 0 at 2.936; beta2 0.99 of Muon's AdamW part: 2.736 (0.999: 2.748), 3 seeds at it 2.736,
         # 2.886, 2.720 (beta2 0.95: 2.832, 2.784); NorMuon lost: 2.913 (2.880 at half the lr). Then, on that
         # winner, four knobs that each ended level (cautious weight decay 2.732, the AdamW part at 0.25x Muon's lr
         # 2.712, weight decay timescale 4 2.727, half the peak lr 2.729), together: 3 seeds 2.705 / 2.737 / 2.751,
         # level at the end, but hf-best's final loss (2.953) reached inside one run at 0.423 / 0.484 / 0.509 of the
         # budget against the winner's 0.661 / 0.663 / 0.831. Kept: the two that are options (cautious_wd,
         # adamw_lr_ratio); weight decay 0.1 at half the winner's lr is timescale 3.84 (the combination ran 4.0:
         # 0.104), and the half lr is the lr_factor hint
         "muon": _LONG_MUON},
        "long-horizon search at 16x and its four level knobs together (benchmarks/results/hf_best.md)",
        lr_factor={"muon": 0.5}),
    BudgetRegime(
        "over-training", math.inf,
        # 64x (99.3 tokens per parameter), each family at its 16x winner with the peak lr swept: AdamW ended at
        # 2.724 / 2.697 / 2.705 / 2.728 at x0.25 / x0.5 / x1 / x2 of its 16x lr (4e-3), 2 seeds at x0.5: 2.683;
        # the recipe at 2.654 / 2.575 / 2.599 / 2.604 / 2.818 / 2.940 at x0.0625 ... x2 of its 16x lr (1.6e-2);
        # the long row's combination at x0.125 ended at 2.658 (seed 0, against the recipe's 2.575), so Muon keeps
        # the 16x winner's settings here
        {"adamw": {"lr_decay": "1-sqrt", "min_lr_ratio": 0.0, "decay_fraction": 0.2, "weight_decay": 0.1,
                   "adam_beta2": 0.99},
         "muon": {"lr_decay": "cosine", "min_lr_ratio": 0.1, "decay_fraction": None, "weight_decay": 0.1,
                  "adam_beta2": 0.99, "optimizer_kwargs": {"betas": [0.9, 0.99], "normuon_beta2": None,
                                                           **_NOT_LONG}}},
        "the 16x search winners at 64x, only the peak lr swept (benchmarks/results/hf_best.md)",
        lr_factor={"adamw": 0.5, "muon": 0.125}),
)


def budget_settings(tokens_per_param: float, optimizer: str) -> dict[str, Any]:
    """The measured settings for a run of ``tokens_per_param`` tokens per parameter with ``optimizer``
    ("muon" for Muon, anything else AdamW-like): ``{"regime", "settings", "source", "extrapolated",
    "lr_factor"}``; ``extrapolated`` is True beyond the longest measured run (99.3 tokens per parameter);
    ``lr_factor`` (None where not measured) is the peak lr the settings were measured best at in that regime,
    over the best lr of the search's winner at 24.8 tokens per parameter: a hint for the lr sweep, not applied.

    Example:
        ```python
        >>> s = budget_settings(50, "adamw")
        >>> s["regime"], s["extrapolated"], s["lr_factor"]
        ('over-training', False, 0.5)
        ```
    """
    if not (isinstance(tokens_per_param, (int, float)) and tokens_per_param > 0):
        raise ValueError(f"tokens_per_param={tokens_per_param!r} is invalid: it must be a number > 0")
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


LONGEST_MEASURED = 99.3  # tokens per parameter of the 64x budget (the longest searched: 24.8, the 16x budget)

# (width, tokens per non-embedding parameter, best peak lr: the vertex of a parabola through the best lr and its
# neighbours in log lr, source). AdamW: hf-tuned settings; Muon: the scaling ladder's Muon arm (opt-muon) and the
# budget ladder's recipe (Muon + EMA + sequence-length warmup).
MEASURED_BEST_LR: dict[str, tuple[tuple[int, float, float, str], ...]] = {
    "adamw": (
        (32, 5.79, 0.0106, "scaling gpt2-2x32"), (64, 3.19, 0.00231, "scaling gpt2-2x64"),
        (128, 1.55, 0.00183, "scaling gpt2-2x128 = budget ladder 1x"), (192, 0.85, 0.00173, "scaling gpt2-3x192"),
        (256, 0.55, 0.00127, "scaling gpt2-4x256"), (128, 6.19, 0.00224, "budget ladder 4x"),
        (128, 24.77, 0.00494, "budget ladder 16x"),
    ),
    "muon": (
        (32, 5.79, 0.0504, "scaling gpt2-2x32"), (64, 3.19, 0.0267, "scaling gpt2-2x64"),
        (128, 1.55, 0.0143, "scaling gpt2-2x128"), (192, 0.85, 0.00870, "scaling gpt2-3x192"),
        (256, 0.55, 0.00484, "scaling gpt2-4x256"), (128, 1.55, 0.0127, "budget ladder 1x (recipe)"),
        (128, 6.19, 0.0100, "budget ladder 4x (recipe)"), (128, 24.77, 0.0164, "budget ladder 16x (recipe)"),
    ),
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
