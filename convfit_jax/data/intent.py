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
instead give its own {file: (url, sha256)} table (`urls=`; see `downloads.fetch_file`).

Files are read by `readers.py`, downloads are `downloads.py`, few-shot samples
`sampling.py`; this module assembles them into an `IntentData`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from convfit_jax.data import downloads, sampling, sources
from convfit_jax.data.readers import DataError, LabelledFile, read_labelled_file

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
    label_texts: each intent as text (`label_texts`: its description or readable name),
      or None when the names hold no words.
  """
  name: str
  label_names: tuple[str, ...]
  train: IntentSplit
  pool: IntentSplit
  test: IntentSplit
  val: IntentSplit | None
  full_train: IntentSplit
  label_texts: tuple[str, ...] | None = None

  @property
  def num_labels(self) -> int:
    return len(self.label_names)


def label_texts(label_names: Sequence, descriptions: Mapping[str, str] | None = None
                ) -> tuple[str, ...] | None:
  """Each intent as text to encode: its description when `descriptions` has one, else its
  name made readable ('card_arrival' -> 'card arrival'); None when some text holds no
  letter: ids such as '12' or 7 say nothing about their intent."""
  descriptions = descriptions or {}
  texts = tuple(descriptions.get(n) or " ".join(str(n).replace("_", " ").replace("-", " ").split()).lower()
                for n in label_names)
  return texts if all(any(c.isalpha() for c in t) for t in texts) else None


def from_lists(texts: Sequence[str], labels: Sequence, name: str = "memory") -> IntentData:
  """In-memory examples as the `IntentData` that `load(name='csv', shots=0)` builds from a
  file of the same rows: the sorted label vocabulary (labels kept as given, strings or
  ints), train = pool = full_train = every row in order; no test or validation split."""
  label_names = tuple(sorted(set(labels)))
  vocab = {l: i for i, l in enumerate(label_names)}
  rows = IntentSplit(tuple(texts), np.asarray([vocab[l] for l in labels], np.int32))
  empty = IntentSplit((), np.zeros(0, np.int32))
  return IntentData(name, label_names, rows, rows, empty, None, rows, label_texts(label_names))


def unknown_dataset_error(name: str) -> ValueError:
  return ValueError(f"unknown dataset {name!r}; known: {', '.join(DATASET_NAMES)}")


def _has_files(folder: Path, name: str) -> bool:
  return all((folder / f).is_file() for files in _SPLIT_FILES[name].values() for f in files)


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
    cache = Path(cache_dir or downloads.default_cache_dir()) / name
    for files in _SPLIT_FILES[name].values():
      for f in files:
        if f not in urls:
          raise ValueError(f"{name}: no URL for {f}")
        downloads.fetch_file(*urls[f], cache)
    return cache
  tried = [f"{folder} (no files)" for folder in candidates]
  cache = downloads.upstream_cache_folder(name, cache_dir)
  if cache.exists():
    return downloads.download_builtin(name, cache_dir)  # checks the cached files, downloads nothing
  tried.append(f"{cache} (not downloaded yet)")
  reason = downloads.offline_reason()
  if reason:
    upstream = list(sources.SOURCES[name].urls.values())
    raise FileNotFoundError(
      f"{name}: not found; tried {'; '.join(tried)}; not downloading its {len(upstream)} "
      f"upstream file(s) (first: {upstream[0]}) because {reason}. "
      f"Unset it to download once, or put the set's files in data_dir/{name}/")
  return downloads.download_builtin(name, cache_dir)


def choose_intents(label_names: Sequence[str], intents: int, seed: int) -> tuple[str, ...]:
  """`intents` of `label_names` drawn by `seed` (its own stream, apart from the few-shot
  sample's), sorted; all of them when `intents` is 0."""
  if intents == 0:
    return tuple(label_names)
  if not 0 < intents <= len(label_names):
    raise ValueError(f"intents={intents}: the training data has {len(label_names)} intents")
  rng = np.random.Generator(np.random.PCG64([seed, len(label_names), intents]))
  return tuple(sorted(rng.choice(np.asarray(label_names, object), intents, replace=False)))


def _encode(files: Sequence[LabelledFile], vocab: Mapping[str, int],
            left_out: frozenset = frozenset()) -> IntentSplit:
  """The rows of `files` as ids into `vocab`, skipping the intents in `left_out`."""
  texts, ids = [], []
  for lf in files:
    for text, label, line in zip(lf.texts, lf.labels, lf.lines):
      if label in left_out:
        continue
      if label not in vocab:
        raise DataError(f"{lf.path}:{line}: label {label!r} does not occur in the training data")
      texts.append(text)
      ids.append(vocab[label])
  return IntentSplit(tuple(texts), np.asarray(ids, np.int32))


def load(name: str, *, data_dir: str | os.PathLike | None = None,
                     train_file: str | os.PathLike | None = None,
                     test_file: str | os.PathLike | None = None,
                     val_file: str | os.PathLike | None = None,
                     text_column: str = "text", label_column: str = "label",
                     description_column: str = "", shots: int = 0, seed: int = 0, pool_shots: int | None = None,
                     allow_fewer: bool = False, train_split: str = "train",
                     include_oos: bool = True, intents: int = 0,
                     label_texts_in_pool: bool = False,
                     urls: Mapping[str, tuple[str, str]] | None = None,
                     cache_dir: str | os.PathLike | None = None) -> IntentData:
  """Loads an intent dataset with its few-shot training set and k-NN pool.

  Args:
    name: 'banking77' | 'clinc150' | 'hwu64', or 'csv' for user files.
    data_dir: folder holding `<name>/` with the built-in set's files (optional).
    train_file, test_file, val_file: user files (name='csv'; CSV, TSV or JSONL by
      suffix). For a built-in set, they replace its files when given.
    text_column, label_column: column (or JSON key) names in user files.
    description_column: a column of the training files saying what each intent is
      (`label_texts`; '' = none: names are read as text).
    shots: training examples per label (0 = all).
    seed: few-shot sampling seed.
    pool_shots: k-NN pool: None = the training set, 0 = all training rows, N =
      N per label drawn with the same seed (contains the training set when N >= shots).
    allow_fewer: a label with fewer than `shots` rows gives all it has instead of an error.
    train_split: 'train' or 'train_minus_val' (banking77 and hwu64: DialoGLUE's
      train, disjoint from val).
    include_oos: clinc150 only: add its out-of-scope rows with label 'oos'.
    intents: a seeded choice (`seed`) of this many of the training data's intents; every
      split keeps only their rows, ids over the chosen ones (0 = every intent).
    label_texts_in_pool: each intent as text (`label_texts`) joins the k-NN pool as one more
      example of its intent; names that hold no words are left out, with a warning.
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
    read = lambda f, **kw: [read_labelled_file(f, text_column, label_column, **kw)]
    train_files = read(train_file, description_column=description_column)
    test_files = read(test_file)
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
      vendored = folder == VENDOR_DIR / name
      return [read_labelled_file(folder / f, warn_duplicates=not vendored) for f in files]
    train_files, test_files = read(train_split, train_file), read("test", test_file)
    val_files = read("val", val_file)
  every_label = tuple(sorted({l for lf in train_files for l in lf.labels}))
  label_names = choose_intents(every_label, intents, seed)
  vocab = {l: i for i, l in enumerate(label_names)}
  left_out = frozenset(every_label) - set(label_names)
  full_train = _encode(train_files, vocab, left_out)
  test = _encode(test_files, vocab, left_out)
  val = _encode(val_files, vocab, left_out) if val_files else None
  train_idx = sampling.few_shot_indices(full_train.texts, full_train.labels, label_names, shots, seed,
                               allow_fewer)
  train = full_train.subset(train_idx)
  if pool_shots is None:
    pool = train
  else:
    pool = full_train.subset(sampling.few_shot_indices(full_train.texts, full_train.labels, label_names,
                                              pool_shots, seed, allow_fewer))
  descriptions = {l: d for lf in train_files for l, d in lf.descriptions.items()}
  texts = label_texts(label_names, descriptions)
  if label_texts_in_pool:
    if texts is None:
      warnings.warn(f"data.label_texts_in_pool: {name}'s intent names hold no words "
                    f"({', '.join(map(str, label_names[:3]))}, ...); the pool keeps its examples only",
                    stacklevel=2)
    else:
      pool = IntentSplit(pool.texts + texts, np.concatenate(
          [pool.labels, np.arange(len(label_names), dtype=np.int32)]))
  return IntentData(name, label_names, train, pool, test, val, full_train, texts)


def from_config(config) -> IntentData:
  """`load` from a `config.data`-style mapping (ConfigDict or dict).

  Reads name, data_dir, train_file, test_file, val_file, text_column,
  label_column, description_column, shots, seed, pool_shots, allow_fewer, train_split, include_oos, intents,
  label_texts_in_pool;
  missing or empty ('' / None) fields take the defaults.
  """
  get = config.get
  def opt(key):
    value = get(key, None)
    return None if value in ("", None) else value
  kwargs = {k: opt(k) for k in ("data_dir", "train_file", "test_file", "val_file", "pool_shots")}
  if kwargs["pool_shots"] is not None and int(kwargs["pool_shots"]) < 0:
    kwargs["pool_shots"] = None
  return load(
    get("name"), text_column=get("text_column", "text"), label_column=get("label_column", "label"),
    description_column=get("description_column", "") or "",
    shots=int(get("shots", 0)), seed=int(get("seed", 0)),
    allow_fewer=bool(get("allow_fewer", False)), train_split=get("train_split", "train") or "train",
    include_oos=bool(get("include_oos", True)), intents=int(get("intents", 0)),
    label_texts_in_pool=bool(get("label_texts_in_pool", False)), **kwargs)


def for_evaluation(data_config, *, oos: bool = False) -> IntentData:
  """`from_config` for an evaluation: with `oos`, clinc150's out-of-scope rows join val
  and test only; out-of-scope is detected by a threshold, not learnt as an intent."""
  d = data_config.to_dict() if hasattr(data_config, "to_dict") else dict(data_config)
  d["include_oos"] = d.get("include_oos", False) or oos
  data = from_config(d)
  if not oos:
    return data
  oos_id = data.label_names.index(OOS_LABEL)
  keep = lambda split: split.subset(np.flatnonzero(split.labels != oos_id))
  return IntentData(data.name, data.label_names, keep(data.train), keep(data.pool), data.test,
                    data.val, keep(data.full_train), data.label_texts)


def subsample(split: IntentSplit, max_rows: int, seed: int) -> IntentSplit:
  """At most `max_rows` rows of `split`, a seeded subset in original order (0 = all)."""
  return split.subset(sampling.subsample_indices(len(split), max_rows, seed))
