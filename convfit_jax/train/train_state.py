"""The train state: parameters, model state beyond parameters, optimiser state, step, key.

A pytree of plain arrays; the NNX graph definition and the optax transformation
ride along as static fields, so `jax.jit` sees only arrays and orbax saves them
(`train.checkpointing`).
"""

from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.experimental import multihost_utils

PyTree = Any


@flax.struct.dataclass
class TrainState:
  """The whole mutable state of a run.

  Attributes:
    step: int32 scalar, optimiser steps taken.
    params: the model's `nnx.Param`s as a pure nested dict of float32 arrays; what
      the optimiser updates.
    model_state: every other variable the model keeps (BatchNorm running statistics,
      anything `nnx` holds that is not a parameter) as a pure nested dict; updated by
      the forward pass in train mode, read in eval mode, checkpointed with the rest.
      Empty for the Transformer encoders.
    opt_state: optax state for `params`.
    rng: uint32[2] PRNG key the step keys are folded from.
    graphdef: static NNX graph definition; `model()` merges it with the arrays.
    tx: static optax transformation.
  """

  step: jax.Array
  params: PyTree
  model_state: PyTree
  opt_state: PyTree
  rng: jax.Array
  graphdef: nnx.GraphDef = flax.struct.field(pytree_node=False)
  tx: optax.GradientTransformation = flax.struct.field(pytree_node=False)

  @classmethod
  def create(cls, model: nnx.Module, tx: optax.GradientTransformation, seed: int = 0) -> "TrainState":
    """Splits `model` into graphdef, parameters and the rest of its state."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    params = nnx.to_pure_dict(params)
    return cls(step=jnp.zeros((), jnp.int32), params=params, model_state=nnx.to_pure_dict(rest),
               opt_state=tx.init(params), rng=jax.random.PRNGKey(seed), graphdef=graphdef, tx=tx)

  def model(self, params: PyTree | None = None, model_state: PyTree | None = None) -> nnx.Module:
    """The NNX module with `params` and `model_state` (default: this state's)."""
    return merge(self.graphdef, self.params if params is None else params,
                 self.model_state if model_state is None else model_state)

  def host_arrays(self) -> tuple[PyTree, PyTree]:
    """(params, model_state) on this process's first local device: for evaluating and
    exporting outside the sharded step. Every process must call it: arrays sharded over
    a `model` axis that spans processes are all-gathered first."""
    return jax.device_put(
        multihost_utils.process_allgather((self.params, self.model_state), tiled=True),
        jax.local_devices()[0])

  def host_model(self) -> nnx.Module:
    """The model on this process's first local device (`host_arrays`), in eval mode."""
    model = merge(self.graphdef, *self.host_arrays())
    model.eval()
    return model

  def step_key(self) -> jax.Array:
    """A PRNG key unique to this step (dropout); the same on every process."""
    return jax.random.fold_in(self.rng, self.step)

  def apply_gradients(self, grads: PyTree, model_state: PyTree | None = None) -> "TrainState":
    """One optimiser step; `model_state`, when given, replaces the model's other state."""
    updates, opt_state = self.tx.update(grads, self.opt_state, self.params)
    return self.replace(step=self.step + 1, params=optax.apply_updates(self.params, updates),
                        opt_state=opt_state,
                        model_state=self.model_state if model_state is None else model_state)

  def arrays(self) -> dict[str, PyTree]:
    """What a checkpoint holds."""
    return {"step": self.step, "params": self.params, "model_state": self.model_state,
            "opt_state": self.opt_state, "rng": self.rng}


def merge(graphdef: nnx.GraphDef, params: PyTree, model_state: PyTree) -> nnx.Module:
  """The module of `graphdef` with pure-dict `params` and `model_state` filled in."""
  return nnx.merge(graphdef, params, model_state)


def model_state_of(model: nnx.Module) -> PyTree:
  """Everything `model` keeps that is not an `nnx.Param`, as a pure dict (what a forward
  pass in train mode may have updated)."""
  return nnx.to_pure_dict(nnx.state(model, nnx.Not(nnx.Param)))


def place(state: TrainState, sharding) -> TrainState:
  """Puts every array of `state` on `sharding`: one sharding for all, or a tree of them
  matching `state` (e.g. `convfit_jax.sharding.param_shardings(state, mesh)`)."""
  return jax.device_put(state, sharding)


def count_params(params: PyTree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(params)))
