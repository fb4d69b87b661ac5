"""Tests of FSDP parameter sharding over the mesh `model` axis (`sharding.param_shardings`).

Also the workers' script of the multi-host test (see tests/multihost.py).
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

import multihost
from convfit_jax.configs import stage2 as stage2_config
from convfit_jax import sharding
from convfit_jax.data import batching, pairs as pairs_lib
from convfit_jax.models import heads
from convfit_jax.models.dual_encoder import DualEncoder
from convfit_jax.models.sentence import SentenceEncoder
from convfit_jax.models.siamese import SiameseEncoder
from convfit_jax.models.transformer import TransformerConfig
from convfit_jax.train import checkpointing, optimizer, stage1, stage2, trainer, train_state

M = sharding.MODEL
# Per-layer kernels at or above the 2**14-element threshold (attention 128x128, FFN
# 128x260); the vocabulary 1002 is divisible by 2 but not by 4.
CFG = TransformerConfig(vocab_size=1002, hidden_size=128, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=260, max_position_embeddings=32)
MPNET_CFG = TransformerConfig.from_hf_dict(dict(
    model_type="mpnet", vocab_size=1002, hidden_size=128, num_hidden_layers=2,
    num_attention_heads=4, intermediate_size=260, max_position_embeddings=32))
B, L = 16, 8


def _specs(tree):
  return jax.tree.map(lambda s: s.spec, tree)


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _assert_placed_as(tree, shardings):
  for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    assert x.sharding.is_equivalent_to(s, x.ndim), (x.sharding, s)


@pytest.mark.parametrize("model_parallel, embedding, ffn_in", [
    (2, P(M, None), P(None, M)),  # 1002 and 260 are the largest dimensions divisible by 2
    (4, P(None, M), P(None, M)),  # 1002 % 4 != 0: the embedding splits its 128 columns
])
def test_param_shardings_split_large_arrays_over_model(model_parallel, embedding, ffn_in):
  mesh = sharding.make_mesh(model_parallel)
  model = SentenceEncoder(CFG, rngs=nnx.Rngs(0), projection_dim=64)
  tx, _ = optimizer.make_optimizer(learning_rate=1e-3, total_steps=10)
  state = train_state.TrainState.create(model, tx)
  shardings = sharding.param_shardings(state, mesh)
  specs = _specs(shardings.params)
  tf = specs["transformer"]
  assert tf["embeddings"]["word_embeddings"]["embedding"] == embedding
  layer = tf["layers"][1]
  for name in ("query", "key", "value", "output"):  # [128, 128]: the first of equal dimensions
    assert layer["attention"][name]["kernel"] == P(M, None)
  assert layer["intermediate"]["kernel"] == ffn_in
  assert layer["output"]["kernel"] == P(M, None)
  # Below 2**14 elements: replicated.
  assert tf["embeddings"]["position_embeddings"]["embedding"] == P()  # [32, 128]
  assert specs["projection"]["dense"]["kernel"] == P()  # [128, 64]
  assert layer["intermediate"]["bias"] == P() and layer["layer_norm"]["scale"] == P()
  assert _specs(shardings).step == P() and _specs(shardings).rng == P()
  # The AdamW moments are sharded as their parameters.
  adam = shardings.opt_state[0]
  assert _specs(adam.mu) == specs and _specs(adam.nu) == specs
  # Large arrays no dimension of which divides stay replicated.
  odd = sharding.param_shardings({"w": jax.ShapeDtypeStruct((129, 127), np.float32)}, mesh)
  assert odd["w"].spec == P()

  placed = train_state.place(state, shardings)
  num_sharded = 0
  for x, spec in zip(jax.tree.leaves(placed), jax.tree.leaves(_specs(shardings))):
    expected = tuple(n // model_parallel if axis == M else n
                     for n, axis in zip(x.shape, tuple(spec) + (None,) * x.ndim))
    assert {s.data.shape for s in x.addressable_shards} == {expected}
    if spec != P():
      num_sharded += 1
      # Each model-axis group holds model_parallel different pieces of the array.
      assert len({str(s.index) for s in x.addressable_shards}) == model_parallel
  assert num_sharded == 3 * (1 + 2 * 6)  # params, mu, nu: embedding + 6 kernels per layer


def test_model_parallel_one_replicates_everything():
  mesh = sharding.make_mesh(1)
  tree = {"big": jax.ShapeDtypeStruct((1024, 1024), np.float32)}
  assert sharding.param_shardings(tree, mesh)["big"].spec == P()


def test_checkpoint_restores_a_sharded_state_sharded(tmp_path):
  mesh = sharding.make_mesh(2)
  tx, _ = optimizer.make_optimizer(learning_rate=1e-3, total_steps=10)

  def placed_state(seed):
    state = train_state.TrainState.create(SentenceEncoder(CFG, rngs=nnx.Rngs(seed)), tx, seed=seed)
    return train_state.place(state, sharding.param_shardings(state, mesh))

  saved = placed_state(0)
  ckpt = checkpointing.Checkpointer(tmp_path, save_every=1)
  ckpt.save(saved, force=True)
  ckpt.close()
  fresh = placed_state(1)
  ckpt = checkpointing.Checkpointer(tmp_path, save_every=1)
  restored, _ = ckpt.restore_or_init(fresh)
  ckpt.close()
  _assert_placed_as(restored, sharding.param_shardings(fresh, mesh))
  assert _max_diff(fresh.params, saved.params) > 1e-3
  assert _max_diff(restored.arrays(), saved.arrays()) == 0.0


def _stage2_batch(seed, sampler="pairs"):
  """B // 2 pairs over B sentences packed two to a row (`data.packing`): [B // 2, 2L] rows;
  for sampler=labels the B sentences are B // 4 intents x 4."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, L + 1, size=(B // 2, 2))
  col = np.arange(2 * L)[None, :]
  first, second = col < lengths[:, :1], (col >= L) & (col < L + lengths[:, 1:])
  mask = (first * 1 + second * 2).astype(np.int32)  # sentence numbers 1, 2; 0 on padding
  ids = (rng.integers(1, CFG.vocab_size, size=mask.shape) * (mask > 0)).astype(np.int32)
  positions = np.where(second, col - L, np.where(first, col, 0)).astype(np.int32)
  slots = np.stack([np.arange(B) // 2, np.arange(B) % 2 + 1], axis=1).astype(np.int32)
  same, different = pairs_lib.loss_targets("smax")
  if sampler == "labels":
    return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "slots": slots,
            "labels": rng.permutation(np.arange(B) % (B // 4)).astype(np.int32),
            "weights": (np.arange(B) != B - 1).astype(np.float32)}
  return {"input_ids": ids, "attention_mask": mask, "position_ids": positions, "slots": slots,
          "u_idx": rng.permutation(B)[:B // 2].astype(np.int32),
          "v_idx": rng.permutation(B)[:B // 2].astype(np.int32),
          "targets": np.where(np.arange(B // 2) % 2, same, different).astype(np.float32),
          "weights": np.ones((B // 2,), np.float32)}


def _stage2_run(model_parallel, objective="smax"):
  """Two Stage 2 steps (the first has learning rate 0: warm-up) on a data x model mesh."""
  mesh = sharding.make_mesh(model_parallel)
  config = stage2_config.get_config()
  config.train.sampler, config.train.loss = stage2_config.parse_objective(objective)
  config.train.learning_rate = 1e-3
  model = SiameseEncoder(SentenceEncoder(CFG, rngs=nnx.Rngs(0), projection_dim=64),
                         heads.PairClassifier(64, rngs=nnx.Rngs(1)))
  state, _ = trainer.init_state(config, model, total_steps=10, mesh=mesh)
  shardings = sharding.param_shardings(state, mesh)
  _assert_placed_as(state, shardings)
  initial = jax.device_get(state.params)
  # As the trainer jits the Stage 2 task's step.
  step_fn = trainer.make_train_step(
      functools.partial(stage2.loss_and_grads, train_config=config.train), mesh)
  losses = []
  for seed in range(2):
    batch = _stage2_batch(seed, config.train.sampler)
    state, out = step_fn(state, sharding.global_batch(batch, mesh))
    losses.append(float(out["loss"]))
  _assert_placed_as(state, shardings)
  return losses, initial, state.host_arrays()[0]


@pytest.mark.parametrize("objective", ["smax", "supcon", "dense_smax"])
def test_stage2_step_with_sharded_params_equals_replicated(objective):
  losses8, initial, params8 = _stage2_run(1, objective)
  losses2, _, params2 = _stage2_run(2, objective)
  np.testing.assert_allclose(losses2, losses8, rtol=1e-5, atol=1e-5)
  assert _max_diff(params8, initial) > 1e-4  # the second step trained
  assert _max_diff(params2, params8) < 1e-5


def _stage1_batch(seed):
  """B (context, response) pairs of random tokens: *_ids, *_mask [B, L] int32, weights [B]."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, L + 1, size=(2, B))
  masks = (np.arange(L)[None, None, :] < lengths[:, :, None]).astype(np.int32)
  ids = (rng.integers(1, CFG.vocab_size, size=(2, B, L)) * masks).astype(np.int32)
  return {"context_ids": ids[0], "context_mask": masks[0], "response_ids": ids[1],
          "response_mask": masks[1], "weights": np.ones((B,), np.float32)}


def _stage1_run(mesh, config=CFG, remat=False):
  """Two Stage 1 steps through `trainer.make_train_step` (gradient cache, 2 chunks, dropout)."""
  tx, _ = optimizer.make_optimizer(learning_rate=1e-3, total_steps=10)
  state = train_state.TrainState.create(
      DualEncoder(SentenceEncoder(config, rngs=nnx.Rngs(0), remat=remat)), tx)
  shardings = sharding.param_shardings(state, mesh)
  state = train_state.place(state, shardings)
  initial = jax.device_get(state.params)
  cfg = stage1.LossConfig(dropout=True, grad_cache=True, chunk_size=B // 2,
                          data_shards=mesh.shape[sharding.DATA])
  step_fn = trainer.make_train_step(functools.partial(stage1.state_loss_and_grads, cfg=cfg), mesh)
  losses = []
  for seed in range(2):
    batch = stage1.device_batch(batching.ConversationBatch(**_stage1_batch(seed)), mesh, cfg)
    state, out = step_fn(state, batch)
    losses.append(float(out["loss"]))
  _assert_placed_as(state, shardings)
  return losses, initial, state.host_arrays()[0]


@pytest.mark.parametrize("config, remat", [(CFG, False), (MPNET_CFG, True)], ids=["bert", "mpnet_remat"])
def test_stage1_step_with_sharded_params_equals_replicated(config, remat):
  # The reference keeps 4 data shards: the gradient-cache chunks (and so their dropout
  # masks) take rows from every data shard, so 8 x 1 would draw other masks.
  losses4, initial, params4 = _stage1_run(sharding.make_mesh(1, devices=jax.devices()[:4]), config)
  losses2, _, params2 = _stage1_run(sharding.make_mesh(2), config, remat)
  np.testing.assert_allclose(losses2, losses4, rtol=1e-5, atol=1e-5)
  assert _max_diff(params4, initial) > 1e-4
  assert _max_diff(params2, params4) < 1e-5


# --------------------------------------------------------------------------- multi-host


def _linear():
  return nnx.Linear(512, 64, rngs=nnx.Rngs(0))  # kernel [512, 64]: split 8 ways on rows


def _worker(process_id: int, out_dir: str) -> None:
  """One of 2 processes: writes its `host_arrays()` params of a model-sharded state to p{process_id}.npz."""
  mesh = sharding.make_mesh(model_parallel=8)  # the model axis spans both processes
  state = train_state.TrainState.create(_linear(), optax.sgd(0.1))
  state = train_state.place(state, sharding.param_shardings(state, mesh))
  kernel = state.params["kernel"]
  assert kernel.sharding.spec == P(M, None) and not kernel.is_fully_addressable
  try:  # why host_arrays gathers across processes instead of calling device_get
    jax.device_get(kernel)
    raise AssertionError("device_get fetched an array with pieces on the other process")
  except RuntimeError:
    pass
  np.savez(Path(out_dir) / f"p{process_id}.npz", **jax.device_get(state.host_arrays()[0]))


def test_host_arrays_gathers_a_model_axis_spanning_two_processes(tmp_path):
  multihost.launch(__file__, tmp_path)
  expected = nnx.to_pure_dict(nnx.state(_linear(), nnx.Param))
  for i in range(2):
    got = np.load(tmp_path / f"p{i}.npz")
    assert set(got) == set(expected)
    for k, v in expected.items():
      np.testing.assert_array_equal(got[k], np.asarray(v), err_msg=k)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
  with multihost.distributed(int(sys.argv[2]), int(sys.argv[3])):
    _worker(int(sys.argv[2]), sys.argv[4])
