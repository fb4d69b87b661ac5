"""The deep averaging network (DAN) of Yang et al. (2018), and the bag-of-vectors baseline.

A sentence is the mean of its word and bigram embeddings, through a feed-forward net
(the paper's 300, 300, 500 units). Words and bigrams come from vocabularies built on
the training texts (`data.words`: lower-cased words and punctuation); a word or bigram
outside them is the unknown id 1 of its table, and counts in the mean. Word vectors
start from a GloVe-format file when `model.vectors` names one (its width is then
`embed_dim`), else random; bigrams start random. Trained from scratch, cheap on a CPU.

`config.model.encoder = "dan"` in the input-response task; a finished run's `model/`
folder (`save`) is read back by `load` and by the evaluate task's `init_from`.
"""

from __future__ import annotations

import collections
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
from convfit_jax.models import Built, word_models
from convfit_jax.models.heads import l2_normalize

ACTIVATIONS = {"tanh": jnp.tanh, "relu": jax.nn.relu}
CONFIG_FILE = "dan.json"


@dataclasses.dataclass(frozen=True)
class DanVocabulary:
  """The word and bigram vocabularies, and how they turn texts into a DAN's inputs."""
  words: words.Vocabulary
  bigrams: words.Vocabulary

  def inputs(self, texts: Sequence[str], max_length: int) -> dict[str, np.ndarray]:
    """n texts -> {"word_ids", "bigram_ids"} [n, L] int32, 0 = padding.

    Each text keeps its first `max_length` words (an empty text is one unknown word) and
    their bigrams; L is `words.padded_length` of the longest.
    """
    rows = [words.tokenize(t)[:max_length] for t in texts]
    word_rows = [self.words.ids(r) or [1] for r in rows]
    bigram_rows = [self.bigrams.ids(bigrams(r)) for r in rows]
    width = words.padded_length(max((len(r) for r in word_rows), default=1), max_length)
    out = {"word_ids": np.zeros((len(rows), width), np.int32),
           "bigram_ids": np.zeros((len(rows), width), np.int32)}
    for i, (w, b) in enumerate(zip(word_rows, bigram_rows)):
      out["word_ids"][i, :len(w)] = w
      out["bigram_ids"][i, :len(b)] = b
    return out


def bigrams(tokens: Sequence[str]) -> list[str]:
  """Consecutive token pairs, each as one string "w1 w2"."""
  return [f"{a} {b}" for a, b in zip(tokens, tokens[1:])]


def build_vocabulary(texts: Iterable[str], *, min_count: int, max_words: int, max_bigrams: int
                     ) -> DanVocabulary:
  """Words and bigrams of `texts` seen at least `min_count` times, most frequent first,
  at most `max_words` / `max_bigrams` ids (0 = no limit), `words.RESERVED` first in both."""
  word_counts, bigram_counts = collections.Counter(), collections.Counter()
  for text in texts:  # tokenised once for both vocabularies
    tokens = words.tokenize(text)
    word_counts.update(tokens)
    bigram_counts.update(bigrams(tokens))
  return DanVocabulary(
      words.vocabulary_from_counts(word_counts, min_count=min_count, max_size=max_words),
      words.vocabulary_from_counts(bigram_counts, min_count=min_count, max_size=max_bigrams))


class DAN(nnx.Module):
  """Word and bigram ids to one vector per sentence.

  Args:
    config: sizes (`DAN.Config`).
    rngs: initialisation.
    embeddings: [vocab_size, embed_dim] initial word vectors (`words.embedding_matrix`).
  """

  @dataclasses.dataclass(frozen=True)
  class Config:
    """vocab_size, bigram_size: table rows; embed_dim; hidden: the feed-forward widths
    (the last is the sentence vector's); activation: after every layer (ACTIVATIONS);
    dropout: on the averaged embedding and each hidden layer in training;
    freeze_embeddings: the word table stays as initialised."""
    vocab_size: int
    bigram_size: int
    embed_dim: int = 300
    hidden: tuple[int, ...] = (300, 300, 500)
    activation: str = "tanh"
    dropout: float = 0.0
    freeze_embeddings: bool = False

  def __init__(self, config: DAN.Config, *, rngs: nnx.Rngs, embeddings: np.ndarray | None = None):
    if config.activation not in ACTIVATIONS:
      raise ValueError(f"model.activation={config.activation!r}; one of {sorted(ACTIVATIONS)}")
    if not config.hidden:
      raise ValueError("model.hidden: at least one layer")
    self.config = config
    table = word_models.embedding_table
    self.words = table(config.vocab_size, config.embed_dim, frozen=config.freeze_embeddings,
                       rngs=rngs, embeddings=embeddings)
    self.bigrams = table(config.bigram_size, config.embed_dim, frozen=False, rngs=rngs,
                         embeddings=None)
    widths = (config.embed_dim, *config.hidden)
    self.layers = nnx.List([nnx.Linear(a, b, kernel_init=nnx.initializers.xavier_uniform(), rngs=rngs)
                            for a, b in zip(widths, widths[1:])])

  @property
  def dim(self) -> int:
    return self.config.hidden[-1]

  def __call__(self, word_ids: jax.Array, bigram_ids: jax.Array,
               dropout_key: jax.Array | None = None) -> jax.Array:
    """[n, L] int32 word ids and [n, L'] int32 bigram ids (0 = padding) -> [n, dim] float32."""
    word_mask = (word_ids > 0).astype(jnp.float32)
    bigram_mask = (bigram_ids > 0).astype(jnp.float32)
    total = (jnp.einsum("nl,nld->nd", word_mask, self.words[...][word_ids])
             + jnp.einsum("nl,nld->nd", bigram_mask, self.bigrams[...][bigram_ids]))
    count = jnp.sum(word_mask, axis=1) + jnp.sum(bigram_mask, axis=1)
    x = total / jnp.maximum(count, 1.0)[:, None]
    act = ACTIVATIONS[self.config.activation]
    keys = [None] * len(self.layers) if dropout_key is None else jax.random.split(dropout_key, len(self.layers))
    for layer, key in zip(self.layers, keys):
      if key is not None and self.config.dropout > 0:
        keep = jax.random.bernoulli(key, 1.0 - self.config.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - self.config.dropout), 0.0)
      x = act(layer(x))
    return x


class DanEncoder(word_models.WordTextEncoder):
  """A DAN as a text encoder (`evaluators.TextEncoder`): texts -> [n, dim] float32."""

  def __init__(self, model: DAN, vocabulary: DanVocabulary, *, max_length: int):
    super().__init__(model, lambda texts: vocabulary.inputs(texts, max_length))
    self.vocabulary, self.max_length = vocabulary, max_length


def text_inputs(built: Built, max_length: int) -> Callable[[Sequence[str]], dict]:
  """texts -> the DAN's keyword inputs (`DanVocabulary.inputs` at `max_length` words)."""
  return lambda texts: built.tokenizer.inputs(texts, max_length)


def text_encoder(built: Built, model: DAN, m: ml_collections.ConfigDict) -> DanEncoder:
  return DanEncoder(model, built.tokenizer, max_length=m.max_length)


def build(m: ml_collections.ConfigDict, *, seed: int, train_texts: Callable[[], Iterable[str]]) -> Built:
  """A random DAN as the `model` block says (embed_dim, hidden, activation, dropout,
  freeze_embeddings, vectors, min_count, max_vocab, max_bigrams), its vocabularies built
  from `train_texts()`. `hf_config` records the share of words found in `vectors`."""
  vocabulary = build_vocabulary(train_texts(), min_count=m.min_count, max_words=m.max_vocab,
                                max_bigrams=m.max_bigrams)
  table, found = words.embedding_matrix(vocabulary.words, dim=m.embed_dim, vectors=m.vectors or None,
                                        seed=seed)
  config = DAN.Config(vocab_size=len(vocabulary.words), bigram_size=len(vocabulary.bigrams),
                      embed_dim=m.embed_dim, hidden=tuple(m.hidden), activation=m.activation,
                      dropout=m.dropout, freeze_embeddings=m.freeze_embeddings)
  return Built(DAN(config, rngs=nnx.Rngs(seed), embeddings=table), tokenizer=vocabulary,
               hf_config={"words_in_vectors": found})


def save(built: Built, model: DAN, folder: str | os.PathLike, max_length: int) -> None:
  """Writes `dan.json` (the config and max_length), `vocab.txt`, `bigrams.txt`, `weights/` (an orbax checkpoint)."""
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  config = {**dataclasses.asdict(model.config), "max_length": max_length}
  (folder / CONFIG_FILE).write_text(json.dumps(config, indent=1))
  built.tokenizer.words.save(folder / "vocab.txt")
  built.tokenizer.bigrams.save(folder / "bigrams.txt")
  word_models.save_weights(model, folder)


def is_saved(path: str | os.PathLike) -> bool:
  """Whether `path` (or its `model/` folder: a finished run's workdir) holds a saved DAN."""
  return word_models.saved_folder(path, CONFIG_FILE) is not None


def load(path: str | os.PathLike) -> DanEncoder:
  """The DAN `save` wrote, as a text encoder; `path` is that folder or a run's workdir."""
  folder = word_models.saved_folder(path, CONFIG_FILE) or Path(path)
  fields = json.loads((folder / CONFIG_FILE).read_text())
  max_length = fields.pop("max_length")
  config = DAN.Config(**{**fields, "hidden": tuple(fields["hidden"])})
  model = word_models.load_weights(lambda: DAN(config, rngs=nnx.Rngs(0)), folder)
  vocabulary = DanVocabulary(words.Vocabulary.load(folder / "vocab.txt"),
                             words.Vocabulary.load(folder / "bigrams.txt"))
  return DanEncoder(model, vocabulary, max_length=max_length)


class BagOfVectors:
  """The bag-of-words baseline: the mean of a sentence's word vectors from a GloVe-format
  file (words the file lacks are left out; a sentence with none is the zero vector)."""

  def __init__(self, vectors: str | os.PathLike):
    self.path = Path(vectors)
    self._vectors: dict[str, np.ndarray] = {}

  def encode(self, texts: Sequence[str], *, batch_size: int = 32, normalize: bool | None = None
             ) -> np.ndarray:
    del batch_size
    tokens = [words.tokenize(t) for t in texts]
    vocabulary = words.Vocabulary((*words.RESERVED, *sorted({w for ts in tokens for w in ts}
                                                             - set(words.RESERVED))))
    table, found = words.read_vectors(self.path, vocabulary)
    out = np.zeros((len(texts), table.shape[1]), np.float32)
    for i, ts in enumerate(tokens):
      ids = [j for j in vocabulary.ids(ts) if found[j]]
      if ids:
        out[i] = table[ids].mean(axis=0)
    return np.asarray(l2_normalize(out)) if normalize else out
