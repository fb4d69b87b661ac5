"""Where banking77 and clinc150 come from upstream, and how to rebuild the vendored layout.

The third place `intent.dataset_dir` looks for a built-in set (after
`data_dir/<name>/` and the copy vendored in the package) is its original public
files, downloaded once from raw.githubusercontent.com at the commit the vendored
copy was made from, converted here into the vendored layout (`text,label` CSVs
named as in `intent._SPLIT_FILES`, plus `labels.json`) and cached.

What is checked, and why: the sha256s below are of the **converted files**, i.e.
of our vendored CSVs and labels.json (computed from `convfit_jax/data/vendor/`),
not of the downloaded upstream bytes. The upstream bytes could not be established
here: the only copies at hand are stored *text* (decoded, so line endings, BOM
and the exact encoding are not guaranteed), banking77's `train.csv` and clinc150's
`data_full.json` are not among them at all, and a hash must never be guessed.
Checking the converted output is also the stronger guarantee for a user: the
files the loaders read are byte for byte the vendored ones, whatever happened on
the way (a changed upstream file, a different line ending, a converter bug), and
a mismatch names the file and both hashes. (Other public projects pin the same
URLs with upstream sha256 b06e26ac...664b for banking_data/train.csv, d12d6e3b...474d
for banking_data/test.csv and 36923c37...56e0 for data/data_full.json; those were
not verified here and are not enforced.)

hwu64 is vendored only: its source is 128 `;`-separated CSV files (KFold_1
trainset and testset of xliuhw/NLU-Evaluation-Data); it has no entry here.

Conversion (see /work/shared/data/README.md, reproduced exactly):
  * every text: each run of whitespace becomes one space, ends stripped; labels
    are stripped;
  * banking77: `banking_data/{train,test}.csv` columns text,category -> text,label;
    `val.csv` and `train_minus_val.csv` are DialoGLUE's validation split
    (alexa/dialoglue, commit 9074e4f27c97, `subsample_from_train.py` then
    `process_intent.py`, re-implemented in `dialoglue_val_split` on the raw rows);
  * clinc150: `data/data_full.json` keys train / val / test / oos_train / oos_val /
    oos_test, each a list of [text, label], -> one CSV per key;
  * CSVs are written with the csv module (minimal quoting, '\\n' line ends, UTF-8);
    `labels.json` is the sorted training labels (clinc150's without `oos`),
    `json.dumps(indent=1)` plus a newline.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import io
import json
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

BANKING77_COMMIT = "57ec275d8078af65b7731c2a98be812d844a6d6b"
CLINC150_COMMIT = "828f8093932c8fe6ca7936c3d2e52903b1c523de"
_RAW = "https://raw.githubusercontent.com"


@dataclasses.dataclass(frozen=True)
class Source:
  """One built-in set's upstream files and the converted files' expected sha256.

  Attributes:
    urls: {raw file name: URL}; each is downloaded to that name in a work folder.
    convert: (raw folder, output folder) -> None, writing the vendored layout.
    sha256: {converted file name: sha256 of its bytes}; every converted file is checked.
  """
  urls: Mapping[str, str]
  convert: Callable[[Path, Path], None]
  sha256: Mapping[str, str]


class ConversionError(ValueError):
  """A downloaded file that does not have the expected structure."""


def normalise(text: str) -> str:
  """Every run of whitespace becomes one space; ends stripped."""
  return " ".join(text.split())


def write_csv(path: Path, rows: Sequence[tuple[str, str]]) -> None:
  """`text,label` CSV, minimal quoting, '\\n' line ends, UTF-8."""
  buf = io.StringIO()
  writer = csv.writer(buf, lineterminator="\n")
  writer.writerow(("text", "label"))
  writer.writerows(rows)
  path.write_bytes(buf.getvalue().encode("utf-8"))


def write_labels(path: Path, labels) -> None:
  path.write_bytes((json.dumps(sorted(set(labels)), indent=1, ensure_ascii=False) + "\n")
                   .encode("utf-8"))


def _read_csv(path: Path, columns: Sequence[str]) -> list[list[str]]:
  """Rows (lists of the `columns` values) of a downloaded CSV, header checked."""
  try:
    text = path.read_bytes().decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise ConversionError(f"{path}: not UTF-8 (byte {e.start})") from None
  records = list(csv.reader(io.StringIO(text, newline="")))
  if not records or [h.strip() for h in records[0]] != list(columns):
    raise ConversionError(f"{path}: expected header {','.join(columns)}, got "
                          f"{','.join(records[0]) if records else 'an empty file'}")
  rows = []
  for lineno, rec in enumerate(records[1:], start=2):
    if not rec:
      continue
    if len(rec) != len(columns):
      raise ConversionError(f"{path}: record {lineno}: {len(rec)} fields, expected {len(columns)}")
    rows.append(rec)
  return rows


def dialoglue_val_split(train: Sequence[Sequence[str]], test: Sequence[Sequence[str]],
                        val_test_ratio: int) -> tuple[list[int], list[int]]:
  """DialoGLUE's validation rows carved from `train`, with its numpy seed-0 draws.

  Re-implements alexa/dialoglue (commit 9074e4f27c97) `subsample_from_train.py`
  (run once for 10 and once for 30 per label, each from a fresh seed 0) then
  `process_intent.py` (seed 0 again): for each label in order of first appearance
  in `test`, `test count // val_test_ratio` indices are drawn **with replacement**
  from that label's train rows that are in neither few-shot subset (compared as
  [text, label] rows, as DialoGLUE does).

  Args:
    train, test: raw [text, label] rows, in file order.
    val_test_ratio: 2 for banking77, 1 for hwu64.
  Returns:
    (val indices into `train` in draw order, with repeats;
     indices of the train rows not drawn, ascending).
  """
  labels = np.asarray([row[1] for row in train])
  few_shot = set()
  for n in (10, 30):
    rng = np.random.RandomState(0)
    for label in sorted(set(labels.tolist())):
      rows = np.flatnonzero(labels == label)
      if len(rows) < n:
        raise ValueError(f"label {label!r} has {len(rows)} train rows, DialoGLUE needs {n}")
      # RandomState.choice(rows, n, replace=False) is permutation(len)[:n].
      few_shot.update((train[i][0], train[i][1]) for i in rows[rng.permutation(len(rows))[:n]])
  by_label = collections.defaultdict(list)
  for i, (text, label) in enumerate(train):
    if (text, label) not in few_shot:
      by_label[label].append(i)
  rng = np.random.RandomState(0)
  val: list[int] = []
  for label, count in collections.Counter(row[1] for row in test).items():
    pool = by_label[label]
    if not pool:
      raise ValueError(f"label {label!r}: no train rows left for validation")
    # RandomState.choice(pool, k) with replacement is pool[randint(0, len(pool), k)].
    val.extend(pool[j] for j in rng.randint(0, len(pool), size=count // val_test_ratio).tolist())
  drawn = set(val)
  return val, [i for i in range(len(train)) if i not in drawn]


def convert_banking77(raw: Path, out: Path) -> None:
  """banking_data/{train,test}.csv (text,category) -> train/test/val/train_minus_val.csv
  and labels.json."""
  train = _read_csv(raw / "train.csv", ("text", "category"))
  test = _read_csv(raw / "test.csv", ("text", "category"))
  val, rest = dialoglue_val_split(train, test, val_test_ratio=2)
  norm = lambda row: (normalise(row[0]), row[1].strip())
  write_csv(out / "train.csv", [norm(r) for r in train])
  write_csv(out / "test.csv", [norm(r) for r in test])
  write_csv(out / "val.csv", [norm(train[i]) for i in val])
  write_csv(out / "train_minus_val.csv", [norm(train[i]) for i in rest])
  write_labels(out / "labels.json", (r[1].strip() for r in train))


_CLINC_KEYS = ("train", "val", "test", "oos_train", "oos_val", "oos_test")


def convert_clinc150(raw: Path, out: Path) -> None:
  """data/data_full.json -> {train,val,test,oos_train,oos_val,oos_test}.csv and labels.json."""
  path = raw / "data_full.json"
  try:
    data = json.loads(path.read_bytes().decode("utf-8-sig"))
  except (UnicodeDecodeError, json.JSONDecodeError) as e:
    raise ConversionError(f"{path}: not a UTF-8 JSON file ({e})") from None
  if not isinstance(data, dict) or any(k not in data for k in _CLINC_KEYS):
    keys = ", ".join(data) if isinstance(data, dict) else type(data).__name__
    raise ConversionError(f"{path}: expected keys {', '.join(_CLINC_KEYS)}; got {keys}")
  for key in _CLINC_KEYS:
    rows = []
    for i, item in enumerate(data[key]):
      if (not isinstance(item, list) or len(item) != 2
          or not all(isinstance(x, str) for x in item)):
        raise ConversionError(f"{path}: {key}[{i}] is not a [text, label] pair of strings")
      rows.append((normalise(item[0]), item[1].strip()))
    write_csv(out / f"{key}.csv", rows)
  write_labels(out / "labels.json", (item[1].strip() for item in data["train"]))


SOURCES: dict[str, Source] = {
  "banking77": Source(
    urls={f: f"{_RAW}/PolyAI-LDN/task-specific-datasets/{BANKING77_COMMIT}/banking_data/{f}"
          for f in ("train.csv", "test.csv")},
    convert=convert_banking77,
    # sha256 of convfit_jax/data/vendor/banking77/*, i.e. of the converted files.
    sha256={
      "train.csv": "5de1798bdce0303135b473f443e95c9bccfe4a770f0d04fee0298186b2511697",
      "test.csv": "6d2f6516ba5aa75e04c45a4eac901422592f6b3db5a4a2cf3d3cb0bb457458e7",
      "val.csv": "d2bd4d4583c09cb9607b72cf493741a28837042543919f0c7f02da0c13d63983",
      "train_minus_val.csv": "7ed7cbaf1d4cfc325c5abc7165e6fb2f09dbab2df478671802970de1514ce778",
      "labels.json": "e8a7c40f442de0c812ae1d38f0188cf48e982d6200807749bd74df5becd5cefc",
    }),
  "clinc150": Source(
    urls={"data_full.json": f"{_RAW}/clinc/oos-eval/{CLINC150_COMMIT}/data/data_full.json"},
    convert=convert_clinc150,
    # sha256 of convfit_jax/data/vendor/clinc150/*, i.e. of the converted files.
    sha256={
      "train.csv": "835dd4ee834ec3b8b93bfc5b515ade4bd1990c3086e0e841b1c9c7ef0a74a47e",
      "val.csv": "07255be49fafe97979804ce7a339acecbe18c7bb1681d29b12db2caff6412e88",
      "test.csv": "77da1148d86c77acde9fd523e3b8f827f64bac8d5e06559c1fe4ebb9068a7749",
      "oos_train.csv": "f8eaf8749bb74c831315980ba2ef84acda91e45adb794fe022b8587ed0d722e8",
      "oos_val.csv": "f14b2b7975770da4c82e55a62b88204447bef97450dcde08b49fb59cd0256acd",
      "oos_test.csv": "db1e6b5f1f87481c24c75b35f843b03ea098dd95a205784cf96cf3098dfa0b68",
      "labels.json": "3c6738c32f566aa8c9131e1ea27f4c6424ff73d0c15497127d993cfc4dfa80de",
    }),
}
