"""Retrieve-then-rerank over a pool of responses (Chen & Wang 2019's pipeline).

  python -m convfit_jax.main --config=configs/retrieve_rerank.py:reranker=workdirs/rerank_esim
  python -m convfit_jax.main --config=configs/retrieve_rerank.py:retriever=workdirs/stage1_ubuntu,reranker=workdirs/rerank_cross
  python -m convfit_jax.main --config=configs/retrieve_rerank.py   # retrieval alone

The retriever is any sentence encoder (off-the-shelf all-MiniLM-L6-v2 by default, or a
Stage 1 workdir); the reranker a finished `configs/rerank_*.py` run. The pool is every
distinct candidate of ubuntu_irc's test 1-of-10 cases (its test responses). Besides the
reranker's own order, the task reports the cut ordered by cosine + w * margin, w chosen on
500 of the dev cases against the dev responses.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common
from convfit_jax.configs.rerank_esim import UBUNTU


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/retrieve_rerank.py", retriever=common.MINILM, reranker="",
                       k=100, workdir="")
  c = ml_collections.ConfigDict()
  c.task = "retrieve_rerank"
  c.workdir = a.workdir or "workdirs/retrieve_rerank"
  c.seed = 0  # the query sample when data.num_queries > 0

  c.retriever = common.model_config(a.retriever)  # a folder, hub id or Stage 1/2 workdir
  c.retriever.max_length = 64
  c.reranker = a.reranker  # a finished rerank run's workdir; "" = retrieval alone

  c.data = ml_collections.ConfigDict()
  c.data.file = f"{UBUNTU}/test_rs10.jsonl"  # cases: the pool is all their candidates
  c.data.num_queries = 0  # > 0: a seeded sample of the cases as queries (the pool stays whole)
  # Where the reranker's weight against the retriever's cosine is chosen (its own pool and
  # a seeded sample of its queries); "" = no interpolated order.
  c.data.dev_file = f"{UBUNTU}/dev_rs10.jsonl"
  c.data.dev_queries = 500

  c.retrieve = ml_collections.ConfigDict()
  c.retrieve.k = a.k  # the reranker reorders this many
  c.retrieve.query = "context"  # context (the last turn, as Stage 1 trains) | history
  c.retrieve.batch_size = 64  # sentences per encoder call
  c.retrieve.rerank_batch_size = 64  # pairs per reranker call
  return c
