"""Response selection: rank each case's true response among its candidates (R@k, MRR).

The candidates are scored by the task's `ResponseScorer`: a `BiEncoderScorer` (cosine of
a context vector and each response vector; distinct candidate texts encoded once) for
dual encoders, or any pairwise scorer (a cross-encoder) with the same `score` method.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ml_collections
import numpy as np

from convfit_jax.data.conversations import read_response_selection
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.evaluators import metrics


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

  def score(self, contexts: Sequence[str], candidates: Sequence[Sequence[str]], *,
            batch_size: int = 32) -> np.ndarray:
    """[n, c] cosine similarities; each distinct candidate text is encoded once."""
    texts = sorted({t for cands in candidates for t in cands})
    index = {t: i for i, t in enumerate(texts)}
    rows = np.asarray([[index[t] for t in cands] for cands in candidates])
    return np.einsum("nd,ncd->nc", self.contexts(list(contexts), batch_size),
                     self.responses(texts, batch_size)[rows])


class Evaluator:
  """R@1/10/50 and MRR on the cases of `settings.file`.

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
    scores = predictors[self.settings.predictor].score(self.cases.contexts, self.cases.candidates,
                                                       batch_size=self.settings.batch_size)
    return metrics.response_selection_metrics(scores, self.cases.labels)
