"""Seeded samples of rows: N examples per label (few-shot sets) and subsets for quick evaluation."""

from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np


def few_shot_indices(texts: Sequence[str], labels: np.ndarray, label_names: Sequence[str],
                     shots: int, seed: int, allow_fewer: bool = False) -> np.ndarray:
  """Seeded N-per-label sample; [m] int64 row indices, ascending.

  Each label draws from its own PCG64 stream seeded by (seed, crc32(label)), over
  its rows sorted by (text, row), so the sample does not depend on the machine,
  the process, the row order of the file or the other labels, and for one seed
  the N-shot set is contained in every larger-shot set.

  Args:
    texts: n texts.
    labels: [n] int label ids into `label_names`.
    label_names: the vocabulary.
    shots: N per label; 0 takes every row.
    seed: the sampling seed.
    allow_fewer: take all rows of a label with fewer than N instead of failing.
  """
  labels = np.asarray(labels)
  if shots < 0:
    raise ValueError(f"shots must be >= 0, got {shots}")
  if shots == 0:
    return np.arange(len(labels), dtype=np.int64)
  chosen = []
  for label_id, label in enumerate(label_names):
    rows = np.flatnonzero(labels == label_id)
    if len(rows) < shots and not allow_fewer:
      raise ValueError(f"label {label!r} has {len(rows)} training examples, fewer than "
                       f"shots={shots} (set allow_fewer to take all it has)")
    rows = np.array(sorted(rows, key=lambda i: (texts[i], i)), np.int64)
    rng = np.random.Generator(np.random.PCG64([seed, zlib.crc32(label.encode("utf-8"))]))
    chosen.append(rows[rng.permutation(len(rows))[:shots]])
  return np.sort(np.concatenate(chosen)) if chosen else np.zeros((0,), np.int64)


def subsample_indices(n: int, num: int, seed: int) -> np.ndarray:
  """`num` of `n` row indices drawn without replacement by `seed`, ascending ([num] int64);
  all n rows when num <= 0 or num >= n."""
  if num <= 0 or num >= n:
    return np.arange(n, dtype=np.int64)
  return np.sort(np.random.default_rng(seed).choice(n, num, replace=False))
