"""Encode a text file: `python -m convfit_jax.main --config=configs/encode.py
--config.input=texts.txt --config.output=emb.npy`."""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  common.parse_arg(arg, "configs/encode.py")
  c = ml_collections.ConfigDict()
  c.task = "encode"
  c.model = common.MINILM  # folder, hub id, or the packaged MiniLM
  c.input = ""  # UTF-8 text file, one text per line
  c.output = ""  # .npy, float32 [lines, dim]
  c.batch_size = 32  # packed rows per device call, each holding one or more texts
  c.max_length = 0  # 0: the checkpoint's max_seq_length
  c.normalize = True  # L2-normalise rows (cosine similarity = dot product)
  c.dtype = "float32"  # compute dtype; bfloat16 on accelerators
  return c
