"""ESIM's layers against direct references: the LSTM (outputs and gradients) against
torch.nn.LSTM, alignment, matching and pooling against NumPy loops; its inputs (words,
truncation) and save/load."""

import dataclasses

import jax
import numpy as np
import pytest
import jax.numpy as jnp
from flax import nnx

from convfit_jax.data import words
from convfit_jax.data.readers import DataError
from convfit_jax.models import Built, esim
from convfit_jax.models.word_models import FrozenEmbedding
from convfit_jax.models.lstm import BiLSTM


def _torch_twin(torch, ours: BiLSTM):
  """A bidirectional torch.nn.LSTM with `ours`'s weights (its summed bias split 1:3 between
  PyTorch's two bias vectors)."""
  h = ours.hidden
  ref = torch.nn.LSTM(ours.w_ih[...].shape[1], h, batch_first=True, bidirectional=True)
  with torch.no_grad():
    for k, suffix in enumerate(("", "_reverse")):
      getattr(ref, f"weight_ih_l0{suffix}").copy_(torch.tensor(np.asarray(ours.w_ih[...][k]).T))
      getattr(ref, f"weight_hh_l0{suffix}").copy_(torch.tensor(np.asarray(ours.w_hh[...][k]).T))
      b = np.asarray(ours.bias[...][k])
      getattr(ref, f"bias_ih_l0{suffix}").copy_(torch.tensor(b * 0.25))
      getattr(ref, f"bias_hh_l0{suffix}").copy_(torch.tensor(b * 0.75))
  return ref


def test_bilstm_and_its_gradients_match_torch_on_a_padded_batch():
  torch = pytest.importorskip("torch")
  rng = np.random.default_rng(0)
  n, t, d, h = 4, 9, 5, 6
  x = rng.normal(size=(n, t, d)).astype(np.float32)
  lengths = np.array([7, 3, 1, 5], np.int32)  # steps 7 and 8 padding in every row
  ours = BiLSTM(d, h, rngs=nnx.Rngs(0))
  ref = _torch_twin(torch, ours)
  with torch.no_grad():
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths),
                                                     batch_first=True, enforce_sorted=False)
    want, _ = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], batch_first=True,
                                                     total_length=t)
  # padding holds garbage: it must not leak into the valid positions
  x_padded = np.where(np.arange(t)[None, :, None] < lengths[:, None, None], x, 9.0)
  got = ours(jnp.asarray(x_padded), jnp.asarray(lengths))
  np.testing.assert_allclose(np.asarray(got), want.numpy(), atol=1e-5)
  ours.eval()  # rows sorted; steps 7 and 8 (every row on padding) skipped each way
  np.testing.assert_allclose(np.asarray(ours(jnp.asarray(x_padded), jnp.asarray(lengths))),
                             want.numpy(), atol=1e-5)
  ours.train()

  # Gradients of a weighted sum of the valid outputs: inputs and both directions' weights.
  w = rng.normal(size=(n, t, 2 * h)).astype(np.float32)
  w *= np.arange(t)[None, :, None] < lengths[:, None, None]
  tx = torch.tensor(x, requires_grad=True)
  packed = torch.nn.utils.rnn.pack_padded_sequence(tx, torch.tensor(lengths), batch_first=True,
                                                   enforce_sorted=False)
  out, _ = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], batch_first=True, total_length=t)
  (out * torch.tensor(w)).sum().backward()
  graphdef, state = nnx.split(ours)
  loss = lambda s, v: jnp.sum(nnx.merge(graphdef, s)(v, jnp.asarray(lengths)) * w)
  d_state, d_x = jax.grad(loss, argnums=(0, 1))(state, jnp.asarray(x))
  valid = (np.arange(t)[None, :] < lengths[:, None])[..., None]
  np.testing.assert_allclose(np.asarray(d_x) * valid, tx.grad.numpy() * valid, atol=1e-5)
  for k, suffix in enumerate(("", "_reverse")):
    for name in ("ih", "hh"):
      np.testing.assert_allclose(np.asarray(d_state[f"w_{name}"][...][k]).T,
                                 getattr(ref, f"weight_{name}_l0{suffix}").grad.numpy(), atol=1e-5)
    np.testing.assert_allclose(np.asarray(d_state["bias"][...][k]),
                               getattr(ref, f"bias_ih_l0{suffix}").grad.numpy(), atol=1e-5)


def test_bilstm_eval_mode_computes_only_the_live_rows_and_matches_torch():
  """Eval mode sorts the rows and shrinks each step to a prefix of `prefix_sizes`: with 19
  rows of 1-23 words (ties included) the steps run 19, 16 or 8 rows; every output still
  equals torch.nn.LSTM's on packed sequences, and the rows come back in input order."""
  torch = pytest.importorskip("torch")
  from convfit_jax.models.lstm import prefix_sizes
  assert prefix_sizes(19) == [19, 16, 8]
  assert prefix_sizes(64) == [64, 32, 16, 8]
  assert prefix_sizes(8) == [8]
  rng = np.random.default_rng(1)
  n, t, d, h = 19, 24, 5, 6
  lengths = np.concatenate([[23, 23, 1], rng.integers(1, 24, n - 3)]).astype(np.int32)
  x = rng.normal(size=(n, t, d)).astype(np.float32)
  ours = BiLSTM(d, h, rngs=nnx.Rngs(2))
  ref = _torch_twin(torch, ours)
  with torch.no_grad():
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths),
                                                     batch_first=True, enforce_sorted=False)
    want = torch.nn.utils.rnn.pad_packed_sequence(ref(packed)[0], batch_first=True,
                                                  total_length=t)[0].numpy()
  ours.eval()
  got = np.asarray(jax.jit(lambda v, l: ours(v, l))(jnp.asarray(x), jnp.asarray(lengths)))
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_soft_alignment_matching_and_pooling_match_loops():
  rng = np.random.default_rng(1)
  a, b = rng.normal(size=(2, 4, 3)), rng.normal(size=(2, 5, 3))
  la, lb = [4, 2], [1, 5]
  am = np.arange(4)[None] < np.array(la)[:, None]
  bm = np.arange(5)[None] < np.array(lb)[:, None]
  to_b, to_a = map(np.asarray, esim.alignment_weights(jnp.asarray(a), jnp.asarray(b),
                                                      jnp.asarray(am), jnp.asarray(bm)))
  for k in range(2):
    e = a[k, :la[k]] @ b[k, :lb[k]].T
    wa = np.exp(e - e.max(1, keepdims=True)); wa /= wa.sum(1, keepdims=True)
    wb = np.exp(e - e.max(0, keepdims=True)); wb /= wb.sum(0, keepdims=True)
    np.testing.assert_allclose((to_b[k] @ b[k])[:la[k]], wa @ b[k, :lb[k]], atol=1e-5)
    np.testing.assert_allclose((to_a[k].T @ a[k])[:lb[k]], wb.T @ a[k, :la[k]], atol=1e-5)
  x, x_tilde, kernel = rng.normal(size=(7, 4)), rng.normal(size=(7, 4)), rng.normal(size=(16, 3))
  w_self, w_aligned, w_product = map(np.asarray, esim.matching_weights(jnp.asarray(kernel)))
  np.testing.assert_allclose(x @ w_self + x_tilde @ w_aligned + (x * x_tilde) @ w_product,
                             np.concatenate([x, x_tilde, x - x_tilde, x * x_tilde], -1) @ kernel,
                             atol=1e-6)
  pooled = np.asarray(esim.mean_max_pool(jnp.asarray(a), jnp.asarray(am)))
  for k in range(2):
    np.testing.assert_allclose(pooled[k], np.concatenate([a[k, :la[k]].mean(0), a[k, :la[k]].max(0)]),
                               atol=1e-6)


def test_esim_computes_the_papers_formulas():
  """The model's logits against ESIM written out: dual vectors from the alignment, the
  projection of the concatenated local matching, pooling and the MLP."""
  model, vocab = _tiny()
  c, cl = words.encode(["how do i mount a drive __eou__ use sudo mount", "try the forum"], vocab,
                       max_length=64, keep="end")
  r, rl = words.encode(["use sudo mount a drive", "try"], vocab, max_length=64, keep="start")
  c, cl, r, rl = map(jnp.asarray, (c, cl, r, rl))
  table = model.embeddings[...]
  c_mask, r_mask = c != 0, r != 0
  a, b = model.encoder(table[c], cl), model.encoder(table[r], rl)
  to_b, to_a = esim.alignment_weights(a, b, c_mask, r_mask)
  a_t, b_t = jnp.einsum("nij,njd->nid", to_b, b), jnp.einsum("nij,nid->njd", to_a, a)
  match = lambda x, t: jax.nn.relu(model.projection(jnp.concatenate([x, t, x - t, x * t], -1)))
  va, vb = model.composition(match(a, a_t), cl), model.composition(match(b, b_t), rl)
  v = jnp.concatenate([esim.mean_max_pool(va, c_mask), esim.mean_max_pool(vb, r_mask)], -1)
  np.testing.assert_allclose(np.asarray(model(c, cl, r, rl)),
                             np.asarray(model.out(jnp.tanh(model.hidden(v)))), atol=1e-5)


def _tiny(freeze=False):
  vocab = words.build_vocabulary(["how do i mount a drive", "use sudo mount", "try the forum"])
  config = esim.EsimConfig(len(vocab), embed_dim=8, hidden=6, freeze_embeddings=freeze)
  return esim.Esim(config, rngs=nnx.Rngs(0)), vocab


def test_esim_ignores_padding_and_keeps_frozen_vectors_out_of_the_parameters():
  model, vocab = _tiny(freeze=True)
  c, cl = words.encode(["how do i mount a drive __eou__ use sudo mount"], vocab, max_length=64,
                       keep="end")
  r, rl = words.encode(["try the forum"], vocab, max_length=64, keep="start")
  logits = model(jnp.asarray(c), jnp.asarray(cl), jnp.asarray(r), jnp.asarray(rl))
  wide = lambda ids: jnp.pad(jnp.asarray(ids), ((0, 0), (0, 16)))
  again = model(wide(c), jnp.asarray(cl), wide(r), jnp.asarray(rl))
  np.testing.assert_allclose(np.asarray(logits), np.asarray(again), atol=1e-6)
  assert logits.shape == (1, 2) and np.isfinite(np.asarray(logits)).all()
  params = nnx.state(model, nnx.Param)
  assert "embeddings" not in params and "embeddings" in nnx.state(model, FrozenEmbedding)


def test_save_and_load_give_the_same_logits(tmp_path):
  model, vocab = _tiny()
  esim.export(Built(model, tokenizer=vocab), model, tmp_path)
  built = esim.load(tmp_path)
  loaded = built.model
  assert built.tokenizer == vocab
  c, cl = words.encode(["use sudo mount"], vocab, max_length=8, keep="end")
  args = (jnp.asarray(c), jnp.asarray(cl), jnp.asarray(c), jnp.asarray(cl))
  np.testing.assert_array_equal(np.asarray(model(*args)), np.asarray(loaded(*args)))


def test_words_truncation_and_turn_marks():
  assert words.tokenize("ROPSS3: Install VLC __eou__ ok!") == ["ropss3", ":", "install", "vlc",
                                                              "__eou__", "ok", "!"]
  vocab = words.build_vocabulary(["a b c d e f"])
  ids, lengths = words.encode(["a b c d e f"], vocab, max_length=3, keep="end")
  assert [vocab.words[i] for i in ids[0, :3]] == ["d", "e", "f"] and lengths[0] == 3
  ids, _ = words.encode(["a b c d e f"], vocab, max_length=3, keep="start")
  assert [vocab.words[i] for i in ids[0, :3]] == ["a", "b", "c"]
  ids, lengths = words.encode(["zzz", ""], vocab, max_length=40, keep="start")
  assert ids.shape == (2, 16) and list(lengths) == [1, 1] and ids[0, 0] == ids[1, 0] == 1
  assert vocab.words[:4] == (words.PAD, words.UNK, "__eou__", "__eot__")
  texts = ["a b c d e f", "", "zzz, a", "a b c d e f"]
  for cut in (3, 40):
    np.testing.assert_array_equal(words.cut_lengths(texts, max_length=cut),
                                  words.encode(texts, vocab, max_length=cut, keep="end")[1])


def test_oov_buckets_give_an_unseen_word_one_id_of_its_own(tmp_path):
  import zlib
  vocab = words.build_vocabulary(["the cat sat", "the cat"], min_count=2, oov_buckets=7)
  assert len(vocab) == 4 + 2 + 7 and vocab.oov_buckets == 7
  assert vocab.words[-7:] == words.bucket_names(7)
  first = len(vocab) - 7
  nick, other = vocab.ids(["ropss3", "newbie28"])
  assert nick == first + zlib.crc32(b"ropss3") % 7 and other == first + zlib.crc32(b"newbie28") % 7
  assert nick != other  # these two fall in different buckets of 7
  ids, _ = words.encode(["ropss3 : the sat ropss3"], vocab, max_length=16, keep="start")
  assert list(ids[0, :5]) == [nick, first + zlib.crc32(b":") % 7, vocab.ids(["the"])[0],
                              first + zlib.crc32(b"sat") % 7, nick]
  assert words.build_vocabulary(["the cat sat"]).ids(["ropss3"]) == [1]  # no buckets: unknown
  vocab.save(tmp_path / "vocab.txt")
  assert words.Vocabulary.load(tmp_path / "vocab.txt") == vocab
  assert words.Vocabulary.load(tmp_path / "vocab.txt").ids(["ropss3"]) == [nick]
  with pytest.raises(ValueError, match="come last"):
    words.Vocabulary((*words.RESERVED, "<oov:0>", "cat"))
  table, found = words.embedding_matrix(vocab, dim=3, vectors=None, seed=0)
  assert table.shape == (13, 3) and found == 0.0


def test_vectors_file_errors_name_the_line(tmp_path):
  vocab = words.build_vocabulary(["the cat"])
  f = tmp_path / "v.txt"
  f.write_text("the 0.1 0.2\ncat 0.3\n")
  with pytest.raises(DataError, match=r"v.txt:2: 1 values"):
    words.read_vectors(f, vocab)
  f.write_text("the 0.1 0.2\ncat 0.3 x\n")
  with pytest.raises(DataError, match=r"v.txt:2: values of 'cat'"):
    words.read_vectors(f, vocab)
  f.write_text("the 0.1 0.2\ndog 0.3 0.4\n")
  table, found = words.embedding_matrix(vocab, dim=2, vectors=f, seed=0)
  np.testing.assert_allclose(table[vocab.ids(["the"])[0]], [0.1, 0.2])
  assert found == 0.5 and not table[0].any()
  with pytest.raises(ValueError, match="embed_dim=3"):
    words.embedding_matrix(vocab, dim=3, vectors=f, seed=0)


def test_self_attention_pooling_matches_a_loop():
  from convfit_jax.models.sentence_lstm import SentenceLstm, SentenceLstmConfig
  model = SentenceLstm(SentenceLstmConfig(20, embed_dim=6, hidden=5, heads=3, attention_dim=4),
                       rngs=nnx.Rngs(0))
  ids = np.array([[3, 4, 5, 0], [6, 7, 0, 0]], np.int32)
  lengths = np.array([3, 2], np.int32)
  got = np.asarray(model.encode(jnp.asarray(ids), jnp.asarray(lengths)))
  h = np.asarray(model.encoder(model.embeddings[...][ids], jnp.asarray(lengths)))
  w1, w2 = np.asarray(model.attention_in.kernel[...]), np.asarray(model.attention_out.kernel[...])
  for k in range(2):
    hk = h[k, :lengths[k]]
    s = np.tanh(hk @ w1) @ w2  # [L, heads]
    a = np.exp(s - s.max(0)) / np.exp(s - s.max(0)).sum(0)
    np.testing.assert_allclose(got[k], (a.T @ hk).reshape(-1), atol=1e-5)


def test_bfloat16_products_keep_the_float32_parameters_and_stay_close():
  model, vocab = _tiny()
  config = dataclasses.replace(model.config, dtype="bfloat16")
  low = nnx.merge(nnx.graphdef(esim.Esim(config, rngs=nnx.Rngs(1))), nnx.state(model))
  assert all(v.dtype == jnp.float32 for v in jax.tree.leaves(nnx.state(low, nnx.Param)))
  c, cl = words.encode(["how do i mount a drive __eou__ use sudo mount", "hi"], vocab,
                       max_length=64, keep="end")
  r, rl = words.encode(["try the forum", "sudo mount it"], vocab, max_length=64, keep="start")
  args = (jnp.asarray(c), jnp.asarray(cl), jnp.asarray(r), jnp.asarray(rl))
  want, got = np.asarray(model(*args)), np.asarray(low(*args))
  assert got.dtype == np.float32
  assert not np.array_equal(got, want)  # the products did run in bfloat16
  np.testing.assert_allclose(got, want, atol=2e-2)
