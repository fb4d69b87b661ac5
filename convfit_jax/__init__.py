"""convfit_jax: ConvFiT in JAX/Flax.

Turns pretrained masked LMs (BERT, RoBERTa) into conversational sentence
encoders (Stage 1: multiple-negatives ranking on (context, response) pairs;
Stage 2: task-tailored contrastive fine-tuning on intent pairs) and detects
intents by nearest-neighbour similarity.
"""

from convfit_jax import cpu_flags

cpu_flags.configure()  # before anything below starts JAX's backend

from convfit_jax.encoder import Encoder  # pylint: disable=wrong-import-position

__all__ = ["Encoder"]
__version__ = "0.1.0"
