"""Sentence-pair files: STS (a similarity score per pair) and NLI (a 3-way label per pair).

TSV with a header and no quoting (`../shared/data` writes them so): STS-B's
`score\tsentence1\tsentence2`, SICK's `label\tscore\tsentence1\tsentence2` (its
`score` is SICK-R relatedness, its `label` SICK-E), SNLI's `label\tsentence1\tsentence2`
(sentence1 the premise). Extra columns are ignored.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from convfit_jax.data.readers import DataError, read_rows

NLI_LABELS = ("entailment", "neutral", "contradiction")
# STS-B scores are means of 0-5 judgements, SICK-R's of 1-5: both lie in [0, 5].
STS_RANGE = (0.0, 5.0)


@dataclasses.dataclass(frozen=True)
class StsSet:
  """STS pairs: `scores` [n] float32 in `STS_RANGE` and the two sentence lists."""
  scores: np.ndarray
  sentence1: tuple[str, ...]
  sentence2: tuple[str, ...]

  def __len__(self) -> int:
    return len(self.sentence1)


@dataclasses.dataclass(frozen=True)
class NliSet:
  """NLI pairs: `labels` [n] int32 indices into `NLI_LABELS`, premises and hypotheses."""
  labels: np.ndarray
  premises: tuple[str, ...]
  hypotheses: tuple[str, ...]

  def __len__(self) -> int:
    return len(self.premises)

  def subset(self, indices: np.ndarray) -> NliSet:
    """The pairs at `indices` ([m] int), in that order."""
    pick = lambda xs: tuple(xs[i] for i in indices)
    return NliSet(self.labels[np.asarray(indices, np.int64)], pick(self.premises),
                  pick(self.hypotheses))


def concatenate(sets: list[NliSet]) -> NliSet:
  """The pairs of `sets` one after the other."""
  return NliSet(np.concatenate([s.labels for s in sets]).astype(np.int32),
                tuple(p for s in sets for p in s.premises),
                tuple(h for s in sets for h in s.hypotheses))


def _sentences(path: Path, lineno: int, row: dict[str, str]) -> tuple[str, str]:
  for column in ("sentence1", "sentence2"):
    if not row[column].strip():
      raise DataError(f"{path}:{lineno}: empty {column}")
  return row["sentence1"], row["sentence2"]


def _read(path: str | os.PathLike, column: str, parse) -> tuple[list, list[str], list[str]]:
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"{path.absolute()} does not exist")
  values, s1, s2 = [], [], []
  for lineno, row in read_rows(path, (column, "sentence1", "sentence2"), fmt="tsv"):
    values.append(parse(path, lineno, row[column]))
    a, b = _sentences(path, lineno, row)
    s1.append(a)
    s2.append(b)
  if not values:
    raise DataError(f"{path}: no rows")
  return values, s1, s2


def _score(path: Path, lineno: int, text: str) -> float:
  try:
    score = float(text)
  except ValueError:
    raise DataError(f"{path}:{lineno}: score {text!r} is not a number") from None
  lo, hi = STS_RANGE
  if not lo <= score <= hi:  # NaN fails too
    raise DataError(f"{path}:{lineno}: score {text!r} is outside [{lo:g}, {hi:g}]")
  return score


def _label(path: Path, lineno: int, text: str) -> int:
  if text not in NLI_LABELS:
    raise DataError(f"{path}:{lineno}: label {text!r} is not one of {', '.join(NLI_LABELS)}")
  return NLI_LABELS.index(text)


def read_sts(path: str | os.PathLike) -> StsSet:
  """The `score`, `sentence1`, `sentence2` columns of a TSV (STS-B, or SICK for SICK-R).

  Raises:
    DataError naming file and line: a score that is not a number or lies outside
    `STS_RANGE`, an empty sentence, and what `read_rows` checks (a missing column,
    a row of the wrong width).
  """
  scores, s1, s2 = _read(path, "score", _score)
  return StsSet(np.asarray(scores, np.float32), tuple(s1), tuple(s2))


def read_nli(path: str | os.PathLike) -> NliSet:
  """The `label`, `sentence1` (premise), `sentence2` columns of a TSV (SNLI, or SICK for SICK-E).

  Raises:
    DataError naming file and line: a label not in `NLI_LABELS` (SNLI's `-`, no gold
    label, included), an empty sentence, and what `read_rows` checks.
  """
  labels, s1, s2 = _read(path, "label", _label)
  return NliSet(np.asarray(labels, np.int32), tuple(s1), tuple(s2))
