"""Tests of convfit_jax.train.stage1: global negatives across shards and hosts, grad cache, loop.

Also the workers' script of the multi-host test (see tests/multihost.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import multihost
from convfit_jax import sharding
from convfit_jax.data import batching
from convfit_jax import losses
from convfit_jax.losses import mneg_loss
from convfit_jax.models.dual_encoder import DualEncoder, ResponseFeedForward
from convfit_jax.models.sentence import SentenceEncoder
from convfit_jax.models.transformer import TransformerConfig
from convfit_jax.train import stage1

TINY = TransformerConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=64, max_position_embeddings=32)
B, L = 16, 8
REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def _dual(seed=0, **kw):
  return DualEncoder(SentenceEncoder(TINY, rngs=nnx.Rngs(seed)), **kw)


def _split(model):
  graphdef, params = nnx.split(model, nnx.Param)
  return graphdef, nnx.to_pure_dict(params)


def _hard_negative_batch(seed=0):
  """B pairs whose hardest negatives sit on other shards (of 8 shards of 2 rows).

  The response of row j is a copy of the context of row j - 2, i.e. of a row on
  the previous shard: only a loss that scores each context against every
  device's responses, in the right column order, sees those near-perfect matches.
  """
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, L + 1, size=B)
  mask = (np.arange(L)[None, :] < lengths[:, None]).astype(np.int32)
  ctx = (rng.integers(1, TINY.vocab_size, size=(B, L)) * mask).astype(np.int32)
  resp_ids = np.roll(ctx, 2, axis=0)
  resp_mask = np.roll(mask, 2, axis=0)
  return {"context_ids": ctx, "context_mask": mask, "response_ids": resp_ids,
          "response_mask": resp_mask, "weights": np.ones((B,), np.float32)}


def _packed(batch, cfg, processes=1, process=0):
  """Process `process`'s slice of a host batch dict, packed as `stage1.device_batch`
  packs it for `cfg` (data shards split evenly over the processes)."""
  n = len(batch["weights"])
  part = lambda p: batching.ConversationBatch(
      **{k: v[p * n // processes:(p + 1) * n // processes] for k, v in batch.items()})
  shards, chunks = cfg.data_shards // processes, cfg.num_chunks(n)
  rows = max(batching.conversation_rows(part(p), chunks=chunks, shards=shards, width=L)
             for p in range(processes))
  return batching.pack_conversation_batch(part(process), chunks=chunks, shards=shards, rows=rows,
                                          first_shard=process * shards)


def _assert_trees_close(a, b, tol=1e-5):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=tol, atol=tol)


def _max_diff(a, b):
  return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
             for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def _loss_and_grads(graphdef, params, batch, key, cfg):
  """`stage1.loss_and_grads` of a Transformer dual encoder (no model state): (loss, grads)."""
  loss, grads, model_state = stage1.loss_and_grads(graphdef, params, {}, batch, key, cfg)
  assert not model_state
  return loss, grads


def _sharded_loss_and_grads(graphdef, params, batch, key, cfg, mesh):
  fn = jax.jit(lambda p, b, k: _loss_and_grads(graphdef, p, b, k, cfg),
               in_shardings=(sharding.replicated(mesh), sharding.batch_sharding(mesh),
                             sharding.replicated(mesh)),
               out_shardings=sharding.replicated(mesh))
  return fn(params, batch, key)


def test_sharded_loss_equals_single_device_and_local_negatives_do_not():
  assert jax.device_count() == 8
  graphdef, params = _split(_dual())
  cfg8 = stage1.LossConfig(dropout=True, data_shards=8)
  # Packed for 8 shards (each packs its own 2 sentences per side), run on 1 and 8 devices.
  batch = _packed(_hard_negative_batch(), cfg8)
  key = jax.random.PRNGKey(3)
  cfg1 = stage1.LossConfig(dropout=True)
  dev0 = jax.devices()[0]
  loss1, grads1 = jax.jit(lambda p, b, k: _loss_and_grads(graphdef, p, b, k, cfg1))(
      jax.device_put(params, dev0), jax.device_put(batch, dev0), jax.device_put(key, dev0))

  mesh = sharding.make_mesh()
  loss8, grads8 = _sharded_loss_and_grads(graphdef, params, batch, key, cfg8, mesh)
  np.testing.assert_allclose(float(loss8), float(loss1), rtol=1e-5, atol=1e-5)
  _assert_trees_close(grads8, grads1)

  # Device-local negatives: each shard ranks only its own 2 responses.
  rows = batch["context_ids"].shape[0] // 8

  def local_loss(p, b):
    def per_shard(b):
      model = nnx.merge(graphdef, p)
      side = lambda name: dict(input_ids=b[f"{name}_ids"], attention_mask=b[f"{name}_mask"],
                               position_ids=b[f"{name}_positions"],
                               slots=b[f"{name}_slots"].at[:, 0].set(b[f"{name}_slots"][:, 0] % rows))
      c = model.encode_contexts(**side("context"))
      r = model.encode_responses(**side("response"))
      return jax.lax.pmean(mneg_loss(c, r), sharding.DATA)
    return jax.shard_map(per_shard, mesh=mesh, in_specs=(jax.sharding.PartitionSpec(sharding.DATA),),
                         out_specs=jax.sharding.PartitionSpec())(b)

  local = jax.jit(jax.value_and_grad(local_loss))
  loss_local, grads_local = local(params, batch)
  ref_loss, ref_grads = jax.jit(lambda p, b: _loss_and_grads(
      graphdef, p, b, None, stage1.LossConfig(dropout=False)))(params, batch)
  # The copies on the neighbouring shard make the global loss far larger.
  assert float(ref_loss) > float(loss_local) + 1.0
  assert _max_diff(grads_local, ref_grads) > 1e-3


def test_grad_cache_equals_uncached_with_dropout():
  graphdef, params = _split(_dual())
  batch = _packed(_hard_negative_batch(1), stage1.LossConfig(chunk_size=4))
  key = jax.random.PRNGKey(7)
  fn = lambda cfg: jax.jit(lambda p, b, k: _loss_and_grads(graphdef, p, b, k, cfg))
  plain_loss, plain = fn(stage1.LossConfig(dropout=True, chunk_size=4))(params, batch, key)
  cached_fn = fn(stage1.LossConfig(dropout=True, chunk_size=4, grad_cache=True))
  cached_loss, cached = cached_fn(params, batch, key)
  np.testing.assert_allclose(float(cached_loss), float(plain_loss), rtol=1e-5, atol=1e-5)
  _assert_trees_close(cached, plain)
  # Dropout is really on: a different key changes the gradients.
  _, other = cached_fn(params, batch, jax.random.PRNGKey(8))
  assert _max_diff(other, cached) > 1e-4

  # Per-layer remat composes: same numbers.
  remat_model = DualEncoder(SentenceEncoder(TINY, rngs=nnx.Rngs(0), remat=True))
  graphdef_r, params_r = _split(remat_model)
  _assert_trees_close(params_r, params, tol=0)
  loss_r, grads_r = jax.jit(lambda p, b, k: _loss_and_grads(
      graphdef_r, p, b, k, stage1.LossConfig(dropout=True, chunk_size=4, grad_cache=True)))(
          params_r, batch, key)
  np.testing.assert_allclose(float(loss_r), float(plain_loss), rtol=1e-5, atol=1e-5)
  _assert_trees_close(grads_r, plain)


def test_grad_cache_sharded_with_response_tower_and_ff():
  base = SentenceEncoder(TINY, rngs=nnx.Rngs(0))
  model = DualEncoder(base, response=nnx.clone(base),
                             response_ff=ResponseFeedForward(32, 16, rngs=nnx.Rngs(1)))
  # Give the zero-initialised FF output a non-zero kernel so its gradient path is exercised.
  model.response_ff.blocks[0].down.kernel[...] = 0.1 * jax.random.normal(jax.random.PRNGKey(2), (16, 32))
  graphdef, params = _split(model)
  cfg = stage1.LossConfig(chunk_size=8, data_shards=8)
  batch, key, mesh = _packed(_hard_negative_batch(2), cfg), jax.random.PRNGKey(0), sharding.make_mesh()
  plain_loss, plain = _sharded_loss_and_grads(
      graphdef, params, batch, key, stage1.LossConfig(chunk_size=8, data_shards=8), mesh)
  cached_loss, cached = _sharded_loss_and_grads(
      graphdef, params, batch, key, stage1.LossConfig(chunk_size=8, data_shards=8, grad_cache=True),
      mesh)
  np.testing.assert_allclose(float(cached_loss), float(plain_loss), rtol=1e-5, atol=1e-5)
  _assert_trees_close(cached, plain)
  assert float(jnp.max(jnp.abs(cached["response"]["transformer"]["layers"][0]["output"]["kernel"]))) > 0
  assert float(jnp.max(jnp.abs(cached["response_ff"]["blocks"][0]["up"]["kernel"]))) > 0


def test_identical_responses_are_masked_as_false_negatives():
  graphdef, params = _split(_dual())
  batch = _hard_negative_batch(3)
  batch["response_ids"][5] = batch["response_ids"][1]
  batch["response_mask"][5] = batch["response_mask"][1]
  batch["response_ids"][9] = batch["response_ids"][1]
  batch["response_mask"][9] = batch["response_mask"][1]
  # Row 13 has row 1's tokens behind different padding: the same sentence.
  batch["response_ids"][13] = batch["response_ids"][1]
  batch["response_mask"][13] = batch["response_mask"][1]
  batch["response_ids"][13, batch["response_mask"][1] == 0] = 7
  hashes = batching.token_hashes(batch["response_ids"], batch["response_mask"])
  ids = np.asarray(losses.duplicate_ids(jnp.asarray(hashes)))
  expected = np.arange(B)
  expected[[5, 9, 13]] = 1
  np.testing.assert_array_equal(ids, expected)

  # Packed and chunked, the loss still equals the unpacked reference.
  model = nnx.merge(graphdef, params)
  c = model.encode_contexts(batch["context_ids"], batch["context_mask"])
  r = model.encode_responses(batch["response_ids"], batch["response_mask"])
  loss_of = lambda cfg: jax.jit(lambda p, b: _loss_and_grads(graphdef, p, b, None, cfg)[0])(
      params, _packed(batch, cfg))
  masked = loss_of(stage1.LossConfig(dropout=False, chunk_size=4))  # chunks reassemble in order
  unmasked = loss_of(stage1.LossConfig(dropout=False, mask_duplicates=False))
  np.testing.assert_allclose(float(masked), float(mneg_loss(c, r, response_ids=jnp.asarray(expected))),
                             rtol=1e-6)
  np.testing.assert_allclose(float(unmasked), float(mneg_loss(c, r)), rtol=1e-6)
  # Rows 1, 5, 9, 13 no longer push away copies of their own response: a lower loss.
  assert float(masked) < float(unmasked) - 1e-3


# --------------------------------------------------------------------------- end to end


def _tiny_folder(tmp_path):
  """A tiny random BERT folder with the MiniLM tokenizer (vocab 30522)."""
  from convfit_jax import hf_io  # pylint: disable=import-outside-toplevel
  from convfit_jax.encoder import Encoder  # pylint: disable=import-outside-toplevel
  from convfit_jax.tokenization import load_tokenizer  # pylint: disable=import-outside-toplevel
  tok = load_tokenizer(hf_io.resolve(hf_io.MINILM))
  config = dict(model_type="bert", vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=2,
                num_attention_heads=4, intermediate_size=64, max_position_embeddings=64)
  model = SentenceEncoder(TransformerConfig.from_hf_dict(config), rngs=nnx.Rngs(0))
  folder = tmp_path / "tiny"
  Encoder(model, tok, max_length=24, hf_config=config).save_pretrained(folder)
  return folder


def _e2e_config(tmp_path, folder, train, workdir):
  from convfit_jax.configs import stage1 as stage1_config  # pylint: disable=import-outside-toplevel
  c = stage1_config.get_config("runlocal")
  c.workdir = str(workdir)
  c.model.init_from = str(folder)
  c.model.max_length = 24
  c.data.train = str(train)
  c.data.fraction = 1.0
  c.train.batch_size = 16
  c.train.chunk_size = 8
  c.train.epochs = 2
  c.train.max_steps = 0  # 40 pairs, batch 16: 3 steps per epoch (the last one padded)
  c.train.learning_rate = 1e-3
  c.train.checkpoint_every = 2
  c.train.keep_checkpoints = 5
  c.train.log_every = 2
  c.evals.response_selection.file = str(FIXTURES / "sgd_test_rs100.jsonl")
  c.evals.response_selection.num_cases = 6
  c.evals.response_selection.every = 4
  return c


def test_train_and_evaluate_end_to_end_and_resume(tmp_path):
  from convfit_jax.encoder import Encoder  # pylint: disable=import-outside-toplevel
  folder, train = _tiny_folder(tmp_path), FIXTURES / "sgd_train.tsv"
  c = _e2e_config(tmp_path, folder, train, tmp_path / "run")
  metrics = stage1.train_and_evaluate(c)
  for k in ("r_at_1", "r_at_10", "r_at_50", "mrr", "r_at_1_before", "mrr_before"):
    assert 0.0 <= metrics[k] <= 1.0, k
  assert metrics["total_steps"] == 6 and metrics["num_pairs"] == 40
  run = tmp_path / "run"
  assert json.loads((run / "metrics.json").read_text()) == metrics
  assert json.loads((run / "config.json").read_text())["train"]["batch_size"] == 16
  assert list((run / "tensorboard").glob("events.out.tfevents.*"))
  assert sorted(int(p.name) for p in (run / "checkpoints").iterdir() if p.name.isdigit()) == [2, 4, 6]
  trained = Encoder.from_pretrained(run / "model")
  before = Encoder.from_pretrained(folder)
  texts = ["I want to book a flight.", "It leaves at 5 pm."]
  assert np.max(np.abs(trained.encode(texts) - before.encode(texts))) > 1e-4

  # A second run in the same workdir trains nothing and gives the same model.
  again = stage1.train_and_evaluate(c)
  assert again["train_seconds"] == metrics["train_seconds"]
  np.testing.assert_allclose(Encoder.from_pretrained(run / "model").encode(texts),
                             trained.encode(texts), atol=1e-6)

  # Interrupted after step 4 (its later checkpoint lost), the rerun resumes there and
  # ends with the parameters of the uninterrupted run.
  import shutil  # pylint: disable=import-outside-toplevel
  shutil.copytree(run, tmp_path / "cut")
  shutil.rmtree(tmp_path / "cut" / "checkpoints" / "6")
  shutil.rmtree(tmp_path / "cut" / "model")
  c.workdir = str(tmp_path / "cut")
  stage1.train_and_evaluate(c)
  np.testing.assert_allclose(Encoder.from_pretrained(tmp_path / "cut" / "model").encode(texts),
                             trained.encode(texts), atol=1e-5)


# --------------------------------------------------------------------------- multi-host


MULTI_CFG = dict(dropout=True, data_shards=8)


def _worker_batch_and_params():
  graphdef, params = _split(_dual())
  return graphdef, params, _hard_negative_batch(4), jax.random.PRNGKey(11)


def _worker(process_id: int, out_dir: str) -> None:
  """One of 2 processes: writes this process's copy of the loss and gradients to p{process_id}.npz."""
  graphdef, params, batch, key = _worker_batch_and_params()
  mesh = sharding.make_mesh()
  local = _packed(batch, stage1.LossConfig(**MULTI_CFG), processes=2, process=process_id)
  global_batch = sharding.global_batch(local, mesh)
  rep = sharding.replicated(mesh)
  params = jax.device_put(params, rep)
  key = jax.device_put(key, rep)
  loss, grads = _sharded_loss_and_grads(graphdef, params, global_batch, key,
                                        stage1.LossConfig(**MULTI_CFG), mesh)
  flat = {f"g{i}": np.asarray(x.addressable_data(0)) for i, x in enumerate(jax.tree.leaves(grads))}
  np.savez(Path(out_dir) / f"p{process_id}.npz", loss=np.asarray(loss.addressable_data(0)), **flat)


def test_two_processes_match_one_process_with_eight_devices(tmp_path):
  graphdef, params, batch, key = _worker_batch_and_params()
  cfg = stage1.LossConfig(**MULTI_CFG)
  mesh = sharding.make_mesh()
  # Two processes packing their own halves give the batch one process packs.
  halves = [_packed(batch, cfg, processes=2, process=i) for i in range(2)]
  batch = _packed(batch, cfg)
  for k, v in batch.items():
    np.testing.assert_array_equal(np.concatenate([h[k] for h in halves]), v)
  loss, grads = _sharded_loss_and_grads(graphdef, params, batch, key, cfg, mesh)
  multihost.launch(__file__, tmp_path)
  leaves = jax.tree.leaves(grads)
  for i in range(2):
    got = np.load(tmp_path / f"p{i}.npz")
    np.testing.assert_allclose(got["loss"], float(loss), rtol=1e-5, atol=1e-5)
    for j, g in enumerate(leaves):
      np.testing.assert_allclose(got[f"g{j}"], np.asarray(g), rtol=1e-5, atol=1e-5)


if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
  with multihost.distributed(int(sys.argv[2]), int(sys.argv[3])):
    _worker(int(sys.argv[2]), sys.argv[4])
