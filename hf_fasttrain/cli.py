"""``hf-fasttrain``: the console entry point.

    hf-fasttrain train --config gpt2_tiny [--<field> <value> ...]   # same as recipes/gpt2_small.py
    hf-fasttrain generate --model <output_dir or checkpoint> [--prompt TEXT] [--max_new_tokens N]
    hf-fasttrain tokenize --dataset <files> --block_size N --out DIR  # pre-tokenized shards + manifest
    hf-fasttrain recipes list                                      # the bundled recipes
    hf-fasttrain push-recipe <recipe> --repo <owner>/<repo> [--dry-run] [--run-dir <output_dir>]
    hf-fasttrain restarts --config gpt2_tiny --num-seeds 4 --explore-fraction 0.1 [--<field> <value> ...]
    hf-fasttrain coord-check [--config gpt2_tiny] --widths 64,128,256,512 --parameterization mup
    hf-fasttrain tune-transfer --config gpt2_tiny --proxy-width 64 --lrs 4e-3,8e-3,1.6e-2 [--<field> <value> ...]
    hf-fasttrain version
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import textwrap
from typing import Callable, Optional, Sequence

from .config.options import config_source as _config_source
from .validation import check_output_dir, remove_made_folders

__all__ = ["main"]

USAGE = """usage: hf-fasttrain <command> [options]

commands:
  train        train a causal LM from a recipe (--config <path, bundled name or hf://owner/repo>);
               --help lists the options by technique, --help-all adds the Trainer's; --dry_run prints
               the resolved options and where each value came from, and writes nothing
  generate     sample text from a run's model (--model <output_dir or checkpoint>, --prompt, --max_new_tokens,
               --temperature, --top_k, --seed), offline
  tokenize     tokenize a dataset once into packed parquet shards + manifest.json (--dataset, --tokenizer,
               --block_size, --out); train on them with --dataset <out>
  recipes      recipes list: the bundled recipes
  push-recipe  upload a recipe and a model card with a run's results to the Hub (--dry-run to preview)
  restarts     random restart: train --num-seeds seeds for --explore-fraction of the run, continue
               the best (also --rungs, --keep-fraction, --metric, --direction, --divergence-threshold,
               --replace-diverged, --vary, --parallel, or any --restart_<name>); summary in --output_dir;
               --backend ray runs each stage as a Ray task (--ray-address, --trial-resources, --max-concurrent)
  coord-check  the coordinate check: build the model at several widths (fixed head size), train a few steps,
               print each layer's activation-change and update RMS against width; exit 0 when flat, 1 when not
               (--config, --widths, --parameterization, --optimizer, --lr, --steps, --output_dir; see --help)
  tune-transfer tune small, train big: search --lrs on a narrow proxy (--proxy-width, the same head size;
               successive halving over --rungs), then train the full model at the winner; with
               optimizer_kwargs parameterization mup the proxy is the base width (see --help)
  version      print the package version
"""


RECIPE_DESCRIPTION = (
    "Pretrain a causal language model (a GPT-2 built from scratch, or --model_name_or_path) with "
    "hf_fasttrain's techniques. Options come from --config (a recipe) and are overridden by the flags "
    "below; a killed run resumes from its last checkpoint when started again with the same command. "
    "recipes/gpt2_small.py takes the same options."
)


def _debug(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """``--debug`` (or HF_FASTTRAIN_DEBUG=1): refusals show their traceback. Removed from argv."""
    rest = [a for a in argv if a != "--debug"]
    env = os.environ.get("HF_FASTTRAIN_DEBUG", "").strip().lower() in ("1", "true", "yes")
    return env or len(rest) != len(argv), rest


def _is_main_process() -> bool:
    return os.environ.get("RANK", "0") in ("", "0") and os.environ.get("LOCAL_RANK", "0") in ("", "0")


def with_default_recipe(argv: Sequence[str]) -> list[str]:
    """No ``--config``: the gpt2_small recipe on a GPU, gpt2_tiny on a CPU-only machine, announced in one line."""
    argv = list(argv)
    if _config_source(argv) is not None or any(a == "--config" for a in argv):
        return argv
    import torch

    from .config.options import default_recipe_dirs, find_recipes

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


def _print_help(argv: Sequence[str], full: bool = False) -> int:
    from .config.options import load_local_recipe, render_help

    source = _config_source(argv)
    recipe = load_local_recipe(source) if source else None
    if full and source and recipe is None:  # a Hub recipe: the parser's help with the recipe's values
        return -1
    text = render_help(RECIPE_DESCRIPTION, recipe, recipe_name=source if recipe is not None else None, full=full)
    if text is None:  # the option list could not be read from the sources: the full parser's help
        from .config.recipes import make_parser

        make_parser(prog="hf-fasttrain train").print_help()
    else:
        print(text, end="")
    return 0


def recipe_origin(message: str, argv: Sequence[str]) -> str:
    """``message`` (a refusal) with where its value came from, when that is the recipe and not a flag.

    ``warmup_steps=20 ... longer than training`` after ``--config gpt2_tiny --max_steps 5`` gains
    ``(warmup_steps: 20 is from the recipe gpt2_tiny; override it with --warmup_steps <value>)``: the user did
    not write that value and needs to know which flag changes it.
    """
    import re

    m = re.match(r"(?:--)?([A-Za-z_][\w.]*)\s*[:=]", message)
    source = _config_source(argv)
    if not m or not source or re.search(r"unknown (recipe key|option)|written twice", message):
        return message  # about a key, not about the recipe's value
    field = m.group(1).split(".")[-1]
    given = {a.split("=", 1)[0][2:].replace("-", "_") for a in argv if a.startswith("--")}
    if field in given:
        return message
    from .config.options import load_local_recipe

    try:
        recipe = load_local_recipe(source) or {}
    except ValueError:
        return message
    values = {k: v for k, v in recipe.items() if k not in ("model", "data")}
    for section in ("model", "data"):
        if isinstance(recipe.get(section), dict):
            values.update(recipe[section])
    if field not in values:
        return message
    return (f"{message} ({field}: {values[field]!r} is from the recipe {source}; override it with "
            f"--{field} <value>)")


def said(exc: BaseException) -> str:
    """A refusal in the command line's words: an optimizer's own option (an ``OptionError``, which carries the
    optimizer's name as ``owner``) is set there through ``optimizer_kwargs``, so it is named
    ``optimizer_kwargs.<field>``."""
    from .validation import ConfigError

    if isinstance(exc, ConfigError) and getattr(exc, "owner", None) and "." not in exc.field:
        return f"optimizer_kwargs.{exc}"  # the message starts with the field
    return str(exc)


def _is_config_error(exc: BaseException) -> bool:
    """Refusals of the configuration (raised before any data or model work): one line, exit 2."""
    import yaml

    return isinstance(exc, (ValueError, FileNotFoundError, yaml.YAMLError))


def run_recipe(argv: Sequence[str]) -> int:
    """The recipe command (``recipes/gpt2_small.py`` and ``hf-fasttrain train``): help, refusals, the run.

    A configuration error prints ``error: <field>: <what is wrong>; <what is allowed>`` and returns 2
    (the traceback with ``--debug`` or HF_FASTTRAIN_DEBUG=1). ``--help`` lists the package's options by
    technique without importing torch; ``--help-all`` adds every Trainer option.
    """
    debug, argv = _debug(argv)
    if any(a in ("-h", "--help") for a in argv):
        return _print_help(argv)
    try:
        if "--help-all" in argv and _print_help(argv, full=True) == 0:  # grouped as --help is
            return 0
        if "--help-all" in argv:
            from .config.recipes import load_recipe, make_parser, validate_recipe

            parser = make_parser(prog="hf-fasttrain train")
            source = _config_source(argv)
            if source:  # the recipe's values as the defaults shown
                sections = validate_recipe(load_recipe(source))
                parser.set_defaults(**sections[None], **sections["model"], **sections["data"])
            parser.print_help()
            return 0
        from .config.options import preflight

        dry = "--dry_run" in argv
        argv = [a for a in argv if a != "--dry_run"]
        preflight(argv)  # unknown flags / keys, duplicate keys, ranges: before torch is imported
        argv = with_default_recipe(argv)
        if dry:  # the resolved options and their sources; nothing is written
            from .run.dry_run import dry_run, render

            print(render(*dry_run(argv)), end="")
            return 0
        from .config.recipes import parse_config

        model_args, data_args, training_args = parse_config(argv)
        made = check_output_dir(training_args.output_dir)  # before any data work
    except Exception as exc:
        if debug or not _is_config_error(exc):
            raise
        print(f"error: {recipe_origin(said(exc), argv)}", file=sys.stderr)
        return 2
    if training_args.restart_num_seeds > 1:  # random restart: explore N seeds, continue the best
        return _run_restarts(model_args, data_args, training_args)
    from .run import train as run
    from .validation import ConfigError
    from .stability.snapshots import NoSpaceError

    try:
        run.train(model_args, data_args, training_args)
    except ConfigError as exc:  # the data (a missing file or column, a chat template), the tokenizer or the
        # output folder, refused before any training (DataError is a ConfigError)
        if training_args.process_index == 0:  # the output_dir this command made, when nothing was written to it
            remove_made_folders(training_args.output_dir, made)
        if debug:
            raise
        print(f"error: {said(exc)}", file=sys.stderr)
        return 2
    except NoSpaceError as exc:  # a full disk while saving a checkpoint: say where and what to do, in one line
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (data preparation, final evaluation)
        if debug:
            raise
        print("interrupted: exiting without saving; rerun the same command to resume from the last checkpoint",
              file=sys.stderr)
        return 130
    _close_process_group()
    return 0


def _close_process_group() -> None:
    """End the run's process group once training is over (a launched run of several processes), threads included.

    ``destroy_process_group`` unregisters the group, but the DDP-wrapped model, garbage once the run returned,
    still holds it, and with it gloo's worker threads. Left to the interpreter's exit, a worker that frees its last
    collective's tensors needs the GIL of an interpreter being torn down, and the rank aborts (SIGABRT) after a run
    that finished. Collecting the garbage now frees the group while Python is whole: its destructor joins the
    threads (torch releases the GIL there)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


def _train(argv: Sequence[str]) -> int:
    return run_recipe(argv)


RESTART_FLAGS = ("num-seeds", "explore-fraction", "rungs", "keep-fraction", "metric", "direction",
                 "divergence-threshold", "replace-diverged", "vary", "parallel", "backend", "ray-address",
                 "trial-resources", "max-concurrent")


def restarts_help(width: int = 100) -> str:
    """``hf-fasttrain restarts --help``: the search's own flags, with their defaults; the training options
    are ``hf-fasttrain train --help``'s. Read from the sources, like ``train --help`` (no torch import)."""
    from .config.options import format_default, first_sentence, load_schema, wrap_row

    schema = load_schema() or {}
    col = 34
    lines = ["usage: hf-fasttrain restarts [--config RECIPE] [--num-seeds N] [--explore-fraction F] [...]",
             "                             [--<training option> VALUE ...]", ""]
    lines += textwrap.wrap(
        "Random restart: train --num-seeds seeds (model init and data order) for --explore-fraction of the "
        "run, keep the best, continue it to the end; with --rungs > 1, successive halving. The summary "
        "(restarts_summary.md) is printed and written in --output_dir; a killed search resumes when the same "
        "command is run again.", width) + ["", "search options (each also --restart_<name>, and a recipe key restart_<name>):"]
    for name in RESTART_FLAGS:
        opt = schema.get("restart_" + name.replace("-", "_"))
        default = f" [{format_default(opt.default)}]" if opt and format_default(opt.default) else ""
        text = first_sentence(opt.help.removeprefix("Random restart: ")) if opt else ""
        lines += wrap_row(f"  --{name}", f"{text}{default}", col, width)
    lines += ["", "training options: the recipe's, as in `hf-fasttrain train --help` (--config, --max_steps, "
              "--output_dir, ...).",
              "Without --config: gpt2_small on a GPU, gpt2_tiny on CPU."]
    return "\n".join(lines) + "\n"


def _restarts(argv: Sequence[str]) -> int:
    """``hf-fasttrain restarts``: ``--num-seeds N`` is ``--restart_num_seeds N``, and so on."""
    if any(a in ("-h", "--help", "--help-all") for a in argv):
        print(restarts_help(), end="")
        return 0
    from .config.recipes import parse_config

    flags = {f"--{name}": f"--restart_{name.replace('-', '_')}" for name in RESTART_FLAGS}
    args = []
    for a in argv:
        key, eq, value = a.partition("=")
        args.append(flags.get(key, key) + eq + value if key in flags else a)
    debug, args = _debug(args)
    try:
        model_args, data_args, training_args = parse_config(with_default_recipe(args))
        check_output_dir(training_args.output_dir)
    except Exception as exc:
        if debug or not _is_config_error(exc):
            raise
        print(f"error: {recipe_origin(said(exc), args)}", file=sys.stderr)
        return 2
    return _run_restarts(model_args, data_args, training_args, debug)


def _run_restarts(model_args, data_args, training_args, debug: bool = False) -> int:
    """Run the search and print its summary table; 1 when no seed survived. A refusal before any trial (a
    backend that is missing, an output_dir the Ray workers do not share) is one line and exit 2."""
    from .restarts import SUMMARY_MD
    from .run.recipe_restarts import train_with_restarts

    starts = _stage_starts(training_args.output_dir)
    try:
        summary = train_with_restarts(model_args, data_args, training_args)
    except ValueError as exc:
        if debug or _stage_starts(training_args.output_dir) != starts:  # a trial failed: the traceback
            raise
        print(f"error: {said(exc)}", file=sys.stderr)
        return 2
    if _is_main_process():
        with open(os.path.join(training_args.output_dir, SUMMARY_MD), encoding="utf-8") as f:
            print(f.read(), end="")
    return 0 if summary["winner"] else 1


TUNE_FLAGS = {"proxy-width": "the proxy's width: a multiple of the model's head size, at most its width; under "
               "parameterization mup it becomes base_width (required)",
               "lrs": "comma-separated peak learning rates searched on the proxy, at least 2, e.g. 4e-3,8e-3,1.6e-2 "
               "(required)",
               "rungs": "successive-halving rungs over the proxy's run (default 2; 1 trains every lr to the end)",
               "keep-fraction": "the fraction of lrs kept at each rung (default 0.5)"}


def tune_transfer_help(width: int = 100) -> str:
    """``hf-fasttrain tune-transfer --help``: its own flags; the training options are ``train --help``'s."""
    from .config.options import wrap_row

    lines = ["usage: hf-fasttrain tune-transfer --proxy-width W --lrs LR,LR[,...] [--rungs N] [--keep-fraction F]",
             "                                  [--config RECIPE] [--<training option> VALUE ...]", ""]
    lines += textwrap.wrap(
        "Tune small, train big: build the recipe's model at --proxy-width (the same depth and head size, fewer "
        "heads), train it once per lr of --lrs on the same seeds with successive halving, then train the full model "
        "at the winning lr in --output_dir. With optimizer_kwargs {\"parameterization\": \"mup\"} the proxy is the "
        "base width, so its lr carries; without it the lr is carried as found. The search lives in "
        "<output_dir>/proxy-w<W>/; the run's run_info.json and proxy_search.json name it. Rerun the same command "
        "to resume either stage.", width) + ["", "search options:"]
    for name, text in TUNE_FLAGS.items():
        lines += wrap_row(f"  --{name}", text, 34, width)
    lines += ["", "training options: the recipe's, as in `hf-fasttrain train --help`",
              "(--config, --max_steps, --output_dir, ...). Without --config: gpt2_small on a GPU, gpt2_tiny on CPU."]
    return "\n".join(lines) + "\n"


def _split_flags(argv: Sequence[str], names: Sequence[str]) -> tuple[dict, list[str]]:
    """Pull ``--name value`` / ``--name=value`` for each of ``names`` out of ``argv``: (values, the rest)."""
    from .validation import ConfigError

    values, rest, i = {}, [], 0
    argv = list(argv)
    while i < len(argv):
        key, eq, value = argv[i].partition("=")
        if key.startswith("--") and key[2:] in names:
            if not eq:
                if i + 1 >= len(argv) or argv[i + 1].startswith("--"):
                    raise ConfigError(key[2:], None, "a value after the flag")
                value, i = argv[i + 1], i + 1
            values[key[2:]] = value
        else:
            rest.append(argv[i])
        i += 1
    return values, rest


def _tune_transfer(argv: Sequence[str]) -> int:
    """``hf-fasttrain tune-transfer``: the proxy search, then the target run; one line and exit 2 for a refusal."""
    if any(a in ("-h", "--help", "--help-all") for a in argv):
        print(tune_transfer_help(), end="")
        return 0
    from .validation import ConfigError

    debug, argv = _debug(argv)
    try:
        values, args = _split_flags(argv, tuple(TUNE_FLAGS))
        if "proxy-width" not in values or "lrs" not in values:
            missing = "proxy-width" if "proxy-width" not in values else "lrs"
            raise ConfigError(missing, None, "required: " + TUNE_FLAGS[missing].split(" (required)")[0])
        try:
            proxy_width = int(values["proxy-width"])
        except ValueError:
            raise ConfigError("proxy-width", values["proxy-width"], "an integer, e.g. 64") from None
        try:
            lrs = [float(x) for x in values["lrs"].split(",") if x.strip()]
        except ValueError:
            raise ConfigError("lrs", values["lrs"], "comma-separated numbers, e.g. 4e-3,8e-3,1.6e-2") from None
        try:
            rungs = int(values.get("rungs", 2))
        except ValueError:
            raise ConfigError("rungs", values["rungs"], "an integer >= 1") from None
        if rungs < 1:
            raise ConfigError("rungs", rungs, "an integer >= 1")
        try:
            keep = float(values.get("keep-fraction", 0.5))
        except ValueError:
            raise ConfigError("keep-fraction", values["keep-fraction"], "a number in (0, 1)") from None
        if not 0 < keep < 1:
            raise ConfigError("keep-fraction", keep, "a number in (0, 1)")
        from .config.options import preflight
        from .config.recipes import parse_config
        from .run.tune_transfer import check_tune_args

        args = with_default_recipe(args)
        preflight(args)
        model_args, data_args, training_args = parse_config(args)
        check_tune_args(model_args, training_args, proxy_width, lrs)
        made = check_output_dir(training_args.output_dir)
    except Exception as exc:
        if debug or not _is_config_error(exc):
            raise
        print(f"error: {recipe_origin(said(exc), argv)}", file=sys.stderr)
        return 2
    from .run.tune_transfer import tune_and_train

    try:
        result = tune_and_train(model_args, data_args, training_args, proxy_width, lrs, rungs=rungs,
                                keep_fraction=keep)
    except ConfigError as exc:
        if training_args.process_index == 0:
            remove_made_folders(training_args.output_dir, made)
        if debug:
            raise
        print(f"error: {said(exc)}", file=sys.stderr)
        return 2
    record = result["transfer"]
    if _is_main_process():
        print(f"tune-transfer: lr {record['learning_rate']:g} from the proxy at width {record['proxy_width']} "
              f"({len(record['lrs'])} lrs, {record['proxy_search']}); the width-{record['target_width']} run in "
              f"{training_args.output_dir}: eval_loss {result['metrics'].get('eval_loss', float('nan')):.4f}")
    _close_process_group()
    return 0


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> Optional[argparse.Namespace]:
    """``parser.parse_args(argv)``, its mistakes printed as one line (``error: <field>: <what is wrong>; <what is
    allowed>``) instead of the usage: None then (the command exits 2)."""
    from .validation import ConfigError, argparse_error

    flags = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]

    def fail(message: str):
        raise argparse_error(message, flags)

    parser.error = fail  # type: ignore[method-assign]
    try:
        return parser.parse_args(list(argv))
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def _run_option_help(name: str) -> str:
    """The help text of a run's option (DataArguments, ModelArguments), for a command that takes the same option."""
    from .config.options import load_schema

    schema = load_schema()
    return schema[name].help if schema is not None and name in schema else name.replace("_", " ")


def _tokenize_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf-fasttrain tokenize",
        description="Tokenize a dataset once and write packed rows of --block_size token ids as parquet shards, "
        "with manifest.json (tokenizer hash, block size, tokens, source) and the tokenizer. Train on the folder "
        "with --dataset DIR: no tokenizer work, the manifest checked against the run's tokenizer and block size.",
    )
    p.add_argument("--dataset", required=True, help="what --dataset of a run takes: files, a glob, a folder, a "
                   "save_to_disk folder or a Hub name")
    p.add_argument("--out", required=True, help="the folder to write (must be new or empty)")
    p.add_argument("--tokenizer", default=None, help="tokenizer (save_pretrained folder, tokenizer.json, "
                   "vocab.json + merges.txt folder, Hub name); default: a byte-level BPE trained on the data")
    p.add_argument("--block_size", type=int, required=True, help="tokens per row")
    p.add_argument("--vocab_size", type=int, default=8192,
                   help="vocabulary of the trained BPE (no --tokenizer), an integer >= 260 (default 8192)")
    p.add_argument("--text_column", default="text", help=_run_option_help("text_column"))
    p.add_argument("--num_proc", type=int, default=None, help="processes for tokenization (datasets.map num_proc)")
    p.add_argument("--validation_fraction", type=float, default=0.05,
                   help="share of documents held out when the data has no validation split")
    for name in ("dataset_config", "dataset_split", "dataset_revision", "data_files", "data_dir"):
        p.add_argument(f"--{name}", default=None, help=_run_option_help(name))
    p.add_argument("--shard_tokens", type=int, default=None, help="tokens per parquet shard (default 2^25)")
    p.add_argument("--trust_remote_code", action="store_true", help=_run_option_help("trust_remote_code"))
    return p


def _parsed_command(make_parser: Callable[[], argparse.ArgumentParser],
                    run: Callable[[argparse.Namespace, bool], int]) -> Callable[[Sequence[str]], int]:
    """A command whose options `make_parser()` reads: ``--debug`` taken out, a mistake one line and exit 2,
    then ``run(args, debug)``."""

    def command(argv: Sequence[str]) -> int:
        debug, argv = _debug(argv)
        args = _parse(make_parser(), argv)
        return 2 if args is None else run(args, debug)

    return command


def _tokenize(args: argparse.Namespace, debug: bool) -> int:
    """``hf-fasttrain tokenize``: refusals are one line and exit 2, as for ``train``."""
    try:
        from .config.args import DataArguments
        from .data.prepare import pretokenize

        data_args = DataArguments(
            dataset=args.dataset, dataset_config=args.dataset_config, dataset_split=args.dataset_split,
            dataset_revision=args.dataset_revision, data_files=args.data_files, data_dir=args.data_dir,
            text_column=args.text_column, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
            block_size=args.block_size, validation_fraction=args.validation_fraction,
            preprocessing_num_workers=args.num_proc,
        )
        if args.shard_tokens is not None and args.shard_tokens < 1:
            raise ValueError(f"shard_tokens: got {args.shard_tokens}; must be an integer >= 1")
        manifest = pretokenize(data_args, args.out, trust_remote_code=args.trust_remote_code,
                               shard_tokens=args.shard_tokens)
    except ValueError as exc:  # DataError and ConfigError are ValueErrors
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tokens = manifest["tokens"]
    print(f"wrote {args.out}: {tokens['train']:,} train tokens, {tokens['validation']:,} validation tokens in rows of "
          f"{manifest['block_size']}; train on it with --dataset {args.out} --block_size {manifest['block_size']}")
    return 0
def _coord_check_parser() -> argparse.ArgumentParser:
    from .transfer.coord_check import DEFAULT_TOLERANCE

    p = argparse.ArgumentParser(
        prog="hf-fasttrain coord-check",
        description="The coordinate check of a parameterization: the model is built at each of --widths (the same "
        "depth, the same head size, so more heads), trained --steps steps on one fixed batch at a constant --lr, and "
        "each layer's activation change since initialisation and update (dW x) is measured by its RMS. The log-log "
        "slope of each against width is printed with a table; a JSON, a Markdown table and a PNG go to --output_dir. "
        f"Exit status 0 when every |slope| is at most --tolerance (default {DEFAULT_TOLERANCE}: at most 2^"
        f"{DEFAULT_TOLERANCE} = {2 ** DEFAULT_TOLERANCE:.2f}x per doubling of width), 1 when not, 2 for a bad option. "
        "A flat check shows the updates are the right size at every width; it does not by itself show that the best "
        "lr carries over.")
    p.add_argument("--config", default=None, help="a recipe (path, bundled name or hf://): its model family, depth, "
                   "head size, grouped-query and MLP ratios, model_config, vocabulary, and its optimizer, "
                   "learning_rate and optimizer_kwargs (parameterization options excepted) as defaults for the "
                   "flags below")
    p.add_argument("--model_type", default=None, help="the decoder family (default gpt2, or the recipe's)")
    p.add_argument("--n_layer", type=int, default=None, help="blocks, the same at every width (default 2)")
    p.add_argument("--head_dim", type=int, default=None, help="the head size, the same at every width (default 16, "
                   "or the recipe's n_embd / n_head)")
    p.add_argument("--vocab_size", type=int, default=None, help="the vocabulary (default 256, or the recipe's)")
    p.add_argument("--kv_heads_ratio", type=float, default=None, help="key/value heads per query head (default 1)")
    p.add_argument("--mlp_ratio", type=float, default=None, help="the MLP's width over the model's (default the "
                   "family's: 4, or 8/3 for a gated MLP)")
    p.add_argument("--widths", default="64,128,256,512", help="comma-separated increasing widths, multiples of "
                   "--head_dim (default 64,128,256,512)")
    p.add_argument("--parameterization", default="mup", help="mup (default) or standard")
    p.add_argument("--base_width", type=int, default=None, help="muP's base width (default: the first width)")
    p.add_argument("--optimizer", default=None, help="adamw (default), lion, ademamix, soap or muon")
    p.add_argument("--lr", type=float, default=None, help="the constant learning rate (default 3e-3, or the "
                   "recipe's learning_rate)")
    p.add_argument("--optimizer_kwargs", default=None, help="the optimizer's other options as JSON, e.g. "
                   "'{\"betas\": [0.9, 0.95]}'; weight_decay defaults to 0; also base_depth, base_head_dim")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps per width (default 3)")
    p.add_argument("--batch_size", type=int, default=1, help="rows of the fixed batch (default 1)")
    p.add_argument("--seq_len", type=int, default=16, help="tokens per row (default 16; keep batch_size x seq_len "
                   "well under the smallest width, or its updates look larger than the limit's)")
    p.add_argument("--data", default="random", help="random tokens (default) or embedded: rows of the package's "
                   "default corpus (Python's standard library, its own BPE of --vocab_size)")
    p.add_argument("--seed", type=int, default=0, help="the initialisation and batch seed, the same at every width")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="the largest |log-log slope| that "
                   f"counts as flat (default {DEFAULT_TOLERANCE})")
    p.add_argument("--output_dir", default="coord_check", help="where coord_check.json, .md and .png go (default "
                   "./coord_check)")
    return p


def _recipe_model(sections: dict, overrides: dict):
    """The coordinate check's model from a validated recipe: its family, depth, head size, grouped-query and MLP
    ratios and ``model_config``, and its data section's vocabulary and block size; `overrides` (flags) win."""
    from .config.model_data_args import SIZE_ALIASES
    from .transfer.coord_check import CoordCheckModel

    model = {SIZE_ALIASES.get(k, k): v for k, v in (sections.get("model") or {}).items()}
    data = sections.get("data") or {}
    width, heads = model.get("hidden_size", 768), model.get("num_attention_heads", 12)
    values = {
        "model_type": model.get("model_type", "gpt2"), "n_layer": model.get("num_hidden_layers", 12),
        "head_dim": width // heads, "vocab_size": data.get("vocab_size", 8192),
        "n_positions": model.get("n_positions") or data.get("block_size", 1024),
        "kv_heads_ratio": (model.get("num_key_value_heads") or heads) / heads,
        "mlp_ratio": model["intermediate_size"] / width if model.get("intermediate_size") else None,
        "model_config": dict(model.get("model_config") or {}),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return CoordCheckModel(**values)


def _coord_check(args: argparse.Namespace, debug: bool) -> int:
    """``hf-fasttrain coord-check``: the table and the verdict; exit 0 flat, 1 not flat, 2 a refused option."""
    try:
        from .validation import ConfigError
        from .optim.spec import parse_optimizer_kwargs
        from .transfer.coord_check import CoordCheckModel, coord_check

        try:
            widths = [int(w) for w in args.widths.split(",") if w.strip()]
        except ValueError:
            raise ConfigError("widths", args.widths, "comma-separated integers, e.g. 64,128,256,512") from None
        sizes = {"model_type": args.model_type, "n_layer": args.n_layer, "head_dim": args.head_dim,
                 "vocab_size": args.vocab_size, "kv_heads_ratio": args.kv_heads_ratio, "mlp_ratio": args.mlp_ratio}
        optimizer, lr, kwargs = args.optimizer, args.lr, {}
        if args.config is not None:
            from .config.recipes import load_recipe, validate_recipe

            sections = validate_recipe(load_recipe(args.config))
            model = _recipe_model(sections, sizes)
            top = sections.get(None) or {}
            optimizer = optimizer or top.get("optimizer")
            lr = lr if lr is not None else top.get("learning_rate")
            kwargs = {k: v for k, v in dict(top.get("optimizer_kwargs") or {}).items()
                      if k not in ("parameterization", "base_width", "width")}
        else:
            model = CoordCheckModel(**{"n_layer": 2, "head_dim": 16, "vocab_size": 256,
                                       **{k: v for k, v in sizes.items() if v is not None}})
        optimizer = optimizer or "adamw"
        kwargs.update(parse_optimizer_kwargs(optimizer, args.optimizer_kwargs))
        result = coord_check(model, widths, parameterization=args.parameterization, optimizer=optimizer,
                             lr=3e-3 if lr is None else lr, steps=args.steps, base_width=args.base_width,
                             optimizer_kwargs=kwargs, batch_size=args.batch_size, seq_len=args.seq_len,
                             data=args.data, seed=args.seed, tolerance=args.tolerance)
    except ValueError as exc:  # ConfigError and the optimizers' refusals are ValueErrors
        if debug:
            raise
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = result.write(args.output_dir)
    print(result.table())
    print(result.summary())
    print(f"wrote {paths['json']}, {paths['md']}, {paths['png']}")
    return 0 if result.flat else 1


def _stage_starts(output_dir: str) -> int:
    """Stages started so far by the search in output_dir (0 without a state file)."""
    import json

    from .restarts import STATE_FILE

    try:
        with open(os.path.join(output_dir, STATE_FILE), encoding="utf-8") as f:
            return sum(int(t.get("starts", 0)) for t in json.load(f)["trials"].values())
    except (OSError, ValueError, KeyError, AttributeError):
        return 0


def _version(argv: Sequence[str]) -> int:
    from . import __version__

    print(__version__)
    return 0


def _recipe_description(path) -> str:
    """The first sentence of a recipe file's leading comment (bundled recipes start with what they are):
    comment lines joined until one ends with '.', or the next is indented (a command) or starts with '('."""
    parts: list[str] = []
    for line in path.read_text().splitlines():
        text = line[1:] if line.startswith("#") else None
        if text is None or not text.strip() or (parts and (text.startswith("  ") or text.strip().startswith("("))):
            break
        parts.append(text.strip())
        if text.rstrip().endswith("."):
            break
    return " ".join(parts)


def _recipes_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf-fasttrain recipes", allow_abbrev=False, description="Recipes bundled with hf_fasttrain.")
    parser.add_argument("action", choices=["list"], help="list: name, file and description of each bundled recipe")
    return parser


def _recipes(argv: Sequence[str]) -> int:
    parser = _recipes_parser()
    if _parse(parser, argv) is None:
        return 2
    from .config.options import default_recipe_dirs, find_recipes

    names = find_recipes(default_recipe_dirs())
    width = max((len(n) for n in names), default=0)
    for name, path in names.items():
        print(f"{name:<{width}}  {_recipe_description(path)}\n{'':<{width}}  {path}")
    # the command a wheel installs; recipes/gpt2_small.py is only in a checkout
    print("Run one with: hf-fasttrain train --config <name>  (or a path, or hf://<owner>/<repo>)")
    return 0


def _push_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="hf-fasttrain push-recipe",
        allow_abbrev=False,
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
    p.add_argument("--commit-message", default=None, help="the commit's message (default: one naming the recipe)")
    return p


def _push_recipe(args: argparse.Namespace, debug: bool) -> int:
    from .validation import check_ranges
    from .config.args import DataArguments, ModelArguments
    from .run.push import push_recipe
    from .config.recipes import load_recipe, recipe_path, validate_recipe

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


def _generate(argv: Sequence[str]) -> int:
    from .run.generate import main as generate_main

    return generate_main(argv)


COMMANDS = {"train": _train, "generate": _generate, "tokenize": _parsed_command(_tokenize_parser, _tokenize),
            "recipes": _recipes, "push-recipe": _parsed_command(_push_parser, _push_recipe), "restarts": _restarts,
            "coord-check": _parsed_command(_coord_check_parser, _coord_check), "tune-transfer": _tune_transfer,
            "version": _version}


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, end="")
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd not in COMMANDS:
        from .validation import unknown_name

        print(f"error: {unknown_name('command', cmd, COMMANDS)}", file=sys.stderr)
        return 2
    return COMMANDS[cmd](rest)


if __name__ == "__main__":
    sys.exit(main())
