"""Word-level inputs for the models that read words, not subword pieces (ESIM).

A text is lower-cased and split into words and punctuation marks, as GloVe's vocabulary
was built; turn and speaker marks (`__eou__`, `__eot__`) stay whole tokens. The
vocabulary is built from training texts (most frequent first, ties alphabetically)
behind two reserved ids, padding 0 and unknown 1. Word vectors come from a text file
of `word v_1 ... v_d` lines (GloVe's format); words the file lacks start random.

Words outside the vocabulary share the unknown id, or, with `oov_buckets`, are hashed
(CRC-32) into that many extra ids, `<oov:0>`, `<oov:1>`, ... after the words: two
occurrences of one unseen word (a user's nick in a test context and in the reply that
addresses it) then get one vector, and different unseen words most likely different
ones, so a model that matches words can still match them.

Cutting to a maximum length keeps the end of a context (its last turns are what a
response answers) and the start of a response.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import re
import zlib
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from convfit_jax.data.readers import DataError, decoded_lines

PAD, UNK = "<pad>", "<unk>"
TURN_MARKS = ("__eou__", "__eot__")
RESERVED = (PAD, UNK, *TURN_MARKS)  # the first ids of every vocabulary
# Names of the hashed unknown-word ids; `tokenize` splits "<" and ">" off, so no text has them.
_BUCKET = re.compile(r"<oov:\d+>")
_TOKEN = re.compile(r"__eou__|__eot__|\w+|[^\w\s]")
# Padded lengths start here (`padded_length`): a run compiles a few shapes.
MIN_PADDED_LENGTH = 16


def tokenize(text: str) -> list[str]:
  """Lower-cased words, punctuation marks and turn marks of `text`."""
  return _TOKEN.findall(text.lower())


def bucket_names(n: int) -> tuple[str, ...]:
  """The vocabulary entries of `n` hashed unknown-word ids: `<oov:0>` ... `<oov:n-1>`."""
  return tuple(f"<oov:{k}>" for k in range(n))


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """Ids by entry: 0 is padding, 1 unknown words, then the turn marks, the words and any
  hashed unknown-word ids (`bucket_names`, last). `len` counts every entry: the rows of
  an embedding table."""
  words: tuple[str, ...]

  def __post_init__(self):
    object.__setattr__(self, "_ids", {w: i for i, w in enumerate(self.words)})
    if self.words[:len(RESERVED)] != RESERVED:
      raise ValueError(f"a vocabulary starts with {RESERVED}; got {self.words[:len(RESERVED)]}")
    buckets = sum(1 for w in self.words if _BUCKET.fullmatch(w))
    if self.words[len(self.words) - buckets:] != bucket_names(buckets):
      raise ValueError(f"a vocabulary's {buckets} <oov:k> entries come last, numbered from 0")
    object.__setattr__(self, "oov_buckets", buckets)

  def __len__(self) -> int:
    return len(self.words)

  def ids(self, tokens: Sequence[str]) -> list[int]:
    """Each token's id: its own, else its hashed bucket's, else the unknown id (1)."""
    if not self.oov_buckets:
      return [self._ids.get(t, 1) for t in tokens]
    first = len(self.words) - self.oov_buckets
    return [self._ids.get(t, first + zlib.crc32(t.encode()) % self.oov_buckets) for t in tokens]

  def save(self, path: str | os.PathLike) -> None:
    Path(path).write_text("".join(f"{w}\n" for w in self.words), encoding="utf-8")

  @classmethod
  def load(cls, path: str | os.PathLike) -> Vocabulary:
    return cls(tuple(Path(path).read_text(encoding="utf-8").splitlines()))


def build_vocabulary(texts: Iterable[str], *, min_count: int = 1, max_size: int = 0,
                     oov_buckets: int = 0) -> Vocabulary:
  """The words of `texts` seen at least `min_count` times, most frequent first (ties
  alphabetically), at most `max_size` ids before the buckets (0 = no limit), then
  `oov_buckets` hashed unknown-word ids; `RESERVED` always first."""
  counts = collections.Counter(t for text in texts for t in tokenize(text))
  return vocabulary_from_counts(counts, min_count=min_count, max_size=max_size,
                                oov_buckets=oov_buckets)


def vocabulary_from_counts(counts: collections.Counter, *, min_count: int = 1, max_size: int = 0,
                           oov_buckets: int = 0) -> Vocabulary:
  """`build_vocabulary` of already counted tokens (any strings: words, bigrams, ...)."""
  words = [w for w, c in sorted(counts.items(), key=lambda wc: (-wc[1], wc[0]))
           if c >= min_count and w not in TURN_MARKS]
  words = [*RESERVED, *words]
  words = words[:max(max_size, len(RESERVED))] if max_size else words
  return Vocabulary((*words, *bucket_names(oov_buckets)))


def read_vectors(path: str | os.PathLike, vocabulary: Vocabulary) -> tuple[np.ndarray, np.ndarray]:
  """The vectors of `vocabulary`'s words in a `word v_1 ... v_d` text file.

  Returns:
    ([len(vocabulary), d] float32 vectors, zero where missing; [len(vocabulary)] bool found).
  Raises:
    DataError naming file and line for a line whose width differs from the first's or
    whose values are not numbers.
  """
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"word vectors: {path.absolute()} does not exist")
  vectors, found, dim = None, np.zeros(len(vocabulary), bool), 0
  ids = {w: i for i, w in enumerate(vocabulary.words)}
  for lineno, line in decoded_lines(path):
    word, _, rest = line.rstrip().partition(" ")
    values = rest.split(" ")
    if vectors is None:
      dim = len(values)
      vectors = np.zeros((len(vocabulary), dim), np.float32)
    if len(values) != dim:
      raise DataError(f"{path}:{lineno}: {len(values)} values, the first line has {dim}")
    i = ids.get(word)
    if i is None or found[i] or i < len(RESERVED):
      continue
    try:
      vectors[i] = np.asarray(values, np.float32)
    except ValueError:
      raise DataError(f"{path}:{lineno}: values of {word!r} are not all numbers") from None
    found[i] = True
  if vectors is None:
    raise DataError(f"{path}: no vectors")
  return vectors, found


def vector_words(path: str | os.PathLike) -> list[str]:
  """The words of a `word v_1 ... v_d` file, in file order, each once, reserved names left out."""
  path = Path(path)
  if not path.is_file():
    raise FileNotFoundError(f"word vectors: {path.absolute()} does not exist")
  seen = set(RESERVED)
  out = []
  for _, line in decoded_lines(path):
    word = line.partition(" ")[0]
    if word not in seen:
      seen.add(word)
      out.append(word)
  return out


def embedding_matrix(vocabulary: Vocabulary, *, dim: int, vectors: str | os.PathLike | None,
                     seed: int) -> tuple[np.ndarray, float]:
  """[len(vocabulary), dim] float32 initial word embeddings and the fraction found in `vectors`.

  Words in the file take their vectors; the others, and every word when `vectors` is
  None, are drawn from a normal of the file's vectors' standard deviation (0.1 without a
  file), seeded. Padding is zero.
  """
  rng = np.random.Generator(np.random.PCG64(seed))
  if vectors is None:
    out = rng.normal(0.0, 0.1, (len(vocabulary), dim)).astype(np.float32)
    out[0] = 0.0
    return out, 0.0
  pretrained, found = read_vectors(vectors, vocabulary)
  if pretrained.shape[1] != dim:
    raise ValueError(f"model.embed_dim={dim} but {vectors} holds {pretrained.shape[1]}-d vectors")
  std = float(pretrained[found].std()) if found.any() else 0.1
  out = np.where(found[:, None], pretrained, rng.normal(0.0, std, pretrained.shape)).astype(np.float32)
  out[0] = 0.0
  words_found = found[len(RESERVED):len(vocabulary) - vocabulary.oov_buckets]
  return out, float(words_found.mean()) if len(words_found) else 0.0


def padded_length(longest: int, max_length: int) -> int:
  """The smallest width 2^k or 3 * 2^(k-1) >= `longest` (16, 24, 32, 48, 64, 96, ...; at
  least `MIN_PADDED_LENGTH`), at most `max_length`.

  Two widths an octave bound the shapes XLA compiles to twice the powers of two and cut
  the padded steps a recurrence or attention runs over (at most a third of a width
  instead of half).
  """
  power = 1 << (max(longest, 1) - 1).bit_length()
  width = power * 3 // 4 if power * 3 // 4 >= longest else power
  return min(max(width, MIN_PADDED_LENGTH), max_length)


def distinct(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
  """Each distinct text once, in order of first appearance, and [n] int32 the row of each
  of `texts` in that list (a history scored with each of its candidates: one row)."""
  row = {}
  index = np.array([row.setdefault(t, len(row)) for t in texts], np.int32)
  return list(row), index


def cut_lengths(texts: Sequence[str], *, max_length: int) -> np.ndarray:
  """[n] int32: the lengths `encode` gives `texts`, without their ids. A text that repeats
  (a history scored with each of its candidates) is tokenised once."""
  length = {t: min(len(tokenize(t)), max_length) or 1 for t in set(texts)}
  return np.asarray([length[t] for t in texts], np.int32)


def encode(texts: Sequence[str], vocabulary: Vocabulary, *, max_length: int, keep: str
           ) -> tuple[np.ndarray, np.ndarray]:
  """Word ids of `texts`, cut to `max_length` keeping the "end" (contexts) or "start"
  (responses), padded to `padded_length` of the longest.

  Returns:
    ([n, L] int32 ids, 0 = padding; [n] int32 lengths, each >= 1: an empty text is one
    unknown word).
  """
  if keep not in ("start", "end"):
    raise ValueError(f"keep must be 'start' or 'end', got {keep!r}")
  rows = []
  for text in texts:
    ids = vocabulary.ids(tokenize(text)) or [1]
    rows.append(ids[-max_length:] if keep == "end" else ids[:max_length])
  lengths = np.asarray([len(r) for r in rows], np.int32)
  out = np.zeros((len(rows), padded_length(int(lengths.max(initial=1)), max_length)), np.int32)
  for i, r in enumerate(rows):
    out[i, :len(r)] = r
  return out, lengths
