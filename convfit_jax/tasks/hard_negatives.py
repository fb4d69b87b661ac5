"""Task `hard_negatives`: a reranker's training pairs with negatives a dual encoder retrieves.

A reranker trained on Lowe et al.'s 1:1 pairs meets one random response per context, easy
to tell from the true one; reranking a retriever's top 100 asks it to tell the true
response from the responses most like it, a kind of negative it never saw (docs/experiments/response_selection.md:
a cross-encoder trained on random negatives reordered a Stage 1 retriever's top 100 no
better than the retriever had ranked them). Chen & Wang (2019) train the reranker on the
candidates a retriever proposes. This task writes such training data:

  - the pool is every distinct true (label 1) response of the labelled pairs `data.train`
    (of its `data.max_contexts` true rows drawn by seed, where that is > 0);
  - each true row's query (its last turn, or its whole history: `mine.query`) is ranked
    against the pool by the dual encoder `retriever` (a Stage 1 workdir, any encoder);
  - its own response and the turns of its own history are taken out, and `mine.negatives`
    responses are drawn (seeded) from the ranks `mine.skip` + 1 to `mine.skip` +
    `mine.depth`: the very top holds paraphrases and replies that fit as well (false
    negatives), which `skip` passes over; `depth` 100 matches what a reranker of the top
    100 is shown;
  - workdir/train.tsv gets, per true row, that row, its hard negatives and, with
    `mine.keep_random`, the file's own random negatives of the same history, in the
    format `read_labelled_pairs` reads: `configs/rerank_cross.py` trains on it with
    `--config.data.train=<workdir>/train.tsv`.

metrics.json: contexts, pool size, rows and positive share written, and the retriever's
rank of each true response in the pool (train_r_at_1/10/100, train_mrr): how hard the
mined negatives are, and a check on the retriever.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import ml_collections
import numpy as np
from absl import logging

from convfit_jax.atomic_files import write_text
from convfit_jax.data.conversations import EOU, read_labelled_pairs
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.evaluators.metrics import rank_metrics, ranks
from convfit_jax.tasks.retrieve_rerank import exclude_own_turns, retriever_embeddings
from convfit_jax.train.workdir import Workdir, summary


def draw_negatives(scores: np.ndarray, answer: np.ndarray, *, skip: int, depth: int, count: int,
                   rng: np.random.Generator) -> np.ndarray:
  """[queries, count] pool indices: per query, `count` distinct draws from the entries
  ranked skip + 1 .. skip + depth by `scores` once its answer is taken out (best first,
  ties by lower index); entries scored -inf are never drawn.

  Args:
    scores: [queries, pool] float32; -inf: not a negative (a query's own turns).
    answer: [queries] int, each query's true response in the pool.
  """
  scores = scores.copy()
  scores[np.arange(len(scores)), answer] = -np.inf
  window = np.argsort(-scores, axis=1, kind="stable")[:, skip:skip + depth]
  out = np.empty((len(scores), count), np.int64)
  for i, row in enumerate(window):
    allowed = row[np.isfinite(scores[i, row])]
    if len(allowed) < count:
      raise ValueError(f"mine: query {i} has {len(allowed)} candidates at ranks {skip + 1}-"
                       f"{skip + depth} of a pool of {scores.shape[1]}, fewer than "
                       f"mine.negatives={count}; lower mine.skip or raise mine.depth")
    out[i] = rng.choice(allowed, count, replace=False)
  return out


def run(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Mines and writes workdir/train.tsv and metrics.json as the module docstring says."""
  workdir = Workdir(config.workdir)
  try:
    workdir.write_config(config)
    mi = config.mine
    if mi.query not in ("context", "history"):
      raise ValueError(f"mine.query={mi.query!r}: context or history")
    if mi.negatives < 1 or mi.skip < 0 or mi.depth < mi.negatives:
      raise ValueError(f"mine: negatives={mi.negatives} >= 1, skip={mi.skip} >= 0 and "
                       f"depth={mi.depth} >= negatives are needed")
    path = Path(config.data.train).expanduser()
    if not path.is_file():
      raise FileNotFoundError(f"data.train: {path.absolute()} does not exist")
    pairs = read_labelled_pairs(path)
    true = np.flatnonzero(pairs.labels == 1)
    if not len(true):
      raise ValueError(f"data.train: {path}: no row labelled 1")
    true = true[subsample_indices(len(true), config.data.max_contexts, config.seed)]
    pool = list(dict.fromkeys(pairs.responses[i] for i in true))  # first-seen order
    index = {t: j for j, t in enumerate(pool)}
    answer = np.asarray([index[pairs.responses[i]] for i in true])
    turns = [pairs.histories[i].split(EOU) for i in true]
    queries = [t[-1] for t in turns] if mi.query == "context" else [pairs.histories[i] for i in true]

    enc = retriever_embeddings(config.retriever, seed=config.seed, batch_size=mi.batch_size)
    pool_vectors, query_vectors = enc(pool), enc(queries)
    rng = np.random.default_rng(config.seed)
    found, negatives = [], []
    for start in range(0, len(true), mi.chunk):
      part = slice(start, start + mi.chunk)
      scores = query_vectors[part] @ pool_vectors.T  # [chunk, pool] cosines
      exclude_own_turns(scores, pool, turns[part], answer[part])
      found.append(ranks(scores, answer[part]))
      negatives.append(draw_negatives(scores, answer[part], skip=mi.skip, depth=mi.depth,
                                      count=mi.negatives, rng=rng))
    negatives = np.concatenate(negatives)

    random = defaultdict(list)  # history -> the file's random responses for it
    if mi.keep_random:
      for i in np.flatnonzero(pairs.labels == 0):
        random[pairs.histories[i]].append(pairs.responses[i])
    lines = ["history\tresponse\tlabel"]
    for k, i in enumerate(true):
      history = pairs.histories[i]
      lines.append(f"{history}\t{pairs.responses[i]}\t1")
      lines += [f"{history}\t{pool[j]}\t0" for j in negatives[k]]
      lines += [f"{history}\t{r}\t0" for r in random.pop(history, [])]
    if workdir.main:
      write_text(workdir.path / "train.tsv", "\n".join(lines) + "\n")
    metrics = {"contexts": len(true), "pool_size": len(pool), "rows": len(lines) - 1,
               "positive_share": len(true) / (len(lines) - 1),
               **{f"train_{k}": v for k, v in rank_metrics(np.concatenate(found), (1, 10, 100)).items()}}
    metrics = workdir.update_metrics(metrics)
    logging.info("mined %s", metrics)
    summary(f"{workdir.path / 'train.tsv'}: {metrics['rows']} rows for {len(true)} contexts "
            f"({mi.negatives} retrieved negative(s) each); the retriever ranks the true response "
            f"first for {metrics['train_r_at_1']:.4f} of them")
    return metrics
  finally:
    workdir.close()
