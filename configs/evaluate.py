"""`python -m convfit_jax.main --config=configs/evaluate.py[:args]`: see convfit_jax/configs/evaluate.py."""

from convfit_jax.configs.evaluate import get_config  # noqa: F401  (what --config loads)
