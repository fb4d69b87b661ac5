"""The paper's MLP baseline: a one-hidden-layer classifier trained on frozen encodings.

Architecture as Casanueva et al. (2020): one hidden layer of 512 ReLU units, then a
softmax over the intents. The training settings are ours, chosen for the few-shot
regime the paper evaluates:
- inputs L2-normalised, so one learning rate suits every encoder whatever the scale of
  its outputs (mean-pooled MiniLM, the tanh projection of Stage 2, ...);
- dropout 0.5 on the hidden layer: 10 examples per intent overfit at once without it;
- Adam, learning rate 1e-3, batch 32, a fixed 100 epochs and no early stopping: 10-shot
  splits have no validation data to stop on, and holding some out would leave fewer
  than 10 shots to train on;
- everything (initialisation, shuffling, dropout) derives from `seed`, so a seed gives
  the same classifier every time on the same machine.
The whole run is one jitted program: a `lax.scan` over epochs of a `lax.scan` over steps.
"""

from __future__ import annotations

import dataclasses
from functools import partial
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from convfit_jax.models.heads import l2_normalize


@dataclasses.dataclass(frozen=True)
class MLPConfig:
  hidden: int = 512
  dropout: float = 0.5
  learning_rate: float = 1e-3
  batch_size: int = 32
  epochs: int = 100


def _logits(params, x, key=None, dropout: float = 0.0):
  h = jax.nn.relu(x @ params["w1"] + params["b1"])
  if key is not None:
    h = h * jax.random.bernoulli(key, 1.0 - dropout, h.shape) / (1.0 - dropout)
  return h @ params["w2"] + params["b2"]


@partial(jax.jit, static_argnames=("num_labels", "config"))
def _train(x, y, key, *, num_labels: int, config: MLPConfig):
  n, d = x.shape
  bs = config.batch_size
  steps = math.ceil(n / bs)
  init_key, loop_key = jax.random.split(key)
  k1, k2 = jax.random.split(init_key)
  glorot = jax.nn.initializers.glorot_uniform()
  params = {"w1": glorot(k1, (d, config.hidden)), "b1": jnp.zeros(config.hidden),
            "w2": glorot(k2, (config.hidden, num_labels)), "b2": jnp.zeros(num_labels)}
  tx = optax.adam(config.learning_rate)

  def loss_fn(p, xb, yb, wb, k):
    ce = optax.softmax_cross_entropy_with_integer_labels(_logits(p, xb, k, config.dropout), yb)
    return jnp.sum(wb * ce) / jnp.sum(wb)

  def step(carry, batch):
    p, opt = carry
    idx, wb, k = batch
    grads = jax.grad(loss_fn)(p, x[idx], y[idx], wb, k)
    updates, opt = tx.update(grads, opt, p)
    return (optax.apply_updates(p, updates), opt), None

  def epoch(carry, k):
    perm_key, drop_key = jax.random.split(k)
    # The last batch is filled up with weight-0 rows, so every step has one shape.
    perm = jnp.concatenate([jax.random.permutation(perm_key, n),
                            jnp.zeros(steps * bs - n, jnp.int32)])
    w = (jnp.arange(steps * bs) < n).astype(jnp.float32)
    batches = (perm.reshape(steps, bs), w.reshape(steps, bs),
               jax.random.split(drop_key, steps))
    return jax.lax.scan(step, carry, batches)[0], None

  (params, _), _ = jax.lax.scan(epoch, (params, tx.init(params)),
                                jax.random.split(loop_key, config.epochs))
  return params


@jax.jit
def _predict(params, x):
  return jnp.argmax(_logits(params, l2_normalize(x)), axis=-1).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class MLPClassifier:
  """A trained MLP: `params` {"w1": [d, h], "b1": [h], "w2": [h, L], "b2": [L]} float32."""
  params: dict

  def predict(self, x) -> np.ndarray:
    """[n, d] float encodings -> [n] int32 labels."""
    return np.asarray(_predict(self.params, x))


def train_mlp(x, y, num_labels: int, *, config: MLPConfig = MLPConfig(), seed: int = 0
              ) -> MLPClassifier:
  """Trains the baseline on frozen encodings.

  Args:
    x: [n, d] float encodings.
    y: [n] int labels in [0, num_labels).
    num_labels: size of the softmax.
    config: the settings (module docstring).
    seed: all randomness derives from it.
  """
  params = _train(l2_normalize(x), jnp.asarray(y, jnp.int32), jax.random.key(seed),
                  num_labels=num_labels, config=config)
  return MLPClassifier(params)


def mlp_accuracy(train_x, train_y, test_x, test_y, num_labels: int, *,
                 config: MLPConfig = MLPConfig(), seed: int = 0) -> float:
  """Test accuracy of the baseline trained on (train_x, train_y)."""
  clf = train_mlp(train_x, train_y, num_labels, config=config, seed=seed)
  return float(np.mean(clf.predict(test_x) == np.asarray(test_y)))
