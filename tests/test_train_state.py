"""Tests of the train core: optimiser schedule and weight-decay mask, train state, checkpoints,
the NaN guard and window-mean logging, the workdir, model state beyond parameters (BatchNorm).

Also the workers' script of the multi-host checkpoint test (see tests/multihost.py).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding, PartitionSpec as P

import multihost
from convfit_jax import sharding
from convfit_jax.models.sentence import SentenceEncoder
from convfit_jax.models.transformer import TransformerConfig
from convfit_jax.train import checkpointing, loop, optimizer, train_state
from convfit_jax.train import workdir as workdir_lib

TINY = TransformerConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                         intermediate_size=32, max_position_embeddings=16)


def _model(seed=0):
  return SentenceEncoder(TINY, rngs=nnx.Rngs(seed))


def test_schedule_matches_hf_linear_warmup():
  total, frac, peak = 50, 0.1, 2e-5
  sched = optimizer.linear_warmup_decay(peak, total, frac)
  warmup = 5  # ceil(0.1 * 50)
  for step in range(total + 1):
    # transformers.get_linear_schedule_with_warmup's multiplier.
    expected = step / warmup if step < warmup else max(0.0, (total - step) / (total - warmup))
    np.testing.assert_allclose(float(sched(step)), peak * expected, rtol=1e-6, atol=1e-12)
  assert optimizer.warmup_steps_for(55, 0.1) == 6


def test_weight_decay_mask_spares_biases_and_layer_norm():
  _, params = nnx.split(_model(), nnx.Param)
  mask = optimizer.weight_decay_mask(nnx.to_pure_dict(params))
  flat = {".".join(str(getattr(k, "key", k)) for k in path): v
          for path, v in jax.tree_util.tree_flatten_with_path(mask)[0]}
  assert flat["transformer.layers.0.attention.query.kernel"]
  assert flat["transformer.embeddings.word_embeddings.embedding"]
  assert not flat["transformer.layers.0.attention.query.bias"]
  assert not flat["transformer.layers.0.layer_norm.scale"]
  assert not flat["transformer.embeddings.layer_norm.bias"]
  assert not flat["transformer.layers.0.attention.layer_norm.scale"]
  # With zero gradients only decayed parameters move.
  tx, _ = optimizer.make_optimizer(learning_rate=0.1, total_steps=4, warmup_fraction=0.0,
                                   weight_decay=0.5)
  s = train_state.TrainState.create(_model(), tx)
  s2 = s.apply_gradients(jax.tree.map(jnp.zeros_like, s.params))
  ln = s.params["transformer"]["layers"][0]["layer_norm"]["scale"]
  np.testing.assert_array_equal(s2.params["transformer"]["layers"][0]["layer_norm"]["scale"], ln)
  k = s.params["transformer"]["layers"][0]["intermediate"]["kernel"]
  np.testing.assert_allclose(s2.params["transformer"]["layers"][0]["intermediate"]["kernel"],
                             k * (1 - 0.1 * 0.5), rtol=1e-6)


def test_clip_norm_bounds_the_gradient():
  tx, _ = optimizer.make_optimizer(learning_rate=1.0, total_steps=2, warmup_fraction=0.0,
                                   weight_decay=0.0, clip_norm=1e-3)
  s = train_state.TrainState.create(_model(), tx)
  s = s.apply_gradients(jax.tree.map(lambda p: jnp.full_like(p, 1e6), s.params))
  # Adam's first moment after one step is (1 - b1) * the gradient it received.
  mu = [x for x in jax.tree.leaves(s.opt_state, is_leaf=lambda x: hasattr(x, "mu"))
        if hasattr(x, "mu")][0].mu
  np.testing.assert_allclose(float(optax.tree.norm(mu)), 0.1 * 1e-3, rtol=1e-4)


def test_heads_take_their_own_learning_rate():
  params = {"dual": {"context": {"kernel": jnp.ones(3)}, "response_ff": {"kernel": jnp.ones(3)}},
            "nli": {"kernel": jnp.ones(3)}}
  assert optimizer.head_labels(params, ("nli", "dual/response_ff")) == {
      "dual": {"context": {"kernel": "body"}, "response_ff": {"kernel": "head"}},
      "nli": {"kernel": "head"}}
  tx, _ = optimizer.make_optimizer(learning_rate=1e-5, total_steps=10, warmup_fraction=0.0,
                                   weight_decay=0.0, head_learning_rate=1e-2, heads=("nli",))
  updates, _ = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
  # Adam's first step moves every parameter by its learning rate.
  np.testing.assert_allclose(updates["nli"]["kernel"], -1e-2, rtol=1e-4)
  np.testing.assert_allclose(updates["dual"]["response_ff"]["kernel"], -1e-5, rtol=1e-4)
  np.testing.assert_allclose(updates["dual"]["context"]["kernel"], -1e-5, rtol=1e-4)


def _train(state, steps, ckpt=None):
  for _ in range(steps):
    grads = jax.tree.map(lambda p: jnp.ones_like(p) * 0.01, state.params)
    state = state.apply_gradients(grads)
    if ckpt is not None:
      ckpt.save(state)
  return state


def test_checkpoint_save_restore_and_resume(tmp_path):
  tx, _ = optimizer.make_optimizer(learning_rate=1e-2, total_steps=6)
  straight = _train(train_state.TrainState.create(_model(), tx), 6)

  ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=2, keep=2)
  interrupted = _train(train_state.TrainState.create(_model(), tx), 3, ckpt)  # "dies" after step 3
  ckpt.close()
  assert ckpt.all_steps() == [2]

  ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=2, keep=2)
  fresh = train_state.TrainState.create(_model(seed=1), tx)  # other init: restore must overwrite it
  resumed, _ = ckpt.restore_or_init(fresh)
  assert int(resumed.step) == 2
  resumed = _train(resumed, 4, ckpt)
  assert ckpt.save(resumed, force=True) is False  # step 6 was saved by the interval already
  ckpt.close()
  assert ckpt.all_steps() == [4, 6]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
               straight.arrays(), resumed.arrays())
  del interrupted

  # A finished run restores at its last step, so a loop from there trains nothing.
  again, _ = checkpointing.Checkpointer(tmp_path / "ck", save_every=2).restore_or_init(
      train_state.TrainState.create(_model(), tx))
  assert int(again.step) == 6


def test_empty_directory_keeps_the_initial_state(tmp_path):
  tx, _ = optimizer.make_optimizer(learning_rate=1e-2, total_steps=2)
  s = train_state.TrainState.create(_model(), tx)
  restored, meta = checkpointing.Checkpointer(tmp_path / "none", save_every=1).restore_or_init(s)
  assert restored is s and meta == {}


# --------------------------------------------------------------------------- multi-host checkpoints

# 64 embedding rows: 8 per device of the 8-device `data` axis.
MULTI = dataclasses.replace(TINY, vocab_size=64)
MULTI_BATCH, MULTI_LEN = 8, 6


def _multi_state(seed: int, mesh) -> train_state.TrainState:
  """A fresh TrainState on `mesh`: the word embeddings [64, 16] and their Adam moments split
  by rows over `data` (a process holds only its devices' rows), all else replicated."""
  tx, _ = optimizer.make_optimizer(learning_rate=1e-2, total_steps=4, warmup_fraction=0.0)
  s = train_state.TrainState.create(SentenceEncoder(MULTI, rngs=nnx.Rngs(seed)), tx, seed=seed)
  shardings = jax.tree_util.tree_map_with_path(
      lambda path, _: NamedSharding(
          mesh, P(sharding.DATA) if "word_embeddings" in jax.tree_util.keystr(path) else P()),
      s.arrays())
  return s.replace(**jax.device_put(s.arrays(), shardings))


def _multi_batch(process_id: int, num_processes: int, mesh) -> tuple[jax.Array, jax.Array]:
  """This process's rows of a fixed [8, 6] batch of ids and mask, as global arrays over `data`."""
  rng = np.random.default_rng(0)
  ids = rng.integers(1, MULTI.vocab_size, size=(MULTI_BATCH, MULTI_LEN)).astype(np.int32)
  mask = (np.arange(MULTI_LEN)[None, :] < rng.integers(2, MULTI_LEN + 1, size=(MULTI_BATCH, 1)))
  n = MULTI_BATCH // num_processes
  rows = slice(process_id * n, (process_id + 1) * n)
  b = sharding.global_batch({"ids": ids[rows], "mask": mask[rows].astype(np.int32)}, mesh)
  return b["ids"], b["mask"]


def _multi_train_step(state, ids, mask):
  """One AdamW step on the mean squared sentence embedding: it touches every parameter."""
  grads = jax.grad(lambda p: jnp.mean(state.model(p)(ids, mask) ** 2))(state.params)
  return state.apply_gradients(grads)


def _host_arrays(state: train_state.TrainState) -> dict[str, np.ndarray]:
  """Every checkpointed array, gathered whole onto this process, keyed by its tree path."""
  gathered = multihost_utils.process_allgather(state.arrays(), tiled=True)
  return {jax.tree_util.keystr(path): np.asarray(x)
          for path, x in jax.tree_util.tree_flatten_with_path(gathered)[0]}


def _embedding(state: train_state.TrainState) -> jax.Array:
  return state.params["transformer"]["embeddings"]["word_embeddings"]["embedding"]


def _worker(process_id: int, mode: str, out_dir: str) -> None:
  """One of 2 processes. "save": 2 train steps, a checkpoint after each; "restore": the
  latest checkpoint into a differently initialised state. Writes the state it saved or
  restored to {mode}{process_id}.npz."""
  mesh = sharding.make_mesh()
  fresh = _multi_state(seed=0 if mode == "save" else 1, mesh=mesh)
  rows = sum(s.data.shape[0] for s in _embedding(fresh).addressable_shards)
  assert rows == MULTI.vocab_size // 2, rows  # this process holds half the embedding rows
  ckpt = checkpointing.Checkpointer(Path(out_dir) / "ck", save_every=1)
  if mode == "save":
    state = fresh
    step = jax.jit(_multi_train_step, out_shardings=jax.tree.map(lambda x: x.sharding, fresh))
    ids, mask = _multi_batch(process_id, 2, mesh)
    for _ in range(2):
      state = step(state, ids, mask)
      assert ckpt.save(state)
  else:
    state, _ = ckpt.restore_or_init(fresh)
    assert _embedding(state).sharding == _embedding(fresh).sharding
  ckpt.close()
  np.savez(Path(out_dir) / f"{mode}{process_id}.npz", **_host_arrays(state))


def _assert_arrays_equal(got, want):
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_checkpoint_saved_and_restored_across_processes(tmp_path):
  """2 processes x 4 devices save; 2 fresh processes restore it exactly, and so does this
  process with 8 devices (a checkpoint does not depend on the topology that wrote it)."""
  multihost.launch(__file__, "save", tmp_path)
  saved = dict(np.load(tmp_path / "save0.npz"))
  _assert_arrays_equal(dict(np.load(tmp_path / "save1.npz")), saved)
  assert int(saved["['step']"]) == 2
  assert checkpointing.Checkpointer(tmp_path / "ck", save_every=1).all_steps() == [1, 2]

  multihost.launch(__file__, "restore", tmp_path)
  for i in range(2):
    _assert_arrays_equal(dict(np.load(tmp_path / f"restore{i}.npz")), saved)

  fresh = _multi_state(seed=1, mesh=sharding.make_mesh())
  emb = "['params']['transformer']['embeddings']['word_embeddings']['embedding']"
  assert not np.array_equal(np.asarray(_embedding(fresh)), saved[emb])  # restoring must overwrite
  restored, _ = checkpointing.Checkpointer(tmp_path / "ck", save_every=1).restore_or_init(fresh)
  _assert_arrays_equal(_host_arrays(restored), saved)
  assert _embedding(restored).sharding == _embedding(fresh).sharding


def test_non_finite_loss_names_step_and_batch():
  loop.check_finite(1.5, 3)
  with pytest.raises(loop.NonFiniteLossError, match=r"nan at step 7; batch indices \[4, 9\]"):
    loop.check_finite(float("nan"), 7, np.array([4, 9]))
  with pytest.raises(FloatingPointError, match="inf at step 2"):
    loop.check_finite(float("inf"), 2)


def test_workdir_files(tmp_path):
  import ml_collections  # pylint: disable=import-outside-toplevel
  wd = workdir_lib.Workdir(tmp_path / "run")
  wd.write_config(ml_collections.ConfigDict({"a": 1, "b": {"c": "x"}}))
  assert json.loads((tmp_path / "run" / "config.json").read_text()) == {"a": 1, "b": {"c": "x"}}
  wd.update_metrics({"r_at_1_before": 0.5})
  merged = wd.update_metrics({"r_at_1": np.float32(0.75)})
  assert merged == {"r_at_1_before": 0.5, "r_at_1": 0.75}
  assert json.loads(wd.metrics_path.read_text()) == merged
  wd.write_scalars(1, {"train/loss": 2.0})
  wd.close()
  assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
  with multihost.distributed(int(sys.argv[2]), int(sys.argv[3])):
    _worker(int(sys.argv[2]), *sys.argv[4:])


# --------------------------------------------------------------------------- window-mean logging


class _Recorder:
  """A `Workdir` stand-in that keeps what the loop logs."""

  def __init__(self):
    self.scalars = {}

  def write_scalars(self, step, scalars):
    self.scalars[step] = dict(scalars)


def _counting_step(nan_at=None):
  """A jitted step whose loss is the step number (NaN at `nan_at`) and grad_norm twice that."""
  def step(state, batch):
    del batch
    n = (state.step + 1).astype(jnp.float32)
    loss = jnp.where(state.step + 1 == (nan_at or -1), jnp.nan, n)
    return state.replace(step=state.step + 1), {"loss": loss, "grad_norm": 2 * n}
  return jax.jit(step)


def _loop_state():
  tx, _ = optimizer.make_optimizer(learning_rate=1e-2, total_steps=10)
  return train_state.TrainState.create(_model(), tx)


def test_logged_loss_is_the_window_mean(tmp_path):
  rec = _Recorder()
  ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=100)
  sched = optimizer.linear_warmup_decay(1e-2, 10, 0.1)
  _, seconds = loop.fit(_loop_state(), _counting_step(), iter(range(10)), total_steps=10,
                        examples_per_step=4, schedule=sched, workdir=rec, checkpointer=ckpt,
                        log_every=4, to_device=lambda b: b, train_seconds=1.5)
  ckpt.close()
  assert sorted(rec.scalars) == [4, 8, 10]
  assert rec.scalars[4]["train/loss"] == 2.5  # mean of steps 1-4, not step 4's 4.0
  assert rec.scalars[8]["train/loss"] == 6.5
  assert rec.scalars[10]["train/loss"] == 9.5  # the last, shorter window
  assert rec.scalars[8]["train/grad_norm"] == 13.0
  assert seconds > 1.5  # added to what a resumed run had spent


def test_nan_names_the_window_and_its_checkpoint_is_not_saved(tmp_path):
  ckpt = checkpointing.Checkpointer(tmp_path / "ck", save_every=4)
  sched = optimizer.linear_warmup_decay(1e-2, 12, 0.1)
  batches = iter(np.arange(24).reshape(12, 2))  # batch k holds rows 2k, 2k + 1
  with pytest.raises(loop.NonFiniteLossError, match=r"loss is nan at steps 5-8; batch indices "
                     r"\[8, 9, 10, 11, 12, 13, 14, 15\]"):
    loop.fit(_loop_state(), _counting_step(nan_at=6), batches, total_steps=12, examples_per_step=2,
             schedule=sched, workdir=_Recorder(), checkpointer=ckpt, log_every=100,
             to_device=lambda b: b, batch_rows=lambda b: b)
  ckpt.close()
  assert ckpt.all_steps() == [4]  # step 8 came from an unchecked (NaN) window: not saved


# --------------------------------------------------------------------------- state beyond parameters


class _BatchNormRegressor(nnx.Module):
  """Dense -> BatchNorm -> Dense: its running statistics are model state, not parameters."""

  def __init__(self, seed: int = 0):
    rngs = nnx.Rngs(seed)
    self.dense = nnx.Linear(3, 8, rngs=rngs)
    self.norm = nnx.BatchNorm(8, momentum=0.5, rngs=rngs)
    self.out = nnx.Linear(8, 1, rngs=rngs)

  def __call__(self, x):
    return self.out(jax.nn.relu(self.norm(self.dense(x))))[:, 0]


class _Interrupted(Exception):
  pass


class _BatchNormTask:
  """A `trainer.Task` around `_BatchNormRegressor`: y = x . (1, -2, 3) + 5, batches by step."""

  title = "toy"
  total_steps = 12
  examples_per_step, examples_name = 16, "pairs"

  def __init__(self, config, mesh, *, die_at=None):
    from convfit_jax.models import Built  # pylint: disable=import-outside-toplevel
    self.mesh, self.die_at = mesh, die_at
    self.built = Built(_BatchNormRegressor())
    self.counts = {"num_train": 16 * self.total_steps}

  def batches(self, start_step):
    class Batches:
      def __init__(self, task):
        self.task, self.step = task, start_step

      def __next__(self):
        if self.step == self.task.die_at:
          raise _Interrupted(self.step)
        rng = np.random.default_rng(self.step)
        self.step += 1
        x = rng.normal(size=(16, 3)).astype(np.float32)
        return {"x": x, "y": (x @ np.array([1.0, -2.0, 3.0]) + 5.0).astype(np.float32)}

      def close(self):
        pass
    return Batches(self)

  def device_batch(self, host_batch):
    return sharding.global_batch(host_batch, self.mesh)

  def batch_rows(self, host_batch):
    return None

  def loss_and_grads(self, state, batch):
    from convfit_jax.train import trainer  # pylint: disable=import-outside-toplevel
    return trainer.value_and_grad(
        lambda model, b, key: jnp.mean((model(b["x"]) - b["y"]) ** 2), state, batch)

  def predictors(self, model):
    return {"model": model}

  def export(self, model, folder):
    folder.mkdir(parents=True)
    np.savez(folder / "state.npz", **{"/".join(map(str, k)): np.asarray(v) for k, v in
                                      nnx.to_flat_state(nnx.state(model))})

  def summary(self, metrics):
    return None


def _toy_config(workdir):
  import ml_collections  # pylint: disable=import-outside-toplevel
  from convfit_jax.configs import common  # pylint: disable=import-outside-toplevel
  c = ml_collections.ConfigDict({"workdir": str(workdir), "seed": 0, "evals": {}})
  c.train = common.train_config(learning_rate=1e-2, log_every=2, checkpoint_every=4,
                                keep_checkpoints=5)
  common.mesh_and_distributed(c)
  return c


def test_batchnorm_state_trains_checkpoints_resumes_bit_identically_and_evaluates(tmp_path):
  import functools  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import trainer  # pylint: disable=import-outside-toplevel
  straight = trainer.train_and_evaluate(_toy_config(tmp_path / "straight"), _BatchNormTask)
  assert straight["steps"] == 12
  want = dict(np.load(tmp_path / "straight" / "model" / "state.npz"))
  assert np.abs(want["norm/mean"]).max() > 0.1  # the running statistics moved in training

  # Killed at step 7 (its checkpoint at 4 is complete), rerun: resumes at 4, same end.
  with pytest.raises(_Interrupted):
    trainer.train_and_evaluate(_toy_config(tmp_path / "killed"),
                               functools.partial(_BatchNormTask, die_at=7))
  ck = checkpointing.Checkpointer(tmp_path / "killed" / "checkpoints", save_every=4)
  assert ck.all_steps() == [4]
  tx, _ = optimizer.from_config(_toy_config(tmp_path).train, _BatchNormTask.total_steps)
  restored, _ = ck.restore_or_init(train_state.TrainState.create(_BatchNormRegressor(seed=1), tx))
  ck.close()
  assert np.abs(np.asarray(restored.model_state["norm"]["mean"])).max() > 0  # checkpointed
  trainer.train_and_evaluate(_toy_config(tmp_path / "killed"), _BatchNormTask)
  got = dict(np.load(tmp_path / "killed" / "model" / "state.npz"))
  assert sorted(got) == sorted(want)
  for k in want:
    np.testing.assert_array_equal(got[k], want[k], err_msg=k)

  # Eval mode: the running statistics normalise, not the batch's own.
  tx, _ = optimizer.make_optimizer(learning_rate=1e-2, total_steps=2)
  state = train_state.TrainState.create(_BatchNormRegressor(), tx)
  state = state.replace(model_state={"norm": {"mean": jnp.full((8,), 3.0), "var": jnp.full((8,), 4.0)}})
  model = state.host_model()
  x = np.random.default_rng(0).normal(size=(5, 3)).astype(np.float32)
  h = (model.dense(x) - 3.0) / np.sqrt(4.0 + model.norm.epsilon) * model.norm.scale[...] + model.norm.bias[...]
  np.testing.assert_allclose(model(x), model.out(jax.nn.relu(h))[:, 0], rtol=1e-5, atol=1e-6)
