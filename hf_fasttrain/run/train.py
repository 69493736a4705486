"""One training run from a resolved config: data, tokenizer, model, FastTrainer, final evaluation.

This is the code path of ``recipes/gpt2_small.py``, of ``hf-fasttrain train`` and of every benchmark
arm that uses FastTrainer; the recipe script only parses arguments and calls :func:`train`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any, Optional, Sequence

from transformers import set_seed
from transformers.trainer_callback import PrinterCallback, ProgressCallback

from ..validation import ConfigError
from ..config.args import DataArguments, FastTrainingArguments, ModelArguments
from ..callbacks.progress import ReadablePrinterCallback, ReadableProgressCallback
from ..data.front import run_data
from ..metrics import make_compute_metrics, preprocess_logits_for_metrics
from ..modeling import build_model
from ..config.recipes import resolved_config
from ..runinfo import run_facts
from ..trainer import FastTrainer
from ._console import end_summary, say, start_line
from ._resume import final_outputs_present, resume_plan

__all__ = ["setup_logging", "train"]

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


class _TiedKeysFilter(logging.Filter):
    """Drops the Trainer's "missing keys" warning on resume when the only keys missing are weights tied to
    another parameter (GPT-2's lm_head is the embedding: the checkpoint stores it once, by design)."""

    PREFIX = "There were missing keys in the checkpoint model loaded: "

    def __init__(self, tied: set[str]):
        super().__init__()
        self.tied = tied

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if not msg.startswith(self.PREFIX):
            return True
        import ast

        try:
            missing = ast.literal_eval(msg[len(self.PREFIX):].rstrip("."))
        except (ValueError, SyntaxError):
            return True
        return not (missing and set(missing) <= self.tied)


def _tied_parameter_names(model) -> set[str]:
    """Names of parameters that are the same tensor as an earlier one (tied weights)."""
    seen: dict[int, str] = {}
    tied = set()
    for name, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            tied.add(name)
        else:
            seen[id(p)] = name
    return tied


def _quiet_known_warnings(model) -> None:
    """Silence two warnings where they are known to be harmless, and only there."""
    from transformers.loss.loss_utils import LOSS_MAPPING

    # `loss_type=None ... unrecognized. Using the default loss: ForCausalLMLoss`: a from-scratch GPT-2's class
    # name matches no loss, so transformers falls back to ForCausalLM, which is right: say so up front
    if getattr(model, "loss_type", "") is None and "ForCausalLM" in LOSS_MAPPING:
        model.loss_type = "ForCausalLM"
    tied = _tied_parameter_names(model)
    if tied:
        trainer_logger = logging.getLogger("transformers.trainer")
        for f in [f for f in trainer_logger.filters if isinstance(f, _TiedKeysFilter)]:
            trainer_logger.removeFilter(f)
        trainer_logger.addFilter(_TiedKeysFilter(tied))


def _finish_from_checkpoint(trainer, checkpoint: str) -> None:
    """A run killed after its last checkpoint but before its final save: the final weights are that
    checkpoint's; load them and the log history without training."""
    from transformers.trainer_callback import TrainerState

    trainer._load_from_checkpoint(checkpoint)
    averaging = getattr(trainer, "weight_averaging", None)
    if averaging is not None:  # the run's model is the average the checkpoint carries, not its iterate
        averaging.finish_from(checkpoint, trainer.model)
    trainer.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
    trainer.recorder.resume_dir = checkpoint  # its run_record.json: the clock and the logs' wall-clock values
    trainer.recorder.on_train_begin(trainer.args, trainer.state, trainer.control)
    trainer.recorder.on_train_end(trainer.args, trainer.state, trainer.control)


def _tidy_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each eval once (the final evaluate repeats the one at the last step: the last copy is kept)."""
    last_eval_at: dict[int, int] = {}
    for i, r in enumerate(records):
        if "eval_loss" in r:
            last_eval_at[r.get("step", -1)] = i
    out = []
    for i, r in enumerate(records):
        if "eval_loss" in r:
            if last_eval_at[r.get("step", -1)] != i:
                continue
        out.append(r)
    return out


def train(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: FastTrainingArguments,
    callbacks: Optional[Sequence[Any]] = None,
    trainer_cls: type = FastTrainer,
) -> dict[str, Any]:
    """Train and evaluate; returns the final eval metrics (also written to output_dir/metrics.json).

    Rerun on a finished run, it trains nothing: it says the run is complete and returns the recorded final
    metrics, leaving every output as it was (a run killed between its last checkpoint and its final save
    gets its final save and evaluation from that checkpoint).
    """
    setup_logging(training_args)
    _lora_checks(model_args)
    out = training_args.output_dir
    name = os.path.basename(os.path.normpath(out)) or out
    is_main = training_args.process_index == 0
    # what the data cannot do is refused here, and the run's plan made (max_tokens: the optimizer steps that hold
    # them set as max_steps); nothing read yet
    data = run_data(data_args, model_args, training_args)
    options = resolved_config(model_args, data.args, training_args)
    # resume, finished or from scratch; a checkpoint trained with other options is refused here, before any work
    plan = resume_plan(training_args, options, data.plan)
    checkpoint, done_at = plan.checkpoint, plan.finished_at
    if done_at is not None:
        final = final_outputs_present(out)
        if final is not None:
            if is_main:
                tokens = f", max_tokens {training_args.max_tokens:,}" if training_args.max_tokens else ""
                say(f"{plan.describe(name)} (max_steps {training_args.max_steps}{tokens}; outputs left as they are). "
                    "To train longer, raise --max_steps (a run whose lr schedule spans it needs a new --output_dir); "
                    "to start over, use a new --output_dir or --overwrite_output_dir.")
            return final
    data.load()  # tokenizer, train set or stream, eval set, collator, summary
    set_seed(training_args.seed)  # the model's initialisation depends on the seed alone
    model = build_model(model_args, data.tokenizer, data.plan.row_length,
                        training_args.optimizer_kwargs if training_args.optimizer else None)
    _quiet_known_warnings(model)
    trainer = trainer_cls(
        model=model,
        args=training_args,
        train_dataset=data.train_set,
        eval_dataset=data.eval_set,
        data_collator=data.collator,
        processing_class=data.tokenizer,
        compute_metrics=make_compute_metrics(),
        preprocess_logits_for_metrics=preprocess_logits_for_metrics,
        callbacks=list(callbacks or []),
        run_config={k: v for k, v in options.items() if k in ("model", "peft", "data")},
        data_plan=data.plan,  # the trainer's run plan takes its rows, steps and tokens from the recipe's
    )
    if trainer.pop_callback(ProgressCallback) is not None:  # the same bar, logs printed as numbers
        trainer.add_callback(ReadableProgressCallback(bar_after_training=False))
        # one bar on the console: transformers' own (each checkpoint's "Writing model shards") stay off
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if trainer.pop_callback(PrinterCallback) is not None:  # disable_tqdm: the same lines, no bar
        trainer.add_callback(ReadablePrinterCallback())
    facts = run_facts(model, training_args, data.plan.row_length)
    facts["tokens"], facts["max_tokens"] = data.plan.tokens, data.plan.max_tokens
    if is_main:
        logger.info(start_line(name, facts, out, data=data.summary))
    if done_at is not None:  # complete, but killed before its final save: finish from the checkpoint
        if is_main:
            logger.info("%s reached max_steps at %s; writing the final model and evaluation without training",
                        name, os.path.basename(checkpoint))
        _finish_from_checkpoint(trainer, checkpoint)
    else:
        if is_main:
            if checkpoint and getattr(trainer, "run_record", False):  # FastTrainer.train() says it, as in a script
                trainer.resume_decision = plan
            elif checkpoint:
                say(plan.describe(name))
            elif training_args.auto_resume:
                logger.info("no complete checkpoint in %s: starting from scratch", out)
            else:
                logger.info("auto_resume is off: starting from scratch in %s", out)
        trainer.train(resume_from_checkpoint=checkpoint)
    trainer.save_model()
    metrics = trainer.evaluate()
    if trainer.is_world_process_zero():
        recorder = trainer.recorder
        if recorder is None:  # run_record: false leaves the Trainer's outputs alone (no metrics.json, no PNG)
            print("done:", {k: round(v, 4) for k, v in metrics.items() if isinstance(v, float)}, flush=True)
        else:
            recorder.records = _tidy_records(recorder.records)
            final_loss = metrics.get("eval_loss")
            title = f"{name}: final eval loss {final_loss:.4f}" if isinstance(final_loss, float) else name
            summary = recorder.save(out, final_metrics=metrics, title=title)
    merged = None
    if model_args.lora_r is not None and model_args.lora_merge and trainer.is_world_process_zero():
        from ..modeling import merge_lora

        merged = os.path.join(out, "merged")
        merged_model = merge_lora(trainer.accelerator.unwrap_model(trainer.model))
        merged_model.save_pretrained(merged)
        data.tokenizer.save_pretrained(merged)
        logger.info("the base with the adapter merged in: %s", merged)
    if trainer.is_world_process_zero() and trainer.recorder is not None:
        # the result on stdout, where the step and eval lines are; the run's story stays on stderr
        step = trainer.state.global_step
        tokens = facts["tokens"] if step == training_args.max_steps else None  # not known for a run stopped early
        print(end_summary(summary, out, facts, steps=step, tokens=tokens, adapter=model_args.lora_r is not None,
                          merged=merged), flush=True)
    return metrics


def _lora_checks(model_args: ModelArguments) -> None:
    """What LoRA needs, checked before any data work: peft and a CUDA GPU for a 4-bit base (the tokenizer is the
    data's front door's to check: :func:`~hf_fasttrain.data.front.run_data`)."""
    if model_args.lora_r is not None:
        try:
            import peft  # noqa: F401
        except ImportError:
            raise ConfigError("lora_r", model_args.lora_r, allowed="LoRA needs peft: pip install peft") from None
        if model_args.lora_load_in_4bit:
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("lora_load_in_4bit", True, problem="QLoRA (a 4-bit base through bitsandbytes) needs "
                                  "a CUDA GPU and this machine has none",
                                  allowed="lora_load_in_4bit: false (LoRA on the full-precision base) on CPU")
