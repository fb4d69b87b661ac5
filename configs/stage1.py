"""`python -m convfit_jax.main --config=configs/stage1.py[:args]`: see convfit_jax/configs/stage1.py."""

from convfit_jax.configs.stage1 import get_config  # noqa: F401  (what --config loads)
