"""The sentence encoder: Transformer, pooling, optional projection; how it is loaded and built.

`load` reads a pretrained folder (through `hf_io`), `init` is where a training run
starts (pretrained, a run's output, or random), `build` does that from a `model`
config block (`config.model.name = "sentence"`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp
from flax import nnx
import numpy as np

from convfit_jax import hf_io
from convfit_jax.models import Built, heads
from convfit_jax.models.transformer import TransformerConfig, TransformerEncoder
from convfit_jax.tokenization import bucket, bucket_widths, load_tokenizer, tokenize


class SentenceEncoder(nnx.Module):
  """Token ids to one vector per sentence; what Stage 1, Stage 2 and `Encoder` share.

  Args:
    config: Transformer architecture.
    pooling: "mean" (ConvFiT's choice) or "cls".
    projection_dim: when set, Dense(projection_dim) + tanh after pooling (Stage 2's d_o).
    dtype, init, remat: as in `TransformerEncoder`.
  """

  def __init__(self, config: TransformerConfig, *, rngs: nnx.Rngs, pooling: str = "mean",
               projection_dim: int | None = None, dtype=jnp.float32, init: str = "normal",
               remat: bool = False):
    if pooling not in heads.POOLING_MODES:
      raise ValueError(f"pooling must be one of {heads.POOLING_MODES}, got {pooling!r}")
    self.pooling = pooling
    self.transformer = TransformerEncoder(config, rngs=rngs, dtype=dtype, init=init, remat=remat)
    self.projection = (heads.Projection(config.hidden_size, projection_dim, rngs=rngs, dtype=dtype)
                       if projection_dim else None)

  @property
  def config(self) -> TransformerConfig:
    return self.transformer.config

  @property
  def dim(self) -> int:
    if self.projection is not None:
      return self.projection.dense.out_features
    return self.config.hidden_size

  def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
               dropout_key: jax.Array | None = None, *, position_ids: jax.Array | None = None,
               slots: jax.Array | None = None) -> jax.Array:
    """Sentence vectors (not normalised), one sentence per row or packed.

    Args:
      input_ids: [rows, seq] int32.
      attention_mask: [rows, seq] int32, 0 on padding, 1 on real tokens or, in packed
        rows (`data.packing`), each token's sentence number 1, 2, ...
      dropout_key: PRNG key; None is inference.
      position_ids: [rows, seq] int32 positions within each sentence (packed rows).
      slots: [n, 2] int32 (row, sentence number) of the sentences to return (packed rows).
    Returns:
      [rows, dim] float32, or [n, dim] with `slots`.
    """
    hidden = self.transformer(input_ids, attention_mask, dropout_key=dropout_key,
                              position_ids=position_ids)
    x = heads.pool(hidden, attention_mask, self.pooling, slots)
    if self.projection is not None:
      x = self.projection(x)
    return x


def flat_params(module: nnx.Module) -> dict[str, np.ndarray]:
  """The module's parameters as {dotted path: float32 numpy array}."""
  return {".".join(map(str, path)): np.asarray(var[...])
          for path, var in nnx.to_flat_state(nnx.state(module, nnx.Param))}


def build_with_params(build: Callable[[], nnx.Module], params: dict[str, Any],
                      source: str = "parameters") -> nnx.Module:
  """Builds `build()` abstractly (no random init) and fills it with `params`.

  Args:
    build: constructs the module; called under `nnx.eval_shape`.
    params: {dotted path: array} covering every parameter, with matching shapes.
    source: named in errors.
  """
  graphdef, state = nnx.split(nnx.eval_shape(build))
  flat = nnx.to_flat_state(state)
  expected = {".".join(map(str, p)): v for p, v in flat}
  missing = sorted(set(expected) - set(params))
  unexpected = sorted(set(params) - set(expected))
  if missing or unexpected:
    raise ValueError(f"{source}: parameters do not match the model.\n  missing: {missing}\n"
                     f"  unexpected: {unexpected}")
  leaves = []
  for path, var in flat:
    key = ".".join(map(str, path))
    value = jnp.asarray(params[key], dtype=var.dtype)
    if value.shape != var.shape:
      raise ValueError(f"{source}: {key} has shape {value.shape}, the model expects {var.shape}")
    leaves.append((path, var.replace(value)))
  return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def load(name_or_path: str | os.PathLike, *, dtype=None, remat: bool = False,
                          projection_dim: int | None = None, seed: int = 0):
  """A `SentenceEncoder` with a checkpoint's weights, and the `hf_io.PretrainedFolder` it came from.

  Args:
    name_or_path: folder, hub id or the MiniLM name (see `hf_io.resolve`).
    dtype: compute dtype (default float32); parameters stay float32.
    remat: per-layer rematerialisation.
    projection_dim: add a fresh Dense+tanh head of this width (Glorot init from `seed`)
      when the checkpoint has none; a checkpoint's own head must have this width.
  """
  ck = hf_io.load(name_or_path)
  dtype = jnp.float32 if dtype is None else dtype
  if ck.projection is not None:
    have = ck.projection["kernel"].shape[1]
    if projection_dim not in (None, have):
      raise ValueError(f"{name_or_path}: its projection has width {have}, asked for {projection_dim}")
    projection_dim = have
  build = lambda: SentenceEncoder(ck.config, rngs=nnx.Rngs(seed), pooling=ck.pooling,
                                  projection_dim=projection_dim, dtype=dtype, remat=remat)
  params = {f"transformer.{k}": v for k, v in ck.transformer.items()}
  if ck.projection is not None:
    params.update({f"projection.dense.{k}": v for k, v in ck.projection.items()})
  elif projection_dim:
    head = heads.Projection(ck.config.hidden_size, projection_dim, rngs=nnx.Rngs(seed))
    params.update({f"projection.{k}": v for k, v in flat_params(head).items()})
  return build_with_params(build, params, source=str(name_or_path)), ck


def init(init_from: str | os.PathLike, *, architecture: str | os.PathLike = hf_io.MINILM,
         architecture_overrides: str = "", rand_init: str = "xavier", dtype=None,
         remat: bool = False, projection_dim: int | None = None, seed: int = 0):
  """The encoder a training run starts from, and the `hf_io.PretrainedFolder` of its tokenizer and config.

  Args:
    init_from: a folder or hub id (pretrained, or a Stage 1/2 output: a workdir with a
      `model/` folder is accepted as is), or "rand" for `architecture` with
      random weights (`rand_init`).
    architecture: config and tokenizer for "rand".
    architecture_overrides: for "rand", config.json fields to change
      (`hf_io.with_architecture`): a Transformer of another size from scratch.
    rand_init: for "rand", "xavier" (Glorot uniform: the paper's `rand` baseline) or
      "normal" (HF's N(0, initializer_range): BERT's own start, which trains from scratch).
    dtype, remat, projection_dim, seed: as in `load`.
  """
  if architecture_overrides and str(init_from) != "rand":
    raise ValueError(f"model.architecture_overrides={architecture_overrides!r} changes the shape of "
                     f"the weights; it needs model.init_from='rand', not {str(init_from)!r}")
  if str(init_from) == "rand":
    ck = hf_io.load(architecture)
    if architecture_overrides:
      ck = hf_io.with_architecture(ck, architecture_overrides, source="model.architecture_overrides")
    model = SentenceEncoder(ck.config, rngs=nnx.Rngs(seed), pooling=ck.pooling,
                            projection_dim=projection_dim, dtype=jnp.float32 if dtype is None else dtype,
                            init=rand_init, remat=remat)
    return model, ck
  folder = Path(init_from)
  if (folder / "model" / "config.json").is_file():
    init_from = folder / "model"
  return load(init_from, dtype=dtype, remat=remat, projection_dim=projection_dim,
                               seed=seed)


def init_from_config(m, *, seed: int, projection_dim: int | None = None):
  """`init` with the fields of a `model` config block (init_from, architecture,
  architecture_overrides, rand_init, dtype, remat): what every Transformer-based model
  (the sentence encoder, the cross-encoder) starts from."""
  return init(m.init_from, architecture=m.architecture,
              architecture_overrides=m.get("architecture_overrides", ""),
              rand_init=m.get("rand_init", "xavier"), dtype=jnp.dtype(m.dtype),
              remat=m.get("remat", False), projection_dim=projection_dim, seed=seed)


def build(m, *, seed: int, train_texts=None) -> Built:
  """The encoder a `model` config block names (`init_from_config`'s fields and
  projection_dim), with its tokenizer (pretrained: `train_texts`, which models with
  vocabularies of their own read, is not needed)."""
  del train_texts
  model, ck = init_from_config(m, seed=seed, projection_dim=m.get("projection_dim", 0) or None)
  return Built(model, load_tokenizer(ck.tokenizer_dir), ck.hf_config, ck.normalize)


def text_inputs(built: Built, max_length: int) -> Callable[[Sequence[str]], dict[str, np.ndarray]]:
  """texts -> {"input_ids", "attention_mask"} [n, L] int32: cut at `max_length` tokens,
  L the smallest `tokenization.bucket_widths` width that holds the longest."""
  widths = bucket_widths(max_length)

  def inputs(texts: Sequence[str]) -> dict[str, np.ndarray]:
    ids, mask = tokenize(built.tokenizer, texts, max_length)
    width = bucket(int(mask.sum(axis=1).max(initial=1)), widths)
    return {"input_ids": ids[:, :width], "attention_mask": mask[:, :width]}

  return inputs
