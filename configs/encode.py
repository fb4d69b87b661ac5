"""Encode a text file: `python -m convfit_jax.main --config=configs/encode.py
--config.input=texts.txt --config.output=emb.npy`."""

import ml_collections


def get_config(arg=None):
  del arg
  c = ml_collections.ConfigDict()
  c.task = "encode"
  c.model = "sentence-transformers/all-MiniLM-L6-v2"  # folder, hub id, or the packaged MiniLM
  c.input = ""  # UTF-8 text file, one text per line
  c.output = ""  # .npy, float32 [lines, dim]
  c.batch_size = 128
  c.max_length = 0  # 0: the checkpoint's max_seq_length
  c.normalize = True  # L2-normalise rows (cosine similarity = dot product)
  c.dtype = "float32"  # compute dtype; bfloat16 on accelerators
  return c
