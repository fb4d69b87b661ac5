"""Response selection: rank each case's true response among its candidates (R@k, MRR).

The candidates are scored by the task's response scorer, anything with
`score(cases, *, batch_size) -> [n, c]`: a `BiEncoderScorer` (cosine of a context vector
and each response vector; distinct candidate texts encoded once) for dual encoders, or a
pairwise scorer (`train.rerank.PairScorer`: ESIM, a cross-encoder) reading each case's
history with each candidate.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ml_collections
import numpy as np

from convfit_jax.data.conversations import ResponseSelectionSet, read_response_selection
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.evaluators import metrics


def summary_line(metrics: Mapping[str, Any]) -> str | None:
  """"<set>r_at_1 before -> after; ..." for every R@1 (R10@1) in a run's metrics, or None."""
  shown = [k for k in metrics if k.endswith(("r_at_1", "r10_at_1"))]
  before = lambda k: f"{metrics[k + '_before']:.4f} -> " if k + "_before" in metrics else ""
  return "; ".join(f"{k} {before(k)}{metrics[k]:.4f}" for k in shown) or None


def distinct_candidates(cases: ResponseSelectionSet) -> tuple[list[str], np.ndarray]:
  """(the distinct candidate texts of `cases`, sorted; [n, c] int their index per case)."""
  texts = sorted({t for cands in cases.candidates for t in cands})
  index = {t: i for i, t in enumerate(texts)}
  return texts, np.asarray([[index[t] for t in cands] for cands in cases.candidates])


class BiEncoderScorer:
  """Scores by the dot product of unit vectors.

  Args:
    contexts: (n context texts, batch size) -> [n, d] unit rows.
    responses: (m response texts, batch size) -> [m, d] unit rows.
  """

  def __init__(self, contexts: Callable[[Sequence[str], int], np.ndarray],
               responses: Callable[[Sequence[str], int], np.ndarray]):
    self.contexts = contexts
    self.responses = responses

  def score(self, cases: ResponseSelectionSet, *, batch_size: int = 32) -> np.ndarray:
    """[n, c] cosine similarities of each case's context and candidates; each distinct
    candidate text is encoded once."""
    texts, rows = distinct_candidates(cases)
    return np.einsum("nd,ncd->nc", self.contexts(list(cases.contexts), batch_size),
                     self.responses(texts, batch_size)[rows])


class TfidfScorer:
  """Lowe et al.'s (2015) TF-IDF baseline: cosine of the TF-IDF vectors of a case's history
  (its turns joined) and of each candidate, term weights fitted on the cases' own
  histories and distinct candidates (scikit-learn's `TfidfVectorizer`, unit rows)."""

  def score(self, cases: ResponseSelectionSet, *, batch_size: int = 0) -> np.ndarray:
    """[n, c] cosine similarities (`batch_size` unused: one sparse product)."""
    del batch_size
    from sklearn.feature_extraction.text import TfidfVectorizer  # pylint: disable=import-outside-toplevel
    histories = [" ".join(h) for h in cases.histories]
    texts, rows = distinct_candidates(cases)
    vectorizer = TfidfVectorizer().fit(histories + texts)
    queries, responses = vectorizer.transform(histories), vectorizer.transform(texts)
    c = rows.shape[1]
    pairs = queries[np.repeat(np.arange(len(cases)), c)].multiply(responses[rows.reshape(-1)])
    return np.asarray(pairs.sum(axis=1), np.float32).reshape(len(cases), c)


class Evaluator:
  """Recall and MRR on the cases of `settings.file` (`metrics.response_selection_metrics`),
  each name after `settings.prefix` (a run evaluating several sets names each).

  Args:
    settings: its config block (`convfit_jax.configs.common`).
    run_config: the run's config (its `seed` draws the case sample).
    workdir: unused; every evaluator takes it.
  """

  def __init__(self, settings: ml_collections.ConfigDict, *, run_config: ml_collections.ConfigDict,
               workdir: Path):
    del workdir
    self.settings = settings
    path = Path(settings.file).expanduser()
    if not path.is_file():
      raise FileNotFoundError(f"response selection: {path.absolute()} does not exist "
                              "(evals.<name>.file is relative to the current directory)")
    cases = read_response_selection(path)
    self.cases = cases.subset(subsample_indices(len(cases), settings.num_cases, run_config.seed))

  def __call__(self, predictors: Mapping[str, Any], *, when: str, label: str = "") -> dict[str, float]:
    del when, label
    scores = predictors[self.settings.predictor].score(self.cases, batch_size=self.settings.batch_size)
    prefix = self.settings.get("prefix", "")
    return {f"{prefix}{k}": v for k, v in metrics.response_selection_metrics(
        scores, self.cases.labels).items()}
