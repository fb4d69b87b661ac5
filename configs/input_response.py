"""The input-response model of Yang et al. (2018), conversations alone or multitask with NLI.

    python -m convfit_jax.main --config=configs/input_response.py
    python -m convfit_jax.main --config=configs/input_response.py:multitask
    python -m convfit_jax.main --config=configs/input_response.py:encoder=dan,multitask
    python -m convfit_jax.main --config=configs/input_response.py:runlocal   # a few-minute smoke run

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/input_response.py` (installed with the package, so this file works
from any directory).
"""

from convfit_jax.configs.input_response import get_config

__all__ = ["get_config"]  # what --config loads
