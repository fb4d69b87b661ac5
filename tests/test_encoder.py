"""`Encoder` on the real all-MiniLM-L6-v2 weights: parity with PyTorch, padding, inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

from convfit_jax import Encoder
from convfit_jax.encoder import _embed
from convfit_jax.tokenization import bucket_widths

SENTENCES = [
    "how do I top up my card?", "my card was declined", "I still haven't received my new card",
    "Why was I charged a fee for withdrawing cash?", "what is the exchange rate for GBP to EUR",
    "Can I get a refund for this purchase? It arrived broken.", "wake me up at 6:30 tomorrow",
    "play some jazz", "is it going to rain in Paris this weekend?", "order a large pepperoni pizza",
    "Transfer £250 to Alice's account", "¿Dónde está mi tarjeta?", "😀 thanks!!", "ok",
    "cancel", "What's the balance on my savings account, and when did the last payment go out?",
    "turn off the lights in the kitchen", "remind me to call mom", "set volume to 20 percent",
    "I think someone stole my card and used it at an ATM in another country last night",
    "Tell me a joke", "how many days until christmas", "", "card card card card card card card",
]


@pytest.fixture(scope="module")
def encoder(minilm_dir):
  return Encoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2", max_length=128)


def test_parity_with_bert_model_hidden_states_and_mean_pooling(encoder, minilm_dir):
  tok = AutoTokenizer.from_pretrained(str(minilm_dir))
  ref_model = AutoModel.from_pretrained(str(minilm_dir)).eval()
  batch = tok(SENTENCES, padding=True, truncation=True, max_length=128, return_tensors="np")
  ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32)
  with torch.no_grad():
    ref = ref_model(input_ids=torch.tensor(ids).long(), attention_mask=torch.tensor(mask).long())
  ref_hidden = ref.last_hidden_state.numpy()
  ours = np.asarray(encoder.model.transformer(jnp.asarray(ids), jnp.asarray(mask)))
  assert np.abs(ours - ref_hidden)[mask.astype(bool)].max() <= 1e-4
  m = mask[..., None].astype(np.float32)
  ref_pooled = (ref_hidden * m).sum(1) / m.sum(1)
  assert np.abs(encoder.encode(SENTENCES, normalize=False) - ref_pooled).max() <= 1e-4


def test_parity_with_sentence_transformers_encode(encoder, minilm_dir):
  st = SentenceTransformer(str(minilm_dir), device="cpu")
  st.max_seq_length = 128
  ref = st.encode(SENTENCES, batch_size=8, convert_to_numpy=True)
  ours = encoder.encode(SENTENCES, batch_size=8)  # the checkpoint normalises by default
  assert np.abs(ours - ref).max() <= 1e-4


def test_packed_encoding_equals_one_text_at_a_time_unpadded(encoder):
  batched = encoder.encode(SENTENCES, batch_size=16)
  one_by_one = np.stack([encoder.encode([s], batch_size=1)[0] for s in SENTENCES[:8]])
  np.testing.assert_allclose(batched[:8], one_by_one, atol=1e-5)
  unpadded = []
  for s in SENTENCES[:4]:
    ids = np.asarray(encoder.tokenizer([s])["input_ids"], np.int32)
    unpadded.append(np.asarray(encoder.model(ids, np.ones_like(ids)))[0])
  unpadded = np.stack(unpadded)
  unpadded /= np.linalg.norm(unpadded, axis=1, keepdims=True)
  np.testing.assert_allclose(batched[:4], unpadded, atol=1e-5)


def test_packed_calls_compile_a_bounded_number_of_shapes(encoder):
  """Texts of every length, in sets of different sizes: the shapes come from a small menu."""
  rng = np.random.default_rng(0)
  words = " ".join(SENTENCES).split()
  sets = [[" ".join(rng.choice(words, rng.integers(0, 60))) for _ in range(n)] for n in (300, 301, 517)]
  before = _embed._cache_size()  # pylint: disable=protected-access
  outs = [encoder.encode(texts, batch_size=32) for texts in sets]
  # One width per input; full calls share their row count and sentence counts are powers
  # of two, so only a few shapes per input are new.
  assert _embed._cache_size() - before <= 16  # pylint: disable=protected-access
  again = encoder.encode(sets[0][::-1], batch_size=32)
  np.testing.assert_allclose(again[::-1], outs[0], atol=1e-6)


def test_an_update_to_the_model_shows_in_the_next_encode(tiny_bert_dir):
  enc = Encoder.from_pretrained(tiny_bert_dir)
  before = enc.encode(["top up my card"])
  state = nnx.state(enc.model)
  nnx.update(enc.model, jax.tree.map(lambda x: x * 0.5, state))
  after = enc.encode(["top up my card"])
  fresh = Encoder(enc.model, enc.tokenizer, max_length=enc.max_length).encode(["top up my card"])
  assert np.abs(after - before).max() > 1e-3
  np.testing.assert_array_equal(after, fresh)


def test_bucket_widths_are_bounded():
  assert bucket_widths(48) == [8, 16, 32, 48]
  assert bucket_widths(128) == [8, 16, 32, 64, 128]


def test_order_empty_and_bad_inputs(encoder):
  a = encoder.encode(["my card was declined", "play some jazz"])
  b = encoder.encode(["play some jazz", "my card was declined"])
  np.testing.assert_allclose(a, b[::-1], atol=1e-6)
  assert encoder.encode([]).shape == (0, 384)
  empty = encoder.encode([""])
  assert empty.shape == (1, 384) and np.isfinite(empty).all() and np.abs(empty).sum() > 0
  with pytest.raises(TypeError, match=r"\[1\]"):
    encoder.encode(["fine", 3])
  with pytest.raises(TypeError, match="one string"):
    encoder.encode("a single string")


def test_truncation_at_max_length(minilm_dir):
  short = Encoder.from_pretrained(minilm_dir, max_length=8)
  long_text = "one two three four five six seven eight nine ten eleven twelve"
  ids = short.tokenizer([long_text], truncation=True, max_length=8)["input_ids"]
  assert len(ids[0]) == 8
  np.testing.assert_allclose(short.encode([long_text]), short.encode([long_text + " thirteen"]), atol=1e-6)
  with pytest.raises(ValueError, match="max_length"):
    Encoder.from_pretrained(minilm_dir, max_length=100000)


def test_bfloat16_compute_stays_close(encoder, minilm_dir):
  bf16 = Encoder.from_pretrained(minilm_dir, dtype=jnp.bfloat16, max_length=128)
  a = encoder.encode(SENTENCES, normalize=True)
  b = bf16.encode(SENTENCES, normalize=True)
  assert b.dtype == np.float32
  cos = np.sum(a * b, axis=1)
  assert cos.min() > 0.99, cos.min()
