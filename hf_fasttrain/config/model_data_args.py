"""The ``model:`` and ``data:`` sections of a recipe: ``ModelArguments`` (the decoder to train) and
``DataArguments`` (the text, the tokenizer, how it is cut).

The training section is ``FastTrainingArguments`` (:mod:`hf_fasttrain.config.args`, which re-exports both classes).
As there, every field carries its ``--help`` text in ``metadata={"help": ...}``, is a recipe key under its
section and a ``--<field>`` flag, and a bad value raises a ``ConfigError`` naming the field when the object
is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..validation import ConfigError
from ..validation import check as _check
from .decoders import check_model_config, check_model_type

__all__ = ["ModelArguments", "DataArguments", "SIZE_ALIASES", "SIZE_DEFAULTS", "DATA_FORMATS"]

DATA_FORMATS = ("text", "prompt_completion", "messages")  # DataArguments.data_format


# Size keys of the model: section under both spellings: GPT-2's (n_layer) = the common HF name (num_hidden_layers).
SIZE_ALIASES: dict[str, str] = {"n_layer": "num_hidden_layers", "n_head": "num_attention_heads", "n_embd": "hidden_size"}
SIZE_DEFAULTS: dict[str, int] = {"n_layer": 12, "n_head": 12, "n_embd": 768}  # GPT-2 small


# the `peft:` section of a recipe: these ModelArguments fields (lora_r first)
PEFT_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules", "lora_modules_to_save", "lora_use_dora",
               "lora_merge", "lora_load_in_4bit")
_PEFT_DEFAULTS = {"lora_r": None, "lora_alpha": None, "lora_dropout": 0.0, "lora_target_modules": "all-linear",
                  "lora_modules_to_save": None, "lora_use_dora": False, "lora_merge": False, "lora_load_in_4bit": False}


@dataclass
class ModelArguments:
    """The ``model:`` section of a recipe: a pretrained checkpoint, or a decoder built from scratch.

    From scratch, ``model_type`` picks the family (``gpt2``, ``llama``, ``qwen2``, ``mistral`` or any
    type ``transformers.AutoConfig.for_model`` knows) and the size keys set its shape; each size key
    has two spellings that mean the same thing, GPT-2's and the common Hugging Face one
    (``n_layer`` = ``num_hidden_layers``, ``n_head`` = ``num_attention_heads``, ``n_embd`` =
    ``hidden_size``). Any other attribute of the family's config goes in ``model_config``.
    """

    model_name_or_path: Optional[str] = field(
        default=None,
        metadata={"help": "Hub name or local path of a pretrained causal LM to start from. "
                  "Default: a decoder built from scratch (model_type) with the sizes below."},
    )
    model_type: str = field(
        default="gpt2",
        metadata={"help": "Family of the decoder built from scratch: gpt2, llama, qwen2, mistral, or any "
                  "model type transformers.AutoConfig.for_model knows (built with "
                  "AutoModelForCausalLM.from_config)."},
    )
    n_layer: Optional[int] = field(default=None, metadata={"help": "Transformer blocks (= num_hidden_layers). Default 12."})
    n_head: Optional[int] = field(
        default=None, metadata={"help": "Attention (query) heads per block (= num_attention_heads); must divide "
                                "n_embd. Default 12."})
    n_embd: Optional[int] = field(default=None, metadata={"help": "Hidden size (= hidden_size). Default 768."})
    num_hidden_layers: Optional[int] = field(default=None, metadata={"help": "Same as n_layer."})
    num_attention_heads: Optional[int] = field(default=None, metadata={"help": "Same as n_head."})
    hidden_size: Optional[int] = field(default=None, metadata={"help": "Same as n_embd."})
    num_key_value_heads: Optional[int] = field(
        default=None,
        metadata={"help": "Key/value heads (grouped-query attention; families that have it, e.g. llama, "
                  "qwen2, mistral); must divide n_head. Default: n_head (plain multi-head attention)."},
    )
    intermediate_size: Optional[int] = field(
        default=None,
        metadata={"help": "Width of the MLP's hidden layer (GPT-2: n_inner). Default: 4 x hidden size, or for "
                  "gated (SwiGLU) families such as llama, qwen2, mistral 8/3 x hidden size rounded up to a "
                  "multiple of 64 (the same parameter count)."},
    )
    n_positions: Optional[int] = field(
        default=None, metadata={"help": "Maximum positions (= max_position_embeddings). Default: the data's block_size."}
    )
    dropout: float = field(
        default=0.0,
        metadata={"help": "Dropout on residual, embedding and attention (0 is usual for pretraining)."},
    )
    model_config: dict | str | None = field(
        default=None,
        metadata={"help": "Other attributes of the family's config, a mapping (YAML) or a JSON string (CLI), e.g. "
                  "'{\"rope_theta\": 10000, \"tie_word_embeddings\": true}'; a name the family's config does "
                  "not have is refused."},
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
    # --- LoRA adapters with peft (recipe section `peft:`; needs `pip install peft`) -------------------
    lora_r: Optional[int] = field(
        default=None,
        metadata={"help": "LoRA rank: train low-rank adapters (peft) on the frozen model_name_or_path instead "
                  "of every weight; checkpoints and the final output hold the adapter only "
                  "(PeftModel.from_pretrained loads it). Default: null, full training."},
    )
    lora_alpha: Optional[float] = field(
        default=None, metadata={"help": "LoRA scale numerator (the update is scaled by alpha / r). Default: 2 x lora_r."})
    lora_dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA branch's input."})
    lora_target_modules: str = field(
        default="all-linear",
        metadata={"help": "Modules that get adapters: 'all-linear' (every linear layer but the output head; "
                  "GPT-2's Conv1D included) or comma-separated module names, e.g. 'q_proj,v_proj'."},
    )
    lora_modules_to_save: Optional[str] = field(
        default=None,
        metadata={"help": "Comma-separated modules trained in full beside the adapters and saved with them "
                  "(e.g. 'lm_head'; on a base whose head is tied to its input embedding, as GPT-2's, that one matrix "
                  "trains and stays tied). Default: none."},
    )
    lora_use_dora: bool = field(
        default=False, metadata={"help": "DoRA (weight-decomposed LoRA, Liu et al. 2024) instead of plain LoRA."})
    lora_merge: bool = field(
        default=False,
        metadata={"help": "Also write the base with the adapter merged in (a plain from_pretrained model) to "
                  "output_dir/merged after training."},
    )
    lora_load_in_4bit: bool = field(
        default=False,
        metadata={"help": "QLoRA: load the base in 4 bits (NF4, bitsandbytes) and train LoRA adapters on it. "
                  "Needs a CUDA GPU and bitsandbytes."},
    )

    def __post_init__(self):
        # one value per size: either spelling (both only when they agree), else GPT-2 small's
        for short, long in SIZE_ALIASES.items():
            a, b = getattr(self, short), getattr(self, long)
            if a is not None and b is not None and a != b:
                raise ConfigError(short, a, problem=f"got {a!r}, but {long} got {b!r}",
                                  allowed=f"they are the same setting: give one of {short}, {long}")
            value = a if a is not None else b if b is not None else SIZE_DEFAULTS[short]
            _check(isinstance(value, int) and not isinstance(value, bool) and value >= 1,
                   short if a is not None else long, value, "must be a positive integer")
            setattr(self, short, value)
            setattr(self, long, value)
        _check(self.n_embd % self.n_head == 0, "n_head", self.n_head,
               f"must divide n_embd={self.n_embd}")
        if self.num_key_value_heads is not None:
            _check(isinstance(self.num_key_value_heads, int) and self.num_key_value_heads >= 1
                   and self.n_head % self.num_key_value_heads == 0, "num_key_value_heads",
                   self.num_key_value_heads, f"must be a positive integer dividing n_head={self.n_head}")
        if self.intermediate_size is not None:
            _check(isinstance(self.intermediate_size, int) and self.intermediate_size >= 1, "intermediate_size",
                   self.intermediate_size, "must be a positive integer or null")
        if self.n_positions is not None:
            _check(isinstance(self.n_positions, int) and self.n_positions >= 1, "n_positions",
                   self.n_positions, "must be a positive integer or null")
        _check(0.0 <= self.dropout < 1.0, "dropout", self.dropout, "must be in [0, 1)")
        _check(self.attn_implementation in ("sdpa", "eager", "flash_attention_2"), "attn_implementation",
               self.attn_implementation, "allowed: 'sdpa', 'eager', 'flash_attention_2'")
        if self.model_config is None:
            self.model_config = {}
        if isinstance(self.model_config, str):  # from the command line: --model_config '{"rope_theta": 1e4}'
            import json

            try:
                self.model_config = json.loads(self.model_config)
            except ValueError:
                pass
        _check(isinstance(self.model_config, dict), "model_config", self.model_config,
               "must be a mapping of config attribute names to values (a JSON object on the command line)")
        if not self.model_name_or_path:
            check_model_type(self.model_type)
            check_model_config(self.model_type, self.model_config)
        self._check_lora()

    def _check_lora(self) -> None:
        if self.lora_r is None:
            for name in PEFT_FIELDS[1:]:  # every LoRA option but the rank needs the rank
                if getattr(self, name) != _PEFT_DEFAULTS[name]:
                    raise ConfigError(name, getattr(self, name), allowed="set lora_r (the LoRA rank) to train adapters")
            return
        _check(isinstance(self.lora_r, int) and not isinstance(self.lora_r, bool) and self.lora_r >= 1, "lora_r",
               self.lora_r, "must be a positive integer (typical: 8-64) or null")
        _check(bool(self.model_name_or_path), "lora_r", self.lora_r,
               "trains adapters on a pretrained base: set model_name_or_path (or lora_r: null to train from scratch)")
        if self.lora_alpha is None:
            self.lora_alpha = 2.0 * self.lora_r
        _check(isinstance(self.lora_alpha, (int, float)) and self.lora_alpha > 0, "lora_alpha", self.lora_alpha,
               "must be a number > 0")
        _check(isinstance(self.lora_dropout, (int, float)) and 0.0 <= self.lora_dropout < 1.0, "lora_dropout",
               self.lora_dropout, "must be in [0, 1)")
        _check(isinstance(self.lora_target_modules, str) and bool(self.lora_target_modules.strip()),
               "lora_target_modules", self.lora_target_modules, "'all-linear' or comma-separated module names")

    def lora_modules(self) -> tuple[str | list[str], Optional[list[str]]]:
        """(target_modules, modules_to_save) as peft's LoraConfig takes them."""
        def names(text):
            return [n.strip() for n in text.split(",") if n.strip()]

        target = self.lora_target_modules.strip()
        return (target if target == "all-linear" else names(target),
                names(self.lora_modules_to_save) if self.lora_modules_to_save else None)


@dataclass
class DataArguments:
    """The ``data:`` section of a recipe: which text, which tokenizer, how it is cut.

    With ``dataset`` unset the run trains on the embedded corpus (this Python's standard library sources)
    with a byte-level BPE tokenizer trained on it and cached; both work offline.

    Example:
        ```python
        >>> from hf_fasttrain import DataArguments
        >>> DataArguments(vocab_size=4096, block_size=128).dataset is None  # the embedded corpus
        True
        ```
    """

    dataset: Optional[str] = field(
        default=None,
        metadata={"help": "The text to train on: a file, comma list, glob or folder of .parquet, .csv, .tsv, .arrow, "
                  ".json, .jsonl or .txt files (text formats also .gz/.zst), a save_to_disk folder, a folder "
                  "written by `hf-fasttrain tokenize`, a nanoGPT data folder (train.bin, val.bin, meta.pkl), or a "
                  "Hub dataset name. Default: the embedded corpus (this Python's stdlib sources; works offline)."},
    )
    dataset_config: Optional[str] = field(default=None, metadata={"help": "Hub dataset config name."})
    dataset_split: Optional[str] = field(
        default=None, metadata={"help": "Train on this split only (e.g. 'train'); the validation split is then cut "
                                "from it. Default: the source's train split, and its validation split when it has one."})
    dataset_revision: Optional[str] = field(
        default=None, metadata={"help": "Hub dataset revision (branch, tag or commit)."})
    data_files: Optional[str] = field(
        default=None, metadata={"help": "Files of a Hub or local dataset to load, passed to datasets.load_dataset "
                                "(comma-separated patterns, e.g. 'data/train-0000*.parquet')."})
    data_dir: Optional[str] = field(
        default=None, metadata={"help": "Folder of a Hub or local dataset to load (datasets.load_dataset data_dir)."})
    text_column: str = field(
        default="text", metadata={"help": "Column holding the raw text. A dataset with an input_ids column and "
                                  "no text column is taken as pre-tokenized rows."})
    tokenizer: Optional[str] = field(
        default=None,
        metadata={"help": "A save_pretrained folder, a tokenizer.json file (or a folder holding one), a folder "
                  "with vocab.json + merges.txt, a Hub name, or 'char' (the characters of a text file, as nanoGPT's "
                  "shakespeare_char). Default: a byte-level BPE trained on the train split and cached (see "
                  "vocab_size); for a `hf-fasttrain tokenize` folder or a nanoGPT folder, its own tokenizer."},
    )
    vocab_size: int = field(
        default=8192, metadata={"help": "Vocabulary size of the trained BPE tokenizer (no tokenizer given), an "
                                "integer >= 260: 256 byte tokens plus the specials."}
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
    streaming: bool = field(
        default=False,
        metadata={"help": "Read the dataset as a stream (Hub names and local files): documents are tokenized and "
                  "packed into rows of block_size as training needs them, split across ranks and dataloader "
                  "workers, and a resume restarts at the saved position without re-reading. Needs max_steps. "
                  "Evaluation uses the validation split, else the first max_eval_samples rows (default 64), "
                  "whose documents are kept out of training."},
    )
    shuffle_buffer: int = field(
        default=0,
        metadata={"help": "Streaming: documents per shuffle window; each window is permuted with the data seed "
                  "(a resume reads one window again, not the stream before it). 0 keeps the file order."},
    )
    # -- fine-tuning (hf_fasttrain.data.sft): one example per row instead of concatenated text --------------
    data_format: str = field(
        default="text",
        metadata={"help": "'text': pretraining rows (documents concatenated and cut into block_size tokens). "
                  "'prompt_completion' or 'messages': supervised fine-tuning, one example per row cut at "
                  "block_size tokens, from prompt/completion columns or chat turns (rendered with the "
                  "tokenizer's chat template, else a plain '<|role|>' template); the tokenizer is the "
                  "model's (model_name_or_path) unless tokenizer is set. 'embedded:functions' is an offline "
                  "set (stdlib signatures + docstrings -> bodies)."},
    )
    prompt_column: str = field(default="prompt", metadata={"help": "Column of the prompts (data_format='prompt_completion')."})
    completion_column: str = field(
        default="completion", metadata={"help": "Column of the completions (data_format='prompt_completion')."})
    messages_column: str = field(
        default="messages", metadata={"help": "Column of the chat turns, lists of {role, content} (data_format='messages')."})
    completion_only_loss: bool = field(
        default=True,
        metadata={"help": "Fine-tuning: train on the completion (assistant) tokens only, labels -100 on the "
                  "prompt. false: on every token."},
    )

    def __post_init__(self):
        _check(isinstance(self.vocab_size, int) and self.vocab_size >= 260, "vocab_size", self.vocab_size,
               "must be an integer >= 260 (256 byte tokens plus specials)")
        _check(isinstance(self.block_size, int) and self.block_size >= 2, "block_size", self.block_size,
               "must be an integer >= 2")
        _check(0.0 < self.validation_fraction < 1.0, "validation_fraction", self.validation_fraction,
               "must be in (0, 1)")
        _check(isinstance(self.streaming, bool), "streaming", self.streaming, "must be true or false")
        _check(isinstance(self.shuffle_buffer, int) and not isinstance(self.shuffle_buffer, bool)
               and self.shuffle_buffer >= 0, "shuffle_buffer", self.shuffle_buffer,
               "must be an integer >= 0 (documents per shuffle window; 0 keeps the file order)")
        _check(self.shuffle_buffer == 0 or self.streaming, "shuffle_buffer", self.shuffle_buffer,
               "only used with streaming: true (map-style data is shuffled whole)")
        _check(self.data_format in DATA_FORMATS, "data_format", self.data_format,
               f"allowed: {', '.join(repr(f) for f in DATA_FORMATS)}")
        _check(isinstance(self.completion_only_loss, bool), "completion_only_loss", self.completion_only_loss,
               "must be true or false")
        _check(not (self.streaming and self.data_format != "text"), "streaming", self.streaming,
               f"streams hold pretraining text only (data_format 'text'), not data_format={self.data_format!r}")
        for name in ("max_corpus_files", "max_train_samples", "max_eval_samples", "preprocessing_num_workers"):
            v = getattr(self, name)
            if v is not None:
                _check(isinstance(v, int) and v >= 1, name, v, "must be a positive integer or null")
        for name in ("dataset", "dataset_config", "dataset_split", "dataset_revision", "data_dir", "tokenizer"):
            v = getattr(self, name)
            _check(v is None or isinstance(v, str) and v.strip() != "", name, v, "must be a non-empty string or null")
        if isinstance(self.data_files, (list, tuple)):  # a YAML list: the same as the comma-separated string
            self.data_files = ",".join(str(f) for f in self.data_files)
        _check(self.data_files is None or isinstance(self.data_files, str) and self.data_files.strip() != "",
               "data_files", self.data_files, "must be a comma-separated string (or a YAML list) of files or patterns")
