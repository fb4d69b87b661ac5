"""ConvFiT Stage 2: task-tailored contrastive fine-tuning on intent pairs.

Model: `SentenceEncoder` (Transformer, masked mean pooling, Dense(d_o) + tanh), plus
the pair classifier for the `smax` loss. Data: the paper's pairs (every same-intent
pair, 2n different-intent negatives per positive) as index arrays into one table of
tokenised training sentences. Each step encodes the batch's distinct sentences once,
packed several to a row (`data.packing`: banking77's utterances fill a third of a
padded batch), and scores the B pairs from those embeddings, so a sentence that
appears in several pairs of a batch costs one forward pass and padding costs nothing.

The loop: k-NN accuracy of the encoder before training, training with orbax
checkpoints (a rerun with the same workdir resumes; a finished run is not
retrained), k-NN accuracy after, the model exported as an HF/sentence-transformers
folder (workdir/model) that the `evaluate` task, Stage 1 or PyTorch users load.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import optax
from absl import logging
from flax import nnx

from convfit_jax import checkpoints, losses, sharding
from convfit_jax.data import batching, pairs as pairs_lib
from convfit_jax.encoder import Encoder
from convfit_jax.eval.intent import evaluate_intents, load_intent_data, subsample
from convfit_jax.models import heads
from convfit_jax.models.sentence import SentenceEncoder
from convfit_jax.tokenize import load_tokenizer
from convfit_jax.train import loop, state as state_lib

BATCH_KEYS = ("input_ids", "attention_mask", "position_ids", "slots", "u_idx", "v_idx", "targets",
              "weights")


class PairModel(nnx.Module):
  """The Stage 2 network: the sentence encoder, and the smax classifier when used."""

  def __init__(self, encoder: SentenceEncoder, classifier: heads.PairClassifier | None):
    self.encoder = encoder
    self.classifier = classifier


def build_model(config: ml_collections.ConfigDict) -> tuple[PairModel, Any, dict, bool]:
  """(PairModel, tokenizer, hf_config, normalize) for `config.model` and `config.train.loss`."""
  m = config.model
  encoder, ck = checkpoints.init_sentence_encoder(
      m.init_from, architecture=m.architecture, dtype=jnp.dtype(m.dtype), remat=m.remat,
      projection_dim=m.projection_dim or None, seed=config.seed)
  classifier = (heads.PairClassifier(encoder.dim, rngs=nnx.Rngs(config.seed + 1))
                if config.train.loss == "smax" else None)
  return PairModel(encoder, classifier), load_tokenizer(ck.tokenizer_dir), ck.hf_config, ck.normalize


def loss_fn(model: PairModel, batch: Mapping[str, jax.Array], dropout_key: jax.Array | None, *,
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


def train_step(state: state_lib.TrainState, batch: Mapping[str, jax.Array], *, loss: str,
               margin: float) -> tuple[state_lib.TrainState, dict[str, jax.Array]]:
  """One AdamW step on one batch (dropout on, keyed by the step)."""
  def objective(params):
    return loss_fn(state.model(params), batch, state.step_key(), loss=loss, margin=margin)
  value, grads = jax.value_and_grad(objective)(state.params)
  return state.apply_gradients(grads), {"loss": value, "grad_norm": optax.tree.norm(grads)}


def device_batch(host_batch: batching.PairBatch, mesh) -> dict[str, jax.Array]:
  """A host `PairBatch` as the global arrays `train_step` takes."""
  return sharding.global_batch({k: getattr(host_batch, k) for k in BATCH_KEYS}, mesh)


def pack_rows(config: ml_collections.ConfigDict, table: batching.SentenceTable,
              pairs: pairs_lib.Pairs, total_steps: int, mesh) -> int:
  """Packed rows per process for every batch of the run (`batching.pair_batch_rows`)."""
  return batching.pair_batch_rows(
      table, pairs, batch_size=config.train.batch_size, seed=config.data.seed,
      num_steps=total_steps, process_count=jax.process_count(),
      multiple=max(mesh.shape[sharding.DATA] // jax.process_count(), 1))


def init_state(config: ml_collections.ConfigDict, model: PairModel, total_steps: int,
               mesh) -> tuple[state_lib.TrainState, optax.Schedule]:
  """The train state (AdamW as `config.train` says, on `mesh` as `sharding.param_shardings`
  says) and its schedule."""
  t = config.train
  tx, schedule = state_lib.make_optimizer(
      learning_rate=t.learning_rate, total_steps=total_steps, warmup_fraction=t.warmup_fraction,
      weight_decay=t.weight_decay, clip_norm=t.clip_norm)
  state = state_lib.TrainState.create(model, tx, seed=config.seed)
  state = state_lib.place(state, sharding.param_shardings(state, mesh))
  return state, schedule


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


def total_steps_for(num_pairs: int, t: ml_collections.ConfigDict) -> int:
  steps = batching.steps_per_epoch(num_pairs, t.batch_size) * t.epochs
  return min(steps, t.max_steps) if t.max_steps > 0 else steps


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Runs Stage 2 as `config` says; returns the metrics (also in workdir/metrics.json).

  metrics.json: knn_accuracy, knn_accuracy_before, macro_f1, silhouette (and _before),
  mlp_accuracy (eval.mlp), num_train, num_test, pairs_positive, pairs_negative,
  train_seconds, steps, estimated memory; dry_run stops after the counts.
  """
  sharding.initialize_distributed(config.get("distributed"))
  workdir = state_lib.Workdir(config.workdir)
  workdir.write_config(config)
  t = config.train
  if t.loss not in losses.STAGE2_LOSSES:
    raise ValueError(f"train.loss={t.loss!r}: choose one of {sorted(losses.STAGE2_LOSSES)}")
  data = load_intent_data(config.data, oos=config.eval.oos)
  model, tokenizer, hf_config, normalize = build_model(config)
  pairs = pairs_lib.build_pairs(data.train.labels, config.data.negatives, seed=config.data.seed,
                                max_pairs_per_label=config.data.max_pairs_per_label or None)
  total_steps = total_steps_for(len(pairs), t)
  num_params = state_lib.count_params(nnx.state(model, nnx.Param))
  counts = {"num_train": len(data.train), "num_pool": len(data.pool), "num_labels": data.num_labels,
            "pairs_positive": pairs.num_positive, "pairs_negative": pairs.num_negative,
            "total_steps": total_steps, "num_params": num_params,
            "memory_estimate": memory_estimate(num_params, config, model.encoder.config)}
  logging.info("stage2 %s: %s", data.name, pairs.summary(config.model.max_length))
  print(f"{data.name}: {len(data.train)} training examples, {data.num_labels} intents; "
        f"{pairs.summary(config.model.max_length)}; {total_steps} steps; "
        f"estimated memory {counts['memory_estimate']['total_mib']:.0f} MiB", flush=True)
  test = subsample(data.test, config.eval.max_test, config.seed)
  counts["num_test"] = len(test)
  metrics = workdir.update_metrics(counts)
  if config.dry_run:
    workdir.close()
    return metrics

  mesh = sharding.make_mesh(config.mesh.model_parallel)
  state, schedule = init_state(config, model, total_steps, mesh)
  ckpt = state_lib.Checkpointer(workdir.checkpoint_dir, save_every=t.checkpoint_every,
                                keep=t.keep_checkpoints)
  state = ckpt.restore_or_init(state)
  start = int(jax.device_get(state.step))
  if start >= total_steps and "knn_accuracy" in metrics:
    logging.info("%s already finished at step %d; nothing to do", workdir.path, start)
    ckpt.close()
    workdir.close()
    return metrics

  e = config.eval
  evaluate = functools.partial(evaluate_intents, data=data, k=e.k, vote=e.vote,
                               batch_size=e.batch_size, test=test, oos=e.oos, seed=config.seed)
  plot_title = f"{data.name} test, {config.data.shots or 'full'}-shot"

  def encoder_of(state_) -> Encoder:
    return Encoder(state_.model(state_.host_params()).encoder, tokenizer, max_length=config.model.max_length,
                   normalize=normalize, hf_config=hf_config)

  if e.before and "knn_accuracy_before" not in metrics:
    before = evaluate(encoder_of(state), run_mlp=e.mlp, suffix="_before",
                      tsne_path=workdir.path / "tsne_before.png" if e.tsne else None,
                      tsne_title=f"{plot_title}, before Stage 2")
    metrics = workdir.update_metrics(before)
    logging.info("before: knn_accuracy %.4f", before["knn_accuracy_before"])

  table = batching.SentenceTable.from_texts(tokenizer, data.train.texts, config.model.max_length)
  rows = pack_rows(config, table, pairs, total_steps, mesh)
  logging.info("stage2: %d sentences of a batch packed into %d rows of %d per process",
               2 * t.batch_size // jax.process_count(), rows, table.width)
  host_batches = batching.prefetch(batching.pair_batches(
      table, pairs, loss=t.loss, rows=rows, batch_size=t.batch_size, seed=config.data.seed,
      start_step=start, num_steps=total_steps - start))
  to_device = functools.partial(device_batch, mesh=mesh)
  # Pinned output shardings: the next step (and the donation) gets the state as placed.
  step_fn = jax.jit(functools.partial(train_step, loss=t.loss, margin=t.margin),
                    out_shardings=(sharding.param_shardings(state, mesh), sharding.replicated(mesh)),
                    donate_argnums=0)
  state, seconds = loop.fit(
      state, step_fn, host_batches, total_steps=total_steps, pairs_per_step=t.batch_size,
      schedule=schedule, workdir=workdir, checkpointer=ckpt, log_every=t.log_every,
      to_device=to_device, batch_rows=lambda b: b.sentence_ids)
  host_batches.close()
  ckpt.close()

  encoder = encoder_of(state)
  after = evaluate(encoder, run_mlp=e.mlp,
                   tsne_path=workdir.path / "tsne_after.png" if e.tsne else None,
                   tsne_title=f"{plot_title}, after Stage 2 ({t.loss})")
  for pool_shots in e.extra_pools:
    # The paper's inference-time augmentation: the same encoder, a larger k-NN pool.
    pool_data = load_intent_data({**config.data.to_dict(), "pool_shots": pool_shots}, oos=e.oos)
    name = f"pool{pool_shots or 'full'}"
    after.update(evaluate(encoder, data=pool_data, suffix=f"_{name}"))
  if state_lib.is_main_process():
    encoder.save_pretrained(workdir.path / "model")
  metrics = workdir.update_metrics({
      **after, "steps": total_steps, "train_seconds": seconds})
  print(f"k-NN accuracy on {len(test)} test examples: "
        f"before {metrics.get('knn_accuracy_before', float('nan')):.4f}, "
        f"after {metrics['knn_accuracy']:.4f}", flush=True)
  workdir.close()
  return metrics
