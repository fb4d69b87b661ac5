"""ConvFiT Stage 2: task-tailored contrastive fine-tuning on intent pairs.

Model: `models.siamese` (the sentence encoder: Transformer, masked mean pooling,
Dense(d_o) + tanh; plus the pair classifier for the `smax` loss). Data: the paper's
pairs (every same-intent pair, 2n different-intent negatives per positive) as index
arrays into one table of tokenised training sentences. Each step encodes the batch's
distinct sentences once, packed several to a row (`data.packing`: banking77's
utterances fill a third of a padded batch), and scores the B pairs from those
embeddings, so a sentence that appears in several pairs of a batch costs one forward
pass and padding costs nothing.

The run itself (k-NN before, training with checkpoints, k-NN after, the model
exported as an HF/sentence-transformers folder) is `train.trainer`'s.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from convfit_jax import losses, models, sharding
from convfit_jax.data import batching, intent, pairs as pairs_lib
from convfit_jax.encoder import Encoder
from convfit_jax.models.siamese import SiameseEncoder
from convfit_jax.train import trainer
from convfit_jax.train.train_state import TrainState, count_params

BATCH_KEYS = ("input_ids", "attention_mask", "position_ids", "slots", "u_idx", "v_idx", "targets",
              "weights")


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


def loss_and_grads(state: TrainState, batch: Mapping[str, jax.Array], *, loss: str, margin: float):
  """`trainer.Task.loss_and_grads` of the Stage 2 loss (dropout on, keyed by the step)."""
  return trainer.value_and_grad(
      lambda model, b, key: loss_fn(model, b, key, loss=loss, margin=margin), state, batch)


def memory_estimate(num_params: int, config: ml_collections.ConfigDict, model_config) -> dict[str, float]:
  """Rough training memory in MiB: float32 parameters, gradients and two AdamW moments,
  plus activations of the [2B, L] sentence batch kept for the backward pass."""
  rows, length = 2 * config.train.batch_size, config.model.max_length
  h, layers, heads = model_config.hidden_size, model_config.num_hidden_layers, model_config.num_attention_heads
  # Per layer and token: ~16 hidden-size vectors (q, k, v, attention output, 2 LayerNorms,
  # residuals, and the 4x-wide FFN counted as 8) plus the attention maps of every head.
  act = layers * rows * length * (16 * h + 2 * heads * length) * 4
  if config.model.remat:
    act = rows * length * h * 4 * (layers + 16) + rows * heads * length * length * 8
  state_bytes = num_params * 4 * 4
  return {"params_mib": num_params * 4 / 2**20, "optimizer_and_grads_mib": num_params * 12 / 2**20,
          "activations_mib": act / 2**20, "total_mib": (state_bytes + act) / 2**20}


class Stage2:
  """The Stage 2 `trainer.Task`: intent pairs of `config.data`, loss `config.train.loss`."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    t = config.train
    if t.loss not in losses.STAGE2_LOSSES:
      raise ValueError(f"train.loss={t.loss!r}: choose one of {sorted(losses.STAGE2_LOSSES)}")
    self.config, self.mesh = config, mesh
    self.title = f"Stage 2 ({t.loss})"
    data = intent.from_config(config.data)
    self.built = models.get(config.model.name).build(config.model, seed=config.seed,
                                                     classifier=t.loss == "smax")
    d = config.data
    self.pairs = pairs_lib.build_pairs(data.train.labels, d.negatives, seed=d.seed,
                                       max_pairs_per_label=d.max_pairs_per_label or None)
    self.total_steps = trainer.total_steps(len(self.pairs), t)
    self.pairs_per_step = t.batch_size
    num_params = count_params(nnx.state(self.built.model, nnx.Param))
    estimate = memory_estimate(num_params, config, self.built.model.encoder.config)
    self.counts = {"num_train": len(data.train), "num_pool": len(data.pool),
                   "num_labels": data.num_labels, "pairs_positive": self.pairs.num_positive,
                   "pairs_negative": self.pairs.num_negative, "total_steps": self.total_steps,
                   "num_params": num_params, "memory_estimate": estimate}
    logging.info("%s: %d training examples, %d intents; %s; %d steps; estimated memory %.0f MiB",
                 data.name, len(data.train), data.num_labels,
                 self.pairs.summary(config.model.max_length), self.total_steps, estimate["total_mib"])
    self.table = batching.SentenceTable.from_texts(self.built.tokenizer, data.train.texts,
                                                   config.model.max_length)

  @functools.cached_property
  def rows(self) -> int:
    """Packed rows per process that every batch of the run fits in (packs every batch once)."""
    rows = batching.pair_batch_rows(
        self.table, self.pairs, batch_size=self.config.train.batch_size,
        seed=self.config.data.seed, num_steps=self.total_steps, process_count=jax.process_count(),
        multiple=max(self.mesh.shape[sharding.DATA] // jax.process_count(), 1))
    logging.info("stage2: %d sentences of a batch packed into %d rows of %d per process",
                 2 * self.config.train.batch_size // jax.process_count(), rows, self.table.width)
    return rows

  def batches(self, start_step: int) -> Iterator[batching.PairBatch]:
    return batching.prefetch(batching.pair_batches(
        self.table, self.pairs, loss=self.config.train.loss, rows=self.rows,
        batch_size=self.config.train.batch_size, seed=self.config.data.seed,
        start_step=start_step, num_steps=self.total_steps - start_step))

  def device_batch(self, host_batch: batching.PairBatch) -> dict[str, jax.Array]:
    return sharding.global_batch({k: getattr(host_batch, k) for k in BATCH_KEYS}, self.mesh)

  def batch_rows(self, host_batch: batching.PairBatch) -> np.ndarray:
    return host_batch.sentence_ids

  def loss_and_grads(self, state: TrainState, batch: Mapping[str, jax.Array]):
    return loss_and_grads(state, batch, loss=self.config.train.loss, margin=self.config.train.margin)

  def encoder(self, model: SiameseEncoder) -> Encoder:
    return Encoder(model.encoder, self.built.tokenizer, max_length=self.config.model.max_length,
                   normalize=self.built.normalize, hf_config=self.built.hf_config)

  def predictors(self, model: SiameseEncoder) -> dict[str, Any]:
    return {"text": self.encoder(model)}

  def export(self, model: SiameseEncoder, folder: Path) -> None:
    self.encoder(model).save_pretrained(folder)

  def summary(self, metrics: Mapping[str, Any]) -> str | None:
    if "knn_accuracy" not in metrics:
      return None
    return (f"k-NN accuracy on {metrics['num_test']} test examples: "
            f"before {metrics.get('knn_accuracy_before', float('nan')):.4f}, "
            f"after {metrics['knn_accuracy']:.4f}")


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Runs Stage 2 as `config` says; returns the metrics (also in workdir/metrics.json).

  metrics.json: knn_accuracy, knn_accuracy_before, macro_f1, silhouette (and _before),
  mlp_accuracy (evals.knn.mlp), num_train, num_test, pairs_positive, pairs_negative,
  train_seconds, steps, estimated memory; dry_run stops after the counts.
  """
  return trainer.train_and_evaluate(config, Stage2)
