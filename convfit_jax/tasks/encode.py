"""Task `encode`: one text per line in, a float32 .npy with row i for line i out."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from convfit_jax.atomic_files import save_npy
from convfit_jax.data.readers import decoded_lines
from convfit_jax.encoder import Encoder


def run(config: ml_collections.ConfigDict) -> np.ndarray:
  """Encodes `config.input` with `config.model` and writes `config.output`."""
  if not config.input or not config.output:
    raise ValueError("encode needs --config.input=texts.txt and --config.output=emb.npy")
  texts = [line for _, line in decoded_lines(Path(config.input))]
  enc = Encoder.from_pretrained(config.model, dtype=jnp.dtype(config.dtype),
                                max_length=config.max_length or None)
  emb = enc.encode(texts, batch_size=config.batch_size, normalize=config.normalize)
  save_npy(config.output, emb)
  logging.info("wrote %s %s to %s", emb.shape, emb.dtype, config.output)
  return emb
