"""What the kill-and-resume tests share."""

import shutil
from pathlib import Path
from typing import Callable

import numpy as np


def weights_before_and_after_a_kill(run: Path, final_step: int, train: Callable[[], object]
                                    ) -> tuple[dict, dict]:
  """A finished run's exported weights.npz arrays, and the same after deleting its export
  and its final checkpoint (as if killed after the one before) and running `train` again."""
  first = dict(np.load(run / "model" / "weights.npz"))
  shutil.rmtree(run / "model")
  shutil.rmtree(run / "checkpoints" / str(final_step))
  train()
  again = dict(np.load(run / "model" / "weights.npz"))
  assert first.keys() == again.keys()
  return first, again
