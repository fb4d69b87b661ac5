"""Semantic textual similarity with any text encoder: out of the box, and adapted.

Out of the box: the cosine of the two sentences' vectors against the human scores,
Pearson r (STS-B's official figure) and Spearman rho, on STS-B dev and test and on
SICK-R test. Adapted (Yang et al. 2018's transformation matrix): a linear map W
[d, d], started at the identity, trained on STS-B train to bring cos(uW, vW) to the
score scaled to [0, 1] (squared error, Adam, seeded minibatches); the epoch (and, where
several Adam rates are given, the rate) with the best STS-B dev Pearson is kept (epoch 0
is the identity, so adapting never loses on dev), and its W is applied to every set.

Metric names (fractions): `stsb_dev_pearson`, `stsb_dev_spearman`, `stsb_test_*`,
`sickr_test_*`, the same with `_adapted` before the statistic
(`stsb_test_adapted_pearson`), `sts_adapt_epoch` and `sts_adapt_learning_rate`. Files: `run_config.data.sts_dir`
(STS-B `train.tsv`, `dev.tsv`, `test.tsv`) and `run_config.data.sick_dir` (SICK
`test.tsv`; "" leaves SICK-R out).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging

from convfit_jax.data import batching
from convfit_jax.data.sentence_pairs import STS_RANGE, StsSet, read_sts
from convfit_jax.evaluators import TextEncoder, metrics
from convfit_jax.models.heads import l2_normalize


@dataclasses.dataclass(frozen=True)
class AdaptConfig:
  """How the transformation is trained: epochs over STS-B train, minibatch, Adam's rate."""
  epochs: int = 20
  batch_size: int = 64
  learning_rate: float = 1e-4


def _cosine(u: jax.Array, v: jax.Array, w: jax.Array) -> jax.Array:
  """cos(u W, v W): [n, d] x [n, d] x [d, d'] -> [n] float32."""
  return jnp.sum(l2_normalize(u @ w) * l2_normalize(v @ w), axis=-1)


@functools.partial(jax.jit, static_argnums=0)
def _epoch(tx: optax.GradientTransformation, w, opt_state, u, v, targets, order, mask):
  """One pass over `order` [steps, batch] int32 rows (`mask` [steps, batch] float32, 0 on padding)."""
  def loss_fn(w_, rows, m):
    err = _cosine(u[rows], v[rows], w_) - targets[rows]
    return jnp.sum(m * err * err) / jnp.maximum(jnp.sum(m), 1.0)

  def step(carry, batch):
    w_, s = carry
    grads = jax.grad(loss_fn)(w_, *batch)
    updates, s = tx.update(grads, s, w_)
    return (optax.apply_updates(w_, updates), s), None

  (w, opt_state), _ = jax.lax.scan(step, (w, opt_state), (order, mask))
  return w, opt_state


def fit_adaptation(train: tuple[np.ndarray, np.ndarray, np.ndarray],
                   dev: tuple[np.ndarray, np.ndarray, np.ndarray], *,
                   config: AdaptConfig = AdaptConfig(), seed: int = 0
                   ) -> tuple[np.ndarray, int, float]:
  """The transformation matrix of the module docstring.

  Args:
    train, dev: (u [n, d], v [n, d] float32 sentence vectors, scores [n] in `STS_RANGE`).
    config: training settings.
    seed: the minibatch order of each epoch (`batching.epoch_order(n, seed, epoch)`).
  Returns:
    (W [d, d] float32 of the best dev epoch, that epoch (0: the identity), its dev Pearson r).
  """
  u, v, scores = (jnp.asarray(a, jnp.float32) for a in train)
  targets = (scores - STS_RANGE[0]) / (STS_RANGE[1] - STS_RANGE[0])
  dev_u, dev_v, dev_scores = (jnp.asarray(a, jnp.float32) for a in dev)
  n, d = u.shape
  steps = batching.steps_per_epoch(n, config.batch_size)
  tx = optax.adam(config.learning_rate)
  w = jnp.eye(d, dtype=jnp.float32)
  opt_state = tx.init(w)
  best = (np.asarray(w), 0, metrics.pearson(_cosine(dev_u, dev_v, w), dev_scores))
  for epoch in range(1, config.epochs + 1):
    order = np.zeros(steps * config.batch_size, np.int32)
    order[:n] = batching.epoch_order(n, seed, epoch)
    mask = (np.arange(steps * config.batch_size) < n).astype(np.float32)
    w, opt_state = _epoch(tx, w, opt_state, u, v, targets,
                          order.reshape(steps, -1), mask.reshape(steps, -1))
    r = metrics.pearson(_cosine(dev_u, dev_v, w), dev_scores)
    if r > best[2]:
      best = (np.asarray(w), epoch, r)
  return best


def _embed(encoder: TextEncoder, sts: StsSet, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Unit vectors of both sides, each distinct sentence encoded once."""
  texts = sorted(set(sts.sentence1) | set(sts.sentence2))
  index = {t: i for i, t in enumerate(texts)}
  x = encoder.encode(texts, batch_size=batch_size, normalize=True)
  pick = lambda side: x[[index[t] for t in side]]
  return pick(sts.sentence1), pick(sts.sentence2)


def _correlations(cosines: np.ndarray, scores: np.ndarray, prefix: str) -> dict[str, float]:
  return {f"{prefix}pearson": metrics.pearson(cosines, scores),
          f"{prefix}spearman": metrics.spearman(cosines, scores)}


class Evaluator:
  """STS-B dev/test and SICK-R test, out of the box and adapted (the module docstring).

  Args:
    settings: its config block (`configs.common.sts_eval`): adapt, adapt_epochs,
      adapt_batch_size, adapt_learning_rates, batch_size, predictor.
    run_config: the run's config: `data.sts_dir`, `data.sick_dir`, `seed`.
    workdir: unused; every evaluator takes it.
  """

  def __init__(self, settings: ml_collections.ConfigDict, *, run_config: ml_collections.ConfigDict,
               workdir: Path):
    del workdir
    self.settings = settings
    self.seed = run_config.seed
    sts_dir = Path(run_config.data.sts_dir).expanduser()
    self.sets = {"stsb_dev": read_sts(sts_dir / "dev.tsv"), "stsb_test": read_sts(sts_dir / "test.tsv")}
    sick_dir = run_config.data.get("sick_dir", "")
    if sick_dir:
      self.sets["sickr_test"] = read_sts(Path(sick_dir).expanduser() / "test.tsv")
    self.train = read_sts(sts_dir / "train.tsv") if settings.adapt else None

  def __call__(self, predictors: Mapping[str, Any], *, when: str, label: str = "") -> dict[str, float]:
    del when, label
    encoder = predictors[self.settings.predictor]
    batch_size = self.settings.batch_size
    vectors = {name: _embed(encoder, sts, batch_size) for name, sts in self.sets.items()}
    out = {}
    for name, (u, v) in vectors.items():
      out.update(_correlations(np.sum(u * v, axis=-1), self.sets[name].scores, f"{name}_"))
    if self.train is None:
      return out
    s = self.settings
    if not s.adapt_learning_rates:
      raise ValueError("evals.sts.adapt_learning_rates: give at least one Adam rate")
    train = (*_embed(encoder, self.train, batch_size), self.train.scores)
    dev = (*vectors["stsb_dev"], self.sets["stsb_dev"].scores)
    fits = [(*fit_adaptation(train, dev, config=AdaptConfig(s.adapt_epochs, s.adapt_batch_size, lr),
                             seed=self.seed), lr) for lr in s.adapt_learning_rates]
    w, epoch, _, lr = max(fits, key=lambda fit: fit[2])  # the first of equal dev Pearsons
    logging.info("STS adaptation: epoch %d of %d at Adam rate %g kept (best STS-B dev Pearson)",
                 epoch, s.adapt_epochs, lr)
    out["sts_adapt_epoch"], out["sts_adapt_learning_rate"] = epoch, lr
    for name, (u, v) in vectors.items():
      cosines = np.asarray(_cosine(jnp.asarray(u), jnp.asarray(v), jnp.asarray(w)))
      out.update(_correlations(cosines, self.sets[name].scores, f"{name}_adapted_"))
    return out
