"""Stage 1 training throughput: convfit_jax against sentence-transformers, same run.

Run by hand from the repository root:

  python benchmarks/stage1_throughput.py [--batch_size 64] [--max_length 48] [--steps 12]
      [--mode plain|cached|both] [--chunk_size 32]

Both sides train all-MiniLM-L6-v2 on the first SGD training pairs
(../shared/data/conversations/sgd/train.tsv) with dropout on, AdamW 2e-5, global-norm
clipping 1.0, scale 20, and compare like with like:

  plain:  ours (the Stage 1 task's step, `trainer.make_train_step` of
          `stage1.state_loss_and_grads`) without gradient cache (one forward, one backward)
          against sentence-transformers' MultipleNegativesRankingLoss;
  cached: ours with `grad_cache=True, chunk_size=--chunk_size` (an extra forward pass)
          against CachedMultipleNegativesRankingLoss(mini_batch_size=--chunk_size).

  ours:   batches from `data.batching` (tokenised per batch, in the timed step, no
          prefetch), each side packed several sentences to a row
          (`stage1.device_batch`, what the training loop does);
  theirs: SentenceTransformer + the loss in a plain PyTorch loop (tokenise, forward,
          backward, clip, AdamW step): what its trainer runs per step, without the
          trainer's bookkeeping; max_seq_length = max_length, each side padded to its
          longest row.

The machine is shared, so the two sides are interleaved step by step (ours first on
even steps, theirs first on odd ones) and the figure to read is the ratio. Before
timing, ours runs one step per packed row count that the timed batches use, so no
compilation falls in the timed steps (checked: the jit cache must
not grow while timing); theirs runs one warm-up step. Prints pairs/second per side
(total pairs / total seconds), the ratio, and the median of the per-step ratios.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import harness
import numpy as np

TRAIN = Path(__file__).resolve().parents[2] / "shared" / "data" / "conversations" / "sgd" / "train.tsv"


def _pairs(n: int):
  from convfit_jax.data.conversations import read_conversations  # pylint: disable=import-outside-toplevel
  return list(itertools.islice(read_conversations(TRAIN), n))


class Ours:
  """convfit_jax's Stage 1 step on successive batches of `pairs`."""

  def __init__(self, pairs, batch_size: int, max_length: int, total_steps: int, grad_cache: bool,
               chunk_size: int):
    from convfit_jax import hf_io, sharding  # pylint: disable=import-outside-toplevel
    from convfit_jax.data import batching  # pylint: disable=import-outside-toplevel
    from convfit_jax.models import sentence  # pylint: disable=import-outside-toplevel
    from convfit_jax.models.dual_encoder import DualEncoder  # pylint: disable=import-outside-toplevel
    from convfit_jax.tokenization import load_tokenizer  # pylint: disable=import-outside-toplevel
    from convfit_jax.train import optimizer, stage1, trainer, train_state  # pylint: disable=import-outside-toplevel

    self.stage1 = stage1
    self.max_length = max_length
    model, ck = sentence.load(hf_io.MINILM)
    self.tokenizer = load_tokenizer(ck.tokenizer_dir)
    tx, _ = optimizer.make_optimizer(learning_rate=2e-5, total_steps=total_steps, clip_norm=1.0)
    self.mesh = sharding.make_mesh()
    # Placed (committed) as the trainer does: an uncommitted first state would give the
    # first call of each width its own cache entry, compiled again later.
    state = train_state.TrainState.create(DualEncoder(model), tx)
    self.state = train_state.place(state, sharding.param_shardings(state, self.mesh))
    self.cfg = stage1.LossConfig(dropout=True, grad_cache=grad_cache,
                                 chunk_size=chunk_size if grad_cache else None)
    # The Stage 1 task's step, as the trainer jits it.
    self.step_fn = trainer.make_train_step(
        functools.partial(stage1.state_loss_and_grads, cfg=self.cfg), self.mesh)
    self.batches = batching.conversation_batches(
        lambda _: pairs, self.tokenizer, batch_size=batch_size, max_length=max_length)

  def run(self, device_batch) -> float:
    self.state, out = self.step_fn(self.state, device_batch)
    return float(out["loss"])

  def step(self) -> float:
    """Tokenise the next batch, pack, one optimiser step; the loss."""
    return self.run(self.stage1.device_batch(next(self.batches), self.mesh, self.cfg))

  def rows(self, host_batch) -> int:
    """The packed rows `device_batch` gives this batch (a compiled shape)."""
    return self.stage1.device_batch(host_batch, self.mesh, self.cfg)["context_ids"].shape[0]

  def compile_rows(self, examples) -> None:
    """One step on each of `examples` (host batches, one per packed row count)."""
    for example in examples:
      self.run(self.stage1.device_batch(example, self.mesh, self.cfg))

  def cache_size(self) -> int:
    return self.step_fn._cache_size()  # pylint: disable=protected-access


class Theirs:
  """sentence-transformers' MNRL (or its cached variant) on successive batches of `pairs`."""

  def __init__(self, pairs, batch_size: int, max_length: int, cached: bool, chunk_size: int):
    import torch  # pylint: disable=import-outside-toplevel
    from sentence_transformers import SentenceTransformer, losses  # pylint: disable=import-outside-toplevel
    from convfit_jax import hf_io  # pylint: disable=import-outside-toplevel

    self.torch = torch
    self.model = SentenceTransformer(str(hf_io.resolve(hf_io.MINILM)), device="cpu")
    self.model.max_seq_length = max_length
    self.model.train()
    if cached:
      self.loss_fn = losses.CachedMultipleNegativesRankingLoss(self.model, scale=20.0,
                                                               mini_batch_size=chunk_size)
    else:
      self.loss_fn = losses.MultipleNegativesRankingLoss(self.model, scale=20.0)
    self.opt = torch.optim.AdamW(self.model.parameters(), lr=2e-5, weight_decay=0.01)
    self.pairs, self.batch_size, self.k = pairs, batch_size, 0

  def step(self) -> float:
    chunk = self.pairs[self.k * self.batch_size:(self.k + 1) * self.batch_size]
    self.k += 1
    tok = self.model.tokenize
    feats = [tok([p.context for p in chunk]), tok([p.response for p in chunk])]
    loss = self.loss_fn(feats, None)
    loss.backward()
    self.torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
    self.opt.step()
    self.opt.zero_grad()
    return float(loss.detach())


def compare(pairs, args, cached: bool) -> dict[str, float]:
  """Warm both sides up, then `args.steps` interleaved timed steps; the figures."""
  from convfit_jax.data import batching  # pylint: disable=import-outside-toplevel

  ours = Ours(pairs, args.batch_size, args.max_length, args.steps + 20, cached, args.chunk_size)
  theirs = Theirs(pairs, args.batch_size, args.max_length, cached, args.chunk_size)
  # The row counts the warm-up batch and the timed batches pack to, each compiled once.
  host = list(batching.conversation_batches(
      lambda _: pairs, ours.tokenizer, batch_size=args.batch_size, max_length=args.max_length))
  by_rows = {}
  for b in host[:args.steps + 1]:
    by_rows.setdefault(ours.rows(b), b)
  tic = time.perf_counter()
  ours.compile_rows(by_rows.values())
  ours.step()  # batch 0, as theirs' warm-up
  compile_s = time.perf_counter() - tic
  theirs.step()
  cache = ours.cache_size()
  t_ours, t_theirs = [], []
  for i in range(args.steps):
    order = [(ours, t_ours), (theirs, t_theirs)]
    for side, times in (order if i % 2 == 0 else order[::-1]):
      t = time.perf_counter()
      side.step()
      times.append(time.perf_counter() - t)
    print(f"  step {i}: ours {t_ours[-1]:6.2f} s  theirs {t_theirs[-1]:6.2f} s  "
          f"load {os.getloadavg()[0]:.1f}", flush=True)
  if ours.cache_size() != cache:
    print(f"  WARNING: ours compiled during timing ({cache} -> {ours.cache_size()} executables)")
  n = args.steps * args.batch_size
  return {"ours": n / sum(t_ours), "theirs": n / sum(t_theirs),
          "ratio": sum(t_theirs) / sum(t_ours),
          "median_step_ratio": float(np.median(np.asarray(t_theirs) / np.asarray(t_ours))),
          "rows": sorted(by_rows), "warmup_s": compile_s}


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_size", type=int, default=64)
  parser.add_argument("--max_length", type=int, default=48)
  parser.add_argument("--steps", type=int, default=12)
  parser.add_argument("--mode", choices=("plain", "cached", "both"), default="plain")
  parser.add_argument("--chunk_size", type=int, default=32)
  args = parser.parse_args()
  pairs = _pairs(args.batch_size * (args.steps + 1))
  modes = ("plain", "cached") if args.mode == "both" else (args.mode,)
  print(f"machine at start: {harness.machine()}")
  for mode in modes:
    cached = mode == "cached"
    theirs_name = (f"CachedMultipleNegativesRankingLoss(mini_batch_size={args.chunk_size})"
                   if cached else "MultipleNegativesRankingLoss")
    ours_name = f"grad_cache=True, chunk_size={args.chunk_size}" if cached else "grad_cache=False"
    print(f"{mode}: ours {ours_name} vs {theirs_name}")
    r = compare(pairs, args, cached)
    print(f"ours   (convfit_jax, {ours_name}): {r['ours']:8.1f} pairs/s  "
          f"(packed rows {r['rows']} of {args.max_length} tokens, warm-up {r['warmup_s']:.0f} s)")
    print(f"theirs (sentence-transformers {theirs_name}): {r['theirs']:8.1f} pairs/s")
    print(f"ratio ours/theirs: {r['ratio']:.2f}  (median per-step ratio {r['median_step_ratio']:.2f}; "
          f"batch {args.batch_size}, max_length {args.max_length}, {args.steps} timed steps)")
  print(f"machine at the end: {harness.machine()}")


if __name__ == "__main__":
  main()
