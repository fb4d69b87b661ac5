"""`IntentClassifier` on a tiny random BERT: the CLI and Python give one model, the saved
folder round-trips and refuses damage, bad input gets one clear error."""

import csv
import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from conftest import REPO
from convfit_jax import Encoder, IntentClassifier, fine_tune_stage1, saved_classifier
from convfit_jax.saved_classifier import SavedClassifierError

STEPS = 4
FIXTURES = REPO / "tests" / "fixtures"


def _rows(name):
  with open(FIXTURES / name, newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  return [r["text"] for r in rows], [r["label"] for r in rows]


TRAIN, TEST = _rows("intent_train.csv"), _rows("intent_test.csv")


@pytest.fixture(scope="module")
def fitted(tiny_bert_dir):
  clf = IntentClassifier.from_pretrained(tiny_bert_dir)
  return clf.fit(*TRAIN, max_steps=STEPS, epochs=2, learning_rate=1e-3, progress=False)


def test_cli_and_python_train_the_same_model(tiny_bert_dir, tmp_path):
  """Same rows (a CSV for the CLI, two lists for Python), same seed: the same pool
  embeddings bit for bit and the same k-NN accuracy."""
  run = tmp_path / "cli"
  cmd = [sys.executable, "-m", "convfit_jax.main", "--config=configs/stage2_dense.py",
         f"--config.workdir={run}", f"--config.model.init_from={tiny_bert_dir}",
         "--config.data.name=csv", f"--config.data.train_file={FIXTURES / 'intent_train.csv'}",
         f"--config.data.test_file={FIXTURES / 'intent_test.csv'}", "--config.data.shots=0",
         "--config.train.epochs=2", f"--config.train.max_steps={STEPS}",
         "--config.train.learning_rate=1e-3", "--config.evals.knn.tsne=False"]
  r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  cli_metrics = json.loads((run / "metrics.json").read_text())
  cli = IntentClassifier.from_pretrained(run / "classifier")

  api = IntentClassifier.from_pretrained(tiny_bert_dir).fit(
      *TRAIN, max_steps=STEPS, epochs=2, learning_rate=1e-3, progress=False)
  np.testing.assert_array_equal(api.pool_embeddings, cli.pool_embeddings)
  assert api.labels == cli.labels == sorted(set(TRAIN[1]))
  assert api.evaluate(*TEST)["accuracy"] == cli_metrics["knn_accuracy"]
  assert api.history_["steps"] == cli_metrics["steps"] and api.history_["losses"]


def test_predict_scores_proba_explain(fitted):
  texts = TEST[0]
  pred = fitted.predict(texts)
  assert len(pred) == len(texts) and set(pred) <= set(fitted.labels)
  scores = fitted.scores(texts)
  assert scores.shape == (len(texts), len(fitted.labels))
  # 1-NN: the predicted intent is the one with the best cosine.
  assert [fitted.labels[i] for i in scores.argmax(1)] == pred
  proba = fitted.predict_proba(texts)
  np.testing.assert_allclose(proba.sum(1), 1.0, rtol=1e-5)
  assert [fitted.labels[i] for i in proba.argmax(1)] == pred
  near = fitted.explain(texts[0], top=3)
  assert len(near) == 3 and near[0]["label"] == pred[0]
  assert [n["score"] for n in near] == sorted((n["score"] for n in near), reverse=True)
  assert all(n["text"] in TRAIN[0] for n in near)
  details = fitted.predict_details(texts, explain=2)
  assert [d["label"] for d in details] == pred and not any(d["oos"] for d in details)
  assert details[0]["score"] == pytest.approx(near[0]["score"], abs=1e-5)
  assert fitted.predict([]) == []
  m = fitted.evaluate(*TEST)
  assert set(m) == {"accuracy", "macro_f1", "ece", "num_test"} and 0 <= m["ece"] <= 1


def test_save_and_load_round_trip(fitted, tmp_path):
  folder = fitted.save_pretrained(tmp_path / "clf")
  back = IntentClassifier.from_pretrained(folder)
  assert back.labels == fitted.labels and back.pool_texts == fitted.pool_texts
  assert back.temperature == fitted.temperature
  np.testing.assert_array_equal(back.pool_embeddings, fitted.pool_embeddings)
  np.testing.assert_allclose(back.predict_proba(TEST[0]), fitted.predict_proba(TEST[0]), atol=1e-6)
  settings = json.loads((tmp_path / "clf" / "classifier.json").read_text())
  assert settings["convfit_jax_version"] and settings["max_length"] == fitted.encoder.max_length
  # The folder is also a plain encoder folder, for this package and sentence-transformers.
  from sentence_transformers import SentenceTransformer
  st = SentenceTransformer(str(folder), device="cpu").encode(TEST[0], normalize_embeddings=True)
  np.testing.assert_allclose(st, fitted.encoder.encode(TEST[0], normalize=True), atol=1e-5)
  assert Encoder.from_pretrained(folder).dim == fitted.encoder.dim


def test_int_labels_stay_ints(tiny_bert_dir, tmp_path):
  ids = {l: i for i, l in enumerate(sorted(set(TRAIN[1])))}
  clf = IntentClassifier.from_pretrained(tiny_bert_dir).add_examples(
      TRAIN[0], [ids[l] for l in TRAIN[1]])
  assert all(type(p) is int for p in clf.predict(TEST[0]))
  back = IntentClassifier.from_pretrained(clf.save_pretrained(tmp_path / "c"))
  assert back.labels == clf.labels and all(type(p) is int for p in back.predict(TEST[0]))


def test_add_examples_grows_the_pool_with_a_new_intent(fitted, tiny_bert_dir):
  clf = IntentClassifier.from_pretrained(tiny_bert_dir)
  clf.add_examples(*TRAIN)
  new = ["please close my account", "i want to delete my account"]
  assert "close_account" not in clf.predict(new)  # places the pool: the next add replaces it
  clf.add_examples(new, ["close_account"] * 2)
  assert clf.labels[-1] == "close_account" and len(clf.pool_texts) == len(TRAIN[0]) + 2
  # A pool text is its own nearest neighbour (cosine 1).
  assert clf.predict(new) == ["close_account"] * 2
  with pytest.raises(TypeError, match="mix types"):
    clf.add_examples(["hello"], [3])


def test_out_of_scope_threshold_rejects_below_it(fitted):
  clf = IntentClassifier.from_pretrained(fitted.encoder).add_examples(*TRAIN)
  val_texts = TEST[0] + ["what is the weather in paris", "play some jazz music"]
  val_labels = TEST[1] + ["oos", "oos"]
  clf.calibrate_oos(val_texts, val_labels, oos_label="oos", reject_label="out_of_scope")
  assert clf.oos_threshold is not None
  details = clf.predict_details(val_texts)
  for d in details:
    assert d["oos"] == (d["score"] < clf.oos_threshold)
    assert (d["label"] == "out_of_scope") == d["oos"]
  m = clf.evaluate(val_texts, val_labels, oos_label="oos")
  assert {"in_scope_accuracy", "oos_recall", "oos_precision"} <= set(m)
  with pytest.raises(ValueError, match="one of the classifier's intents"):
    clf.calibrate_oos(val_texts, TEST[1] + ["pin", "pin"], oos_label="pin")


def test_fit_on_a_small_set_trains_the_floor_of_steps(tiny_bert_dir):
  """3 intents in one batch: an epoch is a step; the floor (100 by default, as on the command
  line) raises the epochs' steps."""
  clf = IntentClassifier.from_pretrained(tiny_bert_dir)
  assert clf._train_config(TRAIN[1], "supcon", None, None, None, 0, False, {}).train.min_steps == 100
  assert clf.fit(*TRAIN, epochs=2, min_steps=5, progress=False).history_["steps"] == 5


def test_fit_with_val_fits_temperature_and_reports_before_after(tiny_bert_dir):
  clf = IntentClassifier.from_pretrained(tiny_bert_dir).fit(
      *TRAIN, max_steps=2, progress=False, val=TEST)
  assert set(clf.history_["val_before"]) == set(clf.history_["val_after"]) >= {"accuracy", "ece"}
  assert clf.temperature > 0


def test_fit_with_a_workdir_is_a_resumable_run(tiny_bert_dir, tmp_path):
  clf = IntentClassifier.from_pretrained(tiny_bert_dir)
  clf.fit(*TRAIN, max_steps=2, progress=False, workdir=tmp_path / "run")
  for name in ("model", "classifier", "checkpoints", "metrics.json", "log.txt"):
    assert (tmp_path / "run" / name).exists(), name
  # A finished run is not run again: the same model comes back.
  again = IntentClassifier.from_pretrained(tiny_bert_dir)
  again.fit(*TRAIN, max_steps=2, progress=False, workdir=tmp_path / "run")
  np.testing.assert_array_equal(again.pool_embeddings, clf.pool_embeddings)


def test_intents_with_one_example_and_batches_smaller_than_the_intents(tiny_bert_dir):
  texts, labels = TRAIN[0] + ["cancel everything"], TRAIN[1] + ["cancel"]
  with pytest.warns(UserWarning, match="single example"):
    clf = IntentClassifier.from_pretrained(tiny_bert_dir).fit(
        texts, labels, max_steps=2, progress=False, labels_per_batch=2)
  assert "cancel" in clf.labels and clf.predict(["cancel everything"]) == ["cancel"]


@pytest.mark.parametrize("objective", ["ocl", "dense_cos"])
def test_other_objectives_are_one_argument_away(objective, tiny_bert_dir):
  clf = IntentClassifier.from_pretrained(tiny_bert_dir).fit(
      *TRAIN, objective=objective, max_steps=2, progress=False)
  assert clf.history_["steps"] == 2 and len(clf.pool_texts) == len(TRAIN[0])


def test_bad_input_is_one_clear_error(tiny_bert_dir):
  clf = IntentClassifier.from_pretrained(tiny_bert_dir)
  with pytest.raises(RuntimeError, match="no examples yet"):
    clf.predict(["hello"])
  cases = [
      (([], []), ValueError, "texts is empty"),
      ((["a b", "c d"], ["x"]), ValueError, "1 labels for 2 texts"),
      ((["a b", 3], ["x", "y"]), TypeError, r"texts\[1\]: expected str"),
      ((["a b", "  "], ["x", "y"]), ValueError, r"texts\[1\] is empty or whitespace"),
      ((["a b", "c d"], ["x", "x"]), ValueError, "at least two intents"),
      ((["a b", "c d"], ["x", 1]), TypeError, "mix types"),
      ((["a b", "c d"], [1.5, 2.5]), TypeError, "strings or ints"),
      (("a b", ["x"]), TypeError, "got one string"),
  ]
  for args, error, message in cases:
    with pytest.raises(error, match=message):
      clf.fit(*args, max_steps=1, progress=False)
  with pytest.raises(ValueError, match="also a training intent"):
    clf.fit(*TRAIN, oos_label="pin", max_steps=1, progress=False)
  with pytest.raises(TypeError, match="unexpected keyword 'batchsize'"):
    clf.fit(*TRAIN, batchsize=3, progress=False)


def test_a_long_text_is_truncated_and_said_once(fitted):
  long = " ".join(["card"] * 200)
  with pytest.warns(UserWarning, match="truncated"):
    fitted.encoder._warned_truncation = False
    fitted.predict([long])
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    fitted.predict([long])


def _damage(folder, name, change):
  path = folder / name
  path.write_bytes(change(path.read_bytes()))


@pytest.mark.parametrize("name,change,message", [
    ("pool_embeddings.npy", lambda b: b[:-16], "pool_embeddings.npy: sha256 differs"),
    ("pool.jsonl", lambda b: b.rsplit(b"\n", 2)[0] + b"\n", "pool.jsonl: 8 rows"),
    ("pool.jsonl", lambda b: b.replace(b'"label"', b'"lable"', 1), "pool.jsonl:1: expected"),
    ("classifier.json", lambda b: b[:20], "classifier.json: not valid JSON"),
    ("classifier.json", lambda b: b.replace(b'"format_version": 1', b'"format_version": 99'),
     "newer convfit_jax"),
    ("classifier.json", lambda b: b.replace(b'"temperature"', b'"temp"'), "missing field"),
])
def test_damaged_folders_are_refused_naming_file_and_field(fitted, tmp_path, name, change, message):
  folder = tmp_path / "clf"
  fitted.save_pretrained(folder)
  _damage(folder, name, change)
  with pytest.raises(SavedClassifierError, match=message):
    IntentClassifier.from_pretrained(folder)


def test_a_failed_save_leaves_the_previous_folder_whole(fitted, tmp_path, monkeypatch):
  folder = tmp_path / "clf"
  fitted.save_pretrained(folder)
  before = sorted(p.name for p in folder.iterdir())

  def broken(*args, **kwargs):
    raise OSError("disk full")

  monkeypatch.setattr(saved_classifier.np, "save", broken)
  with pytest.raises(OSError, match="disk full"):
    fitted.save_pretrained(folder)
  assert sorted(p.name for p in folder.iterdir()) == before
  assert [p.name for p in tmp_path.iterdir()] == ["clf"]  # no temporary folder left
  monkeypatch.undo()
  assert IntentClassifier.from_pretrained(folder).predict(TEST[0]) == fitted.predict(TEST[0])


def test_predict_command_line_writes_json_lines(fitted, tmp_path):
  folder = fitted.save_pretrained(tmp_path / "clf")
  cmd = [sys.executable, "-m", "convfit_jax.main", "--config=configs/predict.py",
         f"--config.classifier={folder}"]
  r = subprocess.run(cmd, cwd=REPO, input="\n".join(TEST[0]) + "\n", capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  rows = [json.loads(line) for line in r.stdout.splitlines()]
  expected = fitted.predict_details(TEST[0])
  assert [(x["text"], x["label"], x["oos"]) for x in rows] == [
      (x["text"], x["label"], x["oos"]) for x in expected]
  np.testing.assert_allclose([x["score"] for x in rows], [x["score"] for x in expected], atol=1e-5)
  texts = tmp_path / "texts.txt"
  texts.write_text("card still missing\n\nbalance\n", encoding="utf-8")
  r = subprocess.run(cmd + [f"--config.input={texts}", f"--config.output={tmp_path / 'o.jsonl'}"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 1 and f"{texts}:2: empty line" in r.stderr
  assert not (tmp_path / "o.jsonl").exists()


def test_stage1_from_python_feeds_the_classifier(tiny_bert_dir):
  with open(FIXTURES / "sgd_train.tsv", encoding="utf-8") as f:
    rows = [line.rstrip("\n").split("\t") for line in f][1:]
  contexts, responses = [r[0] for r in rows], [r[1] for r in rows]
  enc = fine_tune_stage1(tiny_bert_dir, contexts, responses, batch_size=8, max_steps=2,
                         progress=False)
  assert isinstance(enc, Encoder)
  before = Encoder.from_pretrained(tiny_bert_dir, max_length=48)
  assert not np.allclose(enc.encode(TEST[0]), before.encode(TEST[0]))
  clf = IntentClassifier.from_pretrained(enc).fit(*TRAIN, max_steps=1, progress=False)
  assert len(clf.predict(TEST[0])) == len(TEST[0])
  with pytest.raises(ValueError, match="at least a batch"):
    fine_tune_stage1(tiny_bert_dir, contexts[:3], responses[:3], batch_size=8)
