"""Stage 1 peak host memory with and without the gradient cache (MiniLM, CPU).

Run by hand from the repository root:

  python benchmarks/stage1_memory.py [--batch_sizes 64 256] [--chunk_size 32] [--max_length 48]

Each configuration runs in its own subprocess (so peaks do not mix): load
all-MiniLM-L6-v2, build the jitted Stage 1 step, run 1 step on random token ids
(all positions real, the worst case), and report the process's max RSS
(`resource.getrusage`). The first row ("model only") is the same process without
a step: what the parameters, optimiser state and runtime cost before any activation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys


def _child(batch_size: int, max_length: int, grad_cache: bool, chunk_size: int, steps: int) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from convfit_jax import hf_io, sharding  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import batching  # pylint: disable=import-outside-toplevel
  from convfit_jax.models import sentence  # pylint: disable=import-outside-toplevel
  from convfit_jax.models.dual_encoder import DualEncoder  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import optimizer, stage1, trainer, train_state  # pylint: disable=import-outside-toplevel

  model, _ = sentence.load(hf_io.MINILM)
  tx, _ = optimizer.make_optimizer(learning_rate=2e-5, total_steps=10)
  state = train_state.TrainState.create(DualEncoder(model), tx)
  mesh = sharding.make_mesh()
  state = train_state.place(state, sharding.param_shardings(state, mesh))
  cfg = stage1.LossConfig(dropout=True, grad_cache=grad_cache, chunk_size=chunk_size)
  step_fn = trainer.make_train_step(lambda st, b: stage1.state_loss_and_grads(st, b, cfg), mesh)
  rng = np.random.default_rng(0)
  for _ in range(steps):
    ids = rng.integers(1000, 30000, size=(2, batch_size, max_length)).astype(np.int32)
    mask = np.ones((batch_size, max_length), np.int32)
    host = batching.ConversationBatch(ids[0], mask, ids[1], mask, np.ones((batch_size,), np.float32))
    state, out = step_fn(state, stage1.device_batch(host, mesh, cfg))
    jax.block_until_ready(out["loss"])
  rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  print(json.dumps({"max_rss_gib": rss_gib}))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_sizes", type=int, nargs="+", default=[64, 256])
  parser.add_argument("--chunk_size", type=int, default=32)
  parser.add_argument("--max_length", type=int, default=48)
  parser.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    b, grad_cache, steps, chunk = args.child
    _child(b, args.max_length, bool(grad_cache), chunk, steps)
    return
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
  runs = [("model only", 64, 0, 0)] + [
      (f"batch {b}, {'grad cache (chunk %d)' % args.chunk_size if gc else 'no grad cache'}", b, gc, 1)
      for b in args.batch_sizes for gc in (0, 1)]
  print(f"| configuration (MiniLM, max_length {args.max_length}) | peak RSS (GiB) |")
  print("|---|---|")
  for name, b, gc, steps in runs:
    cmd = [sys.executable, __file__, "--max_length", str(args.max_length),
           "--child", str(b), str(gc), str(steps), str(args.chunk_size)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if out.returncode != 0:
      print(f"| {name} | failed (exit {out.returncode}): {out.stderr.strip().splitlines()[-1:]} |")
      continue
    rss = json.loads(out.stdout.strip().splitlines()[-1])["max_rss_gib"]
    print(f"| {name} | {rss:.2f} |", flush=True)


if __name__ == "__main__":
  main()
