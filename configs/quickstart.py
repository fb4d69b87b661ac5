"""The README's main job: a short Stage 2 run that fits in 10 minutes on a 2-core CPU.

    python -m convfit_jax.main --config=configs/quickstart.py

Entry point for the command line; the config itself, with every field documented, is built
by `convfit_jax/configs/quickstart.py` (installed with the package, so this file works from any
directory).
"""

from convfit_jax.configs.quickstart import get_config

__all__ = ["get_config"]  # what --config loads
