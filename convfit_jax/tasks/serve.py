"""Task `serve`: a saved classifier behind HTTP (`convfit_jax.serving`) until interrupted."""

from __future__ import annotations

import ml_collections
from absl import logging

from convfit_jax import saved_classifier
from convfit_jax.classifier import IntentClassifier
from convfit_jax.tasks.predict import classifier_folder


def run(config: ml_collections.ConfigDict) -> None:
  if not config.model:
    raise ValueError("serve needs a saved classifier: --config=configs/serve.py:model=<folder>")
  folder = classifier_folder(config.model)
  if not folder.is_dir():
    raise FileNotFoundError(f"model: {folder} does not exist")
  try:
    import uvicorn  # pylint: disable=import-outside-toplevel
    from convfit_jax import serving  # pylint: disable=import-outside-toplevel
  except ImportError as e:
    raise ValueError(f'serving needs the serve extra (pip install -e ".[serve]"): {e}') from None
  restored = saved_classifier.recover(folder)
  if restored:
    logging.warning(restored)
  if not saved_classifier.is_saved_classifier(folder):
    raise ValueError(f"model: {folder} is not a saved classifier (no "
                     f"{saved_classifier.SETTINGS_FILE}); IntentClassifier.save_pretrained "
                     "writes one, and so does a Stage 2 run (workdir/classifier)")
  clf = IntentClassifier.from_pretrained(folder, dtype=config.dtype or None)
  settings = serving.ServeSettings(
      max_texts=config.max_texts, max_body_bytes=config.max_body_bytes,
      batching=config.batching, batch_wait_ms=config.batch_wait_ms,
      batch_size=config.batch_size, explain_top=config.explain_top,
      allow_updates=config.allow_updates)
  logging.info("serving %s (%d intents, pool of %d) on http://%s:%d; compiling before ready",
               folder, len(clf.labels), len(clf.pool_texts), config.host, config.port)
  app = serving.build_app(clf, folder, settings)
  uvicorn.Server(uvicorn.Config(app, host=config.host, port=config.port, log_config=None,
                                access_log=False, lifespan="on")).run()
