"""Model construction for recipes: a pretrained causal LM, or a decoder of any family built from scratch.

From scratch, :func:`hf_fasttrain.config.decoders.decoder_config` turns the ``model:`` section (family + sizes)
into the family's config, and :func:`build_model` builds it with ``AutoModelForCausalLM.from_config``.
"""

from __future__ import annotations

import inspect

from typing import TYPE_CHECKING

from .validation import ConfigError
from .config.decoders import (  # noqa: F401  (re-exported: the model-building names in one place)
    GATED_MLP_FAMILIES,
    check_model_config,
    check_model_type,
    decoder_config,
    default_intermediate_size,
)

if TYPE_CHECKING:
    from .config.model_data_args import ModelArguments

__all__ = ["build_model", "apply_lora", "merge_lora", "decoder_config", "default_intermediate_size", "check_model_type", "check_model_config",
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


def build_model(model_args: "ModelArguments", tokenizer, block_size: int, optimizer_kwargs=None):
    """A causal LM whose vocabulary matches ``tokenizer`` and whose context covers ``block_size``.

    Built from scratch with ``optimizer_kwargs`` setting ``parameterization: mup``, its hidden matrices get muP's
    initialisation (:func:`hf_fasttrain.transfer.mup_init_`); a pretrained model keeps its weights."""
    from transformers import AutoModelForCausalLM

    if model_args.model_name_or_path:
        extra = {}
        if model_args.lora_load_in_4bit:  # QLoRA: the frozen base in NF4 (run.train refuses it without CUDA)
            import torch
            from transformers import BitsAndBytesConfig

            extra["quantization_config"] = BitsAndBytesConfig(
                load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                bnb_4bit_compute_dtype=torch.bfloat16)
        model = AutoModelForCausalLM.from_pretrained(
            model_args.model_name_or_path,
            trust_remote_code=model_args.trust_remote_code,
            attn_implementation=model_args.attn_implementation,
            **extra,
        )
        if model.get_input_embeddings().num_embeddings < len(tokenizer):
            if model_args.lora_r is not None:  # new rows would stay untrained in a frozen embedding
                raise ConfigError("tokenizer", len(tokenizer), problem=f"the tokenizer has {len(tokenizer)} tokens, the "
                                  f"base {model_args.model_name_or_path!r} "
                                  f"{model.get_input_embeddings().num_embeddings} embeddings",
                                  allowed="the base's own tokenizer (leave data.tokenizer unset)")
            model.resize_token_embeddings(len(tokenizer))
        return apply_lora(model, model_args)
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
    model = AutoModelForCausalLM.from_config(config, attn_implementation=model_args.attn_implementation)
    if getattr(model, "loss_type", "") is None:  # GPT2LMHeadModel: the causal-LM loss it uses anyway, named
        model.loss_type = "ForCausalLM"
    from .transfer import transfer_options, mup_init_

    transfer = transfer_options(optimizer_kwargs)
    if transfer["parameterization"] == "mup":
        mup_init_(model, transfer["base_width"], transfer["width"])
    return model


def apply_lora(model, model_args: "ModelArguments"):
    """``model`` with LoRA adapters (peft) when ``model_args.lora_r`` is set, else ``model`` itself.

    The base is frozen; adapters go on ``lora_target_modules`` ('all-linear': every linear layer but the
    output head, GPT-2's Conv1D included, with peft's ``fan_in_fan_out`` set for it); ``lora_modules_to_save``
    train in full beside them. A 4-bit base (``lora_load_in_4bit``) is prepared for k-bit training first.
    """
    if model_args.lora_r is None:
        return model
    import peft

    if model_args.lora_load_in_4bit:
        model = peft.prepare_model_for_kbit_training(model)
    target, to_save = model_args.lora_modules()
    conv1d = _has_conv1d(model)
    extra = {}
    if (set(to_save or ()) & _tied_embedding_names(model)
            and "ensure_weight_tying" in inspect.signature(peft.LoraConfig).parameters):
        # a tied base stays tied: the head and the input embedding train as one copy (else peft unties them
        # and the merged model carries two matrices where the base had one)
        extra["ensure_weight_tying"] = True
    config = peft.LoraConfig(r=model_args.lora_r, lora_alpha=model_args.lora_alpha, lora_dropout=model_args.lora_dropout,
                             target_modules=target, modules_to_save=to_save, use_dora=model_args.lora_use_dora,
                             fan_in_fan_out=conv1d, task_type="CAUSAL_LM", **extra)
    try:
        return peft.get_peft_model(model, config)
    except ValueError as e:  # e.g. "Target modules {'q_proj'} not found in the base model"
        raise ConfigError("lora_target_modules", model_args.lora_target_modules,
                          problem=str(e).split("\n")[0], allowed="'all-linear' or names of the base's linear modules")


def merge_lora(model):
    """The base with the adapters merged in (peft's ``merge_and_unload``): a plain transformers model."""
    return model.merge_and_unload()


def _tied_embedding_names(model) -> set[str]:
    """Module names (full and last part) of the output head and input embedding when they share one matrix
    (``tie_word_embeddings``, GPT-2's default); empty otherwise."""
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None or head.weight is not embed.weight:
        return set()
    names = {n for n, m in model.named_modules() if m is head or m is embed}
    return names | {n.rsplit(".", 1)[-1] for n in names}


def _has_conv1d(model) -> bool:
    from transformers.pytorch_utils import Conv1D

    return any(isinstance(m, Conv1D) for m in model.modules())
