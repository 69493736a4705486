"""Data: sources (every format by path, pre-tokenized folders), the embedded corpus and tokenizer, samplers,
sequence-length scheduling, packing."""

from .corpus import build_prose_corpus, build_stdlib_corpus, load_text_datasets, tokenize_and_chunk, tokenize_documents
from .tokenizer import get_tokenizer, load_tokenizer
from .prepare import prepare_lm_data, pretokenize
from .sources import DataError, load_source, resolve_source
from .packing import PackedBatchSampler, PackedRowsCollator, pack_bins
from .samplers import CurriculumBatchSampler, LengthGroupedBatchSampler, add_length_column, get_lengths
from .seqlen import SeqLenWarmup, SeqLenWarmupCollator, set_batch_sequence_length, seq_len_at
from .token_budget import BatchWarmupBatchSampler, TokenBudgetBatchSampler

__all__ = [
    # sources: any format by path, pre-tokenized folders
    "DataError",
    "resolve_source",
    "load_source",
    "load_tokenizer",
    "prepare_lm_data",
    "pretokenize",
    "build_stdlib_corpus",
    "build_prose_corpus",
    "get_tokenizer",
    "load_text_datasets",
    "tokenize_and_chunk",
    "tokenize_documents",
    # sequence length
    "add_length_column",
    "get_lengths",
    "LengthGroupedBatchSampler",
    "TokenBudgetBatchSampler",
    "CurriculumBatchSampler",
    "BatchWarmupBatchSampler",
    "PackedBatchSampler",
    "PackedRowsCollator",
    "pack_bins",
    "SeqLenWarmup",
    "SeqLenWarmupCollator",
    "set_batch_sequence_length",
    "seq_len_at",
]
