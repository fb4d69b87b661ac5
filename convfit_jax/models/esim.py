"""ESIM for response selection (Chen & Wang 2019, after Chen et al. 2017's ESIM for NLI).

Context and response are word sequences (`data.words`; the context's turns joined by
`__eou__`, cut from the left). Both go through one input-encoding BiLSTM; each context
token is aligned softly with the response tokens and vice versa (e = a b^T, padding
masked); local matching [a; a~; a - a~; a * a~] goes through a ReLU projection and a
composition BiLSTM; mean and max pooling of both sides feed an MLP with one tanh hidden
layer and a 2-way softmax (not a match / a match). A candidate's score is the logit
difference, log p(match) - log p(no match).

Word embeddings start from a vectors file (GloVe) or at random; frozen ones are an
`nnx.Variable` that is not a parameter, so the optimiser neither moves nor decays them.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax.data import words
from convfit_jax.models import Built, PairInputs, sentence
from convfit_jax.models.lstm import BiLSTM

_MASKED = -1e9  # softmax logit of a padded position (finite: a row of padding stays NaN-free)


class FrozenEmbedding(nnx.Variable):
  """Word vectors that training leaves as they are (model state, not a parameter)."""


@dataclasses.dataclass(frozen=True)
class EsimConfig:
  """Sizes. `hidden` is the paper's 300 for both BiLSTMs, the projection and the MLP."""
  vocab_size: int
  embed_dim: int = 300
  hidden: int = 300
  dropout: float = 0.0  # on the MLP's input and hidden layer during training
  freeze_embeddings: bool = False


def masked_softmax(scores: jax.Array, mask: jax.Array, axis: int) -> jax.Array:
  """softmax of `scores` along `axis` over the positions `mask` keeps (bool, broadcast)."""
  return jax.nn.softmax(jnp.where(mask, scores, _MASKED), axis=axis)


def soft_align(a: jax.Array, b: jax.Array, a_mask: jax.Array, b_mask: jax.Array
               ) -> tuple[jax.Array, jax.Array]:
  """ESIM's dual vectors: [n, La, d] and [n, Lb, d] with bool masks [n, La], [n, Lb] ->
  (a~ [n, La, d], each a token's attention-weighted response tokens; b~ [n, Lb, d])."""
  e = jnp.einsum("nid,njd->nij", a, b)
  a_tilde = jnp.einsum("nij,njd->nid", masked_softmax(e, b_mask[:, None, :], axis=2), b)
  b_tilde = jnp.einsum("nij,nid->njd", masked_softmax(e, a_mask[:, :, None], axis=1), a)
  return a_tilde, b_tilde


def local_matching(x: jax.Array, x_tilde: jax.Array) -> jax.Array:
  """[x; x~; x - x~; x * x~] along the last axis: [n, L, d] -> [n, L, 4 d]."""
  return jnp.concatenate([x, x_tilde, x - x_tilde, x * x_tilde], axis=-1)


def mean_max_pool(x: jax.Array, mask: jax.Array) -> jax.Array:
  """[n, L, d] float32 with [n, L] bool mask -> [n, 2 d]: mean and max over valid positions."""
  m = mask[:, :, None]
  mean = jnp.sum(jnp.where(m, x, 0.0), axis=1) / jnp.maximum(jnp.sum(m, axis=1), 1)
  return jnp.concatenate([mean, jnp.max(jnp.where(m, x, -jnp.inf), axis=1)], axis=-1)


class Esim(nnx.Module):
  """(context, response) word ids -> [n, 2] float32 logits."""

  def __init__(self, config: EsimConfig, *, rngs: nnx.Rngs, embeddings: np.ndarray | None = None):
    c = config
    self.config = c
    table = (jax.random.normal(rngs.params(), (c.vocab_size, c.embed_dim)) * 0.1
             if embeddings is None else jnp.asarray(embeddings, jnp.float32))
    self.embeddings = FrozenEmbedding(table) if c.freeze_embeddings else nnx.Param(table)
    self.encoder = BiLSTM(c.embed_dim, c.hidden, rngs=rngs)
    self.projection = nnx.Linear(8 * c.hidden, c.hidden, rngs=rngs)
    self.composition = BiLSTM(c.hidden, c.hidden, rngs=rngs)
    self.hidden = nnx.Linear(8 * c.hidden, c.hidden, rngs=rngs)
    self.out = nnx.Linear(c.hidden, 2, rngs=rngs)

  def __call__(self, context_ids: jax.Array, context_lengths: jax.Array, response_ids: jax.Array,
               response_lengths: jax.Array, dropout_key: jax.Array | None = None) -> jax.Array:
    """[n, Lc] / [n, Lr] int32 ids (0 = padding) and [n] int32 lengths -> [n, 2] logits.

    `dropout_key` (training) drops MLP inputs and hidden units at `config.dropout`.
    """
    table = self.embeddings[...]
    c_mask = jnp.arange(context_ids.shape[1])[None, :] < context_lengths[:, None]
    r_mask = jnp.arange(response_ids.shape[1])[None, :] < response_lengths[:, None]
    a = self.encoder(table[context_ids], context_lengths)
    b = self.encoder(table[response_ids], response_lengths)
    a_tilde, b_tilde = soft_align(a, b, c_mask, r_mask)
    project = lambda x: jax.nn.relu(self.projection(x))
    va = self.composition(project(local_matching(a, a_tilde)), context_lengths)
    vb = self.composition(project(local_matching(b, b_tilde)), response_lengths)
    v = jnp.concatenate([mean_max_pool(va, c_mask), mean_max_pool(vb, r_mask)], axis=-1)
    k1, k2 = (None, None) if dropout_key is None else jax.random.split(dropout_key)
    h = jnp.tanh(self.hidden(_dropout(v, self.config.dropout, k1)))
    return self.out(_dropout(h, self.config.dropout, k2))


def _dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), 0.0)


def build(m: ml_collections.ConfigDict, *, seed: int,
          train_texts: Callable[[], Iterable[str]]) -> Built:
  """ESIM as a `model` config block says, its vocabulary built from `train_texts()`.

  Fields: embed_dim, hidden, dropout, freeze_embeddings, vectors (a word-vectors file, or
  "" for random embeddings), min_count and max_vocab (`words.build_vocabulary`).
  `Built.tokenizer` is the vocabulary; `hf_config` records the share of its words found
  in the vectors file.
  """
  vocabulary = words.build_vocabulary(train_texts(), min_count=m.min_count, max_size=m.max_vocab)
  table, found = words.embedding_matrix(vocabulary, dim=m.embed_dim, vectors=m.vectors or None,
                                        seed=seed)
  config = EsimConfig(len(vocabulary), m.embed_dim, m.hidden, m.dropout, m.freeze_embeddings)
  model = Esim(config, rngs=nnx.Rngs(seed), embeddings=table)
  return Built(model, tokenizer=vocabulary, hf_config={"words_in_vectors": found})


def pair_inputs(built: Built, m: ml_collections.ConfigDict) -> PairInputs:
  """(histories, responses) -> ESIM's inputs: contexts cut to `m.max_context` words from
  the left, responses to `m.max_response` from the right (`train.rerank`)."""
  vocabulary = built.tokenizer

  def inputs(histories: Sequence[str], responses: Sequence[str]) -> dict[str, np.ndarray]:
    c, cl = words.encode(histories, vocabulary, max_length=m.max_context, keep="end")
    r, rl = words.encode(responses, vocabulary, max_length=m.max_response, keep="start")
    return {"context_ids": c, "context_lengths": cl, "response_ids": r, "response_lengths": rl}

  return PairInputs(inputs)  # word id 0 is padding


def export(built: Built, model: Esim, folder: str | os.PathLike) -> None:
  """`save` (`train.rerank`'s export)."""
  save(model, built.tokenizer, folder)


def save(model: Esim, vocabulary: words.Vocabulary, folder: str | os.PathLike) -> None:
  """Writes `esim.json` (the config), `vocab.txt` and `weights.npz` (every array by path)."""
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / "esim.json").write_text(json.dumps(dataclasses.asdict(model.config), indent=1))
  vocabulary.save(folder / "vocab.txt")
  np.savez(folder / "weights.npz", **{".".join(map(str, path)): np.asarray(var[...])
                                       for path, var in nnx.to_flat_state(nnx.state(model))})


def load(folder: str | os.PathLike, m: ml_collections.ConfigDict | None = None) -> Built:
  """The model and vocabulary `save` wrote, as `build` gives them (`m`, the run's model
  block, is not needed: the sizes are in esim.json)."""
  del m
  folder = Path(folder)
  config = EsimConfig(**json.loads((folder / "esim.json").read_text()))
  with np.load(folder / "weights.npz") as arrays:
    model = sentence.build_with_params(lambda: Esim(config, rngs=nnx.Rngs(0)), dict(arrays),
                                       source=str(folder / "weights.npz"))
  return Built(model, tokenizer=words.Vocabulary.load(folder / "vocab.txt"))
