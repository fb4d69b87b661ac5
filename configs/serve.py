"""Serve a saved IntentClassifier over HTTP: POST /predict, POST /examples, GET /health, /info.

    python -m convfit_jax.main --config=configs/serve.py:model=my_classifier,port=8000

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/serve.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.serve import get_config

__all__ = ["get_config"]  # what --config loads
