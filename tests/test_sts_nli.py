"""STS and NLI pieces: the readers' bad input, Pearson/Spearman against scipy, the STS
adaptation where the answer is known, the NLI head against numpy, the evaluate task's STS."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats
from flax import nnx

from configs import evaluate as evaluate_config
from convfit_jax.data.readers import DataError
from convfit_jax.data.sentence_pairs import NLI_LABELS, read_nli, read_sts
from convfit_jax.evaluators import metrics, sts
from convfit_jax.models.heads import NliClassifier
from convfit_jax.tasks import evaluate

from conftest import SHARED_DATA


def _write(path, text):
  path.write_text(text)
  return path


@pytest.mark.parametrize("body, message", [
    ("score\tsentence1\tsentence2\n5.2\ta\tb\n", r"s\.tsv:2: score '5\.2' is outside \[0, 5\]"),
    ("score\tsentence1\tsentence2\n-1\ta\tb\n", r"s\.tsv:2: score '-1' is outside \[0, 5\]"),
    ("score\tsentence1\tsentence2\nnan\ta\tb\n", r"s\.tsv:2: score 'nan' is outside"),
    ("score\tsentence1\tsentence2\nhigh\ta\tb\n", r"s\.tsv:2: score 'high' is not a number"),
    ("score\tsentence1\tsentence2\n1\ta\tb\n2\t \tb\n", r"s\.tsv:3: empty sentence1"),
    ("score\tsentence1\tsentence2\n1\ta\tb\n2\ta\n", r"s\.tsv:3: 2 fields, the header has 3"),
    ("score\ttext\tsentence2\n1\ta\tb\n", r"s\.tsv:1: missing column\(s\) 'sentence1'"),
])
def test_sts_reader_names_file_and_line(tmp_path, body, message):
  with pytest.raises(DataError, match=message):
    read_sts(_write(tmp_path / "s.tsv", body))


def test_nli_reader(tmp_path):
  good = _write(tmp_path / "n.tsv", "label\tscore\tsentence1\tsentence2\n"
                "contradiction\t1.5\tA dog runs .\tNo dog runs .\nentailment\t4\tA b\tA\n")
  nli = read_nli(good)
  assert nli.labels.tolist() == [2, 0] and nli.premises[0] == "A dog runs ."
  assert read_sts(good).scores.tolist() == [1.5, 4.0]  # SICK-R from the same file
  with pytest.raises(DataError, match=r"n\.tsv:3: label '-' is not one of entailment"):
    read_nli(_write(tmp_path / "n.tsv", "label\tsentence1\tsentence2\nneutral\ta\tb\n-\ta\tb\n"))
  with pytest.raises(DataError, match=r"n\.tsv:2: empty sentence2"):
    read_nli(_write(tmp_path / "n.tsv", "label\tsentence1\tsentence2\nneutral\ta\t\n"))
  with pytest.raises(DataError, match=r"n\.tsv:1: missing column\(s\) 'label'"):
    read_nli(_write(tmp_path / "n.tsv", "gold\tsentence1\tsentence2\nneutral\ta\tb\n"))


def test_pearson_and_spearman_equal_scipy_with_ties():
  rng = np.random.default_rng(0)
  for _ in range(5):
    x = rng.integers(0, 6, 80).astype(np.float32)  # many ties, like STS's scores
    y = x + rng.normal(0, 2, 80)
    y[:10] = y[10]  # ties on the other side too
    assert metrics.pearson(x, y) == pytest.approx(scipy.stats.pearsonr(x, y).statistic, abs=1e-12)
    assert metrics.spearman(x, y) == pytest.approx(scipy.stats.spearmanr(x, y).statistic, abs=1e-12)
  assert np.isnan(metrics.pearson(np.ones(5), np.arange(5)))


def _synthetic_sts(n, rng):
  """Scores are 5 cos(z_u, z_v) of 4 positive latent dims; 4 louder nuisance dims follow."""
  z_u, z_v = rng.uniform(0, 1, (n, 4)), rng.uniform(0, 1, (n, 4))
  cos = np.sum(z_u * z_v, 1) / np.linalg.norm(z_u, axis=1) / np.linalg.norm(z_v, axis=1)
  u = np.concatenate([z_u, 2 * rng.normal(size=(n, 4))], 1).astype(np.float32)
  v = np.concatenate([z_v, 2 * rng.normal(size=(n, 4))], 1).astype(np.float32)
  return u, v, (5 * cos).astype(np.float32)


def test_adaptation_finds_the_known_transformation():
  rng = np.random.default_rng(0)
  train, dev, test = (_synthetic_sts(n, rng) for n in (2000, 300, 300))
  cos = lambda u, v, w: np.asarray(sts._cosine(jnp.asarray(u), jnp.asarray(v), jnp.asarray(w)))
  before = metrics.pearson(cos(test[0], test[1], np.eye(8)), test[2])
  w, epoch, dev_r = sts.fit_adaptation(train, dev, config=sts.AdaptConfig(
      epochs=30, batch_size=64, learning_rate=1e-2), seed=0)
  after = metrics.pearson(cos(test[0], test[1], w), test[2])
  assert before < 0.5 and after > 0.95 and dev_r > 0.95 and epoch > 0
  # The nuisance dimensions are (nearly) projected away.
  assert np.abs(w[4:]).max() < 0.2 * np.abs(w[:4]).max()
  # Seeded: the same run gives the same matrix.
  w2, _, _ = sts.fit_adaptation(train, dev, config=sts.AdaptConfig(
      epochs=30, batch_size=64, learning_rate=1e-2), seed=0)
  np.testing.assert_array_equal(w, w2)


def test_nli_head_equals_numpy():
  rng = np.random.default_rng(0)
  head = NliClassifier(6, (5,), rngs=nnx.Rngs(0))
  u, v = rng.normal(size=(4, 6)).astype(np.float32), rng.normal(size=(4, 6)).astype(np.float32)
  (k1, b1), (k2, b2) = [(np.asarray(layer.kernel[...]), np.asarray(layer.bias[...]))
                        for layer in head.layers]
  features = np.concatenate([u, v, np.abs(u - v), u * v], 1)
  expected = np.maximum(features @ k1 + b1, 0) @ k2 + b2
  np.testing.assert_allclose(np.asarray(head(jnp.asarray(u), jnp.asarray(v))), expected, rtol=1e-5,
                             atol=1e-5)
  assert head(jnp.asarray(u), jnp.asarray(v)).shape == (4, len(NLI_LABELS))


def write_sts_dir(folder, seed=0, topics=("dog", "cat", "car", "bus", "piano", "guitar", "soup", "bread")):
  """STS-B-like train/dev/test: a sentence about a topic against the same topic (4-5),
  a related one (2-3) or another (0-1); `topics` an even number of words."""
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  for split, n in (("train", 120), ("dev", 40), ("test", 40)):
    lines = ["score\tsentence1\tsentence2"]
    for _ in range(n):
      a = int(rng.integers(len(topics)))
      kind = int(rng.integers(3))
      b = a if kind == 0 else a ^ 1 if kind == 1 else (a + 2 + int(rng.integers(6))) % len(topics)
      score = (4 + rng.uniform(), 2 + rng.uniform(), rng.uniform())[kind]
      lines.append(f"{score:.3f}\tA photo of a {topics[a]} here.\tThere is a {topics[b]} in it.")
    (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
  return folder


def test_evaluate_task_writes_the_sts_metrics(tmp_path, tiny_bert_dir):
  c = evaluate_config.get_config(f"sts,init_from={tiny_bert_dir}")
  c.workdir = str(tmp_path / "run")
  c.data.sts_dir = str(write_sts_dir(tmp_path / "stsb"))
  c.data.sick_dir = str(write_sts_dir(tmp_path / "sick", seed=1))  # SICK-R reads score too
  c.evals.sts.adapt_epochs = 3
  m = evaluate.run(c)
  on_disk = json.loads((tmp_path / "run" / "metrics.json").read_text())
  for name in ("stsb_dev", "stsb_test", "sickr_test"):
    for stat in ("pearson", "spearman"):
      for key in (f"{name}_{stat}", f"{name}_adapted_{stat}"):
        assert -1 <= m[key] <= 1 and on_disk[key] == m[key]
  assert m["stsb_dev_adapted_pearson"] >= m["stsb_dev_pearson"] - 1e-4  # epoch 0: the identity
  # Without a SICK folder SICK-R is left out.
  c.data.sick_dir = ""
  c.workdir = str(tmp_path / "run2")
  assert "sickr_test_pearson" not in evaluate.run(c)
  # Several Adam rates: the best on dev is kept, so dev never falls below the one-rate run's.
  c.evals.sts.adapt_learning_rates = (1e-4, 1e-2)
  c.workdir = str(tmp_path / "run3")
  grid = evaluate.run(c)
  assert grid["sts_adapt_learning_rate"] in (1e-4, 1e-2) and m["sts_adapt_learning_rate"] == 1e-4
  assert grid["stsb_dev_adapted_pearson"] >= m["stsb_dev_adapted_pearson"]
  c.evals.sts.adapt_learning_rates = ()
  c.workdir = str(tmp_path / "run4")
  with pytest.raises(ValueError, match="adapt_learning_rates"):
    evaluate.run(c)


@pytest.mark.skipif(not (SHARED_DATA / "nli").is_dir(), reason="../shared/data is absent")
def test_shared_nli_and_sick_files():
  assert len(read_nli(SHARED_DATA / "nli" / "snli" / "test.tsv")) == 9824
  sick = read_nli(SHARED_DATA / "nli" / "sick" / "train.tsv")
  assert len(sick) == 4439 and np.bincount(sick.labels).tolist() == [1274, 2524, 641]
  sickr = read_sts(SHARED_DATA / "nli" / "sick" / "test.tsv")
  assert len(sickr) == 4906 and 1.0 <= sickr.scores.min() and sickr.scores.max() <= 5.0

