"""``hf-fasttrain``: the console entry point.

    hf-fasttrain train --config gpt2_tiny [--<field> <value> ...]   # same as recipes/gpt2_small.py
    hf-fasttrain recipes list                                      # the bundled recipes
    hf-fasttrain push-recipe <recipe> --repo <owner>/<repo> [--dry-run] [--run-dir <output_dir>]
    hf-fasttrain restarts --config gpt2_tiny --num-seeds 4 --explore-fraction 0.1 [--<field> <value> ...]
    hf-fasttrain version
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

__all__ = ["main"]

USAGE = """usage: hf-fasttrain <command> [options]

commands:
  train        train a causal LM from a recipe (--config <path, bundled name or hf://owner/repo>);
               --help lists every option
  recipes      recipes list: the bundled recipes
  push-recipe  upload a recipe and a model card with a run's results to the Hub (--dry-run to preview)
  restarts     random restart: train --num-seeds seeds for --explore-fraction of the run, continue
               the best (also --rungs, --keep-fraction, --metric, --direction, --divergence-threshold,
               --replace-diverged, --vary, --parallel, or any --restart_<name>); summary in --output_dir
  version      print the package version
"""


def _train(argv: Sequence[str]) -> int:
    from .recipes import parse_config
    from .run import train

    model_args, data_args, training_args = parse_config(list(argv))
    if training_args.restart_num_seeds > 1:  # the recipe flag: same as `hf-fasttrain restarts`
        return _restarts(argv)
    train(model_args, data_args, training_args)
    return 0


RESTART_FLAGS = ("num-seeds", "explore-fraction", "rungs", "keep-fraction", "metric", "direction",
                 "divergence-threshold", "replace-diverged", "vary", "parallel")


def _restarts(argv: Sequence[str]) -> int:
    """``hf-fasttrain restarts``: ``--num-seeds N`` is ``--restart_num_seeds N``, and so on."""
    from .recipes import parse_config
    from .restarts import SUMMARY_MD
    from .restarts.recipe_runner import train_with_restarts

    flags = {f"--{name}": f"--restart_{name.replace('-', '_')}" for name in RESTART_FLAGS}
    args = []
    for a in argv:
        key, eq, value = a.partition("=")
        args.append(flags.get(key, key) + eq + value if key in flags else a)
    model_args, data_args, training_args = parse_config(args)
    summary = train_with_restarts(model_args, data_args, training_args)
    import os

    with open(os.path.join(training_args.output_dir, SUMMARY_MD), encoding="utf-8") as f:
        print(f.read(), end="")
    return 0 if summary["winner"] else 1


def _version(argv: Sequence[str]) -> int:
    from . import __version__

    print(__version__)
    return 0


def _recipe_description(path) -> str:
    """The first comment line of a recipe file (bundled recipes start with what they are)."""
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("#").strip()
        if line.strip():
            break
    return ""


def _recipes(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="hf-fasttrain recipes", description="Recipes bundled with hf_fasttrain.")
    parser.add_argument("action", choices=["list"], help="list: name, file and description of each bundled recipe")
    parser.parse_args(list(argv))
    from .recipes import bundled_recipes

    names = bundled_recipes()
    width = max((len(n) for n in names), default=0)
    for name, path in names.items():
        print(f"{name:<{width}}  {_recipe_description(path)}\n{'':<{width}}  {path}")
    print("Run one with: accelerate launch recipes/gpt2_small.py --config <name>  (or a path, or hf://<owner>/<repo>)")
    return 0


def _push_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf-fasttrain push-recipe",
        description="Validate a recipe and upload it, with a README model card (what it is, how to run it, "
        "the measured results of a run), to a Hub model repo.",
    )
    p.add_argument("recipe", help="a YAML path, a bundled name or hf://<owner>/<repo>[/<file>.yaml][@<revision>]")
    p.add_argument("--repo", required=True, help="target model repo, <owner>/<repo> (created if missing)")
    p.add_argument("--revision", default=None, help="branch to push to (created if missing); default main")
    p.add_argument("--run-dir", default=None,
                   help="a run's output_dir: its metrics.json, run_info.json, config.yaml and loss_curve.png "
                   "go on the card and into results/")
    p.add_argument("--dry-run", action="store_true", help="write the folder and print what would be uploaded")
    p.add_argument("--out-dir", default=None,
                   help="folder to write (must be new or empty); default ./push-recipe-<owner>--<repo> "
                   "with --dry-run, a temporary folder otherwise")
    p.add_argument("--filename", default="recipe.yaml", help="name of the YAML in the repo (default recipe.yaml)")
    p.add_argument("--private", action="store_true", help="create the repo private")
    p.add_argument("--tag", action="append", default=[], help="extra card tag (repeatable)")
    p.add_argument("--commit-message", default=None)
    return p


def _push_recipe(argv: Sequence[str]) -> int:
    args = _push_parser().parse_args(list(argv))
    from .args import DataArguments, ModelArguments
    from .push import push_recipe
    from .recipes import load_recipe, recipe_path, validate_recipe

    # validate before anything is written: keys, types, and the model/data sections' ranges (the
    # training section's device checks, e.g. bf16 needs a GPU, belong to the machine that runs it)
    path = recipe_path(args.recipe)
    sections = validate_recipe(load_recipe(args.recipe))
    model_args = ModelArguments(**sections["model"])
    DataArguments(**sections["data"])
    model_tag = (model_args.model_name_or_path or "gpt2").rstrip("/").split("/")[-1].lower()
    plan = push_recipe(
        path,
        args.repo,
        revision=args.revision,
        dry_run=args.dry_run,
        run_dir=args.run_dir,
        out_dir=args.out_dir,
        filename=args.filename,
        private=True if args.private else None,
        commit_message=args.commit_message,
        tags=[model_tag, *args.tag],
    )
    if not args.dry_run:
        print(plan.describe())
    return 0


COMMANDS = {"train": _train, "recipes": _recipes, "push-recipe": _push_recipe, "restarts": _restarts,
            "version": _version}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        print(f"hf-fasttrain: unknown command {cmd!r}; known: {sorted(COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":
    sys.exit(main())
