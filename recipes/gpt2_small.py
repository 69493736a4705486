#!/usr/bin/env python
"""GPT-2 pretraining recipe.

    accelerate launch recipes/gpt2_small.py --config recipes/configs/gpt2_small.yaml   # GPT-2 124M, GPU
    python recipes/gpt2_small.py --config recipes/configs/gpt2_tiny.yaml               # 2 CPU cores, < 3 min
    python recipes/gpt2_small.py --config gpt2_tiny --learning_rate 2e-3 --max_steps 100
    python recipes/gpt2_small.py --config gpt2_tiny --restart_num_seeds 4 --restart_explore_fraction 0.1  # best of 4
    python recipes/gpt2_small.py --help                                                 # every option

Every field of the recipe can be overridden on the command line. The run writes config.yaml,
run_info.json, metrics.json and loss_curve.png into output_dir; restarted with the same command, a
killed run resumes from its last checkpoint.
"""

import sys

from hf_fasttrain.recipes import make_parser, parse_config
from hf_fasttrain.restarts.recipe_runner import train_with_restarts
from hf_fasttrain.run import train


def main(argv=None):
    model_args, data_args, training_args = parse_config(argv)
    if training_args.restart_num_seeds > 1:  # random restart: explore N seeds, continue the best
        return train_with_restarts(model_args, data_args, training_args)
    return train(model_args, data_args, training_args)


if __name__ == "__main__":
    if any(a in ("-h", "--help") for a in sys.argv[1:]):
        make_parser().print_help()
        sys.exit(0)
    main()
