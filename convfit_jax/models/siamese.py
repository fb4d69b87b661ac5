"""A siamese sentence encoder for pairs: one encoder for both sides, and the `smax` pair
classifier when the loss needs one (ConvFiT's Stage 2 model; `config.model.name = "siamese"`).
"""

from __future__ import annotations

import ml_collections
from flax import nnx

from convfit_jax.models import Built, heads, sentence
from convfit_jax.models.sentence import SentenceEncoder


class SiameseEncoder(nnx.Module):
  """The sentence encoder, and the [u; v; |u - v|] classifier of the `smax` loss when used."""

  def __init__(self, encoder: SentenceEncoder, classifier: heads.PairClassifier | None):
    self.encoder = encoder
    self.classifier = classifier


def build(m: ml_collections.ConfigDict, *, seed: int, classifier: bool = False) -> Built:
  """`sentence.build`'s encoder, with a fresh pair classifier (seeded by seed + 1) when asked."""
  built = sentence.build(m, seed=seed)
  head = heads.PairClassifier(built.model.dim, rngs=nnx.Rngs(seed + 1)) if classifier else None
  built.model = SiameseEncoder(built.model, head)
  return built
