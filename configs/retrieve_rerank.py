"""Retrieve-then-rerank over a pool of responses (Chen & Wang 2019's pipeline).

    python -m convfit_jax.main --config=configs/retrieve_rerank.py   # retrieval alone
    python -m convfit_jax.main --config=configs/retrieve_rerank.py:reranker=workdirs/rerank_esim

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/retrieve_rerank.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.retrieve_rerank import get_config

__all__ = ["get_config"]  # what --config loads
