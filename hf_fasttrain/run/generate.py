"""``hf-fasttrain generate``: sample text from a run's model, offline.

    hf-fasttrain generate --model runs/gpt2_tiny --prompt "def main(" --max_new_tokens 40 --seed 0

``--model`` is a run's output_dir (its final model) or one of its ``checkpoint-<step>`` folders. Which weights:

- a run's output_dir holds the final model; with ``weight_averaging`` (EMA or LAWA) that *is* the average, as the
  run evaluated it;
- a checkpoint holds the last weights (the iterate, which a resume continues from) and, with weight averaging, the
  average in ``weight_average.pt``: the average is loaded, as the run evaluated at that step;
  ``--weights iterate`` takes the checkpoint's own weights instead;
- ``--weights iterate`` on a run's output_dir: a run that averaged keeps its iterate only in its checkpoints, so the
  last checkpoint's own weights are loaded (its step is said); a run with no checkpoint is refused in one line. A run
  that did not average: its final model is the iterate.

The tokenizer is the one saved beside the model, or in the run's folder for a checkpoint saved without one.
Nothing is downloaded: every file is read with ``local_files_only``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any, Optional, Sequence

from ..validation import ConfigError, check

__all__ = ["generate", "load_run_model", "make_parser", "main"]

WEIGHTS = ("average", "iterate")
_ALLOWED_DIR = "give a run's output_dir or one of its checkpoint-<step> folders"


def _has_model(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "config.json")) or os.path.isfile(
        os.path.join(path, "adapter_config.json"))


def _has_tokenizer(path: str) -> bool:
    return any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json",
                                                               "vocab.json"))


def _tokenizer_dir(model_dir: str) -> str:
    """The model's folder when it holds a tokenizer, else the run's folder above a checkpoint."""
    parent = os.path.dirname(os.path.normpath(model_dir))
    for path in (model_dir, parent):
        if path and _has_tokenizer(path):
            return path
    raise ConfigError("model", problem=f"no tokenizer in {model_dir} or in {parent or '.'}",
                      allowed="give a run's output_dir (the run saves its tokenizer there) or one of its checkpoints")


def _checkpoints(path: str) -> list[str]:
    """The ``checkpoint-<step>`` folders of a run's folder, by step."""
    return sorted((d for d in os.listdir(path) if d.startswith("checkpoint-")),
                  key=lambda d: int(d.split("-")[-1]) if d.split("-")[-1].isdigit() else -1)


def load_run_model(path: str, weights: str = "average") -> tuple[Any, Any, str]:
    """``(model, tokenizer, what)`` of a run's folder or checkpoint, read offline; ``what`` says which weights.

    ``weights="iterate"`` on the folder of a run that averaged loads its last checkpoint's own weights.
    Raises :class:`~hf_fasttrain.validation.ConfigError` (one line) for a folder that is missing or holds no
    model or tokenizer, and for ``weights="iterate"`` on the folder of a run that averaged and kept no checkpoint.
    """
    check(weights in WEIGHTS, "weights", weights, f"allowed: {', '.join(WEIGHTS)}")
    if not os.path.isdir(path):
        raise ConfigError("model", problem=f"{path} is not a folder" if os.path.exists(path) else
                          f"{path} does not exist", allowed=_ALLOWED_DIR)
    if not _has_model(path):
        steps = _checkpoints(path)
        hint = f" (the run has not finished; its latest checkpoint is {os.path.join(path, steps[-1])})" if steps else ""
        raise ConfigError("model", problem=f"{path} holds no model (no config.json){hint}", allowed=_ALLOWED_DIR)
    averaging = None if _is_checkpoint(path) else _run_option(path, "weight_averaging")
    if weights == "iterate" and averaging not in (None, "none"):  # the final model is the average: the last iterate
        last = [d for d in _checkpoints(path) if _has_model(os.path.join(path, d))]
        if not last:
            raise ConfigError("weights", weights, "use --weights average (the final model), or keep checkpoints "
                              "(save_strategy) to sample an iterate",
                              problem=f"got 'iterate', but {path} holds only the run's weight average ({averaging}) "
                                      "and no checkpoint")
        model, tokenizer, _ = load_run_model(os.path.join(path, last[-1]), "iterate")
        return model, tokenizer, (f"the iterate of the run's last checkpoint ({last[-1]}; the final model is the "
                                  f"run's weight average, {averaging})")
    tokenizer_dir = _tokenizer_dir(path)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one model's "Loading weights" bar says nothing here
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    from ..transfer import restore_mup

    restore_mup(model)  # a muP run's output multiplier (a hook, recorded in its config), as in training
    model.eval()
    if _is_checkpoint(path):
        what = "the checkpoint's weights"
    else:
        what = (f"the final model, the run's weight average ({averaging})" if averaging not in (None, "none")
                else "the final model")
    average = os.path.join(path, "weight_average.pt")
    if _is_checkpoint(path) and os.path.isfile(average):
        if weights == "average":
            from ..stability.averaging import WeightAverage, load_average_file
            from ..stability.trainables import trainable_parameters

            state = load_average_file(average)
            avg = WeightAverage(trainable_parameters(model), mode=state["mode"])
            avg.load_state_dict(state)
            avg.copy_to(model)
            what = f"the checkpoint's weight average ({state['mode']})"
        else:
            what = "the checkpoint's own weights (the iterate; its average left out)"
    return model, tokenizer, what


def _run_option(run_dir: str, name: str) -> Any:
    """Option ``name`` as the run recorded it (its config.yaml), or None."""
    import yaml

    try:
        with open(os.path.join(run_dir, "config.yaml"), encoding="utf-8") as f:
            return (yaml.safe_load(f) or {}).get(name)
    except (OSError, yaml.YAMLError, AttributeError):
        return None


def _is_checkpoint(path: str) -> bool:
    return os.path.basename(os.path.normpath(path)).startswith("checkpoint-")


def generate(model, tokenizer, prompt: str = "", max_new_tokens: int = 50, temperature: float = 1.0,
             top_k: int = 50, seed: int = 0) -> list[int]:
    """The ids of ``max_new_tokens`` tokens sampled after ``prompt`` (greedy with ``temperature`` 0); the same
    ``seed`` gives the same tokens. An empty prompt starts from the tokenizer's BOS (else EOS) token. Past the
    model's positions (a GPT-2 of block 64 asked for 200 characters) each token sees the last ``n_positions``
    tokens, as nanoGPT's sample.py crops its context."""
    import torch

    ids = tokenizer(prompt, return_tensors="pt")["input_ids"] if prompt else None
    if ids is None or ids.shape[1] == 0:
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        check(start is not None, "prompt", prompt, "give a prompt: the tokenizer has no BOS or EOS token to start from",
              problem="empty")
        ids = torch.tensor([[start]])
    sample = temperature > 0
    kwargs = dict(do_sample=True, temperature=temperature, top_k=top_k) if sample else dict(do_sample=False)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    torch.manual_seed(seed)
    positions = getattr(model.config, "n_positions", None) or getattr(model.config, "max_position_embeddings", None)
    if positions and ids.shape[1] + max_new_tokens > positions and getattr(model.config, "model_type", "") == "gpt2":
        return _cropped_sample(model, ids, max_new_tokens, positions, temperature, top_k)
    with torch.no_grad():
        out = model.generate(ids.to(model.device), attention_mask=torch.ones_like(ids).to(model.device),
                             max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, pad_token_id=pad,
                             **kwargs)
    return out[0, ids.shape[1]:].tolist()


def _cropped_sample(model, ids, max_new_tokens: int, positions: int, temperature: float, top_k: int) -> list[int]:
    """Token by token, each from the last ``positions`` tokens (absolute positions cannot go further)."""
    import torch

    out = ids.to(model.device)
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(input_ids=out[:, -positions:]).logits[:, -1].float()
            if temperature <= 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, -1), 1)
            out = torch.cat([out, nxt], dim=1)
    return out[0, ids.shape[1]:].tolist()


def make_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf-fasttrain generate", allow_abbrev=False,
        description="Sample text from a run's model, offline. --model is a run's output_dir (the final model: with "
        "weight_averaging, the average the run evaluated) or one of its checkpoint-<step> folders (the average saved "
        "with it when the run averaged, else its weights); the tokenizer is the one saved with the model or the run.")
    p.add_argument("--model", required=True, help="a run's output_dir or one of its checkpoint-<step> folders")
    p.add_argument("--prompt", default="", help="text to continue (default: none, from the BOS/EOS token)")
    p.add_argument("--max_new_tokens", type=int, default=50, help="tokens to sample (default 50)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature; 0: greedy (default 1.0)")
    p.add_argument("--top_k", type=int, default=50, help="sample from the k likeliest tokens; 0: all (default 50)")
    p.add_argument("--seed", type=int, default=0, help="the same seed gives the same text (default 0)")
    p.add_argument("--weights", choices=WEIGHTS, default="average",
                   help="for an averaging run: 'average' (default) or 'iterate', the weights trained (of the "
                   "checkpoint given, or of the run's last checkpoint for a run's output_dir)")
    p.error = _usage_error  # type: ignore[method-assign]
    return p


def _usage_error(message: str):
    """argparse's errors as one line: ``error: <field>: <what is wrong>; <what is allowed>``."""
    from ..validation import argparse_error

    err = argparse_error(message, [f"--{a.dest}" for a in make_parser()._actions if a.dest != "help"])
    if err.field == "model" and not err.allowed:
        err = ConfigError("model", problem=err.problem, allowed=_ALLOWED_DIR)
    raise err


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Parse, check, load, sample, print; a user error is one line and exit 2."""
    import sys

    debug = "--debug" in (argv or [])
    argv = [a for a in (argv or []) if a != "--debug"]
    try:
        args = make_parser().parse_args(list(argv))
        check(args.max_new_tokens >= 1, "max_new_tokens", args.max_new_tokens, "must be an integer >= 1")
        check(args.temperature >= 0, "temperature", args.temperature, "must be a number >= 0 (0: greedy)")
        check(args.top_k >= 0, "top_k", args.top_k, "must be an integer >= 0 (0: no cut)")
        model, tokenizer, what = load_run_model(args.model, args.weights)
        ids = generate(model, tokenizer, args.prompt, args.max_new_tokens, args.temperature, args.top_k, args.seed)
    except ConfigError as exc:
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"[{args.model}: {what}]", file=sys.stderr)
    print(args.prompt + tokenizer.decode(ids, skip_special_tokens=True))
    return 0
