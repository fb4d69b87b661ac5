"""A siamese sentence encoder for pairs: one encoder for both sides, the `smax` pair
classifier when the loss needs one, and the intent head of `train.head_weight` (ConvFiT's
Stage 2 model; `config.model.name = "siamese"`).
"""

from __future__ import annotations

from typing import Callable, Iterable

import ml_collections
from flax import nnx

from convfit_jax import models
from convfit_jax.models import Built, heads


class SiameseEncoder(nnx.Module):
  """The sentence encoder, the [u; v; |u - v|] classifier of the `smax` loss and the intent
  head, each when used."""

  def __init__(self, encoder: nnx.Module, classifier: heads.PairClassifier | None,
               intent_head: heads.IntentHead | None = None):
    self.encoder = encoder
    self.classifier = classifier
    self.intent_head = intent_head


def build(m: ml_collections.ConfigDict, *, seed: int, classifier: bool = False,
          train_texts: Callable[[], Iterable[str]] | None = None, intent_labels: int = 0,
          head_scale: float = 20.0) -> Built:
  """The encoder of `m.encoder`'s module (`sentence`: a Transformer; `conv_encoder`, ...,
  whose vocabularies may read `train_texts()`), with a fresh pair classifier (seeded by
  seed + 1) when asked, and an intent head over `intent_labels` intents when > 0."""
  built = models.get(m.encoder).build(m, seed=seed, train_texts=train_texts)
  head = heads.PairClassifier(built.model.dim, rngs=nnx.Rngs(seed + 1)) if classifier else None
  intent_head = (heads.IntentHead(built.model.dim, intent_labels, scale=head_scale)
                 if intent_labels else None)
  built.model = SiameseEncoder(built.model, head, intent_head)
  return built
