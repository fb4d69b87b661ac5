"""BERT-style cross-encoder reranker for multi-turn response selection, on ubuntu_irc.

    python -m convfit_jax.main --config=configs/rerank_cross.py
    python -m convfit_jax.main --config=configs/rerank_cross.py:runlocal   # a few-minute smoke run

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/rerank_cross.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.rerank_cross import get_config

__all__ = ["get_config"]  # what --config loads
