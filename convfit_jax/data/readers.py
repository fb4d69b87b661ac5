"""Readers of tabular input files (CSV, TSV, JSON lines): every bad row is a `DataError`
naming file and line. Intent sets, conversations, response-selection cases and STS pairs
are all read through them.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import warnings
from pathlib import Path
from typing import BinaryIO, Iterator, Sequence

_FORMATS = {".csv": "csv", ".tsv": "tsv", ".txt": "tsv", ".jsonl": "jsonl", ".json": "jsonl"}



class DataError(ValueError):
  """A bad input file; the message starts with `file:line:` where a line applies."""


class DuplicateRowsWarning(UserWarning):
  """Repeated (text, label) rows in a file: kept, counted in the message."""


def file_format(path: str | os.PathLike, fmt: str | None = None) -> str:
  """`fmt` if given, else 'csv' | 'tsv' | 'jsonl' from the file's suffix."""
  if fmt is not None:
    if fmt not in ("csv", "tsv", "jsonl"):
      raise ValueError(f"unknown file format {fmt!r}; known: csv, tsv, jsonl")
    return fmt
  suffix = Path(path).suffix.lower()
  if suffix not in _FORMATS:
    raise DataError(f"{path}: cannot tell the format from suffix {suffix!r}; "
                    f"known suffixes: {', '.join(sorted(_FORMATS))}")
  return _FORMATS[suffix]


def decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
  """(line number from 1, line without its end) of a UTF-8 file, streamed."""
  with open(path, "rb") as f:
    yield from decoded_stream(f, str(path))


def decoded_stream(f: BinaryIO, where: str) -> Iterator[tuple[int, str]]:
  """`decoded_lines` of an open binary stream (stdin too); errors name `where` and the line."""
  for lineno, raw in enumerate(f, start=1):
    try:
      line = raw.decode("utf-8")
    except UnicodeDecodeError as e:
      raise DataError(f"{where}:{lineno}: invalid UTF-8 at byte {e.start} of the line") from None
    if lineno == 1:
      line = line.removeprefix("\ufeff")
    yield lineno, line.rstrip("\r\n")


def read_rows(path: str | os.PathLike, columns: Sequence[str], optional: Sequence[str] = (),
              fmt: str | None = None) -> Iterator[tuple[int, dict[str, str]]]:
  """Streams the rows of a CSV (quoted), TSV (no quoting, header) or JSONL file.

  Args:
    path: the file.
    columns: columns every row must have.
    optional: columns returned when present (a missing one is '' in every row).
    fmt: 'csv' | 'tsv' | 'jsonl'; None picks it from the suffix.
  Yields:
    (line number, {column: value}) for each non-blank row; values are str.
  Raises:
    DataError naming file and line: invalid UTF-8, missing column, wrong number
    of fields, invalid JSON, a non-string value.
  """
  path = Path(path)
  fmt = file_format(path, fmt)
  wanted = tuple(columns) + tuple(c for c in optional if c not in columns)
  if fmt == "jsonl":
    yield from _read_jsonl(path, columns, wanted)
    return
  lines = decoded_lines(path)
  if fmt == "csv":
    numbered = iter(lines)
    current = [0]

    def texts():
      for lineno, line in numbered:
        current[0] = lineno
        yield line
    records = ((current[0], rec) for rec in csv.reader(texts()))
  else:
    records = ((lineno, line.split("\t")) for lineno, line in lines)
  header = None
  for lineno, fields in records:
    if header is None:
      header = [h.strip() for h in fields]
      missing = [c for c in columns if c not in header]
      if missing:
        raise DataError(f"{path}:{lineno}: missing column(s) {', '.join(map(repr, missing))}; "
                        f"the header has {', '.join(map(repr, header))}")
      positions = {c: header.index(c) for c in wanted if c in header}
      continue
    if not fields or fields == [""]:
      continue
    if len(fields) != len(header):
      raise DataError(f"{path}:{lineno}: {len(fields)} fields, the header has {len(header)}")
    yield lineno, {c: (fields[positions[c]] if c in positions else "") for c in wanted}
  if header is None:
    raise DataError(f"{path}: empty file (no header)")


def json_objects(path: Path, required: Sequence[str]) -> Iterator[tuple[int, dict]]:
  """(line number, object) of a JSON-lines file; blank lines are skipped, and a line that
  is not a JSON object holding every `required` key is a `DataError` naming it."""
  for lineno, line in decoded_lines(path):
    if not line.strip():
      continue
    try:
      obj = json.loads(line)
    except json.JSONDecodeError as e:
      raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(obj, dict):
      raise DataError(f"{path}:{lineno}: expected a JSON object, got {type(obj).__name__}")
    missing = [c for c in required if c not in obj]
    if missing:
      raise DataError(f"{path}:{lineno}: missing column(s) {', '.join(map(repr, missing))}; "
                      f"the object has {', '.join(map(repr, obj))}")
    yield lineno, obj


def _read_jsonl(path: Path, columns: Sequence[str], wanted: Sequence[str]):
  for lineno, obj in json_objects(path, columns):
    row = {}
    for c in wanted:
      value = obj.get(c, "")
      if not isinstance(value, str):
        raise DataError(f"{path}:{lineno}: column {c!r} is {type(value).__name__}, expected a string")
      row[c] = value
    yield lineno, row


@dataclasses.dataclass(frozen=True)
class LabelledFile:
  """The rows of one labelled file, in file order; `descriptions`: label -> its text, from
  the description column when one was read."""
  path: Path
  texts: list[str]
  labels: list[str]
  lines: list[int]
  descriptions: dict[str, str] = dataclasses.field(default_factory=dict)


def read_labelled_file(path: str | os.PathLike, text_column: str = "text",
                       label_column: str = "label", fmt: str | None = None,
                       warn_duplicates: bool = True, description_column: str = "") -> LabelledFile:
  """Reads (text, label) rows; an empty text or label is a DataError naming the line.

  `description_column`: a column saying in words what each row's intent is ("card has not
  arrived yet"); one intent's rows must agree (blank cells say nothing), else a DataError
  names both lines.

  Repeated (text, label) rows are kept, with one DuplicateRowsWarning giving their count
  (unless `warn_duplicates` is False: the package's own copies of the public sets have
  such rows upstream, and a warning about them is nothing a user can act on).
  """
  path = Path(path)
  texts, labels, lines = [], [], []
  first_seen: dict[tuple[str, str], int] = {}
  duplicates = []
  descriptions: dict[str, tuple[str, int]] = {}
  columns = (text_column, label_column) + ((description_column,) if description_column else ())
  for lineno, row in read_rows(path, columns, fmt=fmt):
    text, label = row[text_column], row[label_column].strip()
    described = " ".join(row.get(description_column, "").split()) if description_column else ""
    if described:
      said, where = descriptions.setdefault(label, (described, lineno))
      if said != described:
        raise DataError(f"{path}:{lineno}: intent {label!r} is described as {described!r} in "
                        f"column {description_column!r}, but as {said!r} at line {where}")
    if not text.strip():
      raise DataError(f"{path}:{lineno}: empty text in column {text_column!r}")
    if not label:
      raise DataError(f"{path}:{lineno}: empty label in column {label_column!r}")
    key = (text, label)
    if key in first_seen:
      duplicates.append((lineno, first_seen[key]))
    else:
      first_seen[key] = lineno
    texts.append(text)
    labels.append(label)
    lines.append(lineno)
  if not texts:
    raise DataError(f"{path}: no rows")
  if duplicates and warn_duplicates:
    line, orig = duplicates[0]
    warnings.warn(DuplicateRowsWarning(
      f"{path}: {len(duplicates)} duplicated row(s) kept (first: line {line} repeats line {orig})"),
      stacklevel=2)
  return LabelledFile(path, texts, labels, lines, {l: d for l, (d, _) in descriptions.items()})
