"""A cross-encoder: context and response read together by the Transformer, a match classifier
on the first token (the BERT cross-encoder of Chen & Wang 2019; sentence-transformers'
`CrossEncoder`).

Input: the tokenizer's pair template, [CLS] context [SEP] response [SEP] for BERT
(token types 0 then 1) or <s> context </s></s> response </s> for RoBERTa/MPNet. The
response keeps its first `max_response` tokens, the context its LAST tokens that fit in
`max_length` (the turns nearest the response matter most).

Head: BertForSequenceClassification's, tanh(W_p h_[CLS]) -> dropout -> W_c -> 2 logits
(not a match, a match). W_p is BERT's pretrained pooler where the checkpoint has one
(MiniLM does), random otherwise (MPNet, RoBERTa: their classification heads are also a
dense + tanh on the first token, with one more dropout).
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax import hf_io
from convfit_jax.atomic_files import write_json
from convfit_jax.data.words import padded_length
from convfit_jax.models import Built, PairInputs, sentence
from convfit_jax.models.transformer import TransformerConfig, TransformerEncoder, dropout
from convfit_jax.tokenization import load_tokenizer


class CrossEncoder(nnx.Module):
  """Pair token ids -> [n, 2] float32 logits.

  Args:
    config: the Transformer architecture.
    dtype, init, remat: as `TransformerEncoder` takes them.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, dtype=jnp.float32,
               init: str = "normal", remat: bool = False):
    h = config.hidden_size
    self.transformer = TransformerEncoder(config, rngs=rngs, dtype=dtype, init=init, remat=remat)
    dense_init = nnx.initializers.normal(config.initializer_range)
    self.pooler = nnx.Linear(h, h, kernel_init=dense_init, rngs=rngs)
    self.classifier = nnx.Linear(h, 2, kernel_init=dense_init, rngs=rngs)

  def __call__(self, ids: jax.Array, mask: jax.Array, type_ids: jax.Array,
               dropout_key: jax.Array | None = None) -> jax.Array:
    """[n, L] int32 token ids, attention mask and token types -> [n, 2] float32 logits."""
    k_body, k_head = (None, None) if dropout_key is None else jax.random.split(dropout_key)
    hidden = self.transformer(ids, mask, token_type_ids=type_ids, dropout_key=k_body)
    pooled = jnp.tanh(self.pooler(hidden[:, 0].astype(jnp.float32)))
    return self.classifier(dropout(pooled, self.transformer.config.hidden_dropout_prob, k_head))


def build(m: ml_collections.ConfigDict, *, seed: int,
          train_texts: Callable[[], Iterable[str]]) -> Built:
  """The cross-encoder a `model` config block names (`sentence.init_from_config`'s fields:
  a pretrained folder or hub id, a Stage 1/2 workdir, or "rand"). The classifier is new
  (seeded); the pooler is the checkpoint's where it has one.
  `train_texts` is not read: the vocabulary is the pretrained tokenizer's."""
  del train_texts
  encoder, ck = sentence.init_from_config(m, seed=seed)
  model = CrossEncoder(ck.config, rngs=nnx.Rngs(seed), dtype=jnp.dtype(m.dtype),
                       remat=m.get("remat", False))
  model.transformer = encoder.transformer
  if ck.pooler is not None and str(m.init_from) != "rand":
    model.pooler.kernel[...] = jnp.asarray(ck.pooler["kernel"])
    model.pooler.bias[...] = jnp.asarray(ck.pooler["bias"])
  return Built(model, load_tokenizer(ck.tokenizer_dir), ck.hf_config)


def pair_inputs(built: Built, m: ml_collections.ConfigDict) -> PairInputs:
  """(histories, responses) -> {"ids", "mask", "type_ids"} [n, L] int32, L a
  `words.padded_length` up to `m.max_length`; responses cut to `m.max_response` tokens
  from the right, contexts to what is left of `m.max_length` from the left."""
  backend = copy.deepcopy(built.tokenizer.backend_tokenizer)
  backend.no_padding()
  backend.no_truncation()
  template = backend.post_processor
  specials = template.num_special_tokens_to_add(True)
  pad_id = built.tokenizer.pad_token_id
  if m.max_response + specials >= m.max_length:
    raise ValueError(f"model.max_response={m.max_response} leaves no room for the context in "
                     f"model.max_length={m.max_length} ({specials} special tokens)")

  def encode(histories: Sequence[str], responses: Sequence[str]) -> dict[str, np.ndarray]:
    contexts = backend.encode_batch(list(histories), add_special_tokens=False)
    replies = backend.encode_batch(list(responses), add_special_tokens=False)
    pairs = []
    for c, r in zip(contexts, replies):
      r.truncate(m.max_response, direction="right")
      c.truncate(m.max_length - specials - len(r.ids), direction="left")
      pairs.append(template.process(c, r, add_special_tokens=True))
    width = padded_length(max(len(p.ids) for p in pairs), m.max_length)
    out = {"ids": np.full((len(pairs), width), pad_id, np.int32),
           "mask": np.zeros((len(pairs), width), np.int32),
           "type_ids": np.zeros((len(pairs), width), np.int32)}
    for i, p in enumerate(pairs):
      out["ids"][i, :len(p.ids)] = p.ids
      out["mask"][i, :len(p.ids)] = 1
      out["type_ids"][i, :len(p.ids)] = p.type_ids
    return out

  return PairInputs(encode, pad_values={"ids": pad_id})


def export(built: Built, model: CrossEncoder, folder: str | os.PathLike) -> None:
  """An HF folder (config, weights, tokenizer) the encoder loads from, plus `head.npz`
  (pooler and classifier) and `cross_encoder.json`."""
  folder = Path(folder)
  hf_io.save(folder, config=model.transformer.config, hf_config=built.hf_config,
             transformer=sentence.flat_params(model.transformer), tokenizer=built.tokenizer,
             pooling="cls", normalize=False, projection=None,
             max_seq_length=model.transformer.config.max_tokens)
  head = {f"{name}.{k}": v for name in ("pooler", "classifier")
          for k, v in sentence.flat_params(getattr(model, name)).items()}
  np.savez(folder / "head.npz", **head)
  write_json(folder / "cross_encoder.json", {"num_labels": 2, "head": "head.npz"})


def load(folder: str | os.PathLike, m: ml_collections.ConfigDict) -> Built:
  """The cross-encoder `export` wrote, in the dtype of `m` (the run's model block)."""
  folder = Path(folder)
  ck = hf_io.load(folder)
  with np.load(folder / "head.npz") as head:
    params = {**{f"transformer.{k}": v for k, v in ck.transformer.items()}, **dict(head)}
  model = sentence.build_with_params(
      lambda: CrossEncoder(ck.config, rngs=nnx.Rngs(0), dtype=jnp.dtype(m.dtype)), params,
      source=str(folder))
  return Built(model, load_tokenizer(ck.tokenizer_dir), ck.hf_config)
