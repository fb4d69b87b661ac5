"""Task `byte_autoencoder`: the byte-level recursive convolutional auto-encoder of seed 003.

Model: `models.byte_autoencoder` (`config.model`: d, layers, length = 2^K, latent
positions 2^r, balanced or right padding, shared or static recursion). Loss: the
mean cross-entropy of the 258-way softmax at every one of the 2^K positions (bytes,
end-of-sequence, padding), the paper's objective; the batch's byte error (bytes and
end-of-sequence only) is logged beside it (`train/byte_error`).

Data: the sentences of `data.train` whose bytes and end-of-sequence fit 2^K positions
(the rest are counted and left out: the model has no position for them), an optional
seeded sample of `data.max_sentences`; each epoch a PCG64(seed, epoch) permutation cut
into full batches, indexed by the step, so a resumed run sees the same batches. Each
process encodes its contiguous share of a batch; BatchNorm's batch statistics are of
the global batch (the step runs under `jax.jit` on the sharded batch).

Evaluation (`evaluators/byte_error.py`): byte error on `data.test` by length bucket.
Export: `model/` with `byte_autoencoder.json` and `weights/`, an orbax checkpoint (`byte_autoencoder.load`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import ml_collections
import numpy as np
import optax
from flax import nnx

from convfit_jax import models, sharding
from convfit_jax.data import batching
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.data.text import read_sentences
from convfit_jax.models import byte_autoencoder
from convfit_jax.models.byte_autoencoder import ByteAutoencoder
from convfit_jax.train import trainer
from convfit_jax.train.train_state import TrainState, count_params


def loss_fn(model: ByteAutoencoder, batch: Mapping[str, jax.Array], dropout_key=None
            ) -> dict[str, jax.Array]:
  """{"loss": mean cross-entropy over all positions, "byte_error": the batch's share of
  wrong bytes and end-of-sequence tokens} of `batch` (ids [n, L] int32, lengths [n] int32)."""
  del dropout_key
  logits, placed = model(batch["ids"], batch["lengths"])
  loss = optax.softmax_cross_entropy_with_integer_labels(logits, placed).mean()
  errors, scored = byte_autoencoder.token_errors(logits, placed)
  return {"loss": loss, "byte_error": errors.sum() / scored.sum()}


class ByteAutoencoderTask:
  """The auto-encoder `trainer.Task` (module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    d, t, m = config.data, config.train, config.model
    texts = read_sentences(Path(d.train).expanduser())
    fitting = [s for s in texts if byte_autoencoder.fits(s, m.length)]
    self.sentences = [fitting[i] for i in subsample_indices(len(fitting), d.max_sentences, config.seed)]
    batching.check_divisible(t.batch_size, mesh.shape[sharding.DATA])
    self.per_epoch = len(self.sentences) // t.batch_size
    if self.per_epoch == 0:
      raise ValueError(f"data.train: {len(self.sentences)} sentences fit {m.length} bytes, "
                       f"fewer than train.batch_size={t.batch_size}")
    self.built = models.get(m.name).build(m, seed=config.seed)
    self.title = (f"byte auto-encoder ({m.padding} padding, "
                  f"{'shared' if m.shared else 'static'} recursion)")
    self.total_steps = trainer.total_steps(self.per_epoch, t)
    self.examples_per_step, self.examples_name = t.batch_size, "sentences"
    self.counts = {"num_train": len(self.sentences), "num_train_too_long": len(texts) - len(fitting),
                   "num_params": count_params(nnx.state(self.built.model, nnx.Param)),
                   "latent_dim": self.built.model.latent_dim, "steps_per_epoch": self.per_epoch,
                   "total_steps": self.total_steps}

  def step_rows(self, step: int) -> np.ndarray:
    """The global batch of `step`: [batch_size] rows of the training sentences."""
    size = self.config.train.batch_size
    order = batching.epoch_order(len(self.sentences), self.config.seed, step // self.per_epoch)
    first = (step % self.per_epoch) * size
    return order[first:first + size]

  def batches(self, start_step: int) -> Iterator[np.ndarray]:
    def steps():
      for step in range(start_step, self.total_steps):
        rows = self.step_rows(step)
        yield rows[batching.own_slice(len(rows), jax.process_index(), jax.process_count())]
    return batching.prefetch(steps(), size=self.config.data.prefetch)

  def device_batch(self, host_batch: np.ndarray) -> dict[str, jax.Array]:
    ids, lengths = byte_autoencoder.byte_rows([self.sentences[i] for i in host_batch],
                                              self.config.model.length)
    return sharding.global_batch({"ids": ids, "lengths": lengths}, self.mesh)

  def batch_rows(self, host_batch: np.ndarray) -> np.ndarray:
    return host_batch

  def loss_and_grads(self, state: TrainState, batch: Mapping[str, jax.Array]):
    return trainer.value_and_grad(loss_fn, state, batch)

  def predictors(self, model: ByteAutoencoder) -> dict[str, Any]:
    return {"autoencoder": byte_autoencoder.Reconstructor(model)}

  def export(self, model: ByteAutoencoder, folder: Path) -> None:
    byte_autoencoder.save(model, folder)

  def summary(self, metrics: Mapping[str, Any]) -> str | None:
    if "byte_error" not in metrics:
      return None
    return (f"byte error on {metrics['num_test']} test sentences: {100 * metrics['byte_error']:.2f}% "
            f"(sentences not reproduced exactly: {100 * metrics['sentence_error']:.1f}%)")


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Trains the auto-encoder as `config` says; returns the final metrics (also in
  workdir/metrics.json). Writes config.json, log.txt, metrics.json, tensorboard/,
  checkpoints/, byte_error_by_length*.png and model/."""
  return trainer.train_and_evaluate(config, ByteAutoencoderTask)
