"""NLI accuracy of a task's NLI classifier (the multitask input-response model's).

The predictor (`predictors["nli"]`) maps (premises, hypotheses) to predicted label
indices (`data.sentence_pairs.NLI_LABELS`); the metric is `<prefix>accuracy` (a fraction).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import ml_collections

from convfit_jax.data.sampling import subsample_indices
from convfit_jax.data.sentence_pairs import read_nli
from convfit_jax.evaluators import metrics


class Evaluator:
  """Accuracy on `settings.file` (a seeded sample of `settings.max_pairs` when > 0)."""

  def __init__(self, settings: ml_collections.ConfigDict, *, run_config: ml_collections.ConfigDict,
               workdir: Path):
    del workdir
    self.settings = settings
    nli = read_nli(Path(settings.file).expanduser())
    self.nli = nli.subset(subsample_indices(len(nli), settings.max_pairs, run_config.seed))

  def __call__(self, predictors: Mapping[str, Any], *, when: str, label: str = "") -> dict[str, float]:
    del when, label
    predicted = predictors[self.settings.predictor].predict(
        self.nli.premises, self.nli.hypotheses, batch_size=self.settings.batch_size)
    return {f"{self.settings.prefix}accuracy": metrics.accuracy(self.nli.labels, predicted)}
