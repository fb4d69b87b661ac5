"""Intent detection with any encoder, no training: k-NN (and the MLP baseline).

    python -m convfit_jax.main --config=configs/evaluate.py                     # off-the-shelf MiniLM
    python -m convfit_jax.main --config=configs/evaluate.py:init_from=workdirs/stage2/banking77_10shot_ocl_seed0
    python -m convfit_jax.main --config=configs/evaluate.py:dataset=clinc150,oos --config.evals.knn.mlp=True

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/evaluate.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.evaluate import get_config

__all__ = ["get_config"]  # what --config loads
