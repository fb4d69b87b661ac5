"""The byte-level recursive convolutional auto-encoder of seed 003.

    python -m convfit_jax.main --config=configs/byte_autoencoder.py
    python -m convfit_jax.main --config=configs/byte_autoencoder.py:padding=right
    python -m convfit_jax.main --config=configs/byte_autoencoder.py:runlocal   # a few-minute smoke run

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/byte_autoencoder.py` (installed with the package, so this file works
from any directory).
"""

from convfit_jax.configs.byte_autoencoder import get_config

__all__ = ["get_config"]  # what --config loads
