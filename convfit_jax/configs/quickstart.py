"""The README's main job: a short Stage 2 run that fits in 10 minutes on a 2-core CPU.

    python -m convfit_jax.main --config=configs/quickstart.py

all-MiniLM-L6-v2 (the packaged weights), banking77 10-shot (seed 0), ocl, the paper's
pairs (n=3) and batch size; it prints k-NN accuracy on the full banking77 test set
(3,080 utterances) before and after. Only the length differs from the paper's run
(configs/stage2.py: 7,580 steps): `train.max_steps` steps with a larger peak
learning rate, so that a short run moves the encoder.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import stage2


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = stage2.get_config(arg)
  c.workdir = "workdirs/quickstart"
  c.train.max_steps = 150
  c.train.learning_rate = 1e-4
  c.train.log_every = 10
  return c
