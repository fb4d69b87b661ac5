"""`python -m convfit_jax.main --config=configs/encode.py[:args]`: see convfit_jax/configs/encode.py."""

from convfit_jax.configs.encode import get_config  # noqa: F401  (what --config loads)
