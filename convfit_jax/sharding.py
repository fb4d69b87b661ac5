"""Device mesh and the shardings of parameters and batches.

One mesh for everything: axis `data` splits batches (and k-NN pools), axis `model`
shards parameters and optimiser state FSDP-style (`param_shardings`; size 1, i.e.
replicated, by default).
Multi-host runs use the same code: the mesh spans every process's devices once
`jax.distributed.initialize()` has run.
"""

from __future__ import annotations

import math
import os
from typing import Any, Mapping

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

DATA = "data"
MODEL = "model"


def make_mesh(model_parallel: int = 1, devices=None) -> Mesh:
  """A (data, model) mesh over all (or the given) devices.

  Args:
    model_parallel: size of the `model` axis; must divide the device count.
    devices: defaults to `jax.devices()` (all processes).
  """
  devices = jax.devices() if devices is None else list(devices)
  n = len(devices)
  if model_parallel < 1 or n % model_parallel:
    raise ValueError(f"model_parallel={model_parallel} must divide the {n} devices")
  # Auto axes: XLA (GSPMD) propagates shardings and inserts the collectives, so a
  # similarity matrix of a batch sharded over `data` gathers its columns by itself.
  return jax.make_mesh((n // model_parallel, model_parallel), (DATA, MODEL), devices=devices,
                       axis_types=(AxisType.Auto, AxisType.Auto))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis split over `data`, the rest replicated."""
  return NamedSharding(mesh, P(DATA))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


# Arrays below this many elements stay replicated: sharding a bias or a LayerNorm
# scale saves nothing worth an all-gather per use.
MIN_SHARDED_SIZE = 2**14


def param_shardings(tree: Any, mesh: Mesh, min_size: int = MIN_SHARDED_SIZE) -> Any:
  """FSDP (ZeRO-3) shardings over the `model` axis for a pytree of arrays.

  Each array of at least `min_size` elements is split over `model` along its largest
  dimension that the axis size divides (the first such on ties); smaller arrays, those
  no dimension of which divides, and all arrays when the axis has size 1 are
  replicated. Every array is replicated over `data`. Under `jax.jit` with the mesh's
  Auto axes, XLA all-gathers each weight where a layer uses it and reduce-scatters
  its gradient, so a device holds 1/N of the parameters and AdamW moments.

  Args:
    tree: arrays (or anything with `.shape`: tracers, ShapeDtypeStructs), e.g. a
      whole `TrainState`; only shapes are read, so it works inside `jax.jit` too.
    mesh: a mesh from `make_mesh`.
    min_size: arrays with fewer elements stay replicated.

  Returns:
    The same structure with a `NamedSharding` in place of each array.
  """
  n = mesh.shape[MODEL]

  def one(x) -> NamedSharding:
    shape = np.shape(x)
    if n > 1 and math.prod(shape) >= min_size:
      for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % n == 0:
          return NamedSharding(mesh, P(*(MODEL if d == dim else None for d in range(len(shape)))))
    return replicated(mesh)

  return jax.tree.map(one, tree)


def global_batch(local: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
  """This process's contiguous slice of a batch -> global arrays sharded over `data`.

  With P processes each holding rows [p*n/P, (p+1)*n/P) of every array, the result
  is the global batch a single process would have built; on one process it is a
  plain `device_put` with the batch sharding.
  """
  sh = batch_sharding(mesh)
  return {k: jax.make_array_from_process_local_data(sh, np.asarray(v)) for k, v in local.items()}


def process_max(value: int) -> int:
  """The largest of every process's `value` (itself on one process): how processes agree
  on a shape that depends on their own data."""
  if jax.process_count() == 1:
    return int(value)
  return int(np.max(multihost_utils.process_allgather(np.int32(value))))


def initialize_distributed(config=None) -> None:
  """Starts `jax.distributed` when this run is multi-process, once.

  `config` (a `distributed` ConfigDict with coordinator_address, num_processes,
  process_id) or the env vars JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES,
  JAX_PROCESS_ID name the cluster explicitly; with none of them, SLURM (srun with
  several tasks) and multi-host Cloud TPU VMs are detected by JAX itself. A
  single-process run does nothing.
  """
  if jax.distributed.is_initialized():
    return
  get = (lambda k, default: default) if config is None else config.get
  address = get("coordinator_address", "") or os.environ.get("JAX_COORDINATOR_ADDRESS", "")
  num = get("num_processes", 0) or int(os.environ.get("JAX_NUM_PROCESSES", "0"))
  pid = get("process_id", -1)
  pid = pid if pid >= 0 else int(os.environ.get("JAX_PROCESS_ID", "-1"))
  if address:
    jax.distributed.initialize(coordinator_address=address, num_processes=num or None,
                               process_id=pid if pid >= 0 else None)
    return
  slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ
  tpu_pod = "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if slurm or tpu_pod:
    jax.distributed.initialize()
