"""TFDS builders for banking77, clinc150 and hwu64 over the package's vendored files.

Importing this module registers the three builders, after which

  tfds.builder("banking77", data_dir=d).download_and_prepare()
  tfds.data_source("banking77", data_dir=d, split="train")

work with no TensorFlow installed: files are written as array_record and read
back through `as_data_source`. Features: `text` (Text) and `label` (ClassLabel
over the same sorted vocabulary as `intent.load`, so ids agree;
clinc150's includes 'oos'). Splits are the vendored files: train, val, test and
(banking77, hwu64) train_minus_val; clinc150's out-of-scope files are splits of
their own (oos_train, oos_val, oos_test).
"""

from __future__ import annotations

import tensorflow_datasets as tfds
from etils import epath

from convfit_jax.data import intent, readers

_CITATIONS = {
  "banking77": "Casanueva et al. 2020, Efficient Intent Detection with Dual Sentence Encoders "
               "(PolyAI-LDN/task-specific-datasets, CC BY 4.0).",
  "clinc150": "Larson et al. 2019, An Evaluation Dataset for Intent Classification and "
              "Out-of-Scope Prediction (clinc/oos-eval, CC BY 3.0).",
  "hwu64": "Liu et al. 2019, Benchmarking Natural Language Understanding Services for "
           "Building Conversational Agents (xliuhw/NLU-Evaluation-Data, CC BY 4.0).",
}


class _IntentBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Common builder: one split per vendored CSV file."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Vendored convfit_jax copy."}
  # tfds derives code_path through importlib_resources, which is only installed
  # for Python < 3.9; giving it explicitly avoids that import.
  code_path = epath.Path(__file__)

  def __init__(self, *, file_format=None, **kwargs):
    # TFRecord, tfds' default, needs TensorFlow to write; array_record does not.
    super().__init__(file_format=file_format or "array_record", **kwargs)

  def _read(self, path: str) -> readers.LabelledFile:
    # The vendored files' repeats are known (see the data README) and kept.
    return readers.read_labelled_file(path, warn_duplicates=False)

  def _files(self) -> dict[str, str]:
    folder = intent.dataset_dir(self.name)
    splits = {"train": "train.csv", "val": "val.csv", "test": "test.csv"}
    if self.name == "clinc150":
      splits.update(oos_train="oos_train.csv", oos_val="oos_val.csv", oos_test="oos_test.csv")
    else:
      splits["train_minus_val"] = "train_minus_val.csv"
    return {split: str(folder / f) for split, f in splits.items()}

  def _label_names(self) -> list[str]:
    files = self._files()
    train = ["train", "oos_train"] if self.name == "clinc150" else ["train"]
    return sorted({l for s in train for l in self._read(files[s]).labels})

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description=f"{self.name} intent detection (text, label), as vendored in convfit_jax.",
      features=tfds.features.FeaturesDict({
        "text": tfds.features.Text(),
        "label": tfds.features.ClassLabel(names=self._label_names()),
      }),
      supervised_keys=("text", "label"),
      citation=_CITATIONS[self.name],
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # the files are in the package
    return {split: self._generate_examples(path) for split, path in self._files().items()}

  def _generate_examples(self, path):
    rows = self._read(path)
    for i, (text, label) in enumerate(zip(rows.texts, rows.labels)):
      yield i, {"text": text, "label": label}


class Banking77(_IntentBuilder):
  """banking77: 77 banking intents."""
  name = "banking77"


class Clinc150(_IntentBuilder):
  """clinc150: 150 intents plus out-of-scope queries ('oos')."""
  name = "clinc150"


class Hwu64(_IntentBuilder):
  """hwu64: 64 home-assistant intents (KFold_1)."""
  name = "hwu64"
