"""Intent-detection datasets: banking77, clinc150, hwu64 and user CSV/TSV/JSONL files.

A dataset gives train / test (/ val) texts with int32 label ids into a sorted,
stable label vocabulary (the sorted set of training labels), a seeded few-shot
training subset (N examples per label, `shots=0` for all) and a k-NN pool that
is configured separately from the training subset.

Built-in sets are found, in this order, under `data_dir/<name>/`, then in the
copies vendored in the package (`convfit_jax/data/vendor/<name>/`, each with
its licence), then in the download cache, downloaded once
from their original public files when the network is allowed (neither
CONVFIT_OFFLINE nor HF_HUB_OFFLINE set), converted to the vendored layout and
checked against the vendored files' sha256 (see `sources.py`). A caller may
instead give its own {file: (url, sha256)} table (`urls=`; see `fetch_file`).

The file readers here (`read_rows`, `read_labelled_file`) are also used by the
conversation readers: every bad row is a `DataError` naming file and line.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import urllib.request
import warnings
import zlib
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import numpy as np

from convfit_jax.data import sources

VENDOR_DIR = Path(__file__).resolve().parent / "vendor"
BUILTIN_DATASETS = ("banking77", "clinc150", "hwu64")
DATASET_NAMES = BUILTIN_DATASETS + ("csv",)
OOS_LABEL = "oos"

# Files of each built-in set: split name -> file names concatenated in that split.
# clinc150's out-of-scope queries join its in-scope splits under the label `oos`
# unless `include_oos=False`.
_SPLIT_FILES = {
  "banking77": {"train": ("train.csv",), "train_minus_val": ("train_minus_val.csv",),
                "val": ("val.csv",), "test": ("test.csv",)},
  "hwu64": {"train": ("train.csv",), "train_minus_val": ("train_minus_val.csv",),
            "val": ("val.csv",), "test": ("test.csv",)},
  "clinc150": {"train": ("train.csv", "oos_train.csv"), "val": ("val.csv", "oos_val.csv"),
               "test": ("test.csv", "oos_test.csv")},
}

_FORMATS = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}


class DataError(ValueError):
  """A bad input file; the message starts with `file:line:` where a line applies."""


class DuplicateRowsWarning(UserWarning):
  """Repeated (text, label) rows in a file: kept, counted in the message."""


def file_format(path: str | os.PathLike, fmt: str | None = None) -> str:
  """`fmt` if given, else 'csv' | 'tsv' | 'jsonl' from the file's suffix."""
  if fmt is not None:
    if fmt not in ("csv", "tsv", "jsonl"):
      raise ValueError(f"unknown file format {fmt!r}; known: csv, tsv, jsonl")
    return fmt
  suffix = Path(path).suffix.lower()
  if suffix not in _FORMATS:
    raise DataError(f"{path}: cannot tell the format from suffix {suffix!r}; "
                    f"known suffixes: {', '.join(sorted(_FORMATS))}")
  return _FORMATS[suffix]


def decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
  """(line number from 1, line without its end) of a UTF-8 file, streamed."""
  with open(path, "rb") as f:
    for lineno, raw in enumerate(f, start=1):
      try:
        line = raw.decode("utf-8")
      except UnicodeDecodeError as e:
        raise DataError(f"{path}:{lineno}: invalid UTF-8 at byte {e.start} of the line") from None
      if lineno == 1:
        line = line.removeprefix("\ufeff")
      yield lineno, line.rstrip("\r\n")


def read_rows(path: str | os.PathLike, columns: Sequence[str], optional: Sequence[str] = (),
              fmt: str | None = None) -> Iterator[tuple[int, dict[str, str]]]:
  """Streams the rows of a CSV (quoted), TSV (no quoting, header) or JSONL file.

  Args:
    path: the file.
    columns: columns every row must have.
    optional: columns returned when present (a missing one is '' in every row).
    fmt: 'csv' | 'tsv' | 'jsonl'; None picks it from the suffix.
  Yields:
    (line number, {column: value}) for each non-blank row; values are str.
  Raises:
    DataError naming file and line: invalid UTF-8, missing column, wrong number
    of fields, invalid JSON, a non-string value.
  """
  path = Path(path)
  fmt = file_format(path, fmt)
  wanted = tuple(columns) + tuple(c for c in optional if c not in columns)
  if fmt == "jsonl":
    yield from _read_jsonl(path, columns, wanted)
    return
  lines = decoded_lines(path)
  if fmt == "csv":
    numbered = iter(lines)
    current = [0]

    def texts():
      for lineno, line in numbered:
        current[0] = lineno
        yield line
    records = ((current[0], rec) for rec in csv.reader(texts()))
  else:
    records = ((lineno, line.split("\t")) for lineno, line in lines)
  header = None
  for lineno, fields in records:
    if header is None:
      header = [h.strip() for h in fields]
      missing = [c for c in columns if c not in header]
      if missing:
        raise DataError(f"{path}:{lineno}: missing column(s) {', '.join(map(repr, missing))}; "
                        f"the header has {', '.join(map(repr, header))}")
      positions = {c: header.index(c) for c in wanted if c in header}
      continue
    if not fields or fields == [""]:
      continue
    if len(fields) != len(header):
      raise DataError(f"{path}:{lineno}: {len(fields)} fields, the header has {len(header)}")
    yield lineno, {c: (fields[positions[c]] if c in positions else "") for c in wanted}
  if header is None:
    raise DataError(f"{path}: empty file (no header)")


def json_objects(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict]]:
  """(line number, object) of a JSON-lines file; blank lines are skipped, and a line that
  is not a JSON object holding every `required` key is a `DataError` naming it."""
  for lineno, line in decoded_lines(path):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
      raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    missing = [c for c in required if c not in obj]
    if missing:
      raise DataError(f"{path}:{lineno}: missing column(s) {', '.join(map(repr, missing))}; "
                      f"the object has {', '.join(map(repr, obj))}")
    yield lineno, obj


def _read_jsonl(path: Path, columns: Sequence[str], wanted: Sequence[str]):
  for lineno, obj in json_objects(path, columns):
    row = {}
    for c in wanted:
      value = obj.get(c, "")
      if not isinstance(value, str):
        raise DataError(f"{path}:{lineno}: column {c!r} is {type(value).__name__}, expected a string")
      row[c] = value
    yield lineno, row


@dataclasses.dataclass(frozen=True)
class LabelledFile:
  """The rows of one labelled file, in file order."""
  path: Path
  texts: list[str]
  labels: list[str]
  lines: list[int]


def read_labelled_file(path: str | os.PathLike, text_column: str = "text",
                       label_column: str = "label", fmt: str | None = None) -> LabelledFile:
  """Reads (text, label) rows; an empty text or label is a DataError naming the line.

  Repeated (text, label) rows are kept, with one DuplicateRowsWarning giving their count.
  """
  path = Path(path)
  texts, labels, lines = [], [], []
  first_seen: dict[tuple[str, str], int] = {}
  duplicates = []
  for lineno, row in read_rows(path, (text_column, label_column), fmt=fmt):
    text, label = row[text_column], row[label_column].strip()
    if not text.strip():
      raise DataError(f"{path}:{lineno}: empty text in column {text_column!r}")
    if not label:
      raise DataError(f"{path}:{lineno}: empty label in column {label_column!r}")
    key = (text, label)
    if key in first_seen:
      duplicates.append((lineno, first_seen[key]))
    else:
      first_seen[key] = lineno
    texts.append(text)
    labels.append(label)
    lines.append(lineno)
  if not texts:
    raise DataError(f"{path}: no rows")
  if duplicates:
    line, orig = duplicates[0]
    warnings.warn(DuplicateRowsWarning(
      f"{path}: {len(duplicates)} duplicated row(s) kept (first: line {line} repeats line {orig})"),
      stacklevel=2)
  return LabelledFile(path, texts, labels, lines)


@dataclasses.dataclass(frozen=True)
class IntentSplit:
  """Texts and their label ids; `labels` is [n] int32."""
  texts: tuple[str, ...]
  labels: np.ndarray

  def __len__(self) -> int:
    return len(self.texts)

  def subset(self, indices: np.ndarray) -> IntentSplit:
    """The rows at `indices` ([m] int), in that order."""
    return IntentSplit(tuple(self.texts[i] for i in indices),
                       np.asarray(self.labels[np.asarray(indices, np.int64)], np.int32))


@dataclasses.dataclass(frozen=True)
class IntentData:
  """One intent dataset, ready for training and k-NN evaluation.

  Attributes:
    name: dataset name ('csv' for user files).
    label_names: sorted label vocabulary; label id i is label_names[i].
    train: the few-shot training set (all of `full_train` when shots=0).
    pool: the k-NN pool (by default the same rows as `train`).
    test: the test set.
    val: the validation set, or None.
    full_train: every training row, in file order.
  """
  name: str
  label_names: tuple[str, ...]
  train: IntentSplit
  pool: IntentSplit
  test: IntentSplit
  val: IntentSplit | None
  full_train: IntentSplit

  @property
  def num_labels(self) -> int:
    return len(self.label_names)


def unknown_dataset_error(name: str) -> ValueError:
  return ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASET_NAMES)}")


def _has_files(folder: Path, name: str) -> bool:
  return all((folder / f).is_file() for files in _SPLIT_FILES[name].values() for f in files)


def fetch_file(url: str, sha256: str, cache_dir: str | os.PathLike) -> Path:
  """Downloads `url` once into `cache_dir`, keeping it only if its sha256 matches.

  A cached copy is re-checked on every call, so a corrupted cache is an error,
  not silently used. Any urllib scheme works (https://, file://).
  """
  cache_dir = Path(cache_dir)
  target = cache_dir / url.rstrip("/").rsplit("/", 1)[-1]
  if target.is_file():
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != sha256:
      raise DataError(f"{target}: cached file has sha256 {digest}, expected {sha256}; delete it")
    return target
  cache_dir.mkdir(parents=True, exist_ok=True)
  with urllib.request.urlopen(url) as response:
    data = response.read()
  digest = hashlib.sha256(data).hexdigest()
  if digest != sha256:
    raise DataError(f"{url}: sha256 {digest}, expected {sha256}; not cached")
  # Written under a temporary name then renamed, so a concurrent reader never
  # sees a partial file.
  fd, tmp = tempfile.mkstemp(dir=cache_dir)
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  os.replace(tmp, target)
  return target


OFFLINE_ENV_VARS = ("CONVFIT_OFFLINE", "HF_HUB_OFFLINE")


def default_cache_dir() -> Path:
  """~/.cache/convfit_jax (read at call time, so HOME can change)."""
  return Path.home() / ".cache" / "convfit_jax"


def offline_reason() -> str | None:
  """'VAR=value' of the first of OFFLINE_ENV_VARS that forbids downloads, else None.

  A variable counts when set to anything but '', '0', 'false', 'no' or 'off'
  (so HF_HUB_OFFLINE=0 still allows downloads, as in huggingface_hub).
  """
  for var in OFFLINE_ENV_VARS:
    value = os.environ.get(var, "")
    if value.strip().lower() not in ("", "0", "false", "no", "off"):
      return f"{var}={value}"
  return None


def _mismatches(folder: Path, expected: Mapping[str, str]) -> list[tuple[str, str, str]]:
  """(file, actual sha256 or 'missing', expected sha256) for each file that differs."""
  bad = []
  for f, want in expected.items():
    path = folder / f
    got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    if got != want:
      bad.append((f, got, want))
  return bad


def upstream_cache_folder(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
  """Where the converted download of built-in set `name` is cached."""
  return Path(cache_dir or default_cache_dir()) / "upstream" / name


def _download(url: str) -> bytes:
  with urllib.request.urlopen(url, timeout=120) as response:
    return response.read()


def download_builtin(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
  """The cached, verified upstream copy of `name`, downloading and converting it once.

  The files listed in `sources.SOURCES[name].urls` are downloaded into a temporary
  folder under the cache, converted to the vendored layout, and every converted
  file's sha256 is checked against `sources.SOURCES[name].sha256`; only then is
  the folder renamed into place (atomically), with `source.json` recording each
  URL and the sha256 and size of the bytes downloaded. Later calls re-check the
  cached files' sha256 and download nothing. Does not look at OFFLINE_ENV_VARS
  (`dataset_dir` does).

  Raises:
    DataError naming the URL or the file and both hashes on a failed download,
    conversion or check; nothing is cached then.
  """
  source = sources.SOURCES[name]
  target = upstream_cache_folder(name, cache_dir)
  if target.exists():
    bad = _mismatches(target, source.sha256)
    if bad:
      f, got, want = bad[0]
      raise DataError(f"{target / f}: cached file has sha256 {got}, expected {want}; "
                      f"delete {target} to download {name} again")
    return target
  target.parent.mkdir(parents=True, exist_ok=True)
  work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
  try:
    raw, out = work / "raw", work / "out"
    raw.mkdir()
    out.mkdir()
    record = {}
    for fname, url in source.urls.items():
      try:
        data = _download(url)
      except (OSError, ValueError) as e:  # urllib.error.URLError is an OSError
        raise DataError(
          f"{name}: could not download {url} ({e}). Check the network, or put the set's files "
          f"in data_dir/{name}/ (see convfit_jax/data/vendor/README.md for the layout)") from None
      (raw / fname).write_bytes(data)
      record[fname] = {"url": url, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    try:
      source.convert(raw, out)
    except (ValueError, KeyError, IndexError) as e:
      raise DataError(f"{name}: cannot convert the files downloaded from "
                      f"{', '.join(source.urls.values())}: {e}") from None
    bad = _mismatches(out, source.sha256)
    if bad:
      lines = "; ".join(f"{f}: sha256 {got}, expected {want}" for f, got, want in bad)
      raise DataError(f"{name}: the files converted from {', '.join(source.urls.values())} "
                      f"differ from the vendored copy ({lines}); not cached. The upstream files "
                      f"may have changed: put the set's files in data_dir/{name}/ instead")
    (out / "source.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    try:
      os.replace(out, target)
    except OSError:
      # Another process put a copy in place first; use it if it checks out.
      if not target.exists():
        raise
      return download_builtin(name, cache_dir)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  return target


def dataset_dir(name: str, data_dir: str | os.PathLike | None = None,
                urls: Mapping[str, tuple[str, str]] | None = None,
                cache_dir: str | os.PathLike | None = None) -> Path:
  """The folder holding built-in set `name`'s files.

  Looks in `data_dir/<name>/`, then the vendored copy. Then, with `urls`
  ({file name: (url, sha256)}), downloads every file of the set into
  `cache_dir/<name>/`; without, uses the set's upstream files (`download_builtin`:
  banking77, clinc150, hwu64) cached in `cache_dir/upstream/<name>/`, downloading them
  unless CONVFIT_OFFLINE or HF_HUB_OFFLINE is set. `cache_dir` defaults to
  ~/.cache/convfit_jax.

  Raises:
    FileNotFoundError listing every place tried and why no download happened.
    DataError on a failed download or sha256 check (see `download_builtin`).
  """
  if name not in BUILTIN_DATASETS:
    raise unknown_dataset_error(name)
  candidates = ([Path(data_dir) / name] if data_dir else []) + [VENDOR_DIR / name]
  for folder in candidates:
    if _has_files(folder, name):
      return folder
  if urls:
    cache = Path(cache_dir or default_cache_dir()) / name
    for files in _SPLIT_FILES[name].values():
      for f in files:
        if f not in urls:
          raise ValueError(f"{name}: no URL for {f}")
        fetch_file(*urls[f], cache)
    return cache
  tried = [f"{folder} (no files)" for folder in candidates]
  cache = upstream_cache_folder(name, cache_dir)
  if cache.exists():
    return download_builtin(name, cache_dir)  # checks the cached files, downloads nothing
  tried.append(f"{cache} (not downloaded yet)")
  reason = offline_reason()
  if reason:
    upstream = list(sources.SOURCES[name].urls.values())
    raise FileNotFoundError(
      f"{name}: not found; tried {'; '.join(tried)}; not downloading its {len(upstream)} "
      f"upstream file(s) (first: {upstream[0]}) because {reason}. "
      f"Unset it to download once, or put the set's files in data_dir/{name}/")
  return download_builtin(name, cache_dir)


def few_shot_indices(texts: Sequence[str], labels: np.ndarray, label_names: Sequence[str],
                     shots: int, seed: int, allow_fewer: bool = False) -> np.ndarray:
  """Seeded N-per-label sample; [m] int64 row indices, ascending.

  Each label draws from its own PCG64 stream seeded by (seed, crc32(label)), over
  its rows sorted by (text, row), so the sample does not depend on the machine,
  the process, the row order of the file or the other labels, and for one seed
  the N-shot set is contained in every larger-shot set.

  Args:
    texts: n texts.
    labels: [n] int label ids into `label_names`.
    label_names: the vocabulary.
    shots: N per label; 0 takes every row.
    seed: the sampling seed.
    allow_fewer: take all rows of a label with fewer than N instead of failing.
  """
  labels = np.asarray(labels)
  if shots < 0:
    raise ValueError(f"shots must be >= 0, got {shots}")
  if shots == 0:
    return np.arange(len(labels), dtype=np.int64)
  chosen = []
  for label_id, label in enumerate(label_names):
    rows = np.flatnonzero(labels == label_id)
    if len(rows) < shots and not allow_fewer:
      raise ValueError(f"label {label!r} has {len(rows)} training examples, fewer than "
                       f"shots={shots} (set allow_fewer to take all it has)")
    rows = np.array(sorted(rows, key=lambda i: (texts[i], i)), np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, zlib.crc32(label.encode("utf-8"))]))
    chosen.append(rows[rng.permutation(len(rows))[:shots]])
  return np.sort(np.concatenate(chosen)) if chosen else np.zeros((0,), np.int64)


def _encode(files: Sequence[LabelledFile], vocab: Mapping[str, int]) -> IntentSplit:
  texts, ids = [], []
  for lf in files:
    for text, label, line in zip(lf.texts, lf.labels, lf.lines):
      if label not in vocab:
        raise DataError(f"{lf.path}:{line}: label {label!r} does not occur in the training data")
      texts.append(text)
      ids.append(vocab[label])
  return IntentSplit(tuple(texts), np.asarray(ids, np.int32))


def load_intent_data(name: str, *, data_dir: str | os.PathLike | None = None,
                     train_file: str | os.PathLike | None = None,
                     test_file: str | os.PathLike | None = None,
                     val_file: str | os.PathLike | None = None,
                     text_column: str = "text", label_column: str = "label",
                     shots: int = 0, seed: int = 0, pool_shots: int | None = None,
                     allow_fewer: bool = False, train_split: str = "train",
                     include_oos: bool = True,
                     urls: Mapping[str, tuple[str, str]] | None = None,
                     cache_dir: str | os.PathLike | None = None) -> IntentData:
  """Loads an intent dataset with its few-shot training set and k-NN pool.

  Args:
    name: 'banking77' | 'clinc150' | 'hwu64', or 'csv' for user files.
    data_dir: folder holding `<name>/` with the built-in set's files (optional).
    train_file, test_file, val_file: user files (name='csv'; CSV, TSV or JSONL by
      suffix). For a built-in set, they replace its files when given.
    text_column, label_column: column (or JSON key) names in user files.
    shots: training examples per label (0 = all).
    seed: few-shot sampling seed.
    pool_shots: k-NN pool: None = the training set, 0 = all training rows, N =
      N per label drawn with the same seed (contains the training set when N >= shots).
    allow_fewer: a label with fewer than `shots` rows gives all it has instead of an error.
    train_split: 'train' or 'train_minus_val' (banking77 and hwu64: DialoGLUE's
      train, disjoint from val).
    include_oos: clinc150 only: add its out-of-scope rows with label 'oos'.
    urls: {file name: (url, sha256)} to download a built-in set from when no local copy exists.
    cache_dir: download cache (default ~/.cache/convfit_jax); banking77 and clinc150 are
      downloaded from their upstream files into it when no local copy exists (see
      `dataset_dir`).
  """
  if name not in DATASET_NAMES:
    raise unknown_dataset_error(name)
  if name == "csv":
    if train_file is None or test_file is None:
      raise ValueError("name='csv' needs train_file and test_file")
    read = lambda f: [read_labelled_file(f, text_column, label_column)]
    train_files, test_files = read(train_file), read(test_file)
    val_files = read(val_file) if val_file else None
  else:
    folder = None
    splits = _SPLIT_FILES[name]
    if train_split not in splits or train_split in ("val", "test"):
      raise ValueError(f"{name}: unknown train_split {train_split!r}; known: "
                       f"{', '.join(s for s in splits if s not in ('val', 'test'))}")

    def read(split, override):
      nonlocal folder
      if override is not None:
        return [read_labelled_file(override)]
      folder = folder or dataset_dir(name, data_dir, urls, cache_dir)
      files = splits[split] if include_oos else splits[split][:1]
      return [read_labelled_file(folder / f) for f in files]
    train_files, test_files = read(train_split, train_file), read("test", test_file)
    val_files = read("val", val_file)
  label_names = tuple(sorted({l for lf in train_files for l in lf.labels}))
  vocab = {l: i for i, l in enumerate(label_names)}
  full_train = _encode(train_files, vocab)
  test = _encode(test_files, vocab)
  val = _encode(val_files, vocab) if val_files else None
  train_idx = few_shot_indices(full_train.texts, full_train.labels, label_names, shots, seed,
                               allow_fewer)
  train = full_train.subset(train_idx)
  if pool_shots is None:
    pool = train
  else:
    pool = full_train.subset(few_shot_indices(full_train.texts, full_train.labels, label_names,
                                              pool_shots, seed, allow_fewer))
  return IntentData(name, label_names, train, pool, test, val, full_train)


def from_config(config) -> IntentData:
  """`load_intent_data` from a `config.data`-style mapping (ConfigDict or dict).

  Reads name, data_dir, train_file, test_file, val_file, text_column,
  label_column, shots, seed, pool_shots, allow_fewer, train_split, include_oos;
  missing or empty ('' / None) fields take the defaults.
  """
  get = config.get
  def opt(key):
    value = get(key, None)
    return None if value in ("", None) else value
  kwargs = {k: opt(k) for k in ("data_dir", "train_file", "test_file", "val_file", "pool_shots")}
  if kwargs["pool_shots"] is not None and int(kwargs["pool_shots"]) < 0:
    kwargs["pool_shots"] = None
  return load_intent_data(
    get("name"), text_column=get("text_column", "text"), label_column=get("label_column", "label"),
    shots=int(get("shots", 0)), seed=int(get("seed", 0)),
    allow_fewer=bool(get("allow_fewer", False)), train_split=get("train_split", "train") or "train",
    include_oos=bool(get("include_oos", True)), **kwargs)
