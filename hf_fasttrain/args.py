"""The configuration: ``FastTrainingArguments`` (the one object the Trainer sees) plus the model and
data sections of a recipe.

Every field carries its ``--help`` text in ``metadata={"help": ...}``; the YAML recipe keys are exactly
these field names (training fields at the top level, ``model:`` and ``data:`` sections for the other
two dataclasses), and every one can be overridden on the command line as ``--<field> <value>``.
"""

from __future__ import annotations

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

    # --- Random restart (issue 7: hf_fasttrain/restarts.py) ---------------------------------
    # restart_num_seeds > 1 turns the recipe into a search: every seed trains for
    # restart_explore_fraction * max_steps (with the full run's LR schedule), the best continues.
    restart_num_seeds: int = field(
        default=1,
        metadata={"help": "Random restart: seeds to explore (model init and data order). 1 = a single run; "
                  "> 1 explores each seed briefly and continues the best to max_steps."},
    )
    restart_explore_fraction: float = field(
        default=0.1, metadata={"help": "Random restart: exploration budget as a fraction of max_steps, in (0, 1]."}
    )
    restart_rungs: int = field(
        default=1,
        metadata={"help": "Random restart: successive-halving rungs (1 = plain best-of-N). Rung r of R sits at "
                  "restart_explore_fraction * restart_keep_fraction**(R-1-r) of max_steps."},
    )
    restart_keep_fraction: float = field(
        default=0.5, metadata={"help": "Random restart: share of seeds kept at each rung before the last, in (0, 1)."}
    )
    restart_metric: str = field(
        default="eval_loss", metadata={"help": "Random restart: eval metric that ranks the seeds."}
    )
    restart_direction: str = field(
        default="min", metadata={"help": "Random restart: 'min' (lower is better) or 'max'."}
    )
    restart_divergence_threshold: Optional[float] = field(
        default=None,
        metadata={"help": "Random restart: a seed whose metric at a rung is worse than this is diverged "
                  "(non-finite values always are). E.g. ln(vocab size) for eval_loss."},
    )
    restart_replace_diverged: bool = field(
        default=False, metadata={"help": "Random restart: replace each diverged seed by a fresh one."}
    )
    restart_vary: str = field(
        default="both",
        metadata={"help": "Random restart: which seed changes across trials: 'both', 'model' (init) or 'data' "
                  "(order)."},
    )
    restart_parallel: str = field(
        default="no",
        metadata={"help": "Random restart: 'no' (trials one after another in this process) or 'per_gpu' (one "
                  "subprocess per visible GPU, CUDA_VISIBLE_DEVICES set per trial)."},
    )
    restart_stop_at_step: Optional[int] = field(
        default=None,
        metadata={"help": "Stop after this optimizer step, saving checkpoint-<step>, with the schedule still "
                  "built from max_steps. Set by the random-restart search on each trial."},
    )

    def __post_init__(self):
        from .restarts import restart_config_from_args

        restart_config_from_args(self)  # raises naming the restart_* field
        if self.restart_stop_at_step is not None:
            _check(isinstance(self.restart_stop_at_step, int) and self.restart_stop_at_step >= 1,
                   "restart_stop_at_step", self.restart_stop_at_step, "must be an integer >= 1 or null")
        if self.mfu_peak_tflops is not None:
            _check(self.mfu_peak_tflops > 0, "mfu_peak_tflops", self.mfu_peak_tflops, "must be > 0 or null")
        super().__post_init__()
