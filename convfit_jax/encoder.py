"""`Encoder`: texts in, sentence vectors out, for any HF BERT/RoBERTa checkpoint.

    enc = Encoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")
    emb = enc.encode(["how do I top up my card?"], normalize=True)   # [1, 384] float32
    enc.save_pretrained("out/")   # loads in transformers and sentence-transformers

Batches are padded to one of a few fixed widths (powers of two up to
`max_length`, and `max_length`) and a few fixed row counts, so XLA compiles a
bounded number of shapes however many texts come in. Texts are sorted by length
before batching (short texts are not padded to long ones) and returned in input order.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from convfit_jax import hf_io
from convfit_jax.models import sentence
from convfit_jax.models.heads import l2_normalize
from convfit_jax.models.sentence import SentenceEncoder, flat_params
from convfit_jax.tokenization import bucket, bucket_widths, check_texts, load_tokenizer

@functools.partial(jax.jit, static_argnums=0)
def _embed(graphdef: nnx.GraphDef, state: nnx.State, ids: jax.Array, mask: jax.Array) -> jax.Array:
  """[rows, width] int32 ids and mask -> [rows, dim] float32, in eval mode. One compiled
  program per (architecture, shape), shared by every `Encoder` of that architecture."""
  return nnx.merge(graphdef, state)(ids, mask)


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
    self._graphdef = nnx.graphdef(model)

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

  def encode(self, texts: Sequence[str], *, batch_size: int = 128, normalize: bool | None = None,
             show_progress: bool | None = None) -> np.ndarray:
    """Encodes texts.

    Args:
      texts: n strings; an empty string is encoded (special tokens only).
      batch_size: rows per device call (rounded to a power of two for small inputs).
      normalize: L2-normalise rows; defaults to the checkpoint's choice.
      show_progress: tqdm bar; by default on when stderr is a terminal and n > batch_size.
    Returns:
      [n, dim] float32, row i for texts[i].
    """
    texts = check_texts(texts)
    normalize = self.normalize if normalize is None else normalize
    out = np.zeros((len(texts), self.dim), np.float32)
    if not texts:
      return out
    enc = self.tokenizer(texts, truncation=True, max_length=self.max_length,
                         return_attention_mask=False, return_token_type_ids=False)["input_ids"]
    lengths = np.fromiter((len(x) for x in enc), np.int64, len(enc))
    order = np.argsort(-lengths, kind="stable")
    widths = bucket_widths(self.max_length)
    rows = [r for r in (1, 2, 4, 8, 16, 32, 64) if r < batch_size] + [batch_size]
    pad_id = self.tokenizer.pad_token_id or 0
    if show_progress is None:
      show_progress = sys.stderr.isatty() and len(texts) > batch_size
    state = nnx.state(self.model)  # read per call: training may have updated the model
    for start in tqdm(range(0, len(texts), batch_size), disable=not show_progress, desc="encode",
                      unit="batch"):
      idx = order[start:start + batch_size]
      width = bucket(int(lengths[idx].max()), widths)
      n_rows = bucket(len(idx), rows)
      ids = np.full((n_rows, width), pad_id, np.int32)
      mask = np.zeros((n_rows, width), np.int32)
      for r, i in enumerate(idx):
        ids[r, :lengths[i]] = enc[i]
        mask[r, :lengths[i]] = 1
      emb = _embed(self._graphdef, state, ids, mask)
      if normalize:
        emb = l2_normalize(emb)
      out[idx] = np.asarray(emb[:len(idx)], np.float32)
    return out

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
