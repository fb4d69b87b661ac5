"""The recursive convolutional encoder of seed 003: balanced padding, pool/expand, shared
weights with BatchNorm per recursion, the byte auto-encoder learning and resuming, and the
word-level encoder's width and masking."""

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from convfit_jax import sharding
from convfit_jax.configs import byte_autoencoder as config_lib
from convfit_jax.evaluators import byte_error
from convfit_jax.models import byte_autoencoder as ba
from convfit_jax.models import conv_encoder, recursive_conv as rc
from convfit_jax.train import byte_autoencoder as task
from convfit_jax.train.workdir import read_scalars

from resume import weights_before_and_after_a_kill

FIXTURES = Path(__file__).parent / "fixtures"


def test_balanced_padding_spreads_the_tokens_as_figure_2():
  # n tokens: padded to P = 2^ceil(log2 n), then width / P apart.
  positions = np.asarray(rc.balanced_positions(jnp.array([3, 4, 5, 8, 1, 16]), 5, 16))
  assert positions[0, :3].tolist() == [0, 4, 8]  # odd: P = 4, stride 4
  assert positions[1, :4].tolist() == [0, 4, 8, 12]  # even: P = 4
  assert positions[2, :5].tolist() == [0, 2, 4, 6, 8]  # odd: P = 8, stride 2
  assert positions[3, :5].tolist() == [0, 2, 4, 6, 8]  # even: P = 8
  assert positions[4, :1].tolist() == [0]
  assert positions[5, :5].tolist() == [0, 1, 2, 3, 4]  # full: no gaps
  ids, lengths = ba.byte_rows(["Tom", "home"], 8)  # + EOS: 4 and 5 tokens
  placed = np.asarray(rc.place(jnp.asarray(ids), jnp.asarray(lengths), 16, "balanced", ba.PAD))
  P = ba.PAD
  assert placed[0].tolist() == [ord("T"), P, P, P, ord("o"), P, P, P, ord("m"), P, P, P,
                                ba.EOS, P, P, P]
  assert placed[1].tolist() == [ord("h"), P, ord("o"), P, ord("m"), P, ord("e"), P, ba.EOS,
                                P, P, P, P, P, P, P]
  right = np.asarray(rc.place(jnp.asarray(ids), jnp.asarray(lengths), 16, "right", ba.PAD))
  assert right[0].tolist() == [ord("T"), ord("o"), ord("m"), ba.EOS] + [P] * 12
  # Each max-pool halves the gaps: after log2(16 / 4) = 2 pools the sentence is packed.
  x = jnp.asarray(placed[0] != P, jnp.float32)[None, :, None]
  assert np.asarray(rc.pool(rc.pool(x)))[0, :, 0].tolist() == [1, 1, 1, 1]


def test_expand_inverts_the_pooling_shape():
  x = jax.random.normal(jax.random.PRNGKey(0), (2, 8, 6))
  y = rc.expand(jnp.concatenate([x, x], axis=-1))
  assert y.shape == (2, 16, 6)
  np.testing.assert_array_equal(np.asarray(y), np.repeat(np.asarray(x), 2, axis=1))
  np.testing.assert_array_equal(np.asarray(rc.pool(y)), np.asarray(x))
  z = jax.random.normal(jax.random.PRNGKey(1), (2, 8, 12))
  e = np.asarray(rc.expand(z))
  np.testing.assert_array_equal(e[:, 0::2], np.asarray(z)[..., :6])
  np.testing.assert_array_equal(e[:, 1::2], np.asarray(z)[..., 6:])


def _bn_stats(group: rc.Group) -> list[np.ndarray]:
  return [np.asarray(n.mean[...]) for b in group.sets for n in b[0].norm1]


def test_shared_recursion_has_one_set_of_weights_and_batchnorm_per_depth():
  enc = rc.RecursiveEncoder(4, 2, 3, shared=True, momentum=0.5, rngs=nnx.Rngs(0))
  assert len(enc.recursive.sets) == 1 and len(enc.recursive.sets[0][0].norm1) == 3
  x = jax.random.normal(jax.random.PRNGKey(0), (5, 16, 4)) * 3 + 1
  enc.train()
  kernel = np.asarray(enc.recursive.sets[0][0].conv1.kernel[...])
  out = enc(x)
  assert out.shape == (5, 2, 4)
  stats = _bn_stats(enc.recursive)
  # Every depth moved its own statistics, and they differ: the inputs differ by depth.
  assert all(np.abs(s).sum() > 0 for s in stats)
  assert not np.allclose(stats[0], stats[1]) and not np.allclose(stats[1], stats[2])
  np.testing.assert_array_equal(np.asarray(enc.recursive.sets[0][0].conv1.kernel[...]), kernel)
  # One application in train mode moves that depth's statistics only.
  before = _bn_stats(enc.recursive)
  enc.recursive(x, 1)
  after = _bn_stats(enc.recursive)
  np.testing.assert_array_equal(after[0], before[0])
  np.testing.assert_array_equal(after[2], before[2])
  assert not np.allclose(after[1], before[1])

  # The ablation: shared weights sharing one set of statistics for every depth.
  one = rc.RecursiveEncoder(4, 2, 3, norm_per_recursion=False, momentum=0.5, rngs=nnx.Rngs(0))
  assert len(one.recursive.sets[0][0].norm1) == 1
  one.train()
  one(x)
  assert np.abs(_bn_stats(one.recursive)[0]).sum() > 0

  static = rc.RecursiveEncoder(4, 2, 3, shared=False, momentum=0.5, rngs=nnx.Rngs(0))
  assert len(static.recursive.sets) == 3
  assert all(len(s[0].norm1) == 1 for s in static.recursive.sets)
  kernels = [np.asarray(s[0].conv1.kernel[...]) for s in static.recursive.sets]
  assert not np.allclose(kernels[0], kernels[1])


def test_batchnorm_uses_the_batch_in_train_mode_and_running_statistics_in_eval():
  enc = rc.RecursiveEncoder(4, 2, 2, momentum=0.0, rngs=nnx.Rngs(0))
  x = jax.random.normal(jax.random.PRNGKey(0), (6, 8, 4))
  other = x.at[1:].set(x[1:] * 5 + 2)
  enc.train()
  a, b = enc(x), enc(other)
  assert not np.allclose(np.asarray(a[0]), np.asarray(b[0]))  # row 0 depends on its batch
  enc.eval()
  stats = _bn_stats(enc.recursive)
  a, b = enc(x), enc(other)
  np.testing.assert_allclose(np.asarray(a[0]), np.asarray(b[0]), rtol=1e-6)  # not in eval
  for s, t in zip(stats, _bn_stats(enc.recursive)):
    np.testing.assert_array_equal(s, t)  # and eval leaves the statistics alone


def test_byte_error_buckets():
  lengths = np.array([10, 70, 70, 200])
  m = byte_error.bucket_metrics(lengths, np.array([0, 2, 0, 30]), np.array([11, 71, 71, 201]))
  assert m["byte_error_1_64"] == 0.0 and m["fraction_1_64"] == 0.25
  assert m["byte_error_65_128"] == pytest.approx(2 / 142) and m["fraction_65_128"] == 0.5
  assert m["byte_error_129_256"] == pytest.approx(30 / 201)
  assert "byte_error_257_512" not in m


def _config(tmp_path, **extra):
  c = config_lib.get_config(f"runlocal,workdir={tmp_path / 'run'}")
  with c.unlocked():
    c.data.train = str(FIXTURES / "enwiki.tsv")
    c.evals.byte_error.file = str(FIXTURES / "enwiki.tsv")
    c.evals.byte_error.max_sentences = 0
    for k, v in extra.items():
      section, field = k.split(".")
      c[section][field] = v
  return c


def test_tiny_autoencoder_overfits_sentences_and_a_killed_run_resumes_bit_identical(tmp_path,
                                                                                    monkeypatch):
  # One device: this step's BatchNorm collectives over 8 virtual CPU devices on 2 cores once
  # missed XLA's 40 s rendezvous in CI; the sharded BatchNorm step is tested in
  # test_conv_encoder.py.
  one_device = sharding.make_mesh
  monkeypatch.setattr(sharding, "make_mesh",
                      lambda model_parallel=1, devices=None: one_device(model_parallel, jax.devices()[:1]))
  c = _config(tmp_path, **{"model.d": 48, "model.layers": 2, "model.length": 128,
                           "model.latent_positions": 32, "data.max_sentences": 8,
                           "train.batch_size": 8, "train.epochs": 1000, "train.max_steps": 150,
                           "train.learning_rate": 0.5, "train.decay_start": 100,
                           "train.decay_every": 25, "train.checkpoint_every": 50,
                           "train.log_every": 50})
  m = task.train_and_evaluate(c)
  assert m["steps"] == 150
  assert m["num_params"] > 0 and m["latent_dim"] == 48 * 32
  run = tmp_path / "run"
  trained = task.ByteAutoencoderTask(c, sharding.make_mesh()).sentences
  # The eight training sentences come back exactly.
  model = ba.load(run)
  preds, placed = ba.Reconstructor(model).predict(trained, batch_size=8)
  real = placed != ba.PAD
  assert ((preds != placed) & real).sum() == 0
  assert [ba.decode(p[r]) for p, r in zip(preds, real)] == trained
  # The latent as a sentence vector, the same whatever the batch (eval mode).
  assert ba.is_saved(run)
  enc = ba.ByteTextEncoder(model)
  vectors = enc.encode(trained[:5], batch_size=4, normalize=True)
  assert vectors.shape == (5, 48 * 32)
  np.testing.assert_allclose(enc.encode(trained[:5][::-1], batch_size=8, normalize=True)[::-1],
                             vectors, rtol=1e-5, atol=1e-6)
  first, again = weights_before_and_after_a_kill(run, 150, lambda: task.train_and_evaluate(c))
  assert any("mean" in k for k in first)  # BatchNorm statistics are exported
  for k in first:
    np.testing.assert_array_equal(again[k], first[k], err_msg=k)
  assert json.loads((run / "metrics.json").read_text())["byte_error"] <= m["byte_error"] + 1e-9
  assert (run / "byte_error_by_length_after.png").is_file()
  curve = read_scalars(run)["train/byte_error"]  # logged beside the loss, read back
  assert [s for s, _ in curve][-1] == 150 and curve[-1][1] < curve[0][1]


def _word_encoder(padding, bow="none", length=16):
  config = conv_encoder.ConvSentenceEncoder.Config(vocab_size=30, embed_dim=6, layers=2,
                                                   length=length, padding=padding, bow=bow,
                                                   momentum=0.5)
  model = conv_encoder.ConvSentenceEncoder(config, rngs=nnx.Rngs(0))
  model.train()
  model(jnp.asarray(np.random.default_rng(0).integers(2, 30, (8, 16)), jnp.int32),
        jnp.ones((8, 16), jnp.int32))  # statistics away from their start
  model.eval()
  return model


@pytest.mark.parametrize("padding", ["balanced", "right", "variable"])
def test_word_encoder_width_and_masking(padding):
  model = _word_encoder(padding)
  ids = np.array([[5, 6, 7, 0, 0, 0, 0, 0], [8, 9, 10, 11, 12, 13, 14, 15]], np.int32)
  mask = (ids > 0).astype(np.int32)
  out = model(jnp.asarray(ids), jnp.asarray(mask))
  assert out.shape == (2, 6) and out.dtype == jnp.float32
  # What lies past a sentence's words changes nothing.
  garbage = np.where(mask > 0, ids, 29)
  np.testing.assert_allclose(np.asarray(model(jnp.asarray(garbage), jnp.asarray(mask))),
                             np.asarray(out), rtol=1e-6, atol=1e-6)
  # Nor does the batch around it, or the row's width.
  alone = model(jnp.asarray(ids[:1, :4]), jnp.asarray(mask[:1, :4]))
  np.testing.assert_allclose(np.asarray(alone[0]), np.asarray(out[0]), rtol=1e-5, atol=1e-6)


def test_variable_length_reads_each_sentence_at_its_own_depth():
  model = _word_encoder("variable")
  ids = jnp.asarray([[5, 6, 7, 0]], jnp.int32)
  x = model.embed[...][ids]
  # Three words: padded to 4, two recursions, as the encoder alone on a row of 4.
  h = model.encoder.prefix(x, 0)
  h = rc.pool(model.encoder.recursive(h, 0))
  h = rc.pool(model.encoder.recursive(h, 1))
  np.testing.assert_allclose(np.asarray(model(ids, (ids > 0).astype(jnp.int32))[0]),
                             np.asarray(h[0, 0]), rtol=1e-5, atol=1e-6)


def test_bow_adds_the_mean_word_vector():
  plain, plus, only = (_word_encoder("balanced", bow) for bow in ("none", "plus", "only"))
  ids = jnp.asarray([[5, 6, 7, 0]], jnp.int32)
  mask = (ids > 0).astype(jnp.int32)
  mean = np.asarray(plain.embed[...])[[5, 6, 7]].mean(axis=0)
  np.testing.assert_allclose(np.asarray(only(ids, mask)[0]), mean, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(plus(ids, mask)[0]),
                             np.asarray(plain(ids, mask)[0]) + mean, rtol=1e-5, atol=1e-6)
