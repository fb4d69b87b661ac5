"""ConvFiT Stage 2: task-tailored contrastive fine-tuning, then k-NN intent detection.

    python -m convfit_jax.main --config=configs/stage2.py
    python -m convfit_jax.main --config=configs/stage2.py:dataset=hwu64,shots=30,loss=cos
    python -m convfit_jax.main --config=configs/stage2.py:runlocal --config.train.epochs=1

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/stage2.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.stage2 import get_config

__all__ = ["get_config"]  # what --config loads
