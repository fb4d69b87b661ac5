"""Stage 2 step time per objective and compute dtype: the paper's pairs against label
batches, float32 against bfloat16, same run.

Run by hand from the repository root (idle machine; nothing else running):

  python benchmarks/stage2_objectives.py [--objectives ocl+dense_ocl+dense_cos+supcon]
      [--dtypes float32 bfloat16] [--steps 20] [--dataset banking77] [--shots 10]

Each objective is the Stage 2 task as `configs/stage2.py` builds it (all-MiniLM-L6-v2,
32 pairs a step for the paper's sparse pairs, 16 intents x 4 utterances for the dense
objectives: at most 64 sentences a step either way), stepped by the trainer's own jitted
train step on the task's own packed batches. After two warm-up steps per objective (the
compile), the objectives take turns step by step, so background load falls on all alike.
`--dtypes` runs each objective at each compute dtype (`model.dtype`: parameters, gradients
and optimiser state stay float32; products in that dtype, accumulated in float32).
Prints per objective and dtype the median step time, the real sentences a step encodes, the pairs
its loss scores, both per second, and the step time relative to the first objective.
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import harness
import numpy as np


def _task(objective: str, dtype: str, dataset: str, shots: int, steps: int):
  import jax  # pylint: disable=import-outside-toplevel
  from convfit_jax import sharding  # pylint: disable=import-outside-toplevel
  from convfit_jax.configs import stage2 as settings  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import stage2, trainer  # pylint: disable=import-outside-toplevel
  config = settings.get_config(f"dataset={dataset},shots={shots}")
  config.train.sampler, config.train.loss = settings.parse_objective(objective)
  config.train.max_steps = steps
  config.train.learning_rate = 1e-4
  config.model.dtype = dtype
  mesh = sharding.make_mesh(1)
  task = stage2.Stage2(config, mesh)
  state, _ = trainer.init_state(config, task.built.model, task.total_steps, mesh)
  step_fn = trainer.make_train_step(task.loss_and_grads, mesh)
  batches = task.batches(0)

  def scored(batch) -> tuple[int, int]:
    """(real sentences encoded, pairs the loss scores) of a host batch."""
    if task.dense:
      n = int((batch.weights > 0).sum())
      return len(np.unique(batch.sentence_ids[batch.weights > 0])), n * (n - 1) // 2
    real = batch.weights > 0
    used = np.unique(np.concatenate([batch.u_idx[real], batch.v_idx[real]]))
    return len(used), int(real.sum())

  def step(state_):
    batch = next(batches)
    start = time.perf_counter()
    state_, out = step_fn(state_, task.device_batch(batch))
    jax.block_until_ready(out["loss"])
    return state_, time.perf_counter() - start, scored(batch)

  return step, state


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--objectives", default="ocl+dense_ocl+dense_cos+supcon")
  parser.add_argument("--dtypes", nargs="+", default=["float32"])
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--dataset", default="banking77")
  parser.add_argument("--shots", type=int, default=10)
  args = parser.parse_args()
  runs_of = [(o, d) for o in args.objectives.split("+") for d in args.dtypes]
  names = [o if d == "float32" else f"{o} {d}" for o, d in runs_of]
  runs = {}
  for name, (objective, dtype) in zip(names, runs_of):
    step, state = _task(objective, dtype, args.dataset, args.shots, args.steps + 2)
    for _ in range(2):
      state, _, _ = step(state)
    runs[name] = [step, state, []]
  for _ in range(args.steps):
    for name in names:
      step, state, record = runs[name]
      runs[name][1], seconds, counts = step(state)
      record.append((seconds, *counts))
  print(f"{args.dataset} {args.shots or 'full'}-shot, all-MiniLM-L6-v2, {args.steps} timed steps each; "
        f"at the end {harness.machine()}")
  print("| objective (compute dtype) | median step ms | sentences a step | pairs scored a step | sentences/s | "
        f"pairs scored/s | step time / {names[0]} |")
  print("|---|---|---|---|---|---|---|")
  base = None
  for name in names:
    rec = np.array(runs[name][2], np.float64)
    ms = 1000 * np.median(rec[:, 0])
    base = base or ms
    total = rec[:, 0].sum()
    print(f"| {name} | {ms:.0f} | {rec[:, 1].mean():.1f} | {rec[:, 2].mean():.0f} | "
          f"{rec[:, 1].sum() / total:.1f} | {rec[:, 2].sum() / total:.0f} | {ms / base:.2f} |")


if __name__ == "__main__":
  main()
