"""Model construction for recipes: a pretrained causal LM, or a decoder of any family built from scratch.

From scratch, :func:`hf_fasttrain.decoders.decoder_config` turns the ``model:`` section (family + sizes)
into the family's config, and :func:`build_model` builds it with ``AutoModelForCausalLM.from_config``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._validation import ConfigError
from .decoders import (  # noqa: F401  (re-exported: the model-building names in one place)
    GATED_MLP_FAMILIES,
    check_model_config,
    check_model_type,
    decoder_config,
    default_intermediate_size,
)

if TYPE_CHECKING:
    from ._model_data_args import ModelArguments

__all__ = ["build_model", "decoder_config", "default_intermediate_size", "check_model_type", "check_model_config",
           "GATED_MLP_FAMILIES", "is_causal_lm"]


def is_causal_lm(model) -> bool:
    """Whether ``model`` is a causal language model, whose eval loss is a mean next-token cross-entropy (so
    ``exp(loss)`` is a perplexity). Any class of transformers' causal-LM mapping, or a wrapper such as a
    PEFT ``...ForCausalLM``, counts; a classifier or a regression head does not.

    ```python
    >>> import torch
    >>> is_causal_lm(torch.nn.Linear(2, 2))
    False
    ```
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    names = set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.values())
    for cls in type(model).__mro__:
        if cls.__name__ in names or cls.__name__.endswith(("ForCausalLM", "LMHeadModel")):
            return True
    return False


def build_model(model_args: "ModelArguments", tokenizer, block_size: int):
    """A causal LM whose vocabulary matches ``tokenizer`` and whose context covers ``block_size``."""
    from transformers import AutoModelForCausalLM

    if model_args.model_name_or_path:
        model = AutoModelForCausalLM.from_pretrained(
            model_args.model_name_or_path,
            trust_remote_code=model_args.trust_remote_code,
            attn_implementation=model_args.attn_implementation,
        )
        if model.get_input_embeddings().num_embeddings < len(tokenizer):
            model.resize_token_embeddings(len(tokenizer))
        return model
    n_positions = model_args.n_positions or block_size
    if n_positions < block_size:
        raise ConfigError("n_positions", n_positions, allowed=f"must be >= data block_size={block_size}")
    eos = tokenizer.eos_token_id
    config = decoder_config(
        model_args.model_type,
        vocab_size=len(tokenizer),
        num_hidden_layers=model_args.n_layer,
        num_attention_heads=model_args.n_head,
        hidden_size=model_args.n_embd,
        max_position_embeddings=n_positions,
        num_key_value_heads=model_args.num_key_value_heads,
        intermediate_size=model_args.intermediate_size,
        dropout=model_args.dropout,
        extra=model_args.model_config,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else eos,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    return AutoModelForCausalLM.from_config(config, attn_implementation=model_args.attn_implementation)
