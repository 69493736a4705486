"""``hf-fasttrain``: the console entry point.

    hf-fasttrain train --config gpt2_tiny [--<field> <value> ...]   # same as recipes/gpt2_small.py
    hf-fasttrain recipes list                                      # the bundled recipes
    hf-fasttrain push-recipe <recipe> --repo <owner>/<repo> [--dry-run] [--run-dir <output_dir>]
    hf-fasttrain restarts --config gpt2_tiny --num-seeds 4 --explore-fraction 0.1 [--<field> <value> ...]
    hf-fasttrain version
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

__all__ = ["main"]

USAGE = """usage: hf-fasttrain <command> [options]

commands:
  train        train a causal LM from a recipe (--config <path, bundled name or hf://owner/repo>);
               --help lists the options by technique, --help-all adds the Trainer's
  recipes      recipes list: the bundled recipes
  push-recipe  upload a recipe and a model card with a run's results to the Hub (--dry-run to preview)
  restarts     random restart: train --num-seeds seeds for --explore-fraction of the run, continue
               the best (also --rungs, --keep-fraction, --metric, --direction, --divergence-threshold,
               --replace-diverged, --vary, --parallel, or any --restart_<name>); summary in --output_dir
  version      print the package version
"""


RECIPE_DESCRIPTION = (
    "Pretrain a causal language model (a GPT-2 built from scratch, or --model_name_or_path) with "
    "hf_fasttrain's techniques. Options come from --config (a recipe) and are overridden by the flags "
    "below; a killed run resumes from its last checkpoint when started again with the same command."
)


def _debug(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """``--debug`` (or HF_FASTTRAIN_DEBUG=1): refusals show their traceback. Removed from argv."""
    rest = [a for a in argv if a != "--debug"]
    env = os.environ.get("HF_FASTTRAIN_DEBUG", "").strip().lower() in ("1", "true", "yes")
    return env or len(rest) != len(argv), rest


def _config_source(argv: Sequence[str]) -> Optional[str]:
    for i, a in enumerate(argv):
        if a == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith("--config="):
            return a.split("=", 1)[1]
    return None


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") in ("", "0") and os.environ.get("LOCAL_RANK", "0") in ("", "0")


def with_default_recipe(argv: Sequence[str]) -> list[str]:
    """No ``--config``: the gpt2_small recipe on a GPU, gpt2_tiny on a CPU-only machine, announced in one line."""
    argv = list(argv)
    if _config_source(argv) is not None or any(a == "--config" for a in argv):
        return argv
    import torch

    from ._options import default_recipe_dirs, find_recipes

    bundled = ", ".join(find_recipes(default_recipe_dirs()))
    if torch.cuda.is_available():
        name = "gpt2_small"
        msg = (f"no --config given: training the gpt2_small recipe (GPT-2 124M) on the GPU; choose another "
               f"with --config <name or path> (bundled: {bundled})")
    else:
        name = "gpt2_tiny"
        msg = (f"no --config given and no GPU found: training the gpt2_tiny recipe (GPT-2 with 2 layers, about a "
               f"minute on 2 cores) on CPU instead of gpt2_small; choose with --config <name or path> "
               f"(bundled: {bundled})")
    if _is_main_process():
        print(msg, file=sys.stderr, flush=True)
    return ["--config", name, *argv]


def _print_help(argv: Sequence[str], prog: str) -> int:
    from ._options import _load_local_recipe, render_help

    source = _config_source(argv)
    recipe = _load_local_recipe(source) if source else None
    text = render_help(prog, RECIPE_DESCRIPTION, recipe, recipe_name=source if recipe is not None else None)
    if text is None:  # the option list could not be read from the sources: the full parser's help
        from .recipes import make_parser

        make_parser().print_help()
    else:
        print(text, end="")
    return 0


def _is_config_error(exc: BaseException) -> bool:
    """Refusals of the configuration (raised before any data or model work): one line, exit 2."""
    import yaml

    return isinstance(exc, (ValueError, FileNotFoundError, yaml.YAMLError))


def run_recipe(argv: Sequence[str], prog: str = "hf-fasttrain train") -> int:
    """The recipe command (``recipes/gpt2_small.py`` and ``hf-fasttrain train``): help, refusals, the run.

    A configuration error prints ``error: <field>: <what is wrong>; <what is allowed>`` and returns 2
    (the traceback with ``--debug`` or HF_FASTTRAIN_DEBUG=1). ``--help`` lists the package's options by
    technique without importing torch; ``--help-all`` adds every Trainer option.
    """
    debug, argv = _debug(argv)
    if any(a in ("-h", "--help") for a in argv):
        return _print_help(argv, prog)
    try:
        if "--help-all" in argv:
            from .recipes import load_recipe, make_parser, validate_recipe

            parser = make_parser(prog=prog)
            source = _config_source(argv)
            if source:  # the recipe's values as the defaults shown
                sections = validate_recipe(load_recipe(source))
                parser.set_defaults(**sections[None], **sections["model"], **sections["data"])
            parser.print_help()
            return 0
        from ._options import preflight

        preflight(argv)  # unknown flags / keys, duplicate keys, ranges: before torch is imported
        argv = with_default_recipe(argv)
        from .recipes import parse_config

        model_args, data_args, training_args = parse_config(argv)
    except Exception as exc:
        if debug or not _is_config_error(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if training_args.restart_num_seeds > 1:  # random restart: explore N seeds, continue the best
        return _run_restarts(model_args, data_args, training_args)
    from . import run
    from ._validation import ConfigError
    from .snapshots import NoSpaceError

    try:
        run.train(model_args, data_args, training_args)
    except NoSpaceError as exc:  # a full disk while saving a checkpoint: say where and what to do, in one line
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ConfigError as exc:  # found on reading the data (a missing column, a chat template): before training
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _train(argv: Sequence[str]) -> int:
    return run_recipe(argv, prog="hf-fasttrain train")


RESTART_FLAGS = ("num-seeds", "explore-fraction", "rungs", "keep-fraction", "metric", "direction",
                 "divergence-threshold", "replace-diverged", "vary", "parallel")


def _restarts(argv: Sequence[str]) -> int:
    """``hf-fasttrain restarts``: ``--num-seeds N`` is ``--restart_num_seeds N``, and so on."""
    from .recipes import parse_config

    flags = {f"--{name}": f"--restart_{name.replace('-', '_')}" for name in RESTART_FLAGS}
    args = []
    for a in argv:
        key, eq, value = a.partition("=")
        args.append(flags.get(key, key) + eq + value if key in flags else a)
    debug, args = _debug(args)
    try:
        model_args, data_args, training_args = parse_config(with_default_recipe(args))
    except Exception as exc:
        if debug or not _is_config_error(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return _run_restarts(model_args, data_args, training_args)


def _run_restarts(model_args, data_args, training_args) -> int:
    """Run the search and print its summary table; 1 when no seed survived."""
    from .restarts import SUMMARY_MD
    from .recipe_restarts import train_with_restarts

    summary = train_with_restarts(model_args, data_args, training_args)
    if _is_main_process():
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
    from ._options import default_recipe_dirs, find_recipes

    names = find_recipes(default_recipe_dirs())
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
    debug, argv = _debug(argv)
    args = _push_parser().parse_args(list(argv))
    from ._validation import check_ranges
    from .args import DataArguments, ModelArguments
    from .push import push_recipe
    from .recipes import load_recipe, recipe_path, validate_recipe

    # validate before anything is written: keys, types, ranges, and the model/data sections (the training
    # section's device checks, e.g. bf16 needs a GPU, belong to the machine that runs it)
    try:
        path = recipe_path(args.recipe)
        sections = validate_recipe(load_recipe(args.recipe))
        check_ranges(sections[None])
        model_args = ModelArguments(**sections["model"])
        DataArguments(**sections["data"])
    except Exception as exc:
        if debug or not _is_config_error(exc):
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model_tag = (model_args.model_name_or_path or model_args.model_type).rstrip("/").split("/")[-1].lower()
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
        from ._validation import unknown_name

        print(f"error: {unknown_name('command', cmd, COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":
    sys.exit(main())
