"""Task `retrieve_rerank`: a dual encoder retrieves from a pool, a reranker reorders its top k.

Cross-attention is too costly to score every response of a large pool (Chen & Wang 2019
rerank the top 100 of 120,000), so the dual encoder ranks the whole pool by cosine and
the reranker (`train.rerank`: ESIM or a cross-encoder, a finished rerank run's workdir)
reorders only the first `retrieve.k`. The pool is every distinct candidate of a
response-selection file (ubuntu_irc's test cases: the test responses); each case's query
is its context (or its whole history, `retrieve.query`) and its answer the true candidate.

Metrics over the whole pool (ties rank the true response last): retrieval_r_at_1/10,
retrieval_mrr, retrieval_r_at_k (the share of answers inside the cut: the reranker's
ceiling) and rerank_r_at_1/10, rerank_mrr (an answer outside the cut counts as missed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from convfit_jax import models
from convfit_jax.data.conversations import EOU, read_response_selection
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.encoder import Encoder
from convfit_jax.evaluators import knn
from convfit_jax.train.rerank import PairScorer, load_reranker
from convfit_jax.train.workdir import Workdir, summary


def pool_ranks(scores: np.ndarray, answer: np.ndarray) -> np.ndarray:
  """[n] int ranks (1 = first) of each row's `answer` column in [n, m] `scores`; a tie
  ranks the answer last."""
  truth = scores[np.arange(len(scores)), answer][:, None]
  return np.sum(scores >= truth, axis=1)


def rank_metrics(ranks: np.ndarray, prefix: str, cuts: tuple[int, ...]) -> dict[str, float]:
  """R@k for each cut and MRR of [n] ranks (np.inf = missed)."""
  out = {f"{prefix}r_at_{k}": float(np.mean(ranks <= k)) for k in cuts}
  out[f"{prefix}mrr"] = float(np.mean(1.0 / ranks))
  return out


def run(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Retrieves, reranks and writes workdir/metrics.json as the module docstring says."""
  workdir = Workdir(config.workdir)
  try:
    workdir.write_config(config)
    r = config.retrieve
    path = Path(config.data.file).expanduser()
    if not path.is_file():
      raise FileNotFoundError(f"data.file: {path.absolute()} does not exist")
    all_cases = read_response_selection(path)
    pool = sorted({t for cands in all_cases.candidates for t in cands})
    index = {t: i for i, t in enumerate(pool)}
    cases = all_cases.subset(subsample_indices(len(all_cases), config.data.num_queries, config.seed))
    answer = np.asarray([index[c[label]] for c, label in zip(cases.candidates, cases.labels)])
    histories = [EOU.join(h) for h in cases.histories]
    if r.query not in ("context", "history"):
      raise ValueError(f"retrieve.query={r.query!r}: context or history")
    queries = list(cases.contexts) if r.query == "context" else histories
    if not 1 <= r.k <= len(pool):
      raise ValueError(f"retrieve.k={r.k}: between 1 and the pool size {len(pool)}")

    built = models.get(config.retriever.name).build(config.retriever, seed=config.seed)
    encoder = Encoder(built.model, built.tokenizer, max_length=config.retriever.max_length,
                      hf_config=built.hf_config)
    enc = lambda texts: encoder.encode(texts, batch_size=r.batch_size, normalize=True)
    query_x, pool_x = enc(queries), enc(pool)
    cuts = (1, 10, r.k)
    metrics = {"num_queries": len(cases), "pool_size": len(pool), "k": r.k}
    metrics.update(rank_metrics(pool_ranks(query_x @ pool_x.T, answer), "retrieval_", cuts))
    _, top = knn.search(query_x, pool_x, k=r.k)
    logging.info("retrieval over %d responses: %s", len(pool), metrics)

    if config.reranker:
      model, inputs = load_reranker(config.reranker)
      scorer = PairScorer(model, inputs)
      margins = scorer.margins([h for h in histories for _ in range(r.k)],
                               [pool[j] for row in top for j in row],
                               batch_size=r.rerank_batch_size).reshape(len(cases), r.k)
      inside = top == answer[:, None]
      found = inside.any(axis=1)
      truth = np.where(found, margins[np.arange(len(cases)), inside.argmax(axis=1)], np.inf)
      ranks = np.where(found, np.sum(margins >= truth[:, None], axis=1), np.inf)
      metrics.update(rank_metrics(ranks, "rerank_", (1, 10)))
    metrics = workdir.update_metrics(metrics)
    line = (f"retrieval over {len(pool)} responses: R@1 {metrics['retrieval_r_at_1']:.4f}, "
            f"R@{r.k} {metrics[f'retrieval_r_at_{r.k}']:.4f}")
    if "rerank_r_at_1" in metrics:
      line += f"; reranked: R@1 {metrics['rerank_r_at_1']:.4f}, MRR {metrics['rerank_mrr']:.4f}"
    summary(line)
    return metrics
  finally:
    workdir.close()
