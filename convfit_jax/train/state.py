"""What every training loop shares: optimiser, train state, checkpoints, logging.

Stage 1 and Stage 2 both build on this module:

  - `make_optimizer`: AdamW with linear warm-up then linear decay to 0, no weight
    decay on biases and LayerNorm parameters (as sentence-transformers / HF
    Trainer), optional global-norm clipping.
  - `TrainState`: a pytree of plain arrays (parameters as a pure dict from
    `nnx.split`, optimiser state, step, PRNG key); the NNX graph definition and
    the optimiser ride along as static fields, so `jax.jit` sees only arrays.
  - `Checkpointer`: an orbax `CheckpointManager` (atomic saves, keep the last k,
    every N steps and at the end); `restore_or_init` resumes the latest step of a
    workdir, so rerunning the same command continues the run (and does nothing
    more when it had finished).
  - `check_finite`: stops a run on a NaN/inf loss, naming the step and batch.
  - `Workdir`: config.json, metrics.json and TensorBoard scalars (tensorboardX, no
    TensorFlow), written by process 0 only; `progress_bar` shows loss and pairs/s.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.experimental import multihost_utils

PyTree = Any

# --------------------------------------------------------------------------- optimiser


def warmup_steps_for(total_steps: int, warmup_fraction: float) -> int:
  """ceil(fraction * total), as sentence-transformers' `fit` computes it."""
  return int(math.ceil(total_steps * warmup_fraction))


def linear_warmup_decay(peak_lr: float, total_steps: int, warmup_fraction: float) -> optax.Schedule:
  """0 -> peak_lr linearly over the warm-up steps, then linearly to 0 at `total_steps`.

  The same curve as transformers' `get_linear_schedule_with_warmup`.
  """
  if total_steps < 1:
    raise ValueError(f"total_steps must be >= 1, got {total_steps}")
  warmup = min(warmup_steps_for(total_steps, warmup_fraction), total_steps)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak_lr, warmup),
       optax.linear_schedule(peak_lr, 0.0, total_steps - warmup)],
      boundaries=[warmup])


def _is_no_decay(path: Sequence[Any]) -> bool:
  names = [str(getattr(k, "key", getattr(k, "idx", k))) for k in path]
  # NNX names LayerNorm parameters `scale`/`bias` under a module whose name holds
  # "norm"; every `bias` (Dense, LayerNorm) is exempt too, as HF's
  # no_decay = ["bias", "LayerNorm.weight"].
  return names[-1] == "bias" or any("norm" in n.lower() for n in names[:-1])


def weight_decay_mask(params: PyTree) -> PyTree:
  """True where AdamW applies weight decay: not on biases, not on LayerNorm parameters."""
  return jax.tree_util.tree_map_with_path(lambda path, _: not _is_no_decay(path), params)


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_fraction: float = 0.1,
                   weight_decay: float = 0.01, clip_norm: float | None = None,
                   b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
  """AdamW with the warm-up/decay schedule; returns (transformation, schedule).

  Args:
    learning_rate: peak learning rate.
    total_steps: optimiser steps of the whole run (the decay reaches 0 there).
    warmup_fraction: share of `total_steps` spent warming up.
    weight_decay: decoupled weight decay, masked by `weight_decay_mask`.
    clip_norm: global gradient-norm clipping threshold; None or <= 0 disables it.
  """
  schedule = linear_warmup_decay(learning_rate, total_steps, warmup_fraction)
  adamw = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                      mask=weight_decay_mask)
  if clip_norm is not None and clip_norm > 0:
    return optax.chain(optax.clip_by_global_norm(clip_norm), adamw), schedule
  return adamw, schedule


# --------------------------------------------------------------------------- train state


@flax.struct.dataclass
class TrainState:
  """The whole mutable state of a run, as a pytree of arrays.

  Attributes:
    step: int32 scalar, optimiser steps taken.
    params: the model's `nnx.Param`s as a pure nested dict of float32 arrays.
    opt_state: optax state for `params`.
    rng: uint32[2] PRNG key the step keys are folded from.
    graphdef: static NNX graph definition; `model()` merges it with `params`.
    tx: static optax transformation.
  """

  step: jax.Array
  params: PyTree
  opt_state: PyTree
  rng: jax.Array
  graphdef: nnx.GraphDef = flax.struct.field(pytree_node=False)
  tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)

  @classmethod
  def create(cls, model: nnx.Module, tx: optax.GradientTransformation, seed: int = 0) -> "TrainState":
    """Splits `model` into graphdef + parameters; the model must hold only `nnx.Param`s."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    if jax.tree.leaves(rest):
      raise ValueError("TrainState holds parameters only; the model has other state: "
                       f"{sorted(set(type(v).__name__ for v in jax.tree.leaves(rest)))}")
    params = nnx.to_pure_dict(params)
    return cls(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
               rng=jax.random.PRNGKey(seed), graphdef=graphdef, tx=tx)

  def model(self, params: PyTree | None = None) -> nnx.Module:
    """The NNX module with `params` (default: this state's)."""
    return nnx.merge(self.graphdef, self.params if params is None else params)

  def host_params(self) -> PyTree:
    """The parameters on this process's first local device: for evaluating and exporting
    outside the sharded step. Every process must call it: parameters sharded over a
    `model` axis that spans processes are all-gathered first."""
    return jax.device_put(multihost_utils.process_allgather(self.params, tiled=True),
                          jax.local_devices()[0])

  def step_key(self) -> jax.Array:
    """A PRNG key unique to this step (dropout); the same on every process."""
    return jax.random.fold_in(self.rng, self.step)

  def apply_gradients(self, grads: PyTree) -> "TrainState":
    updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
    return self.replace(step=self.step + 1, params=optax.apply_updates(self.params, updates),
                        opt_state=opt_state)

  def arrays(self) -> dict[str, PyTree]:
    """What a checkpoint holds."""
    return {"step": self.step, "params": self.params, "opt_state": self.opt_state, "rng": self.rng}


def place(state: TrainState, sharding) -> TrainState:
  """Puts every array of `state` on `sharding`: one sharding for all, or a tree of them
  matching `state` (e.g. `convfit_jax.sharding.param_shardings(state, mesh)`)."""
  return jax.device_put(state, sharding)


# --------------------------------------------------------------------------- checkpoints


class Checkpointer:
  """Orbax checkpoints of a `TrainState` under `directory`.

  Saves are asynchronous and atomic (orbax writes to a temporary folder and renames
  it), so a run killed mid-save resumes from the previous complete step. Every
  process calls every method: orbax coordinates the multi-host write.

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

  def save(self, state: TrainState, *, force: bool = False) -> bool:
    """Saves when the step is due (or `force`); returns whether it saved."""
    step = int(jax.device_get(state.step))
    if (not force and step % self.save_every) or step in self._manager.all_steps():
      return False
    return self._manager.save(step, args=ocp.args.StandardSave(state.arrays()), force=True)

  def restore_or_init(self, state: TrainState) -> TrainState:
    """The latest checkpoint restored into `state`'s structure and shardings, or `state`."""
    step = self._manager.latest_step()
    if step is None:
      return state
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, state.arrays())
    restored = self._manager.restore(step, args=ocp.args.StandardRestore(target))
    return state.replace(**restored)

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()


# --------------------------------------------------------------------------- NaN guard


class NonFiniteLossError(FloatingPointError):
  """The loss became NaN or infinite; the message names the step (and batch)."""


def check_finite(loss: float, step: int, batch_indices: Sequence[int] | np.ndarray | None = None,
                 what: str = "loss") -> None:
  """Raises `NonFiniteLossError` when `loss` is NaN or +-inf.

  Args:
    loss: the step's loss, a host float.
    step: the step that produced it (1-based: after `step` optimiser updates).
    batch_indices: dataset rows of the batch, named in the message when given.
  """
  if math.isfinite(loss):
    return
  msg = f"{what} is {loss} at step {step}"
  if batch_indices is not None:
    idx = np.asarray(batch_indices).tolist()
    msg += f"; batch indices {idx[:64]}" + (f" ... ({len(idx)} rows)" if len(idx) > 64 else "")
  raise NonFiniteLossError(msg + ". Lower the learning rate, enable clip_norm, or check these rows.")


# --------------------------------------------------------------------------- workdir


def is_main_process() -> bool:
  return jax.process_index() == 0


def _json_default(obj):
  if isinstance(obj, (np.floating, np.integer)):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  return str(obj)


def write_json(path: str | os.PathLike, obj: Any) -> None:
  """Atomic JSON write (temporary file + rename)."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(path.suffix + ".tmp")
  with open(tmp, "w", encoding="utf-8") as f:
    json.dump(obj, f, indent=2, sort_keys=True, default=_json_default)
    f.write("\n")
  os.replace(tmp, path)


class Workdir:
  """A run's folder: config.json, metrics.json, tensorboard/, checkpoints/.

  Writes happen on process 0 only; other processes get no-ops, so callers need
  no `if` of their own. Metrics accumulate: `update_metrics` merges into the
  existing metrics.json, so a resumed run keeps its "before" figures.
  """

  def __init__(self, path: str | os.PathLike):
    self.path = Path(path).absolute()
    self.main = is_main_process()
    self._tb = None
    if self.main:
      self.path.mkdir(parents=True, exist_ok=True)

  @property
  def checkpoint_dir(self) -> Path:
    return self.path / "checkpoints"

  @property
  def metrics_path(self) -> Path:
    return self.path / "metrics.json"

  def write_config(self, config) -> None:
    """The resolved config (an ml_collections.ConfigDict or a mapping) as config.json."""
    if not self.main:
      return
    as_dict = config.to_dict() if hasattr(config, "to_dict") else dict(config)
    write_json(self.path / "config.json", as_dict)

  def read_metrics(self) -> dict[str, Any]:
    if self.metrics_path.exists():
      with open(self.metrics_path, encoding="utf-8") as f:
        return json.load(f)
    return {}

  def update_metrics(self, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Merges `metrics` into metrics.json; returns the merged dict."""
    merged = {**self.read_metrics(), **metrics}
    if self.main:
      write_json(self.metrics_path, merged)
    return merged

  def write_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
    """TensorBoard scalars under tensorboard/ (tensorboardX event files)."""
    if not self.main:
      return
    if self._tb is None:
      from tensorboardX import SummaryWriter  # pylint: disable=import-outside-toplevel
      self._tb = SummaryWriter(str(self.path / "tensorboard"))
    for name, value in scalars.items():
      self._tb.add_scalar(name, float(value), int(step))

  def close(self) -> None:
    if self._tb is not None:
      self._tb.flush()
      self._tb.close()
      self._tb = None


def progress_bar(total: int, initial: int = 0, desc: str = "train"):
  """tqdm over steps, shown on process 0 only; update it with `set_postfix(loss=, pairs_s=)`."""
  from tqdm.auto import tqdm  # pylint: disable=import-outside-toplevel
  return tqdm(total=total, initial=initial, desc=desc, disable=not is_main_process(),
              dynamic_ncols=True, smoothing=0.1)


def count_params(params: PyTree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))

