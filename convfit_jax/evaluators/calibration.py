"""k-NN evidence as intent scores and probabilities: each intent's best cosine, a softmax
over those at a fitted temperature, and that temperature chosen by leave-one-out on the pool.

The scores are the k-NN's own evidence (1-NN predicts the intent of the highest), so the
probabilities rank intents exactly as the neighbours do; the temperature only decides how
peaked they are. It is fitted by minimising the negative log-likelihood of the true intent,
on held-out queries when there are some, else on the pool itself with each example left
out of its own neighbours (an intent with a single example is then skipped: it has no
evidence left).
"""

from __future__ import annotations

import numpy as np

# Temperatures tried (a log grid): cosines differ by hundredths between close intents,
# so the best lies well below 1.
TEMPERATURES = np.geomspace(1e-3, 1.0, 91)
_CHUNK = 1024  # query rows per similarity block: [chunk, pool] float32 at a time


def intent_scores(queries: np.ndarray, pool: np.ndarray, pool_labels: np.ndarray, num_labels: int,
                  *, leave_out_self: bool = False) -> np.ndarray:
  """Each intent's best cosine similarity among the pool's examples of it.

  Args:
    queries: [n, d] float32, unit rows.
    pool: [m, d] float32, unit rows.
    pool_labels: [m] int32 ids in [0, num_labels).
    leave_out_self: queries are the pool itself (n == m): row i does not see pool row i.
  Returns:
    [n, num_labels] float32; -inf for an intent with no (other) example in the pool.
  """
  queries, pool = np.asarray(queries, np.float32), np.asarray(pool, np.float32)
  pool_labels = np.asarray(pool_labels, np.int64)
  order = np.argsort(pool_labels, kind="stable")
  sorted_labels = pool_labels[order]
  present = np.unique(sorted_labels)
  starts = np.searchsorted(sorted_labels, present)
  out = np.full((len(queries), num_labels), -np.inf, np.float32)
  for lo in range(0, len(queries), _CHUNK):
    sims = queries[lo:lo + _CHUNK] @ pool.T
    if leave_out_self:
      rows = np.arange(len(sims))
      sims[rows, lo + rows] = -np.inf
    out[lo:lo + _CHUNK, present] = np.maximum.reduceat(sims[:, order], starts, axis=1)
  return out


def softmax(scores: np.ndarray, temperature: float) -> np.ndarray:
  """Row softmax of scores / temperature: [n, c] -> [n, c] float32 (-inf scores get 0)."""
  z = np.asarray(scores, np.float64) / temperature
  z = np.exp(z - z.max(axis=1, keepdims=True))
  return (z / z.sum(axis=1, keepdims=True)).astype(np.float32)


def fit_temperature(scores: np.ndarray, labels: np.ndarray) -> float:
  """The grid temperature of least mean negative log-likelihood of `labels` [n] int under
  `softmax(scores, t)`; rows whose true intent scores -inf are left out. 1.0 when no row is
  left."""
  scores, labels = np.asarray(scores, np.float64), np.asarray(labels, np.int64)
  true = scores[np.arange(len(labels)), labels]
  keep = np.isfinite(true)
  if not keep.any():
    return 1.0
  scores, true = scores[keep], true[keep]
  top = scores.max(axis=1)
  best, best_nll = 1.0, np.inf
  for t in TEMPERATURES:
    log_norm = top / t + np.log(np.exp((scores - top[:, None]) / t).sum(axis=1))
    nll = float(np.mean(log_norm - true / t))
    if nll < best_nll:
      best, best_nll = float(t), nll
  return best


def leave_one_out_temperature(pool: np.ndarray, pool_labels: np.ndarray, num_labels: int) -> float:
  """`fit_temperature` on the pool scored against itself, each example left out."""
  scores = intent_scores(pool, pool, pool_labels, num_labels, leave_out_self=True)
  return fit_temperature(scores, pool_labels)
