"""Run recipes/gpt2_small.py unchanged, with a fault injected at a chosen optimizer step (no timing involved).

    [accelerate launch ...] python tests/_inject.py ACTION STEP [RANK] -- <recipe arguments>

ACTION (sent by the process to itself, from a callback):
- ``kill``: SIGKILL at the start of step STEP + 1, i.e. after step STEP and its checkpoint (every ``on_save``
  included) are complete;
- ``term`` / ``int`` / ``usr1``: SIGTERM / SIGINT / SIGUSR1 in the middle of step STEP (before its optimizer
  update), so a graceful stop ends that step and saves ``checkpoint-STEP``;
- ``int2``: SIGINT twice in the middle of step STEP (Ctrl-C pressed again);
- ``intpg``: SIGINT to the whole process group in the middle of step STEP, as a terminal's Ctrl-C does: the
  DataLoader's worker processes get it too (run the recipe in a session of its own).

RANK (default: every process) limits the injection to the process of that rank. The steps each process
ended are written, one per line, to ``$INJECT_STEPS_FILE.rank<R>`` when that variable is set.
"""

import os
import runpy
import signal
import sys

from transformers import TrainerCallback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import hf_fasttrain.run.train as run  # noqa: E402

ACTION, STEP = sys.argv[1], int(sys.argv[2])
RANK = int(sys.argv[3]) if sys.argv[3] != "--" else None
ARGS = sys.argv[sys.argv.index("--") + 1:]
MY_RANK = int(os.environ.get("RANK", "0"))
SIGNALS = {"term": [signal.SIGTERM], "int": [signal.SIGINT], "usr1": [signal.SIGUSR1],
           "int2": [signal.SIGINT, signal.SIGINT]}


class Inject(TrainerCallback):
    def __init__(self):
        self.log = None
        path = os.environ.get("INJECT_STEPS_FILE")
        if path:
            self.log = open(f"{path}.rank{MY_RANK}", "a", buffering=1)

    def _mine(self):
        return RANK is None or RANK == MY_RANK

    def on_step_begin(self, args, state, control, **kwargs):
        if ACTION == "kill" and state.global_step == STEP and self._mine():
            os.kill(os.getpid(), signal.SIGKILL)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if ACTION in SIGNALS and state.global_step == STEP - 1 and self._mine():
            for s in SIGNALS[ACTION]:
                os.kill(os.getpid(), s)
        if ACTION == "intpg" and state.global_step == STEP - 1 and self._mine():
            os.killpg(os.getpgid(0), signal.SIGINT)

    def on_step_end(self, args, state, control, **kwargs):
        if self.log is not None:
            self.log.write(f"{state.global_step}\n")


_train = run.train
run.train = lambda *a, callbacks=None, **k: _train(*a, callbacks=[*(callbacks or []), Inject()], **k)
sys.argv = [os.path.join(ROOT, "recipes", "gpt2_small.py"), *ARGS]
runpy.run_path(sys.argv[0], run_name="__main__")
