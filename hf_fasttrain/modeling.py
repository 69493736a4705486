"""Model construction for recipes: a pretrained causal LM, or a GPT-2 from scratch."""

from __future__ import annotations

from .args import ModelArguments

__all__ = ["build_model"]


def build_model(model_args: ModelArguments, tokenizer, block_size: int):
    """A causal LM whose vocabulary matches ``tokenizer`` and whose context covers ``block_size``."""
    from transformers import AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

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
        raise ValueError(f"n_positions={n_positions} is invalid: must be >= data block_size={block_size}")
    config = GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=n_positions,
        n_embd=model_args.n_embd,
        n_layer=model_args.n_layer,
        n_head=model_args.n_head,
        resid_pdrop=model_args.dropout,
        embd_pdrop=model_args.dropout,
        attn_pdrop=model_args.dropout,
        bos_token_id=tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        attn_implementation=model_args.attn_implementation,
    )
    return GPT2LMHeadModel(config)
