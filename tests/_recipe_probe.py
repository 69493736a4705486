"""Run recipes/gpt2_small.py unchanged, recording per process what it trained on and what it wrote.

    [accelerate launch ...] python tests/_recipe_probe.py PROBE_DIR <recipe arguments>

The recipe's own code path runs (parse_config -> hf_fasttrain.run.train.train); the probe only adds a
callback and wraps the functions that write outputs, then writes PROBE_DIR/rank<R>.json at exit:
sha1 of every training row this process ran forward on, the global steps it ended, whether
autocast was on and the LM head's output dtype, and the output-writing calls it made.
"""

import atexit
import functools
import hashlib
import json
import os
import runpy
import sys

import torch
from transformers import PreTrainedModel, TrainerCallback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hf_fasttrain.run.train as run  # noqa: E402
import hf_fasttrain.trainer as fast_trainer  # noqa: E402
from hf_fasttrain.callbacks.run_record import RunRecorderCallback  # noqa: E402

PROBE_DIR = sys.argv.pop(1)
RANK = int(os.environ.get("RANK", "0"))
record = {"rank": RANK, "world_size": int(os.environ.get("WORLD_SIZE", "1")), "rows": [], "steps": [],
          "autocast": [], "head_dtype": [], "writes": [], "dataset_rows": None, "start_step": None}


def _sha(row: torch.Tensor) -> str:
    return hashlib.sha1(row.detach().cpu().numpy().tobytes()).hexdigest()


class Probe(TrainerCallback):
    def on_train_begin(self, args, state, control, model=None, train_dataloader=None, **kwargs):
        record["start_step"] = state.global_step
        ds = train_dataloader.dataset
        record["dataset_rows"] = [_sha(torch.tensor(r, dtype=torch.long)) for r in ds["input_ids"]]

        def pre(module, args_, kwargs_):
            if module.training:
                ids = kwargs_.get("input_ids", args_[0] if args_ else None)
                record["rows"].extend(_sha(r) for r in ids)

        def post(module, inputs, output):  # inside forward, where accelerate's autocast is active
            if module.training:
                record["autocast"].append(torch.is_autocast_enabled("cpu"))
                record["head_dtype"].append(str(output.dtype))

        model.register_forward_pre_hook(pre, with_kwargs=True)
        model.get_output_embeddings().register_forward_hook(post)

    def on_step_end(self, args, state, control, **kwargs):
        record["steps"].append(state.global_step)


def _logged(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        record["writes"].append(name)
        return fn(*args, **kwargs)

    return wrapper


fast_trainer.write_run_record = _logged("write_run_record", fast_trainer.write_run_record)
RunRecorderCallback.save = _logged("recorder.save", RunRecorderCallback.save)
PreTrainedModel.save_pretrained = _logged("save_pretrained", PreTrainedModel.save_pretrained)
_train = run.train
run.train = lambda *a, callbacks=None, **k: _train(*a, callbacks=[*(callbacks or []), Probe()], **k)


def _collective_threads() -> list[str]:
    """The names of this process's collective threads still running (gloo's worker and transport threads)."""
    names = []
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:  # a thread that ended while we looked
            pass
    return sorted(n for n in names if "gloo" in n)


@atexit.register
def _dump():
    # at exit, once the recipe returned: a gloo thread still running here would meet the interpreter's teardown
    record["collective_threads_at_exit"] = _collective_threads()
    os.makedirs(PROBE_DIR, exist_ok=True)
    with open(os.path.join(PROBE_DIR, f"rank{RANK}.json"), "w") as f:
        json.dump(record, f)


sys.argv = [os.path.join(ROOT, "recipes", "gpt2_small.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
