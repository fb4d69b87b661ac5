"""ConvFiT Stage 1: a dual encoder trained by multiple-negatives ranking on conversations.

Model: `models.dual_encoder` (one encoder for contexts and responses, with an optional
response tower or response-side feed-forward layer): a pretrained Transformer
(`config.model.encoder = "sentence"`), or any encoder module of `models` (the recursive
convolutional `conv_encoder`, whose BatchNorm statistics the step carries and returns).

Loss: `losses.mneg_loss` over the GLOBAL batch. The step is one `jax.jit` whose
batch arrays are sharded over the mesh `data` axis; the [B, B] similarity matrix
is written on the global arrays and XLA gathers the response columns (as
big_vision's SigLIP/CLIP losses), so every context is scored against the
responses of every device and every host, in global row order. Identical
responses in a batch (equal token digests from the host) are dropped from each
other's softmax (they are false negatives). With `train.grad_cache` the gradient
is computed chunk by chunk (`train/grad_cache.py`): batch 256 in one chunk's memory
(BatchNorm then normalises each chunk by its own statistics, as gradient accumulation would).

Packing: each device's sentences of each chunk are packed several to a row
(`data.packing`; SGD turns fill a third of a padded batch), contexts and responses
separately; one to a row for models that declare they do not pack (`Built.packs`). The
packed row count is chosen per batch (the largest any process needs, rounded up to
`ROW_MULTIPLE`), so a run compiles a few shapes.

The run (response selection before, during and after; the context encoder exported
for Stage 2) is `train.trainer`'s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax import losses, models, sharding
from convfit_jax.data import batching
from convfit_jax.data.conversations import read_conversations, shuffle_buffer
from convfit_jax.evaluators import response_selection
from convfit_jax.models.dual_encoder import DualEncoder
from convfit_jax.train import grad_cache, train_state, trainer
from convfit_jax.train.train_state import TrainState

SIDE_KEYS = tuple(f"{side}_{k}" for side in batching.SIDES for k in ("ids", "mask", "positions", "slots"))
# Packed rows are rounded up to a multiple of this: fewer distinct shapes to compile.
ROW_MULTIPLE = 2


@dataclasses.dataclass(frozen=True)
class LossConfig:
  """Static settings of the Stage 1 loss and of how it is computed.

  Attributes:
    scale: D in S = D cos(c, r).
    symmetric: add the responses-rank-contexts term.
    mask_duplicates: drop identical responses from each other's softmax.
    dropout: train with dropout (as sentence-transformers does).
    chunk_size: rows per gradient-cache chunk; None or >= batch means one chunk.
    grad_cache: two-pass gradient caching (else plain backprop through all chunks).
    data_shards: size of the mesh `data` axis; chunks take rows from every shard, so
      each chunk runs on every device.
  """
  scale: float = 20.0
  symmetric: bool = False
  mask_duplicates: bool = True
  dropout: bool = True
  chunk_size: int | None = None
  grad_cache: bool = False
  data_shards: int = 1

  @classmethod
  def from_config(cls, config: ml_collections.ConfigDict, data_shards: int) -> "LossConfig":
    t = config.train
    return cls(scale=config.loss.scale, symmetric=config.loss.symmetric,
               mask_duplicates=config.loss.mask_duplicates, dropout=config.model.dropout,
               chunk_size=t.chunk_size or None, grad_cache=t.grad_cache, data_shards=data_shards)

  def num_chunks(self, batch_size: int) -> int:
    return grad_cache.num_chunks(batch_size, self.chunk_size, self.data_shards)


def _embed_chunk(graphdef, params, model_state, chunk: Mapping[str, jax.Array],
                 key: jax.Array | None):
  """((contexts, responses) [rows, d], the model state after them) of one chunk, in train
  mode; `key` splits into one per side."""
  model = train_state.merge(graphdef, params, model_state)
  model.train()
  kc, kr = (None, None) if key is None else jax.random.split(key, 2)
  side = lambda name: dict(input_ids=chunk[f"{name}_ids"], attention_mask=chunk[f"{name}_mask"],
                           position_ids=chunk[f"{name}_positions"], slots=chunk[f"{name}_slots"])
  embeddings = (model.encode_contexts(**side("context"), dropout_key=kc),
                model.encode_responses(**side("response"), dropout_key=kr))
  return embeddings, train_state.model_state_of(model)


def loss_and_grads(graphdef, params, model_state, batch: Mapping[str, jax.Array],
                   key: jax.Array | None, cfg: LossConfig) -> tuple[jax.Array, Any, Any]:
  """The Stage 1 loss of a global batch, its gradient with respect to `params`, and the
  model state the forward passes leave (BatchNorm statistics; {} for Transformers).

  Args:
    graphdef: the `DualEncoder`'s NNX graph definition (`nnx.split(model, nnx.Param, ...)`).
    params, model_state: its parameters and its other state (pure dicts).
    batch: global arrays (`batching.pack_conversation_batch` for every process's slice,
      packed for `cfg.data_shards` shards and the chunks of `cfg.chunk_size`): `SIDE_KEYS`,
      per side ids, mask, positions [S*n*R, L] int32 and slots [B, 2] int32;
      response_hash [B, 2] int32; weights [B] float32.
    key: the step's dropout key (ignored unless `cfg.dropout`).
    cfg: loss settings.
  Returns:
    (scalar float32 loss, grads shaped like `params`, model state).
  """
  ids = losses.duplicate_ids(batch["response_hash"]) if cfg.mask_duplicates else None

  def loss_of(embeddings):
    return losses.mneg_loss(*embeddings, scale=cfg.scale, symmetric=cfg.symmetric,
                     weights=batch["weights"], response_ids=ids)

  # Packed rows and slots are both laid out (shard, chunk, ...): the same re-layout
  # gives chunk k its rows and its sentences' slots into them.
  return grad_cache.loss_and_grads(
      lambda p, s, chunk, k: _embed_chunk(graphdef, p, s, chunk, k), loss_of, params, model_state,
      {k: batch[k] for k in SIDE_KEYS}, key if cfg.dropout else None,
      chunks=cfg.num_chunks(batch["weights"].shape[0]), shards=cfg.data_shards, cache=cfg.grad_cache)


def state_loss_and_grads(state: TrainState, batch: Mapping[str, jax.Array], cfg: LossConfig):
  """`trainer.Task.loss_and_grads` of `loss_and_grads` (dropout keyed by the step)."""
  return loss_and_grads(state.graphdef, state.params, state.model_state, batch, state.step_key(), cfg)


def device_batch(host_batch: batching.ConversationBatch, mesh, cfg: LossConfig, packs: bool = True
                 ) -> dict[str, jax.Array]:
  """This process's `ConversationBatch`, packed (one sentence per row where the model does
  not pack: `Built.packs`), as the global arrays `loss_and_grads` takes.

  The row count is the largest any (process, shard, chunk, side) needs, so every
  process packs to the same shape.
  """
  shards = cfg.data_shards // jax.process_count()
  chunks = cfg.num_chunks(len(host_batch.weights) * jax.process_count())
  needed = batching.conversation_rows(host_batch, chunks=chunks, shards=shards,
                                      width=host_batch.context_ids.shape[1], packs=packs)
  rows = -(-sharding.process_max(needed) // ROW_MULTIPLE) * ROW_MULTIPLE
  local = batching.pack_conversation_batch(host_batch, chunks=chunks, shards=shards, rows=rows,
                                           first_shard=jax.process_index() * shards, packs=packs)
  return sharding.global_batch(local, mesh)


class Stage1:
  """The Stage 1 `trainer.Task`: (context, response) pairs of `config.data.train`."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    self.title = "Stage 1"
    self.cfg = LossConfig.from_config(config, mesh.shape[sharding.DATA])
    self.module = models.get(config.model.encoder)
    d = config.data
    self.path = Path(d.train).expanduser()
    if not self.path.is_file():
      raise FileNotFoundError(f"data.train: {self.path.absolute()} does not exist "
                              "(relative paths are read from the current directory)")
    num_pairs = sum(1 for _ in self._conversations())
    self.built = models.get(config.model.name).build(
        config.model, seed=config.seed,
        train_texts=lambda: [t for c in self._conversations() for t in (c.context, c.response)])
    self.total_steps = trainer.total_steps(
        batching.steps_per_epoch(num_pairs, config.train.batch_size), config.train)
    self.examples_per_step, self.examples_name = config.train.batch_size, "pairs"
    self.counts = {"num_pairs": num_pairs, "total_steps": self.total_steps}

  def _conversations(self):
    d = self.config.data
    return read_conversations(self.path, fmt=d.format or None, fraction=d.fraction,
                              seed=self.config.seed)

  def batches(self, start_step: int) -> Iterator[batching.ConversationBatch]:
    """One fixed subset (`data.fraction`, seeded) for the whole run; each epoch streams it
    through a shuffle buffer seeded by (seed, epoch), so a resumed run sees the batches
    an uninterrupted one would."""
    d = self.config.data

    def open_epoch(epoch: int):
      seed = int(np.random.SeedSequence([self.config.seed, epoch]).generate_state(1)[0])
      return shuffle_buffer(self._conversations(), d.shuffle_buffer, seed)

    return batching.prefetch(batching.conversation_batches(
        open_epoch, self.built.tokenizer, batch_size=self.config.train.batch_size,
        max_length=self.config.model.max_length, num_epochs=self.config.train.epochs,
        start_step=start_step), size=d.prefetch)

  def device_batch(self, host_batch: batching.ConversationBatch) -> dict[str, jax.Array]:
    return device_batch(host_batch, self.mesh, self.cfg, self.built.packs)

  def batch_rows(self, host_batch: batching.ConversationBatch) -> None:
    return None  # streamed pairs have no stable row numbers

  def loss_and_grads(self, state: TrainState, batch: Mapping[str, jax.Array]):
    return state_loss_and_grads(state, batch, self.cfg)

  def text_encoder(self, tower: nnx.Module):
    """A tower as its encoder's text encoder (`Encoder` for a Transformer)."""
    return trainer.text_encoder(self.module, self.built, tower, self.config.model)

  def predictors(self, model: DualEncoder) -> dict[str, Any]:
    contexts, scorer = trainer.dual_encoder_predictors(model, self.text_encoder)
    return {"text": contexts, "response_scorer": scorer}

  def export(self, model: DualEncoder, folder: Path) -> None:
    self.text_encoder(model.context).save_pretrained(folder)

  def summary(self, metrics: Mapping[str, Any]) -> str | None:
    return response_selection.summary_line(metrics)


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Runs Stage 1 as `config` says; returns the final metrics (also in metrics.json).

  Writes under `config.workdir`: config.json, metrics.json (r_at_1, r_at_10, r_at_50,
  mrr after training, the same with `_before` before it, train figures), tensorboard/,
  checkpoints/, and model/ (the context encoder as an HF + sentence-transformers
  folder that Stage 2 can `init_from`).
  """
  return trainer.train_and_evaluate(config, Stage1)
