"""BERT-style cross-encoder reranker for multi-turn response selection, on ubuntu_irc.

  python -m convfit_jax.main --config=configs/rerank_cross.py
  python -m convfit_jax.main --config=configs/rerank_cross.py:init_from=sentence-transformers/all-mpnet-base-v2
  python -m convfit_jax.main --config=configs/rerank_cross.py:runlocal   # a few-minute smoke run

The paper's BERT fine-tuning (Chen & Wang 2019, section 5): pair input of at most 128
tokens, batch 32, Adam at 2e-5 (their grid 1e-5..5e-5), dropout 0.1, 2 epochs on Ubuntu,
here from all-MiniLM-L6-v2 (the embedded default; any BERT/RoBERTa/MPNet checkpoint by
`init_from`). The response keeps its first 32 tokens, the context the last that fit.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common
from convfit_jax.configs.rerank_esim import UBUNTU, rerank_evals, shrink_for_runlocal


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/rerank_cross.py", init_from=common.MINILM, runlocal=False)
  c = ml_collections.ConfigDict()
  c.task = "rerank"
  c.workdir = "workdirs/rerank_cross"  # relative to the current directory
  c.seed = 0

  c.model = common.model_config(a.init_from, name="cross_encoder")
  c.model.max_length = 128  # tokens of the pair, special tokens included
  c.model.max_response = 32  # tokens of the response, its first ones

  c.data = ml_collections.ConfigDict()
  c.data.train = f"{UBUNTU}/train.tsv"  # history \t response \t label (1 true, 0 random)
  c.data.max_rows = 0  # > 0: a seeded subset of this many rows
  c.data.prefetch = 2  # batches prepared ahead in a background thread

  c.train = common.train_config(learning_rate=2e-5, log_every=20, checkpoint_every=500)
  c.train.batch_size = 32
  c.train.epochs = 2

  rerank_evals(c, every=1000)
  common.mesh_and_distributed(c)
  if a.runlocal:
    c.workdir = "workdirs/rerank_cross_runlocal"
    c.model.max_length = 64
    c.model.max_response = 16
    shrink_for_runlocal(c)
  c.lock()
  return c
