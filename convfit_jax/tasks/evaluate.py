"""Task `evaluate`: k-NN (and MLP) intent detection with any encoder or checkpoint."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import ml_collections
from absl import logging

from convfit_jax import checkpoints
from convfit_jax.encoder import Encoder
from convfit_jax.eval.intent import evaluate_intents, load_intent_data, subsample
from convfit_jax.tokenize import load_tokenizer
from convfit_jax.train.state import Workdir


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Evaluates `config.model.init_from` on `config.data`; writes workdir/metrics.json."""
  workdir = Workdir(config.workdir)
  workdir.write_config(config)
  m = config.model
  model, ck = checkpoints.init_sentence_encoder(m.init_from, architecture=m.architecture,
                                                dtype=jnp.dtype(m.dtype), seed=config.seed)
  encoder = Encoder(model, load_tokenizer(ck.tokenizer_dir), max_length=m.max_length,
                    normalize=ck.normalize, hf_config=ck.hf_config)
  data = load_intent_data(config.data, oos=config.eval.oos)
  e = config.eval
  test = subsample(data.test, e.max_test, config.seed)
  metrics = evaluate_intents(
      encoder, data, k=e.k, vote=e.vote, batch_size=e.batch_size, test=test, run_mlp=e.mlp,
      oos=e.oos, seed=config.seed, tsne_path=workdir.path / "tsne.png" if e.tsne else None,
      tsne_title=f"{data.name} test, {m.init_from}")
  metrics = workdir.update_metrics({**metrics, "num_train": len(data.train)})
  logging.info("%s", {k: v for k, v in metrics.items() if not isinstance(v, (list, dict))})
  print(f"k-NN accuracy on {len(test)} test examples: {metrics['knn_accuracy']:.4f}"
        + (f"; MLP {metrics['mlp_accuracy']:.4f}" if "mlp_accuracy" in metrics else ""), flush=True)
  workdir.close()
  return metrics
