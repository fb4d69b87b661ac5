"""Evaluators by name, as big_vision's `evaluators/common.py` runs them.

`config.evals` holds one block per evaluation: `type` names a module here (which
defines `Evaluator`), `every` says how often it runs during training (0: only before
and after), `before` whether it runs on the initial model, and the rest are its own
settings. An evaluator is built once per run as `Evaluator(settings, run_config=...,
workdir=...)` and called as `evaluator(predictors, when="before" | "during" | "after")`;
`predictors` maps names to what the task's model offers (`"text"`: a `TextEncoder`;
`"response_scorer"`: a `ResponseScorer`), so any model that turns texts into vectors
can be evaluated by the k-NN and response-selection evaluators, and a cross-encoder
plugs into response selection through its own scorer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Protocol, Sequence

import ml_collections
import numpy as np

from convfit_jax import registry

class TextEncoder(Protocol):
  """Texts to vectors (what `convfit_jax.Encoder` is)."""

  def encode(self, texts: Sequence[str], *, batch_size: int = 32,
             normalize: bool | None = None) -> np.ndarray:
    """n texts -> [n, d] float32."""


class ResponseScorer(Protocol):
  """Scores candidate responses for contexts (a bi-encoder, or a cross-encoder pair by pair)."""

  def score(self, contexts: Sequence[str], candidates: Sequence[Sequence[str]], *,
            batch_size: int = 32) -> np.ndarray:
    """n contexts, n lists of c candidates -> [n, c] float scores, higher is better."""


def get(name: str):
  """The evaluator module `convfit_jax.evaluators.<name>`; an unknown name lists the known ones."""
  return registry.lookup(__name__, name, "Evaluator", "config.evals.<name>.type")


def from_config(evals: ml_collections.ConfigDict, *, run_config: ml_collections.ConfigDict,
                workdir: Path) -> dict[str, tuple[Any, ml_collections.ConfigDict]]:
  """{name: (evaluator, its config block)} for each block of `config.evals`."""
  out = {}
  for name, block in evals.items():
    if "type" not in block:
      raise ValueError(f"config.evals.{name}: no `type` (the evaluator module, e.g. intent_knn)")
    out[name] = (get(block.type).Evaluator(block, run_config=run_config, workdir=workdir), block)
  return out


def numeric(metrics: Mapping[str, Any]) -> dict[str, float]:
  """The scalar entries of `metrics` (what goes to TensorBoard)."""
  return {k: float(v) for k, v in metrics.items()
          if isinstance(v, (int, float, np.floating, np.integer)) and not isinstance(v, bool)}
