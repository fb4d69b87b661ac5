"""convfit_jax: ConvFiT in JAX/Flax.

Turns pretrained masked LMs (BERT, RoBERTa) into conversational sentence
encoders (Stage 1: multiple-negatives ranking on (context, response) pairs;
Stage 2: task-tailored contrastive fine-tuning on intent pairs) and detects
intents by nearest-neighbour similarity.
"""

from convfit_jax import cpu_flags

cpu_flags.configure()  # before anything below starts JAX's backend

# pylint: disable=wrong-import-position
from convfit_jax.classifier import IntentClassifier
from convfit_jax.encoder import Encoder
from convfit_jax.fine_tune import fine_tune_stage1
from convfit_jax.version import __version__

__all__ = ["Encoder", "IntentClassifier", "fine_tune_stage1", "__version__"]
