"""ConvFiT Stage 2: task-tailored contrastive fine-tuning on intent pairs.

Model: `models.siamese` (the sentence encoder: Transformer, masked mean pooling,
Dense(d_o) + tanh; plus the pair classifier for the `smax` loss). Data, by
`train.sampler`:

  pairs: the paper's pairs (every same-intent pair, 2n different-intent negatives per
    positive) as index arrays into one table of tokenised training sentences, B pairs a
    step, scored by a loss of `losses.STAGE2_LOSSES`;
  labels: P intents x K utterances a step (`data.label_batches`), every utterance once
    an epoch, scored over every pair of the batch or by supervised contrast
    (`losses.DENSE_LOSSES`).

Each step encodes the batch's distinct sentences once, packed several to a row
(`data.packing`: banking77's utterances fill a third of a padded batch), so a sentence
that appears in several pairs of a batch costs one forward pass and padding costs nothing.

The run itself (k-NN before, training with checkpoints, k-NN after, the model
exported as an HF/sentence-transformers folder) is `train.trainer`'s; the export also
writes `workdir/classifier/`, the saved `IntentClassifier` of the trained encoder and the
run's k-NN pool (`saved_classifier`).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from convfit_jax import losses, models, saved_classifier, sharding
from convfit_jax.configs.stage2 import objective
from convfit_jax.data import batching, intent, label_batches, pairs as pairs_lib
from convfit_jax.encoder import Encoder
from convfit_jax.evaluators import calibration
from convfit_jax.models import heads
from convfit_jax.models.sentence import SentenceEncoder
from convfit_jax.models.siamese import SiameseEncoder
from convfit_jax.train import trainer
from convfit_jax.train.train_state import TrainState, count_params
from convfit_jax.version import __version__

SAMPLERS = ("pairs", "labels")
BATCH_KEYS = {
    "pairs": ("input_ids", "attention_mask", "position_ids", "slots", "u_idx", "v_idx", "targets",
              "weights"),
    "labels": ("input_ids", "attention_mask", "position_ids", "slots", "labels", "weights"),
}


def dense_options(train_config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The keyword options of `losses.DENSE_LOSSES[train.loss]` from `train`."""
  t = train_config
  if t.loss == "supcon":
    return {"scale": t.scale, "denominator": t.supcon_denominator}
  options = {"negative_ratio": t.negative_ratio}
  if t.loss in ("ocl", "cl"):
    options["margin"] = t.margin
  return options


def loss_fn(model: SiameseEncoder, batch: Mapping[str, jax.Array], dropout_key: jax.Array | None, *,
            loss: str, margin: float) -> jax.Array:
  """The Stage 2 loss of one batch.

  Args:
    batch: input_ids, attention_mask, position_ids [R, W] int32 (the batch's distinct
      sentences, packed); slots [2B, 2] int32 (their rows and sentence numbers); u_idx,
      v_idx [B] int32 into those 2B; targets [B] float32; weights [B] float32.
  """
  emb = model.encoder(batch["input_ids"], batch["attention_mask"], dropout_key=dropout_key,
                      position_ids=batch["position_ids"], slots=batch["slots"])
  u, v = emb[batch["u_idx"]], emb[batch["v_idx"]]
  # The batch carries the loss's targets (0.8/0.3 for cos); the losses take same/different.
  labels = (batch["targets"] == pairs_lib.loss_targets(loss)[0]).astype(jnp.int32)
  kwargs = {"margin": margin} if loss in ("ocl", "cl") else {}
  return losses.STAGE2_LOSSES[loss](u, v, labels, batch["weights"], params=model.classifier,
                                    **kwargs)


def dense_loss_fn(model: SiameseEncoder, batch: Mapping[str, jax.Array],
                  dropout_key: jax.Array | None, *, loss: str, options: Mapping[str, Any],
                  head_weight: float = 0.0) -> jax.Array | dict[str, jax.Array]:
  """The dense Stage 2 loss of one label batch, plus `head_weight` x the intent head's
  cross-entropy when the model has one ({"loss", "contrast", "head"} then).

  Args:
    batch: input_ids, attention_mask, position_ids [R, W] int32 (the batch's distinct
      sentences, packed); slots [B, 2] int32 (each place's row and sentence number);
      labels [B] int32; weights [B] float32.
    loss: a key of `losses.DENSE_LOSSES`; options: its keyword options.
  """
  emb = model.encoder(batch["input_ids"], batch["attention_mask"], dropout_key=dropout_key,
                      position_ids=batch["position_ids"], slots=batch["slots"])
  contrast = losses.DENSE_LOSSES[loss](emb, batch["labels"], batch["weights"],
                                       params=model.classifier, **options)
  if model.intent_head is None:
    return contrast
  head = losses.cross_entropy(model.intent_head(emb), batch["labels"], batch["weights"])
  return {"loss": contrast + head_weight * head, "contrast": contrast, "head": head}


def loss_and_grads(state: TrainState, batch: Mapping[str, jax.Array], *,
                   train_config: ml_collections.ConfigDict):
  """`trainer.Task.loss_and_grads` of the Stage 2 loss `train_config` names (dropout on,
  keyed by the step)."""
  t = train_config
  if t.sampler == "labels":
    options = dense_options(t)
    fn = lambda model, b, key: dense_loss_fn(model, b, key, loss=t.loss, options=options,
                                             head_weight=t.head_weight)
  else:
    fn = lambda model, b, key: loss_fn(model, b, key, loss=t.loss, margin=t.margin)
  return trainer.value_and_grad(fn, state, batch)


def sentences_per_step(train_config: ml_collections.ConfigDict, anchors: bool | None = None
                       ) -> int:
  """Sentences a step encodes at most: 2B for B pairs; for a label batch P*K, plus P
  intent texts with anchors (`anchors`, default `label_anchors`), times `views`."""
  t = train_config
  if t.sampler != "labels":
    return 2 * t.batch_size
  anchors = t.label_anchors if anchors is None else anchors
  return label_batches.batch_places(t.labels_per_batch, t.examples_per_label, views=t.views,
                                    anchors=anchors)


def memory_estimate(num_params: int, config: ml_collections.ConfigDict, model_config) -> dict[str, float]:
  """Rough training memory in MiB: float32 parameters, gradients and two AdamW moments,
  plus activations of the step's sentences kept for the backward pass."""
  rows, length = sentences_per_step(config.train), config.model.max_length
  h, layers, heads = model_config.hidden_size, model_config.num_hidden_layers, model_config.num_attention_heads
  # Per layer and token: ~16 hidden-size vectors (q, k, v, attention output, 2 LayerNorms,
  # residuals, and the 4x-wide FFN counted as 8) plus the attention maps of every head.
  act = layers * rows * length * (16 * h + 2 * heads * length) * 4
  if config.model.remat:
    act = rows * length * h * 4 * (layers + 16) + rows * heads * length * length * 8
  state_bytes = num_params * 4 * 4
  return {"params_mib": num_params * 4 / 2**20, "optimizer_and_grads_mib": num_params * 12 / 2**20,
          "activations_mib": act / 2**20, "total_mib": (state_bytes + act) / 2**20}


def check_train_config(t: ml_collections.ConfigDict) -> None:
  """A clear error for a sampler / loss / batch combination that cannot run."""
  if t.sampler not in SAMPLERS:
    raise ValueError(f"train.sampler={t.sampler!r}: choose one of {SAMPLERS}")
  known = losses.DENSE_LOSSES if t.sampler == "labels" else losses.STAGE2_LOSSES
  if t.loss not in known:
    raise ValueError(f"train.loss={t.loss!r} with train.sampler={t.sampler}: choose one of "
                     f"{sorted(known)}" + (" (supcon needs train.sampler=labels)"
                                           if t.loss == "supcon" else ""))
  if t.sampler == "labels" and (t.examples_per_label < 2 or t.labels_per_batch < 1):
    raise ValueError(f"train.examples_per_label={t.examples_per_label} must be >= 2 (a group "
                     f"needs a positive) and train.labels_per_batch={t.labels_per_batch} >= 1")
  if t.views < 1:
    raise ValueError(f"train.views={t.views}: need at least 1 (1 = each sentence once)")
  if t.sampler == "pairs" and (t.views > 1 or t.label_anchors or t.head_weight):
    raise ValueError("train.views, train.label_anchors and train.head_weight act on label "
                     "batches: they need train.sampler=labels")
  if t.head_weight < 0:
    raise ValueError(f"train.head_weight={t.head_weight}: need >= 0 (0 = no intent head)")


class IntentScorer(NamedTuple):
  """The trained intent head, to score unit encodings: `heads.head_logits(unit, kernel,
  bias, scale)` [n, c] over `label_names` (the training set's)."""
  kernel: np.ndarray
  bias: np.ndarray
  scale: float
  label_names: tuple

  def logits(self, unit: np.ndarray) -> np.ndarray:
    return heads.head_logits(np.asarray(unit, np.float32), self.kernel, self.bias, self.scale)


class Stage2:
  """The Stage 2 `trainer.Task`: `config.data`'s intents (or `data`, in memory: what
  `IntentClassifier.fit` passes), batches by `config.train.sampler`, loss `config.train.loss`."""

  def __init__(self, config: ml_collections.ConfigDict, mesh, data: intent.IntentData | None = None):
    t = config.train
    check_train_config(t)
    self.config, self.mesh = config, mesh
    self.dense = t.sampler == "labels"
    self.title = f"Stage 2 ({objective(t)})"
    data = intent.from_config(config.data) if data is None else data
    self.data = data
    self.labels = data.train.labels
    self.built = models.get(config.model.name).build(
        config.model, seed=config.seed, classifier=t.loss == "smax",
        train_texts=lambda: data.train.texts,
        intent_labels=data.num_labels if t.head_weight > 0 else 0, head_scale=t.scale)
    self.module = models.get(config.model.encoder)
    d = config.data
    num_params = count_params(nnx.state(self.built.model, nnx.Param))
    self.counts = {"num_train": len(data.train), "num_pool": len(data.pool),
                   "num_labels": data.num_labels, "num_params": num_params}
    encoder = self.built.model.encoder
    if isinstance(encoder, SentenceEncoder):
      self.counts["memory_estimate"] = memory_estimate(num_params, config, encoder.config)
    texts = data.train.texts
    self.anchors = bool(self.dense and t.label_anchors)
    if self.anchors:
      names = data.label_texts
      if names is None:
        logging.warning("train.label_anchors: %s's intent names hold no words (%s, ...); "
                        "training without them", data.name, ", ".join(map(str, data.label_names[:3])))
        self.anchors = False
      else:
        texts = texts + names
    if self.dense:
      p, k = t.labels_per_batch, t.examples_per_label
      per_epoch = label_batches.layout(self.labels, p, k).steps_per_epoch
      # Anchors dropped for want of names encode no intent texts.
      self.examples_per_step = sentences_per_step(t, anchors=self.anchors)
      self.examples_name = "sentences"
      layout = label_batches.summary(self.labels, p, k, views=t.views, anchors=self.anchors)
      self.counts["sentences_per_step"] = self.examples_per_step
      # Every data-parallel device takes an equal share; the extra places are padding.
      self.places = label_batches.batch_places(p, k, mesh.shape[sharding.DATA], views=t.views,
                                               anchors=self.anchors)
    else:
      self.pairs = pairs_lib.build_pairs(self.labels, d.negatives, seed=d.seed,
                                         max_pairs_per_label=d.max_pairs_per_label or None)
      per_epoch = batching.steps_per_epoch(len(self.pairs), t.batch_size)
      self.examples_per_step, self.examples_name = t.batch_size, "pairs"
      layout = self.pairs.summary(config.model.max_length)
      self.counts.update(pairs_positive=self.pairs.num_positive,
                         pairs_negative=self.pairs.num_negative)
    self.total_steps = trainer.total_steps(per_epoch, t)
    self.counts["total_steps"] = self.total_steps
    logging.info("%s: %d training examples, %d intents; %s; %s", data.name, len(data.train),
                 data.num_labels, layout, trainer.schedule_summary(per_epoch, t))
    self.table = batching.SentenceTable.from_texts(self.built.tokenizer, texts,
                                                   config.model.max_length, self.built.packs)

  @functools.cached_property
  def rows(self) -> int:
    """Packed rows per process that every batch of the run fits in (packs every batch once)."""
    t, seed = self.config.train, self.config.data.seed
    common = dict(seed=seed, num_steps=self.total_steps, process_count=jax.process_count(),
                  multiple=max(self.mesh.shape[sharding.DATA] // jax.process_count(), 1))
    if self.dense:
      rows = label_batches.label_batch_rows(self.table, self.labels, labels_per_batch=t.labels_per_batch,
                                            examples_per_label=t.examples_per_label,
                                            places=self.places, views=t.views,
                                            anchors=self.anchors, **common)
    else:
      rows = batching.pair_batch_rows(self.table, self.pairs, batch_size=t.batch_size, **common)
    logging.info("stage2: %d sentences of a batch packed into %d rows of %d per process",
                 sentences_per_step(t, self.anchors) // jax.process_count(), rows, self.table.width)
    return rows

  def batches(self, start_step: int) -> Iterator[batching.PairBatch | label_batches.LabelBatch]:
    t, seed, steps = self.config.train, self.config.data.seed, self.total_steps - start_step
    if self.dense:
      batches = label_batches.label_batches(
          self.table, self.labels, labels_per_batch=t.labels_per_batch,
          examples_per_label=t.examples_per_label, rows=self.rows, seed=seed,
          start_step=start_step, num_steps=steps, places=self.places, views=t.views,
          anchors=self.anchors)
    else:
      batches = batching.pair_batches(self.table, self.pairs, loss=t.loss, rows=self.rows,
                                      batch_size=t.batch_size, seed=seed, start_step=start_step,
                                      num_steps=steps)
    return batching.prefetch(batches)

  def device_batch(self, host_batch) -> dict[str, jax.Array]:
    keys = BATCH_KEYS[self.config.train.sampler]
    return sharding.global_batch({k: getattr(host_batch, k) for k in keys}, self.mesh)

  def batch_rows(self, host_batch) -> np.ndarray:
    return host_batch.sentence_ids

  def loss_and_grads(self, state: TrainState, batch: Mapping[str, jax.Array]):
    return loss_and_grads(state, batch, train_config=self.config.train)

  def encoder(self, model: SiameseEncoder):
    """The trained encoder as a text encoder (`Encoder` for a Transformer), which also exports it."""
    return trainer.text_encoder(self.module, self.built, model.encoder, self.config.model)

  def predictors(self, model: SiameseEncoder) -> dict[str, Any]:
    """text: the encoder; intent_head (with `train.head_weight`): an `IntentScorer`."""
    out = {"text": self.encoder(model)}
    if model.intent_head is not None:
      h = model.intent_head
      out["intent_head"] = IntentScorer(np.asarray(h.kernel[...]), np.asarray(h.bias[...]),
                                        h.scale, self.data.label_names)
    return out

  def export(self, model: SiameseEncoder, folder: Path) -> None:
    """The encoder into `folder` (model/), and beside it classifier/: that encoder with the
    run's k-NN pool, its temperature fitted by leave-one-out (Transformer encoders)."""
    encoder = self.encoder(model)
    encoder.save_pretrained(folder)
    if not isinstance(encoder, Encoder):
      return
    pool, knn_block = self.data.pool, self.config.evals.get("knn", {})
    embeddings = encoder.encode(pool.texts, normalize=True)
    settings = saved_classifier.Settings(
        labels=list(self.data.label_names), k=knn_block.get("k", 1),
        vote=knn_block.get("vote", "majority"),
        temperature=calibration.leave_one_out_temperature(embeddings, pool.labels,
                                                          self.data.num_labels),
        dtype=self.config.model.dtype, max_length=self.config.model.max_length)
    saved_classifier.write(folder.parent / "classifier", encoder_dir=folder, settings=settings,
                           pool_texts=pool.texts, pool_label_ids=pool.labels,
                           embeddings=embeddings, version=__version__)

  def summary(self, metrics: Mapping[str, Any]) -> str | None:
    if "knn_accuracy" not in metrics:
      return None
    return (f"k-NN accuracy on {metrics['num_test']} test examples: "
            f"before {metrics.get('knn_accuracy_before', float('nan')):.4f}, "
            f"after {metrics['knn_accuracy']:.4f}")


def train_and_evaluate(config: ml_collections.ConfigDict, data: intent.IntentData | None = None
                       ) -> dict[str, Any]:
  """Runs Stage 2 as `config` says (on `data` instead of `config.data`'s set when given);
  returns the metrics (also in workdir/metrics.json).

  metrics.json: knn_accuracy, knn_accuracy_before, macro_f1, silhouette (and _before),
  mlp_accuracy (evals.knn.mlp), num_train, num_test, pairs_positive and pairs_negative
  (sampler pairs) or sentences_per_step (sampler labels), train_seconds, steps, estimated
  memory; dry_run stops after the counts.
  """
  return trainer.train_and_evaluate(
      config, Stage2 if data is None else functools.partial(Stage2, data=data))
