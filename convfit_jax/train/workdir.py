"""A run's folder and what is written to it: config.json, metrics.json, TensorBoard
scalars, the full log (log.txt); and the one line a run prints as its summary.

Everything here writes on process 0 only; other processes get no-ops, so callers
need no `if` of their own.
"""

from __future__ import annotations

import contextlib
import json
import logging as py_logging
import os
import struct
import sys
from pathlib import Path
from typing import Any, Mapping

import jax
from absl import logging

from convfit_jax.atomic_files import write_json


# `logging.info(..., extra=FILE_ONLY)`: a line for log.txt that the terminal does not show
# (the progress bar already does).
FILE_ONLY = {"terminal": False}


def is_main_process() -> bool:
  return jax.process_index() == 0



def finished_metrics(spec: str | os.PathLike) -> dict[str, Any]:
  """The metrics.json of a finished run's workdir, or of several joined by `+` merged (a
  later run's value wins): what the results scripts in benchmarks/ tabulate."""
  merged = {}
  for workdir in str(spec).split("+"):
    path = Path(workdir) / "metrics.json"
    if not path.is_file():
      raise FileNotFoundError(f"{path}: no metrics.json (the run has not finished)")
    merged.update(json.loads(path.read_text(encoding="utf-8")))
  return merged

class Workdir:
  """A run's folder: config.json, metrics.json, tensorboard/, checkpoints/, log.txt.

  metrics.json holds results only (what a run measured); nothing reads it to decide
  what to run. `update_metrics` merges into it, so a resumed run keeps the figures
  it measured before it was interrupted.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path).absolute()
    self.main = is_main_process()
    self._tb = None
    self._log_handler = None
    self._root_level = py_logging.getLogger().level
    if self.main:
      self.path.mkdir(parents=True, exist_ok=True)
      self._log_handler = _log_to_file(self.path / "log.txt")

  @property
  def checkpoint_dir(self) -> Path:
    return self.path / "checkpoints"

  @property
  def metrics_path(self) -> Path:
    return self.path / "metrics.json"

  def write_config(self, config) -> None:
    """The resolved config (an ml_collections.ConfigDict or a mapping) as config.json."""
    if self.main:
      write_json(self.path / "config.json",
                 config.to_dict() if hasattr(config, "to_dict") else dict(config), sort_keys=True)

  def read_metrics(self) -> dict[str, Any]:
    if self.metrics_path.exists():
      with open(self.metrics_path, encoding="utf-8") as f:
        return json.load(f)
    return {}

  def update_metrics(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Merges `metrics` into metrics.json; returns the merged dict."""
    merged = {**self.read_metrics(), **metrics}
    if self.main:
      write_json(self.metrics_path, merged, sort_keys=True)
    return merged

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """TensorBoard scalars under tensorboard/ (tensorboardX event files, no TensorFlow)."""
    if not self.main:
      return
    if self._tb is None:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._tb = SummaryWriter(str(self.path / "tensorboard"))
    for name, value in scalars.items():
      self._tb.add_scalar(name, float(value), int(step))

  def close(self) -> None:
    if self._tb is not None:
      self._tb.flush()
      self._tb.close()
      self._tb = None
    if self._log_handler is not None:
      root = py_logging.getLogger()
      root.removeHandler(self._log_handler)
      root.setLevel(self._root_level)
      self._log_handler.close()
      self._log_handler = None


def _log_to_file(path: Path) -> py_logging.Handler:
  """Every log record at INFO and above (ours, orbax's, JAX's) appended to `path`."""
  handler = py_logging.FileHandler(path, encoding="utf-8")
  handler.setLevel(py_logging.INFO)
  handler.setFormatter(logging.PythonFormatter())
  root = py_logging.getLogger()
  root.addHandler(handler)
  if root.level > py_logging.INFO or root.level == py_logging.NOTSET:
    root.setLevel(py_logging.INFO)
  return handler


@contextlib.contextmanager
def quiet_terminal():
  """While inside: the terminal's log handlers show warnings and errors only (log.txt still
  gets everything). A run started from Python (`IntentClassifier.fit`) is a library call,
  not a command line: its INFO lines (orbax's included) belong in the workdir's log."""
  root = py_logging.getLogger()
  if not root.handlers:
    # absl's first log call without app.run installs this handler; install it now so it
    # is one of those quieted.
    py_logging.basicConfig()
  handlers = [h for h in root.handlers
              if not isinstance(h, py_logging.FileHandler)]
  levels = [h.level for h in handlers]
  for h in handlers:
    h.setLevel(max(h.level, py_logging.WARNING))
  try:
    yield
  finally:
    for h, level in zip(handlers, levels):
      h.setLevel(level)


def progress_bar(total: int, initial: int = 0, desc: str = "train", show: bool = True):
  """tqdm over steps, shown on process 0 only (and when `show`); `set_postfix(loss=, pairs_s=)`
  per window."""
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  return tqdm(total=total, initial=initial, desc=desc, disable=not (show and is_main_process()),
              dynamic_ncols=True, smoothing=0.1)


def summary(line: str) -> None:
  """The run's final summary line, on stdout (process 0) and in the log: the one thing
  library code prints."""
  logging.info("%s", line, extra=FILE_ONLY)
  if is_main_process():
    print(line, file=sys.stdout, flush=True)


def read_scalars(workdir: str | os.PathLike) -> dict[str, list[tuple[int, float]]]:
  """The TensorBoard scalars of a run's workdir, read back without TensorFlow: each event
  file is a sequence of records (length u64, its CRC u32, an `Event` protobuf, its CRC u32)."""
  from tensorboardX.proto import event_pb2  # pylint: disable=import-outside-toplevel
  out: dict[str, list[tuple[int, float]]] = {}
  for path in sorted(Path(workdir, "tensorboard").glob("events.out.tfevents.*")):
    data, i = path.read_bytes(), 0
    while i + 12 <= len(data):
      (n,) = struct.unpack("<Q", data[i:i + 8])
      event = event_pb2.Event.FromString(data[i + 12:i + 12 + n])
      i += 12 + n + 4
      for value in event.summary.value:
        out.setdefault(value.tag, []).append((int(event.step), float(value.simple_value)))
  return out
