"""The recipe with ``--streaming true`` end to end (subprocesses): killed at chosen steps and rerun with the
same command, it ends with the straight run's weights to the bit; over 2 processes every document of an
epoch is read by exactly one of them."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--config", "gpt2_tiny", "--vocab_size", "300", "--block_size", "32", "--n_layer", "2", "--n_embd", "32",
         "--n_head", "2", "--per_device_train_batch_size", "8", "--max_eval_samples", "16", "--logging_steps", "5",
         "--disable_tqdm", "true", "--warmup_steps", "2", "--streaming", "true", "--shuffle_buffer", "32",
         "--max_steps", "30", "--save_steps", "5", "--eval_steps", "15"]

# The recipe, unchanged, with one callback that kills the process (SIGKILL: no cleanup, no final save) when a
# chosen step ends: a deterministic stand-in for a preemption between two checkpoints.
KILLER = r'''
import os, runpy, signal, sys
from transformers import TrainerCallback
import hf_fasttrain.run.train as run

KILL_AT = int(os.environ.get("KILL_AT_STEP", "0"))

class Kill(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)

_train = run.train
run.train = lambda *a, callbacks=None, **k: _train(*a, callbacks=[*(callbacks or []), Kill()], **k)
sys.argv = [sys.argv[1], *sys.argv[2:]]
runpy.run_path(sys.argv[0], run_name="__main__")
'''


def _corpus(path: Path, n: int = 600) -> None:
    rng = random.Random(0)
    words = "the of and to in a is that for it as was with be by on not this are or from at which".split()
    with open(path, "w") as f:
        for i in range(n):
            f.write(json.dumps({"text": f"doc{i} " + " ".join(rng.choice(words) for _ in range(rng.randint(5, 60)))})
                    + "\n")


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}


def _recipe(tmp_path, out, kill_at=0):
    killer = tmp_path / "killer.py"
    killer.write_text(KILLER)
    cmd = [sys.executable, str(killer), str(ROOT / "recipes" / "gpt2_small.py"), *SMALL,
           "--dataset", str(tmp_path / "docs.jsonl"), "--output_dir", str(out)]
    return subprocess.run(cmd, env={**_env(), "KILL_AT_STEP": str(kill_at)}, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.e2e
def test_streaming_recipe_killed_at_random_steps_resumes_bit_exact(tmp_path):
    _corpus(tmp_path / "docs.jsonl")
    straight = _recipe(tmp_path, tmp_path / "straight")
    assert straight.returncode == 0, straight.stderr[-3000:]
    out = tmp_path / "killed"
    kills = sorted(random.Random(24).sample(range(6, 30), 2))  # two steps, each between two checkpoints
    kills = [k if k % 5 else k + 1 for k in kills]
    for k in kills:
        p = _recipe(tmp_path, out, kill_at=k)
        assert p.returncode == -9, (k, p.stderr[-3000:])  # killed, not finished
        assert not (out / "metrics.json").exists()
    done = _recipe(tmp_path, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming killed from" in done.stderr and "re-reads" not in done.stderr
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "straight" / "model.safetensors").read_bytes()
    losses = lambda d: {h["step"]: h["loss"] for h in json.loads((d / "metrics.json").read_text())["history"]  # noqa: E731
                        if "loss" in h}
    assert losses(out) == losses(tmp_path / "straight") and len(losses(out)) >= 6


@pytest.mark.e2e
def test_two_processes_read_every_document_exactly_once_and_train(tmp_path):
    _corpus(tmp_path / "docs.jsonl", n=300)
    script = tmp_path / "ddp_stream.py"
    script.write_text(DDP_COUNT)
    args = [*SMALL, "--dataset", str(tmp_path / "docs.jsonl"), "--output_dir", str(tmp_path / "run"),
            "--max_steps", "6", "--save_steps", "3", "--eval_steps", "6", "--dataloader_num_workers", "2"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script),
           str(tmp_path), *args]
    proc = subprocess.run(cmd, env={**_env(), "ACCELERATE_USE_CPU": "true"}, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["world_size"] for r in ranks] == [2, 2]
    held = ranks[0]["held_out"]  # the first documents of the file made the evaluation rows
    assert 0 < held == ranks[1]["held_out"]
    seen = ranks[0]["docs"] + ranks[1]["docs"]
    assert sorted(seen) == list(range(held, 300))  # each other document once: no rank twice, none dropped
    assert ranks[0]["docs"] and ranks[1]["docs"]
    for r in ranks:  # and the recipe trained over both processes, saving each rank's stream position
        assert r["global_step"] == 6
        assert (tmp_path / "run" / "checkpoint-6" / f"stream_position_rank{r['rank']}.json").exists()


@pytest.mark.e2e
def test_two_processes_whose_streams_end_apart_stay_in_step(tmp_path):
    # rank 0 reads the even documents (long), rank 1 the odd ones (short): rank 1's pass ends after a few steps
    # while rank 0's goes on. Every rank must end each pass together, or one waits for a step the other never takes.
    rng = random.Random(0)
    words = "the of and to in a is that for it as was with be by on not this are or from at which".split()
    with open(tmp_path / "docs.jsonl", "w") as f:
        for i in range(240):
            n = 60 if i % 2 == 0 else 4
            f.write(json.dumps({"text": f"doc{i} " + " ".join(rng.choice(words) for _ in range(n))}) + "\n")
    script = tmp_path / "ddp_uneven.py"
    script.write_text(DDP_UNEVEN)
    args = [*SMALL, "--dataset", str(tmp_path / "docs.jsonl"), "--output_dir", str(tmp_path / "run"),
            "--max_steps", "12", "--save_steps", "12", "--eval_steps", "12", "--gradient_accumulation_steps", "3",
            "--per_device_train_batch_size", "4"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", str(script),
           str(tmp_path), *args]
    # a rank left waiting for a collective hangs: fail after 300 s, and end the launcher and both ranks with it
    proc = subprocess.Popen(cmd, env={**_env(), "ACCELERATE_USE_CPU": "true"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        import psutil  # (accelerate's own dependency) the ranks run in sessions of their own: find them by parent

        for p in [*psutil.Process(proc.pid).children(recursive=True), psutil.Process(proc.pid)]:
            p.kill()
        proc.communicate()
        pytest.fail("the two ranks hung (a collective one of them never reached)")
    assert proc.returncode == 0, stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    short, long_ = sorted(ranks, key=lambda r: r["rows"])
    assert short["rows"] * 4 < long_["rows"]  # the passes really end apart
    assert short["rows"] < 12 * 3 * 4 and short["rows"] % (3 * 4)  # passes cross, and end inside a step
    assert ranks[0]["global_step"] == ranks[1]["global_step"] >= 12  # (a token budget: short warmup rows add steps)
    # every rank trained as many micro-batches, and they are in the same pass: the short rank's pass ended it for all
    assert ranks[0]["micro_batches"] == ranks[1]["micro_batches"], ranks
    assert ranks[0]["epoch"] == ranks[1]["epoch"] > 2, ranks
    assert ranks[0]["weights"] == ranks[1]["weights"]  # and stepped together


DDP_UNEVEN = r'''
import hashlib, json, sys
from transformers import TrainerCallback
from hf_fasttrain.run import train as run
from hf_fasttrain.data.streaming import stream_datasets
from hf_fasttrain.config.recipes import parse_config

class Digest(TrainerCallback):
    micro_batches = 0

    def on_substep_end(self, args, state, control, **kwargs):
        self.micro_batches += 1

    def on_step_end(self, args, state, control, **kwargs):
        self.micro_batches += 1

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.step, self.epoch = state.global_step, state.epoch
        self.weights = hashlib.sha256(b"".join(p.detach().cpu().numpy().tobytes() for p in model.parameters())).hexdigest()

out = sys.argv[1]
model_args, data_args, training_args = parse_config(sys.argv[2:])
tokenizer, stream, _ = stream_datasets(data_args, training_args, model_args)
rows = sum(1 for _ in stream)  # this rank's rows in one pass
digest = Digest()
run.train(model_args, data_args, training_args, callbacks=[digest])
json.dump({"rows": rows, "global_step": digest.step, "epoch": digest.epoch, "weights": digest.weights,
           "micro_batches": digest.micro_batches},
          open(f"{out}/rank{training_args.process_index}.json", "w"))
# the run's DDP wrapper, now garbage, holds the process group and its gloo threads: free it now, or the
# threads end in the interpreter's teardown, where one can abort the rank
import gc, torch.distributed
torch.distributed.destroy_process_group(); gc.collect()
'''


DDP_COUNT = r'''
import json, re, sys
import torch
from hf_fasttrain.run import train as run
from hf_fasttrain.data.streaming import StreamCollator, stream_datasets
from hf_fasttrain.config.recipes import parse_config

out = sys.argv[1]
model_args, data_args, training_args = parse_config(sys.argv[2:])
tokenizer, stream, eval_set = stream_datasets(data_args, training_args, model_args)
# one epoch of this rank's stream through 2 dataloader workers; each reader's rows, in order, are its text
loader = torch.utils.data.DataLoader(stream, batch_size=4, num_workers=2,
                                     collate_fn=StreamCollator(lambda f: {"rows": [x["input_ids"] for x in f]}))
tokens = {}
for batch in loader:
    tokens.setdefault(batch["_stream"]["worker"], []).extend(t for row in batch["rows"] for t in row)
docs = [int(m) for ids in tokens.values() for m in re.findall(r"doc(\d+) ", tokenizer.decode(ids))]
run.train(model_args, data_args, training_args)
state = json.load(open(f"{training_args.output_dir}/checkpoint-6/trainer_state.json"))
json.dump({"rank": training_args.process_index, "world_size": training_args.world_size, "docs": docs,
           "held_out": len(stream.exclude), "global_step": state["global_step"]},
          open(f"{out}/rank{training_args.process_index}.json", "w"))
# the run's DDP wrapper, now garbage, holds the process group and its gloo threads: free it now, or the
# threads end in the interpreter's teardown, where one can abort the rank
import gc, torch.distributed
torch.distributed.destroy_process_group(); gc.collect()
'''
