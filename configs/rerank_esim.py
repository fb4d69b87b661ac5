"""ESIM reranker for multi-turn response selection (Chen & Wang 2019), on ubuntu_irc.

    python -m convfit_jax.main --config=configs/rerank_esim.py
    python -m convfit_jax.main --config=configs/rerank_esim.py:runlocal   # a few-minute smoke run

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/rerank_esim.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.rerank_esim import get_config

__all__ = ["get_config"]  # what --config loads
