"""Encode a text file, one text per line, into a float32 .npy (row i for line i).

    python -m convfit_jax.main --config=configs/encode.py --config.input=texts.txt --config.output=emb.npy

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/encode.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.encode import get_config

__all__ = ["get_config"]  # what --config loads
