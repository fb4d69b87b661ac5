"""`python -m convfit_jax.main --config=configs/quickstart.py[:args]`: see convfit_jax/configs/quickstart.py."""

from convfit_jax.configs.quickstart import get_config  # noqa: F401  (what --config loads)
