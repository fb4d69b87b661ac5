"""Intent detection with any encoder: k-NN (and the MLP baseline) on a test set.

What Stage 2 reports before and after training and what the `evaluate` task runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from convfit_jax import knn
from convfit_jax.data import intent
from convfit_jax.data.intent import OOS_LABEL, IntentData, IntentSplit
from convfit_jax.encoder import Encoder
from convfit_jax.eval import metrics, mlp, plots


def subsample(split: IntentSplit, max_rows: int, seed: int) -> IntentSplit:
  """At most `max_rows` rows of `split`, a seeded subset in original order (0 = all)."""
  if not max_rows or len(split) <= max_rows:
    return split
  rows = np.sort(np.random.default_rng(seed).choice(len(split), max_rows, replace=False))
  return split.subset(rows)


def without_label(split: IntentSplit, label: int) -> IntentSplit:
  return split.subset(np.flatnonzero(split.labels != label))


def load_intent_data(data_config, *, oos: bool = False) -> IntentData:
  """`intent.from_config` for an evaluation: with `oos`, clinc150's out-of-scope rows
  join val and test only; out-of-scope is detected by a threshold, not learnt as an intent."""
  d = data_config.to_dict() if hasattr(data_config, "to_dict") else dict(data_config)
  d["include_oos"] = d.get("include_oos", False) or oos
  data = intent.from_config(d)
  if not oos:
    return data
  oos_id = data.label_names.index(OOS_LABEL)
  return IntentData(data.name, data.label_names, without_label(data.train, oos_id),
                    without_label(data.pool, oos_id), data.test, data.val,
                    without_label(data.full_train, oos_id))


def evaluate_intents(encoder: Encoder, data: IntentData, *, k: int = 1, vote: str = "majority",
                     batch_size: int = 256, test: IntentSplit | None = None, run_mlp: bool = False,
                     oos: bool = False, seed: int = 0, tsne_path: str | Path | None = None,
                     tsne_title: str = "", suffix: str = "") -> dict[str, Any]:
  """k-NN intent accuracy of `encoder` on `data`, with the diagnostics the paper reports.

  Args:
    encoder: the sentence encoder (its encodings are L2-normalised here).
    data: the pool (`data.pool`) and label names; the test set unless `test` is given.
    k, vote: k-NN settings.
    run_mlp: also train the MLP baseline on the training examples' encodings.
    oos: clinc150 out-of-scope evaluation (`data` from `load_intent_data(..., oos=True)`):
      a similarity threshold chosen on `data.val` maps low-confidence queries to `oos`.
    tsne_path: write the t-SNE PNG of the test encodings there.
    suffix: appended to every metric name (e.g. "_before").
  Returns:
    knn_accuracy, macro_f1, silhouette, top_confusions, num_test, num_pool (and
    mlp_accuracy, oos_* when asked), each name + suffix.
  """
  test = data.test if test is None else test
  names = data.label_names
  oos_id = names.index(OOS_LABEL) if oos else None
  pool = data.pool
  enc = lambda texts: encoder.encode(texts, batch_size=batch_size, normalize=True)
  pool_x, test_x = enc(pool.texts), enc(test.texts)
  result = knn.knn_predict(test_x, pool_x, pool.labels, k=k, vote=vote)
  out: dict[str, Any] = {"num_test": len(test), "num_pool": len(pool)}
  in_scope = np.ones(len(test), bool) if oos_id is None else test.labels != oos_id
  pred = result.predictions
  out["knn_accuracy"] = metrics.accuracy(test.labels[in_scope], pred[in_scope])
  out["macro_f1"] = metrics.macro_f1(test.labels[in_scope], pred[in_scope])
  out["top_confusions"] = metrics.confusion_pairs(test.labels[in_scope], pred[in_scope], top=10,
                                                  label_names=names)
  out["silhouette"] = metrics.silhouette(test_x[in_scope], test.labels[in_scope])
  # The nearest pool example behind the first test predictions: the decision is readable.
  out["examples"] = [{"text": test.texts[i], "label": names[test.labels[i]],
                      "predicted": names[pred[i]],
                      "neighbours": knn.explain(result, i, pool.texts, pool.labels, names)}
                     for i in range(min(5, len(test)))]
  if oos:
    val = data.val
    val_x = enc(val.texts)
    val_result = knn.knn_predict(val_x, pool_x, pool.labels, k=k, vote=vote)
    threshold = knn.choose_oos_threshold(val_result.scores[:, 0], val_result.predictions,
                                         val.labels, oos_id)
    thresholded = knn.apply_oos_threshold(pred, result.scores[:, 0], threshold, oos_id)
    out["oos_threshold"] = float(threshold)
    out.update(knn.oos_metrics(thresholded, test.labels, oos_id))
  if run_mlp:
    train = data.train
    out["mlp_accuracy"] = mlp.mlp_accuracy(enc(train.texts), train.labels, test_x[in_scope],
                                           test.labels[in_scope], len(names), seed=seed)
  if tsne_path is not None:
    plots.plot_tsne(test_x[in_scope], test.labels[in_scope], str(tsne_path), title=tsne_title,
                    label_names=names, seed=seed)
    out["tsne_png"] = str(tsne_path)
  return {f"{key}{suffix}": value for key, value in out.items()}
