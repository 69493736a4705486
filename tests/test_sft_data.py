"""Fine-tuning data: prompt/completion and chat formats, completion-only label masks, one-line errors."""

import copy

import datasets
import jinja2
import pytest
import torch

from hf_fasttrain.data.sft import (
    IGNORE_INDEX,
    PLAIN_CHAT_TEMPLATE,
    CompletionCollator,
    SFTDataError,
    chat_segments,
    completion_only_example,
    completion_token_count,
    detect_sft_format,
    plain_chat_segments,
    segments_example,
    tokenize_sft,
)

M = IGNORE_INDEX


class CharTokenizer:
    """One token per character (its code point); EOS is id 1. Exact ids make exact label masks."""

    eos_token = "<e>"
    eos_token_id = 1
    pad_token_id = 0

    def __init__(self, chat_template=None):
        self.chat_template = chat_template

    def __call__(self, text, add_special_tokens=False, return_attention_mask=False):
        ids, i = [], 0
        while i < len(text):
            if text.startswith(self.eos_token, i):
                ids.append(self.eos_token_id)
                i += len(self.eos_token)
            else:
                ids.append(ord(text[i]))
                i += 1
        return {"input_ids": ids}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return jinja2.Template(self.chat_template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                                          eos_token=self.eos_token)


def ids(text):
    return CharTokenizer()(text)["input_ids"]


CHAT = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q1"}, {"role": "assistant", "content": "A1"},
        {"role": "user", "content": "Q2"}, {"role": "assistant", "content": "A2"}]


# -- prompt/completion ---------------------------------------------------------------------------
def test_completion_only_example_masks_the_prompt_and_trains_the_eos():
    assert completion_only_example([10, 11, 12], [20, 21], eos_token_id=1) == {
        "input_ids": [10, 11, 12, 20, 21, 1], "labels": [M, M, M, 20, 21, 1]}


@pytest.mark.parametrize("max_length, input_ids, labels", [
    (6, [10, 11, 12, 20, 21, 1], [M, M, M, 20, 21, 1]),
    (5, [10, 11, 12, 20, 21], [M, M, M, 20, 21]),  # cut at the right: the EOS goes first
    (3, [10, 11, 12], [M, M, M]),  # nothing left to train (tokenize_sft drops it)
])
def test_completion_only_example_cut_at_max_length(max_length, input_ids, labels):
    assert completion_only_example([10, 11, 12], [20, 21], 1, max_length) == {"input_ids": input_ids, "labels": labels}


def test_tokenize_sft_prompt_completion_exact_and_drops_untrainable_rows():
    ds = datasets.Dataset.from_dict({"prompt": ["ab", "abcdef"], "completion": ["XY", "Z"], "id": [0, 1]})
    out = tokenize_sft(ds, CharTokenizer(), max_length=5)
    assert out.column_names == ["input_ids", "labels"]
    assert out["input_ids"] == [[97, 98, 88, 89, 1]]  # "abcdef" fills max_length with prompt: dropped
    assert out["labels"] == [[M, M, 88, 89, 1]]
    assert completion_token_count(out) == 3


def test_tokenize_sft_custom_column_names_on_a_dataset_dict():
    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"q": ["a"], "a": ["b"]}),
                               "validation": datasets.Dataset.from_dict({"q": ["c"], "a": ["d"]})})
    out = tokenize_sft(dd, CharTokenizer(), prompt_column="q", completion_column="a")
    assert out["train"]["labels"] == [[M, 98, 1]]
    assert out["validation"]["input_ids"] == [[99, 100, 1]]


# -- chat ----------------------------------------------------------------------------------------
def test_plain_template_segments_multi_turn():
    assert plain_chat_segments(CHAT, "<e>") == [
        ("<|system|>\nS\n<|user|>\nQ1\n<|assistant|>\n", False), ("A1<e>", True),
        ("<|user|>\nQ2\n<|assistant|>\n", False), ("A2<e>", True)]


def test_plain_template_constant_renders_the_same_text():
    rendered = jinja2.Template(PLAIN_CHAT_TEMPLATE).render(messages=CHAT, eos_token="<e>", add_generation_prompt=False)
    assert rendered == "".join(text for text, _ in plain_chat_segments(CHAT, "<e>"))


def test_chat_without_template_labels_only_assistant_turns():
    out = tokenize_sft(datasets.Dataset.from_dict({"messages": [CHAT]}), CharTokenizer())
    row_ids, labels = out["input_ids"][0], out["labels"][0]
    text = "<|system|>\nS\n<|user|>\nQ1\n<|assistant|>\nA1<e><|user|>\nQ2\n<|assistant|>\nA2<e>"
    assert row_ids == ids(text)
    trained = [t for t, y in zip(row_ids, labels) if y != M]
    assert trained == ids("A1<e>A2<e>")
    first = text.index("A1")  # every position before the first answer is masked
    assert labels[:first] == [M] * first and labels[first:first + 3] == ids("A1<e>")


TEMPLATE = ("{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% if m['role'] == 'assistant' %}"
            "{{ eos_token }}{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")


def test_chat_template_is_used_when_the_tokenizer_has_one():
    tok = CharTokenizer(TEMPLATE)
    assert chat_segments(CHAT, tok) == [("[system]S[user]Q1[assistant]", False), ("A1<e>", True),
                                        ("[user]Q2[assistant]", False), ("A2<e>", True)]
    out = segments_example([(ids(t), trained) for t, trained in chat_segments(CHAT, tok)])
    assert [t for t, y in zip(out["input_ids"], out["labels"]) if y != M] == ids("A1<e>A2<e>")


def test_chat_template_on_a_real_tokenizer(tiny_tokenizer):
    tok = copy.deepcopy(tiny_tokenizer)
    tok.chat_template = TEMPLATE
    out = tokenize_sft(datasets.Dataset.from_dict({"messages": [CHAT[1:3]]}), tok)
    prompt = tok("[user]Q1[assistant]", add_special_tokens=False)["input_ids"]
    answer = tok("A1", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    assert out["input_ids"][0] == prompt + answer
    assert out["labels"][0] == [M] * len(prompt) + answer


def test_chat_template_that_rewrites_earlier_turns_is_refused():
    # numbers each turn from the end: adding a turn changes the earlier text
    tok = CharTokenizer("{% for m in messages %}{{ loop.revindex }}{{ m['content'] }}{% endfor %}")
    with pytest.raises(SFTDataError) as e:
        chat_segments(CHAT[1:], tok)
    msg = str(e.value)
    assert msg.startswith("chat_template: turn 1: the rendering of the earlier turns is not a prefix")
    assert "\n" not in msg and "prompt/completion columns" in msg


def test_chat_template_render_error_is_one_line():
    tok = CharTokenizer("{{ raise_exception('roles must alternate') }}")
    tok.apply_chat_template = lambda *a, **k: (_ for _ in ()).throw(jinja2.TemplateError("roles must alternate\nmore"))
    with pytest.raises(SFTDataError, match=r"^chat_template: rendering failed: roles must alternate; use a tokenizer"):
        chat_segments(CHAT, tok)


@pytest.mark.parametrize("messages, problem", [
    ("hello", "messages: got str 'hello'"),
    ([{"role": "user", "content": "hi"}], "messages: no 'assistant' turn among roles ['user']"),
    ([{"role": "user"}, {"role": "assistant", "content": "x"}], "messages: turn 0 is \"{'role': 'user'}\""),
])
def test_bad_messages_are_refused_in_one_line(messages, problem):
    with pytest.raises(SFTDataError) as e:
        chat_segments(messages, CharTokenizer())
    assert str(e.value).startswith(problem + "; each example needs a list of")
    assert "\n" not in str(e.value)


# -- format detection and errors -----------------------------------------------------------------
@pytest.mark.parametrize("columns, fmt", [
    (["prompt", "completion"], "prompt_completion"), (["messages", "prompt"], "messages"), (["messages"], "messages"),
])
def test_detect_sft_format(columns, fmt):
    assert detect_sft_format(columns) == fmt


def test_missing_column_error_names_the_field_and_the_columns():
    with pytest.raises(SFTDataError) as e:
        detect_sft_format(["prompt", "text"])
    assert str(e.value) == ("completion_column: column 'completion' is not in the dataset (columns: ['prompt', 'text']); "
                            "fine-tuning data needs 'prompt' and 'completion' string columns, or a 'messages' column of "
                            "chat turns; name them with prompt_column, completion_column or messages_column")
    with pytest.raises(SFTDataError, match=r"^prompt_column: column 'question' is not in the dataset"):
        detect_sft_format(["text"], prompt_column="question")
    assert e.value.field == "completion_column"


def test_non_text_prompt_is_refused():
    with pytest.raises(SFTDataError, match=r"^prompt_column: column 'prompt' holds int, not text; "):
        tokenize_sft(datasets.Dataset.from_dict({"prompt": [3], "completion": ["x"]}), CharTokenizer())


# -- collator ------------------------------------------------------------------------------------
def test_completion_collator_pads_right_with_masked_labels():
    batch = CompletionCollator(pad_token_id=0, pad_to_multiple_of=4)(
        [{"input_ids": [5, 6, 7], "labels": [M, 6, 7]}, {"input_ids": [8, 9], "labels": [M, 9]}])
    assert batch["input_ids"].tolist() == [[5, 6, 7, 0], [8, 9, 0, 0]]
    assert batch["labels"].tolist() == [[M, 6, 7, M], [M, 9, M, M]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0], [1, 1, 0, 0]]
    assert batch["labels"].dtype == torch.long


def test_loss_is_over_completion_tokens_only():
    """A model's loss on a collated batch equals the mean over completion tokens: prompt tokens do not count."""
    from tests.conftest import make_tiny_gpt2

    model = make_tiny_gpt2(vocab_size=130, n_positions=16).eval()
    rows = [completion_only_example(ids("abc"), ids("de"), 1), completion_only_example(ids("x"), ids("yz"), 1)]
    batch = CompletionCollator(0)(rows)
    with torch.no_grad():
        loss = model(**batch).loss
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    targets = batch["labels"][:, 1:]
    logp = torch.log_softmax(logits[:, :-1], -1)
    keep = targets != M
    expected = -logp[keep].gather(-1, targets[keep][:, None]).mean()
    assert keep.sum().item() == 6  # "de<e>" and "yz<e>"
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
