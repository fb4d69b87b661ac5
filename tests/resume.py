"""What the kill-and-resume tests share."""

import shutil
from pathlib import Path
from typing import Callable

from convfit_jax.models import word_models


def weights_before_and_after_a_kill(run: Path, final_step: int, train: Callable[[], object]
                                    ) -> tuple[dict, dict]:
  """A finished run's exported arrays (`word_models.read_weights`), and the same after deleting its export
  and its final checkpoint (as if killed after the one before) and running `train` again."""
  first = word_models.read_weights(run / "model")
  shutil.rmtree(run / "model")
  shutil.rmtree(run / "checkpoints" / str(final_step))
  train()
  again = word_models.read_weights(run / "model")
  assert first.keys() == again.keys()
  return first, again
