"""`python -m convfit_jax.main --config=configs/stage2.py[:args]`: see convfit_jax/configs/stage2.py."""

from convfit_jax.configs.stage2 import get_config  # noqa: F401  (what --config loads)
