"""Stage 2 on label batches: every pair of the batch, intents as in-batch negatives.

    python -m convfit_jax.main --config=configs/stage2_dense.py
    python -m convfit_jax.main --config=configs/stage2_dense.py:dataset=clinc150,shots=0,loss=ocl

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/stage2_dense.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.stage2_dense import get_config

__all__ = ["get_config"]  # what --config loads
