"""Task `encode`: one text per line in, a float32 .npy with row i for line i out."""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from convfit_jax.encoder import Encoder


def read_lines(path: str | Path) -> list[str]:
  """Lines of a UTF-8 file without their line ends; an invalid byte names the line."""
  raw = Path(path).read_bytes()
  lines = raw.split(b"\n")
  if lines and lines[-1] == b"":
    lines.pop()
  out = []
  for i, line in enumerate(lines, start=1):
    try:
      out.append(line.rstrip(b"\r").decode("utf-8"))
    except UnicodeDecodeError as e:
      raise ValueError(f"{path}:{i}: invalid UTF-8 at byte {e.start}") from e
  return out


def train_and_evaluate(config: ml_collections.ConfigDict) -> np.ndarray:
  """Encodes `config.input` with `config.model` and writes `config.output`."""
  if not config.input or not config.output:
    raise ValueError("encode needs --config.input=texts.txt and --config.output=emb.npy")
  texts = read_lines(config.input)
  enc = Encoder.from_pretrained(config.model, dtype=jnp.dtype(config.dtype),
                                max_length=config.max_length or None)
  emb = enc.encode(texts, batch_size=config.batch_size, normalize=config.normalize)
  out = Path(config.output)
  out.parent.mkdir(parents=True, exist_ok=True)
  tmp = out.with_name(out.name + ".tmp.npy")
  np.save(tmp, emb)
  tmp.replace(out)
  logging.info("wrote %s %s to %s", emb.shape, emb.dtype, out)
  return emb
