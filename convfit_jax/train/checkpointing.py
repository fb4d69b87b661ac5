"""Orbax checkpoints of a `TrainState`: atomic, asynchronous, resumable, multi-host."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from convfit_jax.train.train_state import TrainState


class Checkpointer:
  """Orbax checkpoints of a `TrainState` under `directory`.

  Saves are asynchronous and atomic (orbax writes to a temporary folder and renames
  it), so a run killed mid-save resumes from the previous complete step. Every
  process calls every method: orbax coordinates the multi-host write. Besides the
  arrays, each checkpoint holds a small JSON `meta` dict (the training seconds so
  far), so a resumed run carries on from what the checkpoint says, not from its
  metrics file.

  Args:
    directory: absolute or relative folder (created).
    save_every: save when `step % save_every == 0`; `save(..., force=True)` always saves.
    keep: how many of the latest checkpoints to keep.
  """

  def __init__(self, directory: str | os.PathLike, *, save_every: int, keep: int = 2):
    self.directory = Path(directory).absolute()
    self.save_every = max(save_every, 1)
    # The interval is ours: orbax's own also saves the first step it sees.
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def due(self, step: int) -> bool:
    """Whether `save` would write at `step` without `force`."""
    return step % self.save_every == 0 and step not in self._manager.all_steps()

  def save(self, state: TrainState, *, force: bool = False, meta: dict[str, Any] | None = None
           ) -> bool:
    """Saves when the step is due (or `force`); returns whether it saved."""
    step = int(jax.device_get(state.step))
    if not (force or self.due(step)) or step in self._manager.all_steps():
      return False
    return self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state.arrays()), meta=ocp.args.JsonSave(meta or {})),
        force=True)

  def restore_or_init(self, state: TrainState) -> tuple[TrainState, dict[str, Any]]:
    """The latest checkpoint restored into `state`'s structure and shardings and its meta
    dict, or (`state`, {}) when there is none."""
    step = self._manager.latest_step()
    if step is None:
      return state, {}
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state.arrays())
    restored = self._manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()))
    return state.replace(**restored.state), dict(restored.meta or {})

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()
