"""The paper's protocol: datasets x {10-shot, 30-shot, full} x seeds {0, 1, 2} x losses.

    python -m convfit_jax.main --config=configs/protocol.py
    python -m convfit_jax.main --config=configs/protocol.py:datasets=banking77,shots=10,losses=ocl \\
        --config.stage2.train.max_steps=150 --config.stage2.train.learning_rate=1e-4
    python -m convfit_jax.main --config=configs/protocol.py:runlocal   # a one-minute smoke run

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/protocol.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.protocol import get_config

__all__ = ["get_config"]  # what --config loads
