"""One training run from a resolved config: data, tokenizer, model, FastTrainer, final evaluation.

This is the code path of ``recipes/gpt2_small.py``, of ``hf-fasttrain train`` and of every benchmark
arm that uses FastTrainer; the recipe script only parses arguments and calls :func:`train`.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
from typing import Any, Optional, Sequence

from transformers import DataCollatorForLanguageModeling, set_seed

from .args import DataArguments, FastTrainingArguments, ModelArguments
from .data.corpus import get_tokenizer, load_text_datasets, tokenize_and_chunk
from .metrics import make_compute_metrics, preprocess_logits_for_metrics
from .modeling import build_model
from .recipes import resolved_config
from .trainer import FastTrainer

__all__ = ["setup_logging", "prepare_data", "train", "find_resume_checkpoint", "last_complete_checkpoint"]

logger = logging.getLogger(__name__)


class _StderrHandler(logging.Handler):
    """Writes to whatever ``sys.stderr`` is at the time of each record (not the one at setup), so a
    redirected or captured stderr gets the records and a closed one is never written to."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
        except Exception:
            self.handleError(record)


def setup_logging(training_args: FastTrainingArguments) -> None:
    """INFO logs from hf_fasttrain on the main process (what it resumed from, cache hits, final eval).

    When the application has configured logging (the root logger has handlers), records propagate to
    those handlers; otherwise one ``[hf_fasttrain]`` handler on stderr shows them.
    """
    pkg = logging.getLogger("hf_fasttrain")
    pkg.setLevel(logging.INFO if training_args.should_log else logging.WARNING)
    ours = [h for h in pkg.handlers if isinstance(h, _StderrHandler)]
    if logging.getLogger().handlers:
        for h in ours:
            pkg.removeHandler(h)
        pkg.propagate = True
    elif not ours:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("[hf_fasttrain] %(message)s"))
        pkg.addHandler(handler)
        pkg.propagate = False


def prepare_data(data_args: DataArguments, model_args: Optional[ModelArguments] = None, seed: int = 0):
    """(tokenizer, DatasetDict of fixed-length ``input_ids`` rows with train/validation)."""
    raw = load_text_datasets(
        data_args.dataset,
        data_args.dataset_config,
        data_args.text_column,
        data_args.validation_fraction,
        data_args.max_corpus_files,
        seed=seed,
    )
    trust = bool(model_args and model_args.trust_remote_code)
    tokenizer = get_tokenizer(data_args.tokenizer, data_args.vocab_size, corpus=raw, trust_remote_code=trust)
    lm = tokenize_and_chunk(raw, tokenizer, data_args.block_size, num_proc=data_args.preprocessing_num_workers)
    for split, limit in (("train", data_args.max_train_samples), ("validation", data_args.max_eval_samples)):
        if limit is not None and len(lm[split]) > limit:
            lm[split] = lm[split].select(range(limit))
    if len(lm["train"]) == 0:
        raise ValueError(
            f"block_size={data_args.block_size} leaves no training rows: the corpus is shorter than one block"
        )
    return tokenizer, lm


def last_complete_checkpoint(output_dir: str) -> Optional[str]:
    """The newest ``checkpoint-N`` in ``output_dir`` that was written to the end.

    The Trainer writes ``trainer_state.json`` last, so a checkpoint whose state file is missing or does
    not parse was cut short by a kill; it is skipped (and reported) in favour of the one before.
    """
    if not os.path.isdir(output_dir):
        return None
    found = []
    for name in os.listdir(output_dir):
        m = re.fullmatch(r"checkpoint-(\d+)", name)
        if m and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), os.path.join(output_dir, name)))
    for _, path in sorted(found, reverse=True):
        try:
            with open(os.path.join(path, "trainer_state.json")) as f:
                json.load(f)
            return path
        except (OSError, ValueError):
            logger.warning("Skipping %s: it was not written to the end (killed while saving?)", path)
    return None


def find_resume_checkpoint(training_args: FastTrainingArguments) -> Optional[str]:
    """The checkpoint to resume from: the one asked for, else (auto_resume) the last complete one."""
    if training_args.resume_from_checkpoint:
        return training_args.resume_from_checkpoint
    if training_args.auto_resume:
        return last_complete_checkpoint(training_args.output_dir)
    return None


def train(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: FastTrainingArguments,
    callbacks: Optional[Sequence[Any]] = None,
    trainer_cls: type = FastTrainer,
) -> dict[str, Any]:
    """Train and evaluate; returns the final eval metrics (also written to output_dir/metrics.json)."""
    setup_logging(training_args)
    with training_args.main_process_first(desc="dataset and tokenizer"):
        # the held-out split must not move with the training seed (random restart compares seeds on it)
        tokenizer, lm = prepare_data(data_args, model_args, seed=0)
    set_seed(training_args.seed)  # the model's initialisation depends on the seed alone
    model = build_model(model_args, tokenizer, data_args.block_size)
    trainer = trainer_cls(
        model=model,
        args=training_args,
        train_dataset=lm["train"],
        eval_dataset=lm["validation"],
        data_collator=DataCollatorForLanguageModeling(tokenizer, mlm=False),
        processing_class=tokenizer,
        compute_metrics=make_compute_metrics(),
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=list(callbacks or []),
        run_config={k: v for k, v in resolved_config(model_args, data_args, training_args).items()
                    if k in ("model", "data")},
    )
    checkpoint = find_resume_checkpoint(training_args)
    if checkpoint:
        logger.info("Resuming from %s", checkpoint)
    trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():
        if trainer.recorder is not None:  # run_record: false leaves the Trainer's outputs alone
            trainer.recorder.save(training_args.output_dir, final_metrics=metrics)
        logger.info("Final eval: %s", {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)})
    return metrics
