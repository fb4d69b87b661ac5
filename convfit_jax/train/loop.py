"""The training loop every task runs: steps, the NaN guard, window-mean logging, checkpoints.

The host does not wait for a step to finish: each step's outputs (loss, gradient
norm, ...) are summed on the device, and the host reads the sums once per window
(every `log_every` steps, and before every checkpoint and evaluation), so XLA runs
ahead of the host as far as the data allows. The NaN guard checks those sums: a
NaN or infinite value in any step of the window makes its sum non-finite, and the
error names the window's steps and the dataset rows of its batches. A checkpoint
is only saved after its window has been checked.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import logging

from convfit_jax.train.checkpointing import Checkpointer
from convfit_jax.train.train_state import TrainState
from convfit_jax.train.workdir import FILE_ONLY, Workdir, progress_bar


class NonFiniteLossError(FloatingPointError):
  """The loss (or gradient norm) became NaN or infinite; the message names the steps and rows."""


def check_finite(value: float, step: int, batch_indices: Sequence[int] | np.ndarray | None = None,
                 what: str = "loss", first_step: int | None = None) -> None:
  """Raises `NonFiniteLossError` when `value` is NaN or +-inf.

  Args:
    value: a host float: one step's value, or a window's sum.
    step: the (last) step that produced it (1-based: after `step` optimiser updates).
    batch_indices: dataset rows of the batch(es), named in the message when given.
    what: what `value` is, for the message.
    first_step: the window's first step, when `value` sums steps first_step..step.
  """
  if math.isfinite(value):
    return
  where = f"step {step}" if first_step in (None, step) else f"steps {first_step}-{step}"
  msg = f"{what} is {value} at {where}"
  if batch_indices is not None:
    idx = np.asarray(batch_indices).tolist()
    msg += f"; batch indices {idx[:64]}" + (f" ... ({len(idx)} rows)" if len(idx) > 64 else "")
  raise NonFiniteLossError(msg + ". Lower the learning rate, enable clip_norm, or check these rows.")


def fit(state: TrainState, step_fn: Callable, batches: Iterator[Any], *,
        total_steps: int, examples_per_step: int, schedule: optax.Schedule,
        workdir: Workdir, checkpointer: Checkpointer, log_every: int,
        to_device: Callable[[Any], Any],
        batch_rows: Callable[[Any], np.ndarray] | None = None,
        eval_due: Callable[[int], bool] | None = None,
        evaluate: Callable[[TrainState, int], Any] | None = None,
        train_seconds: float = 0.0, examples_name: str = "pairs",
        show_progress: bool = True) -> tuple[TrainState, float]:
  """Runs `step_fn` from `state.step` to `total_steps`; returns (state, seconds spent training).

  Args:
    state: the (possibly restored) train state.
    step_fn: jitted `(state, device_batch) -> (state, {"loss": ..., "grad_norm": ...})`,
      every output a float32 scalar.
    batches: host batches starting at `state.step`.
    total_steps: the step to stop at.
    examples_per_step: training examples per step, for the examples/second figure.
    schedule: the learning-rate schedule, logged.
    to_device: host batch -> what `step_fn` takes (e.g. global sharded arrays).
    batch_rows: host batch -> dataset rows (or None), named when the window's loss is NaN.
    eval_due, evaluate: `evaluate(state, step)` runs after each step where `eval_due(step)`
      (not at the last step: callers evaluate the final state themselves).
    train_seconds: seconds already spent (a resumed run), added to; saved with each
      checkpoint as meta {"train_seconds": ...}.
    examples_name: what an example is ("pairs", "sentences"), naming that figure.
    show_progress: the tqdm bar (process 0).
  Logged every window (TensorBoard and the progress bar): the window means of every
  output of `step_fn` (`train/loss`, `train/grad_norm`), the learning rate, examples/s
  (`train/<examples_name>_per_second`).
  Timed: data wait, steps and the window's read-back; checkpoints and evaluation are not.
  """
  start = int(jax.device_get(state.step))
  bar = progress_bar(total_steps, initial=start, show=show_progress)
  sums, rows, first = None, [], start + 1
  tic = time.perf_counter()
  for step in range(start + 1, total_steps + 1):
    host_batch = next(batches)
    state, out = step_fn(state, to_device(host_batch))
    sums = out if sums is None else jax.tree.map(jnp.add, sums, out)  # stays on the device
    step_rows = None if batch_rows is None else batch_rows(host_batch)
    if step_rows is not None:
      rows.append(np.asarray(step_rows))
    bar.update(1)
    due_eval = evaluate is not None and eval_due is not None and eval_due(step) and step != total_steps
    if not (step % log_every == 0 or step == total_steps or checkpointer.due(step) or due_eval):
      continue
    totals = {k: float(v) for k, v in jax.device_get(sums).items()}  # the window's one sync
    elapsed = time.perf_counter() - tic
    train_seconds += elapsed
    window_rows = np.concatenate(rows) if rows else None
    for key, what in (("loss", "loss"), ("grad_norm", "gradient norm")):
      # A loss over selected pairs (ocl) can stay finite on NaN weights; the norm cannot.
      if key in totals:
        check_finite(totals[key], step, window_rows, what=what, first_step=first)
    n = step - first + 1
    means = {f"train/{k}": v / n for k, v in totals.items()}
    rate = n * examples_per_step / max(elapsed, 1e-9)
    bar.set_postfix({"loss": f"{means['train/loss']:.4f}", f"{examples_name}/s": f"{rate:.1f}"})
    workdir.write_scalars(step, {**means, "train/learning_rate": float(schedule(step - 1)),
                                 f"train/{examples_name}_per_second": rate})
    # A loss of named parts (contrast + head, ...) shows each beside the total.
    parts = "".join(f", {k} {v / n:.4f}" for k, v in totals.items() if k not in ("loss", "grad_norm"))
    logging.info("steps %d-%d: loss %.4f%s, %.1f %s/s", first, step, means["train/loss"], parts,
                 rate, examples_name, extra=FILE_ONLY)
    checkpointer.save(state, meta={"train_seconds": train_seconds})
    if due_eval:
      evaluate(state, step)
    sums, rows, first = None, [], step + 1
    tic = time.perf_counter()
  bar.close()
  checkpointer.save(state, force=True, meta={"train_seconds": train_seconds})
  return state, train_seconds
