"""The word-level recursive convolutional sentence encoder of seed 003 (its section 6).

Words (`data.words`) embedded by a table (GloVe, frozen by default, as the paper), the
recursive encoder of `recursive_conv` applied until one position is left, so the
sentence vector is one word vector wide. `model.bow`: "plus" adds the mean word vector of
the sentence (the paper's "+ BoW" ensemble x = v + u); "only" is that mean alone, the
paper's bag-of-words baseline, trained through the same heads. Padding (`model.padding`):

  balanced: the first `length` = 2^K words, balanced-padded to 2^K (the paper's best);
  right: the same width, words first;
  variable: each sentence padded to its own 2^ceil(log2 n) and read after that many
    recursions, as BRCA does; the rest of the row is masked out, so a sentence's vector
    does not depend on its batch.

With frozen vectors the vocabulary is every word of the vectors file (words the
training data never shows keep their meaning); otherwise it is built from the
training texts, as the DAN's. The convolutions would mix neighbouring sentences of a
packed row, so the model declares `Built.packs = False` and Stage 2 gives it one
sentence per row. `config.model.encoder = "conv_encoder"` in the input-response task
(NLI training) and in Stage 2; a finished run's `model/` folder is read back by `load`
(and by `build` when `model.init_from` names it).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax.data import words
from convfit_jax.models import Built, recursive_conv, word_models

PADDINGS = ("balanced", "right", "variable")
BOW = ("none", "plus", "only")


class ConvSentenceEncoder(nnx.Module):
  """Word ids to one vector per sentence.

  Args:
    config: `ConvSentenceEncoder.Config`.
    embeddings: [vocab_size, embed_dim] initial word vectors (`words.embedding_matrix`).
  """

  @dataclasses.dataclass(frozen=True)
  class Config:
    """vocab_size; embed_dim: the word vectors' and every conv's width; layers: N convs
    per group; length: 2^K positions, K recursions; padding: `PADDINGS`; bow: `BOW`;
    shared: one set of recursive weights (False: the static model);
    freeze_embeddings; momentum: BatchNorm's; zero_init: every residual block starts as
    the identity (`recursive_conv.ResidualBlock`), so the sentence vector starts at the
    word vectors' scale instead of growing with the 28 blocks of N = 8."""
    vocab_size: int
    embed_dim: int = 300
    layers: int = 8
    length: int = 64
    padding: str = "balanced"
    bow: str = "none"
    shared: bool = True
    freeze_embeddings: bool = True
    momentum: float = 0.9
    zero_init: bool = True

  def __init__(self, config: ConvSentenceEncoder.Config, *, rngs: nnx.Rngs,
               embeddings: np.ndarray | None = None):
    if config.padding not in PADDINGS:
      raise ValueError(f"model.padding={config.padding!r}; one of {PADDINGS}")
    if config.bow not in BOW:
      raise ValueError(f"model.bow={config.bow!r}; one of {BOW}")
    self.config = config
    self.recursions = recursive_conv.log2_positions(config.length, "model.length")
    self.embed = word_models.embedding_table(config.vocab_size, config.embed_dim,
                                             frozen=config.freeze_embeddings, rngs=rngs,
                                             embeddings=embeddings)
    self.encoder = recursive_conv.RecursiveEncoder(
        config.embed_dim, config.layers, self.recursions, shared=config.shared,
        momentum=config.momentum, zero_init=config.zero_init, rngs=rngs)

  @property
  def dim(self) -> int:
    return self.config.embed_dim

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               dropout_key: jax.Array | None = None, *, position_ids: jax.Array | None = None,
               slots: jax.Array | None = None) -> jax.Array:
    """Sentence vectors, one sentence per row (the `SentenceEncoder` call, unpacked).

    Args:
      input_ids: [rows, L] int32 word ids, real words first (the first `length` are read).
      attention_mask: [rows, L] int32, > 0 on real words.
      dropout_key, position_ids: unused (no dropout; one sentence per row).
      slots: [n, 2] int32 (row, 1) of the sentences to return.
    Returns:
      [rows, dim] float32, or [n, dim] with `slots`.
    """
    del dropout_key, position_ids
    c = self.config
    input_ids, attention_mask = input_ids[:, :c.length], attention_mask[:, :c.length]
    real = attention_mask > 0
    lengths = jnp.maximum(real.sum(axis=1), 1).astype(jnp.int32)
    ids = jnp.where(real, input_ids, 0)
    table = self.embed[...]
    if c.bow != "none":
      bow = jnp.einsum("nl,nld->nd", real.astype(table.dtype), table[ids]) / lengths[:, None]
    if c.bow == "only":
      x = bow
    elif c.padding == "variable":
      width = 1 << (max(ids.shape[1], 2) - 1).bit_length()
      depth = jnp.maximum(recursive_conv.ceil_log2(lengths), 1)
      placed = jnp.pad(ids, [(0, 0), (0, width - ids.shape[1])])
      x = self.encoder(table[placed], depth=depth)
    else:
      placed = recursive_conv.place(ids, lengths, c.length, c.padding, pad_id=0)
      x = self.encoder(table[placed])[:, 0]
    if c.bow == "plus":
      x = x + bow
    return x if slots is None else x[slots[:, 0]]


def inputs(vocabulary: words.Vocabulary, texts: Sequence[str], max_length: int
           ) -> dict[str, np.ndarray]:
  """texts -> {"input_ids", "attention_mask"} [n, L] int32: the first `max_length` words
  (`words.encode`: an empty text is one unknown word; L a bounded padded width)."""
  ids, lengths = words.encode(texts, vocabulary, max_length=max_length, keep="start")
  return {"input_ids": ids,
          "attention_mask": (np.arange(ids.shape[1])[None, :] < lengths[:, None]).astype(np.int32)}


class ConvTextEncoder(word_models.WordTextEncoder):
  """A `ConvSentenceEncoder` as a text encoder (`evaluators.TextEncoder`, Stage 2's
  `encoder`): texts -> [n, dim] float32, in eval mode (BatchNorm's running statistics)."""

  def __init__(self, model: ConvSentenceEncoder, vocabulary: words.Vocabulary, *,
               max_length: int):
    self.vocabulary = vocabulary
    self.max_length = min(max_length, model.config.length)
    super().__init__(model, lambda texts: inputs(vocabulary, texts, self.max_length))

  def save_pretrained(self, folder: str | os.PathLike) -> str:
    """Writes `word_model.json`, `vocab.txt` and `weights/` (an orbax checkpoint: BatchNorm statistics and
    frozen vectors included); `load` reads them."""
    word_models.save(Built(self.model, tokenizer=self.vocabulary), self.model, folder)
    return str(folder)


def is_saved(path: str | os.PathLike) -> bool:
  """Whether `path` (or its `model/` folder: a finished run's workdir) holds a saved encoder."""
  folder = word_models.saved_folder(path)
  return folder is not None and word_models.saved_class(folder) == ConvSentenceEncoder.__name__


def load_built(path: str | os.PathLike) -> Built:
  """The encoder and vocabulary `ConvTextEncoder.save_pretrained` wrote (a folder or a run's workdir)."""
  built = word_models.load(ConvSentenceEncoder, word_models.saved_folder(path) or Path(path))
  built.model.eval()  # BatchNorm's running statistics; training sets its own mode
  built.packs = False
  return built


def load(path: str | os.PathLike, max_length: int = 0) -> ConvTextEncoder:
  """`load_built` as a text encoder (`max_length` 0: the model's length)."""
  built = load_built(path)
  return ConvTextEncoder(built.model, built.tokenizer,
                         max_length=max_length or built.model.config.length)


def build(m: ml_collections.ConfigDict, *, seed: int,
          train_texts: Callable[[], Iterable[str]] | None = None) -> Built:
  """The encoder the `model` block says: a saved one when `init_from` names it, else a
  fresh one (embed_dim, layers, length, padding, bow, shared, freeze_embeddings,
  momentum; vectors, min_count, max_vocab for the vocabulary)."""
  if m.get("init_from") and is_saved(m.init_from):
    return load_built(m.init_from)
  if m.vectors and m.freeze_embeddings:
    vocabulary = words.Vocabulary((*words.RESERVED, *words.vector_words(m.vectors)))
  else:
    if train_texts is None:
      raise ValueError("model.vectors is unset or trainable: the vocabulary needs the training texts")
    vocabulary = words.build_vocabulary(train_texts(), min_count=m.min_count, max_size=m.max_vocab)
  table, found = words.embedding_matrix(vocabulary, dim=m.embed_dim, vectors=m.vectors or None,
                                        seed=seed)
  fields = [f.name for f in dataclasses.fields(ConvSentenceEncoder.Config) if f.name != "vocab_size"]
  config = ConvSentenceEncoder.Config(vocab_size=len(vocabulary), **{f: m[f] for f in fields})
  return Built(ConvSentenceEncoder(config, rngs=nnx.Rngs(seed), embeddings=table),
               tokenizer=vocabulary, hf_config={"words_in_vectors": found}, packs=False)


def text_inputs(built: Built, max_length: int) -> Callable[[Sequence[str]], dict]:
  """texts -> the encoder's keyword inputs (`inputs`; the model reads at most its length)."""
  return lambda texts: inputs(built.tokenizer, texts, max_length)


def text_encoder(built: Built, model: ConvSentenceEncoder, m: ml_collections.ConfigDict
                 ) -> ConvTextEncoder:
  return ConvTextEncoder(model, built.tokenizer, max_length=m.max_length)
