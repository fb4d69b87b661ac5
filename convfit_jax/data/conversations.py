"""Conversational data: Stage 1 (context, response) pairs and evaluation-set readers.

Stage 1 readers stream: a file is read line by line, never whole, and shuffled
through a seeded buffer, so files larger than memory work. Formats:

- TSV with a header `context\tresponse[\thistory]`, no quoting (fields may hold
  `"`); `history` is the previous turns joined by ` __eou__ `, oldest first. Without a
  `context` column the context is the history's last turn, and a `label` column keeps
  only the rows labelled 1 (the rerankers' 1:1 format, e.g. ubuntu_irc's train.tsv).
- JSONL with the same keys (history a string as above, or a list of strings).
- PolyAI conversational-datasets Reddit JSON lines: `context`, `response`, and
  earlier turns `context/0` (the one before `context`), `context/1`, ...

Also here: response-selection cases (JSONL: context, optional history, a list of
candidates, the index of the true one) and rerankers' labelled pairs (TSV history,
response, label). STS and NLI pairs are in `data.sentence_pairs`.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple, TypeVar

import numpy as np

from convfit_jax.data.readers import DataError, file_format, json_objects, read_rows

EOU = " __eou__ "
T = TypeVar("T")


class Conversation(NamedTuple):
  """One (context, response) pair.

  `history` is the turns up to and including `context`, oldest first (a
  one-element tuple when the file gives no earlier turns).
  """
  context: str
  response: str
  history: tuple[str, ...]


def _check_pair(path, lineno, context, response):
  if not context.strip():
    raise DataError(f"{path}:{lineno}: empty context")
  if not response.strip():
    raise DataError(f"{path}:{lineno}: empty response")


def _history_from_string(history: str, context: str) -> tuple[str, ...]:
  turns = tuple(t for t in history.split(EOU.strip()) if t.strip()) if history else ()
  turns = tuple(t.strip() for t in turns)
  if not turns or turns[-1] != context:
    turns = turns + (context,)
  return turns


def _iter_tsv(path: Path) -> Iterator[Conversation]:
  rows = read_rows(path, ("response",), optional=("context", "history", "label"), fmt="tsv")
  for lineno, row in rows:
    if row["label"] not in ("", "1"):
      if row["label"] != "0":
        raise DataError(f"{path}:{lineno}: label {row['label']!r} is not 0 or 1")
      continue  # a sampled wrong response: Stage 1's negatives are the batch's other responses
    history = row["history"]
    if not row["context"] and not history.strip():
      raise DataError(f"{path}:{lineno}: empty context (no context column, or an empty history)")
    context = row["context"] or history.split(EOU.strip())[-1].strip()
    _check_pair(path, lineno, context, row["response"])
    yield Conversation(context, row["response"], _history_from_string(history, context))


def _iter_jsonl(path: Path) -> Iterator[Conversation]:
  for lineno, obj in json_objects(path, ("context", "response")):
    context, response = obj["context"], obj["response"]
    if not isinstance(context, str) or not isinstance(response, str):
      raise DataError(f"{path}:{lineno}: context and response must be strings")
    _check_pair(path, lineno, context, response)
    if "history" in obj:
      history = obj["history"]
      if isinstance(history, list):
        turns = tuple(history) if history and history[-1] == context else tuple(history) + (context,)
      elif isinstance(history, str):
        turns = _history_from_string(history, context)
      else:
        raise DataError(f"{path}:{lineno}: history must be a string or a list of strings")
    else:
      earlier = []
      k = 0
      while f"context/{k}" in obj:
        earlier.append(obj[f"context/{k}"])
        k += 1
      turns = tuple(reversed(earlier)) + (context,)
    if not all(isinstance(t, str) for t in turns):
      raise DataError(f"{path}:{lineno}: history turns must be strings")
    yield Conversation(context, response, turns)


def shuffle_buffer(items: Iterable[T], buffer_size: int, seed: int) -> Iterator[T]:
  """Streams `items` in a seeded random order using a buffer of `buffer_size` items.

  Each output is drawn uniformly from the buffer and replaced by the next input,
  so memory is bounded by the buffer; a buffer at least as large as the input
  gives a uniform permutation. buffer_size <= 1 keeps the order.
  """
  if buffer_size <= 1:
    yield from items
    return
  rng = np.random.Generator(np.random.PCG64(seed))
  buffer: list[T] = []
  for item in items:
    if len(buffer) < buffer_size:
      buffer.append(item)
      continue
    j = int(rng.integers(len(buffer)))
    out, buffer[j] = buffer[j], item
    yield out
  for j in rng.permutation(len(buffer)):
    yield buffer[j]


def take_fraction(items: Iterable[T], fraction: float, seed: int, chunk: int = 4096) -> Iterator[T]:
  """Keeps each item with probability `fraction` (independent seeded draws).

  Row r is kept when its uniform draw u_r < fraction, with the draws a fixed
  PCG64 stream of `seed`: for one seed a smaller fraction is a subset of a larger one.
  """
  if not 0.0 < fraction <= 1.0:
    raise ValueError(f"fraction must be in (0, 1], got {fraction}")
  if fraction == 1.0:
    yield from items
    return
  rng = np.random.Generator(np.random.PCG64(seed))
  draws = rng.random(chunk)
  k = 0
  for item in items:
    if k == chunk:
      draws, k = rng.random(chunk), 0
    if draws[k] < fraction:
      yield item
    k += 1


def read_conversations(path: str | os.PathLike, *, fmt: str | None = None, fraction: float = 1.0,
                       seed: int = 0, buffer_size: int = 0) -> Iterator[Conversation]:
  """Streams (context, response, history) pairs from a TSV or JSONL (incl. Reddit) file.

  Args:
    path: the file; 'tsv' or 'jsonl' by suffix unless `fmt` says.
    fmt: 'tsv' | 'jsonl' (Reddit JSON lines are 'jsonl').
    fraction: keep this fraction of rows, chosen by `seed` (see `take_fraction`).
    seed: seeds the fraction and the shuffle (independent streams).
    buffer_size: shuffle buffer size (0 = file order).
  Raises:
    DataError naming file and line: invalid UTF-8, missing column, wrong number
    of fields, empty context or response, invalid JSON.
  """
  path = Path(path)
  fmt = file_format(path, fmt)
  if fmt == "csv":
    raise DataError(f"{path}: conversations are read from TSV or JSONL, not CSV")
  rows = _iter_tsv(path) if fmt == "tsv" else _iter_jsonl(path)
  fraction_seed, shuffle_seed = np.random.SeedSequence(seed).spawn(2)
  rows = take_fraction(rows, fraction, fraction_seed.generate_state(1)[0])
  return shuffle_buffer(rows, buffer_size, shuffle_seed.generate_state(1)[0])


@dataclasses.dataclass(frozen=True)
class ResponseSelectionSet:
  """Response-selection cases.

  Attributes:
    contexts: n contexts.
    histories: n histories, turns oldest first ending with the context.
    candidates: n tuples of c candidate responses (same c for every case).
    labels: [n] int32 index of the true response among the candidates.
  """
  contexts: tuple[str, ...]
  histories: tuple[tuple[str, ...], ...]
  candidates: tuple[tuple[str, ...], ...]
  labels: np.ndarray

  def __len__(self) -> int:
    return len(self.contexts)

  def subset(self, indices: np.ndarray) -> ResponseSelectionSet:
    """The cases at `indices` ([m] int), in that order."""
    pick = lambda xs: tuple(xs[i] for i in indices)
    return ResponseSelectionSet(pick(self.contexts), pick(self.histories), pick(self.candidates),
                                self.labels[np.asarray(indices, np.int64)])


def read_response_selection(path: str | os.PathLike) -> ResponseSelectionSet:
  """Reads JSONL cases {"context", "history" (optional), "candidates": [str], "label": int}."""
  path = Path(path)
  contexts, histories, candidates, labels = [], [], [], []
  for lineno, obj in json_objects(path, ("context", "candidates", "label")):
    context, cands, label = obj["context"], obj["candidates"], obj["label"]
    if not isinstance(context, str) or not context.strip():
      raise DataError(f"{path}:{lineno}: context must be a non-empty string")
    if (not isinstance(cands, list) or not cands
        or not all(isinstance(c, str) and c.strip() for c in cands)):
      raise DataError(f"{path}:{lineno}: candidates must be a non-empty list of non-empty strings")
    if candidates and len(cands) != len(candidates[0]):
      raise DataError(f"{path}:{lineno}: {len(cands)} candidates, earlier cases have "
                      f"{len(candidates[0])}")
    if not isinstance(label, int) or isinstance(label, bool) or not 0 <= label < len(cands):
      raise DataError(f"{path}:{lineno}: label {label!r} is not an index into the "
                      f"{len(cands)} candidates")
    history = obj.get("history", "")
    if not isinstance(history, str):
      raise DataError(f"{path}:{lineno}: history must be a string")
    contexts.append(context)
    histories.append(_history_from_string(history, context))
    candidates.append(tuple(cands))
    labels.append(label)
  if not contexts:
    raise DataError(f"{path}: no cases")
  return ResponseSelectionSet(tuple(contexts), tuple(histories), tuple(candidates),
                              np.asarray(labels, np.int32))


@dataclasses.dataclass(frozen=True)
class LabelledPairs:
  """(history, response, label) rows: the training data of a reranker.

  Attributes:
    histories: n histories, turns oldest first joined by ` __eou__ ` (one turn: no mark).
    responses: n responses.
    labels: [n] int32, 1 for the true response, 0 for a sampled one.
  """
  histories: tuple[str, ...]
  responses: tuple[str, ...]
  labels: np.ndarray

  def __len__(self) -> int:
    return len(self.histories)

  def subset(self, indices: np.ndarray) -> LabelledPairs:
    """The rows at `indices` ([m] int), in that order."""
    pick = lambda xs: tuple(xs[i] for i in indices)
    return LabelledPairs(pick(self.histories), pick(self.responses),
                         self.labels[np.asarray(indices, np.int64)])


def read_labelled_pairs(path: str | os.PathLike) -> LabelledPairs:
  """Reads a TSV with header `history\tresponse\tlabel` (Lowe et al.'s 1:1 training
  format: a context's true response labelled 1, a random one 0), no quoting.

  Raises:
    DataError naming file and line: an empty history or response, a label not 0 or 1,
    and what `read_rows` checks.
  """
  path = Path(path)
  histories, responses, labels = [], [], []
  for lineno, row in read_rows(path, ("history", "response", "label"), fmt="tsv"):
    if not row["history"].strip():
      raise DataError(f"{path}:{lineno}: empty history")
    if not row["response"].strip():
      raise DataError(f"{path}:{lineno}: empty response")
    if row["label"] not in ("0", "1"):
      raise DataError(f"{path}:{lineno}: label {row['label']!r} is not 0 or 1")
    histories.append(row["history"])
    responses.append(row["response"])
    labels.append(int(row["label"]))
  if not histories:
    raise DataError(f"{path}: no rows")
  return LabelledPairs(tuple(histories), tuple(responses), np.asarray(labels, np.int32))
