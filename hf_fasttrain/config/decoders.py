"""Decoder configs of any family from one set of sizes: the pure part of building a model from scratch.

The size keys of a recipe's ``model:`` section have one meaning in every family; :func:`decoder_config`
translates them to the family's own attribute names (GPT-2's ``n_embd`` is Llama's ``hidden_size``) and
returns ``AutoConfig.for_model(model_type, ...)``. Other attributes pass through after
:func:`check_model_config` finds them in the family's config. No model is built here
(:func:`hf_fasttrain.modeling.build_model` does that).
"""

from __future__ import annotations

import difflib
import functools
import math
from typing import Any, Mapping, Optional

from ..validation import ConfigError

__all__ = ["decoder_config", "default_intermediate_size", "check_model_type", "check_model_config",
           "GATED_MLP_FAMILIES"]

# Families whose MLP is gated (SwiGLU/GeGLU: three matrices); their default MLP width is 8/3 of the
# hidden size, so an MLP has as many parameters as GPT-2's two matrices of 4x (Shazeer 2020).
GATED_MLP_FAMILIES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo", "olmo2",
    "phi3", "granite", "cohere", "smollm3", "glm", "helium", "ministral",
})

# canonical name -> the names families use for it (first one the family's config has wins)
_FAMILY_NAMES: dict[str, tuple[str, ...]] = {
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "multi_query_group_num"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"),
    "max_position_embeddings": ("max_position_embeddings", "n_positions", "max_seq_len"),
}
# the sizes have their own fields in the model: section; model_config is for everything else
_SIZE_FIELDS = {name for names in _FAMILY_NAMES.values() for name in names} | {"vocab_size"}
_DROPOUT_NAMES = ("resid_pdrop", "embd_pdrop", "attn_pdrop", "attention_dropout", "hidden_dropout",
                  "embedding_dropout", "dropout")


def _config_class(model_type: str):
    from transformers import CONFIG_MAPPING

    return CONFIG_MAPPING[model_type]


def check_model_type(model_type: str) -> None:
    """Raise unless ``model_type`` is a family ``AutoConfig.for_model`` knows and that has a causal-LM head."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if isinstance(model_type, str) and model_type in CONFIG_MAPPING and model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return
    known = sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    close = difflib.get_close_matches(str(model_type), known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError("model_type", model_type, allowed=f"a transformers model type with a causal-LM head, e.g. "
                      f"'gpt2', 'llama', 'qwen2', 'mistral' ({len(known)} known){hint}")


@functools.lru_cache(maxsize=None)
def _config_attributes(model_type: str) -> frozenset[str]:
    import inspect

    cls = _config_class(model_type)
    names = set(cls().to_dict()) | set(getattr(cls, "attribute_map", {}))
    names |= {p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "kwargs")}
    if "rope_parameters" in names:  # transformers 5 still takes the older spellings and converts them
        names |= {"rope_theta", "rope_scaling"}
    return frozenset(names)


def check_model_config(model_type: str, model_config: Mapping[str, Any]) -> None:
    """Raise if ``model_config`` names an attribute the family's config lacks, or a size key (those have
    their own fields in the ``model:`` section)."""
    known = _config_attributes(model_type)
    for key in model_config:
        if key in _SIZE_FIELDS:
            raise ConfigError(
                f"model_config.{key}", problem="a size, not a config attribute",
                allowed="sizes are model: section keys (n_layer/num_hidden_layers, n_head/num_attention_heads, "
                "n_embd/hidden_size, num_key_value_heads, intermediate_size, n_positions); the vocabulary size "
                "comes from the tokenizer")
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ConfigError(
                f"model_config.{key}", problem=f"{model_type} configs have no attribute {key!r}",
                allowed=f"{hint.lstrip('; ') + ' ' if hint else ''}"
                f"(known: {', '.join(sorted(k for k in known if not k.startswith('_')))})")


def default_intermediate_size(model_type: str, hidden_size: int) -> int:
    """MLP width when none is given: 4 x hidden, or 8/3 x hidden rounded up to a multiple of 64 for
    gated-MLP families (the same number of MLP parameters)."""
    if model_type in GATED_MLP_FAMILIES:
        return 64 * math.ceil(8 * hidden_size / 3 / 64)
    return 4 * hidden_size


def _family_name(canonical: str, attributes: set[str], attribute_map: Mapping[str, str]) -> Optional[str]:
    for name in _FAMILY_NAMES[canonical]:
        if name in attributes:
            return attribute_map.get(name, name)
    return None


def decoder_config(
    model_type: str,
    *,
    vocab_size: int,
    num_hidden_layers: int,
    num_attention_heads: int,
    hidden_size: int,
    max_position_embeddings: int,
    num_key_value_heads: Optional[int] = None,
    intermediate_size: Optional[int] = None,
    dropout: float = 0.0,
    extra: Optional[Mapping[str, Any]] = None,
    **token_ids: Any,
):
    """The family's config (``AutoConfig.for_model``) with the sizes under the family's own names.

    ``extra`` (the recipe's ``model_config``) is applied last; ``token_ids`` are ``bos_token_id`` etc.
    A size the family cannot express (GQA heads for GPT-2, dropout for a family without it) raises.

    Example:
        >>> cfg = decoder_config("llama", vocab_size=256, num_hidden_layers=2, num_attention_heads=4,
        ...                      hidden_size=64, max_position_embeddings=32, num_key_value_heads=2)
        >>> (cfg.num_hidden_layers, cfg.num_key_value_heads, cfg.intermediate_size, cfg.head_dim)
        (2, 2, 192, 16)
        >>> decoder_config("gpt2", vocab_size=256, num_hidden_layers=2, num_attention_heads=4,
        ...                hidden_size=64, max_position_embeddings=32).n_embd
        64
    """
    check_model_type(model_type)
    extra = dict(extra or {})
    check_model_config(model_type, extra)
    cls = _config_class(model_type)
    attributes = _config_attributes(model_type)
    amap = dict(getattr(cls, "attribute_map", {}))
    if intermediate_size is None:
        intermediate_size = default_intermediate_size(model_type, hidden_size)
    values = {
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "hidden_size": hidden_size,
        "max_position_embeddings": max_position_embeddings,
        "num_key_value_heads": num_key_value_heads,
        "intermediate_size": intermediate_size,
    }
    kwargs: dict[str, Any] = {"vocab_size": vocab_size}
    for canonical, value in values.items():
        name = _family_name(canonical, attributes, amap)
        if name is None:
            if canonical in ("num_key_value_heads",) and value is not None and value != num_attention_heads:
                raise ConfigError("num_key_value_heads", value, problem=f"got {value!r}, but model_type={model_type!r} "
                                  "has no grouped-query attention", allowed="use e.g. llama, qwen2, mistral, or null")
            if canonical in ("num_hidden_layers", "num_attention_heads", "hidden_size"):
                raise ConfigError("model_type", model_type, allowed=f"a decoder whose config has {canonical}")
            continue
        if value is not None:
            kwargs[name] = value
    if num_key_value_heads is None:
        name = _family_name("num_key_value_heads", attributes, amap)
        if name is not None:
            kwargs[name] = num_attention_heads  # plain multi-head attention, whatever the family's default
    drop = [n for n in _DROPOUT_NAMES if n in attributes]
    if dropout and not drop:
        raise ConfigError("dropout", dropout, allowed=f"0: model_type={model_type!r} has no dropout setting")
    kwargs.update({n: dropout for n in drop})
    kwargs.update({k: v for k, v in token_ids.items() if k in attributes})
    kwargs.update(extra)
    from transformers import AutoConfig

    return AutoConfig.for_model(model_type, **kwargs)
