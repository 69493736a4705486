"""Where the text comes from: one ``dataset`` string resolved to a ``datasets`` loader, and loaded.

:func:`resolve_source` is the whole rule, and it only looks at the file system (it loads nothing):

- a file, a comma list of files, a glob (``data/*.parquet``, ``**`` recursive) or a folder of
  ``.parquet``, ``.csv``, ``.tsv``, ``.arrow``, ``.json``, ``.jsonl`` or ``.txt`` files (the text formats
  also compressed: ``.gz``, ``.zst``, ``.bz2``, ``.xz``) -> that format's packaged builder with
  ``data_files``. The builder follows the extension; files of two formats are refused. In a folder, files
  whose names or folders say ``train`` / ``validation`` (``valid``, ``val``, ``dev``) / ``test`` go to that
  split (the rule of ``datasets``), other files are ignored when they are not data (``README.md``);
- a ``save_to_disk`` folder (a ``Dataset`` or a ``DatasetDict``) -> ``load_from_disk``;
- a folder written by ``hf-fasttrain tokenize`` (a ``manifest.json`` beside parquet shards) -> parquet;
- a nanoGPT data folder (``train.bin`` and ``val.bin`` of uint16 ids) is read whole by
  :mod:`hf_fasttrain.data.chars` (not by ``datasets``): :func:`is_nanogpt_folder` says which folders are;
- anything else, or any name with ``data_files`` / ``data_dir`` -> ``datasets.load_dataset(name, ...)``
  (a Hub dataset, with ``dataset_config``, ``dataset_revision``, ``dataset_split``).

:func:`load_source` runs that loader (``streaming=True`` gives an ``IterableDatasetDict`` through the same
resolution) and turns what goes wrong with a user's files into one-line :class:`DataError` messages that
name the file: missing, empty, unreadable, not UTF-8 (with the byte offset), not the format its name says.

Example:
    >>> import os, tempfile
    >>> from datasets import Dataset
    >>> d = tempfile.mkdtemp()
    >>> _ = Dataset.from_dict({"text": ["a b", "c d"]}).to_parquet(os.path.join(d, "part-0.parquet"))
    >>> builder, kwargs = resolve_source(d)
    >>> builder, [os.path.basename(f) for f in kwargs["data_files"]["train"]]
    ('parquet', ['part-0.parquet'])
"""

from __future__ import annotations

import codecs
import contextlib
import glob
import json
import logging
import os
from pathlib import Path
from typing import Any, NamedTuple, Optional, Sequence, Union

from ..validation import ConfigError

__all__ = [
    "DataError",
    "Source",
    "FORMATS",
    "COMPRESSIONS",
    "LOAD_FROM_DISK",
    "MANIFEST",
    "resolve_source",
    "load_source",
    "with_validation",
    "check_text_column",
    "first_non_utf8",
    "NANOGPT_FILES",
    "is_nanogpt_folder",
    "load_source_options",
    "pretokenized_manifest",
]

# extension -> (packaged builder, extra builder kwargs); the text formats may also be compressed
FORMATS: dict[str, tuple[str, dict[str, Any]]] = {
    ".parquet": ("parquet", {}),
    ".arrow": ("arrow", {}),
    ".csv": ("csv", {}),
    ".tsv": ("csv", {"sep": "\t"}),
    ".json": ("json", {}),
    ".jsonl": ("json", {}),
    # a .txt file: one document per paragraph (blank-line separated), not one per line
    ".txt": ("text", {"sample_by": "paragraph"}),
    ".text": ("text", {"sample_by": "paragraph"}),
}
_BUILDERS = {b for b, _ in FORMATS.values()}
TEXT_FORMATS = (".csv", ".tsv", ".json", ".jsonl", ".txt", ".text")
COMPRESSIONS = (".gz", ".zst", ".bz2", ".xz")
LOAD_FROM_DISK = "load_from_disk"  # the "builder" of a save_to_disk folder
MANIFEST = "manifest.json"  # written by `hf-fasttrain tokenize` beside its shards
PRETOKENIZED_FORMAT = "hf_fasttrain.pretokenized"
# files a data folder may hold that are not data (a Hub repo's card, a git attribute file, ...)
NANOGPT_FILES = ("train.bin", "val.bin")  # a nanoGPT data folder: uint16 token ids (prepare.py's format)
_NOT_DATA = {"readme.md", ".gitattributes", "license", "license.md", "license.txt", "dataset_infos.json"}
_ALLOWED = ".parquet, .csv, .tsv, .arrow, .json, .jsonl or .txt (text formats also .gz/.zst/.bz2/.xz)"


class DataError(ConfigError):
    """Data that cannot be trained on, said in one line: ``<field>: <what is wrong>; <what to do>``.

    Raised before any training; the command line prints ``error: ...`` and exits with status 2.
    """


class Source(NamedTuple):
    """How to load a ``dataset`` string: ``datasets.load_dataset(builder, **kwargs)``, or
    ``datasets.load_from_disk(**kwargs)`` when ``builder`` is :data:`LOAD_FROM_DISK`. Unpacks as
    ``builder, kwargs = resolve_source(...)``."""

    builder: str
    kwargs: dict

    @property
    def kind(self) -> str:
        """``"disk"`` (save_to_disk), ``"files"`` (local files, one format) or ``"hub"`` (a name)."""
        if self.builder == LOAD_FROM_DISK:
            return "disk"
        files = self.kwargs.get("data_files")
        local = (self.builder in _BUILDERS and isinstance(files, dict) and files
                 and all(os.path.isabs(f) for fs in files.values() for f in fs))
        return "files" if local else "hub"

    @property
    def files(self) -> list[str]:
        """The local data files, all splits, in order (empty for ``disk`` and ``hub``)."""
        if self.kind != "files":
            return []
        return [f for fs in self.kwargs["data_files"].values() for f in fs]


def _format_of(path: str) -> Optional[str]:
    """The data extension of ``path`` (``.jsonl`` for ``x.jsonl.gz``), or None."""
    name = os.path.basename(path).lower()
    for comp in COMPRESSIONS:
        if name.endswith(comp):
            inner = os.path.splitext(name[: -len(comp)])[1]
            return inner if inner in TEXT_FORMATS else None
    ext = os.path.splitext(name)[1]
    return ext if ext in FORMATS else None


def _is_save_to_disk(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (
        (folder / "state.json").is_file() and (folder / "dataset_info.json").is_file())


def pretokenized_manifest(folder: Path) -> Optional[dict]:
    path = folder / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("format") == PRETOKENIZED_FORMAT else None


def is_nanogpt_folder(path: Union[str, os.PathLike, None]) -> bool:
    """Whether ``path`` is a nanoGPT data folder: ``train.bin`` and ``val.bin`` in it (``meta.pkl`` optional)."""
    if not path:
        return False
    p = Path(os.path.expanduser(str(path)))
    return p.is_dir() and all((p / name).is_file() for name in NANOGPT_FILES)


def _looks_like_path(part: str) -> bool:
    """A path, not a Hub name: starts like one, has a data extension or is a glob."""
    lowered = part.lower()
    return (part.startswith((".", "/", "~")) or _format_of(part) is not None or any(c in part for c in "*?[")
            or lowered.endswith(COMPRESSIONS))


def _folder_files(folder: Path) -> list[str]:
    """The data files under ``folder`` (recursive, hidden ones skipped), sorted; refuses a folder with none."""
    found, other = [], set()
    for root, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for f in files:
            if f.startswith(".") or f.lower() in _NOT_DATA:
                continue
            p = os.path.join(root, f)
            (found.append(p) if _format_of(p) else other.add(os.path.splitext(f)[1] or f))
    if not found:
        extra = f" (it holds {', '.join(sorted(other)[:6])})" if other else " (it is empty)"
        raise DataError("dataset", str(folder), problem=f"folder {str(folder)!r} holds no data files{extra}",
                        allowed=f"a data folder holds {_ALLOWED} files, or is a save_to_disk folder")
    return sorted(found)


def _split_folder(folder: Path, files: list[str]) -> dict[str, list[str]]:
    """Files -> splits by the names ``datasets`` gives splits (train/validation/test in file or folder
    names); all in ``train`` when no name says a split."""
    from datasets.data_files import DataFilesDict, get_data_patterns

    try:
        patterns = get_data_patterns(str(folder))
        resolved = DataFilesDict.from_patterns(patterns, base_path=str(folder))
    except Exception:  # no split pattern applies (e.g. only non-data names): everything is train
        return {"train": files}
    keep = {os.path.abspath(f) for f in files}
    splits = {str(split): sorted(f for f in map(os.path.abspath, fs) if f in keep) for split, fs in resolved.items()}
    splits = {k: v for k, v in splits.items() if v}
    placed = {f for fs in splits.values() for f in fs}
    if not splits or "train" not in splits:
        return {"train": files}
    if placed != keep:  # files no split name covers join train
        splits["train"] = sorted(set(splits["train"]) | (keep - placed))
    return splits


def _expand(part: str) -> list[str]:
    if any(c in part for c in "*?["):
        matches = sorted(p for p in glob.glob(os.path.expanduser(part), recursive=True) if os.path.isfile(p))
        if not matches:
            raise DataError("dataset", part, problem=f"{part!r} matches no file",
                            allowed="give existing files, a glob that matches some, or a folder")
        return matches
    return [os.path.expanduser(part)]


def _comma_list(value: Union[str, Sequence[str], None]) -> list[str]:
    if value is None:
        return []
    parts = value.split(",") if isinstance(value, str) else list(value)
    return [p.strip() for p in parts if p and p.strip()]


def resolve_source(
    dataset: str,
    dataset_config: Optional[str] = None,
    dataset_split: Optional[str] = None,
    dataset_revision: Optional[str] = None,
    data_files: Union[str, Sequence[str], dict, None] = None,
    data_dir: Optional[str] = None,
) -> Source:
    """The loader for ``dataset`` (see the module docstring for the rules): ``(builder, kwargs)``.

    Only the file system is read (which paths exist, what a folder holds); nothing is loaded, so the same
    answer serves ``load_dataset(builder, **kwargs, streaming=True)``. Local files come back absolute under
    ``kwargs["data_files"]`` as ``{split: [files]}`` (``Source.kind`` is then ``"files"``). Raises :class:`DataError` for a missing path, a glob that matches nothing, a folder with no data,
    mixed formats or a compressed binary format.
    """
    if not isinstance(dataset, str) or not dataset.strip():
        raise DataError("dataset", dataset, allowed=f"a path to {_ALLOWED} files, a folder, a glob or a Hub name")
    dataset = dataset.strip()
    hub_kwargs = {k: v for k, v in (("name", dataset_config), ("revision", dataset_revision),
                                    ("data_dir", data_dir), ("split", dataset_split)) if v is not None}
    if data_files is not None or data_dir is not None:  # the loader's own file selection: pass it through
        if data_files is not None:
            hub_kwargs["data_files"] = data_files if isinstance(data_files, dict) else _comma_list(data_files)
        return Source(dataset, hub_kwargs)

    parts = _comma_list(dataset)
    if len(parts) == 1:
        p = Path(os.path.expanduser(parts[0]))
        if p.is_dir():
            if is_nanogpt_folder(p):  # prepare_lm_data reads it whole; a stream or fine-tuning cannot
                raise DataError("dataset", str(p), problem=f"{str(p)!r} is a nanoGPT folder (train.bin, val.bin): "
                                "token ids read whole", allowed="train on it as pretraining rows (data_format: "
                                "text, streaming: false)")
            if _is_save_to_disk(p):
                return Source(LOAD_FROM_DISK, {"dataset_path": str(p.resolve())})
            manifest = pretokenized_manifest(p)
            if manifest is not None:
                splits = {s: [str((p / f).resolve()) for f in fs] for s, fs in manifest.get("shards", {}).items()}
                return Source("parquet", {"data_files": splits})
            files = _folder_files(p)
            splits = _split_folder(p, [str(Path(f).resolve()) for f in files])
            return _file_source(splits)
        if not p.exists() and not _looks_like_path(parts[0]):
            return Source(dataset, hub_kwargs)  # a Hub name (owner/name or name)
    files: list[str] = []
    for part in parts:
        for f in _expand(part):
            if os.path.isdir(f):
                raise DataError("dataset", dataset, problem=f"{f!r} is a folder inside a list",
                                allowed="give one folder alone, or files and globs separated by commas")
            if not os.path.exists(f):
                raise DataError("dataset", f, problem=f"file {f!r} does not exist",
                                allowed="give an existing file, a glob, a folder or a Hub dataset name")
            files.append(str(Path(f).resolve()))
    return _file_source({"train": files})


def _file_source(splits: dict[str, list[str]]) -> Source:
    files = [f for fs in splits.values() for f in fs]
    kinds: dict[tuple, list[str]] = {}
    for f in files:
        fmt = _format_of(f)
        if fmt is None:
            name = os.path.basename(f).lower()
            if any(name.endswith(c) for c in COMPRESSIONS):
                problem = f"{os.path.basename(f)!r}: only the text formats can be compressed"
            else:
                problem = f"{os.path.basename(f)!r} has no data extension"
            raise DataError("dataset", f, problem=problem, allowed=f"files of {_ALLOWED}")
        builder, extra = FORMATS[fmt]
        kinds.setdefault((builder, tuple(sorted(extra.items()))), []).append(fmt)
    if len(kinds) > 1:
        found = sorted({e for exts in kinds.values() for e in exts})
        raise DataError("dataset", ", ".join(found), problem=f"files of {len(kinds)} formats ({', '.join(found)})",
                        allowed="give files of one format (.json and .jsonl count as one); convert the others")
    (builder, extra), = kinds.keys()
    return Source(builder, {"data_files": splits, **dict(extra)})


# -- loading --------------------------------------------------------------------------------------
def first_non_utf8(path: str, chunk: int = 1 << 20) -> Optional[tuple[int, bytes]]:
    """``(byte offset, the bad bytes)`` of the first invalid UTF-8 in ``path`` (decompressed when it
    ends in a compression suffix), or None when the whole file decodes."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with _open_binary(path) as f:
        while True:
            data = f.read(chunk)
            try:
                decoder.decode(data, final=not data)
            except UnicodeDecodeError as e:
                buffered = len(e.object) - len(data)  # bytes held back from the previous chunk
                return offset - buffered + e.start, e.object[e.start:e.end]
            if not data:
                return None
            offset += len(data)


def _open_binary(path: str):
    name = path.lower()
    if name.endswith(".gz"):
        import gzip

        return gzip.open(path, "rb")
    if name.endswith(".bz2"):
        import bz2

        return bz2.open(path, "rb")
    if name.endswith(".xz"):
        import lzma

        return lzma.open(path, "rb")
    if name.endswith(".zst"):
        try:
            import zstandard
        except ImportError as e:
            raise DataError("dataset", path, problem=f"{os.path.basename(path)!r} is zstd-compressed",
                            allowed="install the zstandard package (pip install zstandard)") from e
        return zstandard.open(path, "rb")
    return open(path, "rb")


def _check_files_readable(files: Sequence[str]) -> None:
    """Cheap checks before ``datasets`` reads: each file exists, can be read, is not empty."""
    for f in files:
        short = os.path.basename(f)
        if not os.path.isfile(f):
            raise DataError("dataset", f, problem=f"file {f!r} does not exist", allowed="give existing files")
        if not os.access(f, os.R_OK):
            raise DataError("dataset", f, problem=f"file {f!r} cannot be read (permission denied)",
                            allowed="make it readable by this user")
        if os.path.getsize(f) == 0:
            raise DataError("dataset", f, problem=f"file {short!r} is empty ({f})",
                            allowed="remove it from the list or fill it")


def _diagnose(source: Source, exc: BaseException) -> DataError:
    """The one-line reason a load of local files failed, naming the file at fault."""
    builder = source.builder
    for f in source.files:
        short = os.path.basename(f)
        if builder in ("json", "csv", "text"):
            try:
                bad = first_non_utf8(f)
            except DataError as e:
                return e
            except (OSError, EOFError) as e:
                return DataError("dataset", f, problem=f"could not read {short!r} ({f}): {_first_line(e)}",
                                 allowed="check that the file is complete and its compression matches its name")
            if bad is not None:
                offset, data = bad
                return DataError("dataset", f, problem=f"{short!r} is not UTF-8 text: bytes {data!r} at byte offset "
                                 f"{offset:,} ({f})",
                                 allowed="re-encode it as UTF-8 (e.g. iconv -f latin1 -t utf-8)")
            with _open_binary(f) as fh:
                if not fh.read(1):
                    return DataError("dataset", f, problem=f"file {short!r} is empty once decompressed ({f})",
                                     allowed="remove it from the list or fill it")
        else:
            try:
                import pyarrow.parquet as pq
                import pyarrow as pa

                if builder == "parquet":
                    pq.read_metadata(f)
                else:  # the arrow builder reads the stream format (save_to_disk's) and the file format
                    with pa.memory_map(f) as m:
                        try:
                            pa.ipc.open_stream(m).read_all()
                        except pa.ArrowInvalid:
                            pa.ipc.open_file(m).read_all()
            except Exception as e:
                return DataError("dataset", f, problem=f"{short!r} is not a readable {builder} file: {_first_line(e)}",
                                 allowed=f"check the file; its extension must match its format ({_ALLOWED})")
    names = ", ".join(os.path.basename(f) for f in source.files[:3]) + (", ..." if len(source.files) > 3 else "")
    return DataError("dataset", names, problem=f"could not load {names} as {builder}: {_first_line(exc)}",
                     allowed=f"files whose content matches their extension ({_ALLOWED})")


def _first_line(exc: BaseException) -> str:
    cause = exc
    while cause.__cause__ is not None or (cause.__context__ is not None and not str(cause)):
        cause = cause.__cause__ or cause.__context__
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0]}" if text else type(cause).__name__


def load_source_options(data_args: Any, trust_remote_code: bool = False) -> dict[str, Any]:
    """`load_source`'s keyword arguments from a `DataArguments` (a field the object lacks is None)."""
    return {**{name: getattr(data_args, name, None) for name in ("dataset_split", "dataset_revision", "data_files",
                                                                  "data_dir")},
            "trust_remote_code": trust_remote_code}


def _split_of(loaded, dataset_split: str, dataset: str):
    """Split `dataset_split` of a loaded dataset dict, or a DataError naming the splits it has."""
    if dataset_split not in loaded:
        raise DataError("dataset_split", dataset_split, problem=f"{dataset_split!r} is not a split of {dataset!r}",
                        allowed=f"one of {sorted(loaded)}")
    return loaded[dataset_split]


def load_source(
    dataset: str,
    dataset_config: Optional[str] = None,
    dataset_split: Optional[str] = None,
    *,
    streaming: bool = False,
    trust_remote_code: bool = False,
    **where: Any,
):
    """Load what :func:`resolve_source` resolves: a ``DatasetDict`` (an ``IterableDatasetDict`` with
    ``streaming=True``) holding the splits the source has; a source with one split only (``dataset_split``,
    a ``Dataset`` saved to disk) comes back as ``{"train": ...}``. ``where`` passes resolve_source's other
    arguments (``dataset_revision``, ``data_files``, ``data_dir``).

    Errors with the user's data are :class:`DataError` (one line, the file named); a map-style source with
    no rows at all is one too.
    """
    import datasets

    source = resolve_source(dataset, dataset_config, dataset_split, **where)
    builder, kwargs = source
    kwargs = dict(kwargs)
    if source.kind == "files":
        _check_files_readable(source.files)
    try:
        if source.kind == "disk":
            loaded = datasets.load_from_disk(kwargs["dataset_path"])
            if dataset_split is not None and isinstance(loaded, datasets.DatasetDict):
                loaded = _split_of(loaded, dataset_split, dataset)
            if streaming:
                loaded = _to_iterable(loaded)
        else:
            if source.kind == "hub" and trust_remote_code:
                kwargs["trust_remote_code"] = True
            with _quiet_datasets(source.kind == "files"):  # its error logs: the diagnosis below says it in one line
                loaded = datasets.load_dataset(builder, **kwargs, streaming=streaming)
            if source.kind == "files" and dataset_split is not None:
                loaded = _split_of(loaded, dataset_split, dataset)
    except DataError:
        raise
    except Exception as exc:
        if source.kind == "files":
            raise _diagnose(source, exc) from exc
        if source.kind == "hub":
            raise _hub_error(dataset, exc) from exc
        raise DataError("dataset", dataset, problem=f"could not load the save_to_disk folder: {_first_line(exc)}",
                        allowed="check the folder (it must be written by Dataset/DatasetDict.save_to_disk)") from exc
    if source.kind == "files" and builder == "json" and not streaming and not _valid_utf8(loaded):
        # pyarrow's JSON reader keeps invalid UTF-8 in strings (the error would come at tokenization): find it
        raise _diagnose(source, UnicodeError("invalid UTF-8 in a string column"))
    if isinstance(loaded, (datasets.Dataset, datasets.IterableDataset)):
        cls = datasets.IterableDatasetDict if isinstance(loaded, datasets.IterableDataset) else datasets.DatasetDict
        loaded = cls({"train": loaded})
    if not streaming and sum(d.num_rows for d in loaded.values()) == 0:
        raise DataError("dataset", dataset, problem=f"{dataset!r} has no rows", allowed="give data with some text")
    return loaded


def _valid_utf8(loaded) -> bool:
    """Whether every string column of a loaded (map-style) source is valid UTF-8 (a C++ pass, no Python)."""
    import pyarrow as pa

    parts = loaded.values() if hasattr(loaded, "values") else [loaded]
    for ds in parts:
        table = ds.data.table
        for column in table.columns:
            if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
                for chunk in column.chunks:
                    try:
                        chunk.validate(full=True)
                    except pa.ArrowInvalid:
                        return False
    return True


@contextlib.contextmanager
def _quiet_datasets(on: bool):
    log = logging.getLogger("datasets")
    level = log.level
    if on:
        log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def _to_iterable(loaded):
    import datasets

    def one(ds):
        return ds.to_iterable_dataset(num_shards=max(1, len(ds.cache_files)))

    if isinstance(loaded, datasets.DatasetDict):
        return datasets.IterableDatasetDict({k: one(v) for k, v in loaded.items()})
    return one(loaded)


def _hub_error(dataset: str, exc: BaseException) -> DataError:
    text = _first_line(exc)
    local_hint = "a local file, glob or folder (none exists at that path), or a Hub dataset name"
    if "Offline" in text or "Couldn't reach" in text or "ConnectionError" in text:
        return DataError("dataset", dataset, problem=f"{dataset!r} is not a local path and the Hub cannot be reached "
                         f"({text})", allowed=f"give {local_hint} with network access or in the datasets cache")
    return DataError("dataset", dataset, problem=f"could not load {dataset!r}: {text}", allowed=f"give {local_hint}")


def with_validation(dd, validation_fraction: float = 0.05, seed: int = 0):
    """``DatasetDict(train, validation)``: the source's validation split (``validation``, else ``test``),
    else a ``validation_fraction`` cut of train with a fixed ``seed`` (the same rows on every run)."""
    from datasets import DatasetDict

    if "train" not in dd:
        raise DataError("dataset_split", None, problem=f"the data has no train split (splits: {sorted(dd)})",
                        allowed="name one with --dataset_split")
    for name in ("validation", "test"):
        if name in dd and dd[name].num_rows > 0:
            return DatasetDict({"train": dd["train"], "validation": dd[name]})
    train = dd["train"]
    if train.num_rows < 2:
        raise DataError("dataset", None, problem=f"{train.num_rows} row(s): too few to hold out a validation split",
                        allowed="give at least 2 documents, or a validation split")
    split = train.train_test_split(test_size=validation_fraction, seed=seed)
    return DatasetDict({"train": split["train"], "validation": split["test"]})


def check_text_column(columns: Sequence[str], text_column: str, dataset: Optional[str] = None) -> str:
    """What a split with ``columns`` holds: ``"text"`` (``text_column`` is there) or ``"input_ids"``
    (already tokenized); else a :class:`DataError` listing the columns and suggesting ``--text_column``."""
    if text_column in columns:
        return "text"
    if "input_ids" in columns:
        return "input_ids"
    strings = [c for c in columns if c != text_column]
    guess = f" (e.g. --text_column {strings[0]})" if len(strings) == 1 else ""
    where = f" of {dataset!r}" if dataset else ""
    raise DataError("text_column", text_column, problem=f"{text_column!r} is not a column{where}; its columns are "
                    f"{list(columns)}", allowed=f"name the text column with --text_column{guess}, or give "
                    "pre-tokenized rows in an input_ids column")
