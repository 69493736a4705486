"""Supervised fine-tuning data: prompt/completion pairs or chat messages -> ``input_ids`` and ``labels``.

Two formats, picked from the dataset's columns (:func:`detect_sft_format`):

- **prompt/completion**: two string columns (``prompt_column``, ``completion_column``). The example is the
  prompt's tokens, then the completion's, then EOS.
- **chat messages**: one column (``messages_column``) holding a list of ``{"role", "content"}`` turns. With a
  tokenizer that has a chat template, each turn is rendered by the template; without one, by
  :data:`PLAIN_CHAT_TEMPLATE` (``<|role|>`` on its own line, the content, a newline; each assistant turn
  ends with the EOS token instead of the newline).

Labels are completion-only: -100 on every prompt token (the system and user turns and the template's
markup, for chat), the token id on every completion token (each assistant turn's content and the EOS that
ends it), so the loss and the gradient come from the completions alone. Prompt and completion are
tokenized apart and concatenated, so the boundary is exact whatever the tokenizer merges.

Examples longer than ``max_length`` are cut at the right; an example left with no completion token is
dropped (:func:`tokenize_sft` counts them). :class:`CompletionCollator` pads a batch on the right (labels
with -100), so the Trainer's padding, token-budget batching and row packing all train on the same labels.

A problem with the data (a missing column, a turn that is not a ``{"role", "content"}`` mapping, a chat
template that does not render the conversation as a prefix of itself) raises :class:`SFTDataError`, whose
message is one line: ``<field>: <what is wrong>; <what is allowed>``.

Example:
    >>> from hf_fasttrain.data.sft import completion_only_example
    >>> completion_only_example([5, 6], [7, 8], eos_token_id=0)
    {'input_ids': [5, 6, 7, 8, 0], 'labels': [-100, -100, 7, 8, 0]}
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

import torch

from ..validation import ConfigError

__all__ = [
    "IGNORE_INDEX",
    "SFT_FORMATS",
    "PLAIN_CHAT_TEMPLATE",
    "SFTDataError",
    "detect_sft_format",
    "completion_only_example",
    "plain_chat_segments",
    "chat_segments",
    "segments_example",
    "tokenize_sft",
    "CompletionCollator",
    "completion_token_count",
]

IGNORE_INDEX = -100
SFT_FORMATS = ("prompt_completion", "messages")
#: The template used when the tokenizer has none (documented; a Jinja chat template that renders the same).
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}{{ eos_token }}{% else %}\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


class SFTDataError(ConfigError):
    """Fine-tuning data that cannot be used: ``<field>: <what is wrong>; <what is allowed>`` (one line)."""


def detect_sft_format(columns: Iterable[str], prompt_column: str = "prompt", completion_column: str = "completion",
                      messages_column: str = "messages") -> str:
    """``"messages"`` when the chat column is there, else ``"prompt_completion"`` when both of those are.

    >>> detect_sft_format(["prompt", "completion", "id"])
    'prompt_completion'
    >>> detect_sft_format(["messages"])
    'messages'
    """
    columns = list(columns)
    if messages_column in columns:
        return "messages"
    missing = [c for c in (prompt_column, completion_column) if c not in columns]
    if not missing:
        return "prompt_completion"
    field = "completion_column" if missing == [completion_column] else "prompt_column"
    raise SFTDataError(field, problem=f"column {missing[0]!r} is not in the dataset (columns: {columns})",
                       allowed=f"fine-tuning data needs '{prompt_column}' and '{completion_column}' string columns, "
                               f"or a '{messages_column}' column of chat turns; name them with prompt_column, "
                               "completion_column or messages_column")


def completion_only_example(prompt_ids: Sequence[int], completion_ids: Sequence[int], eos_token_id: Optional[int],
                            max_length: Optional[int] = None) -> dict[str, list[int]]:
    """``prompt + completion + [eos]`` with labels -100 on the prompt; cut at the right to ``max_length``.

    >>> completion_only_example([1, 2, 3], [4, 5], eos_token_id=9, max_length=4)
    {'input_ids': [1, 2, 3, 4], 'labels': [-100, -100, -100, 4]}
    """
    completion = list(completion_ids) + ([eos_token_id] if eos_token_id is not None else [])
    return segments_example([(list(prompt_ids), False), (completion, True)], max_length)


def segments_example(segments: Sequence[tuple[Sequence[int], bool]], max_length: Optional[int] = None
                     ) -> dict[str, list[int]]:
    """Concatenate token segments ``(ids, trained)``; labels are the ids where ``trained``, else -100.

    >>> segments_example([([1], False), ([2, 3], True), ([4], False), ([5], True)])
    {'input_ids': [1, 2, 3, 4, 5], 'labels': [-100, 2, 3, -100, 5]}
    """
    input_ids: list[int] = []
    labels: list[int] = []
    for ids, trained in segments:
        input_ids += list(ids)
        labels += list(ids) if trained else [IGNORE_INDEX] * len(ids)
    if max_length is not None:
        input_ids, labels = input_ids[:max_length], labels[:max_length]
    return {"input_ids": input_ids, "labels": labels}


def _check_messages(messages: Any, field: str) -> list[Mapping[str, str]]:
    allowed = "each example needs a list of {'role': ..., 'content': <string>} turns with at least one 'assistant' turn"
    if not isinstance(messages, (list, tuple)) or not messages:
        raise SFTDataError(field, messages if not isinstance(messages, (list, tuple)) else [],
                           allowed, problem=f"got {type(messages).__name__} {str(messages)[:60]!r}")
    for i, m in enumerate(messages):
        if not (isinstance(m, Mapping) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise SFTDataError(field, problem=f"turn {i} is {str(m)[:60]!r}", allowed=allowed)
    if not any(m["role"] == "assistant" for m in messages):
        raise SFTDataError(field, problem=f"no 'assistant' turn among roles {[m['role'] for m in messages]}",
                           allowed=allowed)
    return list(messages)


def plain_chat_segments(messages: Sequence[Mapping[str, str]], eos_token: str) -> list[tuple[str, bool]]:
    """The conversation as ``(text, trained)`` pieces under :data:`PLAIN_CHAT_TEMPLATE`.

    >>> plain_chat_segments([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}], "<e>")
    [('<|user|>\\nhi\\n<|assistant|>\\n', False), ('yo<e>', True)]
    """
    out: list[tuple[str, bool]] = []
    prompt = ""
    for m in messages:
        if m["role"] == "assistant":
            out.append((prompt + "<|assistant|>\n", False))
            out.append((m["content"] + eos_token, True))
            prompt = ""
        else:
            prompt += f"<|{m['role']}|>\n{m['content']}\n"
    if prompt:
        out.append((prompt, False))
    return [(t, trained) for t, trained in out if t]


def chat_segments(messages: Sequence[Mapping[str, str]], tokenizer, field: str = "messages") -> list[tuple[str, bool]]:
    """The conversation as ``(text, trained)`` pieces: each assistant turn's rendering is trained, the rest not.

    With the tokenizer's chat template, the text before assistant turn ``i`` is the rendering of
    ``messages[:i]`` with the generation prompt, and the turn is what ``messages[:i+1]`` adds to it; a
    template for which that is not a prefix (it rewrites earlier turns) raises :class:`SFTDataError`.
    Without a chat template: :func:`plain_chat_segments`.
    """
    messages = _check_messages(messages, field)
    template = getattr(tokenizer, "chat_template", None)
    if not template:
        return plain_chat_segments(messages, tokenizer.eos_token or "")

    def render(turns, gen):
        try:
            return tokenizer.apply_chat_template(list(turns), tokenize=False, add_generation_prompt=gen)
        except Exception as exc:  # jinja errors, templates that raise on a role order
            msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise SFTDataError("chat_template", problem=f"rendering failed: {msg}",
                               allowed="use a tokenizer whose chat template renders these roles, or data without it "
                                       "(the plain template)") from None

    out: list[tuple[str, bool]] = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        before = render(messages[:i], True) if i else render([], True) if _renders_empty(render) else ""
        upto = render(messages[: i + 1], False)
        for prefix, whole in ((done, before), (before, upto)):
            if not whole.startswith(prefix):
                raise SFTDataError("chat_template", problem=f"turn {i}: the rendering of the earlier turns is not a "
                                   f"prefix of the rendering with this turn ({prefix[-40:]!r} vs {whole[:80]!r})",
                                   allowed="completion-only labels need a template that appends each turn; use one "
                                           "that does, or prompt/completion columns")
        out.append((before[len(done):], False))
        out.append((upto[len(before):], True))
        done = upto
    full = render(messages, False)
    if len(full) > len(done):
        out.append((full[len(done):], False))
    return [(t, trained) for t, trained in out if t]


def _renders_empty(render) -> bool:
    try:
        render([], True)
        return True
    except SFTDataError:
        return False


def _tokenize_text(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False, return_attention_mask=False)["input_ids"] if text else []


def tokenize_sft(dataset, tokenizer, max_length: Optional[int] = None, prompt_column: str = "prompt",
                 completion_column: str = "completion", messages_column: str = "messages",
                 completion_only: bool = True, num_proc: Optional[int] = None):
    """A ``datasets.Dataset`` (or ``DatasetDict``) of prompt/completion or chat rows -> ``input_ids``/``labels``.

    Every original column is removed; examples left with no trained token after the cut at ``max_length``
    are dropped. The EOS of a prompt/completion example is the tokenizer's ``eos_token_id``. With
    ``completion_only=False`` every token is trained (labels = ``input_ids``), prompts included.
    """
    splits = dataset.values() if hasattr(dataset, "keys") else [dataset]
    columns = next(iter(splits)).column_names
    fmt = detect_sft_format(columns, prompt_column, completion_column, messages_column)
    eos = tokenizer.eos_token_id

    def one(row):
        out = _one(row)
        return out if completion_only else {"input_ids": out["input_ids"], "labels": list(out["input_ids"])}

    def _one(row):
        if fmt == "prompt_completion":
            for col in (prompt_column, completion_column):
                if not isinstance(row[col], str):
                    raise SFTDataError(f"{col}_column" if col in ("prompt", "completion") else col,
                                       problem=f"column {col!r} holds {type(row[col]).__name__}, not text",
                                       allowed="prompt and completion columns hold strings (use messages_column for "
                                               "chat turns)")
            return completion_only_example(_tokenize_text(tokenizer, row[prompt_column]),
                                           _tokenize_text(tokenizer, row[completion_column]), eos, max_length)
        pieces = chat_segments(row[messages_column], tokenizer, field=messages_column)
        return segments_example([(_tokenize_text(tokenizer, t), trained) for t, trained in pieces], max_length)

    tokenized = dataset.map(one, remove_columns=columns, num_proc=num_proc, desc="Tokenizing for fine-tuning")
    return tokenized.filter(lambda row: any(x != IGNORE_INDEX for x in row["labels"]), num_proc=num_proc,
                            desc="Dropping examples with no completion token")


def completion_token_count(dataset) -> int:
    """Tokens that carry a label (the completion tokens) in a tokenized fine-tuning dataset."""
    return sum(sum(1 for x in labels if x != IGNORE_INDEX) for labels in dataset["labels"])


class CompletionCollator:
    """Pads ``input_ids`` (with ``pad_token_id``), ``labels`` (with -100) and builds ``attention_mask``, on the right.

    Args:
        pad_token_id: id written into padded ``input_ids`` positions (never attended to, never trained on).
        pad_to_multiple_of: round the batch width up to a multiple of this (``None``: the longest example).

    Example:
        ```python
        >>> c = CompletionCollator(pad_token_id=0)
        >>> b = c([{"input_ids": [5, 6, 7], "labels": [-100, 6, 7]}, {"input_ids": [8], "labels": [8]}])
        >>> b["input_ids"].tolist(), b["labels"].tolist(), b["attention_mask"].tolist()
        ([[5, 6, 7], [8, 0, 0]], [[-100, 6, 7], [8, -100, -100]], [[1, 1, 1], [1, 0, 0]])
        ```
    """

    def __init__(self, pad_token_id: int, pad_to_multiple_of: Optional[int] = None):
        self.pad_token_id = pad_token_id
        self.pad_to_multiple_of = pad_to_multiple_of

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, torch.Tensor]:
        ids = [list(f["input_ids"]) for f in features]
        labels = [list(f.get("labels", f["input_ids"])) for f in features]
        width = max(len(x) for x in ids)
        if self.pad_to_multiple_of:
            width = -(-width // self.pad_to_multiple_of) * self.pad_to_multiple_of
        input_ids = torch.full((len(ids), width), self.pad_token_id, dtype=torch.long)
        out_labels = torch.full((len(ids), width), IGNORE_INDEX, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for r, (x, y) in enumerate(zip(ids, labels)):
            input_ids[r, : len(x)] = torch.tensor(x, dtype=torch.long)
            out_labels[r, : len(y)] = torch.tensor(y, dtype=torch.long)
            mask[r, : len(x)] = 1
        return {"input_ids": input_ids, "attention_mask": mask, "labels": out_labels}
