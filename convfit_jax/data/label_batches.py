"""Label-aware Stage 2 batches: P intents x K utterances each, every utterance once an epoch.

The paper's pairs (`data.pairs`) grow with the square of the examples per intent and
encode each sentence dozens of times an epoch. A label batch instead holds P groups of
up to K same-intent utterances, and the dense losses (`losses.DENSE_LOSSES`) score
every pair of the batch, so one encoding serves P*K - 1 comparisons.

An epoch: each intent's utterances are shuffled and cut into groups of K (the last one
shorter when K does not divide the count: such a group takes what its intent has left,
never repeats, and its empty places are padding of weight 0). The groups of all
intents are then interleaved so each intent's groups spread evenly over the epoch
(group r of an intent with G groups sits at (r + u) / G, u uniform): in a few-shot set
every batch holds P distinct intents, and with full, unbalanced data a frequent intent
can fill two groups of one batch, never a long run of batches. Consecutive P groups
form a batch; the epoch's last batch is padded.

A set with fewer intents than P (a user's 7 intents against P = 32) cannot put P intents
in a batch. Its batches hold every intent instead (`layout`): P' = n groups of K' = P*K // n
places (at least K, at most the largest intent's count), the step's P*K sentences kept;
an intent's utterances are then cut into ceil(count / K') groups of near-equal size, so
an epoch never ends an intent on a lone utterance with nothing to contrast it with
(10 utterances at K' = 9: 5 + 5, not 9 + 1).

Two options add places to a batch. `anchors`: each intent's own text (its name, made
readable: `intent.label_texts`) is a table row after the labelled ones (intent c at row
len(labels) + c), and a batch's block of P places after its groups holds the text of each
intent the batch has, once, as one more member of its intent (FastFit's label anchors).
`views` = R: every place is repeated R times and each copy packed as its own sentence, so
dropout encodes R views of it (SimCSE's idea, FastFit's repeats); a copy is a positive of
the other copies of its utterance and of its intent's other utterances alike.

Step s is batch s % steps_per_epoch of epoch s // steps_per_epoch, each epoch drawn
from PCG64(seed, epoch): the same on every machine and process, and a run resumed at
step k sees what an uninterrupted one sees. Each process keeps its contiguous slice of
the places and packs its sentences (`data.packing`) into a row count fixed for the
run (`label_batch_rows`), as `batching.pair_batches` does.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np

from convfit_jax.data import packing
from convfit_jax.data.batching import (SentenceTable, check_divisible, own_slice, process_slot,
                                       steps_per_epoch)


def batch_places(labels_per_batch: int, examples_per_label: int, multiple: int = 1, *,
                 views: int = 1, anchors: bool = False) -> int:
  """B: the (P*K + P if `anchors`) x `views` places of a batch rounded up to `multiple` (the
  data-parallel devices, which split the batch); the extra places are padding of weight 0."""
  p = labels_per_batch
  return -(-(p * examples_per_label + p * anchors) * views // multiple) * multiple


class LabelBatch(NamedTuple):
  """One label batch of B places (`batch_places`; or one process's slice of it).

  Global shapes: input_ids, attention_mask (sentence numbers), position_ids [R, W] int32,
  the distinct sentences packed; slots [B, 2] int32, (row, sentence number) of each
  place; sentence_ids [B] int32 (table rows; padding places repeat the batch's first);
  labels [B] int32; weights [B] float32 (0 on padding). Process p holds rows
  [p*R/P', (p+1)*R/P') of the packed arrays and places [p*B/P', (p+1)*B/P') of the rest,
  for P' processes.
  """
  input_ids: np.ndarray
  attention_mask: np.ndarray
  position_ids: np.ndarray
  slots: np.ndarray
  sentence_ids: np.ndarray
  labels: np.ndarray
  weights: np.ndarray


class Layout(NamedTuple):
  """What a batch of a set holds (`layout`): `labels_per_batch` groups of up to
  `examples_per_label` utterances; `even`: an intent's groups are of near-equal size (else
  K, the last shorter); `groups` and `steps_per_epoch`: of one epoch."""
  labels_per_batch: int
  examples_per_label: int
  even: bool
  groups: int
  steps_per_epoch: int


def layout(labels: np.ndarray, labels_per_batch: int, examples_per_label: int) -> Layout:
  """P x K as asked when the set has at least P intents; with n < P intents, n groups of
  P*K // n places (at least K, at most the largest intent's count), groups even."""
  counts = np.unique(np.asarray(labels), return_counts=True)[1]
  p, k, even = labels_per_batch, examples_per_label, False
  if len(counts) < p:
    p, k, even = len(counts), max(k, min(p * k // len(counts), int(counts.max()))), True
  groups = int(np.sum(-(-counts // k)))
  return Layout(p, k, even, groups, steps_per_epoch(groups, p))


def epoch_groups(labels: np.ndarray, examples_per_label: int, seed: int, epoch: int,
                 even: bool = False) -> list[np.ndarray]:
  """The groups of one epoch in order: [<= K] int64 table rows of one intent each; an
  intent's ceil(count / K) groups are K each but the last, or near-equal when `even`."""
  labels = np.asarray(labels)
  k = examples_per_label
  rng = np.random.Generator(np.random.PCG64([seed, epoch]))
  groups, keys = [], []
  for label in np.unique(labels):
    rows = np.flatnonzero(labels == label)
    rows = rows[rng.permutation(len(rows))]
    g = -(-len(rows) // k)
    groups += np.array_split(rows, g) if even else [rows[i * k:(i + 1) * k] for i in range(g)]
    keys.append((np.arange(g) + rng.random(g)) / g)
  order = np.argsort(np.concatenate(keys), kind="stable") if keys else []
  return [groups[i] for i in order]


def summary(labels: np.ndarray, labels_per_batch: int, examples_per_label: int, *,
            views: int = 1, anchors: bool = False) -> str:
  """One line before training: what a batch holds, and the intents that cannot fill a group."""
  counts = np.unique(np.asarray(labels), return_counts=True)[1]
  p, k, even, groups, per_epoch = layout(labels, labels_per_batch, examples_per_label)
  extra = "".join([", each group joined by its intent's text" if anchors else "",
                   f", every sentence encoded {views} times (dropout views: "
                   f"{batch_places(labels_per_batch, examples_per_label, views=views, anchors=anchors)}"
                   " places)" if views > 1 else ""])
  epoch = f"{groups:,} groups, {per_epoch:,} steps an epoch over {len(labels):,} utterances"
  if even:
    # ceil(c / k) near-equal groups of c utterances hold c // g or c // g + 1 each.
    g = -(-counts // k)
    sizes = sorted(set((counts // g).tolist()) | set((counts // g + 1)[counts % g != 0].tolist()))
    return (f"label batches: all {p} intents (fewer than labels_per_batch={labels_per_batch}) "
            f"x up to {k} utterances = up to {p * k} sentences of the "
            f"{labels_per_batch * examples_per_label} asked; each intent's utterances cut into "
            f"near-equal groups (sizes {', '.join(map(str, sizes))}){extra}; {epoch}")
  short = int(np.sum(counts % k != 0))
  fewer = int(np.sum(counts < k))
  return (f"label batches: {p} intents x {k} utterances = {p * k} sentences{extra}; {epoch}; "
          f"{short} of {len(counts)} intents end an epoch on a group of fewer "
          f"than {k} ({fewer} have fewer than {k} in all)")


def _step_places(labels: np.ndarray, labels_per_batch: int, examples_per_label: int, seed: int,
                 start_step: int, num_steps: int | None, places: int, views: int = 1,
                 anchors: bool = False) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
  """Per step from `start_step`: (sentence_ids [places] int32, weights [places] float32,
  copies [places] int32: which of the `views` copies of its sentence a place holds)."""
  p, k, even, _, per_epoch = layout(labels, labels_per_batch, examples_per_label)
  base = labels_per_batch * examples_per_label + labels_per_batch * anchors
  epoch, groups = None, None
  step = start_step
  while num_steps is None or step < start_step + num_steps:
    if step // per_epoch != epoch:
      epoch = step // per_epoch
      groups = epoch_groups(labels, k, seed, epoch, even)
    batch = groups[(step % per_epoch) * p:(step % per_epoch + 1) * p]
    ids = np.full((places,), batch[0][0], np.int32)
    weights = np.zeros((places,), np.float32)
    for g, rows in enumerate(batch):
      ids[g * k:g * k + len(rows)] = rows
      weights[g * k:g * k + len(rows)] = 1.0
    if anchors:
      # An intent with two groups in the batch (full, unbalanced data) gets its text once.
      present = np.unique(labels[[rows[0] for rows in batch]])
      start = labels_per_batch * examples_per_label
      ids[start:start + len(present)] = len(labels) + present
      weights[start:start + len(present)] = 1.0
    ids[base:base * views] = np.tile(ids[:base], views - 1)
    weights[base:base * views] = np.tile(weights[:base], views - 1)
    copies = np.zeros((places,), np.int32)
    copies[:base * views] = np.repeat(np.arange(views, dtype=np.int32), base)
    yield ids, weights, copies
    step += 1


def _distinct(ids: np.ndarray, copies: np.ndarray, views: int) -> tuple[np.ndarray, np.ndarray]:
  """(table rows of the distinct sentences to encode, each place's index into them): a
  sentence's copies are distinct, so each gets its own dropout."""
  keys, inverse = np.unique(ids.astype(np.int64) * views + copies, return_inverse=True)
  return keys // views, inverse


def label_batch_rows(table: SentenceTable, labels: np.ndarray, *, labels_per_batch: int,
                     examples_per_label: int, seed: int, num_steps: int, places: int | None = None,
                     process_count: int = 1, multiple: int = 1, views: int = 1,
                     anchors: bool = False) -> int:
  """Packed rows per process that every batch of a run of `num_steps` steps fits in
  (exact: packs each process's sentences of every step), rounded up to `multiple`.
  `places`: B, default `batch_places`; views, anchors: as `label_batches`."""
  b = places or batch_places(labels_per_batch, examples_per_label, views=views, anchors=anchors)
  lengths = table.lengths

  def length_sets():
    for ids, _, copies in _step_places(labels, labels_per_batch, examples_per_label, seed, 0,
                                       num_steps, b, views, anchors):
      for p in range(process_count):
        own = own_slice(b, p, process_count)
        yield lengths[_distinct(ids[own], copies[own], views)[0]]

  return packing.rows_for(length_sets(), table.width, multiple, table.packs)


def label_batches(table: SentenceTable, labels: np.ndarray, *, labels_per_batch: int,
                  examples_per_label: int, rows: int, seed: int = 0, start_step: int = 0,
                  num_steps: int | None = None, places: int | None = None, views: int = 1,
                  anchors: bool = False, process_index: int | None = None,
                  process_count: int | None = None) -> Iterator[LabelBatch]:
  """Label batches, epoch after epoch; step s is batch s % steps_per_epoch of epoch
  s // steps_per_epoch, so `start_step=k` resumes exactly.

  Args:
    table: tokenised training sentences (with `anchors`, then each intent's text).
    labels: [n] int intent id of each of the table's first n rows (the utterances).
    labels_per_batch, examples_per_label: P and K as asked (K >= 2: a group needs a
      positive); `layout` says what a batch of this set holds.
    rows: packed rows per process (`label_batch_rows`).
    seed: the sampling seed.
    start_step, num_steps: the steps to produce (num_steps None: without end).
    places: B, the places of a batch (`batch_places`; its default).
    views: R >= 1 copies of every place, each encoded apart.
    anchors: the table's rows after the utterances hold each intent's text, joining
      every batch that has the intent.
    process_index, process_count: default jax.process_index() / process_count().
  """
  process_index, process_count = process_slot(process_index, process_count)
  labels = np.asarray(labels)
  needed = batch_places(labels_per_batch, examples_per_label, views=views, anchors=anchors)
  b = places or needed
  check_divisible(b, process_count)
  if b < needed:
    raise ValueError(f"places={b} cannot hold {labels_per_batch} x {examples_per_label}"
                     f"{' and the intent texts' if anchors else ''} x {views} views ({needed})")
  if views < 1:
    raise ValueError(f"views={views}: need at least 1")
  if examples_per_label < 2 or labels_per_batch < 1:
    raise ValueError(f"need examples_per_label >= 2 and labels_per_batch >= 1, got "
                     f"{examples_per_label} and {labels_per_batch}")
  if len(labels) == 0:
    raise ValueError("no training sentences")
  num_labels = int(labels.max()) + 1
  if len(table) != len(labels) + anchors * num_labels:
    raise ValueError(f"table has {len(table)} sentences; {len(labels)} labels"
                     f"{f' and {num_labels} intent texts' if anchors else ''} expected")
  row_labels = np.concatenate([labels, np.arange(num_labels)]) if anchors else labels
  own = own_slice(b, process_index, process_count)
  for ids, weights, copies in _step_places(labels, labels_per_batch, examples_per_label, seed,
                                           start_step, num_steps, b, views, anchors):
    mine = ids[own]
    distinct, inverse = _distinct(mine, copies[own], views)
    packed = packing.pack(table.input_ids[distinct], table.attention_mask[distinct], rows,
                          table.width, row_offset=process_index * rows, packs=table.packs)
    yield LabelBatch(packed.input_ids, packed.segment_ids, packed.position_ids,
                     packed.slots[inverse], mine, row_labels[mine].astype(np.int32), weights[own])
