"""Stage 1 (ConvFiT): conversational fine-tuning of a pretrained encoder.

    python -m convfit_jax.main --config=configs/stage1.py
    python -m convfit_jax.main --config=configs/stage1.py:runlocal   # a few-minute smoke run
    python -m convfit_jax.main --config=configs/stage1.py --config.train.max_steps=200

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/stage1.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.stage1 import get_config

__all__ = ["get_config"]  # what --config loads
