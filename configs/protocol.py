"""`python -m convfit_jax.main --config=configs/protocol.py[:args]`: see convfit_jax/configs/protocol.py."""

from convfit_jax.configs.protocol import get_config  # noqa: F401  (what --config loads)
