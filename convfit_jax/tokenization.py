"""Tokenisation into fixed-width int32 arrays, shared by `Encoder` and the data pipeline."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from convfit_jax.data import words


def check_texts(texts: Sequence[str], source: str = "texts") -> list[str]:
  """Returns `texts` as a list; a non-string item is a TypeError naming its index."""
  if isinstance(texts, str):
    raise TypeError(f"{source}: expected a sequence of strings, got one string")
  out = list(texts)
  for i, t in enumerate(out):
    if not isinstance(t, str):
      raise TypeError(f"{source}[{i}]: expected str, got {type(t).__name__}")
  return out


def check_nonblank_texts(texts: Sequence[str], source: str = "texts",
                         allow_empty_list: bool = False) -> list[str]:
  """`check_texts`, and a ValueError naming the first empty or whitespace-only text (and an
  empty sequence unless `allow_empty_list`): what training and classifying refuse."""
  out = check_texts(texts, source)
  if not out and not allow_empty_list:
    raise ValueError(f"{source} is empty")
  for i, t in enumerate(out):
    if not t.strip():
      raise ValueError(f"{source}[{i}] is empty or whitespace only")
  return out


def tokenize(tokenizer, texts: Sequence[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
  """Tokenises with truncation at `max_length`, padded to `max_length`.

  Args:
    tokenizer: a transformers fast tokenizer, or a word vocabulary (`data.words.Vocabulary`,
      the word-level models': lower-cased words, an empty text one unknown word).
    texts: n strings (an empty string gives the special tokens only).
    max_length: sequence width, special tokens included.
  Returns:
    input_ids [n, max_length] int32 and attention_mask [n, max_length] int32.
  """
  texts = check_texts(texts)
  if not texts:
    return np.zeros((0, max_length), np.int32), np.zeros((0, max_length), np.int32)
  if isinstance(tokenizer, words.Vocabulary):
    ids, lengths = words.encode(texts, tokenizer, max_length=max_length, keep="start")
    ids = np.pad(ids, [(0, 0), (0, max_length - ids.shape[1])])
    return ids, (np.arange(max_length)[None, :] < lengths[:, None]).astype(np.int32)
  enc = tokenizer(texts, truncation=True, max_length=max_length, padding="max_length",
                  return_attention_mask=True, return_token_type_ids=False)
  return (np.asarray(enc["input_ids"], np.int32), np.asarray(enc["attention_mask"], np.int32))


_MIN_WIDTH = 8


def bucket_widths(max_length: int) -> list[int]:
  """Padded sequence widths: 8, 16, 32, ... below max_length, then max_length.

  Batches padded to one of these compile a bounded number of XLA shapes while short
  texts cost about their length, not max_length.
  """
  widths, w = [], _MIN_WIDTH
  while w < max_length:
    widths.append(w)
    w *= 2
  return widths + [max_length]


def bucket(n: int, sizes: Sequence[int]) -> int:
  """The smallest of the ascending `sizes` that holds n."""
  return next(s for s in sizes if s >= n)


def load_tokenizer(folder):
  """The folder's fast tokenizer (transformers.AutoTokenizer)."""
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
  return AutoTokenizer.from_pretrained(str(folder), use_fast=True)
