"""ConvFiT Stage 1: a dual encoder trained by multiple-negatives ranking on conversations.

Model: one `SentenceEncoder` (masked mean pooling, optional projection) encodes
contexts and responses with shared weights; optionally the response side gets its
own tower (a copy of the encoder) or a residual feed-forward layer on top of the
shared encoder (the input-response models of Yang et al. 2018).

Loss: `losses.mneg_loss` over the GLOBAL batch. The step is one `jax.jit` whose
batch arrays are sharded over the mesh `data` axis; the [B, B] similarity matrix
is written on the global arrays and XLA gathers the response columns (as
big_vision's SigLIP/CLIP losses), so every context is scored against the
responses of every device and every host, in global row order. Identical
responses in a batch (equal token digests from the host) are dropped from each
other's softmax (they are false negatives).

Packing: each device's sentences of each gradient-cache chunk are packed several
to a row (`data.packing`; SGD turns fill a third of a padded batch), contexts and
responses separately, so no compute goes to padding. The packed row count is
chosen per batch (the largest any process needs, rounded up to `ROW_MULTIPLE`), so
a run compiles a few shapes.

Gradient cache (Gao et al. 2021; sentence-transformers'
CachedMultipleNegativesRankingLoss): embed the batch chunk by chunk without
keeping activations, take the gradient of the loss with respect to the
embeddings, then re-run each chunk under `jax.vjp` with that cotangent and sum
the parameter gradients. Each chunk's second pass uses the dropout key of its
first pass, so both see the same masks and the gradients equal the uncached
ones. Per-layer remat (`model.remat`) composes with it: it shrinks the one
chunk whose activations are alive during the second pass.

Multi-host: `initialize_distributed` starts `jax.distributed` when the run is
multi-process; every process feeds its contiguous slice of the global batch
(`data.batching`), assembled with `jax.make_array_from_process_local_data`.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx
from jax.sharding import Mesh

from convfit_jax import checkpoints, sharding
from convfit_jax.data import batching
from convfit_jax.data.conversations import (ResponseSelectionSet, read_conversations,
                                            read_response_selection, shuffle_buffer)
from convfit_jax.encoder import Encoder
from convfit_jax.losses import mneg_loss
from convfit_jax.models.sentence import SentenceEncoder
from convfit_jax.tokenize import load_tokenizer
from convfit_jax.eval import metrics as metrics_lib
from convfit_jax.train import loop, state as state_lib

REPO_ROOT = Path(__file__).resolve().parents[2]
SIDE_KEYS = tuple(f"{side}_{k}" for side in batching.SIDES for k in ("ids", "mask", "positions", "slots"))
BATCH_KEYS = SIDE_KEYS + ("response_hash", "weights")
# Packed rows are rounded up to a multiple of this: fewer distinct shapes to compile.
ROW_MULTIPLE = 2


# --------------------------------------------------------------------------- model


class ResponseFeedForward(nnx.Module):
  """Response-side layer: x + W2 gelu(W1 x), [batch, d] -> [batch, d] float32.

  W2 starts at zero, so the layer starts as the identity and training starts from
  the pretrained encoder's own context-response similarity.
  """

  def __init__(self, dim: int, hidden: int, *, rngs: nnx.Rngs):
    self.up = nnx.Linear(dim, hidden, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
    self.down = nnx.Linear(hidden, dim, kernel_init=nnx.initializers.zeros, rngs=rngs)

  def __call__(self, x: jax.Array) -> jax.Array:
    return x + self.down(jax.nn.gelu(self.up(x), approximate=False))


class DualEncoder(nnx.Module):
  """Contexts and responses to vectors of the same width.

  Args:
    context: the shared encoder (also the response encoder unless `response` is set).
    response: a separate response tower.
    response_ff: a `ResponseFeedForward` applied to response vectors.
  """

  def __init__(self, context: SentenceEncoder, *, response: SentenceEncoder | None = None,
               response_ff: ResponseFeedForward | None = None):
    self.context = context
    self.response = response
    self.response_ff = response_ff

  def encode_contexts(self, ids: jax.Array, mask: jax.Array, dropout_key: jax.Array | None = None,
                      **packed) -> jax.Array:
    """[n, L] int32 ids and mask -> [n, d] float32; packed rows with `position_ids`
    and `slots` as `SentenceEncoder` takes them."""
    return self.context(ids, mask, dropout_key=dropout_key, **packed)

  def encode_responses(self, ids: jax.Array, mask: jax.Array, dropout_key: jax.Array | None = None,
                       **packed) -> jax.Array:
    """As `encode_contexts`, through the response tower and feed-forward layer."""
    tower = self.context if self.response is None else self.response
    return self.apply_response_ff(tower(ids, mask, dropout_key=dropout_key, **packed))

  def apply_response_ff(self, x: jax.Array) -> jax.Array:
    return x if self.response_ff is None else self.response_ff(x)


def build_model(config: ml_collections.ConfigDict):
  """The dual encoder, tokenizer and HF config dict named by `config.model`.

  `model.init_from`: a folder or hub id (pretrained, or a Stage 1 output), or "rand"
  for the architecture and tokenizer of `model.architecture` with Glorot-initialised
  weights (the paper's `rand` baseline).
  Returns:
    (DualEncoder, tokenizer, hf_config dict).
  """
  m = config.model
  context, ck = checkpoints.init_sentence_encoder(
      m.init_from, architecture=m.architecture, dtype=jnp.dtype(m.dtype), remat=m.remat,
      projection_dim=m.projection_dim or None, seed=config.seed)
  response = nnx.clone(context) if m.response_tower else None
  response_ff = (ResponseFeedForward(context.dim, m.response_ff_hidden or 4 * context.dim,
                                     rngs=nnx.Rngs(config.seed + 1)) if m.response_ff else None)
  model = DualEncoder(context, response=response, response_ff=response_ff)
  return model, load_tokenizer(ck.tokenizer_dir), ck.hf_config


# --------------------------------------------------------------------------- loss


def duplicate_ids(hashes: jax.Array) -> jax.Array:
  """Per row, the first row of the batch with the same tokens: [B, 2] int32 digests
  (`batching.token_hashes`) -> [B] int32.

  Rows that tokenise identically embed identically, so they are exactly the false
  negatives to mask; the 64-bit digests compare them at [B, B] memory.
  """
  same = jnp.all(hashes[:, None, :] == hashes[None, :, :], axis=-1)
  return jnp.argmax(same, axis=1).astype(jnp.int32)


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


def _num_chunks(batch_size: int, cfg: LossConfig) -> int:
  c = cfg.chunk_size if cfg.chunk_size and cfg.chunk_size < batch_size else batch_size
  if batch_size % c or c % cfg.data_shards:
    raise ValueError(f"chunk_size {c} must divide the batch {batch_size} and be a multiple of "
                     f"the {cfg.data_shards} data shards")
  return batch_size // c


def _to_chunks(x: jax.Array, n: int, shards: int) -> jax.Array:
  """[B, ...] -> [n, B/n, ...] where chunk k takes rows k*c/S.. of every shard's block.

  Rows stay on the device that holds them (a local re-layout), so every chunk is
  spread over all devices instead of chunk k living on a few of them.
  """
  b = x.shape[0]
  x = x.reshape((shards, n, b // (shards * n)) + x.shape[1:])
  return jnp.swapaxes(x, 0, 1).reshape((n, b // n) + x.shape[3:])


def _from_chunks(x: jax.Array, shards: int) -> jax.Array:
  """Inverse of `_to_chunks`: [n, B/n, ...] -> [B, ...] in the original row order."""
  n, c = x.shape[:2]
  x = x.reshape((n, shards, c // shards) + x.shape[2:])
  return jnp.swapaxes(x, 0, 1).reshape((n * c,) + x.shape[3:])


def _chunk_keys(key: jax.Array | None, n: int) -> jax.Array | None:
  """[n, 2, 2] uint32: per chunk, a context and a response dropout key."""
  if key is None:
    return None
  return jax.vmap(lambda k: jax.random.split(k, 2))(jax.random.split(key, n))


def _embed_chunk(graphdef, params, chunk: Mapping[str, jax.Array], keys: jax.Array | None):
  model = nnx.merge(graphdef, params)
  kc, kr = (None, None) if keys is None else (keys[0], keys[1])
  side = lambda name: dict(ids=chunk[f"{name}_ids"], mask=chunk[f"{name}_mask"],
                           position_ids=chunk[f"{name}_positions"], slots=chunk[f"{name}_slots"])
  return model.encode_contexts(**side("context"), dropout_key=kc), model.encode_responses(
      **side("response"), dropout_key=kr)


def loss_and_grads(graphdef, params, batch: Mapping[str, jax.Array], key: jax.Array | None,
                   cfg: LossConfig) -> tuple[jax.Array, Any]:
  """The Stage 1 loss of a global batch and its gradient with respect to `params`.

  Args:
    graphdef: the `DualEncoder`'s NNX graph definition.
    params: its parameters (pure dict).
    batch: global arrays, `BATCH_KEYS` (`batching.pack_conversation_batch` for every
      process's slice, packed for `cfg.data_shards` shards and the chunks of
      `cfg.chunk_size`): per side ids, mask, positions [S*n*R, L] int32 and slots
      [B, 2] int32; response_hash [B, 2] int32; weights [B] float32.
    key: the step's dropout key (ignored unless `cfg.dropout`).
    cfg: loss settings.
  Returns:
    (scalar float32 loss, grads shaped like `params`).
  """
  b = batch["weights"].shape[0]
  n = _num_chunks(b, cfg)
  keys = _chunk_keys(key if cfg.dropout else None, n)
  # Packed rows and slots are both laid out (shard, chunk, ...): the same re-layout
  # gives chunk k its rows and its sentences' slots into them.
  tokens = {k: (batch[k][None] if n == 1 else _to_chunks(batch[k], n, cfg.data_shards))
            for k in SIDE_KEYS}
  ids = duplicate_ids(batch["response_hash"]) if cfg.mask_duplicates else None

  def loss_of(c, r):
    return mneg_loss(c, r, scale=cfg.scale, symmetric=cfg.symmetric, weights=batch["weights"],
                     response_ids=ids)

  def embed_all(p):
    if n == 1:  # one chunk: no loop and no re-layout, XLA sees the plain batch
      return _embed_chunk(graphdef, p, {k: batch[k] for k in tokens},
                          None if keys is None else keys[0])
    c, r = jax.lax.map(lambda xs: _embed_chunk(graphdef, p, *xs), (tokens, keys))
    return _from_chunks(c, cfg.data_shards), _from_chunks(r, cfg.data_shards)

  if not cfg.grad_cache:
    return jax.value_and_grad(lambda p: loss_of(*embed_all(p)))(params)

  # Pass 1: embeddings only; nothing is differentiated, so no activations are saved.
  c, r = embed_all(jax.lax.stop_gradient(params))
  loss, (gc, gr) = jax.value_and_grad(loss_of, argnums=(0, 1))(c, r)
  cot = (_to_chunks(gc, n, cfg.data_shards), _to_chunks(gr, n, cfg.data_shards))

  # Pass 2: one chunk at a time, same dropout keys, pull the embedding gradient back.
  def accumulate(total, xs):
    chunk, k, g = xs
    _, vjp = jax.vjp(lambda p: _embed_chunk(graphdef, p, chunk, k), params)
    (grads,) = vjp(g)
    return jax.tree.map(jnp.add, total, grads), None

  grads, _ = jax.lax.scan(accumulate, jax.tree.map(jnp.zeros_like, params), (tokens, keys, cot))
  return loss, grads


def train_step(state: state_lib.TrainState, batch: Mapping[str, jax.Array], *, cfg: LossConfig
               ) -> tuple[state_lib.TrainState, dict[str, jax.Array]]:
  """One optimiser step on a global batch; jit it at the call site (see `make_train_step`)."""
  loss, grads = loss_and_grads(state.graphdef, state.params, batch, state.step_key(), cfg)
  metrics = {"loss": loss, "grad_norm": optax.tree.norm(grads)}
  return state.apply_gradients(grads), metrics


@functools.lru_cache(maxsize=8)
def make_train_step(mesh: Mesh, cfg: LossConfig):
  """`train_step` jitted: state as `sharding.param_shardings` places it (taken from the
  argument, pinned on the output), batch sharded over `data`, state donated."""
  def step(state, batch):
    state, metrics = train_step(state, batch, cfg=cfg)
    # The shardings depend on shapes only, so the traced state yields the placed ones.
    return jax.lax.with_sharding_constraint(state, sharding.param_shardings(state, mesh)), metrics

  rep = sharding.replicated(mesh)
  return jax.jit(step, in_shardings=(None, sharding.batch_sharding(mesh)),
                 out_shardings=(None, rep), donate_argnums=0)


# --------------------------------------------------------------------------- evaluation


class ResponseSelection:
  """Scores every case's candidates by cos(context, response) and ranks the true one.

  Holds host copies of the towers with `Encoder`s over them, built once, so that
  evaluations during training reuse the compiled encoders; `__call__` loads the
  current parameters first. Runs on this process's default device; distinct
  candidate texts are encoded once.

  Args:
    model: a `DualEncoder` on this process's devices (its structure is reused).
    tokenizer, max_length, batch_size: as `Encoder`.
    cases: the response-selection cases.
  """

  def __init__(self, model: DualEncoder, tokenizer, cases: ResponseSelectionSet, *,
               max_length: int, batch_size: int = 128):
    self.model = model
    self.cases = cases
    self.batch_size = batch_size
    self.texts = sorted({t for cands in cases.candidates for t in cands})
    index = {t: i for i, t in enumerate(self.texts)}
    self.candidates = np.asarray([[index[t] for t in cands] for cands in cases.candidates])
    self.contexts = Encoder(model.context, tokenizer, max_length=max_length)
    tower = model.context if model.response is None else model.response
    self.responses = Encoder(tower, tokenizer, max_length=max_length)
    graphdef = nnx.graphdef(model)
    self._ff = jax.jit(lambda state, x: nnx.merge(graphdef, state).apply_response_ff(x))

  def __call__(self, params=None) -> dict[str, float]:
    """R@1/10/50 and MRR with `params` (a pure dict; default: the model's current ones)."""
    if params is not None:
      state = nnx.state(self.model, nnx.Param)
      nnx.replace_by_pure_dict(state, params)
      nnx.update(self.model, state)
    contexts = self.contexts.encode(list(self.cases.contexts), batch_size=self.batch_size,
                                    normalize=True)
    responses = self.responses.encode(self.texts, batch_size=self.batch_size)
    if self.model.response_ff is not None:
      responses = np.asarray(self._ff(nnx.state(self.model), responses))
    responses /= np.maximum(np.linalg.norm(responses, axis=1, keepdims=True), 1e-12)
    scores = np.einsum("nd,ncd->nc", contexts, responses[self.candidates])
    return metrics_lib.response_selection_metrics(scores, self.cases.labels)


def subsample(cases: ResponseSelectionSet, num: int, seed: int) -> ResponseSelectionSet:
  """`num` cases drawn without replacement (all when num <= 0 or >= len)."""
  if num <= 0 or num >= len(cases):
    return cases
  idx = np.sort(np.random.default_rng(seed).choice(len(cases), num, replace=False))
  pick = lambda xs: tuple(xs[i] for i in idx)
  return ResponseSelectionSet(pick(cases.contexts), pick(cases.histories), pick(cases.candidates),
                              cases.labels[idx])


# --------------------------------------------------------------------------- main loop


def resolve_path(path: str) -> Path:
  """An absolute path as is; a relative one against the repository root."""
  p = Path(path).expanduser()
  return p if p.is_absolute() else REPO_ROOT / p


def count_pairs(config: ml_collections.ConfigDict) -> int:
  d = config.data
  return sum(1 for _ in read_conversations(resolve_path(d.train), fmt=d.format or None,
                                           fraction=d.fraction, seed=config.seed))


def make_batches(config: ml_collections.ConfigDict, tokenizer, start_step: int):
  """This process's slices of the Stage 1 batches from `start_step` on (prefetched).

  One fixed subset (`data.fraction`, seeded) for the whole run; each epoch streams it
  through a shuffle buffer seeded by (seed, epoch), so a resumed run sees the batches
  an uninterrupted one would.
  """
  d = config.data
  path = resolve_path(d.train)

  def open_epoch(epoch: int):
    rows = read_conversations(path, fmt=d.format or None, fraction=d.fraction, seed=config.seed)
    seed = int(np.random.SeedSequence([config.seed, epoch]).generate_state(1)[0])
    return shuffle_buffer(rows, d.shuffle_buffer, seed)

  batches = batching.conversation_batches(
      open_epoch, tokenizer, batch_size=config.train.batch_size, max_length=config.model.max_length,
      num_epochs=config.train.epochs, start_step=start_step)
  return batching.prefetch(batches, size=d.prefetch)


def device_batch(host_batch: batching.ConversationBatch, mesh: Mesh, cfg: LossConfig
                 ) -> dict[str, jax.Array]:
  """This process's `ConversationBatch`, packed, as the global arrays `train_step` takes.

  The row count is the largest any (process, shard, chunk, side) needs, so every
  process packs to the same shape.
  """
  shards = cfg.data_shards // jax.process_count()
  chunks = _num_chunks(len(host_batch.weights) * jax.process_count(), cfg)
  needed = batching.conversation_rows(host_batch, chunks=chunks, shards=shards,
                                      width=host_batch.context_ids.shape[1])
  rows = -(-sharding.process_max(needed) // ROW_MULTIPLE) * ROW_MULTIPLE
  local = batching.pack_conversation_batch(host_batch, chunks=chunks, shards=shards, rows=rows,
                                           first_shard=jax.process_index() * shards)
  return sharding.global_batch(local, mesh)


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Runs Stage 1 as `config` says; returns the final metrics (also in metrics.json).

  Writes under `config.workdir`: config.json, metrics.json (r_at_1, r_at_10, r_at_50,
  mrr after training, the same with `_before` before it, train figures), tensorboard/,
  checkpoints/, and model/ (the context encoder as an HF + sentence-transformers
  folder that Stage 2 can `init_from`). Rerunning with the same workdir resumes from
  the latest checkpoint; a finished run only re-evaluates and re-exports.
  """
  sharding.initialize_distributed(config.distributed)
  workdir = state_lib.Workdir(config.workdir)
  workdir.write_config(config)
  mesh = sharding.make_mesh(config.mesh.model_parallel)
  data_shards = mesh.shape[sharding.DATA]

  model, tokenizer, hf_config = build_model(config)
  t = config.train
  num_pairs = count_pairs(config)
  per_epoch = batching.steps_per_epoch(num_pairs, t.batch_size)
  total_steps = per_epoch * t.epochs
  if t.max_steps > 0:
    total_steps = min(total_steps, t.max_steps)
  tx, schedule = state_lib.make_optimizer(
      learning_rate=t.learning_rate, total_steps=total_steps, warmup_fraction=t.warmup_fraction,
      weight_decay=t.weight_decay, clip_norm=t.clip_norm)
  state = state_lib.TrainState.create(model, tx, seed=config.seed)
  state = state_lib.place(state, sharding.param_shardings(state, mesh))
  ckpt = state_lib.Checkpointer(workdir.checkpoint_dir, save_every=t.checkpoint_every,
                                keep=t.keep_checkpoints)
  state = ckpt.restore_or_init(state)
  start = int(jax.device_get(state.step))
  logging.info("stage1: %d pairs, %d steps/epoch, %d steps, resuming at %d, %d devices, %d processes",
               num_pairs, per_epoch, total_steps, start, jax.device_count(), jax.process_count())

  selection = None
  if config.eval.file:
    cases = subsample(read_response_selection(resolve_path(config.eval.file)),
                      config.eval.num_cases, config.seed)
    selection = ResponseSelection(state.model(state.host_params()), tokenizer, cases,
                                  max_length=config.model.max_length,
                                  batch_size=config.eval.batch_size)

  def evaluate(state_: state_lib.TrainState, suffix: str, step: int) -> dict[str, float]:
    if selection is None:
      return {}
    m = selection(state_.host_params())
    logging.info("response selection %s (step %d): %s", suffix or "after", step, m)
    workdir.write_scalars(step, {f"eval/{k}": v for k, v in m.items()})
    return {f"{k}{suffix}": v for k, v in m.items()}

  metrics = workdir.read_metrics()
  if start == 0 or "r_at_1_before" not in metrics:
    metrics = workdir.update_metrics({**evaluate(state, "_before", start), "num_pairs": num_pairs,
                                      "total_steps": total_steps})

  cfg = LossConfig(scale=config.loss.scale, symmetric=config.loss.symmetric,
                   mask_duplicates=config.loss.mask_duplicates, dropout=config.model.dropout,
                   chunk_size=t.chunk_size or None, grad_cache=t.grad_cache, data_shards=data_shards)
  step_fn = make_train_step(mesh, cfg)
  train_seconds = metrics.get("train_seconds", 0.0)  # a resumed run adds to it
  if start < total_steps:
    batches = make_batches(config, tokenizer, start)

    state, seconds = loop.fit(
        state, step_fn, batches, total_steps=total_steps, pairs_per_step=t.batch_size,
        schedule=schedule, workdir=workdir, checkpointer=ckpt, log_every=t.log_every,
        to_device=functools.partial(device_batch, mesh=mesh, cfg=cfg), eval_every=config.eval.every,
        evaluate=lambda state_, step: evaluate(state_, "", step))
    train_seconds += seconds
    batches.close()
  ckpt.close()

  metrics = workdir.update_metrics({**evaluate(state, "", total_steps), "steps": total_steps,
                                    "train_seconds": train_seconds})
  encoder = Encoder(state.model(state.host_params()).context, tokenizer, max_length=config.model.max_length,
                    hf_config=hf_config)
  if state_lib.is_main_process():
    encoder.save_pretrained(workdir.path / "model")
  workdir.close()
  return metrics
