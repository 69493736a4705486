"""pytest plugin for ``benchmarks.hf_trainer_suite``: substitutes FastTrainer for transformers' Trainer.

Loaded with ``-p benchmarks._hf_suite_plugin``; the mode comes from ``HF_FASTTRAIN_SUITE_MODE``:

- ``trainer``: nothing is patched (the reference run);
- ``fast``: ``transformers.Trainer`` is ``FastTrainer``, arguments stay ``TrainingArguments``;
- ``fast_args``: also ``transformers.TrainingArguments`` is ``FastTrainingArguments``;
- ``fast_neutral``: as ``fast_args`` with ``run_record`` and ``save_on_signal`` defaulting to False (every package
  option off).

The names are patched on the ``transformers`` package in ``pytest_configure``, before any test module is
imported, so ``from transformers import Trainer, TrainingArguments`` in a test module (and every class it
derives from them, such as a test's ``CustomDataloaderTrainer(Trainer)`` or
``RegressionTrainingArguments(TrainingArguments)``) gets the substitute. Trainer subclasses that
transformers itself defines (``Seq2SeqTrainer``) keep the real base and are not substituted.
After collection every test module's ``Trainer``/``TrainingArguments`` globals are checked, and the
result is written as JSON to ``HF_FASTTRAIN_SUITE_REPORT`` when that is set.
"""

from __future__ import annotations

import json
import os

MODES = ("trainer", "fast", "fast_args", "fast_neutral")
_MODE = os.environ.get("HF_FASTTRAIN_SUITE_MODE", "trainer")


def pytest_configure(config):
    if _MODE not in MODES:
        raise ValueError(f"HF_FASTTRAIN_SUITE_MODE: got {_MODE!r}; one of {', '.join(MODES)}")
    if _MODE == "trainer":
        return
    import sys

    import transformers

    from hf_fasttrain import FastTrainer, FastTrainingArguments

    args_cls = {"fast_args": FastTrainingArguments, "fast_neutral": _neutral_args_class()}.get(_MODE)
    # `import transformers` and sys.modules["transformers"] can be two lazy-module objects (transformers
    # re-registers itself while hf_fasttrain imports); `from transformers import X` reads sys.modules
    for mod in {id(m): m for m in (transformers, sys.modules["transformers"])}.values():
        mod.Trainer = FastTrainer
        if args_cls is not None:
            mod.TrainingArguments = args_cls


def _neutral_args_class():
    """FastTrainingArguments whose run_record and save_on_signal default to False: the package's neutral mode."""
    import dataclasses

    from hf_fasttrain import FastTrainingArguments

    @dataclasses.dataclass
    class NeutralFastTrainingArguments(FastTrainingArguments):
        run_record: bool = False
        save_on_signal: bool = False

    # a module-level name, so that the Trainer can pickle the arguments into training_args.bin
    NeutralFastTrainingArguments.__qualname__ = "NeutralFastTrainingArguments"
    globals()["NeutralFastTrainingArguments"] = NeutralFastTrainingArguments
    return NeutralFastTrainingArguments


def pytest_collection_finish(session):
    path = os.environ.get("HF_FASTTRAIN_SUITE_REPORT")
    if not path:
        return
    import sys

    root = str(session.config.rootpath)
    modules = {}
    for name, mod in sorted(sys.modules.items()):  # the test modules and their helpers (trainer_test_utils)
        if not str(getattr(mod, "__file__", None) or "").startswith(root):
            continue
        seen = {}
        for attr in ("Trainer", "TrainingArguments"):
            obj = getattr(mod, attr, None)
            if isinstance(obj, type):
                seen[attr] = f"{obj.__module__}.{obj.__qualname__}"
        if seen:
            modules[name] = seen
    with open(path, "w") as f:
        json.dump({"mode": _MODE, "modules": modules}, f, indent=2)
