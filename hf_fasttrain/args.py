"""The configuration: ``FastTrainingArguments`` (the one object the Trainer sees) plus the model and
data sections of a recipe.

Every field carries its ``--help`` text in ``metadata={"help": ...}``; the YAML recipe keys are exactly
these field names (training fields at the top level, ``model:`` and ``data:`` sections for the other
two dataclasses), and every one can be overridden on the command line as ``--<field> <value>``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Optional

from transformers import TrainingArguments

__all__ = ["ModelArguments", "DataArguments", "FastTrainingArguments"]


def _check(cond: bool, name: str, value, allowed: str) -> None:
    if not cond:
        raise ValueError(f"{name}={value!r} is invalid: {allowed}")


@dataclass
class ModelArguments:
    """The ``model:`` section of a recipe: a pretrained checkpoint, or a GPT-2 built from scratch."""

    model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Hub name or local path of a pretrained causal LM to start from. "
                  "Default: a GPT-2 built from scratch with the sizes below."},
    )
    n_layer: int = field(default=12, metadata={"help": "Transformer blocks (from-scratch GPT-2)."})
    n_head: int = field(default=12, metadata={"help": "Attention heads per block; must divide n_embd."})
    n_embd: int = field(default=768, metadata={"help": "Hidden size (from-scratch GPT-2)."})
    n_positions: Optional[int] = field(
        default=None, metadata={"help": "Maximum positions. Default: the data's block_size."}
    )
    dropout: float = field(
        default=0.0,
        metadata={"help": "Dropout on residual, embedding and attention (0 is usual for pretraining)."},
    )
    attn_implementation: str = field(
        default="sdpa",
        metadata={"help": "Attention kernel: 'sdpa' (PyTorch scaled_dot_product_attention, flash on GPU) "
                  "or 'eager'."},
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={"help": "Allow model/tokenizer code from the Hub to run. Only ever set by the user: "
                  "recipes cannot switch it on."},
    )

    def __post_init__(self):
        for name in ("n_layer", "n_head", "n_embd"):
            v = getattr(self, name)
            _check(isinstance(v, int) and v >= 1, name, v, "must be a positive integer")
        _check(self.n_embd % self.n_head == 0, "n_head", self.n_head,
               f"must divide n_embd={self.n_embd}")
        if self.n_positions is not None:
            _check(isinstance(self.n_positions, int) and self.n_positions >= 1, "n_positions",
                   self.n_positions, "must be a positive integer or null")
        _check(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "must be in [0, 1)")
        _check(self.attn_implementation in ("sdpa", "eager", "flash_attention_2"), "attn_implementation",
               self.attn_implementation, "allowed: 'sdpa', 'eager', 'flash_attention_2'")


@dataclass
class DataArguments:
    """The ``data:`` section of a recipe: which text, which tokenizer, how it is cut."""

    dataset: Optional[str] = field(
        default=None,
        metadata={"help": "Hub dataset name, or comma-separated local .txt/.json/.jsonl files. "
                  "Default: the embedded corpus (this Python's stdlib sources; works offline)."},
    )
    dataset_config: Optional[str] = field(default=None, metadata={"help": "Hub dataset config name."})
    text_column: str = field(default="text", metadata={"help": "Column holding the raw text."})
    tokenizer: Optional[str] = field(
        default=None,
        metadata={"help": "Hub name or local path of a tokenizer. Default: a byte-level BPE trained on "
                  "the train split and cached (see vocab_size)."},
    )
    vocab_size: int = field(
        default=8192, metadata={"help": "Vocabulary size of the trained BPE tokenizer (embedded default)."}
    )
    block_size: int = field(
        default=1024, metadata={"help": "Tokens per training row: documents are concatenated and cut."}
    )
    validation_fraction: float = field(
        default=0.05, metadata={"help": "Share of documents held out for evaluation when the data has no "
                                "validation split (embedded corpus: chosen by a hash of the file path)."},
    )
    max_corpus_files: Optional[int] = field(
        default=None, metadata={"help": "Use only this many stdlib files (a deterministic subset) for the "
                                "embedded corpus; for quick runs and tests."},
    )
    max_train_samples: Optional[int] = field(
        default=None, metadata={"help": "Truncate the training rows to this many (after chunking)."}
    )
    max_eval_samples: Optional[int] = field(
        default=None, metadata={"help": "Truncate the validation rows to this many (after chunking)."}
    )
    preprocessing_num_workers: Optional[int] = field(
        default=None, metadata={"help": "Processes for tokenization and chunking (datasets.map num_proc)."}
    )

    def __post_init__(self):
        _check(isinstance(self.vocab_size, int) and self.vocab_size >= 260, "vocab_size", self.vocab_size,
               "must be an integer >= 260 (256 byte tokens plus specials)")
        _check(isinstance(self.block_size, int) and self.block_size >= 2, "block_size", self.block_size,
               "must be an integer >= 2")
        _check(0.0 < self.validation_fraction < 1.0, "validation_fraction", self.validation_fraction,
               "must be in (0, 1)")
        for name in ("max_corpus_files", "max_train_samples", "max_eval_samples", "preprocessing_num_workers"):
            v = getattr(self, name)
            if v is not None:
                _check(isinstance(v, int) and v >= 1, name, v, "must be a positive integer or null")


@dataclass
class FastTrainingArguments(TrainingArguments):
    """``TrainingArguments`` plus the switches of hf_fasttrain's techniques.

    Everything the Trainer accepts still works; the fields below are grouped by technique.

    Example:
        >>> from hf_fasttrain import FastTrainingArguments
        >>> args = FastTrainingArguments(output_dir="runs/x", max_steps=100, learning_rate=1e-3)
    """

    # --- Throughput logging ------------------------------------------------------------------
    mfu_peak_tflops: Optional[float] = field(
        default=None,
        metadata={"help": "Peak TFLOP/s of one device for the MFU estimate. Default: looked up from the "
                  "GPU name (dense bf16 datasheet figure); MFU is not logged on CPU or unknown devices."},
    )
    # --- Run management ----------------------------------------------------------------------
    auto_resume: bool = field(
        default=True,
        metadata={"help": "Resume from the last checkpoint in output_dir when one exists (a killed run "
                  "continues when restarted with the same command)."},
    )

    # --- Optimizer by name (hf_fasttrain.optim) ------------------------------------------------
    # Rule: `optimizer` set -> it replaces the Trainer's `optim`, which must then stay at its default
    # (and `optim_args` unset); learning_rate / weight_decay are its lr and weight decay.
    optimizer: Optional[str] = field(
        default=None,
        metadata={"help": "Optimizer from hf_fasttrain.optim: 'adamw', 'lion', 'ademamix', 'soap' or 'muon' "
                  "(Muon on hidden matrices + AdamW on embeddings, head, biases, norms). Replaces `optim`, which "
                  "must then be left at its default. learning_rate and weight_decay are its lr and weight decay "
                  "(adam_beta1/2 and adam_epsilon too for 'adamw'); 'ademamix' warms alpha and beta3 up over the "
                  "whole run. Default: null, the Trainer's `optim`."},
    )
    optimizer_kwargs: dict | str | None = field(
        default=None,
        metadata={"help": "More options of `optimizer`, a mapping (YAML) or a JSON string (CLI), e.g. "
                  "'{\"betas\": [0.9, 0.99]}' or '{\"muon_lr\": 0.02}'. Numbers written as strings ('1e-5') are "
                  "converted; unknown keys and bad values are errors. Overrides learning_rate / weight_decay when "
                  "it sets lr / weight_decay."},
    )

    def __post_init__(self):
        if self.mfu_peak_tflops is not None:
            _check(self.mfu_peak_tflops > 0, "mfu_peak_tflops", self.mfu_peak_tflops, "must be > 0 or null")
        self._check_optimizer()
        super().__post_init__()

    def _check_optimizer(self) -> None:
        """Validate `optimizer` / `optimizer_kwargs` now: a bad name or value fails before any training."""
        from .optim import (
            check_optimizer_options,
            get_optimizer_factory,
            parse_optimizer_kwargs,
            trainer_optimizer_kwargs,
        )

        if self.optimizer is None:
            _check(not self.optimizer_kwargs, "optimizer_kwargs", self.optimizer_kwargs,
                   "only allowed together with `optimizer` (the Trainer's `optim` takes `optim_args`)")
            return
        get_optimizer_factory(self.optimizer)  # ValueError naming the known optimizers
        default_optim = next(f.default for f in dataclasses.fields(TrainingArguments) if f.name == "optim")
        optim = getattr(self.optim, "value", self.optim)
        _check(optim == default_optim, "optim", optim,
               f"set either `optim` or `optimizer` (here {self.optimizer!r}), not both; leave optim at "
               f"{default_optim!r} when `optimizer` is set")
        _check(not self.optim_args, "optim_args", self.optim_args,
               f"applies to `optim` only; give options of optimizer={self.optimizer!r} in `optimizer_kwargs`")
        self.optimizer_kwargs = parse_optimizer_kwargs(self.optimizer, self.optimizer_kwargs)  # JSON, "1e-5"
        check_optimizer_options(self.optimizer, **trainer_optimizer_kwargs(self))
