"""Intent loaders: built-in sets, user files, few-shot sampling, bad input."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from convfit_jax.data import intent
from convfit_jax.data.intent import DataError, DuplicateRowsWarning

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
  data = intent.load_intent_data(name)
  assert data.num_labels == labels
  assert list(data.label_names) == sorted(data.label_names)
  assert (len(data.full_train), len(data.test), len(data.val)) == (train, test, val)
  assert data.train.labels.dtype == np.int32 and data.test.labels.dtype == np.int32
  assert len(data.train) == train  # shots=0 takes every row
  assert data.pool is data.train


def test_clinc150_oos_is_a_label_and_can_be_left_out():
  data = intent.load_intent_data("clinc150")
  oos = data.label_names.index("oos")
  assert int((data.test.labels == oos).sum()) == 1000
  in_scope = intent.load_intent_data("clinc150", include_oos=False)
  assert "oos" not in in_scope.label_names and len(in_scope.test) == 4500


def test_train_minus_val_split():
  data = intent.load_intent_data("banking77", train_split="train_minus_val")
  assert len(data.full_train) == 8622
  with pytest.raises(ValueError, match="train_split"):
    intent.load_intent_data("banking77", train_split="dev")


def test_data_dir_is_searched_before_the_vendored_copy(tmp_path):
  folder = tmp_path / "hwu64"
  folder.mkdir()
  for f in ("train.csv", "val.csv", "test.csv", "train_minus_val.csv"):
    _write(folder / f, "text,label\nwake me up at 7,alarm_set\nplay jazz,play_music\n")
  data = intent.load_intent_data("hwu64", data_dir=tmp_path)
  assert data.label_names == ("alarm_set", "play_music") and len(data.test) == 2
  assert intent.dataset_dir("hwu64", data_dir=tmp_path / "absent") == intent.VENDOR_DIR / "hwu64"


def test_unknown_dataset_lists_known_ones():
  with pytest.raises(ValueError, match="banking77, clinc150, hwu64, csv"):
    intent.load_intent_data("banking78")


def test_few_shot_counts_and_determinism():
  a = intent.load_intent_data("banking77", shots=10, seed=0)
  b = intent.load_intent_data("banking77", shots=10, seed=0)
  c = intent.load_intent_data("banking77", shots=10, seed=1)
  assert len(a.train) == 770
  assert np.bincount(a.train.labels, minlength=77).tolist() == [10] * 77
  assert a.train.texts == b.train.texts and a.train.texts != c.train.texts
  thirty = intent.load_intent_data("banking77", shots=30, seed=0)
  assert set(a.train.texts) <= set(thirty.train.texts)


def test_few_shot_is_the_same_in_a_fresh_process():
  code = ("import warnings; warnings.simplefilter('ignore');"
          "from convfit_jax.data import intent;"
          "d = intent.load_intent_data('hwu64', shots=5, seed=2);"
          "print('|'.join(d.train.texts[:20]))")
  # A different hash seed: nothing may depend on Python's string hashing.
  env = dict(os.environ, PYTHONHASHSEED="123")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       env=env,
                       cwd=Path(__file__).resolve().parents[1]).stdout.strip()
  here = intent.load_intent_data("hwu64", shots=5, seed=2)
  assert out == "|".join(here.train.texts[:20])


def test_few_shot_ignores_row_order():
  texts = [f"t{i}" for i in range(40)]
  labels = np.array([i % 2 for i in range(40)])
  idx = intent.few_shot_indices(texts, labels, ["a", "b"], 5, seed=3)
  rev = intent.few_shot_indices(texts[::-1], labels[::-1], ["a", "b"], 5, seed=3)
  assert sorted(texts[i] for i in idx) == sorted(texts[::-1][i] for i in rev)


def test_too_few_examples_names_the_label_unless_allowed():
  with pytest.raises(ValueError, match="label 'balance' has 3 training examples, fewer than shots=4"):
    intent.load_intent_data("csv", train_file=FIXTURES / "intent_train.csv",
                            test_file=FIXTURES / "intent_test.csv", shots=4)
  data = intent.load_intent_data("csv", train_file=FIXTURES / "intent_train.csv",
                                 test_file=FIXTURES / "intent_test.csv", shots=4, allow_fewer=True)
  assert len(data.train) == 9


def test_pool_is_configured_separately():
  data = intent.load_intent_data("banking77", shots=10, seed=0, pool_shots=30)
  assert len(data.train) == 770 and len(data.pool) == 2310
  assert set(data.train.texts) <= set(data.pool.texts)
  full = intent.load_intent_data("banking77", shots=10, pool_shots=0)
  assert len(full.pool) == 10003


def test_user_csv_tsv_jsonl_with_custom_columns():
  csv_data = intent.load_intent_data("csv", train_file=FIXTURES / "intent_train.csv",
                                     test_file=FIXTURES / "intent_test.csv")
  assert csv_data.label_names == ("balance", "card", "pin")
  assert csv_data.full_train.texts[1] == "i forgot my pin, help"
  assert csv_data.test.labels.tolist() == [2, 1, 0]
  tsv = intent.load_intent_data("csv", train_file=FIXTURES / "intent_train.tsv",
                                test_file=FIXTURES / "intent_train.jsonl",
                                text_column="utterance", label_column="intent")
  assert tsv.full_train.texts[0] == 'how do i reset my "pin"'
  assert tsv.test.labels.tolist() == [1, 1, 0, 0]
  with pytest.raises(ValueError, match="train_file and test_file"):
    intent.load_intent_data("csv", train_file=FIXTURES / "intent_train.csv")


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
    intent.read_labelled_file(f)


def test_empty_text(tmp_path):
  f = _write(tmp_path / "t.csv", "text,label\nhello,a\n  ,b\n")
  with pytest.raises(DataError, match=r"t\.csv:3: empty text"):
    intent.read_labelled_file(f)


def test_wrong_number_of_fields(tmp_path):
  f = _write(tmp_path / "t.tsv", "text\tlabel\nhello\ta\nhi\tb\textra\n")
  with pytest.raises(DataError, match=r"t\.tsv:3: 3 fields, the header has 2"):
    intent.read_labelled_file(f)
  g = _write(tmp_path / "t.csv", "text,label\nhello,a\nhi, there,b\n")
  with pytest.raises(DataError, match=r"t\.csv:3: 3 fields"):
    intent.read_labelled_file(g)


def test_invalid_utf8(tmp_path):
  f = _write(tmp_path / "t.csv", b"text,label\nhello,a\ncaf\xe9,b\n")
  with pytest.raises(DataError, match=r"t\.csv:3: invalid UTF-8"):
    intent.read_labelled_file(f)


def test_invalid_json(tmp_path):
  f = _write(tmp_path / "t.jsonl", '{"text": "a", "label": "x"}\n{"text": "b", \n')
  with pytest.raises(DataError, match=r"t\.jsonl:2: invalid JSON"):
    intent.read_labelled_file(f)


def test_label_in_test_not_in_train(tmp_path):
  test = _write(tmp_path / "test.csv", "text,label\nbalance please,balance\nopen account,new_account\n")
  with pytest.raises(DataError, match=r"test\.csv:3: label 'new_account' does not occur"):
    intent.load_intent_data("csv", train_file=FIXTURES / "intent_train.csv", test_file=test)


def test_duplicated_rows_warn_with_count(tmp_path):
  f = _write(tmp_path / "t.csv", "text,label\nhello,a\nhi,b\nhello,a\nhi,b\nhi,c\n")
  with pytest.warns(DuplicateRowsWarning, match=r"t\.csv: 2 duplicated row\(s\) kept "
                                                r"\(first: line 4 repeats line 2\)"):
    rows = intent.read_labelled_file(f)
  assert len(rows.texts) == 5


def test_fetch_file_checks_sha256_and_caches(tmp_path):
  src = _write(tmp_path / "train.csv", "text,label\nhi,a\n")
  digest = hashlib.sha256(src.read_bytes()).hexdigest()
  cached = intent.fetch_file(src.as_uri(), digest, tmp_path / "cache")
  assert cached.read_bytes() == src.read_bytes()
  src.unlink()  # a second call must use the cache
  assert intent.fetch_file(src.as_uri(), digest, tmp_path / "cache") == cached
  with pytest.raises(DataError, match="sha256"):
    intent.fetch_file((tmp_path / "cache" / "train.csv").as_uri(), "0" * 64, tmp_path / "other")
  assert not (tmp_path / "other" / "train.csv").exists()


def test_dataset_dir_downloads_when_no_local_copy(tmp_path, monkeypatch):
  remote = tmp_path / "remote"
  remote.mkdir()
  urls = {}
  for f in ("train.csv", "val.csv", "test.csv", "train_minus_val.csv"):
    path = _write(remote / f, "text,label\nhi,greet\nbye,leave\n")
    urls[f] = (path.as_uri(), hashlib.sha256(path.read_bytes()).hexdigest())
  monkeypatch.setattr(intent, "VENDOR_DIR", tmp_path / "no_vendor")
  data = intent.load_intent_data("banking77", urls=urls, cache_dir=tmp_path / "cache")
  assert data.label_names == ("greet", "leave")
