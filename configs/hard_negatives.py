"""Training pairs for a reranker with negatives a dual encoder retrieves.

    python -m convfit_jax.main --config=configs/hard_negatives.py:retriever=workdirs/stage1_ubuntu
    python -m convfit_jax.main --config=configs/hard_negatives.py:runlocal   # a smoke run

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/hard_negatives.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.hard_negatives import get_config

__all__ = ["get_config"]  # what --config loads
