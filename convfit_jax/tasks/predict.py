"""Task `predict`: texts in (a file or stdin, one a line), a JSON line per text out."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Iterator, TextIO

import ml_collections

from convfit_jax import saved_classifier
from convfit_jax.classifier import IntentClassifier
from convfit_jax.data.readers import DataError, decoded_lines, decoded_stream

CHUNK = 4096  # texts per predict call: large enough to fill every encoder call, bounded memory


def _lines(source: str) -> Iterator[tuple[str, int, str]]:
  """(where, line number, text) of every line of a file, or of stdin for "-"."""
  if source == "-":
    where, lines = "<stdin>", decoded_stream(sys.stdin.buffer, "<stdin>")
  else:
    where, lines = source, decoded_lines(Path(source))
  for lineno, line in lines:
    yield where, lineno, line


def classifier_folder(path: str) -> Path:
  """A saved classifier folder, or the classifier/ of a Stage 2 workdir."""
  folder = Path(path)
  if not saved_classifier.is_saved_classifier(folder) and saved_classifier.is_saved_classifier(
      folder / "classifier"):
    return folder / "classifier"
  return folder


def _write(clf: IntentClassifier, lines, out: TextIO, config) -> int:
  """Predictions of `lines` as JSON lines on `out`, CHUNK texts a call; returns the count."""
  count, chunk = 0, []

  def flush():
    for row in clf.predict_details(chunk, batch_size=config.batch_size,
                                   explain=config.explain):
      out.write(json.dumps(row, ensure_ascii=False) + "\n")
    chunk.clear()

  for where, lineno, text in lines:
    if not text.strip():
      raise DataError(f"{where}:{lineno}: empty line (one text a line)")
    chunk.append(text)
    count += 1
    if len(chunk) == CHUNK:
      flush()
  if chunk:
    flush()
  return count


def run(config: ml_collections.ConfigDict) -> int:
  """Predicts every line of `config.input` with `config.classifier`; returns the count."""
  if not config.classifier:
    raise ValueError("predict needs --config.classifier=<a saved classifier folder or a Stage 2 "
                     "workdir>")
  folder = classifier_folder(config.classifier)
  if not folder.is_dir():
    raise FileNotFoundError(f"config.classifier: {folder} does not exist")
  clf = IntentClassifier.from_pretrained(folder, dtype=config.dtype or None)
  if config.output == "-":
    count = _write(clf, _lines(config.input), sys.stdout, config)
    sys.stdout.flush()
    return count
  path = Path(config.output)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      count = _write(clf, _lines(config.input), f, config)
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)
  return count
