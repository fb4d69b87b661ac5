"""ConvFiT's training losses, as pure functions of embeddings, labels and a weight mask.

Stage 1 uses `mneg_loss` (multiple-negatives ranking over the global batch). Stage 2
on the paper's pairs (`train.sampler=pairs`) uses one of `STAGE2_LOSSES`, all called as

  loss_fn(u, v, labels, weights=None, *, params=None) -> scalar float32

with `u, v: [batch, d] float32` the two sentences of each pair, `labels: [batch] int32`
(1 same intent, 0 different) and `weights: [batch] float32` (1 on real rows, 0 on
padding rows). A row of weight 0 changes nothing: not the value, not the gradient, and
not which pairs `ocl` selects as hard. Only `smax` uses `params` (its classifier,
`heads.PairClassifier` or a mapping with `kernel` and `bias`).

Each loss reproduces the sentence-transformers 6.3.0 loss of the same name on the same
embeddings (tests/test_losses.py checks it to 1e-5).

Stage 2 on label batches (`train.sampler=labels`: P intents x K utterances) uses one of
`DENSE_LOSSES`, called on the batch's sentences rather than on pairs:

  loss_fn(emb, labels, weights=None, *, params=None, **options) -> scalar float32

with `emb: [n, d]`, `labels: [n] int32` intent ids and `weights: [n] float32`. The pair
losses (ocl, cos, smax, cl) score every pair i < j of the batch (`dense_pair_loss`);
`supcon_loss` ranks each utterance's same-intent utterances above the rest. Under
`jax.jit` with the batch sharded over the `data` axis the [n, n] similarities span the
global batch: XLA gathers the embeddings of every device and host, as for `mneg_loss`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from convfit_jax.models import heads

OCL_REDUCTIONS = ("sum", "mean")


def _pair_cos(u: jax.Array, v: jax.Array) -> jax.Array:
  """cos(u_i, v_i): [batch, d] x [batch, d] -> [batch] float32."""
  return jnp.sum(heads.l2_normalize(u) * heads.l2_normalize(v), axis=-1)


def _weights(weights: jax.Array | None, n: int) -> jax.Array:
  return jnp.ones((n,), jnp.float32) if weights is None else weights.astype(jnp.float32)


def _weighted_mean(x: jax.Array, w: jax.Array) -> jax.Array:
  # An all-padding batch gives 0, not NaN.
  return jnp.sum(w * x) / jnp.maximum(jnp.sum(w), 1e-12)


def mneg_loss(contexts: jax.Array, responses: jax.Array, *, scale: float = 20.0,
              symmetric: bool = False, weights: jax.Array | None = None,
              response_ids: jax.Array | None = None) -> jax.Array:
  """Multiple-negatives ranking loss (Henderson et al. 2017; ConvFiT Stage 1).

  S_ij = scale * cos(c_i, r_j); each context takes a softmax over all responses of the
  batch with its own response r_i as the target. The true response is in the softmax
  denominator, as in sentence-transformers' MultipleNegativesRankingLoss; the paper's
  Eq. 1 prints the denominator as the sum over j != i, which we do not follow.

  Under `jax.jit` with the batch sharded over the `data` axis, XLA gathers the response
  columns, so every context is scored against the responses of every device.

  Args:
    contexts: [batch, d] float.
    responses: [batch, d] float; row i is the true response of context i.
    scale: D, the inverse temperature.
    symmetric: also rank the contexts for each response and average the two
      cross-entropies per row, as MultipleNegativesSymmetricRankingLoss does.
    weights: [batch] float32, 0 on padding rows. A padding row is neither a query nor a
      candidate; the loss is the weighted mean over rows.
    response_ids: [batch] int32, one id per distinct response text. A column j != i with
      the same id as row i is a copy of the true response, so it is dropped from row i's
      softmax instead of being pushed away as a negative.
  Returns:
    scalar float32.
  """
  b = contexts.shape[0]
  w = _weights(weights, b)
  sim = scale * (heads.l2_normalize(contexts) @ heads.l2_normalize(responses).T)
  eye = jnp.eye(b, dtype=bool)
  real = w > 0
  # Masking rows as well as columns makes `keep` symmetric, which the backward term needs.
  keep = real[:, None] & real[None, :]
  if response_ids is not None:
    keep = keep & (response_ids[:, None] != response_ids[None, :])
  # The diagonal always stays, so even a padding row has a finite (and zero-weighted) loss.
  keep = keep | eye
  positive = jnp.diagonal(sim)
  forward = jax.nn.logsumexp(jnp.where(keep, sim, -jnp.inf), axis=1) - positive
  if symmetric:
    # Equal response ids are symmetric too, so the contexts' softmax uses the same `keep`.
    backward = jax.nn.logsumexp(jnp.where(keep, sim, -jnp.inf), axis=0) - positive
    forward = 0.5 * (forward + backward)
  return _weighted_mean(forward, w)


def smax_loss(u: jax.Array, v: jax.Array, labels: jax.Array, weights: jax.Array | None = None,
              *, params: heads.PairClassifier | Mapping[str, jax.Array] | None = None) -> jax.Array:
  """Softmax classification of the pair (SBERT's SoftmaxLoss): weighted mean cross-entropy.

  Args:
    u, v: [batch, d] float.
    labels: [batch] int32, the class (1 same intent, 0 different).
    weights: [batch] float32 or None.
    params: the classifier, a `PairClassifier` or {"kernel": [3d, 2], "bias": [2]}.
  Returns:
    scalar float32.
  """
  if params is None:
    raise ValueError("smax needs params: a PairClassifier or {'kernel', 'bias'}")
  if isinstance(params, Mapping):
    logits = heads.pair_logits(u, v, params["kernel"], params["bias"])
  else:
    logits = params(u, v)
  return cross_entropy(logits, labels, weights)


def cross_entropy(logits: jax.Array, labels: jax.Array, weights: jax.Array | None = None
                  ) -> jax.Array:
  """Weighted mean cross-entropy: logits [n, c] float, labels [n] int, weights [n] float32
  or None -> scalar float32 (`smax_loss`'s and the Stage 2 intent head's)."""
  logp = jax.nn.log_softmax(logits, axis=-1)
  nll = -jnp.take_along_axis(logp, labels.astype(jnp.int32)[:, None], axis=-1)[:, 0]
  return _weighted_mean(nll, _weights(weights, logits.shape[0]))


def cos_loss(u: jax.Array, v: jax.Array, labels: jax.Array, weights: jax.Array | None = None,
             *, params=None, pos_target: float = 0.8, neg_target: float = 0.3) -> jax.Array:
  """Weighted mean of (cos(u, v) - target)^2, target 0.8 for same-intent pairs, 0.3 otherwise.

  sentence-transformers' CosineSimilarityLoss (MSE) with those targets as its float labels.

  Args:
    u, v: [batch, d] float.
    labels: [batch] int32, 1 same intent, 0 different.
    weights: [batch] float32 or None.
    params: unused; part of the common Stage 2 signature.
  Returns:
    scalar float32.
  """
  del params
  target = jnp.where(labels == 1, pos_target, neg_target)
  return _weighted_mean(jnp.square(_pair_cos(u, v) - target), _weights(weights, u.shape[0]))


def cl_loss(u: jax.Array, v: jax.Array, labels: jax.Array, weights: jax.Array | None = None,
            *, params=None, margin: float = 0.5) -> jax.Array:
  """Plain contrastive loss (Hadsell et al. 2006; the paper's Eq. 2): every pair counts.

  With d = 1 - cos(u, v): 0.5 * (y d^2 + (1 - y) max(0, margin - d)^2), weighted mean
  over rows, as sentence-transformers' ContrastiveLoss (cosine distance, size_average).

  Args:
    u, v: [batch, d] float.
    labels: [batch] int32, 1 same intent, 0 different.
    weights: [batch] float32 or None.
    params: unused; part of the common Stage 2 signature.
  Returns:
    scalar float32.
  """
  del params
  d = 1.0 - _pair_cos(u, v)
  y = labels.astype(jnp.float32)
  per_pair = 0.5 * (y * jnp.square(d) + (1.0 - y) * jnp.square(jax.nn.relu(margin - d)))
  return _weighted_mean(per_pair, _weights(weights, u.shape[0]))


def ocl_loss(u: jax.Array, v: jax.Array, labels: jax.Array, weights: jax.Array | None = None,
             *, params=None, margin: float = 0.5, reduction: str = "sum") -> jax.Array:
  """Online contrastive loss: only the hard pairs of the batch count.

  The rule of sentence-transformers 6.3.0's OnlineContrastiveLoss, with d = 1 - cos(u, v):
  a negative pair is hard when d < the largest positive distance (the mean negative
  distance when the batch has no positive); a positive pair is hard when d > the
  smallest negative distance (the mean positive distance when it has no negative).
  Hard positives add d^2, hard negatives max(0, margin - d)^2. Pairs whose label is
  neither 0 nor 1 are ignored, as there.

  Padding rows (weight 0) take no part in the thresholds either, so they never change
  which real pairs are hard. Real rows count with their weight.

  Args:
    u, v: [batch, d] float.
    labels: [batch] int32, 1 same intent, 0 different.
    weights: [batch] float32 or None.
    params: unused; part of the common Stage 2 signature.
    margin: the distance negatives are pushed beyond.
    reduction: "sum" (the default) is sentence-transformers' reduction and the one the
      paper's hyper-parameters (lr 2e-5, batch 32) were tuned with: the loss grows with
      the number of hard pairs. "mean" divides that sum by the total weight of the batch
      (the number of real pairs), so the scale no longer depends on the batch size.
  Returns:
    scalar float32.
  """
  del params
  if reduction not in OCL_REDUCTIONS:
    raise ValueError(f"reduction must be one of {OCL_REDUCTIONS}, got {reduction!r}")
  w = _weights(weights, u.shape[0])
  d = 1.0 - _pair_cos(u, v)
  # Selection only: comparisons carry no gradient, as in the torch boolean indexing.
  ds = jax.lax.stop_gradient(d)
  real = w > 0
  pos = real & (labels == 1)
  neg = real & (labels == 0)
  n_pos = jnp.sum(pos)
  n_neg = jnp.sum(neg)
  pos_max = jnp.max(jnp.where(pos, ds, -jnp.inf))
  neg_min = jnp.min(jnp.where(neg, ds, jnp.inf))
  pos_mean = jnp.sum(jnp.where(pos, ds, 0.0)) / jnp.maximum(n_pos, 1)
  neg_mean = jnp.sum(jnp.where(neg, ds, 0.0)) / jnp.maximum(n_neg, 1)
  hard_neg = neg & (ds < jnp.where(n_pos > 0, pos_max, neg_mean))
  hard_pos = pos & (ds > jnp.where(n_neg > 0, neg_min, pos_mean))
  per_pair = (jnp.where(hard_pos, jnp.square(d), 0.0)
              + jnp.where(hard_neg, jnp.square(jax.nn.relu(margin - d)), 0.0))
  total = jnp.sum(w * per_pair)
  if reduction == "mean":
    return total / jnp.maximum(jnp.sum(w), 1e-12)
  return total


Stage2Loss = Callable[..., jax.Array]

STAGE2_LOSSES: dict[str, Stage2Loss] = {
    "smax": smax_loss,
    "cos": cos_loss,
    "ocl": ocl_loss,
    "cl": cl_loss,
}


# Stands for -inf in masked similarities: exp() of it is exactly 0 next to any real
# similarity (|s| <= scale), yet a row with nothing left stays finite, gradient included.
_MASKED = -1e9
SUPCON_DENOMINATORS = ("all", "negatives")


def dense_pair_loss(emb: jax.Array, labels: jax.Array, weights: jax.Array | None = None, *,
                    loss: str, params=None, negative_ratio: float = 0.0, **options) -> jax.Array:
  """A Stage 2 pair loss over every pair i < j of the batch.

  Positives are the same-intent pairs, negatives all the others. `negative_ratio` sets
  their balance: 0 weighs every pair 1 (a P x K batch has about P times more negatives
  than positives); r > 0 scales the negatives so that their total weight is r times the
  positives' (the paper's pairs have r = 2n, 6 at n = 3). A batch without positives
  keeps weight 1 on its negatives. ocl is reduced by the weighted mean (its "sum" would
  grow with the square of the batch).

  Args:
    emb: [n, d] float, the batch's sentence embeddings.
    labels: [n] int32 intent ids.
    weights: [n] float32, 0 on padding rows; a pair weighs the product of its rows'.
    loss: a key of `STAGE2_LOSSES`.
    params: the pair classifier, for smax.
    negative_ratio: see above.
    options: passed to the pair loss (margin for ocl / cl).
  Returns:
    scalar float32.
  """
  n = emb.shape[0]
  w = _weights(weights, n)
  # Static, so the gather indices are constants of the compiled step.
  i, j = (jnp.asarray(x, jnp.int32) for x in np.triu_indices(n, k=1))
  same = labels[i] == labels[j]
  pair_w = w[i] * w[j]
  if negative_ratio > 0:
    pos_total = jnp.sum(jnp.where(same, pair_w, 0.0))
    neg_total = jnp.sum(jnp.where(same, 0.0, pair_w))
    balance = negative_ratio * pos_total / jnp.maximum(neg_total, 1e-12)
    pair_w = jnp.where(same, pair_w, pair_w * jnp.where(pos_total > 0, balance, 1.0))
  if loss == "ocl":
    options = {"reduction": "mean", **options}
  return STAGE2_LOSSES[loss](emb[i], emb[j], same.astype(jnp.int32), pair_w, params=params,
                             **options)


def supcon_loss(emb: jax.Array, labels: jax.Array, weights: jax.Array | None = None, *,
                params=None, scale: float = 20.0, denominator: str = "all") -> jax.Array:
  """Supervised contrastive loss over the batch (Khosla et al. 2020, L_out).

  S_ij = scale * cos(e_i, e_j). Every row i with at least one positive (another real row
  of its intent) is an anchor; its loss is the mean over its positives p of
  -log(exp(S_ip) / sum_a exp(S_ia)), where a runs over
    "all": every real row but i (Khosla et al.'s denominator);
    "negatives": p and the rows of other intents (label-masked multiple negatives:
      sentence-transformers' MNRL with the other same-intent columns masked out).
  The loss is the weighted mean over anchors; a row alone with its intent in the batch
  only serves as a negative to the others.

  Args:
    emb: [n, d] float.
    labels: [n] int32 intent ids.
    weights: [n] float32, 0 on padding rows (neither anchors, positives nor negatives).
    params: unused; part of the common Stage 2 signature.
    scale: the inverse temperature (20 = temperature 0.05, as `mneg_loss`).
    denominator: "all" or "negatives", see above.
  Returns:
    scalar float32.
  """
  del params
  if denominator not in SUPCON_DENOMINATORS:
    raise ValueError(f"denominator must be one of {SUPCON_DENOMINATORS}, got {denominator!r}")
  n = emb.shape[0]
  w = _weights(weights, n)
  real = w > 0
  e = heads.l2_normalize(emb)
  sim = scale * (e @ e.T)
  same = labels[:, None] == labels[None, :]
  other = ~jnp.eye(n, dtype=bool)
  positive = same & other & real[:, None] & real[None, :]
  if denominator == "all":
    log_norm = jax.nn.logsumexp(jnp.where(other & real[None, :], sim, _MASKED), axis=1)[:, None]
  else:
    negatives = jax.nn.logsumexp(jnp.where(~same & real[None, :], sim, _MASKED), axis=1)
    log_norm = jnp.logaddexp(sim, negatives[:, None])
  n_pos = jnp.sum(positive, axis=1)
  per_anchor = -jnp.sum(jnp.where(positive, sim - log_norm, 0.0), axis=1) / jnp.maximum(n_pos, 1)
  return _weighted_mean(per_anchor, w * (n_pos > 0))


# The losses of `train.sampler=labels`; each takes (emb, labels, weights, *, params, ...).
DENSE_LOSSES: dict[str, Stage2Loss] = {
    **{name: functools.partial(dense_pair_loss, loss=name) for name in ("smax", "cos", "ocl", "cl")},
    "supcon": supcon_loss,
}


def duplicate_ids(hashes: jax.Array) -> jax.Array:
  """Per row, the first row of the batch with the same tokens: [B, 2] int32 digests
  (`batching.token_hashes`) -> [B] int32.

  Rows that tokenise identically embed identically, so they are exactly the false
  negatives to mask; the 64-bit digests compare them at [B, B] memory.
  """
  same = jnp.all(hashes[:, None, :] == hashes[None, :, :], axis=-1)
  return jnp.argmax(same, axis=1).astype(jnp.int32)
