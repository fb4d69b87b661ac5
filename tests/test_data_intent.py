"""Intent loaders: built-in sets, user files, few-shot sampling, bad input."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from convfit_jax.data import downloads, intent, readers, sampling
from convfit_jax.data.readers import DataError, DuplicateRowsWarning

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture(autouse=True)
def _quiet_duplicates():
  # banking77's and hwu64's files hold known repeats (see the data README).
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DuplicateRowsWarning)
    yield


def _write(path: Path, text: str | bytes) -> Path:
  path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
  return path


@pytest.mark.parametrize("name,labels,train,test,val", [
  ("banking77", 77, 10003, 3080, 1540),
  ("hwu64", 64, 9960, 1076, 1076),
  ("clinc150", 151, 15100, 5500, 3100),
])
def test_builtin_sets_load_from_vendored_copies(name, labels, train, test, val):
  data = intent.load(name)
  assert data.num_labels == labels
  assert list(data.label_names) == sorted(data.label_names)
  assert (len(data.full_train), len(data.test), len(data.val)) == (train, test, val)
  assert data.train.labels.dtype == np.int32 and data.test.labels.dtype == np.int32
  assert len(data.train) == train  # shots=0 takes every row
  assert data.pool is data.train


def test_clinc150_oos_is_a_label_and_can_be_left_out():
  data = intent.load("clinc150")
  oos = data.label_names.index("oos")
  assert int((data.test.labels == oos).sum()) == 1000
  in_scope = intent.load("clinc150", include_oos=False)
  assert "oos" not in in_scope.label_names and len(in_scope.test) == 4500


def test_train_minus_val_split():
  data = intent.load("banking77", train_split="train_minus_val")
  assert len(data.full_train) == 8622
  with pytest.raises(ValueError, match="train_split"):
    intent.load("banking77", train_split="dev")


def test_data_dir_is_searched_before_the_vendored_copy(tmp_path):
  folder = tmp_path / "hwu64"
  folder.mkdir()
  for f in ("train.csv", "val.csv", "test.csv", "train_minus_val.csv"):
    _write(folder / f, "text,label\nwake me up at 7,alarm_set\nplay jazz,play_music\n")
  data = intent.load("hwu64", data_dir=tmp_path)
  assert data.label_names == ("alarm_set", "play_music") and len(data.test) == 2
  assert intent.dataset_dir("hwu64", data_dir=tmp_path / "absent") == intent.VENDOR_DIR / "hwu64"


def test_unknown_dataset_lists_known_ones():
  with pytest.raises(ValueError, match="banking77, clinc150, hwu64, csv"):
    intent.load("banking78")


def test_few_shot_counts_and_determinism():
  a = intent.load("banking77", shots=10, seed=0)
  b = intent.load("banking77", shots=10, seed=0)
  c = intent.load("banking77", shots=10, seed=1)
  assert len(a.train) == 770
  assert np.bincount(a.train.labels, minlength=77).tolist() == [10] * 77
  assert a.train.texts == b.train.texts and a.train.texts != c.train.texts
  thirty = intent.load("banking77", shots=30, seed=0)
  assert set(a.train.texts) <= set(thirty.train.texts)


def test_few_shot_is_the_same_in_a_fresh_process():
  code = ("import warnings; warnings.simplefilter('ignore');"
          "from convfit_jax.data import intent;"
          "d = intent.load('hwu64', shots=5, seed=2);"
          "print('|'.join(d.train.texts[:20]))")
  # A different hash seed: nothing may depend on Python's string hashing.
  env = dict(os.environ, PYTHONHASHSEED="123")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=env,
                       cwd=Path(__file__).resolve().parents[1]).stdout.strip()
  here = intent.load("hwu64", shots=5, seed=2)
  assert out == "|".join(here.train.texts[:20])


def test_few_shot_ignores_row_order():
  texts = [f"t{i}" for i in range(40)]
  labels = np.array([i % 2 for i in range(40)])
  idx = sampling.few_shot_indices(texts, labels, ["a", "b"], 5, seed=3)
  rev = sampling.few_shot_indices(texts[::-1], labels[::-1], ["a", "b"], 5, seed=3)
  assert sorted(texts[i] for i in idx) == sorted(texts[::-1][i] for i in rev)


def test_too_few_examples_names_the_label_unless_allowed():
  with pytest.raises(ValueError, match="label 'balance' has 3 training examples, fewer than shots=4"):
    intent.load("csv", train_file=FIXTURES / "intent_train.csv",
                            test_file=FIXTURES / "intent_test.csv", shots=4)
  data = intent.load("csv", train_file=FIXTURES / "intent_train.csv",
                                 test_file=FIXTURES / "intent_test.csv", shots=4, allow_fewer=True)
  assert len(data.train) == 9


def test_pool_is_configured_separately():
  data = intent.load("banking77", shots=10, seed=0, pool_shots=30)
  assert len(data.train) == 770 and len(data.pool) == 2310
  assert set(data.train.texts) <= set(data.pool.texts)
  full = intent.load("banking77", shots=10, pool_shots=0)
  assert len(full.pool) == 10003


def test_an_intent_subset_is_seeded_and_cuts_every_split():
  data = intent.load("clinc150", shots=10, seed=1, intents=5, include_oos=False)
  assert len(data.label_names) == 5 and list(data.label_names) == sorted(data.label_names)
  assert data.label_names == intent.load("clinc150", shots=10, seed=1, intents=5,
                                         include_oos=False).label_names
  assert data.label_names != intent.load("clinc150", shots=10, seed=2, intents=5,
                                         include_oos=False).label_names
  everything = intent.load("clinc150", include_oos=False)
  kept = lambda split: sum(everything.label_names[l] in data.label_names for l in split.labels)
  assert len(data.train) == 50 and len(data.test) == kept(everything.test) == 150
  assert len(data.val) == kept(everything.val) and len(data.full_train) == kept(everything.full_train)
  assert set(data.test.labels.tolist()) == set(range(5))
  # The few-shot rows of a kept intent do not depend on which others were kept.
  full = intent.load("clinc150", shots=10, seed=1, include_oos=False)
  name = data.label_names[0]
  rows = lambda d: {t for t, l in zip(d.train.texts, d.train.labels) if d.label_names[l] == name}
  assert rows(data) == rows(full)
  with pytest.raises(ValueError, match="intents=151: the training data has 150 intents"):
    intent.load("clinc150", intents=151, include_oos=False)


def test_user_csv_tsv_jsonl_with_custom_columns():
  csv_data = intent.load("csv", train_file=FIXTURES / "intent_train.csv",
                                     test_file=FIXTURES / "intent_test.csv")
  assert csv_data.label_names == ("balance", "card", "pin")
  assert csv_data.full_train.texts[1] == "i forgot my pin, help"
  assert csv_data.test.labels.tolist() == [2, 1, 0]
  tsv = intent.load("csv", train_file=FIXTURES / "intent_train.tsv",
                                test_file=FIXTURES / "intent_train.jsonl",
                                text_column="utterance", label_column="intent")
  assert tsv.full_train.texts[0] == 'how do i reset my "pin"'
  assert tsv.test.labels.tolist() == [1, 1, 0, 0]
  with pytest.raises(ValueError, match="train_file and test_file"):
    intent.load("csv", train_file=FIXTURES / "intent_train.csv")


def test_from_config_uses_the_issue_field_names():
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict({
    "name": "csv", "train_file": str(FIXTURES / "intent_train.csv"),
    "test_file": str(FIXTURES / "intent_test.csv"), "text_column": "text",
    "label_column": "label", "shots": 2, "seed": 0, "negatives": 3, "pool_shots": -1,
    "data_dir": ""})
  data = intent.from_config(config)
  assert len(data.train) == 6 and data.pool is data.train


# Bad input: each error names the file and the line.

def test_missing_column(tmp_path):
  f = _write(tmp_path / "t.csv", "sentence,label\nhello,a\n")
  with pytest.raises(DataError, match=r"t\.csv:1: missing column\(s\) 'text'"):
    readers.read_labelled_file(f)


def test_empty_text(tmp_path):
  f = _write(tmp_path / "t.csv", "text,label\nhello,a\n  ,b\n")
  with pytest.raises(DataError, match=r"t\.csv:3: empty text"):
    readers.read_labelled_file(f)


def test_wrong_number_of_fields(tmp_path):
  f = _write(tmp_path / "t.tsv", "text\tlabel\nhello\ta\nhi\tb\textra\n")
  with pytest.raises(DataError, match=r"t\.tsv:3: 3 fields, the header has 2"):
    readers.read_labelled_file(f)
  g = _write(tmp_path / "t.csv", "text,label\nhello,a\nhi, there,b\n")
  with pytest.raises(DataError, match=r"t\.csv:3: 3 fields"):
    readers.read_labelled_file(g)


def test_invalid_utf8(tmp_path):
  f = _write(tmp_path / "t.csv", b"text,label\nhello,a\ncaf\xe9,b\n")
  with pytest.raises(DataError, match=r"t\.csv:3: invalid UTF-8"):
    readers.read_labelled_file(f)


def test_invalid_json(tmp_path):
  f = _write(tmp_path / "t.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", \n')
  with pytest.raises(DataError, match=r"t\.jsonl:2: invalid JSON"):
    readers.read_labelled_file(f)


def test_label_in_test_not_in_train(tmp_path):
  test = _write(tmp_path / "test.csv", "text,label\nbalance please,balance\nopen account,new_account\n")
  with pytest.raises(DataError, match=r"test\.csv:3: label 'new_account' does not occur"):
    intent.load("csv", train_file=FIXTURES / "intent_train.csv", test_file=test)


def test_duplicated_rows_warn_with_count(tmp_path):
  f = _write(tmp_path / "t.csv", "text,label\nhello,a\nhi,b\nhello,a\nhi,b\nhi,c\n")
  with pytest.warns(DuplicateRowsWarning, match=r"t\.csv: 2 duplicated row\(s\) kept "
                                                r"\(first: line 4 repeats line 2\)"):
    rows = readers.read_labelled_file(f)
  assert len(rows.texts) == 5


def test_fetch_file_checks_sha256_and_caches(tmp_path):
  src = _write(tmp_path / "train.csv", "text,label\nhi,a\n")
  digest = hashlib.sha256(src.read_bytes()).hexdigest()
  cached = downloads.fetch_file(src.as_uri(), digest, tmp_path / "cache")
  assert cached.read_bytes() == src.read_bytes()
  src.unlink()  # a second call must use the cache
  assert downloads.fetch_file(src.as_uri(), digest, tmp_path / "cache") == cached
  with pytest.raises(DataError, match="sha256"):
    downloads.fetch_file((tmp_path / "cache" / "train.csv").as_uri(), "0" * 64, tmp_path / "other")
  assert not (tmp_path / "other" / "train.csv").exists()


def test_dataset_dir_downloads_when_no_local_copy(tmp_path, monkeypatch):
  remote = tmp_path / "remote"
  remote.mkdir()
  urls = {}
  for f in ("train.csv", "val.csv", "test.csv", "train_minus_val.csv"):
    path = _write(remote / f, "text,label\nhi,greet\nbye,leave\n")
    urls[f] = (path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest())
  monkeypatch.setattr(intent, "VENDOR_DIR", tmp_path / "no_vendor")
  data = intent.load("banking77", urls=urls, cache_dir=tmp_path / "cache")
  assert data.label_names == ("greet", "leave")


# Upstream downloads (banking77, clinc150, hwu64): file:// fixtures only, no network.

from convfit_jax.data import sources  # pylint: disable=wrong-import-position


def _sha(path: Path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def _csv_rows(path: Path) -> list[list[str]]:
  import csv  # pylint: disable=import-outside-toplevel
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.reader(f))


def test_recorded_hashes_are_the_vendored_files():
  for name, source in sources.SOURCES.items():
    for f, digest in source.sha256.items():
      assert _sha(intent.VENDOR_DIR / name / f) == digest, (name, f)
    assert all(u.startswith("https://raw.githubusercontent.com/") for u in source.urls.values())
  assert sources.BANKING77_COMMIT in sources.SOURCES["banking77"].urls["train.csv"]
  assert sources.CLINC150_COMMIT in sources.SOURCES["clinc150"].urls["data_full.json"]
  assert set(sources.SOURCES) == set(intent.BUILTIN_DATASETS)


def test_hwu64_urls_are_the_128_kfold1_files():
  urls = sources.SOURCES["hwu64"].urls
  assert len(urls) == 128 and len(set(urls.values())) == 128
  labels = json.loads((intent.VENDOR_DIR / "hwu64" / "labels.json").read_text())
  assert list(sources.HWU64_INTENTS) == labels  # one file per label, sorted
  base = ("https://raw.githubusercontent.com/xliuhw/NLU-Evaluation-Data/"
          "f6071b496b17d71e6eb43f543af0707f4ff30557/CrossValidation/autoGeneFromRealAnno/"
          "autoGene_2018_03_22-13_01_25_169/CrossValidation/KFold_1/")
  assert urls["trainset_alarm_query.csv"] == base + "trainset/alarm_query.csv"
  assert urls["testset_weather_query.csv"] == base + "testset/csv/weather_query.csv"
  assert all(sources.HWU64_COMMIT in u for u in urls.values())


def test_converters_rebuild_the_vendored_files_from_raw_format(tmp_path):
  import csv  # pylint: disable=import-outside-toplevel
  raw, out = tmp_path / "raw", tmp_path / "out"
  raw.mkdir()
  out.mkdir()
  # banking77 in its upstream layout (text,category; CRLF). Its 4 repeated rows are
  # repeats only after whitespace normalisation (data README): in the raw file the
  # copies differ, which DialoGLUE's val draw depends on.
  for f in ("train.csv", "test.csv"):
    rows = _csv_rows(intent.VENDOR_DIR / "banking77" / f)
    rows[0] = ["text", "category"]
    seen = set()
    for row in rows[1:]:
      if tuple(row) in seen:
        row[0] = row[0].replace(" ", "  ", 1)
      seen.add(tuple(row))
    with open(raw / f, "w", newline="", encoding="utf-8") as fh:
      csv.writer(fh).writerows(rows)
  sources.convert_banking77(raw, out)
  for f in sources.SOURCES["banking77"].sha256:
    assert (out / f).read_bytes() == (intent.VENDOR_DIR / "banking77" / f).read_bytes(), f
  data = {k: [[f"  {t}\t", l] for t, l in _csv_rows(intent.VENDOR_DIR / "clinc150" / f"{k}.csv")[1:]]
          for k in ("train", "val", "test", "oos_train", "oos_val", "oos_test")}
  (raw / "data_full.json").write_text(json.dumps(data), encoding="utf-8")
  sources.convert_clinc150(raw, out)
  for f in sources.SOURCES["clinc150"].sha256:
    assert (out / f).read_bytes() == (intent.VENDOR_DIR / "clinc150" / f).read_bytes(), f


_HWU64_HEADER = ["answerid", "scenario", "intent", "answer_annotation", "answer_from_anno",
                 "answer_from_user"]


def _hwu64_raw(folder: Path, split: str, rows, quoting=None) -> None:
  """NLU-Evaluation-Data files `<split>_<scenario>_<intent>.csv` (';'-separated) from
  (text, label) rows, one file per label in row order, as upstream quotes them."""
  import csv  # pylint: disable=import-outside-toplevel
  by_label: dict[str, list] = {}
  for text, label in rows:
    by_label.setdefault(label, []).append(text)
  for label, texts in by_label.items():
    scenario, intent_ = label.split("_", 1)
    with open(folder / f"{split}_{label}.csv", "w", newline="", encoding="utf-8") as fh:
      writer = csv.writer(fh, delimiter=";", lineterminator="\n",
                          quoting=csv.QUOTE_NONNUMERIC if quoting is None else quoting)
      writer.writerow(_HWU64_HEADER)
      for i, text in enumerate(texts):
        writer.writerow([i, scenario, intent_, f"[x : {text}]", text, text.upper() + "?"])


def test_hwu64_converter_rebuilds_the_vendored_files_from_raw_format(tmp_path):
  raw, out = tmp_path / "raw", tmp_path / "out"
  raw.mkdir()
  out.mkdir()
  vendor = intent.VENDOR_DIR / "hwu64"
  for split, f in (("trainset", "train.csv"), ("testset", "test.csv")):
    _hwu64_raw(raw, split, _csv_rows(vendor / f)[1:])
  assert len(list(raw.iterdir())) == 128
  assert sorted(p.name for p in raw.iterdir()) == sorted(sources.SOURCES["hwu64"].urls)
  sources.convert_hwu64(raw, out)
  for f in sources.SOURCES["hwu64"].sha256:
    assert (out / f).read_bytes() == (vendor / f).read_bytes(), f


def test_hwu64_converter_checks_the_files(tmp_path):
  _hwu64_raw(tmp_path, "trainset", [("a", "alarm_set")] * 40)
  with pytest.raises(sources.ConversionError, match="no testset_"):
    sources.convert_hwu64(tmp_path, tmp_path)
  _hwu64_raw(tmp_path, "testset", [("b", "alarm_query")])
  with pytest.raises(sources.ConversionError, match="differ: alarm_query.csv, alarm_set.csv"):
    sources.convert_hwu64(tmp_path, tmp_path)
  (tmp_path / "testset_alarm_query.csv").unlink()
  _write(tmp_path / "testset_alarm_set.csv", "answerid,scenario,intent,answer_from_anno\n1,a,b,c\n")
  with pytest.raises(sources.ConversionError, match=r"testset_alarm_set\.csv: .*missing "
                                                    r"answer_from_anno, scenario, intent"):
    sources.convert_hwu64(tmp_path, tmp_path)
  _write(tmp_path / "testset_alarm_set.csv",
         "answerid;scenario;intent;answer_from_anno\n1;alarm;set;x;extra\n")
  with pytest.raises(sources.ConversionError, match=r"record 2: 5 fields, expected 4"):
    sources.convert_hwu64(tmp_path, tmp_path)


_CLINC_RAW = {
  "train": [["what's  my\tbalance ", "balance"], ["play some\njazz", "play_music"],
            ["how much money do i have", "balance"]],
  "val": [["balance please", "balance"]],
  "test": [["put on a song", "play_music"], ['say "hi", then stop', "play_music"]],
  "oos_train": [["how tall is a giraffe", "oos"]],
  "oos_val": [["what is love", "oos"]],
  "oos_test": [["who won the   cup", "oos"]],
}
_CLINC_CONVERTED = {
  "train.csv": "text,label\nwhat's my balance,balance\nplay some jazz,play_music\n"
               "how much money do i have,balance\n",
  "val.csv": "text,label\nbalance please,balance\n",
  "test.csv": 'text,label\nput on a song,play_music\n"say ""hi"", then stop",play_music\n',
  "oos_train.csv": "text,label\nhow tall is a giraffe,oos\n",
  "oos_val.csv": "text,label\nwhat is love,oos\n",
  "oos_test.csv": "text,label\nwho won the cup,oos\n",
  "labels.json": '[\n "balance",\n "play_music"\n]\n',
}


def _online_without_vendor(tmp_path, monkeypatch):
  """Downloads allowed, the vendored copies hidden; returns an empty folder for the 'remote' files."""
  for var in downloads.OFFLINE_ENV_VARS:
    monkeypatch.delenv(var, raising=False)
  monkeypatch.setattr(intent, "VENDOR_DIR", tmp_path / "no_vendor")
  remote = tmp_path / "remote"
  remote.mkdir()
  return remote


@pytest.fixture
def upstream(tmp_path, monkeypatch):
  """clinc150's upstream table pointed at a tiny file:// data_full.json, vendored copy hidden."""
  import json  # pylint: disable=import-outside-toplevel
  remote = _online_without_vendor(tmp_path, monkeypatch)
  raw = _write(remote / "data_full.json", json.dumps(_CLINC_RAW))
  expected = {f: hashlib.sha256(text.encode()).hexdigest() for f, text in _CLINC_CONVERTED.items()}
  source = sources.Source({"data_full.json": raw.as_uri()}, sources.convert_clinc150, expected)
  monkeypatch.setitem(sources.SOURCES, "clinc150", source)
  return raw, tmp_path / "cache"


def test_upstream_download_converts_verifies_and_caches(upstream):
  import json  # pylint: disable=import-outside-toplevel
  raw, cache = upstream
  data = intent.load("clinc150", cache_dir=cache)
  assert data.label_names == ("balance", "oos", "play_music")
  assert data.full_train.texts[:2] == ("what's my balance", "play some jazz")
  assert data.test.texts[1] == 'say "hi", then stop' and len(data.test) == 3
  folder = intent.dataset_dir("clinc150", cache_dir=cache)
  assert folder == cache / "upstream" / "clinc150"
  for f, text in _CLINC_CONVERTED.items():
    assert (folder / f).read_text(encoding="utf-8") == text
  record = json.loads((folder / "source.json").read_text())
  assert record["data_full.json"] == {"url": raw.as_uri(), "sha256": _sha(raw),
                                      "bytes": raw.stat().st_size}
  assert [p.name for p in folder.parent.iterdir()] == ["clinc150"]  # no work folders left
  # A second call uses the cache: no download (the remote file is gone), even offline.
  raw.unlink()
  with pytest.MonkeyPatch.context() as m:
    m.setenv("CONVFIT_OFFLINE", "1")
    again = intent.load("clinc150", cache_dir=cache)
  assert again.full_train.texts == data.full_train.texts


def test_upstream_cache_is_rechecked(upstream):
  _, cache = upstream
  folder = intent.dataset_dir("clinc150", cache_dir=cache)
  _write(folder / "val.csv", "text,label\ntampered,balance\n")
  with pytest.raises(DataError, match=r"val\.csv: cached file has sha256 [0-9a-f]{64}, "
                                      r"expected [0-9a-f]{64}; delete .*clinc150"):
    intent.dataset_dir("clinc150", cache_dir=cache)


def test_upstream_hash_mismatch_names_file_and_both_hashes(upstream, monkeypatch):
  raw, cache = upstream
  source = sources.SOURCES["clinc150"]
  wrong = dict(source.sha256, **{"test.csv": "0" * 64})
  monkeypatch.setitem(sources.SOURCES, "clinc150", dataclasses.replace(source, sha256=wrong))
  actual = hashlib.sha256(_CLINC_CONVERTED["test.csv"].encode()).hexdigest()
  with pytest.raises(DataError) as err:
    intent.dataset_dir("clinc150", cache_dir=cache)
  msg = str(err.value)
  assert f"test.csv: sha256 {actual}, expected {'0' * 64}" in msg
  assert raw.as_uri() in msg and "not cached" in msg
  assert not (cache / "upstream" / "clinc150").exists()
  assert list((cache / "upstream").iterdir()) == []  # the work folder is removed


def test_upstream_download_failure_names_the_url(upstream, monkeypatch):
  raw, cache = upstream
  raw.unlink()
  with pytest.raises(DataError, match=r"could not download file://.*data_full\.json.*data_dir/clinc150"):
    intent.dataset_dir("clinc150", cache_dir=cache)
  assert not (cache / "upstream" / "clinc150").exists()


@pytest.mark.parametrize("var", ["CONVFIT_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_lists_what_was_tried(upstream, monkeypatch, tmp_path, var):
  raw, cache = upstream
  monkeypatch.setenv(var, "1")
  with pytest.raises(FileNotFoundError) as err:
    intent.load("clinc150", data_dir=tmp_path / "mine", cache_dir=cache)
  msg = str(err.value)
  for part in (str(tmp_path / "mine" / "clinc150"), str(tmp_path / "no_vendor" / "clinc150"),
               str(cache / "upstream" / "clinc150"), raw.as_uri(), f"{var}=1"):
    assert part in msg, part
  assert not (cache / "upstream").exists()
  monkeypatch.setenv(var, "0")  # as in huggingface_hub, 0 allows downloads
  assert intent.dataset_dir("clinc150", cache_dir=cache).is_dir()


def test_hwu64_upstream_pipeline_concatenates_sorted_files(tmp_path, monkeypatch):
  """hwu64's upstream table pointed at a tiny file:// tree (3 intents per split)."""
  import csv  # pylint: disable=import-outside-toplevel
  remote = _online_without_vendor(tmp_path, monkeypatch)
  for split, folder in (("trainset", "trainset"), ("testset", "testset/csv")):
    (remote / folder).mkdir(parents=True)
    n = 40 if split == "trainset" else 3
    # Written out of order; upstream quotes every text field.
    rows = [(f"{l.replace('_', ' ')}  {split}\t{i} ", l) for l in ("weather_query", "alarm_set",
                                                                  "iot_hue_lightup")
            for i in range(n)]
    _hwu64_raw(remote / folder, split, rows, quoting=csv.QUOTE_NONNUMERIC)
    for p in (remote / folder).iterdir():
      p.rename(p.with_name(p.name[len(split) + 1:]))  # upstream names: <intent>.csv
  base = remote.as_uri() + "/"
  urls = {k: v for k, v in sources.hwu64_urls().items()
          if k.split("_", 1)[1] in ("weather_query.csv", "alarm_set.csv", "iot_hue_lightup.csv")}
  prefix = sources.hwu64_urls()["trainset_alarm_set.csv"].rsplit("trainset/", 1)[0]
  urls = {k: v.replace(prefix, base) for k, v in urls.items()}
  assert len(urls) == 6 and all(u.startswith("file://") for u in urls.values())
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  sources.convert_hwu64(_fetch_all(urls, tmp_path / "fetched"), scratch)
  expected = {f: _sha(scratch / f) for f in sources.SOURCES["hwu64"].sha256}
  monkeypatch.setitem(sources.SOURCES, "hwu64",
                      sources.Source(urls, sources.convert_hwu64, expected))
  data = intent.load("hwu64", cache_dir=tmp_path / "cache",
                                 train_split="train_minus_val")
  folder = tmp_path / "cache" / "upstream" / "hwu64"
  train_rows = _csv_rows(folder / "train.csv")[1:]
  test_rows = _csv_rows(folder / "test.csv")[1:]
  val_rows = _csv_rows(folder / "val.csv")[1:]
  assert train_rows[0] == ["alarm set trainset 0", "alarm_set"]  # normalised, label joined
  assert [r[1] for r in train_rows[::40]] == ["alarm_set", "iot_hue_lightup", "weather_query"]
  assert [r[1] for r in test_rows] == ["alarm_set"] * 3 + ["iot_hue_lightup"] * 3 + ["weather_query"] * 3
  assert len(val_rows) == 9 and all(r in train_rows for r in val_rows)  # r = 1: 3 per label
  assert [r[1] for r in val_rows] == [r[1] for r in test_rows]  # test's label order
  assert len(data.full_train) == 120 - len({tuple(r) for r in val_rows})
  assert data.label_names == ("alarm_set", "iot_hue_lightup", "weather_query")
  assert json.loads((folder / "labels.json").read_text()) == list(data.label_names)
  assert set(json.loads((folder / "source.json").read_text())) == set(urls)


def _fetch_all(urls, folder: Path) -> Path:
  import urllib.request  # pylint: disable=import-outside-toplevel
  folder.mkdir()
  for name, url in urls.items():
    with urllib.request.urlopen(url) as r:
      (folder / name).write_bytes(r.read())
  return folder


def test_banking77_upstream_pipeline_builds_the_val_split(tmp_path, monkeypatch):
  remote = _online_without_vendor(tmp_path, monkeypatch)
  train = "text,category\n" + "".join(f"{l} question  {i},{l}\n" for l in ("fee", "card")
                                      for i in range(40))
  test = "text,category\n" + "".join(f"{l} test {i},{l}\n" for l in ("card", "fee") for i in range(6))
  urls = {"train.csv": _write(remote / "train.csv", train).as_uri(),
          "test.csv": _write(remote / "test.csv", test).as_uri()}
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  sources.convert_banking77(remote, scratch)
  expected = {f: _sha(scratch / f) for f in sources.SOURCES["banking77"].sha256}
  monkeypatch.setitem(sources.SOURCES, "banking77",
                      sources.Source(urls, sources.convert_banking77, expected))
  data = intent.load("banking77", cache_dir=tmp_path / "cache",
                                 train_split="train_minus_val")
  folder = tmp_path / "cache" / "upstream" / "banking77"
  train_rows = _csv_rows(folder / "train.csv")[1:]
  val_rows = _csv_rows(folder / "val.csv")[1:]
  assert train_rows[0] == ["fee question 0", "fee"]  # text normalised, column renamed
  assert len(val_rows) == 6 and all(r in train_rows for r in val_rows)  # 3 per label
  assert [r[1] for r in val_rows] == ["card"] * 3 + ["fee"] * 3  # test's label order
  assert len(data.full_train) == 80 - len({tuple(r) for r in val_rows})
  assert not {tuple(r) for r in val_rows} & {tuple(r) for r in
                                             _csv_rows(folder / "train_minus_val.csv")[1:]}
  assert data.label_names == ("card", "fee") and len(data.test) == 12


def test_label_texts_read_names_and_refuse_ids():
  assert intent.label_texts(["Refund_not_showing_up", "card-arrival", "alarm_query"]) == (
      "refund not showing up", "card arrival", "alarm query")
  assert intent.label_texts(["pin", "12"]) is None and intent.label_texts([0, 1]) is None


def test_label_texts_join_the_pool_not_the_training_set(tmp_path):
  data = intent.load("banking77", shots=2, seed=0, label_texts_in_pool=True)
  assert len(data.train) == 77 * 2 and len(data.pool) == 77 * 3
  assert data.pool.texts[-77:] == intent.label_texts(data.label_names)
  assert data.pool.labels[-77:].tolist() == list(range(77))
  assert data.label_names[data.pool.labels[-1]] == "wrong_exchange_rate_for_cash_withdrawal"
  rows = tmp_path / "ids.csv"
  rows.write_text("text,label\nhello there,1\ngood morning,1\nbye now,2\nsee you,2\n")
  with pytest.warns(UserWarning, match="intent names hold no words"):
    ids = intent.load("csv", train_file=rows, test_file=rows, label_texts_in_pool=True)
  assert len(ids.pool) == 4


def test_a_description_column_gives_the_intents_texts_and_must_agree(tmp_path):
  rows = tmp_path / "described.csv"
  rows.write_text("text,label,about\nwhere is my card,c1,card has not arrived\n"
                  "card still not here,c1,\nwhat is my balance,b7,money in my account\n"
                  "how much do i have,b7,money in my account\n")
  data = intent.load("csv", train_file=rows, test_file=rows, description_column="about")
  assert data.label_texts == ("money in my account", "card has not arrived")
  assert intent.load("csv", train_file=rows, test_file=rows).label_texts == ("b7", "c1")
  rows.write_text(rows.read_text() + "show my balance,b7,the balance\n")
  with pytest.raises(DataError, match=r"described.csv:6: intent 'b7' is described as 'the "
                                      r"balance' in column 'about', but as 'money in my account' at line 4"):
    intent.load("csv", train_file=rows, test_file=rows, description_column="about")
