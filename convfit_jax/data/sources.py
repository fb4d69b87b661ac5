"""Where banking77, clinc150 and hwu64 come from upstream, and how to rebuild the vendored layout.

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
`data_full.json` are not among them at all, and a hash must never be guessed
(hwu64's 128 files would need 128 upstream hashes, none of which is known).
Checking the converted output is also the stronger guarantee for a user: the
files the loaders read are byte for byte the vendored ones, whatever happened on
the way (a changed upstream file, a different line ending, a converter bug), and
a mismatch names the file and both hashes. (Other public projects pin the same
URLs with upstream sha256 b06e26ac...664b for banking_data/train.csv, d12d6e3b...474d
for banking_data/test.csv and 36923c37...56e0 for data/data_full.json; those were
not verified here and are not enforced.)


Conversion (see /work/shared/data/README.md, reproduced exactly):
  * every text: each run of whitespace becomes one space, ends stripped; labels
    are stripped;
  * banking77: `banking_data/{train,test}.csv` columns text,category -> text,label;
    `val.csv` and `train_minus_val.csv` are DialoGLUE's validation split
    (alexa/dialoglue, commit 9074e4f27c97, `subsample_from_train.py` then
    `process_intent.py`, re-implemented in `dialoglue_val_split` on the raw rows);
  * clinc150: `data/data_full.json` keys train / val / test / oos_train / oos_val /
    oos_test, each a list of [text, label], -> one CSV per key;
  * hwu64: xliuhw/NLU-Evaluation-Data, `CrossValidation/autoGeneFromRealAnno/
    autoGene_2018_03_22-13_01_25_169/CrossValidation/KFold_1/trainset/<intent>.csv`
    and `.../KFold_1/testset/csv/<intent>.csv` (64 files each, `;`-separated, with a
    header; text = `answer_from_anno`, label = `scenario` + `_` + `intent`), each
    split's files concatenated in sorted file-name order (= sorted label order),
    rows in file order; val / train_minus_val as for banking77 with r = 1. They are
    downloaded as `trainset_<intent>.csv` / `testset_<intent>.csv` (one flat folder);
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
HWU64_COMMIT = "f6071b496b17d71e6eb43f543af0707f4ff30557"
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


_HWU64_DIR = ("CrossValidation/autoGeneFromRealAnno/autoGene_2018_03_22-13_01_25_169/"
              "CrossValidation/KFold_1")
# The 64 `<scenario>_<intent>` file names of each KFold_1 split (listed from the
# repository at the commit above; trainset and testset hold the same names).
HWU64_INTENTS = (
  "alarm_query", "alarm_remove", "alarm_set", "audio_volume_down", "audio_volume_mute",
  "audio_volume_up", "calendar_query", "calendar_remove", "calendar_set", "cooking_recipe",
  "datetime_convert", "datetime_query", "email_addcontact", "email_query",
  "email_querycontact", "email_sendemail", "general_affirm", "general_commandstop",
  "general_confirm", "general_dontcare", "general_explain", "general_joke", "general_negate",
  "general_praise", "general_quirky", "general_repeat", "iot_cleaning", "iot_coffee",
  "iot_hue_lightchange", "iot_hue_lightdim", "iot_hue_lightoff", "iot_hue_lighton",
  "iot_hue_lightup", "iot_wemo_off", "iot_wemo_on", "lists_createoradd", "lists_query",
  "lists_remove", "music_likeness", "music_query", "music_settings", "news_query",
  "play_audiobook", "play_game", "play_music", "play_podcasts", "play_radio", "qa_currency",
  "qa_definition", "qa_factoid", "qa_maths", "qa_stock", "recommendation_events",
  "recommendation_locations", "recommendation_movies", "social_post", "social_query",
  "takeaway_order", "takeaway_query", "transport_query", "transport_taxi",
  "transport_ticket", "transport_traffic", "weather_query",
)
# Downloaded file name prefix -> folder of that split under _HWU64_DIR.
_HWU64_SPLITS = {"trainset": "trainset", "testset": "testset/csv"}
_HWU64_COLUMNS = ("answer_from_anno", "scenario", "intent")


def hwu64_urls(commit: str = HWU64_COMMIT) -> dict[str, str]:
  """{`trainset_<intent>.csv` / `testset_<intent>.csv`: raw URL} for the 128 files."""
  return {f"{prefix}_{intent}.csv":
          f"{_RAW}/xliuhw/NLU-Evaluation-Data/{commit}/{_HWU64_DIR}/{folder}/{intent}.csv"
          for prefix, folder in _HWU64_SPLITS.items() for intent in HWU64_INTENTS}


def _read_hwu64_file(path: Path) -> list[tuple[str, str]]:
  """(raw text, label) rows of one `;`-separated NLU-Evaluation-Data CSV, in file order."""
  try:
    text = path.read_bytes().decode("utf-8-sig")
  except UnicodeDecodeError as e:
    raise ConversionError(f"{path}: not UTF-8 (byte {e.start})") from None
  records = list(csv.reader(io.StringIO(text, newline=""), delimiter=";"))
  header = [h.strip() for h in records[0]] if records else []
  missing = [c for c in _HWU64_COLUMNS if c not in header]
  if missing:
    raise ConversionError(f"{path}: expected a ';'-separated header with "
                          f"{', '.join(_HWU64_COLUMNS)}; missing {', '.join(missing)} "
                          f"(got {';'.join(header) if header else 'an empty file'})")
  cols = [header.index(c) for c in _HWU64_COLUMNS]
  rows = []
  for lineno, rec in enumerate(records[1:], start=2):
    if not rec:
      continue
    if len(rec) != len(header):
      raise ConversionError(f"{path}: record {lineno}: {len(rec)} fields, expected {len(header)}")
    text, scenario, intent = (rec[i] for i in cols)
    rows.append((text, f"{scenario.strip()}_{intent.strip()}"))
  return rows


def convert_hwu64(raw: Path, out: Path) -> None:
  """{trainset,testset}_<intent>.csv (`;`-separated) -> train/test/val/train_minus_val.csv
  and labels.json.

  Each split is its files concatenated in sorted file-name order; the two splits
  must hold the same file names.
  """
  names = {}
  for prefix in _HWU64_SPLITS:
    names[prefix] = sorted(p.name[len(prefix) + 1:] for p in raw.glob(f"{prefix}_*.csv"))
    if not names[prefix]:
      raise ConversionError(f"{raw}: no {prefix}_*.csv files")
  if names["trainset"] != names["testset"]:
    diff = sorted(set(names["trainset"]) ^ set(names["testset"]))
    raise ConversionError(f"{raw}: trainset and testset files differ: {', '.join(diff)}")
  train, test = ([row for n in names[prefix] for row in _read_hwu64_file(raw / f"{prefix}_{n}")]
                 for prefix in ("trainset", "testset"))
  val, rest = dialoglue_val_split(train, test, val_test_ratio=1)
  norm = lambda row: (normalise(row[0]), row[1])
  write_csv(out / "train.csv", [norm(r) for r in train])
  write_csv(out / "test.csv", [norm(r) for r in test])
  write_csv(out / "val.csv", [norm(train[i]) for i in val])
  write_csv(out / "train_minus_val.csv", [norm(train[i]) for i in rest])
  write_labels(out / "labels.json", (r[1] for r in train))


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
  "hwu64": Source(
    urls=hwu64_urls(),
    convert=convert_hwu64,
    # sha256 of convfit_jax/data/vendor/hwu64/*, i.e. of the converted files.
    sha256={
      "train.csv": "7025548e6416f271cde66249666d611c0fc7c04f6ce05780c8e952001f8dedbd",
      "test.csv": "809b9c3fcf088dcfdae38c1f1a430940f203e5df6d6402283a8256a0cbaeb061",
      "val.csv": "d62fa27995b629f38bdb41d8b0ff6b21b26ab90288968af3565d1ef37877101d",
      "train_minus_val.csv": "20363a1700be98c3f4610552219f9a2268ce35a3fe5a995157d8ae7081bbf25b",
      "labels.json": "eff046d39f6ff4bbcf02689f42653380f9bf313bc0236b24f88a25ab15fd9554",
    }),
}
