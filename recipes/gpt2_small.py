#!/usr/bin/env python
"""GPT-2 pretraining recipe.

    accelerate launch recipes/gpt2_small.py                                             # gpt2_small on a GPU, gpt2_tiny on CPU
    accelerate launch recipes/gpt2_small.py --config recipes/configs/gpt2_small.yaml   # GPT-2 124M, GPU
    python recipes/gpt2_small.py --config recipes/configs/gpt2_tiny.yaml               # 2 CPU cores, about a minute
    python recipes/gpt2_small.py --config gpt2_tiny --learning_rate 2e-3 --max_steps 100
    python recipes/gpt2_small.py --config gpt2_tiny --restart_num_seeds 4 --restart_explore_fraction 0.1  # best of 4
    python recipes/gpt2_small.py --help                                                 # the options by technique
    python recipes/gpt2_small.py --help-all                                             # ... and every Trainer option

Every field of the recipe can be overridden on the command line. The run writes config.yaml,
run_info.json, metrics.json and loss_curve.png into output_dir; restarted with the same command, a
killed run resumes from its last checkpoint, and a finished one says so and stops. A bad option
prints one line, `error: <field>: <what is wrong>; <what is allowed>`, and exits with status 2
(--debug or HF_FASTTRAIN_DEBUG=1 shows the traceback).
"""

import sys

from hf_fasttrain.cli import run_recipe  # imports nothing heavy: torch loads once the options are valid


def main(argv=None):
    return run_recipe(sys.argv[1:] if argv is None else list(argv))


if __name__ == "__main__":
    sys.exit(main())
