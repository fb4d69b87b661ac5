"""The optimisers: AdamW with linear warm-up then linear decay, as sentence-transformers and
HF Trainer train (no weight decay on biases and LayerNorm parameters), or SGD with
momentum and a step decay, as the recursive convolutional auto-encoder trains
(`train.optimizer`); optional global-norm clipping for both.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import optax

PyTree = Any


def warmup_steps_for(total_steps: int, warmup_fraction: float) -> int:
  """ceil(fraction * total), as sentence-transformers' `fit` computes it."""
  return int(math.ceil(total_steps * warmup_fraction))


def linear_warmup_decay(peak_lr: float, total_steps: int, warmup_fraction: float) -> optax.Schedule:
  """0 -> peak_lr linearly over the warm-up steps, then linearly to 0 at `total_steps`.

  The same curve as transformers' `get_linear_schedule_with_warmup`.
  """
  if total_steps < 1:
    raise ValueError(f"total_steps must be >= 1, got {total_steps}")
  warmup = min(warmup_steps_for(total_steps, warmup_fraction), total_steps)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak_lr, warmup),
       optax.linear_schedule(peak_lr, 0.0, total_steps - warmup)],
      boundaries=[warmup])


def _names(path: Sequence[Any]) -> list[str]:
  """The keys of a pytree path as strings (dict keys, sequence indices)."""
  return [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]


def _is_no_decay(path: Sequence[Any]) -> bool:
  names = _names(path)
  # NNX names LayerNorm parameters `scale`/`bias` under a module whose name holds
  # "norm"; every `bias` (Dense, LayerNorm) is exempt too, as HF's
  # no_decay = ["bias", "LayerNorm.weight"].
  return names[-1] == "bias" or any("norm" in n.lower() for n in names[:-1])


def weight_decay_mask(params: PyTree) -> PyTree:
  """True where AdamW applies weight decay: not on biases, not on LayerNorm parameters."""
  return jax.tree_util.tree_map_with_path(lambda path, _: not _is_no_decay(path), params)


def head_labels(params: PyTree, heads: Sequence[str]) -> PyTree:
  """"head" for parameters whose path ('/'-joined names) starts with one of `heads`, else "body"."""
  def label(path, _):
    name = "/".join(_names(path))
    return "head" if any(name.startswith(h) for h in heads) else "body"

  return jax.tree_util.tree_map_with_path(label, params)


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_fraction: float = 0.1,
                   weight_decay: float = 0.01, clip_norm: float | None = None,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
                   head_learning_rate: float = 0.0, heads: Sequence[str] = ()
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW with the warm-up/decay schedule; returns (transformation, schedule).

  Args:
    learning_rate: peak learning rate.
    total_steps: optimiser steps of the whole run (the decay reaches 0 there).
    warmup_fraction: share of `total_steps` spent warming up.
    weight_decay: decoupled weight decay, masked by `weight_decay_mask`.
    clip_norm: global gradient-norm clipping threshold; None or <= 0 disables it.
    head_learning_rate: > 0: the peak learning rate of the parameters under `heads` (same
      schedule shape), e.g. a freshly initialised classifier on a pretrained encoder, which
      barely moves at the encoder's rate.
    heads: '/'-joined parameter path prefixes, e.g. "nli".
  """
  schedule = linear_warmup_decay(learning_rate, total_steps, warmup_fraction)
  adamw_at = lambda s: optax.adamw(s, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                                   mask=weight_decay_mask)
  adamw = adamw_at(schedule)
  if head_learning_rate > 0 and heads:
    head_schedule = linear_warmup_decay(head_learning_rate, total_steps, warmup_fraction)
    adamw = optax.multi_transform({"body": adamw, "head": adamw_at(head_schedule)},
                                  lambda params: head_labels(params, heads))
  if clip_norm is not None and clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(clip_norm), adamw), schedule
  return adamw, schedule


def step_decay(learning_rate: float, *, decay_start: int, decay_every: int, decay_factor: float
               ) -> optax.Schedule:
  """`learning_rate` until `decay_start`, then multiplied by `decay_factor` every
  `decay_every` steps (the first time at decay_start + decay_every); decay_every <= 0: constant."""
  if decay_every <= 0:
    return optax.constant_schedule(learning_rate)
  return optax.exponential_decay(learning_rate, transition_steps=decay_every,
                                 decay_rate=decay_factor, transition_begin=decay_start,
                                 staircase=True)


def make_sgd(*, learning_rate: float, momentum: float, clip_norm: float | None,
             decay_start: int, decay_every: int, decay_factor: float
             ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """SGD with (heavy-ball) momentum on `step_decay`, after global-norm clipping; returns
  (transformation, schedule). Clipping is what lets the paper's learning rate reach 30."""
  schedule = step_decay(learning_rate, decay_start=decay_start, decay_every=decay_every,
                        decay_factor=decay_factor)
  sgd = optax.sgd(schedule, momentum=momentum or None)
  if clip_norm is not None and clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(clip_norm), sgd), schedule
  return sgd, schedule


def from_config(train_config, total_steps: int) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """The optimiser `train.optimizer` names ("adamw", the default, or "sgd") with a `train`
  config block's settings: learning_rate, clip_norm and, for AdamW, warmup_fraction,
  weight_decay and, where the block has them, head_learning_rate and heads; for SGD,
  momentum, decay_start, decay_every, decay_factor."""
  t = train_config
  kind = t.get("optimizer", "adamw")
  if kind == "sgd":
    return make_sgd(learning_rate=t.learning_rate, momentum=t.momentum, clip_norm=t.clip_norm,
                    decay_start=t.decay_start, decay_every=t.decay_every,
                    decay_factor=t.decay_factor)
  if kind != "adamw":
    raise ValueError(f"train.optimizer={kind!r}; adamw or sgd")
  return make_optimizer(learning_rate=t.learning_rate, total_steps=total_steps,
                        warmup_fraction=t.warmup_fraction, weight_decay=t.weight_decay,
                        clip_norm=t.clip_norm, head_learning_rate=t.get("head_learning_rate", 0.0),
                        heads=tuple(t.get("heads", ())))
