"""Command line: `python -m convfit_jax.main --config=configs/<task>.py [--config.x.y=...]`.

Thin on purpose: flags, logging, hand-off to the task named by `config.task`.
"""

from __future__ import annotations

import importlib

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (get_config(arg)).",
                                          lock_config=True)

# task name -> module with `train_and_evaluate(config)`.
TASKS = {
    "encode": "convfit_jax.tasks.encode",
    "stage1": "convfit_jax.train.stage1",
    "stage2": "convfit_jax.train.stage2",
    "evaluate": "convfit_jax.tasks.evaluate",
    "protocol": "convfit_jax.tasks.protocol",
}


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  config = _CONFIG.value
  if config.task not in TASKS:
    raise app.UsageError(f"config.task={config.task!r}: choose one of {sorted(TASKS)}")
  logging.info("task %s", config.task)
  importlib.import_module(TASKS[config.task]).train_and_evaluate(config)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
