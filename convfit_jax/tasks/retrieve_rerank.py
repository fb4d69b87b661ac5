"""Task `retrieve_rerank`: a dual encoder retrieves from a pool, a reranker reorders its top k.

Cross-attention is too costly to score every response of a large pool (Chen & Wang 2019
rerank the top 100 of 120,000), so the dual encoder ranks the whole pool by cosine and
the reranker (`train.rerank`: ESIM or a cross-encoder, a finished rerank run's workdir)
reorders only the first `retrieve.k`. The pool is every distinct candidate of a
response-selection file (ubuntu_irc's test cases: the test responses); each case's query
is its context (or its whole history, `retrieve.query`) and its answer the true candidate.

The pool is the file's responses and its cases come from the same conversations, so a
query's own earlier turns are mostly in it (ubuntu_irc's test cases), its context above
all, and a dual encoder ranks a copy of the query first. A turn of the history is not
the response that follows it, so each query's own turns are taken out of its pool
(`own_turns_excluded`: how many per query, mean), except a true response that repeats
one of them.

Metrics over the whole pool (ties rank the true response last): retrieval_r_at_1/10,
retrieval_mrr, retrieval_r_at_k (the share of answers inside the cut: the reranker's
ceiling) and rerank_r_at_1/10, rerank_mrr (an answer outside the cut counts as missed);
fused_r_at_1/10, fused_mrr: the cut ordered by reciprocal rank fusion of the two orders
(Cormack et al. 2009, sum of 1 / (60 + rank)), which keeps what the retriever knows where
a reranker trained on other negatives misorders the cut, with nothing tuned;
interpolated_r_at_1/10, interpolated_mrr: the cut ordered by cosine + w * margin, the
weight w (`interpolation_weight`) the one of `WEIGHTS` with the best MRR on a sample of
another file's queries (`data.dev_file`, its own pool; `dev_retrieval_mrr` and
`dev_interpolated_mrr` are its figures), so nothing is tuned on the reported queries.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import ml_collections
import numpy as np
from absl import logging

from convfit_jax import models
from convfit_jax.data.conversations import EOU, read_response_selection
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.encoder import Encoder
from convfit_jax.evaluators.metrics import rank_metrics, ranks
from convfit_jax.evaluators.response_selection import distinct_candidates
from convfit_jax.train.rerank import PairScorer, load_reranker
from convfit_jax.train.workdir import Workdir, summary


def _prefixed(prefix: str, values: dict[str, float]) -> dict[str, float]:
  return {f"{prefix}{k}": v for k, v in values.items()}


def retriever_embeddings(m: ml_collections.ConfigDict, *, seed: int, batch_size: int
                         ) -> Callable[[Sequence[str]], np.ndarray]:
  """texts -> [n, dim] float32 unit vectors of the dual encoder the `m` block names (a
  folder, hub id or Stage 1/2 workdir as `init_from`; `max_length` tokens)."""
  built = models.get(m.name).build(m, seed=seed)
  encoder = Encoder(built.model, built.tokenizer, max_length=m.max_length, hf_config=built.hf_config)
  return lambda texts: encoder.encode(texts, batch_size=batch_size, normalize=True)


RRF_K = 60  # Cormack et al. (2009)'s constant: how far down a ranking still counts


def reciprocal_rank_fusion(*scores: np.ndarray, k: int = RRF_K) -> np.ndarray:
  """[queries, n] scores of several rankers -> [queries, n] float64 sum over rankers of
  1 / (k + rank), rank 1 the ranker's highest score (ties by lower index)."""
  fused = np.zeros(scores[0].shape, np.float64)
  for s in scores:
    order = np.argsort(-s, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.broadcast_to(np.arange(1, s.shape[1] + 1), s.shape), axis=1)
    fused += 1.0 / (k + rank)
  return fused


def rank_in_cut(scores: np.ndarray, inside: np.ndarray) -> np.ndarray:
  """[queries] 1-based rank of the answer among a cut's [queries, k] scores (ties rank it
  last), inf where `inside` [queries, k] bool holds no answer."""
  found = inside.any(axis=1)
  truth = np.where(found, scores[np.arange(len(scores)), inside.argmax(axis=1)], np.inf)
  return np.where(found, np.sum(scores >= truth[:, None], axis=1), np.inf)


def exclude_own_turns(scores: np.ndarray, pool: list[str], histories, answer: np.ndarray) -> float:
  """Sets scores[i, j] to -inf where pool text j is a turn of history i and not its
  answer (module docstring); returns the mean count per query.

  Args:
    scores: [queries, pool] float32, changed in place.
    pool: the pool's texts; histories: each query's turns; answer: [queries] pool indices.
  """
  index = {t: j for j, t in enumerate(pool)}
  excluded = 0
  for i, turns in enumerate(histories):
    for j in {index[t] for t in turns if t in index} - {int(answer[i])}:
      scores[i, j] = -np.inf
      excluded += 1
  return excluded / max(len(histories), 1)


# Reranker weights tried against the retriever's cosine (margins are logit differences,
# cosines at most 1): 0 (retrieval's order) and 10^-3 ... 10^1 in quarter decades.
WEIGHTS = (0.0, *np.logspace(-3, 1, 17))


def choose_weight(cosines: np.ndarray, margins: np.ndarray, inside: np.ndarray
                  ) -> tuple[float, np.ndarray]:
  """The weight of `WEIGHTS` whose cosine + weight * margin order gives the cut's answers
  the best MRR (the smallest on a tie), and [len(WEIGHTS)] the MRR of each (the first:
  cosine alone); all inputs [queries, k], `inside` bool."""
  mrr = np.array([rank_metrics(rank_in_cut(cosines + w * margins, inside), (1,))["mrr"]
                  for w in WEIGHTS])
  return float(WEIGHTS[int(np.argmax(mrr))]), mrr


def retrieve_and_score(config: ml_collections.ConfigDict, file: str, num_queries: int,
                       encode: Callable[[Sequence[str]], np.ndarray], scorer: PairScorer | None
                       ) -> tuple[dict[str, Any], np.ndarray | None, np.ndarray | None, np.ndarray]:
  """A sample of `file`'s queries against its whole pool (the module docstring).

  Returns:
    (retrieval metrics with the counts, [queries, k] cosines of the cut, its [queries, k]
    reranker margins (None without `scorer`), [queries, k] bool: where the answer is).
  """
  r = config.retrieve
  path = Path(file).expanduser()
  if not path.is_file():
    raise FileNotFoundError(f"{path.absolute()} does not exist (data.file or data.dev_file)")
  all_cases = read_response_selection(path)
  pool, rows = distinct_candidates(all_cases)
  chosen = subsample_indices(len(all_cases), num_queries, config.seed)
  cases = all_cases.subset(chosen)
  answer = rows[chosen, cases.labels]
  histories = [EOU.join(h) for h in cases.histories]
  queries = list(cases.contexts) if r.query == "context" else histories
  if not 1 <= r.k <= len(pool):
    raise ValueError(f"retrieve.k={r.k}: between 1 and {path}'s pool size {len(pool)}")
  scores = encode(queries) @ encode(pool).T  # [queries, pool]; unit rows: cosines
  metrics = {"num_queries": len(cases), "pool_size": len(pool), "k": r.k,
             "own_turns_excluded": exclude_own_turns(scores, pool, cases.histories, answer)}
  metrics.update(_prefixed("retrieval_", rank_metrics(ranks(scores, answer), (1, 10, r.k))))
  top = np.argsort(-scores, axis=1, kind="stable")[:, :r.k]  # best first, ties by lower index
  logging.info("retrieval over %d responses of %s: %s", len(pool), path, metrics)
  margins = None
  if scorer is not None:
    margins = scorer.margins([h for h in histories for _ in range(r.k)],
                             [pool[j] for row in top for j in row],
                             batch_size=r.rerank_batch_size).reshape(len(cases), r.k)
  return metrics, np.take_along_axis(scores, top, axis=1), margins, top == answer[:, None]


def run(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Retrieves, reranks and writes workdir/metrics.json as the module docstring says."""
  workdir = Workdir(config.workdir)
  try:
    workdir.write_config(config)
    r, d = config.retrieve, config.data
    if r.query not in ("context", "history"):
      raise ValueError(f"retrieve.query={r.query!r}: context or history")
    encode = retriever_embeddings(config.retriever, seed=config.seed, batch_size=r.batch_size)
    scorer = PairScorer(*load_reranker(config.reranker)) if config.reranker else None
    metrics, cosines, margins, inside = retrieve_and_score(config, d.file, d.num_queries, encode,
                                                           scorer)
    if scorer is not None:
      metrics.update(_prefixed("rerank_", rank_metrics(rank_in_cut(margins, inside), (1, 10))))
      fused = reciprocal_rank_fusion(cosines, margins)
      metrics.update(_prefixed("fused_", rank_metrics(rank_in_cut(fused, inside), (1, 10))))
      if d.dev_file:
        _, dev_cosines, dev_margins, dev_inside = retrieve_and_score(
            config, d.dev_file, d.dev_queries, encode, scorer)
        w, dev_mrr = choose_weight(dev_cosines, dev_margins, dev_inside)
        metrics.update({"interpolation_weight": w, "dev_retrieval_mrr": float(dev_mrr[0]),
                        "dev_interpolated_mrr": float(dev_mrr.max())})
        metrics.update(_prefixed("interpolated_", rank_metrics(
            rank_in_cut(cosines + w * margins, inside), (1, 10))))
    metrics = workdir.update_metrics(metrics)
    line = (f"retrieval over {metrics['pool_size']} responses: R@1 {metrics['retrieval_r_at_1']:.4f}, "
            f"R@{r.k} {metrics[f'retrieval_r_at_{r.k}']:.4f}")
    for name in ("rerank", "fused", "interpolated"):
      if f"{name}_r_at_1" in metrics:
        line += (f"; {name}: R@1 {metrics[f'{name}_r_at_1']:.4f}, "
                 f"MRR {metrics[f'{name}_mrr']:.4f}")
    summary(line)
    return metrics
  finally:
    workdir.close()
