"""The training loop both stages run: steps, timing, NaN guard, logging, checkpoints."""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator

import jax
import numpy as np
import optax

from convfit_jax.train import state as state_lib


def fit(state: state_lib.TrainState, step_fn: Callable, batches: Iterator[Any], *,
        total_steps: int, pairs_per_step: int, schedule: optax.Schedule,
        workdir: state_lib.Workdir, checkpointer: state_lib.Checkpointer, log_every: int,
        to_device: Callable[[Any], Any],
        batch_rows: Callable[[Any], np.ndarray] | None = None,
        eval_every: int = 0, evaluate: Callable[[state_lib.TrainState, int], Any] | None = None,
        ) -> tuple[state_lib.TrainState, float]:
  """Runs `step_fn` from `state.step` to `total_steps`; returns (state, seconds spent training).

  Args:
    state: the (possibly restored) train state.
    step_fn: jitted `(state, device_batch) -> (state, {"loss": ..., ...})`.
    batches: host batches starting at `state.step`.
    total_steps: the step to stop at.
    pairs_per_step: training pairs per step, for the pairs/second figure.
    schedule: the learning-rate schedule, logged.
    to_device: host batch -> what `step_fn` takes (e.g. global sharded arrays).
    batch_rows: host batch -> dataset rows, named when the loss is NaN.
    eval_every, evaluate: called as `evaluate(state, step)` every `eval_every` steps
      (not at the last step: callers evaluate the final state themselves).
  Timed: data wait + step; checkpoint saves and evaluation are not training time.
  """
  start = int(jax.device_get(state.step))
  bar = state_lib.progress_bar(total_steps, initial=start)
  train_seconds = window_seconds = 0.0
  window_pairs = 0
  for step in range(start + 1, total_steps + 1):
    tic = time.perf_counter()
    host_batch = next(batches)
    state, out = step_fn(state, to_device(host_batch))
    loss = float(out["loss"])  # syncs; the NaN guard and the bar need it anyway
    elapsed = time.perf_counter() - tic
    rows = None if batch_rows is None else batch_rows(host_batch)
    state_lib.check_finite(loss, step, rows)
    if "grad_norm" in out:  # a loss over selected pairs (ocl) can stay finite on NaN weights
      state_lib.check_finite(float(out["grad_norm"]), step, rows, what="gradient norm")
    train_seconds += elapsed
    window_seconds += elapsed
    window_pairs += pairs_per_step
    bar.update(1)
    if step % log_every == 0 or step == total_steps:
      pairs_s = window_pairs / max(window_seconds, 1e-9)
      bar.set_postfix(loss=f"{loss:.4f}", pairs_s=f"{pairs_s:.1f}")
      scalars = {"train/loss": loss, "train/learning_rate": float(schedule(step - 1)),
                 "train/pairs_per_second": pairs_s}
      scalars.update({f"train/{k}": float(v) for k, v in out.items() if k != "loss"})
      workdir.write_scalars(step, scalars)
      window_seconds, window_pairs = 0.0, 0
    checkpointer.save(state)
    if evaluate is not None and eval_every and step % eval_every == 0 and step != total_steps:
      evaluate(state, step)
  bar.close()
  checkpointer.save(state, force=True)
  return state, train_seconds
