"""Sentence corpora: one sentence per row (`text/enwiki/{train,test}.tsv`: doc_id, sentence)."""

from __future__ import annotations

import os
from pathlib import Path

from convfit_jax.data.readers import DataError, read_rows


def read_sentences(path: str | os.PathLike, column: str = "sentence") -> list[str]:
  """The `column` of a CSV/TSV/JSONL file, in file order.

  Raises:
    FileNotFoundError; DataError naming file and line for an empty sentence, a missing
    column or a row of the wrong width (`read_rows`), or a file without rows.
  """
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{path.absolute()} does not exist")
  out = []
  for lineno, row in read_rows(path, (column,)):
    if not row[column].strip():
      raise DataError(f"{path}:{lineno}: empty {column}")
    out.append(row[column])
  if not out:
    raise DataError(f"{path}: no rows")
  return out
