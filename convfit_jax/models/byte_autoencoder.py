"""The byte-level recursive convolutional auto-encoder of seed 003 (its section 4).

A sentence's UTF-8 bytes and an end-of-sequence token, placed in 2^K positions
(`recursive_conv.place`: balanced or right padding), embedded (d), encoded by the
prefix group and K - r recursions to a latent of 2^r positions x d channels (d * 2^r
floats), decoded by K - r expand recursions and the postfix group back to 2^K
positions, each a softmax over the 256 bytes, end-of-sequence and padding. The
d channels cannot hold 258 classes, so a per-position linear map (a kernel-1 conv,
the same at every position) gives the logits; the paper's finding against an output
*embedding* layer tied to the input is about a different layer.

`config.model.name = "byte_autoencoder"` (`configs/byte_autoencoder.py`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax.models import Built, recursive_conv, word_models
from convfit_jax.models.heads import l2_normalize

EOS, PAD = 256, 257
CLASSES = 258


def byte_rows(texts: Sequence[str], width: int) -> tuple[np.ndarray, np.ndarray]:
  """Texts as model inputs: UTF-8 bytes then EOS, right-padded with PAD.

  Returns:
    ([n, width] int32 ids, [n] int32 lengths, EOS included).
  Raises:
    ValueError naming the text whose bytes and EOS do not fit `width` (`fits`).
  """
  ids = np.full((len(texts), width), PAD, np.int32)
  lengths = np.zeros(len(texts), np.int32)
  for i, text in enumerate(texts):
    data = text.encode("utf-8")
    if len(data) + 1 > width:
      raise ValueError(f"text {i} has {len(data)} bytes; with EOS at most {width} fit")
    ids[i, :len(data)] = np.frombuffer(data, np.uint8)
    ids[i, len(data)] = EOS
    lengths[i] = len(data) + 1
  return ids, lengths


def fits(text: str, width: int) -> bool:
  """Whether `text`'s bytes and EOS fit in `width` positions."""
  return len(text.encode("utf-8")) < width


def decode(predicted: np.ndarray) -> str:
  """One row of predicted ids in placed order -> text: padding skipped, cut at the first
  EOS, bytes read as UTF-8 (invalid sequences replaced)."""
  out = bytearray()
  for b in np.asarray(predicted).tolist():
    if b == EOS:
      break
    if b < 256:
      out.append(b)
  return out.decode("utf-8", errors="replace")


class ByteAutoencoder(nnx.Module):
  """Bytes -> latent -> byte logits.

  Args:
    config: `ByteAutoencoder.Config`.
  """

  @dataclasses.dataclass(frozen=True)
  class Config:
    """d: channels; layers: N convs per group; length: 2^K positions; latent_positions:
    2^r (the latent has d * 2^r floats); padding: "balanced" or "right"; shared: one set
    of recursive weights (False: the static model); momentum: BatchNorm's;
    norm_per_recursion: BatchNorm statistics per recursion (the paper's; False: one set
    for every depth)."""
    d: int = 256
    layers: int = 8
    length: int = 1024
    latent_positions: int = 4
    padding: str = "balanced"
    shared: bool = True
    momentum: float = 0.9
    norm_per_recursion: bool = True

  def __init__(self, config: ByteAutoencoder.Config, *, rngs: nnx.Rngs):
    if config.padding not in recursive_conv.PADDINGS:
      raise ValueError(f"model.padding={config.padding!r}; one of {recursive_conv.PADDINGS}")
    k = recursive_conv.log2_positions(config.length, "model.length")
    r = recursive_conv.log2_positions(config.latent_positions, "model.latent_positions")
    if r > k:
      raise ValueError(f"model.latent_positions={config.latent_positions} > model.length={config.length}")
    self.config = config
    kw = dict(shared=config.shared, momentum=config.momentum,
              norm_per_recursion=config.norm_per_recursion, rngs=rngs)
    self.embed = nnx.Embed(CLASSES, config.d, rngs=rngs)
    self.encoder = recursive_conv.RecursiveEncoder(config.d, config.layers, k - r, **kw)
    self.decoder = recursive_conv.RecursiveDecoder(config.d, config.layers, k - r, **kw)
    self.output = nnx.Linear(config.d, CLASSES, rngs=rngs)

  @property
  def latent_dim(self) -> int:
    return self.config.d * self.config.latent_positions

  def place(self, ids: jax.Array, lengths: jax.Array) -> jax.Array:
    """[n, L] right-padded ids, [n] lengths -> [n, length] int32 as the model reads them
    (and is asked to reproduce them)."""
    return recursive_conv.place(ids, lengths, self.config.length, self.config.padding, pad_id=PAD)

  def encode(self, placed: jax.Array) -> jax.Array:
    """[n, length] int32 placed ids -> [n, latent_positions, d] float32."""
    return self.encoder(self.embed(placed))

  def decode(self, latent: jax.Array) -> jax.Array:
    """[n, latent_positions, d] -> [n, length, CLASSES] float32 logits."""
    return self.output(self.decoder(latent))

  def __call__(self, ids: jax.Array, lengths: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[n, L] ids (`byte_rows`), [n] lengths -> (logits [n, length, CLASSES], the placed
    targets [n, length] int32)."""
    placed = self.place(ids, lengths)
    return self.decode(self.encode(placed)), placed


def build(m: ml_collections.ConfigDict, *, seed: int) -> Built:
  """A random auto-encoder of the `model` block's fields (`ByteAutoencoder.Config`)."""
  fields = [f.name for f in dataclasses.fields(ByteAutoencoder.Config)]
  return Built(ByteAutoencoder(ByteAutoencoder.Config(**{f: m[f] for f in fields}),
                               rngs=nnx.Rngs(seed)), packs=False)


def token_errors(logits: jax.Array, placed: jax.Array) -> tuple[jax.Array, jax.Array]:
  """Per sentence: wrong predictions at its bytes and EOS, and how many those are.

  Returns:
    ([n] int32 errors, [n] int32 positions scored); padding positions are not scored.
  """
  real = placed != PAD
  wrong = (jnp.argmax(logits, axis=-1) != placed) & real
  return wrong.sum(axis=1).astype(jnp.int32), real.sum(axis=1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnums=0)
def _predict(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, lengths: jax.Array
             ) -> tuple[jax.Array, jax.Array]:
  model = nnx.merge(graphdef, state)
  logits, placed = model(ids, lengths)
  return jnp.argmax(logits, axis=-1).astype(jnp.int32), placed


class Reconstructor:
  """An auto-encoder in eval mode as the byte-error evaluator reads it (`evaluators.byte_error`)."""

  def __init__(self, model: ByteAutoencoder):
    self.graphdef, self.state = nnx.split(model)
    self.length = model.config.length

  def predict(self, texts: Sequence[str], *, batch_size: int = 32) -> tuple[np.ndarray, np.ndarray]:
    """([n, length] int32 predicted ids, [n, length] int32 placed inputs), in calls of
    `batch_size` (the last padded with empty texts: one compiled shape)."""
    preds = np.zeros((len(texts), self.length), np.int32)
    placed = np.zeros_like(preds)
    for start in range(0, len(texts), batch_size):
      chunk = list(texts[start:start + batch_size])
      ids, lengths = byte_rows(chunk + [""] * (batch_size - len(chunk)), self.length)
      p, x = _predict(self.graphdef, self.state, ids, lengths)
      preds[start:start + len(chunk)] = np.asarray(p)[:len(chunk)]
      placed[start:start + len(chunk)] = np.asarray(x)[:len(chunk)]
    return preds, placed


@functools.partial(jax.jit, static_argnums=(0, 1))
def _latent(graphdef: nnx.GraphDef, normalize: bool, state: nnx.State, ids: jax.Array,
            lengths: jax.Array) -> jax.Array:
  model = nnx.merge(graphdef, state)
  z = model.encode(model.place(ids, lengths))
  z = z.reshape(z.shape[0], -1)
  return l2_normalize(z) if normalize else z


class ByteTextEncoder:
  """The auto-encoder's latent (d * 2^r floats) as a sentence vector (`evaluators.TextEncoder`),
  for the k-NN, STS and response-selection evaluators; a text's bytes past the model's
  positions are cut at a character boundary."""

  def __init__(self, model: ByteAutoencoder):
    self.graphdef, self.state = nnx.split(model)
    self.length = model.config.length
    self.dim = model.latent_dim

  def encode(self, texts: Sequence[str], *, batch_size: int = 32, normalize: bool | None = None
             ) -> np.ndarray:
    out = np.zeros((len(texts), self.dim), np.float32)
    for start in range(0, len(texts), batch_size):
      chunk = [t.encode("utf-8")[:self.length - 1].decode("utf-8", errors="ignore")
               for t in texts[start:start + batch_size]]
      ids, lengths = byte_rows(chunk + [""] * (batch_size - len(chunk)), self.length)
      out[start:start + len(chunk)] = np.asarray(
          _latent(self.graphdef, bool(normalize), self.state, ids, lengths))[:len(chunk)]
    return out


CONFIG_FILE = "byte_autoencoder.json"


def is_saved(path: str | os.PathLike) -> bool:
  """Whether `path` (or its `model/` folder: a finished run's workdir) holds a saved auto-encoder."""
  return word_models.saved_folder(path, CONFIG_FILE) is not None


def save(model: ByteAutoencoder, folder: str | os.PathLike) -> None:
  """Writes `byte_autoencoder.json` (the config) and `weights/` (an orbax checkpoint, BatchNorm statistics included)."""
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  (folder / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(model.config), indent=1))
  word_models.save_weights(model, folder)


def load(path: str | os.PathLike) -> ByteAutoencoder:
  """The auto-encoder `save` wrote; `path` is that folder or a finished run's workdir."""
  folder = word_models.saved_folder(path, CONFIG_FILE) or Path(path)
  config = ByteAutoencoder.Config(**json.loads((folder / CONFIG_FILE).read_text()))
  model = word_models.load_weights(lambda: ByteAutoencoder(config, rngs=nnx.Rngs(0)), folder)
  model.eval()
  return model
