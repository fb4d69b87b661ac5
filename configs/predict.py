"""Classify a text file (or stdin) with a saved IntentClassifier: one JSON line per text.

    python -m convfit_jax.main --config=configs/predict.py --config.classifier=my_classifier < texts.txt

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/predict.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.predict import get_config

__all__ = ["get_config"]  # what --config loads
