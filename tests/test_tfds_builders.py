"""TFDS builders: build banking77 into a temporary data_dir and read it back, no TensorFlow."""

from __future__ import annotations

import collections
import sys
import warnings

import pytest

from convfit_jax.data import intent
from convfit_jax.data.readers import DuplicateRowsWarning

tfds = pytest.importorskip("tensorflow_datasets")
from convfit_jax.data import tfds_builders  # pylint: disable=unused-import,wrong-import-position


def test_banking77_builds_and_reads_back(tmp_path):
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DuplicateRowsWarning)
    builder = tfds.builder("banking77", data_dir=tmp_path)
    builder.download_and_prepare()
    data = intent.load("banking77")
  assert "tensorflow" not in sys.modules
  names = builder.info.features["label"].names
  assert tuple(names) == data.label_names
  assert {s: builder.info.splits[s].num_examples for s in builder.info.splits} == {
    "train": 10003, "val": 1540, "test": 3080, "train_minus_val": 8622}
  assert any(f.name.endswith(".array_record-00000-of-00001")
             for f in (tmp_path / "banking77" / "1.0.0").iterdir())
  source = tfds.data_source("banking77", data_dir=tmp_path, split="test")
  assert len(source) == 3080
  read = collections.Counter((source[i]["text"].decode("utf-8"), int(source[i]["label"]))
                             for i in range(len(source)))
  assert read == collections.Counter(zip(data.test.texts, data.test.labels.tolist()))


def test_all_three_builders_are_registered():
  for name in ("banking77", "clinc150", "hwu64"):
    assert name in tfds.list_builders(with_community_datasets=False)
  clinc = tfds.builder("clinc150", data_dir="/nonexistent")
  assert "oos" in clinc.info.features["label"].names
  assert len(clinc.info.features["label"].names) == 151
