"""Sequence packing: the placement, and packed encodings equal to one sentence per row."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from convfit_jax.models import sentence
from convfit_jax.data import packing


def test_place_first_fit_decreasing_numbers_segments_left_to_right():
  placed = packing.place(np.array([5, 3, 8, 2, 2]), 8)
  # 8 fills row 0; 5 opens row 1, 3 joins it; the 2s open row 2.
  np.testing.assert_array_equal(placed, [[1, 1, 0], [1, 2, 5], [0, 1, 0], [2, 1, 0], [2, 2, 2]])
  assert packing.rows_needed(np.array([5, 3, 8, 2, 2]), 8) == 3
  assert packing.rows_for([np.array([4, 4]), np.array([8, 8, 8])], 8, multiple=2) == 4


@pytest.mark.parametrize("lengths, width, rows, message", [
    ([3, 9], 8, None, "lengths must be in 1..8"),
    ([0, 2], 8, None, "lengths must be in 1..8"),
    ([5, 5, 5], 8, 2, "do not fit in 2 rows of 8"),
])
def test_place_rejects(lengths, width, rows, message):
  with pytest.raises(ValueError, match=message):
    packing.place(np.array(lengths), width, rows)


def test_pack_keeps_every_token_in_order_from_either_padding_side():
  ids = np.array([[11, 12, 13, 0], [14, 15, 0, 0], [0, 16, 17, 18]])
  packed = packing.pack(ids, (ids > 0).astype(np.int32), rows=2, width=5, row_offset=4)
  np.testing.assert_array_equal(packed.input_ids, [[11, 12, 13, 14, 15], [16, 17, 18, 0, 0]])
  np.testing.assert_array_equal(packed.segment_ids, [[1, 1, 1, 2, 2], [1, 1, 1, 0, 0]])
  np.testing.assert_array_equal(packed.position_ids, [[0, 1, 2, 0, 1], [0, 1, 2, 0, 0]])
  np.testing.assert_array_equal(packed.slots, [[4, 1], [4, 2], [5, 1]])


def test_place_scales_and_calls_split_rows_into_blocks():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 49, 20000)
  placed = packing.place(lengths, 48)
  rows = placed[:, 0].max() + 1
  used = np.bincount(placed[:, 0], lengths)
  assert used.max() <= 48 and lengths.sum() / (rows * 48) > 0.97
  starts = np.zeros(rows, np.int64)  # sequences sit end to end in segment order
  for i in np.lexsort((placed[:, 1], placed[:, 0])):
    assert placed[i, 2] == starts[placed[i, 0]]
    starts[placed[i, 0]] += lengths[i]
  seen = []
  for k, (idx, where) in enumerate(packing.calls(placed, 64)):
    assert where[:, 0].min() >= 0 and where[:, 0].max() < 64
    np.testing.assert_array_equal(where[:, 0] + 64 * k, placed[idx, 0])
    np.testing.assert_array_equal(where[:, 1:], placed[idx, 1:])
    seen.extend(idx)
  assert k == (rows - 1) // 64
  np.testing.assert_array_equal(np.sort(seen), np.arange(lengths.size))
  packed = packing.fill([np.full(n, 7) for n in lengths[idx]], where, 64, 48)
  assert (packed.input_ids == 7).sum() == lengths[idx].sum()


def _sentences(rng, n, width, pad, left=False):
  lengths = rng.integers(2, width + 1, n)
  ids = np.full((n, width), pad, np.int32)
  mask = np.zeros((n, width), np.int32)
  for r, k in enumerate(lengths):
    cols = slice(width - k, width) if left and r % 2 else slice(0, k)
    ids[r, cols], mask[r, cols] = rng.integers(5, 200, k), 1
  return ids, mask


@pytest.mark.parametrize("kind, pooling", [("bert", "mean"), ("roberta", "mean"), ("bert", "cls"),
                                           ("mpnet", "mean")])
def test_packed_encodings_and_gradients_equal_padded(kind, pooling, tiny_bert_dir, tiny_roberta_dir,
                                                     tiny_mpnet_dir):
  folder = {"bert": tiny_bert_dir, "roberta": tiny_roberta_dir, "mpnet": tiny_mpnet_dir}[kind]
  model, ck = sentence.load(folder, projection_dim=8)
  model.pooling = pooling
  rng = np.random.default_rng(0)
  # Left padding only for RoBERTa: HF BERT numbers positions from the padding, so a
  # left-padded BERT sentence is not the sentence alone.
  ids, mask = _sentences(rng, 12, 10, ck.config.pad_token_id, left=kind != "bert")
  packed = packing.pack(ids, mask, rows=packing.rows_needed(mask.sum(1), 16), width=16)
  assert packed.input_ids.shape[0] < 12  # several sentences share rows
  graphdef, params = nnx.split(model)
  weights = jnp.asarray(rng.standard_normal((12, 8)), jnp.float32)

  def padded(p):
    return nnx.merge(graphdef, p)(jnp.asarray(ids), jnp.asarray(mask))

  def packed_fn(p):
    return nnx.merge(graphdef, p)(jnp.asarray(packed.input_ids), jnp.asarray(packed.segment_ids),
                                  position_ids=jnp.asarray(packed.position_ids),
                                  slots=jnp.asarray(packed.slots))

  np.testing.assert_allclose(packed_fn(params), padded(params), atol=1e-5)
  grads = [jax.grad(lambda p, f=f: jnp.sum(f(p) * weights))(params) for f in (padded, packed_fn)]
  for a, b in zip(jax.tree.leaves(grads[0]), jax.tree.leaves(grads[1])):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
