"""The Flax encoder against transformers' PyTorch BertModel/RobertaModel on random weights."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from transformers import AutoModel

from convfit_jax.models import sentence
from convfit_jax.models.sentence import SentenceEncoder, flat_params
from convfit_jax.models.transformer import TransformerConfig, _Dense, position_ids_for


def _torch_hidden(folder, ids, mask):
  model = AutoModel.from_pretrained(str(folder)).eval()
  with torch.no_grad():
    out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                attention_mask=torch.tensor(mask, dtype=torch.long))
  return out.last_hidden_state.numpy()


def _ids(rng, pad, vocab, lengths, width, left=()):
  """Random token ids with padding on the right, or on the left for rows in `left`."""
  ids = np.full((len(lengths), width), pad, np.int32)
  mask = np.zeros((len(lengths), width), np.int32)
  for r, n in enumerate(lengths):
    toks = rng.integers(5, vocab, n)
    sl = slice(width - n, width) if r in left else slice(0, n)
    ids[r, sl], mask[r, sl] = toks, 1
  return ids, mask


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet"])
def test_hidden_states_match_torch(kind, tiny_bert_dir, tiny_roberta_dir, tiny_mpnet_dir):
  folder = {"bert": tiny_bert_dir, "roberta": tiny_roberta_dir, "mpnet": tiny_mpnet_dir}[kind]
  model, ck = sentence.load(folder)
  rng = np.random.default_rng(0)
  pad = ck.config.pad_token_id
  # Rows 1 and 3 are left-padded: RoBERTa's position ids must skip the padding. 40 tokens
  # reach MPNet's log-spaced relative buckets (distances 8 and more).
  width = 40 if kind == "mpnet" else 12
  ids, mask = _ids(rng, pad, 200, [width, 7, 3, 9, width - 5], width, left={1, 3})
  ours = np.asarray(model.transformer(jnp.asarray(ids), jnp.asarray(mask)))
  ref = _torch_hidden(folder, ids, mask)
  diff = np.abs(ours - ref)[mask.astype(bool)]
  assert diff.max() < 1e-5, diff.max()


def test_roberta_position_ids_follow_hf():
  from transformers.models.roberta.modeling_roberta import RobertaEmbeddings
  config = TransformerConfig(model_type="roberta", pad_token_id=1)
  ids = np.array([[0, 5, 6, 2, 1, 1], [1, 1, 0, 7, 2, 1]], np.int32)
  ref = RobertaEmbeddings.create_position_ids_from_input_ids(torch.tensor(ids), padding_idx=1).numpy()
  np.testing.assert_array_equal(np.asarray(position_ids_for(jnp.asarray(ids), config)), ref)


def _tiny_model(remat=False, init="normal", **kw):
  config = TransformerConfig(vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                             intermediate_size=37, max_position_embeddings=16, **kw)
  return SentenceEncoder(config, rngs=nnx.Rngs(0), remat=remat, init=init)


def test_remat_gives_same_outputs_and_gradients():
  ids = jnp.asarray(np.random.default_rng(1).integers(1, 50, (3, 10)), jnp.int32)
  mask = jnp.ones_like(ids).at[0, 6:].set(0)
  key = jax.random.key(3)
  results = []
  for remat in (False, True):
    model = _tiny_model(remat=remat)
    loss = lambda m: jnp.sum(m(ids, mask, dropout_key=key) ** 2)
    value, grads = nnx.value_and_grad(loss)(model)
    results.append((value, jax.tree.leaves(grads)))
  np.testing.assert_allclose(results[0][0], results[1][0], rtol=1e-6)
  for a, b in zip(results[0][1], results[1][1]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_dropout_is_replayed_by_key_and_off_without_one():
  model = _tiny_model()
  ids = jnp.ones((2, 8), jnp.int32)
  mask = jnp.ones_like(ids)
  a = model(ids, mask, dropout_key=jax.random.key(0))
  b = model(ids, mask, dropout_key=jax.random.key(0))
  c = model(ids, mask, dropout_key=jax.random.key(1))
  np.testing.assert_array_equal(a, b)
  assert np.abs(np.asarray(a - c)).max() > 1e-4
  np.testing.assert_array_equal(model(ids, mask), model(ids, mask))


def test_random_init_is_glorot_uniform_from_config_alone():
  params = flat_params(_tiny_model(init="xavier"))
  kernel = params["transformer.layers.0.intermediate.kernel"]
  limit = np.sqrt(6.0 / (32 + 37))
  assert np.abs(kernel).max() <= limit
  assert np.abs(kernel).max() > 0.9 * limit  # uniform fills the interval
  np.testing.assert_array_equal(params["transformer.layers.0.intermediate.bias"], 0)


def test_mpnet_relative_buckets_match_transformers():
  from transformers.models.mpnet.modeling_mpnet import MPNetEncoder
  from convfit_jax.models.transformer import relative_buckets
  ref = MPNetEncoder.relative_position_bucket(torch.arange(-600, 601), num_buckets=32).numpy()
  np.testing.assert_array_equal(relative_buckets(32, 601), ref)  # every distance, every edge


def test_unsupported_configs_are_named():
  with pytest.raises(ValueError, match="model_type 'gpt2'"):
    TransformerConfig.from_hf_dict({"model_type": "gpt2"})
  with pytest.raises(ValueError, match="relative_key"):
    TransformerConfig.from_hf_dict({"model_type": "bert", "position_embedding_type": "relative_key"})


def _dense_grads(dtype):
  layer = _Dense(24, 40, init=nnx.initializers.lecun_normal(), dtype=dtype, rngs=nnx.Rngs(0))
  x = jnp.asarray(np.random.default_rng(0).normal(size=(3, 5, 24)), jnp.float32)
  loss = lambda m, x: jnp.sum(jnp.sin(m(x).astype(jnp.float32)))
  return layer, x, loss


def test_bfloat16_dense_runs_its_gradient_products_in_bfloat16():
  """Autodiff of a bfloat16 x bfloat16 -> float32 product multiplies the float32
  cotangent by a bfloat16 operand, which XLA runs in float32: bfloat16 training was
  slower than float32 on CPU. Every product of the layer's gradient is bfloat16 x
  bfloat16 now, and the gradients stay close to float32's."""
  layer, x, loss = _dense_grads(jnp.bfloat16)
  grad = nnx.grad(loss, argnums=(0, 1))
  graphdef, state = nnx.split(layer)
  hlo = jax.jit(lambda st, x: grad(nnx.merge(graphdef, st), x)).lower(state, x).as_text()
  dots = [line for line in hlo.splitlines() if "dot_general" in line]
  assert len(dots) == 3, dots  # forward, input gradient, kernel gradient
  for line in dots:
    inputs = line.rsplit(":", 1)[1].split("->")[0]
    assert inputs.count("bf16") == 2 and "f32" not in inputs, line
  g_layer, g_x = grad(layer, x)
  assert g_layer.kernel[...].dtype == jnp.float32 and g_x.dtype == jnp.float32
  ref_layer, _, _ = _dense_grads(jnp.float32)
  r_layer, r_x = grad(ref_layer, x)
  pairs = ((g_layer.kernel[...], r_layer.kernel[...]), (g_layer.bias[...], r_layer.bias[...]),
           (g_x, r_x))
  for got, want in pairs:
    got, want = np.asarray(got).ravel(), np.asarray(want).ravel()
    assert np.dot(got, want) / np.linalg.norm(got) / np.linalg.norm(want) > 0.999
  # The forward is nnx.Linear's with bfloat16 operands, accumulated in float32.
  want = (jnp.dot(x.astype(jnp.bfloat16), layer.kernel[...].astype(jnp.bfloat16),
                  preferred_element_type=jnp.float32)
          + layer.bias[...].astype(jnp.bfloat16)).astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(layer(x), np.float32), np.asarray(want, np.float32))
