"""Stage 2 pair construction: the paper's counts, label structure, seeding, caps."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from convfit_jax.data import intent, pairs
from convfit_jax.data.readers import DuplicateRowsWarning


@pytest.fixture(scope="module")
def banking_10shot():
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", DuplicateRowsWarning)
    return intent.load("banking77", shots=10, seed=0)


def test_banking77_10shot_paper_counts(banking_10shot):
  labels = banking_10shot.train.labels
  p = pairs.build_pairs(labels, negatives=3, seed=0)
  assert (p.num_positive, p.num_negative) == (3465, 20790)
  assert p.u.dtype == np.int32 and p.v.dtype == np.int32
  pos, neg = p.positive, ~p.positive
  assert np.all(labels[p.u[pos]] == labels[p.v[pos]])
  assert np.all(p.u[pos] < p.v[pos])
  assert len(set(zip(p.u[pos].tolist(), p.v[pos].tolist()))) == 3465
  assert np.all(labels[p.u[neg]] != labels[p.v[neg]])
  assert p.num_sentences == 770


def test_negatives_keep_one_side_of_their_positive():
  labels = np.array([0, 0, 1, 1, 2, 2, 2])
  p = pairs.build_pairs(labels, negatives=2, seed=5)
  n_pos = p.num_positive
  assert n_pos == 1 + 1 + 3
  neg_u = p.u[n_pos:].reshape(n_pos, 4)
  neg_v = p.v[n_pos:].reshape(n_pos, 4)
  pos_u, pos_v = p.u[:n_pos], p.v[:n_pos]
  # First n negatives pair x_i with x', the next n pair x'' with x_j.
  assert np.all(neg_u[:, :2] == pos_u[:, None]) and np.all(neg_v[:, 2:] == pos_v[:, None])
  assert np.all(labels[neg_v[:, :2]] != labels[pos_u][:, None])
  assert np.all(labels[neg_u[:, 2:]] != labels[pos_u][:, None])


def test_same_seed_same_pairs_other_seed_other_negatives(banking_10shot):
  labels = banking_10shot.train.labels
  a = pairs.build_pairs(labels, 3, seed=0)
  b = pairs.build_pairs(labels, 3, seed=0)
  c = pairs.build_pairs(labels, 3, seed=1)
  assert np.array_equal(a.u, b.u) and np.array_equal(a.v, b.v)
  assert not np.array_equal(a.v, c.v)


def test_negatives_are_roughly_uniform_over_other_labels():
  labels = np.repeat(np.arange(4), 5)
  p = pairs.build_pairs(labels, negatives=50, seed=0)
  x_prime = p.v[p.num_positive:].reshape(p.num_positive, 100)[:, :50]
  counts = np.bincount(x_prime.ravel(), minlength=20)
  # 40 positives x 50 draws = 2,000 over 15 candidates each: ~ 100 per (row,label) pair.
  assert counts.min() > 0
  per_row = counts / counts.sum()
  assert per_row.max() < 0.1


def test_max_pairs_per_label_caps_by_seed():
  labels = np.repeat(np.arange(3), 20)  # 190 positives per label
  p = pairs.build_pairs(labels, negatives=1, seed=0, max_pairs_per_label=50)
  assert p.num_positive == 150 and p.num_negative == 300
  assert np.bincount(labels[p.u[p.positive]]).tolist() == [50, 50, 50]
  q = pairs.build_pairs(labels, negatives=1, seed=0, max_pairs_per_label=50)
  r = pairs.build_pairs(labels, negatives=1, seed=1, max_pairs_per_label=50)
  assert np.array_equal(p.u, q.u) and not np.array_equal(p.u[:150], r.u[:150])
  small = pairs.build_pairs(labels, negatives=1, seed=0, max_pairs_per_label=1000)
  assert small.num_positive == 570


def test_targets_per_loss():
  p = pairs.build_pairs(np.array([0, 0, 1]), negatives=1)
  for loss in ("smax", "ocl", "cl"):
    assert p.targets(loss).tolist() == [1.0, 0.0, 0.0]
  assert np.allclose(p.targets("cos"), [0.8, 0.3, 0.3])
  assert p.targets("cos").dtype == np.float32
  with pytest.raises(ValueError, match="known: smax, ocl, cl, cos"):
    p.targets("mse")


def test_summary_reports_counts_and_memory(banking_10shot):
  p = pairs.build_pairs(banking_10shot.train.labels, 3)
  text = p.summary(max_length=48)
  assert "24,255 (3,465 positive, 20,790 negative)" in text and "770 sentences" in text
  assert "MiB" in text


def test_bad_arguments():
  with pytest.raises(ValueError, match="at least two labels"):
    pairs.build_pairs(np.zeros(4, np.int32), negatives=1)
  with pytest.raises(ValueError, match="negatives must be >= 0"):
    pairs.build_pairs(np.array([0, 1]), negatives=-1)
