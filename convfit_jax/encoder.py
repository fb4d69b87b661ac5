"""`Encoder`: texts in, sentence vectors out, for any HF BERT/RoBERTa checkpoint.

    enc = Encoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")
    emb = enc.encode(["how do I top up my card?"], normalize=True)   # [1, 384] float32
    enc.save_pretrained("out/")   # loads in transformers and sentence-transformers

Texts are packed several to a row as in training (`data.packing`: each token
attends to its own sentence, positions restart per sentence), so no compute goes to
padding and every vector equals the one the text gets alone, to float rounding.
All rows of a call have the width of the smallest bucket (powers of two up to
`max_length`, and `max_length`) that holds the longest text; row counts are 2^k and
3 * 2^(k-1) and sentence counts powers of two, so XLA compiles a bounded number of shapes
however many texts come in. Vectors come back in input order. A server fixes the sentence
count too (`compile`), so only widths x row counts remain, all compiled before the first
request.
"""

from __future__ import annotations

import functools
import os
import sys
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from convfit_jax import hf_io
from convfit_jax.data import packing
from convfit_jax.models import sentence
from convfit_jax.models.heads import l2_normalize
from convfit_jax.models.sentence import SentenceEncoder, flat_params
from convfit_jax.tokenization import bucket, bucket_widths, check_texts, load_tokenizer


def _powers_of_two(limit: int) -> list[int]:
  """1, 2, 4, ... below `limit`, then `limit`."""
  return [1 << k for k in range(max(limit - 1, 0).bit_length()) if 1 << k < limit] + [limit]


def _row_counts(limit: int) -> list[int]:
  """1, 2, 3, 4, 6, 8, 12, ...: 2^k and 3 * 2^(k-1) below `limit`, then `limit`. A call of
  a few texts (a server's batch) pads to at most a third more rows, not up to twice as many:
  16 banking77 texts fill 83% of their rows' tokens against 73% with powers of two."""
  return sorted({c for p in _powers_of_two(limit) for c in (p, 3 * p // 2) if c < limit}
                | {limit})


class _Architecture:
  """A model's GraphDef as jit's static argument, hashed once: hashing a Transformer's
  GraphDef takes about a millisecond, which a one-text call would pay every time."""

  def __init__(self, graphdef: nnx.GraphDef):
    self.graphdef = graphdef
    self._hash = hash(graphdef)

  def __hash__(self) -> int:
    return self._hash

  def __eq__(self, other) -> bool:
    return self is other or (isinstance(other, _Architecture) and self._hash == other._hash
                             and self.graphdef == other.graphdef)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _embed(arch: _Architecture, normalize: bool, state: nnx.State, ids: jax.Array,
           segments: jax.Array, positions: jax.Array, slots: jax.Array) -> jax.Array:
  """Packed rows ([rows, width] int32 ids, segments, positions; [n, 2] int32 slots) ->
  [n, dim] float32, in eval mode. One compiled program per (architecture, shape),
  shared by every `Encoder` of that architecture."""
  emb = nnx.merge(arch.graphdef, state)(ids, segments, position_ids=positions, slots=slots)
  return l2_normalize(emb) if normalize else emb


class Encoder:
  """A sentence encoder with its tokenizer.

  Args:
    model: the network (Transformer, pooling, optional projection).
    tokenizer: a transformers fast tokenizer.
    max_length: truncation length in tokens, special tokens included.
    normalize: default of `encode(normalize=None)`; True for checkpoints whose
      sentence-transformers pipeline ends in Normalize.
    hf_config: the checkpoint's config.json dict, written back by `save_pretrained`.
  """

  def __init__(self, model: SentenceEncoder, tokenizer, *, max_length: int = 128,
               normalize: bool = False, hf_config: dict[str, Any] | None = None):
    limit = model.config.max_tokens
    if not 1 < max_length <= limit:
      raise ValueError(f"max_length must be in [2, {limit}] for this model, got {max_length}")
    self.model = model
    self.tokenizer = tokenizer
    self.max_length = max_length
    self.normalize = normalize
    self.hf_config = dict(hf_config or {"model_type": model.config.model_type})
    self._arch = _Architecture(nnx.graphdef(model))
    # The model's Variables, not copies of their values: an update to the model (nnx.update,
    # an optimizer) shows here, and a call does not walk the graph again (3 ms for MiniLM).
    self._state = nnx.state(model)
    self._warned_truncation = False
    self._slots: int | None = None  # fixed sentences per call (`compile`); None: by call

  @classmethod
  def from_pretrained(cls, name_or_path: str | os.PathLike, *, dtype=jnp.float32,
                      max_length: int | None = None, remat: bool = False) -> "Encoder":
    """Loads a folder, hub id, or "sentence-transformers/all-MiniLM-L6-v2".

    Pooling, projection and normalisation follow the checkpoint's sentence-transformers
    modules (mean pooling for a plain HF folder). `max_length` defaults to the
    checkpoint's max_seq_length, else 128 (at most what the position table holds).
    """
    model, ck = sentence.load(name_or_path, dtype=dtype, remat=remat)
    return cls(model, load_tokenizer(ck.tokenizer_dir),
               max_length=max_length or min(ck.max_seq_length or 128, ck.config.max_tokens),
               normalize=ck.normalize, hf_config=ck.hf_config)

  @property
  def dim(self) -> int:
    return self.model.dim

  @property
  def dtype(self) -> str:
    """The compute dtype's name ("float32", "bfloat16"); parameters are float32."""
    return jnp.dtype(self.model.transformer.embeddings.layer_norm.dtype or jnp.float32).name

  def compile(self, slots: int, *, batch_size: int = 32, normalize: bool | None = None) -> int:
    """Fixes every later call at `slots` sentences (at most that many texts per `encode`
    call) and compiles each shape those calls can take (every width bucket x every row
    count up to `batch_size`), so none is compiled while a caller waits. Returns the count."""
    if slots < 1:
      raise ValueError(f"slots must be >= 1, got {slots}")
    normalize = self.normalize if normalize is None else normalize
    self._slots = slots
    shapes = [(rows, width) for width in bucket_widths(self.max_length)
              for rows in _row_counts(batch_size)]
    for rows, width in shapes:
      ids = np.zeros((rows, width), np.int32)
      # One one-token sentence, so no row is all padding (its output is discarded anyway).
      segments = ids.copy()
      segments[:, 0] = 1
      _embed(self._arch, normalize, self._state, ids, segments, ids,
             np.zeros((slots, 2), np.int32)).block_until_ready()
    return len(shapes)

  def encode(self, texts: Sequence[str], *, batch_size: int = 32, normalize: bool | None = None,
             show_progress: bool | None = None) -> np.ndarray:
    """Encodes texts.

    Args:
      texts: n strings; an empty string is encoded (special tokens only).
      batch_size: packed rows per device call (2^k or 3 * 2^(k-1) of them for small
        inputs); each row holds one or more texts. 16-32 rows encode fastest on a
        2-core CPU (about 1,500 tokens a call); larger calls pay on accelerators.
      normalize: L2-normalise rows; defaults to the checkpoint's choice.
      show_progress: tqdm bar; by default on when stderr is a terminal and n > batch_size.
    Returns:
      [n, dim] float32, row i for texts[i].
    """
    texts = check_texts(texts)
    if self._slots is not None and len(texts) > self._slots:
      raise ValueError(f"{len(texts)} texts in one call; this encoder was compiled for at most "
                       f"{self._slots} (Encoder.compile)")
    normalize = self.normalize if normalize is None else normalize
    out = np.zeros((len(texts), self.dim), np.float32)
    if not texts:
      return out
    tokenized = self.tokenizer(texts, truncation=True, max_length=self.max_length,
                               return_attention_mask=False, return_token_type_ids=False)
    enc = tokenized["input_ids"]
    self._warn_truncation(tokenized, len(texts))
    lengths = np.fromiter((len(x) for x in enc), np.int64, len(enc))
    # One width for the whole input, the smallest bucket that holds its longest text;
    # first-fit decreasing over all texts leaves little of it unused.
    width = bucket(int(lengths.max()), bucket_widths(self.max_length))
    placed = packing.place(lengths, width)
    row_counts = _row_counts(batch_size)
    if show_progress is None:
      show_progress = sys.stderr.isatty() and len(texts) > batch_size
    pending = []
    with tqdm(total=len(texts), disable=not show_progress, desc="encode", unit="text") as bar:
      for idx, where in packing.calls(placed, batch_size):
        rows = bucket(int(where[:, 0].max()) + 1, row_counts)
        batch = packing.fill([enc[i] for i in idx], where, rows, width)
        # Unused slots pool row 0's padding (a zero vector) and are dropped.
        slots = np.zeros((self._slots or bucket(len(idx), _powers_of_two(rows * width)), 2),
                         np.int32)
        slots[:len(idx)] = batch.slots
        # Dispatch is asynchronous: the host packs the next call while this one runs.
        pending.append((idx, _embed(self._arch, normalize, self._state, batch.input_ids,
                                    batch.segment_ids, batch.position_ids, slots)))
        bar.update(len(idx))
      for idx, emb in pending:
        # Sliced on the host: a slice on the device would be one more dispatch a call.
        out[idx] = np.asarray(emb, np.float32)[:len(idx)]
    return out

  def _warn_truncation(self, tokenized, n: int) -> None:
    """Says once per encoder that texts were cut at max_length (fast tokenizers keep what
    truncation removed as `overflowing`)."""
    if self._warned_truncation or tokenized.encodings is None:
      return
    cut = sum(1 for e in tokenized.encodings if e.overflowing)
    if cut:
      self._warned_truncation = True
      warnings.warn(f"{cut} of {n} texts are longer than max_length={self.max_length} tokens "
                    "and were truncated (said once per encoder)", stacklevel=3)

  def save_pretrained(self, folder: str | os.PathLike) -> str:
    """Writes an HF + sentence-transformers folder (weights in float32)."""
    params = flat_params(self.model)
    prefix = "transformer."
    projection = None
    if self.model.projection is not None:
      projection = {"kernel": params["projection.dense.kernel"], "bias": params["projection.dense.bias"]}
    path = hf_io.save(
        folder, config=self.model.config, hf_config=self.hf_config,
        transformer={k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)},
        tokenizer=self.tokenizer, pooling=self.model.pooling, normalize=self.normalize,
        projection=projection, max_seq_length=self.max_length)
    return str(path)
