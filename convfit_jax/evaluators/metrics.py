"""Evaluation metrics: intent detection (accuracy, macro-F1, confusions, Silhouette),
response selection (R@k, MRR) and semantic similarity (Pearson r, Spearman rho).

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
  Otherwise (1-of-100, DSTC7's form): r_at_1, r_at_3, r_at_10, r_at_50 (Yang et al.'s
  P@1/3/10 are the first three), mrr and dstc7, DSTC7's ranking figure avg(R@10, MRR).
  """
  r = ranks(scores, true_index)
  if np.shape(scores)[1] == 10:
    out = rank_metrics(r, (1, 2, 5), name="r10_at")
  else:
    out = rank_metrics(r, (1, 3, 10, 50))
  if "r_at_10" in out:
    out["dstc7"] = (out["r_at_10"] + out["mrr"]) / 2
  return out


def pearson(x, y) -> float:
  """Pearson's r of two [n] arrays (float64 sums); NaN when either is constant."""
  x = np.asarray(x, np.float64)
  y = np.asarray(y, np.float64)
  x, y = x - x.mean(), y - y.mean()
  denominator = np.sqrt(np.sum(x * x) * np.sum(y * y))
  return float(np.sum(x * y) / denominator) if denominator > 0 else float("nan")


def average_ranks(x) -> np.ndarray:
  """1-based ranks of [n] values, tied values sharing the mean of their ranks."""
  x = np.asarray(x)
  order = np.argsort(x, kind="stable")
  sorted_x = x[order]
  # Runs of equal values: each gets the mean of the ranks first..last of its run.
  starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
  ends = np.r_[starts[1:], len(x)]
  run_ranks = (starts + ends + 1) / 2.0
  out = np.empty(len(x), np.float64)
  out[order] = np.repeat(run_ranks, ends - starts)
  return out


def spearman(x, y) -> float:
  """Spearman's rho of two [n] arrays: Pearson's r of their average ranks."""
  return pearson(average_ranks(x), average_ranks(y))


def expected_calibration_error(probs, y_true, bins: int = 15) -> float:
  """ECE of predicted distributions (Guo et al. 2017): the top probabilities in `bins`
  equal-width bins over [0, 1], the mean |accuracy - confidence| per bin weighted by its
  share of the examples.

  Args:
    probs: [n, c] float, rows summing to 1.
    y_true: [n] int class ids.
  """
  probs, y_true = np.asarray(probs, np.float64), np.asarray(y_true)
  confidence = probs.max(axis=1)
  correct = probs.argmax(axis=1) == y_true
  # A confidence of exactly 1 falls in the last bin, not one past it.
  which = np.minimum((confidence * bins).astype(np.int64), bins - 1)
  total = 0.0
  for b in range(bins):
    inside = which == b
    if inside.any():
      total += inside.mean() * abs(correct[inside].mean() - confidence[inside].mean())
  return float(total)
