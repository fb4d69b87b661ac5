"""Stage 1 training throughput: convfit_jax against sentence-transformers, same run.

Run by hand from the repository root:

  python benchmarks/stage1_throughput.py [--batch_size 64] [--max_length 48] [--steps 8]

Both sides train all-MiniLM-L6-v2 on the first SGD training pairs
(../shared/data/conversations/sgd/train.tsv) with dropout on, AdamW 2e-5, scale 20:

  ours:   `stage1.train_step` (jit, global multiple-negatives loss, no grad cache),
          batches from `data.batching` (tokenised per batch), padding cut to a bucket width
          as the training loop does on one process
  theirs: SentenceTransformer + MultipleNegativesRankingLoss, a plain PyTorch loop
          (tokenise, forward, backward, AdamW step): what its trainer runs per step,
          without the trainer's bookkeeping; max_seq_length = max_length

Warm-up first (ours: one step per bucket width the batches can be cut to, so no
compilation falls in the timed steps; theirs: one step), then `--steps` timed steps; both sides
include tokenisation. Prints pairs/second for each and the ratio ours / theirs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np

TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "conversations" / "sgd" / "train.tsv"


def _pairs(n: int):
  from convfit_jax.data.conversations import read_conversations  # pylint: disable=import-outside-toplevel
  return list(itertools.islice(read_conversations(TRAIN), n))


def ours(pairs, batch_size: int, max_length: int, steps: int) -> float:
  import jax  # pylint: disable=import-outside-toplevel
  from convfit_jax import checkpoints, sharding  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import batching  # pylint: disable=import-outside-toplevel
  from convfit_jax.tokenize import bucket_widths  # pylint: disable=import-outside-toplevel
  from convfit_jax.tokenize import load_tokenizer  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import stage1, state as state_lib  # pylint: disable=import-outside-toplevel

  model, ck = checkpoints.load_sentence_encoder(checkpoints.MINILM)
  tokenizer = load_tokenizer(ck.tokenizer_dir)
  tx, _ = state_lib.make_optimizer(learning_rate=2e-5, total_steps=steps + 1, clip_norm=1.0)
  state = state_lib.TrainState.create(stage1.DualEncoder(model), tx)
  mesh = sharding.make_mesh()
  step_fn = stage1.make_train_step(mesh, stage1.LossConfig(dropout=True))
  batches = batching.prefetch(batching.conversation_batches(
      lambda _: pairs, tokenizer, batch_size=batch_size, max_length=max_length))

  def one(local):
    nonlocal state
    state, out = step_fn(state, sharding.global_batch(local, mesh))
    return float(out["loss"])

  # Warm-up: compile every bucket width a batch can be cut to, as a long run has.
  first = next(batches)._asdict()
  used = batching.trim_padding(first, ("context_mask", "response_mask"), max_length)["context_ids"].shape[1]
  for width in [w for w in bucket_widths(max_length) if w >= used]:
    one({k: v[:, :width] if v.ndim == 2 else v for k, v in first.items()})
  tic = time.perf_counter()
  for _ in range(steps):
    one(batching.trim_padding(next(batches)._asdict(), ("context_mask", "response_mask"), max_length))
  return steps * batch_size / (time.perf_counter() - tic)


def theirs(pairs, batch_size: int, max_length: int, steps: int) -> float:
  import torch  # pylint: disable=import-outside-toplevel
  from sentence_transformers import SentenceTransformer, losses  # pylint: disable=import-outside-toplevel
  from convfit_jax import checkpoints  # pylint: disable=import-outside-toplevel

  model = SentenceTransformer(str(checkpoints.resolve(checkpoints.MINILM)), device="cpu")
  model.max_seq_length = max_length
  model.train()
  loss_fn = losses.MultipleNegativesRankingLoss(model, scale=20.0)
  opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)

  def one(k):
    chunk = pairs[k * batch_size:(k + 1) * batch_size]
    feats = [model.tokenize([p.context for p in chunk]), model.tokenize([p.response for p in chunk])]
    loss = loss_fn(feats, None)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad()
    return float(loss)

  one(0)
  tic = time.perf_counter()
  for k in range(1, steps + 1):
    one(k)
  return steps * batch_size / (time.perf_counter() - tic)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--max_length", type=int, default=48)
  parser.add_argument("--steps", type=int, default=8)
  args = parser.parse_args()
  pairs = _pairs(args.batch_size * (args.steps + 2))
  a = ours(pairs, args.batch_size, args.max_length, args.steps)
  b = theirs(pairs, args.batch_size, args.max_length, args.steps)
  print(f"ours   (convfit_jax):          {a:8.1f} pairs/s")
  print(f"theirs (sentence-transformers): {b:8.1f} pairs/s")
  print(f"ratio ours/theirs: {a / b:.2f}  (batch {args.batch_size}, max_length {args.max_length}, "
        f"{args.steps} timed steps)")


if __name__ == "__main__":
  main()
