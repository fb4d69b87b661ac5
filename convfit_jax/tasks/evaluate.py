"""Task `evaluate`: the evaluators of `config.evals` on any encoder or run output, no training.

The encoder is read as a text encoder (k-NN intent detection) and as a dual encoder
(response selection: contexts and candidates encoded alike, ranked by cosine);
`model.init_from="tfidf"` is the TF-IDF baseline of response selection instead, a
finished rerank run's workdir (`configs/rerank_*.py`) scores response-selection cases
with that reranker, in `model.dtype`; `"glove"` is the bag-of-vectors text encoder
(the mean GloVe vector of `GLOVE`), a DAN run's workdir (`configs/input_response.py`
with encoder=dan) that DAN, and a recursive convolutional encoder's run
(`configs/conv_encoder.py`) that encoder, and a byte auto-encoder's run
(`configs/byte_autoencoder.py`) its latent.
"""

from __future__ import annotations

from typing import Any

import ml_collections
from absl import logging

from convfit_jax import evaluators, models
from convfit_jax.encoder import Encoder
from convfit_jax.evaluators.response_selection import BiEncoderScorer, TfidfScorer
from convfit_jax.models import byte_autoencoder, conv_encoder, dan
from convfit_jax.train import rerank
from convfit_jax.train.workdir import Workdir, summary


# The bag-of-vectors baseline's word vectors, relative to the current directory.
GLOVE = "../shared/data/vectors/glove6b50d/vectors.txt"


def _text_predictors(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The text encoder `config.model` names, and the same as a dual encoder for response
  selection (contexts and responses encoded alike, unit vectors)."""
  if config.model.init_from == "glove":
    encoder = dan.BagOfVectors(GLOVE)
  elif dan.is_saved(config.model.init_from):
    encoder = dan.load(config.model.init_from)
  elif conv_encoder.is_saved(config.model.init_from):
    encoder = conv_encoder.load(config.model.init_from)
  elif byte_autoencoder.is_saved(config.model.init_from):
    encoder = byte_autoencoder.ByteTextEncoder(byte_autoencoder.load(config.model.init_from))
  else:
    built = models.get(config.model.name).build(config.model, seed=config.seed)
    encoder = Encoder(built.model, built.tokenizer, max_length=config.model.max_length,
                      normalize=built.normalize, hf_config=built.hf_config)
  unit = lambda texts, batch_size: encoder.encode(texts, batch_size=batch_size, normalize=True)
  return {"text": encoder, "response_scorer": BiEncoderScorer(unit, unit)}


def run(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Evaluates `config.model` (e.g. `init_from`) with `config.evals`; writes workdir/metrics.json."""
  workdir = Workdir(config.workdir)
  try:
    workdir.write_config(config)
    if config.model.init_from == "tfidf":
      predictors = {"response_scorer": TfidfScorer()}
    elif rerank.is_rerank_run(config.model.init_from):
      model, inputs = rerank.load_reranker(config.model.init_from, dtype=config.model.dtype)
      predictors = {"response_scorer": rerank.PairScorer(model, inputs)}
    else:
      predictors = _text_predictors(config)
    metrics = {}
    for name, (evaluator, _) in evaluators.from_config(config.evals, run_config=config,
                                                       workdir=workdir.path).items():
      m = evaluator(predictors, when="", label=str(config.model.init_from))
      logging.info("%s: %s", name, evaluators.numeric(m))
      metrics.update(m)
    metrics = workdir.update_metrics(metrics)
    if "knn_accuracy" in metrics:
      summary(f"k-NN accuracy on {metrics['num_test']} test examples: {metrics['knn_accuracy']:.4f}"
              + (f"; MLP {metrics['mlp_accuracy']:.4f}" if "mlp_accuracy" in metrics else ""))
    return metrics
  finally:
    workdir.close()
