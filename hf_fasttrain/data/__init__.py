"""Data: the embedded corpus and tokenizer, samplers, sequence-length scheduling, packing."""

from .corpus import (
    build_stdlib_corpus,
    get_tokenizer,
    load_text_datasets,
    tokenize_and_chunk,
    tokenize_documents,
)

__all__ = [
    "build_stdlib_corpus",
    "get_tokenizer",
    "load_text_datasets",
    "tokenize_and_chunk",
    "tokenize_documents",
]
