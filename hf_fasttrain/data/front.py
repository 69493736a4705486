"""The run's one door to its data, whatever the kind: a stream, fine-tuning examples, pre-tokenized or text rows.

:func:`run_data` takes the run's data, model and training arguments and returns a :class:`RunData`. It works in
two steps so that a run refuses what it cannot do, and a finished run stops, before any data is read:

1. ``run_data(...)``: a pretrained base's own tokenizer is named when none is (one named beside a LoRA base
   must fit its vocabulary: :func:`~hf_fasttrain.data.tokenizer.check_tokenizer_fits`), what a stream cannot do is
   refused (:func:`~hf_fasttrain.data.streaming.check_stream_args`), and the run's
   :class:`~hf_fasttrain.data.from_args.DataPlan` (rows, steps, tokens) is worked out; nothing is read. The
   resume checks, run facts and start line of :func:`hf_fasttrain.run.train.train` use this much.
2. ``RunData.load()``: the tokenizer, the train set (or stream), the eval set, the collator and the one-line
   summary of what was loaded, the main process first (the others then find its caches).

:func:`prepare_data` is the (tokenizer, DatasetDict) pair that benchmarks build their own Trainers on.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from transformers import DataCollatorForLanguageModeling

from .chars import WindowCollator
from .from_args import DataPlan
from .prepare import prepare_lm_data
from .sft_sources import prepare_sft_data, sft_collator
from .streaming import check_stream_args, stream_datasets
from .tokenizer import check_tokenizer_fits, check_tokenizer_path

__all__ = ["RunData", "run_data", "prepare_data", "check_positions"]


@dataclass
class RunData:
    """What a training run takes from its data. Made by :func:`run_data`; :meth:`load` reads the data.

    ``args`` and ``plan``, set by :func:`run_data` (nothing read yet): the data arguments as the run uses them (a
    pretrained base's own tokenizer when none is named), which identify the run and are recorded in its
    ``config.yaml``; and the :class:`~hf_fasttrain.data.from_args.DataPlan` that they and the training arguments
    make (row length, optimizer steps, tokens).

    Fields set by :meth:`load`: ``tokenizer``; ``train_set`` (a ``datasets.Dataset`` of rows or examples, or a
    :class:`~hf_fasttrain.data.streaming.TokenStream`); ``eval_set``; ``collator``; ``summary``, the line the
    run's start line carries (``data c.parquet: 1,998 documents (2 empty dropped) -> 3,220 train rows, ...``).
    """

    args: Any
    plan: DataPlan
    tokenizer: Any = None
    train_set: Any = None
    eval_set: Any = None
    collator: Any = None
    summary: str = ""
    # what load() reads with: trust_remote_code (model), seeds, rank and world size, main_process_first (training)
    _model_args: Any = field(default=None, repr=False)
    _training_args: Any = field(default=None, repr=False)

    def load(self) -> "RunData":
        """Read the data (the main process first) and fill in the tokenizer, the sets, the collator and the summary."""
        args, model_args, training_args = self.args, self._model_args, self._training_args
        with training_args.main_process_first(desc="dataset and tokenizer"):
            if args.streaming:  # rows tokenized and packed as training reads them; a held-out eval set
                self.tokenizer, self.train_set, self.eval_set = stream_datasets(args, training_args, model_args)
                self.summary = f"data {args.dataset}: streamed, {len(self.eval_set):,} held-out validation rows"
            elif args.data_format != "text":  # fine-tuning: one prompt/completion example per row
                self.tokenizer, lm = prepare_sft_data(args, model_args, seed=0)
                self.train_set, self.eval_set = lm["train"], lm["validation"]
                self.summary = (f"data {args.dataset}: {args.data_format}, {len(self.train_set):,} train examples, "
                                f"{len(self.eval_set):,} validation examples")
            else:  # the held-out split must not move with the training seed (random restart compares seeds on it)
                prepared = prepare_lm_data(args, trust_remote_code=model_args.trust_remote_code, seed=0)
                self.tokenizer, self.train_set, self.eval_set = (prepared.tokenizer, prepared.lm["train"],
                                                                 prepared.lm["validation"])
                self.summary = prepared.summary()
        self.collator = _collator(args, self.tokenizer, self.train_set)
        return self


def run_data(data_args, model_args, training_args) -> RunData:
    """The :class:`RunData` of a run with these arguments: refusals made, the plan worked out (with a token budget,
    ``training_args.max_steps`` set to its optimizer steps), nothing read yet (see :meth:`RunData.load`).

    ``data_args`` is any object with the fields of ``DataArguments`` (a dataclass, as the base's tokenizer is
    filled in with ``dataclasses.replace``); ``model_args`` and ``training_args`` those of ``ModelArguments`` and
    ``FastTrainingArguments``.
    """
    base = model_args.model_name_or_path
    if base and not data_args.tokenizer:
        # the base's own tokenizer, as transformers' run_clm.py does: a new one would resize, and so retrain,
        # the base's embeddings
        data_args = dataclasses.replace(data_args, tokenizer=base)
    elif base and model_args.lora_r is not None and data_args.tokenizer != base:  # a frozen base: it must fit
        check_tokenizer_fits(model_args, data_args.tokenizer, model_args.trust_remote_code)
    check_positions(model_args, data_args)
    check_stream_args(data_args, training_args)
    check_tokenizer_path(data_args.tokenizer)
    return RunData(args=data_args, plan=DataPlan.from_args(data_args, training_args), _model_args=model_args,
                   _training_args=training_args)


def check_positions(model_args, data_args) -> None:
    """Rows of ``block_size`` tokens must fit the model's positions: a pretrained base's (its config, read without
    the weights) or ``n_positions`` for a model built from scratch (whose default is the block size). Refused in
    one line before any data is read."""
    from ..validation import ConfigError

    block = data_args.block_size
    base = model_args.model_name_or_path
    if not base:
        if model_args.n_positions is not None and model_args.n_positions < block:
            raise ConfigError("n_positions", model_args.n_positions, allowed=f"must be >= data block_size={block}")
        return
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(base, trust_remote_code=model_args.trust_remote_code)
    except Exception:  # a base that cannot be read is the model loader's to report, with its own message
        return
    config = getattr(config, "text_config", None) or config
    positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    if isinstance(positions, int) and block > positions:
        raise ConfigError("block_size", block, problem=f"got {block}, above the {positions} positions of the base "
                          f"{base!r}", allowed=f"block_size <= {positions}")


def prepare_data(data_args, model_args=None, seed: int = 0):
    """(tokenizer, DatasetDict of fixed-length ``input_ids`` rows with train/validation).

    :func:`hf_fasttrain.data.prepare.prepare_lm_data` does the work (any source, pre-tokenized folders,
    the one-line data errors); this keeps the pair that benchmarks use. Fine-tuning (``data_format`` other
    than ``'text'``): one ``input_ids``/``labels`` example per row instead
    (:func:`hf_fasttrain.data.sft_sources.prepare_sft_data`).
    """
    if data_args.data_format != "text":  # fine-tuning rows
        return prepare_sft_data(data_args, model_args, seed=seed)
    prepared = prepare_lm_data(data_args, trust_remote_code=bool(model_args and model_args.trust_remote_code),
                               seed=seed)
    return prepared.tokenizer, prepared.lm


def _collator(data_args, tokenizer, train_set=None):
    """Pretraining rows: the LM collator (nanoGPT windows, which carry their next ids: stacked as they are);
    fine-tuning examples: right padding that keeps their labels."""
    if data_args.data_format != "text":
        return sft_collator(tokenizer)
    if "labels" in (getattr(train_set, "column_names", None) or ()):  # character windows carry their next ids
        return WindowCollator()
    return DataCollatorForLanguageModeling(tokenizer, mlm=False)
