"""The input-response model of Yang et al. (2018), alone or multitask with NLI.

Model (`InputResponse`): a `DualEncoder` whose context and response sides share one
encoder (`config.model.encoder`: "sentence", a pretrained or `rand` Transformer, or
"dan", the deep averaging network trained from scratch), a response-side feed-forward
network of `model.response_ff_depth` residual blocks, and, for the multitask model, an
NLI classifier on [u; v; |u - v|; u * v] sharing the encoder (`heads.NliClassifier`).

Conversation loss: each input takes a softmax over the batch's responses (the sampled
alternatives), `losses.mneg_loss` over the GLOBAL batch (scale * cosine, as Stage 1;
identical responses are not each other's negatives). NLI loss: 3-way cross-entropy.

Interleaving: every step takes one batch of each task and one optimiser update of
`conversation_loss + train.nli_weight * nli_loss` (the paper alternates single-task
steps; we sum them so both tasks move the shared encoder at every step, with one
compiled step). The ratio is `train.nli_batch_size : train.batch_size` and the weight;
`train.nli_batch_size = 0` is the conversation-only model, `train.batch_size = 0` the
NLI-only one (InferSent's training, which seed 003 uses for its word-level encoder). Both
losses are logged (`train/conversation_loss`, `train/nli_loss`).

Data: conversation pairs of `data.train` (as Stage 1 reads them) and NLI pairs of
`data.nli_train` ('+'-separated TSVs, `data.sentence_pairs.read_nli`), of which a
seeded `data.nli_fraction` is kept (the paper's data-size study). Each stream is an
epoch permutation from PCG64(seed, epoch) (the NLI stream from seed + 1) cut into full
batches, indexed by the step, so step s is the same pair of batches on every machine
and after a resume. Each process encodes its contiguous share of each batch.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any, Iterator, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax import losses, models, sharding
from convfit_jax.data import batching
from convfit_jax.data.conversations import read_conversations
from convfit_jax.data.sentence_pairs import NliSet, concatenate, read_nli
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.models import Built, dan, dual_encoder
from convfit_jax.models.dual_encoder import DualEncoder
from convfit_jax.models.heads import NliClassifier
from convfit_jax.train import trainer
from convfit_jax.train.train_state import TrainState

class InputResponse(nnx.Module):
  """The dual encoder and, for the multitask model, the NLI classifier on its encoder."""

  def __init__(self, dual: DualEncoder, nli: NliClassifier | None):
    self.dual = dual
    self.nli = nli


def text_hashes(texts) -> np.ndarray:
  """[n, 2] int32 digests of the texts: equal texts, equal digests (`losses.duplicate_ids`)."""
  out = np.zeros((len(texts), 2), np.int32)
  for i, t in enumerate(texts):
    out[i] = np.frombuffer(hashlib.blake2b(t.encode("utf-8"), digest_size=8).digest(), np.int32)
  return out


def _side(batch: Mapping[str, jax.Array], name: str) -> dict[str, jax.Array]:
  prefix = f"{name}/"
  return {k[len(prefix):]: v for k, v in batch.items() if k.startswith(prefix)}


def loss_fn(model: InputResponse, batch: Mapping[str, jax.Array], dropout_key: jax.Array | None, *,
            scale: float, nli_weight: float) -> dict[str, jax.Array]:
  """{"loss", "conversation_loss", "nli_loss"} float32 scalars of one step's batches (each
  part where its task trains).

  Args:
    model: in train mode.
    batch: `<side>/<input>` [n, L] arrays for the sides context, response (with
      response_hash [n, 2] int32; absent when NLI trains alone) and premise, hypothesis
      (the multitask model, with nli_labels [m] int32).
    dropout_key: split over the four encodings.
    scale, nli_weight: the conversation loss's scale; the NLI loss's weight.
  """
  keys = [None] * 4 if dropout_key is None else list(jax.random.split(dropout_key, 4))
  dual = model.dual
  out = {}
  if "response_hash" in batch:
    contexts = dual.encode_contexts(**_side(batch, "context"), dropout_key=keys[0])
    responses = dual.encode_responses(**_side(batch, "response"), dropout_key=keys[1])
    out["conversation_loss"] = losses.mneg_loss(
        contexts, responses, scale=scale, response_ids=losses.duplicate_ids(batch["response_hash"]))
  if model.nli is not None:
    u = dual.encode_contexts(**_side(batch, "premise"), dropout_key=keys[2])
    v = dual.encode_contexts(**_side(batch, "hypothesis"), dropout_key=keys[3])
    log_p = jax.nn.log_softmax(model.nli(u, v))
    out["nli_loss"] = -jnp.mean(jnp.take_along_axis(log_p, batch["nli_labels"][:, None], axis=1))
  loss = out.get("conversation_loss", 0.0) + nli_weight * out.get("nli_loss", 0.0)
  return {"loss": loss, **out}


class NliPredictor:
  """(premises, hypotheses) -> [n] int32 predicted `NLI_LABELS` indices, through the
  encoder and the NLI classifier (`evaluators.nli`)."""

  def __init__(self, encoder, classifier: NliClassifier):
    self.encoder = encoder
    self.graphdef, self.state = nnx.split(classifier)

  def predict(self, premises, hypotheses, *, batch_size: int = 32) -> np.ndarray:
    u = self.encoder.encode(premises, batch_size=batch_size, normalize=False)
    v = self.encoder.encode(hypotheses, batch_size=batch_size, normalize=False)
    return np.asarray(_nli_predict(self.graphdef, self.state, u, v))


@functools.partial(jax.jit, static_argnums=0)
def _nli_predict(graphdef: nnx.GraphDef, state: nnx.State, u: jax.Array, v: jax.Array) -> jax.Array:
  return jnp.argmax(nnx.merge(graphdef, state)(u, v), axis=-1).astype(jnp.int32)


class InputResponseTask:
  """The input-response `trainer.Task` (module docstring)."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    d, t, m = config.data, config.train, config.model
    if not (t.batch_size or t.nli_batch_size):
      raise ValueError("train.batch_size and train.nli_batch_size are both 0: nothing to train")
    self.conversations = t.batch_size > 0
    pairs = self._conversation_pairs() if self.conversations else []
    self.contexts = tuple(p.context for p in pairs)
    self.responses = tuple(p.response for p in pairs)
    self.nli = self._nli_train() if t.nli_batch_size else None
    data_shards = mesh.shape[sharding.DATA]
    if self.conversations:
      batching.check_divisible(t.batch_size, data_shards)
      self.per_epoch = len(pairs) // t.batch_size
      if self.per_epoch == 0:
        raise ValueError(f"data.train: {len(pairs)} pairs, fewer than train.batch_size={t.batch_size}")
    if self.nli is not None:
      batching.check_divisible(t.nli_batch_size, data_shards)
      self.nli_per_epoch = len(self.nli) // t.nli_batch_size
      if self.nli_per_epoch == 0:
        raise ValueError(f"data.nli_train: {len(self.nli)} pairs, fewer than "
                         f"train.nli_batch_size={t.nli_batch_size}")

    def train_texts():
      extra = () if self.nli is None else self.nli.premises + self.nli.hypotheses
      return self.contexts + self.responses + extra

    self.module = models.get(m.encoder)
    tower = self.module.build(m, seed=config.seed, train_texts=train_texts)
    self.tower = tower
    dual = dual_encoder.wrap(tower.model, m, seed=config.seed)
    nli = (NliClassifier(tower.model.dim, tuple(m.nli_hidden), rngs=nnx.Rngs(config.seed + 2))
           if self.nli is not None else None)
    self.built = Built(InputResponse(dual, nli), tokenizer=tower.tokenizer,
                       hf_config=tower.hf_config, normalize=tower.normalize)
    self.inputs = self.module.text_inputs(tower, d.max_length or m.max_length)
    self.title = (("input-response" + (" + NLI" if self.nli is not None else "")
                   if self.conversations else "NLI") + f" ({m.encoder})")
    if not self.conversations:  # an epoch is then one of the NLI pairs
      self.per_epoch = self.nli_per_epoch
    self.total_steps = trainer.total_steps(self.per_epoch, t)
    self.examples_per_step = t.batch_size or t.nli_batch_size
    self.examples_name = "pairs"
    self.counts = {"num_pairs": len(pairs), "steps_per_epoch": self.per_epoch,
                   "total_steps": self.total_steps,
                   **({} if self.nli is None else {"num_nli_pairs": len(self.nli)}),
                   **{k: v for k, v in tower.hf_config.items() if k == "words_in_vectors"}}

  def _conversation_pairs(self) -> list:
    d = self.config.data
    path = Path(d.train).expanduser()
    if not path.is_file():
      raise FileNotFoundError(f"data.train: {path.absolute()} does not exist "
                              "(relative paths are read from the current directory)")
    pairs = list(read_conversations(path, fmt=d.format or None))
    return [pairs[i] for i in subsample_indices(len(pairs), d.max_pairs, self.config.seed)]

  def _nli_train(self) -> NliSet:
    d = self.config.data
    sets = [read_nli(Path(f).expanduser()) for f in d.nli_train.split("+")]
    nli = concatenate(sets)
    keep = round(d.nli_fraction * len(nli))
    if not 0 < keep <= len(nli):
      raise ValueError(f"data.nli_fraction={d.nli_fraction} keeps {keep} of {len(nli)} NLI pairs")
    order = np.random.Generator(np.random.PCG64([self.config.seed, 1])).permutation(len(nli))
    return nli.subset(np.sort(order[:keep]))

  def step_rows(self, step: int) -> dict[str, np.ndarray]:
    """The global batches of `step`: {"pairs": [batch_size], "nli": [nli_batch_size]} rows."""
    def rows(n, per_epoch, size, seed):
      order = batching.epoch_order(n, seed, step // per_epoch)
      return order[(step % per_epoch) * size:(step % per_epoch + 1) * size]

    t, seed = self.config.train, self.config.seed
    out = {}
    if self.conversations:
      out["pairs"] = rows(len(self.contexts), self.per_epoch, t.batch_size, seed)
    if self.nli is not None:
      out["nli"] = rows(len(self.nli), self.nli_per_epoch, t.nli_batch_size, seed + 1)
    return out

  def batches(self, start_step: int) -> Iterator[dict[str, np.ndarray]]:
    def own(rows):
      return rows[batching.own_slice(len(rows), jax.process_index(), jax.process_count())]

    def steps():
      for step in range(start_step, self.total_steps):
        yield {k: own(v) for k, v in self.step_rows(step).items()}
    return batching.prefetch(steps(), size=self.config.data.prefetch)

  def device_batch(self, host_batch: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
    texts, local = {}, {}
    if self.conversations:
      rows = host_batch["pairs"]
      texts = {"context": [self.contexts[i] for i in rows], "response": [self.responses[i] for i in rows]}
      local = {"response_hash": text_hashes(texts["response"])}
    if self.nli is not None:
      nli_rows = host_batch["nli"]
      texts["premise"] = [self.nli.premises[i] for i in nli_rows]
      texts["hypothesis"] = [self.nli.hypotheses[i] for i in nli_rows]
      local["nli_labels"] = self.nli.labels[nli_rows]
    inputs = {f"{side}/{k}": v for side, side_texts in texts.items()
              for k, v in self.inputs(side_texts).items()}
    # One width for every side, the widest any process needs: a run compiles one step per
    # width the inputs' padding allows, not one per combination of the four sides' widths.
    width = sharding.process_max(max(v.shape[1] for v in inputs.values()))
    local.update({k: np.pad(v, [(0, 0), (0, width - v.shape[1])]) for k, v in inputs.items()})
    return sharding.global_batch(local, self.mesh)

  def batch_rows(self, host_batch: Mapping[str, np.ndarray]) -> np.ndarray:
    return host_batch["pairs" if self.conversations else "nli"]

  def loss_and_grads(self, state: TrainState, batch: Mapping[str, jax.Array]):
    t = self.config.train
    return trainer.value_and_grad(
        lambda model, b, key: loss_fn(model, b, key if self.config.model.dropout else None,
                                      scale=self.config.loss.scale, nli_weight=t.nli_weight),
        state, batch)

  def predictors(self, model: InputResponse) -> dict[str, Any]:
    contexts, scorer = trainer.dual_encoder_predictors(
        model.dual, lambda tower: trainer.text_encoder(self.module, self.tower, tower, self.config.model))
    out = {"text": contexts, "response_scorer": scorer}
    if model.nli is not None:
      out["nli"] = NliPredictor(contexts, model.nli)
    return out

  def export(self, model: InputResponse, folder: Path) -> None:
    """The shared encoder: an HF + sentence-transformers folder (Transformer) or a DAN folder."""
    if self.config.model.encoder == "dan":
      dan.save(self.tower, model.dual.context, folder, self.config.model.max_length)
    else:
      trainer.text_encoder(self.module, self.tower, model.dual.context,
                          self.config.model).save_pretrained(folder)

  def summary(self, metrics: Mapping[str, Any]) -> str | None:
    if "stsb_test_pearson" not in metrics:
      return None
    return (f"STS-B test Pearson {metrics['stsb_test_pearson']:.4f} "
            f"(before {metrics.get('stsb_test_pearson_before', float('nan')):.4f})")


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Trains the input-response model as `config` says; returns the final metrics (also
  in workdir/metrics.json). Writes config.json, log.txt, metrics.json (each evaluation
  before and after), tensorboard/, checkpoints/ and model/ (the shared encoder)."""
  return trainer.train_and_evaluate(config, InputResponseTask)
