"""Device mesh and the shardings of parameters and batches.

One mesh for everything: axis `data` splits batches (and k-NN pools), axis `model`
is there for fully sharded parameters of large encoders (size 1 by default).
Multi-host runs use the same code: the mesh spans every process's devices once
`jax.distributed.initialize()` has run.
"""

from __future__ import annotations

import jax
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
