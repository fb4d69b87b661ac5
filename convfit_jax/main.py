"""Command line: `python -m convfit_jax.main --config=configs/<task>.py [--config.x.y=...]`.

Thin on purpose: flags, the terminal, hand-off to the task named by `config.task`.
The terminal shows what the run is doing (our own log lines, the progress bar, the
results, warnings and errors); the full log, libraries included, goes to the run's
workdir (log.txt). Bad input ends the run with its one-line message and exit status 1;
`--traceback` shows the full traceback instead.
"""

from __future__ import annotations

import importlib
import logging as py_logging
import os
import sys

# transformers advises at import that PyTorch is absent; convfit_jax never needs it.
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from absl import app, flags, logging  # noqa: E402
from ml_collections import config_flags  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Config file (get_config(arg)).",
                                          lock_config=True)
_TRACEBACK = flags.DEFINE_bool("traceback", False, "On an error, show the full traceback.")

# task name -> "module:function" taking the config.
TASKS = {
    "byte_autoencoder": "convfit_jax.train.byte_autoencoder:train_and_evaluate",
    "encode": "convfit_jax.tasks.encode:run",
    "evaluate": "convfit_jax.tasks.evaluate:run",
    "hard_negatives": "convfit_jax.tasks.hard_negatives:run",
    "input_response": "convfit_jax.train.input_response:train_and_evaluate",
    "predict": "convfit_jax.tasks.predict:run",
    "protocol": "convfit_jax.tasks.protocol:run",
    "rerank": "convfit_jax.train.rerank:train_and_evaluate",
    "retrieve_rerank": "convfit_jax.tasks.retrieve_rerank:run",
    "serve": "convfit_jax.tasks.serve:run",
    "stage1": "convfit_jax.train.stage1:train_and_evaluate",
    "stage2": "convfit_jax.train.stage2:train_and_evaluate",
}
# What a user can cause and fix (bad files and values, missing paths, a diverging run):
# shown as one line. Anything else is a bug and shows its traceback.
_USER_ERRORS = (ValueError, FileNotFoundError, FloatingPointError)
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class _TerminalFilter(py_logging.Filter):
  """Our INFO lines and everyone's warnings; library INFO (orbax, JAX) and our lines
  logged with `extra=workdir.FILE_ONLY` only in log.txt."""

  def filter(self, record: py_logging.LogRecord) -> bool:
    if record.levelno >= py_logging.WARNING:
      return True
    return record.pathname.startswith(_PACKAGE_DIR) and getattr(record, "terminal", True)


class _TerminalFormatter(py_logging.Formatter):
  """The message alone; warnings and errors say which they are."""

  def format(self, record: py_logging.LogRecord) -> str:
    message = record.getMessage()
    return message if record.levelno < py_logging.WARNING else f"{record.levelname.lower()}: {message}"


def _configure_terminal() -> None:
  handler = logging.get_absl_handler().python_handler
  handler.addFilter(_TerminalFilter())
  handler.setFormatter(_TerminalFormatter())
  logging.set_verbosity(logging.INFO)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {argv[1:]}")
  _configure_terminal()
  config = _CONFIG.value
  if config.task not in TASKS:
    raise app.UsageError(f"config.task={config.task!r}: choose one of {sorted(TASKS)}")
  module, function = TASKS[config.task].split(":")
  try:
    getattr(importlib.import_module(module), function)(config)
  except _USER_ERRORS as e:
    if _TRACEBACK.value:
      raise
    print(f"error: {type(e).__name__}: {e}\n(--traceback shows where)", file=sys.stderr)
    sys.exit(1)


if __name__ == "__main__":
  flags.mark_flags_as_required(["config"])
  app.run(main)
