"""The word-level recursive convolutional sentence encoder of seed 003.

    python -m convfit_jax.main --config=configs/conv_encoder.py
    python -m convfit_jax.main --config=configs/conv_encoder.py:stage=stage1,init_from=workdirs/conv_encoder/nli_balanced_none_seed0
    python -m convfit_jax.main --config=configs/conv_encoder.py:stage=stage2,init_from=workdirs/conv_encoder/nli_balanced_none_seed0
    python -m convfit_jax.main --config=configs/conv_encoder.py:runlocal   # a few-minute smoke run

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/conv_encoder.py` (installed with the package, so this file works
from any directory).
"""

from convfit_jax.configs.conv_encoder import get_config

__all__ = ["get_config"]  # what --config loads
