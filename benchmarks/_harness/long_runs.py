"""The long-run search's settings and one reader of its ledger: families, knobs and their values, how a setting
is keyed, the two searches (coordinate descent, the lr walk), the summary of a budget's search, and the measures
both studies read from it (a setting's tokens to a loss inside one run, complete runs of a setting across budgets).

``benchmarks.hf_best`` runs the search and writes the ledger; ``benchmarks.ladder`` reads it back through
:func:`search_ledger` for its hf-best rows.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from pathlib import Path
from typing import Any, Callable, Generator, Optional

from benchmarks._harness.ledger import Ledger
from benchmarks._harness.lm import crossing
from benchmarks._harness import processes
from benchmarks._harness.processes import finished_results, first_finished

FAMILIES = ("hf-best", "recipe", "hf-best+", "recipe+groups")
SEARCHED_BY_DEFAULT = ("hf-best", "recipe")
# The per-group families start from their base family's winner at the same budget: ``hf-best+`` is hf-best's AdamW
# with group lr multipliers (``optimizer_cls_and_kwargs_for("adamw", args, lr_multipliers=...)``), ``recipe+groups``
# the recipe with the same options on Muon's AdamW part.
BASE_OF = {"hf-best": "hf-best", "recipe": "recipe", "hf-best+": "hf-best", "recipe+groups": "recipe"}
# knob -> the group whose lr it multiplies
GROUP_KNOBS = {"emb_lr": "embedding", "head_lr": "head", "norm_lr": "norm"}
# Seed noise of the final eval loss per family: a change is kept only if it gains more than this.
NOISE = {"hf-best": 0.015, "recipe": 0.025, "hf-best+": 0.015, "recipe+groups": 0.025}
WARMUP = 0.02
CHECKPOINT_FROM_BUDGET = 32  # budgets from here on save a checkpoint at every eval and resume a killed run
# The models (``--model``): the ladder's and a larger one; a rung of another model is named ``<budget>x-<model>``.
MODELS = {"2x128": dict(n_layer=2, n_head=4, n_embd=128), "3x192": dict(n_layer=3, n_head=6, n_embd=192)}
LADDER_MODEL = "2x128"
OPTIMIZER_OF = {"hf-best": "adamw", "recipe": "muon", "hf-best+": "adamw", "recipe+groups": "muon"}  # whose measured lr law (hf_fasttrain.config.budget) a family follows


CORPORA = ("stdlib", "unique")  # the ladder's corpora: the stdlib's (repeats past 1.3x), and one that does not repeat


def rung_name(budget: int, model: str = LADDER_MODEL, corpus: str = "stdlib") -> str:
    """``16x``; another model ``54x-3x192``; the corpus that does not repeat ``64x-unique``."""
    return f"{budget}x" + ("" if model == LADDER_MODEL else f"-{model}") + ("" if corpus == "stdlib" else f"-{corpus}")


def rung_multiple(rung: str) -> int:
    """The budget multiple of a rung name (``16x``, ``54x-3x192``)."""
    return int(rung.split("x")[0])

# A joint knob of four settings tried at once (cautious weight decay, the AdamW part at a quarter of Muon's lr,
# weight decay timescale 4, half the peak lr).
TOGETHER = "cautious_wd+adamw_lr_scale+wd_timescale+lr_scale"
# AdEMAMix in place of the recipe's optimizer, at its own lr and at AdamW's weight decay timescale (lr x wd x steps)
ADEMAMIX = "optimizer+lr_scale+wd_timescale"
ADAMW_TIMESCALE = 1.92
# Knobs and the values tried, in the order the search visits them.
KNOBS: dict[str, list[tuple[str, list[Any]]]] = {
    "hf-best": [("schedule", ["linear0", "wsd-1-sqrt", "cosine1", "wsd-linear"]),
                ("beta2", [0.99, 0.999]),
                ("wd_timescale", [0.5, 1.0, 4.0, 8.0]),
                ("lr_scale", [0.5, 2.0]),
                ("optim", ["schedule_free_adamw"])],
    "recipe": [("schedule", ["linear0", "wsd-1-sqrt"]),
               ("beta2", [0.99, 0.999]),
               ("normuon", [0.95]),
               ("normuon+lr_scale", [(0.95, 0.5)]),  # NorMuon at its own (lower) lr
               (TOGETHER, [(True, 0.25, 4.0, 0.5)]),
               # Hyperball (Wen et al. 2025): weight norms held in place of weight decay, with its own lr sweep
               ("hyperball+lr_scale", [(True, 1.0), (True, 0.5), (True, 0.25)]),
               # AdEMAMix (Pagliardini et al. 2024) in place of Muon + AdamW, at x0.125 and x0.25 the recipe's lr
               (ADEMAMIX, [("ademamix", 0.125, ADAMW_TIMESCALE), ("ademamix", 0.25, ADAMW_TIMESCALE)]),
               ("cautious_wd", [True]),
               ("adamw_lr_scale", [0.25]),
               ("ema", [False]),
               ("seq_len_warmup", [False]),
               ("wd_timescale", [4.0, 16.0]),
               ("lr_scale", [0.5, 2.0])],
    # The ladder's GPT-2 ties its head to the token embeddings, so no head_lr knob; the peak lr comes last, once
    # the embeddings have their own.
    "hf-best+": [("emb_lr", [8.0, 16.0, 32.0]),
                 ("wd_on", ["matrices"]),
                 ("norm_lr", [0.25, 4.0]),
                 ("lr_scale", [0.5, 2.0])],
    # The recipe's AdamW part runs at Muon's lr: both ways from there
    "recipe+groups": [("emb_lr", [0.5, 2.0]),
                      ("norm_lr", [0.25, 4.0]),
                      ("wd_on", ["matrices"])],
}
# The value a setting without the knob means (settings saved without a knob keep their run keys).
KNOB_DEFAULTS: dict[str, Any] = {"normuon": None, "cautious_wd": False, "adamw_lr_scale": 1.0, "lr_scale": 1.0,
                                 "hyperball": False, "optimizer": "muon", "beta3": 0.9999,
                                 "emb_lr": 1.0, "head_lr": 1.0, "norm_lr": 1.0, "wd_on": "default"}
# Muon's own options, which mean nothing to another optimizer of the recipe
MUON_ONLY = ("normuon", "cautious_wd", "adamw_lr_scale", "hyperball")
# AdEMAMix's own: the slow momentum's decay
ADEMAMIX_ONLY = ("beta3",)


# Knobs whose values multiply the current one (the peak lr: x0.5 and x2 of wherever the search stands).
RELATIVE_KNOBS = ("lr_scale",)

# ``--transfer-from``: the peak lr walked from a searched budget's winner, one run at a time (``lr_walk``), at most
# ``TRANSFER_STEPS`` steps one way; the best lr is the lowest loss (no threshold).
TRANSFER_KNOBS = [("lr_scale", [0.5, 2.0])]  # the values one step of the walk tries, from the best so far
TRANSFER_STEPS = 4


def knob_value(config: dict[str, Any], knob: str) -> Any:
    """A setting's value of ``knob``; of a joint knob ``"a+b"``, the tuple of its parts' values."""
    if "+" in knob:
        return tuple(knob_value(config, k) for k in knob.split("+"))
    return config.get(knob, KNOB_DEFAULTS.get(knob))


def settled(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the settings that cannot act beside another one turned off, so two settings that train
    the same are one setting (and the search does not train it twice): Hyperball holds the norms of Muon's
    matrices, so cautious weight decay on them has nothing to act on; Muon's options do nothing to AdEMAMix."""
    if config.get("optimizer", "muon") != "muon":
        return {k: v for k, v in config.items() if k not in MUON_ONLY}
    config = {k: v for k, v in config.items() if k not in ADEMAMIX_ONLY}
    if config.get("hyperball") and config.get("cautious_wd"):
        return {**config, "cautious_wd": False}
    return config


def set_knob(config: dict[str, Any], knob: str, value: Any) -> dict[str, Any]:
    """``config`` with ``knob`` at ``value`` as a decision records it (absolute; a joint knob's parts)."""
    if "+" in knob:
        return settled({**config, **dict(zip(knob.split("+"), value))})
    return settled({**config, knob: value})


def with_knob(config: dict[str, Any], knob: str, value: Any) -> dict[str, Any]:
    """``config`` with ``knob`` set to ``value`` (a joint knob sets each part; a relative knob multiplies)."""
    if "+" in knob:
        return settled({**config, **dict(zip(knob.split("+"), value))})
    if knob in RELATIVE_KNOBS:
        return settled({**config, knob: round(knob_value(config, knob) * value, 6)})
    return settled({**config, knob: value})


def start_config(family: str, lr: float, steps: int) -> dict[str, Any]:
    """hf-tuned's (or the recipe's) settings at its swept best lr: the search's first point."""
    base = {"lr": lr, "schedule": "cosine10", "beta2": 0.95, "wd_timescale": round(lr * 0.1 * steps, 3),
            "lr_scale": 1.0}
    if family == "hf-best":
        return {**base, "optim": "adamw_torch"}
    return {**base, "ema": True, "seq_len_warmup": True}


def config_key(config: dict[str, Any]) -> str:
    return json.dumps(config, sort_keys=True)


def run_key(rung: str, family: str, config: dict[str, Any], seed: int) -> str:
    return f"{rung}|{family}|{config_key(config)}|{seed}"


def ladder_best_lr(ladder: dict[str, Any], rung: str, optimizer: str) -> Optional[float]:
    """The budget ladder's best lr (median over seeds) of ``optimizer`` ("adamw"/"recipe") at ``rung``."""
    row = (ladder.get("summary", {}).get(rung) or {}).get("optimizers", {}).get(optimizer)
    return row["best_lr"] if row else None


def searched_rungs(ledger: Ledger) -> list[str]:
    """The budgets the ledger holds a search of, shortest first."""
    return sorted({*ledger.data.get("progress", {}), *ledger.data.get("searches", {})},
                  key=lambda r: (r.count("-"), rung_multiple(r)))


# --- The search ---------------------------------------------------------------------------------------
def coordinate_descent(start: dict[str, Any], knobs: list[tuple[str, list[Any]]], noise: float,
                       decisions: Optional[list] = None,
                       ) -> Generator[list[dict[str, Any]], dict[str, float], dict[str, Any]]:
    """Knob by knob from ``start``: yields the settings to run (a list of configs), is sent their final
    losses (``config_key -> loss``), and returns ``{"best", "loss", "decisions"}``.

    The first batch is ``[start]``. For each knob, every value other than the current one is run; the best
    replaces the current value only if its loss is lower by more than ``noise``. ``decisions`` (a list)
    receives each decision as it is made, so a search cut short still shows them."""
    losses = yield [start]
    best, best_loss = dict(start), losses[config_key(start)]
    decisions = [] if decisions is None else decisions
    seen = {config_key(start)}
    for knob, values in knobs:
        trial = [with_knob(best, knob, v) for v in values]
        trial = [c for c in trial if c != best]
        if not trial or all(config_key(c) in seen for c in trial):  # nothing new to learn (a knob visited again)
            continue
        seen.update(config_key(c) for c in trial)
        losses = yield trial
        scored = sorted(((losses[config_key(c)], i, c) for i, c in enumerate(trial)))
        loss, _, cand = scored[0]
        accepted = loss < best_loss - noise
        decisions.append({"knob": knob, "from": knob_value(best, knob),
                          "tried": {str(knob_value(c, knob)): losses[config_key(c)] for c in trial},
                          "current_loss": best_loss, "best_value": knob_value(cand, knob), "best_loss": loss,
                          "accepted": accepted})
        if accepted:
            best, best_loss = cand, loss
    return {"best": best, "loss": best_loss, "decisions": decisions}


def lr_walk(start: dict[str, Any], steps: Optional[int] = None, decisions: Optional[list] = None,
            ) -> Generator[list[dict[str, Any]], dict[str, float], dict[str, Any]]:
    """The peak lr walked from ``start`` one run at a time, downhill first: a generator as ``coordinate_descent``
    (one setting a batch; each step one decision), returning ``{"best", "loss", "decisions"}``.

    x0.5 first, on down while each step lowers the final loss; where the first step down does not, x2 and on up.
    It stops at the first step that does not lower the loss or after ``steps`` steps one way."""
    steps = TRANSFER_STEPS if steps is None else steps
    knob, (down, up) = TRANSFER_KNOBS[0][0], TRANSFER_KNOBS[0][1]
    losses = yield [start]
    best, best_loss = dict(start), losses[config_key(start)]
    decisions = [] if decisions is None else decisions
    factor, taken = down, 0
    while taken < steps:
        cand = with_knob(best, knob, factor)
        losses = yield [cand]
        loss = losses[config_key(cand)]
        taken += 1
        accepted = loss < best_loss
        decisions.append({"knob": knob, "from": knob_value(best, knob), "tried": {str(knob_value(cand, knob)): loss},
                          "current_loss": best_loss, "best_value": knob_value(cand, knob), "best_loss": loss,
                          "accepted": accepted})
        if accepted:
            best, best_loss = cand, loss
        elif factor == down and len(decisions) == 1:  # the first step down lost: the other way, as far
            factor, taken = up, 0
        else:
            break
    return {"best": best, "loss": best_loss, "decisions": decisions}


def summarise(ledger: Ledger, rung: str) -> dict[str, Any]:
    """Per family: the winner (or, while the search runs, the best so far), its final loss (median over the
    seeds run at it), every decision, and whether the search is complete."""
    out = {}
    done = ledger.data.get("searches", {}).get(rung) or {}
    progress = ledger.data.get("progress", {}).get(rung) or {}
    runs = [r for r in ledger.data["runs"].values() if r["rung"] == rung]
    for family in [f for f in FAMILIES if f in done or f in progress]:  # in FAMILIES' order, whoever wrote first
        if family in done:
            best, decisions, complete = done[family]["best"], done[family]["decisions"], True
        else:
            decisions, complete = progress[family]["decisions"], False
            start = ([{"config": progress[family]["start"]}] if progress[family].get("start") else
                     [r for r in runs if r["family"] == family and r.get("imported_from")])
            if not start:
                continue
            best = dict(start[0]["config"])
            for d in decisions:
                if d["accepted"]:
                    best = set_knob(best, d["knob"], d["best_value"])
        at_best = _seeds_of(runs, family, best)
        if not at_best:
            continue
        out[family] = {"best": best, **at_best, "decisions": decisions, "complete": complete}
        if (progress.get(family) or {}).get("transfer_from"):
            out[family]["transfer_from"] = progress[family]["transfer_from"]
        knobs = TRANSFER_KNOBS if out[family].get("transfer_from") else KNOBS.get(family, [])
        if not complete:  # the knob being tried now: the values that have finished
            trying, finished = {}, []
            running = [config_key(c) for c in progress[family].get("running") or []]
            for knob, value in _knob_of(knobs, best, running):
                c = with_knob(best, knob, value)
                got = [r["final_eval_loss"] for r in runs if r["family"] == family and r["seed"] == 0
                       and config_key(r["config"]) == config_key(c)]
                trying.setdefault("knob", knob)
                trying.setdefault("finished", {})[str(knob_value(c, knob))] = got[0] if got else None
                finished += [(got[0], c)] if got else []
            seed0 = [r["final_eval_loss"] for r in runs if r["family"] == family and r["seed"] == 0
                     and config_key(r["config"]) == config_key(best)]
            if trying.get("knob"):
                trying["from"] = knob_value(best, trying["knob"])
            trying["from_loss"] = seed0[0] if seed0 else out[family]["final_eval_loss"]
            out[family]["trying"] = trying
            # runs that finished ahead of their knob's turn (a restarted search, a reordered knob list): shown,
            # not yet decided
            settled = {d["knob"] for d in decisions} | {trying.get("knob")}
            ahead = {}
            for knob, values in knobs:
                for v in values:
                    c = with_knob(best, knob, v)
                    got = [r["final_eval_loss"] for r in runs if r["family"] == family and r["seed"] == 0
                           and config_key(r["config"]) == config_key(c)]
                    if got and knob not in settled and c != best:
                        ahead.setdefault(knob, {})[str(knob_value(c, knob))] = got[0]
            out[family]["ahead"] = ahead
            # an lr sweep keeps the lowest loss, with no threshold: so does its best so far, before the batch is
            # decided (the baseline a ratio is measured against must be the best run there is)
            lower = min(finished, key=lambda lc: lc[0], default=None)
            if out[family].get("transfer_from") and lower and lower[0] < trying["from_loss"]:
                out[family].pop("seeds_ns_other", None)
                out[family].update(best=lower[1], **_seeds_of(runs, family, lower[1]))
    return out


def _seeds_of(runs: list[dict[str, Any]], family: str, config: dict[str, Any]) -> dict[str, Any]:
    """The median final loss of ``family``'s runs of ``config`` over its seeds, how many, and how many ran Muon's
    iteration at another precision; empty where none ran."""
    mine = [r for r in runs if r["family"] == family and config_key(r["config"]) == config_key(config)]
    if not mine:
        return {}
    other_precision = sum(bool(r.get("ns_dtype")) for r in mine)
    return {"final_eval_loss": statistics.median(r["final_eval_loss"] for r in mine), "seeds": len(mine),
            **({"seeds_ns_other": other_precision} if other_precision else {})}


def _knob_of(knobs: list[tuple[str, list[Any]]], best: dict[str, Any], keys: list[str]) -> list[tuple[str, Any]]:
    """(knob, value) of each running setting, found among ``knobs`` from ``best``."""
    found = []
    for knob, values in knobs:
        for v in values:
            if config_key(with_knob(best, knob, v)) in keys:
                found.append((knob, v))
    return found


def run_search(ledger: Ledger, rung: str, starts: dict[str, dict[str, Any]], pool, seeds: int,
               run_one: Callable[[tuple], dict[str, Any]], knobs: dict[str, list[tuple[str, list[Any]]]],
               noise: dict[str, float], transfer_steps: int, log=print, workers: Optional[int] = None,
               transfer_from: Optional[str] = None) -> dict[str, Any]:
    """The families' coordinate descents (``knobs``, ``noise`` per family) over one pool of ``workers`` workers,
    each job ``(rung, family, config, seed)`` run by ``run_one``; then later seeds at each winner.
    With ``transfer_from`` (a searched budget whose winners are the starts) only the peak lr is walked
    (``lr_walk``, no noise threshold).

    A family asks for its next batch as soon as its own batch has finished, and a free worker takes the next
    job of the family with the fewest jobs running, so one family's long batch does not hold the other back;
    the decisions do not depend on the order."""
    workers = workers or getattr(pool, "_max_workers", 1)
    runs = ledger.data["runs"]
    traces: dict[str, list] = {f: [] for f in starts}
    gens = {f: lr_walk(starts[f], transfer_steps, traces[f]) if transfer_from else
            coordinate_descent(starts[f], knobs[f], noise[f], traces[f]) for f in starts}
    pending = {f: next(g) for f, g in gens.items()}
    outcome: dict[str, Any] = {}
    futures: dict[Any, tuple] = {}  # submitted and not finished: future -> its job
    queued: dict[str, list] = {f: [] for f in starts}  # asked for, waiting for a free worker

    def record(r: dict[str, Any]) -> None:
        runs[run_key(rung, r["family"], r["config"], r["seed"])] = r
        ledger.save()  # each run is kept as soon as it ends
        log(f"[hf_best] {rung} {r['family']:>7s} {config_key(r['config'])} seed {r['seed']}: "
            f"final eval loss {r['final_eval_loss']:.4f} ({r['cpu_seconds']:.0f} CPU-s)")

    def submit(jobs: list) -> bool:
        """Queue the jobs not run yet; without a pool run them here (True when it ran any)."""
        ran = False
        for job in jobs:
            if run_key(*job) in runs or job in futures.values() or job in queued[job[1]]:
                continue
            if pool is None:
                record(run_one(job))
                ran = True
            else:
                queued[job[1]].append(job)
        dispatch()
        return ran

    def dispatch() -> None:
        """Hand queued jobs to free workers, the family with the fewest jobs running first."""
        while pool is not None and not processes.STOP and len(futures) < workers and any(queued.values()):
            family = min((f for f in queued if queued[f]), key=lambda f: sum(j[1] == f for j in futures.values()))
            job = queued[family].pop(0)
            futures[pool.submit(run_one, job)] = job

    def advance() -> None:
        """Feed every family whose batch has finished its next batch (a finished search: its later seeds),
        and queue what that asks for; repeat while anything moves (a rerun replays its decisions here)."""
        while True:
            moved = False
            for f in list(pending):
                batch = pending[f]
                if not all(run_key(rung, f, c, 0) in runs for c in batch):
                    continue
                losses = {config_key(c): runs[run_key(rung, f, c, 0)]["final_eval_loss"] for c in batch}
                try:
                    pending[f] = gens[f].send(losses)
                except StopIteration as stop:
                    outcome[f] = stop.value
                    del pending[f]
                moved = True
            # only the families searched here: a run of one family (``--families``) keeps the other's record
            ledger.data.setdefault("progress", {}).setdefault(rung, {}).update(
                {f: {"decisions": traces[f], "running": pending.get(f), "start": starts[f],
                     **({"transfer_from": transfer_from} if transfer_from else {})} for f in starts})
            finished = ledger.data.get("searches", {}).get(rung) or {}
            if any(f in finished for f in pending):  # a finished search asking for more (its knobs grew): not finished
                ledger.data["searches"][rung] = {f: o for f, o in finished.items() if f not in pending}
            ledger.save()
            # the families' jobs interleaved, so each gets a worker as soon as one is free
            per_family = [[(rung, f, c, 0) for c in batch] for f, batch in pending.items()]
            per_family += [[(rung, f, o["best"], s) for s in range(1, seeds)] for f, o in outcome.items()]
            jobs = [j for group in itertools.zip_longest(*per_family) for j in group if j is not None]
            if not submit(jobs) and not moved:
                return

    advance()
    while futures:
        for _, r in finished_results(futures, first_finished(futures)):
            record(r)
        advance()
    if outcome:  # a search stopped before either family finished records none
        ledger.data.setdefault("searches", {}).setdefault(rung, {}).update(outcome)
    ledger.save()
    return outcome


def search_ledger(path: Path) -> Optional[dict[str, Any]]:
    """The search's ledger at ``path`` with ``summary`` per budget rebuilt from its runs (a search still running
    has written no summary yet); None where there is no file."""
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    view = type("View", (), {"data": data})()
    data["summary"] = {r: summarise(view, r) for r in {run["rung"] for run in data.get("runs", {}).values()}}
    return data


def carried_groups(won: dict[str, Any], base: dict[str, Any], rung: str, family: str) -> dict[str, Any]:
    """A per-group family's start at a budget too long to search: its base family's winner at ``rung`` in
    ``base`` (an hf_best ledger) with the group knobs (the multipliers, weight decay on matrices) of ``won``, the
    winner at a shorter budget; without a finished base search at ``rung``, ``won`` as it is."""
    source = ((base.get("searches") or {}).get(rung) or {}).get(BASE_OF[family])
    if source is None:
        return won
    groups = {k: won[k] for k in (*GROUP_KNOBS, "wd_on") if k in won}
    return {**source["best"], **groups}


# --- Measures read from a long-run ledger ------------------------------------------------------------
def complete_run_budget(finals: dict[int, float], target: float) -> float:
    """The budget (a multiple) at which a complete run ends at ``target``: ``finals`` maps the multiples of the
    complete runs to their final losses; linear interpolation of the loss in log budget between the two runs that
    bracket ``target``, extrapolation from the nearest two outside them (inf with fewer than two runs).

    The optimizer literature's measure of a speed-up (Wen et al. 2025, arXiv:2509.02046), beside the crossing
    inside one run.

    Example:
        >>> round(complete_run_budget({1: 3.973, 4: 3.245, 16: 2.808}, 3.746), 3)   # recipe runs vs AdamW at 4x
        1.541
        >>> complete_run_budget({27: 2.429, 54: 2.446}, 2.501)   # the shorter run ends lower: at most 27
        27.0
    """
    pts = sorted((math.log(m), loss) for m, loss in finals.items() if math.isfinite(loss))
    if len(pts) < 2:
        return math.inf
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if min(y0, y1) <= target <= max(y0, y1) and y0 != y1:
            return math.exp(x0 + (y0 - target) / (y0 - y1) * (x1 - x0))
    below = target > pts[0][1]  # the shortest complete run already ends under the target
    (x0, y0), (x1, y1) = (pts[:2] if below else pts[-2:])
    if y1 >= y0:  # the loss did not fall with the budget there: no budget is found by extending it
        return math.exp(x0) if below else math.inf  # below: at most the shortest run's budget (a bound)
    return math.exp(x0 + (y0 - target) / (y0 - y1) * (x1 - x0))

def fastest_one_run(hf_best: dict[str, Any], rung: str, target: float, budget: float,
                    min_seeds: int = 2) -> Optional[dict[str, Any]]:
    """Of the recipe settings run at ``rung`` with at least ``min_seeds`` seeds, the one that reaches ``target``
    soonest inside a run (median over its seeds): the search decides by the final loss, and a setting can end
    level and still get there much sooner. None without such a setting. Where the same settings also ran as
    complete runs at other budgets of the ladder's model and corpus (``hf_best --budget 8 --config ...``), the
    row also gives the complete-run measure for them: ``complete_runs`` (multiple -> median final loss) and
    ``complete_run_ratio`` (:func:`complete_run_budget` over this budget's multiple)."""
    by_config: dict[str, list] = {}
    for r in (hf_best.get("runs") or {}).values():
        if r["rung"] == rung and r["family"] == "recipe" and r.get("curve"):
            by_config.setdefault(json.dumps(r["config"], sort_keys=True), []).append(r)
    rows = [{"config": rs[0]["config"], "seeds": len(rs),
             "token_ratio": statistics.median(crossing(r["curve"], target, "tokens") for r in rs) / budget,
             "token_ratios": sorted(crossing(r["curve"], target, "tokens") / budget for r in rs),
             "eval_loss": statistics.median(r["final_eval_loss"] for r in rs),
             "ns_dtype_other": sum(bool(r.get("ns_dtype")) for r in rs), "min_seeds": min_seeds}
            for rs in by_config.values() if len(rs) >= min_seeds]
    if not rows:
        return None
    best = min(rows, key=lambda x: (x["token_ratio"], x["eval_loss"]))
    if "-" not in rung:  # the ladder's model and corpus: complete runs of the same settings at other budgets
        chosen = complete_runs_of(hf_best, best["config"], rung)
        if chosen:
            multiple = int(rung.split("x")[0])
            finals = {**{m: loss for m, (loss, _) in chosen.items()}, multiple: best["eval_loss"]}
            lrs = {**{m: lr for m, (_, lr) in chosen.items()}, multiple: peak_lr(best["config"])}
            best["complete_runs"] = dict(sorted(finals.items()))
            if len(set(lrs.values())) > 1:
                best["complete_run_lrs"] = dict(sorted(lrs.items()))
            best["complete_run_ratio"] = complete_run_budget(finals, target) / multiple
            best["complete_run_extrapolated"] = not (min(finals.values()) <= target <= max(finals.values()))
    return best

def rung_suffix(rung: str) -> str:
    """What a rung name says beside its budget: ``""`` on the ladder, ``3x192`` (a model), ``unique`` (a corpus)."""
    return rung.split("-", 1)[1] if "-" in rung else ""

def complete_runs_of(hf_best: dict[str, Any], config: dict[str, Any], rung: str,
                     family: str = "recipe") -> dict[int, tuple[float, float]]:
    """``family``'s ``config`` settings as complete runs at ``rung``'s other budgets, on its model and corpus (the
    ladder's, or a larger model's such as ``27x-3x192`` beside ``54x-3x192``): multiple -> (median final loss over
    the seeds, peak lr). Each budget counts at its own tuned lr, as complete runs are compared in the optimizer
    literature: the budget's search or walk winner where that is these settings, else the lr that ended lowest
    there (at a budget with one lr, that lr, untuned: the ratio then leans against the family)."""
    key = _settings_key(config)
    suffix = rung_suffix(rung)
    by_multiple: dict[int, dict[float, list]] = {}
    for r in (hf_best.get("runs") or {}).values():
        if (r["family"] == family and rung_suffix(r["rung"]) == suffix and r["rung"] != rung
                and _settings_key(r["config"]) == key):
            by_lr = by_multiple.setdefault(int(r["rung"].split("x")[0]), {})
            by_lr.setdefault(peak_lr(r["config"]), []).append(r["final_eval_loss"])
    chosen = {}
    for m, by_lr in sorted(by_multiple.items()):
        name = f"{m}x-{suffix}" if suffix else f"{m}x"
        winner = ((hf_best.get("summary") or {}).get(name) or {}).get(family, {}).get("best")
        if winner and _settings_key(winner) == key and peak_lr(winner) in by_lr:
            chosen[m] = (statistics.median(by_lr[peak_lr(winner)]), peak_lr(winner))
        else:
            chosen[m] = min((statistics.median(v), lr) for lr, v in by_lr.items())
    return chosen

def peak_lr(config: dict[str, Any]) -> float:
    """A recipe setting's peak lr: its ``lr`` times its ``lr_scale`` (the walk's factor), rounded for equality."""
    return float(f"{config.get('lr', 0.0) * config.get('lr_scale', 1.0):.6g}")

def _settings_key(config: dict[str, Any]) -> str:
    """A recipe setting apart from its peak lr: the same settings run at another lr share it."""
    return json.dumps({k: v for k, v in config.items() if k not in ("lr", "lr_scale")}, sort_keys=True)
