"""The README's main job: a short Stage 2 run that fits in 10 minutes on a 2-core CPU.

    python -m convfit_jax.main --config=configs/quickstart.py

all-MiniLM-L6-v2 (the packaged weights), banking77 10-shot (seed 0); it prints k-NN accuracy
on the full banking77 test set (3,080 utterances) before and after. The run is
`configs/stage2_dense.py`'s: label batches of 32 intents x 2 utterances, supervised contrast
over the batch, 10 epochs over the 770 training utterances (130 steps) at a peak learning
rate of 1e-4. At this budget it beats the paper's pairs with ocl and the MLP baseline on
banking77, hwu64 and clinc150 10-shot (docs/results.md); `configs/stage2.py` is the
paper's construction.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import stage2_dense


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = stage2_dense.get_config(arg)
  c.workdir = "workdirs/quickstart"
  c.train.log_every = 10
  return c
