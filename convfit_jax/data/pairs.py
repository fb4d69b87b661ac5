"""ConvFiT Stage 2 pairs: int32 index pairs into one table of unique sentences.

Positives are every unordered pair (x_i, x_j), i < j, with the same label. Each
positive brings 2n negatives: n pairs (x_i, x') and n pairs (x'', x_j), with x'
and x'' drawn uniformly from the examples of other labels than x_i's (paper,
Section 2, Stage 2). Pairs are indices into the sentence table (the rows of the
training set), never copies of token arrays.
"""

from __future__ import annotations

import dataclasses

import numpy as np

# Targets of a positive / negative pair for each Stage 2 loss.
LOSS_TARGETS = {"smax": (1.0, 0.0), "ocl": (1.0, 0.0), "cl": (1.0, 0.0), "cos": (0.8, 0.3)}


def loss_targets(loss: str) -> tuple[float, float]:
  """(positive, negative) target of `loss`; an unknown loss lists the known ones."""
  if loss not in LOSS_TARGETS:
    raise ValueError(f"unknown loss {loss!r}; known: {', '.join(LOSS_TARGETS)}")
  return LOSS_TARGETS[loss]


@dataclasses.dataclass(frozen=True)
class Pairs:
  """Stage 2 pairs over a table of `num_sentences` sentences.

  Attributes:
    u, v: [p] int32 sentence-table rows of each pair's two sides.
    positive: [p] bool, True for same-label pairs. Positives come first, then
      their negatives.
    num_sentences: rows in the sentence table.
  """
  u: np.ndarray
  v: np.ndarray
  positive: np.ndarray
  num_sentences: int

  def __len__(self) -> int:
    return int(self.u.shape[0])

  @property
  def num_positive(self) -> int:
    return int(self.positive.sum())

  @property
  def num_negative(self) -> int:
    return len(self) - self.num_positive

  def targets(self, loss: str) -> np.ndarray:
    """[p] float32 targets for `loss` ('smax' | 'ocl' | 'cl': 1/0, 'cos': 0.8/0.3)."""
    pos, neg = loss_targets(loss)
    return np.where(self.positive, np.float32(pos), np.float32(neg)).astype(np.float32)

  def summary(self, max_length: int = 48) -> str:
    """One line to print before training: pair counts and host memory."""
    index_bytes = len(self) * (4 + 4 + 1 + 4)  # u, v, positive, float32 target
    table_bytes = self.num_sentences * max_length * 4 * 2  # input_ids + mask, int32
    return (f"Stage 2 pairs: {len(self):,} ({self.num_positive:,} positive, "
            f"{self.num_negative:,} negative) over {self.num_sentences:,} sentences; "
            f"memory {index_bytes / 2**20:.1f} MiB pair indices + "
            f"{table_bytes / 2**20:.1f} MiB token table (max_length {max_length})")


def build_pairs(labels: np.ndarray, negatives: int, seed: int = 0,
                max_pairs_per_label: int | None = None) -> Pairs:
  """The paper's positive and negative pairs over sentences with `labels`.

  Args:
    labels: [n] int label id of each sentence-table row.
    negatives: n, negatives per side of each positive (2n per positive).
    seed: seeds the positive subsampling and the negative draws (PCG64).
    max_pairs_per_label: keep at most this many positives per label, a uniform
      sample without replacement (None or 0: all).
  Returns:
    Pairs: positives label by label (ascending label id, then i, j), then for each
    positive in that order its n (x_i, x') and then its n (x'', x_j) negatives.
  """
  labels = np.asarray(labels)
  if labels.ndim != 1:
    raise ValueError(f"labels must be [n], got shape {labels.shape}")
  if negatives < 0:
    raise ValueError(f"negatives must be >= 0, got {negatives}")
  rng = np.random.Generator(np.random.PCG64(seed))
  pos_u, pos_v = [], []
  for label in np.unique(labels):
    rows = np.flatnonzero(labels == label)
    i, j = np.triu_indices(len(rows), k=1)
    if max_pairs_per_label and len(i) > max_pairs_per_label:
      keep = np.sort(rng.choice(len(i), size=max_pairs_per_label, replace=False))
      i, j = i[keep], j[keep]
    pos_u.append(rows[i])
    pos_v.append(rows[j])
  pos_u = np.concatenate(pos_u).astype(np.int32) if pos_u else np.zeros((0,), np.int32)
  pos_v = np.concatenate(pos_v).astype(np.int32) if pos_v else np.zeros((0,), np.int32)
  n_pos = len(pos_u)
  neg_other = np.zeros((n_pos, 2 * negatives), np.int32)
  if negatives and n_pos:
    # Drawn label by label: x' and x'' are uniform over the rows whose label
    # differs from the positive's (both sides share it).
    pos_labels = labels[pos_u]
    for label in np.unique(pos_labels):
      which = np.flatnonzero(pos_labels == label)
      others = np.flatnonzero(labels != label)
      if len(others) == 0:
        raise ValueError("negatives need at least two labels")
      neg_other[which] = others[rng.integers(0, len(others), size=(len(which), 2 * negatives))]
  # Per positive: n pairs (x_i, x'), then n pairs (x'', x_j).
  anchor_u = np.repeat(pos_u[:, None], negatives, axis=1)
  anchor_v = np.repeat(pos_v[:, None], negatives, axis=1)
  neg_u = np.concatenate([anchor_u, neg_other[:, negatives:]], axis=1).reshape(-1)
  neg_v = np.concatenate([neg_other[:, :negatives], anchor_v], axis=1).reshape(-1)
  u = np.concatenate([pos_u, neg_u]).astype(np.int32)
  v = np.concatenate([pos_v, neg_v]).astype(np.int32)
  positive = np.concatenate([np.ones(n_pos, bool), np.zeros(len(neg_u), bool)])
  return Pairs(u, v, positive, int(labels.shape[0]))
