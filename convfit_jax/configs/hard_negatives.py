"""Training pairs for a reranker with negatives a dual encoder retrieves (task `hard_negatives`).

  python -m convfit_jax.main --config=configs/hard_negatives.py:retriever=workdirs/stage1_ubuntu
  python -m convfit_jax.main --config=configs/rerank_cross.py --config.data.train=workdirs/hard_negatives/train.tsv
  python -m convfit_jax.main --config=configs/hard_negatives.py:runlocal   # a smoke run

The retriever (off-the-shelf all-MiniLM-L6-v2 by default, or a Stage 1 workdir, as in
`configs/retrieve_rerank.py`) ranks every true response of ubuntu_irc's training pairs for
each context; per context the written train.tsv holds its true response, `negatives` drawn
from the retriever's top 100 (its own excluded) and the file's random negative, so a
reranker trained on it meets what it reranks (`tasks/hard_negatives.py`).
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common
from convfit_jax.configs.rerank_esim import UBUNTU


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/hard_negatives.py", retriever=common.MINILM, negatives=1,
                       workdir="", runlocal=False)
  c = ml_collections.ConfigDict()
  c.task = "hard_negatives"
  c.workdir = a.workdir or "workdirs/hard_negatives"
  c.seed = 0  # the draws (and the context sample with data.max_contexts)

  c.retriever = common.model_config(a.retriever)  # a folder, hub id or Stage 1/2 workdir
  c.retriever.max_length = 64

  c.data = ml_collections.ConfigDict()
  c.data.train = f"{UBUNTU}/train.tsv"  # labelled pairs: history, response, label
  c.data.max_contexts = 0  # > 0: a seeded sample of the true rows (contexts)

  c.mine = ml_collections.ConfigDict()
  c.mine.negatives = a.negatives  # retrieved negatives per context
  c.mine.skip = 0  # top ranks passed over (near-copies of the true response)
  c.mine.depth = 100  # negatives are drawn from the next this many ranks
  c.mine.keep_random = True  # also write the file's random negatives
  c.mine.query = "context"  # context (the last turn, as Stage 1 trains) | history
  c.mine.batch_size = 64  # sentences per encoder call
  c.mine.chunk = 1024  # queries scored against the pool at once (memory: chunk x pool)

  if a.runlocal:
    c.workdir = a.workdir or "workdirs/hard_negatives_runlocal"
    c.data.max_contexts = 1000
  return c
