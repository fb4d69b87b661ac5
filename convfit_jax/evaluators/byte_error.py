"""Byte error rate of an auto-encoder, overall and by sentence length (seed 003's Figure 4).

Reads the `"autoencoder"` predictor (`models.byte_autoencoder.Reconstructor`). Each test
sentence that fits the model's positions (bytes and end-of-sequence) is auto-encoded;
an error is a byte or the end-of-sequence predicted wrong at its position. Metrics:
`byte_error` (wrong / scored over all sentences), `byte_error_<lo>_<hi>` and
`fraction_<lo>_<hi>` (the share of the sentences) for the length buckets in bytes,
`sentence_error` (sentences not reproduced exactly), `num_test`, `num_test_too_long`
(left out). A bar chart by bucket is written to the workdir, and the first `examples`
sentences are logged with their reconstructions.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

import numpy as np
from absl import logging

from convfit_jax.data.sampling import subsample_indices
from convfit_jax.data.text import read_sentences
from convfit_jax.models import byte_autoencoder

# The paper's Figure 4 buckets, in bytes, and the short and long ends around them.
BUCKETS = ((1, 64), (65, 128), (129, 256), (257, 512), (513, 1024))


def bucket_metrics(lengths: np.ndarray, errors: np.ndarray, scored: np.ndarray
                   ) -> dict[str, float]:
  """Byte error and share of sentences per `BUCKETS` bucket that holds any.

  Args:
    lengths: [n] bytes per sentence (without end-of-sequence).
    errors, scored: [n] wrong and scored positions per sentence.
  """
  out = {}
  for lo, hi in BUCKETS:
    inside = (lengths >= lo) & (lengths <= hi)
    if inside.any():
      out[f"byte_error_{lo}_{hi}"] = float(errors[inside].sum() / scored[inside].sum())
      out[f"fraction_{lo}_{hi}"] = float(inside.mean())
  return out


def plot(metrics: Mapping[str, float], path: Path, title: str) -> None:
  """Bars of byte error by length bucket (PNG)."""
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  names = [f"{lo}-{hi}" for lo, hi in BUCKETS if f"byte_error_{lo}_{hi}" in metrics]
  values = [100 * metrics[f"byte_error_{n.replace('-', '_')}"] for n in names]
  fig, ax = plt.subplots(figsize=(5, 3.2))
  ax.bar(names, values, color="tab:blue")
  ax.set_xlabel("sentence length (bytes)")
  ax.set_ylabel("byte error (%)")
  ax.set_title(title, fontsize=9)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


class Evaluator:
  """Settings (`common.byte_error_eval`): file, max_sentences (0 = all; else a sample
  seeded by the run's seed), batch_size, examples, predictor."""

  def __init__(self, settings, *, run_config, workdir: Path):
    self.settings, self.workdir = settings, Path(workdir)
    texts = read_sentences(Path(settings.file).expanduser())
    keep = subsample_indices(len(texts), settings.max_sentences, run_config.get("seed", 0))
    self.texts = [texts[i] for i in keep]

  def __call__(self, predictors: Mapping[str, Any], *, when: str, label: str = "") -> dict[str, Any]:
    s = self.settings
    model = predictors[s.predictor]
    texts = [t for t in self.texts if byte_autoencoder.fits(t, model.length)]
    if not texts:
      raise ValueError(f"{s.file}: no sentence fits {model.length} positions")
    predicted, placed = model.predict(texts, batch_size=s.batch_size)
    real = placed != byte_autoencoder.PAD
    errors = ((predicted != placed) & real).sum(axis=1)
    scored = real.sum(axis=1)
    lengths = scored - 1
    out = {"byte_error": float(errors.sum() / scored.sum()),
           "sentence_error": float((errors > 0).mean()),
           **bucket_metrics(lengths, errors, scored),
           "num_test": len(texts), "num_test_too_long": len(self.texts) - len(texts)}
    for i in range(min(s.examples, len(texts))):
      # Read the prediction in the input's order: the placed positions of its real tokens.
      decoded = byte_autoencoder.decode(predicted[i][real[i]])
      logging.info("%s example %d\n  in:  %s\n  out: %s", when, i, texts[i], decoded)
    if when != "before":
      plot(out, self.workdir / f"byte_error_by_length{'_' + when if when else ''}.png",
           f"{label}: byte error {100 * out['byte_error']:.2f}%")
    return out
