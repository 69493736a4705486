"""Budgets as multiples of the time-to-loss setup's run, and their data: the stdlib corpus, or (for budgets
that would read it more than once) the stdlib corpus with installed packages' Python sources appended, so that
no row repeats."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from hf_fasttrain import DataArguments
from hf_fasttrain.data.front import prepare_data

from benchmarks._harness import UsageError
from benchmarks._harness.lm import QUICK, Setup

__all__ = ["BASE_STEPS", "EVALS", "budget_setup", "data_args", "SOURCE_PACKAGES", "extra_python_sources",
           "unique_corpus_data"]

BASE_STEPS = 300  # the time-to-loss budget: 300 steps x 2048 tokens = 0.61M tokens
EVALS = 12  # evaluations per run


def budget_setup(multiple: int, quick: bool = False, base_steps: int = BASE_STEPS) -> Setup:
    """The time-to-loss setup (or the quick one) trained for ``multiple x base_steps`` steps."""
    base = QUICK if quick else Setup()
    steps = multiple * base_steps
    return dataclasses.replace(base, max_steps=steps, eval_steps=max(1, steps // EVALS))


# Packages whose sources make the corpus that does not repeat, in order: a longer budget reads further down
# the list, so a shorter one's corpus stays what it was.
SOURCE_PACKAGES = ("transformers", "torch", "datasets", "numpy", "pandas", "pyarrow", "accelerate",
                   "scipy", "sympy", "matplotlib", "networkx", "sqlalchemy", "pip", "setuptools")


def extra_python_sources(min_chars: int, packages: tuple[str, ...] = SOURCE_PACKAGES) -> list[str]:
    """Texts of ``.py`` files of installed packages, in a fixed order, until ``min_chars`` characters
    (fewer when the installed packages hold fewer: the caller checks)."""
    import importlib.util

    texts, total = [], 0
    for pkg in packages:
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        for path in sorted(root.rglob("*.py")):
            text = path.read_text(encoding="utf-8", errors="replace")
            if len(text) < 200:
                continue
            texts.append(text)
            total += len(text)
            if total >= min_chars:
                return texts
    return texts


def unique_corpus_data(setup: Setup, tokens_needed: int):
    """(tokenizer, lm) of the stdlib corpus with extra package sources appended to train until it holds
    ``tokens_needed`` tokens; the stdlib tokenizer and validation rows are kept."""
    import datasets

    from hf_fasttrain.data.corpus import build_stdlib_corpus, tokenize_and_chunk

    tokenizer, lm = prepare_data(data_args(setup))
    have = len(lm["train"]) * setup.block_size
    if have >= tokens_needed:
        return tokenizer, lm
    chars_per_token = 3.5  # measured on the stdlib corpus with this tokenizer (about 3.4-3.8)
    texts = extra_python_sources(int((tokens_needed - have) * chars_per_token * 1.15))
    raw = build_stdlib_corpus()
    extra = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts}),
                                  "validation": raw["validation"].select_columns(["text"]).select(range(1))})
    more = tokenize_and_chunk(extra, tokenizer, setup.block_size)["train"]
    total = have + len(more) * setup.block_size
    if total < tokens_needed:  # before any training: a corpus that repeats would be reported as one that does not
        raise UsageError(f"--corpus unique: the installed packages' Python sources ({', '.join(SOURCE_PACKAGES)}) "
                         f"give {total / 1e6:.1f}M tokens, {tokens_needed / 1e6:.1f}M needed for this budget: install "
                         f"more of them, or use a shorter budget")
    train = datasets.concatenate_datasets([lm["train"], more.cast(lm["train"].features)])
    return tokenizer, datasets.DatasetDict({"train": train, "validation": lm["validation"]})


def data_args(setup: Setup) -> DataArguments:
    return DataArguments(vocab_size=setup.vocab_size, block_size=setup.block_size, max_eval_samples=setup.eval_rows,
                         max_corpus_files=setup.max_corpus_files)
