"""The BERT/RoBERTa/MPNet encoder in flax.nnx, built from a Hugging Face `config.json`.

One module covers `model_type` bert, roberta and mpnet (MiniLM, DistilRoBERTa,
RoBERTa-base/large and all-mpnet-base-v2 are instances): learned absolute positions,
post-LayerNorm blocks, exact GELU. MPNet adds a relative position bias (T5's
bidirectional log buckets, one [buckets, heads] table shared by every layer, added to
every layer's attention scores) and has no token types. The module tree mirrors the
HF one layer for layer, so the key table in `convfit_jax.hf_io` is a plain renaming.

Dropout takes an explicit PRNG key per call instead of NNX `Rngs` state: the
model's state is then its parameters only, and a chunk re-run with the same key
(the gradient cache of Stage 1) replays exactly the same dropout masks.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

import numpy as np

SUPPORTED_MODEL_TYPES = ("bert", "roberta", "xlm-roberta", "camembert", "mpnet")
# Model types whose position ids start at padding_idx + 1 and skip padding.
_FAIRSEQ_POSITIONS = ("roberta", "xlm-roberta", "camembert", "mpnet")
# MPNet's relative positions: distances beyond this share the last bucket.
_MAX_DISTANCE = 128


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
  """The architecture fields of an HF BERT/RoBERTa/MPNet `config.json`.

  `type_vocab_size` 0 means no token-type embeddings (MPNet);
  `relative_attention_num_buckets` > 0 adds MPNet's relative position bias.
  """

  model_type: str = "bert"
  vocab_size: int = 30522
  hidden_size: int = 384
  num_hidden_layers: int = 6
  num_attention_heads: int = 12
  intermediate_size: int = 1536
  hidden_act: str = "gelu"
  hidden_dropout_prob: float = 0.1
  attention_probs_dropout_prob: float = 0.1
  max_position_embeddings: int = 512
  type_vocab_size: int = 2
  layer_norm_eps: float = 1e-12
  pad_token_id: int = 0
  initializer_range: float = 0.02
  relative_attention_num_buckets: int = 0

  @classmethod
  def from_hf_dict(cls, hf: dict[str, Any], source: str = "config") -> "TransformerConfig":
    """Reads the fields we use from an HF config dict; rejects what we don't cover."""
    model_type = hf.get("model_type", "bert")
    if model_type not in SUPPORTED_MODEL_TYPES:
      raise ValueError(
          f"{source}: model_type {model_type!r} is not supported; "
          f"convfit_jax encodes {', '.join(SUPPORTED_MODEL_TYPES)}")
    act = hf.get("hidden_act", "gelu")
    if act != "gelu":
      raise ValueError(f"{source}: hidden_act {act!r} is not supported (only exact 'gelu')")
    pos = hf.get("position_embedding_type", "absolute")
    if pos != "absolute":
      raise ValueError(f"{source}: position_embedding_type {pos!r} is not supported (only 'absolute')")
    names = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: hf[k] for k in names if k in hf and hf[k] is not None}
    kwargs["model_type"] = model_type
    if model_type == "mpnet":  # HF's MPNet: no token types, 32 buckets unless it says otherwise
      kwargs["type_vocab_size"] = 0
      kwargs.setdefault("relative_attention_num_buckets", 32)
      kwargs.setdefault("pad_token_id", 1)
    else:
      kwargs["relative_attention_num_buckets"] = 0
    return cls(**kwargs)

  @property
  def fairseq_positions(self) -> bool:
    return self.model_type in _FAIRSEQ_POSITIONS

  @property
  def max_tokens(self) -> int:
    """The longest sequence the position table encodes (RoBERTa's starts after padding_idx)."""
    return self.max_position_embeddings - (self.pad_token_id + 1 if self.fairseq_positions else 0)

  @property
  def head_dim(self) -> int:
    return self.hidden_size // self.num_attention_heads


def position_ids_for(input_ids: jax.Array, config: TransformerConfig,
                     within: jax.Array | None = None) -> jax.Array:
  """Position ids as HF computes them, or for packed rows.

  Args:
    input_ids: [batch, seq] int32.
    within: [batch, seq] int32 0-based position of each token within its sentence
      (packed rows, `data.packing`); None: one sentence per row.
  Returns:
    [batch, seq] int32: 0..seq-1 for BERT; for RoBERTa padding_idx+1 onwards over
    the non-padding tokens, padding_idx on padding (so left padding is skipped);
    with `within`, those positions restarted at every sentence.
  """
  if within is not None:
    return within + (config.pad_token_id + 1 if config.fairseq_positions else 0)
  if config.fairseq_positions:
    not_pad = (input_ids != config.pad_token_id).astype(jnp.int32)
    return jnp.cumsum(not_pad, axis=1) * not_pad + config.pad_token_id
  return jnp.broadcast_to(jnp.arange(input_ids.shape[1], dtype=jnp.int32), input_ids.shape)


def attention_bias(attention_mask: jax.Array) -> jax.Array:
  """The additive attention mask.

  Args:
    attention_mask: [batch, seq] int or bool: 0 on padding; tokens with the same
      non-zero value form one sentence (1 everywhere for one sentence per row;
      1, 2, ... for the sentences of a packed row).
  Returns:
    [batch, 1, seq, seq] float32: 0 where a query may attend to a key (a real key of
    its own sentence; padding queries see every real key, as in HF), a large negative
    number elsewhere. HF fills with the dtype minimum; finfo(float32).min / 2 avoids
    overflow to -inf when added to a large negative score and gives the same softmax.
  """
  segments = attention_mask.astype(jnp.int32)
  query, key = segments[:, :, None], segments[:, None, :]
  visible = (key != 0) & ((query == key) | (query == 0))
  return jnp.where(visible, 0.0, jnp.finfo(jnp.float32).min / 2)[:, None].astype(jnp.float32)


def relative_buckets(num_buckets: int, length: int) -> np.ndarray:
  """MPNet's bucket of every relative position k - q in [-(length - 1), length - 1]: [2 length - 1]
  int32, entry length - 1 + (k - q).

  Half the buckets for each direction; exact below a quarter of them, log-spaced up to
  `_MAX_DISTANCE`, then the last. Computed on the host in float32 as transformers'
  `MPNetEncoder.relative_position_bucket` computes it, so bucket edges (16, 32, 64 tokens
  away) fall where they fall there (tests compare every distance).
  """
  n = -np.arange(-(length - 1), length)  # q - k
  half = num_buckets // 2
  exact = half // 2
  far = np.abs(n)
  with np.errstate(divide="ignore", invalid="ignore"):
    log_ratio = np.log(far.astype(np.float32) / np.float32(exact))
    large = exact + (log_ratio / np.float32(np.log(_MAX_DISTANCE / exact))
                     * np.float32(half - exact)).astype(np.int64)
  large = np.minimum(large, half - 1)
  return ((n < 0) * half + np.where(far < exact, far, large)).astype(np.int32)


def dropout(x: jax.Array, rate: float, key: jax.Array | None) -> jax.Array:
  """Inverted dropout; the identity when `key` is None (deterministic)."""
  if key is None or rate == 0.0:
    return x
  keep = jax.random.bernoulli(key, 1.0 - rate, x.shape)
  return jnp.where(keep, x / (1.0 - rate), jnp.zeros_like(x))


def _split(key: jax.Array | None, n: int) -> list[jax.Array | None]:
  return [None] * n if key is None else list(jax.random.split(key, n))


def _dot_f32(a: jax.Array, b: jax.Array, contract: tuple) -> jax.Array:
  return jax.lax.dot_general(a, b, (contract, ((), ())), preferred_element_type=jnp.float32)


@jax.custom_vjp
def _low_precision_dot(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """x [..., k] in a low compute dtype (bfloat16) times kernel [k, n] float32 -> [..., n]
  float32: the kernel rounded to x's dtype, products accumulated in float32.

  The gradient runs its two products in x's dtype too (the incoming float32 cotangent
  rounded to it) and returns the kernel's gradient in float32. Autodiff of the same
  forward would multiply the float32 cotangent by a bfloat16 operand, which XLA runs as a
  float32 product after a conversion: two thirds of a training step's FLOPs at float32
  speed, plus the conversions, so bfloat16 training was slower than float32 on CPU.
  """
  return _low_precision_dot_fwd(x, kernel)[0]


def _low_precision_dot_fwd(x, kernel):
  w = kernel.astype(x.dtype)
  return _dot_f32(x, w, ((x.ndim - 1,), (0,))), (x, w)


def _low_precision_dot_bwd(res, g):
  x, w = res
  g = g.astype(x.dtype)
  dx = _dot_f32(g, w, ((g.ndim - 1,), (1,))).astype(x.dtype)
  batch = tuple(range(x.ndim - 1))
  return dx, _dot_f32(x, g, (batch, batch))


_low_precision_dot.defvjp(_low_precision_dot_fwd, _low_precision_dot_bwd)


class _Dense(nnx.Linear):
  """nnx.Linear with the encoder's dtypes and initialiser.

  Products accumulate in float32 whatever the compute dtype, and the result is rounded
  to it once, after the bias: more exact in bfloat16, and on CPUs with AMX the only
  bfloat16 matmul XLA runs on the tile unit (benchmarks/cpu_matmul.py: 1,155 GFLOP/s
  against 189 for a bfloat16 result on this project's 2-core Xeon). Float32 compute
  is unchanged.
  """

  def __init__(self, d_in, d_out, *, init, dtype, rngs):
    super().__init__(d_in, d_out, kernel_init=init, bias_init=nnx.initializers.zeros,
                     dtype=dtype, param_dtype=jnp.float32, preferred_element_type=jnp.float32,
                     rngs=rngs)

  def __call__(self, inputs: jax.Array) -> jax.Array:
    if self.dtype is None or jnp.dtype(self.dtype) == jnp.float32:
      return super().__call__(inputs).astype(jnp.float32)
    # The same forward as nnx.Linear's (bias rounded to the compute dtype, added to the
    # float32 product), with a gradient whose products stay in the compute dtype.
    y = _low_precision_dot(inputs.astype(self.dtype), self.kernel[...])
    return (y + self.bias[...].astype(self.dtype)).astype(self.dtype)


class Embeddings(nnx.Module):
  """Word + position (+ token-type) embeddings, then LayerNorm and dropout."""

  def __init__(self, config: TransformerConfig, *, init, dtype, rngs: nnx.Rngs):
    self.config = config
    h = config.hidden_size
    emb = lambda n: nnx.Embed(n, h, embedding_init=init, dtype=dtype, param_dtype=jnp.float32, rngs=rngs)
    self.word_embeddings = emb(config.vocab_size)
    self.position_embeddings = emb(config.max_position_embeddings)
    self.token_type_embeddings = emb(config.type_vocab_size) if config.type_vocab_size else None
    self.layer_norm = nnx.LayerNorm(h, epsilon=config.layer_norm_eps, dtype=dtype,
                                    param_dtype=jnp.float32, rngs=rngs)

  def __call__(self, input_ids, token_type_ids, dropout_key, position_ids=None):
    positions = position_ids_for(input_ids, self.config, position_ids)
    x = self.word_embeddings(input_ids)
    if self.token_type_embeddings is not None:  # HF's order of additions: the same rounding
      x = x + self.token_type_embeddings(token_type_ids)
    x = x + self.position_embeddings(positions)
    return dropout(self.layer_norm(x), self.config.hidden_dropout_prob, dropout_key)


class SelfAttention(nnx.Module):
  """Multi-head self-attention with the output projection and its residual LayerNorm."""

  def __init__(self, config: TransformerConfig, *, init, dtype, rngs: nnx.Rngs):
    self.config = config
    h = config.hidden_size
    self.query = _Dense(h, h, init=init, dtype=dtype, rngs=rngs)
    self.key = _Dense(h, h, init=init, dtype=dtype, rngs=rngs)
    self.value = _Dense(h, h, init=init, dtype=dtype, rngs=rngs)
    self.output = _Dense(h, h, init=init, dtype=dtype, rngs=rngs)
    self.layer_norm = nnx.LayerNorm(h, epsilon=config.layer_norm_eps, dtype=dtype,
                                    param_dtype=jnp.float32, rngs=rngs)

  def __call__(self, x, bias, dropout_key):
    """x: [batch, seq, hidden]; bias: [batch, 1, seq, seq] (`attention_bias`)."""
    c = self.config
    b, s, _ = x.shape
    # Head-major [batch, heads, seq, head_dim] before the products: XLA's CPU code for
    # the same einsums on [batch, seq, heads, head_dim] was markedly slower (the
    # cross-encoder's reranking ratio to PyTorch in docs/benchmarks.md moved with it).
    heads = lambda t: t.reshape(b, s, c.num_attention_heads, c.head_dim).transpose(0, 2, 1, 3)
    q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
    # Scores and softmax in float32: bf16 logits lose the small differences that
    # decide attention over 48-128 tokens.
    scores = jnp.einsum("bhqd,bhkd->bhqk", q, k, preferred_element_type=jnp.float32)
    scores = scores / jnp.sqrt(jnp.float32(c.head_dim)) + bias
    probs = jax.nn.softmax(scores, axis=-1)
    k_attn, k_out = _split(dropout_key, 2)
    probs = dropout(probs, c.attention_probs_dropout_prob, k_attn).astype(v.dtype)
    ctx = jnp.einsum("bhqk,bhkd->bhqd", probs, v, preferred_element_type=jnp.float32)
    ctx = ctx.astype(v.dtype).transpose(0, 2, 1, 3).reshape(b, s, -1)
    out = dropout(self.output(ctx), c.hidden_dropout_prob, k_out)
    return self.layer_norm(out + x)


class Layer(nnx.Module):
  """One post-LayerNorm Transformer block."""

  def __init__(self, config: TransformerConfig, *, init, dtype, rngs: nnx.Rngs):
    self.config = config
    self.attention = SelfAttention(config, init=init, dtype=dtype, rngs=rngs)
    self.intermediate = _Dense(config.hidden_size, config.intermediate_size, init=init, dtype=dtype, rngs=rngs)
    self.output = _Dense(config.intermediate_size, config.hidden_size, init=init, dtype=dtype, rngs=rngs)
    self.layer_norm = nnx.LayerNorm(config.hidden_size, epsilon=config.layer_norm_eps, dtype=dtype,
                                    param_dtype=jnp.float32, rngs=rngs)

  def __call__(self, x, bias, dropout_key):
    k_attn, k_out = _split(dropout_key, 2)
    x = self.attention(x, bias, k_attn)
    y = self.output(jax.nn.gelu(self.intermediate(x), approximate=False))
    return self.layer_norm(dropout(y, self.config.hidden_dropout_prob, k_out) + x)


def _run_layer(layer: Layer, x, bias, dropout_key):
  return layer(x, bias, dropout_key)


_run_layer_remat = nnx.remat(_run_layer)


class TransformerEncoder(nnx.Module):
  """BERT/RoBERTa encoder: token ids in, contextual hidden states out.

  Args:
    config: the architecture.
    rngs: parameter initialisation.
    dtype: compute dtype (float32, or bfloat16 on accelerators); parameters stay float32.
    init: "normal" (HF's N(0, initializer_range), what pretrained weights overwrite)
      or "xavier" (Glorot uniform: the paper's `rand` baseline).
    remat: recompute each layer's activations in the backward pass.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               init: str = "normal", remat: bool = False):
    if init == "normal":
      initializer = nnx.initializers.normal(config.initializer_range)
    elif init == "xavier":
      initializer = nnx.initializers.xavier_uniform()
    else:
      raise ValueError(f"init must be 'normal' or 'xavier', got {init!r}")
    self.config = config
    self.remat = remat
    self.embeddings = Embeddings(config, init=initializer, dtype=dtype, rngs=rngs)
    self.layers = nnx.List([Layer(config, init=initializer, dtype=dtype, rngs=rngs)
                            for _ in range(config.num_hidden_layers)])
    self.relative_attention_bias = (
        nnx.Embed(config.relative_attention_num_buckets, config.num_attention_heads,
                  embedding_init=initializer, param_dtype=jnp.float32, rngs=rngs)
        if config.relative_attention_num_buckets else None)

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               token_type_ids: jax.Array | None = None,
               dropout_key: jax.Array | None = None,
               position_ids: jax.Array | None = None) -> jax.Array:
    """Encodes a batch, one sentence per row or packed (`data.packing`).

    Args:
      input_ids: [batch, seq] int32.
      attention_mask: [batch, seq] int32 or bool, 0 on padding; 1 on real tokens, or
        the sentence number 1, 2, ... of each token of a packed row.
      token_type_ids: [batch, seq] int32, zeros when None.
      dropout_key: PRNG key; None means deterministic (inference).
      position_ids: [batch, seq] int32 positions within each sentence of packed rows;
        None: HF's positions for one sentence per row.
    Returns:
      [batch, seq, hidden] hidden states in the compute dtype.
    """
    if token_type_ids is None:
      token_type_ids = jnp.zeros_like(input_ids)
    keys = _split(dropout_key, len(self.layers) + 1)
    x = self.embeddings(input_ids, token_type_ids, keys[0], position_ids)
    bias = attention_bias(attention_mask)
    if self.relative_attention_bias is not None:
      bias = bias + self.relative_position_bias(input_ids.shape, position_ids)
    run = _run_layer_remat if self.remat else _run_layer
    for layer, key in zip(self.layers, keys[1:]):
      x = run(layer, x, bias, key)
    return x

  def relative_position_bias(self, shape: tuple[int, int], position_ids: jax.Array | None) -> jax.Array:
    """MPNet's [batch, heads, seq, seq] float32 bias for the relative position k - q.

    HF measures k - q in row positions; within a sentence of a packed row the difference of
    `position_ids` is the same distance, and across sentences the attention mask hides it.
    """
    batch, seq = shape
    table = jnp.asarray(relative_buckets(self.config.relative_attention_num_buckets, seq))
    if position_ids is None:
      relative = np.arange(seq)[None, :] - np.arange(seq)[:, None]
      buckets = jnp.broadcast_to(table[relative + seq - 1], (batch, seq, seq))
    else:
      relative = position_ids[:, None, :] - position_ids[:, :, None]
      buckets = table[jnp.clip(relative, -(seq - 1), seq - 1) + seq - 1]
    values = self.relative_attention_bias.embedding[...][buckets]  # [batch, q, k, heads]
    return jnp.transpose(values, (0, 3, 1, 2)).astype(jnp.float32)
