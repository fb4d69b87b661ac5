"""Intent detection by nearest neighbours (and the MLP baseline) with any text encoder.

What Stage 2 reports before and after training and what the `evaluate` task runs:
k-NN accuracy with the diagnostics the paper reports (macro-F1, Silhouette, the most
frequent confusions, t-SNE), clinc150 out-of-scope detection by a similarity
threshold, and the paper's inference-time augmentation (a larger k-NN pool).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import ml_collections
import numpy as np

from convfit_jax.data import intent
from convfit_jax.data.intent import OOS_LABEL, IntentData, IntentSplit
from convfit_jax.evaluators import TextEncoder, knn, metrics, mlp, plots


def evaluate_intents(encoder: TextEncoder, data: IntentData, *, k: int = 1, vote: str = "majority",
                     batch_size: int = 32, test: IntentSplit | None = None, run_mlp: bool = False,
                     oos: bool = False, seed: int = 0, tsne_path: str | Path | None = None,
                     tsne_title: str = "", suffix: str = "", head=None) -> dict[str, Any]:
  """k-NN intent accuracy of `encoder` on `data`, with the diagnostics the paper reports.

  Args:
    encoder: the text encoder (its encodings are L2-normalised here).
    data: the pool (`data.pool`) and label names; the test set unless `test` is given.
    k, vote: k-NN settings.
    run_mlp: also train the MLP baseline on the training examples' encodings.
    oos: clinc150 out-of-scope evaluation (`data` from `intent.for_evaluation(..., oos=True)`):
      a similarity threshold chosen on `data.val` maps low-confidence queries to `oos`.
    tsne_path: write the t-SNE PNG of the test encodings there.
    suffix: appended to every metric name (e.g. "_pool30").
    head: a trained intent head (`train.stage2.IntentScorer`: `logits(unit [n, d])` over
      its `label_names`), scored as head_accuracy.
  Returns:
    knn_accuracy, prototype_accuracy (the nearest intent mean, `knn.prototypes`), macro_f1,
    silhouette, top_confusions, num_test, num_pool, num_train (and
    mlp_accuracy, head_accuracy, oos_* when asked), each name + suffix.
  """
  test = data.test if test is None else test
  names = data.label_names
  oos_id = names.index(OOS_LABEL) if oos else None
  pool = data.pool
  enc = lambda texts: encoder.encode(texts, batch_size=batch_size, normalize=True)
  pool_x, test_x = enc(pool.texts), enc(test.texts)
  result = knn.knn_predict(test_x, pool_x, pool.labels, k=k, vote=vote)
  out: dict[str, Any] = {"num_test": len(test), "num_pool": len(pool), "num_train": len(data.train)}
  in_scope = np.ones(len(test), bool) if oos_id is None else test.labels != oos_id
  pred = result.predictions
  out["knn_accuracy"] = metrics.accuracy(test.labels[in_scope], pred[in_scope])
  out["macro_f1"] = metrics.macro_f1(test.labels[in_scope], pred[in_scope])
  out["top_confusions"] = metrics.confusion_pairs(test.labels[in_scope], pred[in_scope], top=10,
                                                  label_names=names)
  out["silhouette"] = metrics.silhouette(test_x[in_scope], test.labels[in_scope])
  centres, centre_labels = knn.prototypes(pool_x, pool.labels)
  by_prototype = knn.knn_predict(test_x, centres, centre_labels).predictions
  out["prototype_accuracy"] = metrics.accuracy(test.labels[in_scope], by_prototype[in_scope])
  if head is not None:
    ids = np.asarray([names.index(n) for n in head.label_names])
    by_head = ids[np.argmax(head.logits(test_x), axis=1)]
    out["head_accuracy"] = metrics.accuracy(test.labels[in_scope], by_head[in_scope])
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


_VAL_INSIDE_TRAIN = ("banking77", "hwu64")  # their train.csv holds val.csv's rows


def _evaluation_split(data: IntentData, settings: ml_collections.ConfigDict,
                      data_config: ml_collections.ConfigDict) -> IntentSplit:
  """The split `settings.split` names, refusing one the run's training data contains."""
  split = settings.get("split", "test")
  if split == "test":
    return data.test
  if split != "val":
    raise ValueError(f"evals.<intent_knn>.split: {split!r}; known: test, val")
  if data.val is None:
    raise ValueError(f"evals.<intent_knn>.split='val': {data.name} has no validation split "
                     "(for name='csv' set data.val_file)")
  if settings.oos:
    raise ValueError("evals.<intent_knn>.split='val' with oos=True: the out-of-scope threshold "
                     "is chosen on val, so val cannot also be what it is scored on")
  if data.name in _VAL_INSIDE_TRAIN and (data_config.get("train_split") or "train") == "train":
    raise ValueError(f"evals.<intent_knn>.split='val' on {data.name}: its train.csv contains the "
                     "validation rows; set data.train_split='train_minus_val'")
  return data.val


class Evaluator:
  """k-NN (and MLP) intent detection on the run's `config.data` set.

  Args:
    settings: its config block (`convfit_jax.configs.common`).
    run_config: the run's config: its `data` block names the set; `seed` draws the
      test subset and seeds the MLP and t-SNE.
    workdir: where t-SNE PNGs go.
  """

  def __init__(self, settings: ml_collections.ConfigDict, *, run_config: ml_collections.ConfigDict,
               workdir: Path):
    self.settings = settings
    self.data_config = run_config.data
    self.seed = run_config.seed
    self.workdir = Path(workdir)
    self.data = intent.for_evaluation(run_config.data, oos=settings.oos)
    self.test = intent.subsample(_evaluation_split(self.data, settings, run_config.data),
                                 settings.max_test, self.seed)
    shots = run_config.data.shots
    self.title = f"{self.data.name} {settings.split}, {shots or 'full'}-shot"

  def __call__(self, predictors: Mapping[str, Any], *, when: str, label: str = "") -> dict[str, Any]:
    """Metrics of the predictor named by `settings.predictor`.

    Args:
      predictors: the task's predictors.
      when: "before", "during" or "after" training ("" outside training); names the t-SNE
        file, and "after" adds the larger pools.
      label: how the encoder is described in the t-SNE title.
    """
    e = self.settings
    encoder = predictors[e.predictor]
    png = f"tsne_{when}.png" if when else "tsne.png"
    title = ", ".join(x for x in (self.title, label) if x)
    out = evaluate_intents(encoder, self.data, k=e.k, vote=e.vote, batch_size=e.batch_size,
                           test=self.test, run_mlp=e.mlp, oos=e.oos, seed=self.seed,
                           tsne_path=self.workdir / png if e.tsne and when != "during" else None,
                           tsne_title=title,
                           head=predictors.get("intent_head") if when != "before" else None)
    if when == "after":
      for pool_shots in e.extra_pools:
        # The same encoder, a larger k-NN pool: the paper's inference-time augmentation.
        pool_data = intent.for_evaluation({**self.data_config.to_dict(), "pool_shots": pool_shots},
                                          oos=e.oos)
        out.update(evaluate_intents(encoder, pool_data, k=e.k, vote=e.vote, batch_size=e.batch_size,
                                    test=self.test, oos=e.oos, seed=self.seed,
                                    suffix=f"_pool{pool_shots or 'full'}"))
    return out
