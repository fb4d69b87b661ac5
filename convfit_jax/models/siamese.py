"""A siamese sentence encoder for pairs: one encoder for both sides, and the `smax` pair
classifier when the loss needs one (ConvFiT's Stage 2 model; `config.model.name = "siamese"`).
"""

from __future__ import annotations

from typing import Callable, Iterable

import ml_collections
from flax import nnx

from convfit_jax import models
from convfit_jax.models import Built, heads


class SiameseEncoder(nnx.Module):
  """The sentence encoder, and the [u; v; |u - v|] classifier of the `smax` loss when used."""

  def __init__(self, encoder: nnx.Module, classifier: heads.PairClassifier | None):
    self.encoder = encoder
    self.classifier = classifier


def build(m: ml_collections.ConfigDict, *, seed: int, classifier: bool = False,
          train_texts: Callable[[], Iterable[str]] | None = None) -> Built:
  """The encoder of `m.encoder`'s module (`sentence`: a Transformer; `conv_encoder`, ...,
  whose vocabularies may read `train_texts()`), with a fresh pair classifier (seeded by
  seed + 1) when asked."""
  built = models.get(m.encoder).build(m, seed=seed, train_texts=train_texts)
  head = heads.PairClassifier(built.model.dim, rngs=nnx.Rngs(seed + 1)) if classifier else None
  built.model = SiameseEncoder(built.model, head)
  return built
