"""Conversation, response-selection and STS readers: formats, streaming, bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from convfit_jax.data import conversations as conv
from convfit_jax.data import sentence_pairs
from convfit_jax.data.readers import DataError

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _write(path: Path, text: str | bytes) -> Path:
  path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
  return path


def test_tsv_with_history_and_quotes():
  rows = list(conv.read_conversations(FIXTURES / "conversations.tsv"))
  assert len(rows) == 3
  assert rows[1].context == 'I need a "table" for two'
  assert rows[1].history == ("hi there", "hello, how can I help?", 'I need a "table" for two')
  assert rows[0].history == ("hi there",)


def test_jsonl_and_reddit_formats():
  rows = list(conv.read_conversations(FIXTURES / "conversations.jsonl"))
  assert rows[0] == conv.Conversation("hi there", "hello, how can I help?", ("hi there",))
  assert rows[1].history[0] == "hi there" and len(rows[1].history) == 3
  reddit = list(conv.read_conversations(FIXTURES / "reddit.jsonl"))
  # context/1 is older than context/0, which is older than context.
  assert reddit[0].history == ("what is the best pizza", "margherita, obviously", "pineapple though?")
  assert reddit[0].response == "never" and reddit[1].history == ("anyone here?",)


def test_shuffle_buffer_is_a_seeded_permutation():
  items = list(range(1000))
  a = list(conv.shuffle_buffer(items, 64, seed=0))
  b = list(conv.shuffle_buffer(items, 64, seed=0))
  c = list(conv.shuffle_buffer(items, 64, seed=1))
  assert sorted(a) == items and a == b and a != c and a != items
  assert list(conv.shuffle_buffer(items, 0, seed=0)) == items


def test_shuffle_buffer_streams_without_reading_everything():
  consumed = []

  def source():
    for i in range(10**9):
      consumed.append(i)
      yield i
  stream = conv.shuffle_buffer(source(), 16, seed=0)
  first = [next(stream) for _ in range(5)]
  assert all(x < 21 for x in first) and len(consumed) <= 21


def test_fraction_is_seeded_and_nested():
  items = list(range(20000))
  half = list(conv.take_fraction(items, 0.5, seed=3))
  tenth = list(conv.take_fraction(items, 0.1, seed=3))
  assert abs(len(half) - 10000) < 400 and abs(len(tenth) - 2000) < 200
  assert set(tenth) <= set(half)
  assert half == list(conv.take_fraction(items, 0.5, seed=3))
  assert half != list(conv.take_fraction(items, 0.5, seed=4))
  with pytest.raises(ValueError, match="fraction"):
    list(conv.take_fraction(items, 0.0, seed=0))


def test_read_conversations_fraction_and_shuffle_are_deterministic(tmp_path):
  lines = ["context\tresponse"] + [f"c{i}\tr{i}" for i in range(500)]
  f = _write(tmp_path / "c.tsv", "\n".join(lines) + "\n")
  a = list(conv.read_conversations(f, fraction=0.3, seed=1, buffer_size=50))
  b = list(conv.read_conversations(f, fraction=0.3, seed=1, buffer_size=50))
  assert a == b and 100 < len(a) < 200
  assert [r.context for r in a] != sorted((r.context for r in a), key=lambda c: int(c[1:]))


def test_conversation_bad_input(tmp_path):
  missing = _write(tmp_path / "m.tsv", "context\treply\nhi\tho\n")
  with pytest.raises(DataError, match=r"m\.tsv:1: missing column\(s\) 'response'"):
    list(conv.read_conversations(missing))
  empty = _write(tmp_path / "e.tsv", "context\tresponse\nhi\tho\n \tho\n")
  with pytest.raises(DataError, match=r"e\.tsv:3: empty context"):
    list(conv.read_conversations(empty))
  fields = _write(tmp_path / "f.tsv", "context\tresponse\nhi\tho\tx\n")
  with pytest.raises(DataError, match=r"f\.tsv:2: 3 fields"):
    list(conv.read_conversations(fields))
  utf = _write(tmp_path / "u.jsonl", b'{"context": "hi", "response": "ho"}\n{"context": "\xff"}\n')
  with pytest.raises(DataError, match=r"u\.jsonl:2: invalid UTF-8"):
    list(conv.read_conversations(utf))
  key = _write(tmp_path / "k.jsonl", '{"context": "hi"}\n')
  with pytest.raises(DataError, match=r"k\.jsonl:1: missing column\(s\) 'response'"):
    list(conv.read_conversations(key))


def test_response_selection_reader():
  rs = conv.read_response_selection(FIXTURES / "response_selection.jsonl")
  assert len(rs) == 2 and rs.labels.tolist() == [0, 1] and rs.labels.dtype == np.int32
  assert rs.histories[0] == ("hi", "book a table") and rs.histories[1] == ("what is the weather",)
  assert rs.candidates[1][rs.labels[1]] == "it is sunny"


def test_response_selection_bad_input(tmp_path):
  label = _write(tmp_path / "l.jsonl", '{"context": "a", "candidates": ["x", "y"], "label": 2}\n')
  with pytest.raises(DataError, match=r"l\.jsonl:1: label 2 is not an index"):
    conv.read_response_selection(label)
  count = _write(tmp_path / "c.jsonl", '{"context": "a", "candidates": ["x", "y"], "label": 0}\n'
                 '{"context": "b", "candidates": ["x"], "label": 0}\n')
  with pytest.raises(DataError, match=r"c\.jsonl:2: 1 candidates, earlier cases have 2"):
    conv.read_response_selection(count)


@pytest.mark.skipif(not SHARED.is_dir(), reason="../shared/data is absent")
def test_shared_sgd_and_stsb():
  rs = conv.read_response_selection(SHARED / "conversations" / "sgd" / "test_rs100.jsonl")
  assert len(rs) == 2000 and {len(c) for c in rs.candidates} == {100}
  assert all(h[-1] == c for h, c in zip(rs.histories, rs.contexts))
  stsb = sentence_pairs.read_sts(SHARED / "sts" / "stsb" / "test.tsv")
  assert len(stsb) == 1379 and 0.0 <= stsb.scores.min() and stsb.scores.max() <= 5.0
  test = list(conv.read_conversations(SHARED / "conversations" / "sgd" / "test.tsv"))
  assert len(test) == 10025


def test_labelled_pairs_reader_and_bad_input(tmp_path):
  good = _write(tmp_path / "p.tsv", "history\tresponse\tlabel\nhi __eou__ my wifi drops\ttry a cable\t1\n"
                "one turn only\tlol\t0\n")
  pairs = conv.read_labelled_pairs(good)
  assert pairs.labels.tolist() == [1, 0] and pairs.histories[1] == "one turn only"
  for body, message in (("\ttry a cable\t1", "empty history"), ("hi\t \t1", "empty response"),
                        ("hi\tyo\t2", "label '2' is not 0 or 1"), ("hi\tyo", "fields")):
    bad = _write(tmp_path / "b.tsv", f"history\tresponse\tlabel\nok\tok\t1\n{body}\n")
    with pytest.raises(DataError, match=rf"b\.tsv:3: .*{message}"):
      conv.read_labelled_pairs(bad)


def test_stage1_reads_the_rerankers_labelled_format(tmp_path):
  f = _write(tmp_path / "u.tsv", "history\tresponse\tlabel\nhi __eou__ my wifi drops\ttry a cable\t1\n"
             "hi __eou__ my wifi drops\tlol\t0\none turn\tok\t1\n")
  rows = list(conv.read_conversations(f))
  assert [(r.context, r.response) for r in rows] == [("my wifi drops", "try a cable"), ("one turn", "ok")]
  assert rows[0].history == ("hi", "my wifi drops") and rows[1].history == ("one turn",)
  bad = _write(tmp_path / "b.tsv", "history\tresponse\tlabel\nhi\tyo\tyes\n")
  with pytest.raises(DataError, match=r"b\.tsv:2: label 'yes'"):
    list(conv.read_conversations(bad))
  empty = _write(tmp_path / "e.tsv", "response\nyo\n")
  with pytest.raises(DataError, match=r"e\.tsv:2: empty context"):
    list(conv.read_conversations(empty))
