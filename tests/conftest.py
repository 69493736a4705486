"""Shared fixtures. Tests never touch the network and never write into the user's cache."""

import os
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One torch thread (here and in the runs the tests start): the models are too small for a second thread to share
# the work, and a waiting OpenMP thread spins, which costs CPU time for nothing.
if not os.environ.get("OMP_NUM_THREADS"):
    os.environ["OMP_NUM_THREADS"] = "1"
if "HF_FASTTRAIN_CACHE" not in os.environ:
    os.environ["HF_FASTTRAIN_CACHE"] = tempfile.mkdtemp(prefix="hf_fasttrain_test_cache_")
if "HF_DATASETS_CACHE" not in os.environ:
    os.environ["HF_DATASETS_CACHE"] = os.path.join(os.environ["HF_FASTTRAIN_CACHE"], "datasets")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))  # in case torch was imported before this file


def pytest_collection_finish(session):
    """Freeze what the imports made (torch, transformers, datasets: about half a million objects) out of the
    garbage collector's view. The Trainer runs a full ``gc.collect()`` at the start of every ``train()``, and a
    full collection walks every tracked object: a quarter of a CPU-second each time, for objects that live as
    long as the process. What the tests themselves make is collected as before."""
    import gc

    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def _seeded():
    """Every test starts from the same random state, whatever ran before it: a test that draws random
    weights or data draws the same ones on every machine and in any order (a failure reproduces)."""
    import random

    random.seed(0)
    torch.manual_seed(0)


TINY_FILES = 40  # stdlib files in the test corpus
TINY_VOCAB = 300
TINY_BLOCK = 32


@pytest.fixture
def bf16_native(monkeypatch):
    """Muon's default precision ("auto") as on hardware that multiplies bf16 natively (CUDA, AVX512-BF16/AMX):
    the bf16 iteration, torch's, on any machine; for the tests that compare Muon's steps with torch's or an
    authors' bf16 reference."""
    import hf_fasttrain.optim.orthogonalize as orth

    monkeypatch.setattr(orth, "native_bf16_matmul", lambda device="cpu": True)


@pytest.fixture(scope="session")
def tiny_raw():
    from hf_fasttrain.data import build_stdlib_corpus

    return build_stdlib_corpus(max_files=TINY_FILES)


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_raw):
    from hf_fasttrain.data import get_tokenizer

    return get_tokenizer(vocab_size=TINY_VOCAB, corpus=tiny_raw)


@pytest.fixture(scope="session")
def tiny_lm(tiny_raw, tiny_tokenizer):
    """Fixed-length rows of TINY_BLOCK tokens: DatasetDict(train, validation)."""
    from hf_fasttrain.data import tokenize_and_chunk

    lm = tokenize_and_chunk(tiny_raw, tiny_tokenizer, block_size=TINY_BLOCK)
    lm["validation"] = lm["validation"].select(range(64))  # evaluation stays fast
    return lm


def make_tiny_gpt2(vocab_size: int = 64, n_positions: int = TINY_BLOCK, seed: int = 0, **config):
    """The one tiny GPT-2 of the suite: 2 layers, 32 wide, 2 heads, no dropout, initialised from ``seed``.

    ``config`` overrides GPT2Config fields (e.g. ``n_layer=1``, ``loss_type="ForCausalLM"``).
    """
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    kw = dict(
        vocab_size=vocab_size, n_positions=n_positions, n_embd=32, n_layer=2, n_head=2,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0,
    )
    kw.update(config)
    return GPT2LMHeadModel(GPT2Config(**kw))


@pytest.fixture
def tiny_gpt2(tiny_tokenizer):
    return make_tiny_gpt2(len(tiny_tokenizer))


def make_tiny_trainer(tok, lm, args, model=None, cls=None, **kw):
    """The one tiny trainer of the suite: ``cls`` (`FastTrainer` unless given) on ``lm["train"]`` with a causal-LM
    collator and ``tok`` as its processing class.

    ``model`` defaults to `make_tiny_gpt2` over ``tok``'s vocabulary (none with a ``model_init``); ``kw`` goes to
    the trainer (``eval_dataset``, ``callbacks``, ``compute_metrics``, ...).
    """
    from transformers import DataCollatorForLanguageModeling

    if cls is None:
        from hf_fasttrain import FastTrainer as cls
    if model is None and "model_init" not in kw:
        model = make_tiny_gpt2(len(tok))
    return cls(model=model, args=args, train_dataset=lm["train"], processing_class=tok,
               data_collator=DataCollatorForLanguageModeling(tok, mlm=False), **kw)


def tiny_args(output_dir, **overrides):
    """FastTrainingArguments for a few CPU steps, logging every step, no checkpoints unless asked."""
    from hf_fasttrain import FastTrainingArguments

    kw = dict(
        output_dir=str(output_dir), max_steps=10, per_device_train_batch_size=8,
        per_device_eval_batch_size=16, learning_rate=3e-3, logging_steps=1, save_strategy="no",
        report_to="none", use_cpu=True, disable_tqdm=True, seed=0, dataloader_num_workers=0,
        warmup_steps=0,
    )
    kw.update(overrides)
    return FastTrainingArguments(**kw)


class StopAt(TrainerCallback):
    """Stops training right after checkpoint-``step`` is written: a kill at that point, for resume tests."""

    def __init__(self, step: int):
        self.step = step

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step:
            control.should_training_stop = True
