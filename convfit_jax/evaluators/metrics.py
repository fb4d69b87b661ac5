"""Evaluation metrics: intent detection (accuracy, macro-F1, confusions, Silhouette) and
response selection (R@k, MRR).

Inputs are host arrays (NumPy or anything `np.asarray` takes); outputs are Python floats.
"""

from __future__ import annotations

import numpy as np
from sklearn.metrics import silhouette_score


def accuracy(y_true, y_pred) -> float:
  """Share of exact matches: [n] int x [n] int -> float."""
  y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
  return float(np.mean(y_true == y_pred))


def macro_f1(y_true, y_pred) -> float:
  """Unweighted mean of per-label F1 over every label seen in y_true or y_pred.

  A label with no true and no predicted example cannot occur; one with a zero precision
  or recall denominator scores 0, as scikit-learn's `f1_score(average="macro")`.
  """
  y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
  labels = np.union1d(y_true, y_pred)
  tp = np.array([np.sum((y_true == c) & (y_pred == c)) for c in labels], np.float64)
  # F1 = 2 tp / (2 tp + fp + fn) = 2 tp / (#true + #predicted).
  denom = np.array([np.sum(y_true == c) + np.sum(y_pred == c) for c in labels], np.float64)
  return float(np.mean(2 * tp / denom))


def confusion_pairs(y_true, y_pred, top: int = 10, label_names=None) -> list[tuple]:
  """The most frequent errors: (true, predicted, count), most frequent first.

  Ties in count go to the lower (true, predicted) pair. With `label_names`, labels are
  given as names.
  """
  y_true, y_pred = np.asarray(y_true), np.asarray(y_pred)
  wrong = y_true != y_pred
  pairs, counts = np.unique(np.stack([y_true[wrong], y_pred[wrong]], 1), axis=0,
                            return_counts=True)
  order = np.lexsort((pairs[:, 1], pairs[:, 0], -counts))[:top] if len(pairs) else []
  name = (lambda x: int(x)) if label_names is None else (lambda x: label_names[int(x)])
  return [(name(pairs[i, 0]), name(pairs[i, 1]), int(counts[i])) for i in order]


def silhouette(encodings, labels) -> float:
  """Silhouette coefficient of the encodings clustered by label, cosine metric (scikit-learn).

  Args:
    encodings: [n, d] float.
    labels: [n] int.
  Returns:
    the coefficient, or NaN where it is undefined: fewer than 2 distinct labels, or no
    label with two examples (a test set of one example per intent).
  """
  k = len(np.unique(np.asarray(labels)))
  if not 2 <= k <= len(labels) - 1:
    return float("nan")
  return float(silhouette_score(np.asarray(encodings, np.float32), np.asarray(labels),
                                metric="cosine"))


def ranks(scores, true_index) -> np.ndarray:
  """1-based rank of the true candidate per row; candidates scoring the same as the true
  one rank ahead of it, so a constant scorer gets no credit."""
  scores = np.asarray(scores)
  true_index = np.asarray(true_index)
  true_score = scores[np.arange(len(scores)), true_index][:, None]
  # 1 + (#higher) + (#equal others) = #(scores >= the true one's).
  return np.sum(scores >= true_score, axis=1)


def recall_at_k(scores, true_index, k: int) -> float:
  """R@k: share of rows whose true candidate ranks in the top k.

  Args:
    scores: [n, c] float, e.g. c = 100 candidates per context.
    true_index: [n] int, the column of the true response.
  """
  return float(np.mean(ranks(scores, true_index) <= k))


def mrr(scores, true_index) -> float:
  """Mean reciprocal rank of the true candidate: [n, c] x [n] -> float."""
  return float(np.mean(1.0 / ranks(scores, true_index)))


def rank_metrics(ranks_, cuts, name: str = "r_at") -> dict[str, float]:
  """{"<name>_<k>": R@k for each cut, "mrr": ...} of [n] 1-based ranks (np.inf: not found)."""
  ranks_ = np.asarray(ranks_)
  out = {f"{name}_{k}": float(np.mean(ranks_ <= k)) for k in cuts}
  out["mrr"] = float(np.mean(1.0 / ranks_))
  return out


def response_selection_metrics(scores, true_index) -> dict[str, float]:
  """Recall at the cuts the field reports for a [n, c] score matrix, and MRR.

  1-of-10 cases (the Ubuntu corpus's form): r10_at_1, r10_at_2, r10_at_5, mrr.
  Otherwise (1-of-100, DSTC7's form): r_at_1, r_at_10, r_at_50, mrr and dstc7, DSTC7's
  ranking figure avg(R@10, MRR).
  """
  r = ranks(scores, true_index)
  if np.shape(scores)[1] == 10:
    out = rank_metrics(r, (1, 2, 5), name="r10_at")
  else:
    out = rank_metrics(r, (1, 10, 50))
  if "r_at_10" in out:
    out["dstc7"] = (out["r_at_10"] + out["mrr"]) / 2
  return out
