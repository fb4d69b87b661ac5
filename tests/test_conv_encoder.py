"""The word-level recursive convolutional encoder through the shared tasks: NLI training
(the input-response task with NLI alone) that learns, exports and reloads, Stage 1 on
conversations, Stage 2 from either run with one sentence per row, and the sharded (and, in
Stage 1, chunked) step with BatchNorm equal to one device."""

import dataclasses

import jax
import numpy as np
import pytest
from flax import nnx

from configs import conv_encoder as ce_config
from configs import evaluate as evaluate_config
from convfit_jax import sharding
from convfit_jax.configs import common
from convfit_jax.data import packing
from convfit_jax.models import conv_encoder
from convfit_jax.tasks import evaluate
from convfit_jax.train import input_response, stage1, stage2

from test_input_response import first_step_on_one_and_all_devices, write_data


def nli_config(folder, arg="runlocal", **extra):
  c = ce_config.get_config(f"{arg},vectors=,workdir={folder / 'run'}")
  with c.unlocked():
    c.data.nli_train = str(folder / "nli_train.tsv")
    c.data.sts_dir, c.data.sick_dir = str(folder / "stsb"), ""
    for name in list(c.evals):
      if name != "sts":
        del c.evals[name]
    c.evals.nli = common.nli_eval(file=str(folder / "nli_test.tsv"), prefix="nli_")
    c.model.freeze_embeddings = False  # random vectors: they must learn
    for k, v in extra.items():
      section, field = k.split(".")
      c[section][field] = v
  return c


def stage2_config(init_from, workdir, steps):
  """Stage 2 of the conv encoder from the run `init_from`, `steps` steps, k-NN on 100 queries."""
  s = ce_config.get_config(f"stage=stage2,runlocal,init_from={init_from},workdir={workdir}")
  with s.unlocked():
    s.train.max_steps = steps
    s.evals.knn.max_test = 100
  return s


def test_one_sentence_per_row_when_the_model_does_not_pack():
  ids = np.array([[5, 6, 0, 0], [7, 0, 0, 0], [8, 9, 10, 0]])
  p = packing.pack(ids, (ids > 0).astype(int), rows=4, width=4, row_offset=8, packs=False)
  assert p.slots.tolist() == [[8, 1], [9, 1], [10, 1]]
  assert p.input_ids.tolist() == [[5, 6, 0, 0], [7, 0, 0, 0], [8, 9, 10, 0], [0, 0, 0, 0]]
  assert p.segment_ids.tolist() == [[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]]
  assert packing.rows_for([np.array([2, 1, 3]), np.array([1])], 4, multiple=2, packs=False) == 4
  with pytest.raises(ValueError, match="one per row"):
    packing.pack(ids, (ids > 0).astype(int), rows=2, width=4, packs=False)


def test_nli_training_learns_exports_reloads_and_feeds_stage2(tmp_path):
  folder = write_data(tmp_path)
  c = nli_config(folder, **{"train.max_steps": 90, "train.checkpoint_every": 30,
                            "train.learning_rate": 3e-3,
                            "model.embed_dim": 16, "model.length": 16, "model.max_length": 16,
                            "model.nli_hidden": (32,)})
  m = input_response.train_and_evaluate(c)
  assert m["nli_accuracy"] > 0.9  # the hypothesis's form decides the label
  assert m["num_pairs"] == 0 and m["num_nli_pairs"] == 480 and m["steps"] == 90
  assert "conversation_loss" not in str(m)
  # The exported encoder is the evaluate task's: the same STS figures.
  e = evaluate_config.get_config(f"sts,init_from={tmp_path / 'run'}")
  e.workdir = str(tmp_path / "eval")
  e.data.sts_dir, e.data.sick_dir = c.data.sts_dir, ""
  assert evaluate.run(e)["stsb_test_pearson"] == pytest.approx(m["stsb_test_pearson"], abs=1e-6)

  # Stage 2 starts from that run, one sentence per row, and exports a loadable encoder.
  s = stage2_config(tmp_path / "run", tmp_path / "s2", steps=4)
  task = stage2.Stage2(s, sharding.make_mesh())
  assert task.table.packs is False and task.rows == 64  # 16 intents x 4, one row each
  m2 = stage2.train_and_evaluate(s)
  assert 0 <= m2["knn_accuracy"] <= 1 and m2["steps"] == 4
  enc = conv_encoder.load(tmp_path / "s2")
  texts = ["how do i top up my card", "my card was declined"]
  np.testing.assert_allclose(enc.encode(texts), enc.encode(texts[::-1])[::-1], rtol=1e-5, atol=1e-6)
  assert enc.encode(texts).shape == (2, 16)


@pytest.mark.parametrize("padding", ["balanced", "variable"])
def test_a_sharded_step_with_batchnorm_equals_one_device(tmp_path, padding):
  folder = write_data(tmp_path)
  c = nli_config(folder, **{"model.embed_dim": 8, "model.length": 16, "model.max_length": 16,
                            "model.padding": padding})
  outs = first_step_on_one_and_all_devices(c)
  for k in ("loss", "nli_loss", "grad_norm"):
    assert float(outs[1][0][k]) == pytest.approx(float(outs[0][0][k]), rel=1e-5)
  # BatchNorm's statistics are of the global batch on 8 devices too.
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6),
               outs[0][1], outs[1][1])


def stage1_config(folder, **extra):
  """Stage 1 of the conv encoder on `write_data`'s conversations, scored on its 1-of-12 cases."""
  c = ce_config.get_config(f"stage=stage1,runlocal,vectors=,workdir={folder / 's1'}")
  with c.unlocked():
    c.data.train, c.data.fraction = str(folder / "train.tsv"), 1.0
    del c.evals["response_selection"]
    c.evals.syn = common.response_selection_eval(file=str(folder / "rs.jsonl"), prefix="syn_", every=0)
    c.model.freeze_embeddings = False  # random vectors: they must learn
    c.model.embed_dim, c.model.length, c.model.max_length = 16, 16, 16
    c.train.batch_size = 32
    for k, v in extra.items():
      section, field = k.split(".")
      c[section][field] = v
  return c


def test_stage1_trains_it_exports_and_stage2_starts_from_it(tmp_path):
  folder = write_data(tmp_path)
  c = stage1_config(folder, **{"train.epochs": 5, "train.max_steps": 40, "train.learning_rate": 3e-3,
                               "train.checkpoint_every": 20})
  task = stage1.Stage1(c, sharding.make_mesh())
  assert task.built.packs is False and task.cfg.num_chunks(32) == 1
  batch = task.device_batch(next(task.batches(0)))
  assert batch["context_ids"].shape == (32, 16)  # one sentence per row
  m = stage1.train_and_evaluate(c)
  assert m["num_pairs"] == 256 and m["steps"] == 40
  assert m["syn_r_at_1"] > 0.9 > m["syn_r_at_1_before"]
  # Stage 2 starts from the exported context encoder.
  enc = conv_encoder.load(tmp_path / "s1")
  texts = ["does anyone know about grub here", "yes the grub docs explain it"]
  task2 = stage2.Stage2(stage2_config(tmp_path / "s1", tmp_path / "s2", steps=2), sharding.make_mesh())
  assert (task2.config.train.labels_per_batch, task2.config.train.examples_per_label) == (16, 4)
  np.testing.assert_allclose(task2.encoder(task2.built.model).encode(texts), enc.encode(texts),
                             rtol=1e-6)


def test_stage1_sharded_and_cached_steps_with_batchnorm_equal_one_device(tmp_path):
  folder = write_data(tmp_path)
  c = stage1_config(folder, **{"model.embed_dim": 8})
  outs = first_step_on_one_and_all_devices(c, stage1.Stage1)
  # BatchNorm's statistics are of the global batch on 8 devices too.
  for (m1, arrays1), (m8, arrays8) in [outs]:
    for k in ("loss", "grad_norm"):
      assert float(m8[k]) == pytest.approx(float(m1[k]), rel=1e-5)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6), arrays1, arrays8)

  # Chunked, the gradient cache replays each chunk from the state the one before left:
  # the same loss, gradients and statistics as backpropagating through the chunks.
  task = stage1.Stage1(c, sharding.make_mesh(devices=jax.devices()[:1]))
  graphdef, params, model_state = nnx.split(task.built.model, nnx.Param, ...)
  params, model_state = nnx.to_pure_dict(params), nnx.to_pure_dict(model_state)
  cfgs = [dataclasses.replace(task.cfg, chunk_size=16, grad_cache=g) for g in (False, True)]
  batch = stage1.device_batch(next(task.batches(0)), task.mesh, cfgs[0], packs=False)
  plain, cached = [jax.jit(lambda p, s, b, cfg=cfg: stage1.loss_and_grads(
      graphdef, p, s, b, None, cfg))(params, model_state, batch) for cfg in cfgs]
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6), plain, cached)
  # Both chunks moved the running statistics (the second from where the first left them).
  one_chunk = jax.jit(lambda p, s, b: stage1.loss_and_grads(graphdef, p, s, b, None, task.cfg))(
      params, model_state, stage1.device_batch(next(task.batches(0)), task.mesh, task.cfg, packs=False))
  moved = lambda out: max(float(np.max(np.abs(x - y))) for x, y in zip(
      jax.tree.leaves(out[2]), jax.tree.leaves(model_state)))
  assert moved(cached) > 0 and moved(one_chunk) > 0
  assert max(float(np.max(np.abs(x - y))) for x, y in zip(
      jax.tree.leaves(cached[2]), jax.tree.leaves(one_chunk[2]))) > 1e-6


def test_conversations_also_train_it_through_the_input_response_task(tmp_path):
  folder = write_data(tmp_path)
  c = nli_config(folder, **{"train.batch_size": 32, "train.max_steps": 6,
                            "model.embed_dim": 8, "model.length": 16, "model.max_length": 16,
                            "model.response_ff": True})
  with c.unlocked():
    c.data.train = str(folder / "train.tsv")
    c.evals.syn = common.response_selection_eval(file=str(folder / "rs.jsonl"), prefix="syn_", every=0)
  m = input_response.train_and_evaluate(c)
  assert m["num_pairs"] == 256 and m["steps"] == 6 and 0 <= m["syn_r_at_1"] <= 1
