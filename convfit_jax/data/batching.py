"""Fixed-shape batches for jit: Stage 2 pair batches, Stage 1 (context, response) batches.

Every batch of a run has the same shapes: a last partial batch is padded and
its padding carries weight 0, so no example is dropped and nothing recompiles.

Stage 2 sentences are tokenised once into a `SentenceTable`. A pair batch of B
pairs carries the distinct sentences its pairs use, packed several to a row
(`data.packing`: no compute on padding) into a row count fixed for the run
(`pair_batch_rows`), plus `u_idx`, `v_idx` into the list of those sentences, so the
train step encodes each distinct sentence once and gathers the pair sides from the
embeddings.

Multi-host: every process builds the same global batch and keeps only its
contiguous slice of the leading axis of every array (`process_index` of
`process_count`); concatenating the slices of all processes gives exactly the
single-process global batch. `u_idx` / `v_idx` index the *global* [2B] sentence
slice, which is what a train step sees once the per-process slices are
assembled into global arrays (`jax.make_array_from_process_local_data`).

Order is reshuffled every epoch from (seed, epoch), so a run resumed at step k
with `start_step=k` sees the same batches as one that never stopped.
"""

from __future__ import annotations

import dataclasses
import hashlib
import queue
import threading
from typing import Callable, Iterable, Iterator, NamedTuple, Sequence, TypeVar

import numpy as np

from convfit_jax.data import packing
from convfit_jax.data.conversations import Conversation
from convfit_jax.data.pairs import Pairs
from convfit_jax.tokenization import tokenize

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class SentenceTable:
  """Unique sentences tokenised once: input_ids, attention_mask [n, L] int32; `packs`:
  whether batches may pack several to a row (the model's `Built.packs`)."""
  input_ids: np.ndarray
  attention_mask: np.ndarray
  packs: bool = True

  def __len__(self) -> int:
    return int(self.input_ids.shape[0])

  @property
  def width(self) -> int:
    return int(self.input_ids.shape[1])

  @property
  def lengths(self) -> np.ndarray:
    """[n] int64 real tokens per sentence."""
    return self.attention_mask.sum(1)

  @classmethod
  def from_texts(cls, tokenizer, texts: Sequence[str], max_length: int = 48, packs: bool = True
                 ) -> SentenceTable:
    """`texts` tokenised (`tokenization.tokenize`: a transformers tokenizer or a word
    vocabulary) to `max_length`; `packs` as the model declares (`Built.packs`)."""
    ids, mask = tokenize(tokenizer, texts, max_length)
    return cls(ids, mask, packs)


class PairBatch(NamedTuple):
  """One Stage 2 batch (or one process's slice of it).

  Global shapes for B pairs whose distinct sentences are packed into R rows of the
  table's width W (`data.packing`): input_ids, attention_mask (sentence numbers) and
  position_ids [R, W] int32; slots [2B, 2] int32, (row, sentence number) of the
  batch's distinct sentences, padding entries repeating a used one; sentence_ids [2B]
  int32 (their table rows); u_idx, v_idx [B] int32 into those 2B sentences; targets
  [B] float32; weights [B] float32 (0 for padding pairs). A process's slice holds rows
  [p*R/P, (p+1)*R/P) of the packed arrays, [p*2B/P, (p+1)*2B/P) of slots and
  sentence_ids, and [p*B/P, (p+1)*B/P) of the rest.
  """
  input_ids: np.ndarray
  attention_mask: np.ndarray
  position_ids: np.ndarray
  slots: np.ndarray
  sentence_ids: np.ndarray
  u_idx: np.ndarray
  v_idx: np.ndarray
  targets: np.ndarray
  weights: np.ndarray


class ConversationBatch(NamedTuple):
  """One Stage 1 batch: context_/response_ ids and mask [B, L] int32, weights [B] float32."""
  context_ids: np.ndarray
  context_mask: np.ndarray
  response_ids: np.ndarray
  response_mask: np.ndarray
  weights: np.ndarray


def process_slot(process_index: int | None, process_count: int | None) -> tuple[int, int]:
  """(process_index, process_count), each defaulting to jax's, checked."""
  if process_index is None or process_count is None:
    import jax  # pylint: disable=import-outside-toplevel
    process_index = jax.process_index() if process_index is None else process_index
    process_count = jax.process_count() if process_count is None else process_count
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  return process_index, process_count


def check_divisible(batch_size: int, process_count: int):
  """Every process takes an equal slice of the global batch."""
  if batch_size <= 0 or batch_size % process_count:
    raise ValueError(f"batch_size {batch_size} must be a positive multiple of the "
                     f"process count {process_count}")


def steps_per_epoch(num_examples: int, batch_size: int) -> int:
  """Batches in one epoch; the last partial batch counts (it is padded)."""
  return -(-num_examples // batch_size)


def epoch_order(num_examples: int, seed: int, epoch: int) -> np.ndarray:
  """[num_examples] int64 permutation for `epoch`, from a PCG64 seeded by (seed, epoch)."""
  return np.random.Generator(np.random.PCG64([seed, epoch])).permutation(num_examples)


def _batch_sentences(pairs: Pairs, pair_ids: np.ndarray, batch_size: int):
  """sentence_ids [2B] (distinct, padded with repeats), u_idx, v_idx [B] into them."""
  k = len(pair_ids)
  if not 0 < k <= batch_size:
    raise ValueError(f"need 1..{batch_size} pair ids, got {k}")
  sides = np.concatenate([pairs.u[pair_ids], pairs.v[pair_ids]])
  distinct, inverse = np.unique(sides, return_inverse=True)
  sentence_ids = np.full((2 * batch_size,), distinct[0], np.int32)
  sentence_ids[:len(distinct)] = distinct
  u_idx = np.zeros((batch_size,), np.int32)
  v_idx = np.zeros((batch_size,), np.int32)
  u_idx[:k], v_idx[:k] = inverse[:k], inverse[k:]
  return sentence_ids, u_idx, v_idx


def own_slice(n: int, process_index: int, process_count: int) -> slice:
  """This process's contiguous share of n global places (sentences, pairs, rows)."""
  return slice(process_index * n // process_count, (process_index + 1) * n // process_count)


def make_pair_batch(table: SentenceTable, pairs: Pairs, pair_ids: np.ndarray,
                    targets: np.ndarray, batch_size: int, rows: int, process_index: int = 0,
                    process_count: int = 1) -> PairBatch:
  """The batch of pairs `pair_ids` (at most batch_size), padded to batch_size.

  Args:
    table: the sentence table `pairs` indexes.
    pairs: the Stage 2 pairs.
    pair_ids: [k] int, k <= batch_size, which pairs.
    targets: [len(pairs)] float32 targets of all pairs (`Pairs.targets(loss)`).
    batch_size: B, pairs per global batch.
    rows: packed rows per process (`pair_batch_rows`).
    process_index, process_count: which slice of the global batch to return.
  """
  check_divisible(batch_size, process_count)
  k = len(pair_ids)
  sentence_ids, u_idx, v_idx = _batch_sentences(pairs, pair_ids, batch_size)
  batch_targets = np.zeros((batch_size,), np.float32)
  batch_targets[:k] = targets[pair_ids]
  weights = np.zeros((batch_size,), np.float32)
  weights[:k] = 1.0
  cols = own_slice(batch_size, process_index, process_count)
  own = sentence_ids[own_slice(2 * batch_size, process_index, process_count)]
  distinct, inverse = np.unique(own, return_inverse=True)
  packed = packing.pack(table.input_ids[distinct], table.attention_mask[distinct], rows,
                        table.width, row_offset=process_index * rows, packs=table.packs)
  return PairBatch(packed.input_ids, packed.segment_ids, packed.position_ids,
                   packed.slots[inverse], own, u_idx[cols], v_idx[cols], batch_targets[cols],
                   weights[cols])


def _pair_ids_by_step(num_pairs: int, batch_size: int, seed: int, start_step: int,
                      num_steps: int | None) -> Iterator[np.ndarray]:
  """The pair ids of steps start_step, start_step + 1, ...: batch s % steps_per_epoch of
  epoch s // steps_per_epoch, each epoch in its own seeded order."""
  per_epoch = steps_per_epoch(num_pairs, batch_size)
  step = start_step
  epoch, order = None, None
  while num_steps is None or step < start_step + num_steps:
    if step // per_epoch != epoch:
      epoch = step // per_epoch
      order = epoch_order(num_pairs, seed, epoch)
    first = (step % per_epoch) * batch_size
    yield order[first:first + batch_size]
    step += 1


def pair_batch_rows(table: SentenceTable, pairs: Pairs, *, batch_size: int, seed: int,
                    num_steps: int, process_count: int = 1, multiple: int = 1) -> int:
  """Packed rows per process that every batch of a run of `num_steps` steps fits in.

  Exact (it packs every batch's sentences of every process), so a run compiles one
  shape and a resumed run gets the same count. Rounded up to `multiple`: the
  data-parallel devices of one process, which split its rows.
  """
  lengths = table.lengths

  def length_sets():
    for pair_ids in _pair_ids_by_step(len(pairs), batch_size, seed, 0, num_steps):
      sentence_ids = _batch_sentences(pairs, pair_ids, batch_size)[0]
      for p in range(process_count):
        yield lengths[np.unique(sentence_ids[own_slice(2 * batch_size, p, process_count)])]

  return packing.rows_for(length_sets(), table.width, multiple, table.packs)


def pair_batches(table: SentenceTable, pairs: Pairs, *, loss: str, rows: int,
                 batch_size: int = 32, seed: int = 0, start_step: int = 0,
                 num_steps: int | None = None, process_index: int | None = None,
                 process_count: int | None = None) -> Iterator[PairBatch]:
  """Stage 2 batches, epoch after epoch, each epoch in its own seeded order.

  Step s is batch s % steps_per_epoch of epoch s // steps_per_epoch, so
  `start_step=k` resumes exactly where step k of an uninterrupted run is.

  Args:
    table: tokenised sentences, len(table) == pairs.num_sentences.
    pairs: the Stage 2 pairs.
    loss: 'smax' | 'ocl' | 'cl' | 'cos', chooses the targets.
    rows: packed rows per process (`pair_batch_rows`).
    batch_size: B pairs per global batch.
    seed: shuffling seed.
    start_step: first global step to produce.
    num_steps: steps to produce (None: without end).
    process_index, process_count: default jax.process_index() / process_count().
  """
  process_index, process_count = process_slot(process_index, process_count)
  check_divisible(batch_size, process_count)
  if len(table) != pairs.num_sentences:
    raise ValueError(f"table has {len(table)} sentences, pairs index {pairs.num_sentences}")
  if len(pairs) == 0:
    raise ValueError("no pairs")
  targets = pairs.targets(loss)
  for pair_ids in _pair_ids_by_step(len(pairs), batch_size, seed, start_step, num_steps):
    yield make_pair_batch(table, pairs, pair_ids, targets, batch_size, rows, process_index,
                          process_count)


def _conversation_batch(chunk: Sequence[Conversation], tokenizer, batch_size: int,
                        max_length: int, process_index: int,
                        process_count: int) -> ConversationBatch:
  per_process = batch_size // process_count
  mine = list(chunk[process_index * per_process:(process_index + 1) * per_process])
  real = len(mine)
  # Padding rows repeat the global batch's first pair, so they tokenise to
  # something valid and are the same whatever the process count; weight 0
  # removes them from the loss.
  mine += [chunk[0]] * (per_process - real)
  c_ids, c_mask = tokenize(tokenizer, [c.context for c in mine], max_length)
  r_ids, r_mask = tokenize(tokenizer, [c.response for c in mine], max_length)
  weights = np.zeros((per_process,), np.float32)
  weights[:real] = 1.0
  return ConversationBatch(c_ids, c_mask, r_ids, r_mask, weights)


def conversation_batches(open_epoch: Callable[[int], Iterable[Conversation]], tokenizer, *,
                         batch_size: int = 256, max_length: int = 48, num_epochs: int = 1,
                         start_step: int = 0, process_index: int | None = None,
                         process_count: int | None = None) -> Iterator[ConversationBatch]:
  """Stage 1 batches of global size B from a stream of conversations, tokenised per batch.

  Args:
    open_epoch: epoch -> the conversations of that epoch, in that epoch's order
      (e.g. `lambda e: read_conversations(path, seed=seed + e, buffer_size=...)`).
    tokenizer: a transformers fast tokenizer.
    batch_size: B, global pairs per batch; the last batch of an epoch is padded.
    max_length: L.
    num_epochs: epochs to produce.
    start_step: global batches to skip first (read, not tokenised).
    process_index, process_count: default jax.process_index() / process_count();
      each process tokenises only its B/P rows.
  """
  process_index, process_count = process_slot(process_index, process_count)
  check_divisible(batch_size, process_count)
  step = 0
  for epoch in range(num_epochs):
    chunk: list[Conversation] = []
    for conversation in open_epoch(epoch):
      chunk.append(conversation)
      if len(chunk) == batch_size:
        if step >= start_step:
          yield _conversation_batch(chunk, tokenizer, batch_size, max_length, process_index,
                                    process_count)
        step += 1
        chunk = []
    if chunk:
      if step >= start_step:
        yield _conversation_batch(chunk, tokenizer, batch_size, max_length, process_index,
                                  process_count)
      step += 1


SIDES = ("context", "response")


def _chunk_blocks(n: int, chunks: int, shards: int) -> list[np.ndarray]:
  """Row indices of each (shard, chunk) block of n rows, shard-major: the rows that
  `train.stage1` gives chunk k on shard s (k * n/(shards*chunks) onwards in shard s's
  n/shards rows)."""
  if n % (shards * chunks):
    raise ValueError(f"{n} rows do not split into {shards} shards x {chunks} chunks")
  return list(np.arange(n).reshape(shards * chunks, n // (shards * chunks)))


def conversation_rows(batch: ConversationBatch, *, chunks: int, shards: int, width: int,
                      packs: bool = True) -> int:
  """The packed rows per (shard, chunk) block that both sides of `batch` need (`packs`:
  the model's `Built.packs`)."""
  lengths = {side: getattr(batch, f"{side}_mask").sum(1) for side in SIDES}
  return max(packing.rows_needed(lengths[side][rows], width, packs)
             for rows in _chunk_blocks(len(batch.weights), chunks, shards) for side in SIDES)


def pack_conversation_batch(batch: ConversationBatch, *, chunks: int, shards: int, rows: int,
                            first_shard: int = 0, packs: bool = True) -> dict[str, np.ndarray]:
  """A Stage 1 batch (this process's slice) with each side packed (`data.packing`).

  The slice's n rows split into `shards` blocks (its devices on the mesh `data` axis)
  of `chunks` gradient-cache chunks; each (shard, chunk) block of sentences is packed
  into `rows` rows, so every device packs and encodes only its own sentences.

  Args:
    batch: [n, L] context/response ids and masks, weights [n].
    chunks: gradient-cache chunks per step (1 without chunking).
    shards: data shards of this slice.
    rows: packed rows per block and side (`conversation_rows`, the same on every process).
    first_shard: the global index of this slice's first shard.
    packs: False: one sentence per row (the model's `Built.packs`).
  Returns:
    {side}_ids, {side}_mask (sentence numbers), {side}_positions [shards*chunks*rows, L]
    int32, in (shard, chunk, row) order; {side}_slots [n, 2] int32, per sentence in
    batch order its (row, sentence number), the row counted within its chunk across
    all shards (global shard * rows + row); response_hash [n, 2] int32 (equal for
    identical responses); weights [n] float32.
  """
  width = batch.context_ids.shape[1]
  out = {"weights": batch.weights, "response_hash": token_hashes(batch.response_ids,
                                                                 batch.response_mask)}
  blocks = _chunk_blocks(len(batch.weights), chunks, shards)
  for side in SIDES:
    ids, mask = getattr(batch, f"{side}_ids"), getattr(batch, f"{side}_mask")
    slots = np.zeros((len(batch.weights), 2), np.int32)
    packed = []
    for b, block in enumerate(blocks):
      p = packing.pack(ids[block], mask[block], rows, width,
                       row_offset=(first_shard + b // chunks) * rows, packs=packs)
      slots[block] = p.slots
      packed.append(p)
    out[f"{side}_ids"] = np.concatenate([p.input_ids for p in packed])
    out[f"{side}_mask"] = np.concatenate([p.segment_ids for p in packed])
    out[f"{side}_positions"] = np.concatenate([p.position_ids for p in packed])
    out[f"{side}_slots"] = slots
  return out


def token_hashes(ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
  """[n, 2] int32 digest of each row's real tokens: rows that tokenise identically (and
  so embed identically) get equal digests, whatever their padding."""
  out = np.zeros((len(ids), 2), np.int32)
  for i, (row, m) in enumerate(zip(ids, mask.astype(bool))):
    digest = hashlib.blake2b(row[m].astype(np.int32).tobytes(), digest_size=8).digest()
    out[i] = np.frombuffer(digest, np.int32)
  return out


def prefetch(iterator: Iterable[T], size: int = 2) -> Iterator[T]:
  """Runs `iterator` in a background thread, at most `size` items ahead.

  Host work (indexing, tokenising) then overlaps the device step. An exception in
  the producer is re-raised in the consumer; closing the returned generator (or
  dropping it) stops the producer.
  """
  if size < 1:
    raise ValueError(f"prefetch size must be >= 1, got {size}")
  items: queue.Queue = queue.Queue(maxsize=size)
  stop = threading.Event()
  done = object()

  def produce():
    try:
      for item in iterator:
        while not stop.is_set():
          try:
            items.put((item, None), timeout=0.1)
            break
          except queue.Full:
            continue
        if stop.is_set():
          return
      items.put((done, None))
    except BaseException as e:  # pylint: disable=broad-except
      items.put((done, e))

  thread = threading.Thread(target=produce, daemon=True, name="convfit-prefetch")
  thread.start()
  try:
    while True:
      item, error = items.get()
      if item is done:
        if error is not None:
          raise error
        return
      yield item
  finally:
    stop.set()
    while thread.is_alive():
      try:
        items.get_nowait()
      except queue.Empty:
        thread.join(timeout=0.1)
