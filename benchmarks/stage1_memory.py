"""Stage 1 peak host memory (and step time) with and without the gradient cache (CPU).

Run by hand from the repository root:

  python benchmarks/stage1_memory.py [--batch_sizes 64 256] [--chunk_size 32] [--max_length 48]
      [--model sentence-transformers/all-mpnet-base-v2] [--cache_only] [--steps 1]

Each configuration runs in its own subprocess (so peaks do not mix): load the model
(all-MiniLM-L6-v2 by default), build the jitted Stage 1 step, run `--steps` steps on
random token ids (all positions real, the worst case), and report the process's max
RSS (`resource.getrusage`) and, with 2 steps or more, the median seconds of the steps
after the first (which compiles). The first row ("model only") is the same process
without a step: what the parameters, optimiser state and runtime cost before any activation.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time

import harness


def _child(model_name: str, batch_size: int, max_length: int, grad_cache: bool, chunk_size: int,
           steps: int) -> None:
  import jax  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from convfit_jax import sharding  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import batching  # pylint: disable=import-outside-toplevel
  from convfit_jax.models import sentence  # pylint: disable=import-outside-toplevel
  from convfit_jax.models.dual_encoder import DualEncoder  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import optimizer, stage1, trainer, train_state  # pylint: disable=import-outside-toplevel

  model, _ = sentence.load(model_name)
  tx, _ = optimizer.make_optimizer(learning_rate=2e-5, total_steps=10)
  state = train_state.TrainState.create(DualEncoder(model), tx)
  mesh = sharding.make_mesh()
  state = train_state.place(state, sharding.param_shardings(state, mesh))
  cfg = stage1.LossConfig(dropout=True, grad_cache=grad_cache, chunk_size=chunk_size)
  step_fn = trainer.make_train_step(lambda st, b: stage1.state_loss_and_grads(st, b, cfg), mesh)
  rng = np.random.default_rng(0)
  seconds = []
  for _ in range(steps):
    tic = time.perf_counter()
    ids = rng.integers(1000, 30000, size=(2, batch_size, max_length)).astype(np.int32)
    mask = np.ones((batch_size, max_length), np.int32)
    host = batching.ConversationBatch(ids[0], mask, ids[1], mask, np.ones((batch_size,), np.float32))
    state, out = step_fn(state, stage1.device_batch(host, mesh, cfg))
    jax.block_until_ready(out["loss"])
    seconds.append(time.perf_counter() - tic)
  rss_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
  step_s = float(np.median(seconds[1:])) if len(seconds) > 1 else None
  print(json.dumps({"max_rss_gib": rss_gib, "step_seconds": step_s}))


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--batch_sizes", type=int, nargs="+", default=[64, 256])
  parser.add_argument("--chunk_size", type=int, default=32)
  parser.add_argument("--max_length", type=int, default=48)
  parser.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2")
  parser.add_argument("--cache_only", action="store_true", help="skip the runs without grad cache")
  parser.add_argument("--steps", type=int, default=1, help="steps per run (>= 2 also times a step)")
  parser.add_argument("--child", nargs=4, type=int, help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.child:
    b, grad_cache, steps, chunk = args.child
    _child(args.model, b, args.max_length, bool(grad_cache), chunk, steps)
    return
  env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
  runs = [("model only", 64, 0, 0)] + [
      (f"batch {b}, {'grad cache (chunk %d)' % args.chunk_size if gc else 'no grad cache'}", b, gc,
       args.steps) for b in args.batch_sizes for gc in ((1,) if args.cache_only else (0, 1))]
  print(f"| configuration ({args.model.rsplit('/', 1)[-1]}, max_length {args.max_length}) "
        "| peak RSS (GiB) | s/step |")
  print("|---|---|---|")
  for name, b, gc, steps in runs:
    cmd = [sys.executable, __file__, "--max_length", str(args.max_length), "--model", args.model,
           "--child", str(b), str(gc), str(steps), str(args.chunk_size)]
    try:
      result, _ = harness.run_worker(cmd, env=env)
    except RuntimeError as e:  # an out-of-memory configuration is a row, not the end
      print(f"| {name} | failed: {str(e).strip().splitlines()[-1]} | |")
      continue
    step = "–" if result["step_seconds"] is None else f"{result['step_seconds']:.1f}"
    print(f"| {name} | {result['max_rss_gib']:.2f} | {step} |", flush=True)


if __name__ == "__main__":
  main()
