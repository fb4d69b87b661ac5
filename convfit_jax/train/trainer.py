"""The run skeleton every training task shares, written once.

    distributed init -> workdir (config.json, log.txt) -> mesh -> the task (data, model,
    counts) -> optimiser and train state, placed on the mesh -> restore the latest
    checkpoint, or start -> "before" evaluation -> the loop (window-mean logging, NaN
    guard, checkpoints, evaluation every N steps) -> "after" evaluation -> metrics.json
    -> export (atomic) -> the summary line

A task supplies its pieces (`Task`): the model, host batches from a step on, the device
form of a batch, the loss and its gradients, the predictors its evaluators read, the
export. Evaluators come by name from `config.evals` (`convfit_jax.evaluators`). A run
is finished when its last checkpoint is at the final step and its model is exported (the
last thing a run writes): rerunning a finished run does nothing, rerunning an
interrupted one resumes from its latest checkpoint.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol

import jax
import ml_collections
import numpy as np
import optax
from absl import logging
from flax import nnx

from convfit_jax import evaluators as evaluators_lib
from convfit_jax import sharding
from convfit_jax.encoder import Encoder
from convfit_jax.evaluators.response_selection import BiEncoderScorer
from convfit_jax.models import Built
from convfit_jax.models.dual_encoder import DualEncoder
from convfit_jax.models.heads import l2_normalize
from convfit_jax.models.sentence import SentenceEncoder
from convfit_jax.train import loop, optimizer
from convfit_jax.train.checkpointing import Checkpointer
from convfit_jax.train.train_state import TrainState, model_state_of, place
from convfit_jax.train.workdir import Workdir, is_main_process, summary


class Task(Protocol):
  """What a system gives the trainer; built as `task_cls(config, mesh)`.

  Attributes:
    title: how the trained model is named in logs and plots, e.g. "Stage 2 (ocl)".
    built: the model and its tokenizer (`models.get(config.model.name).build(...)`).
    total_steps: optimiser steps of the whole run.
    examples_per_step: training examples per step, for the examples/second figure.
    examples_name: what they are ("pairs", "sentences").
    counts: figures written to metrics.json before training (data sizes, ...).
  """

  title: str
  built: Built
  total_steps: int
  examples_per_step: int
  examples_name: str
  counts: dict[str, Any]

  def batches(self, start_step: int) -> Iterator[Any]:
    """This process's host batches from `start_step` on; closed when the run ends."""

  def device_batch(self, host_batch: Any) -> Mapping[str, jax.Array]:
    """A host batch as the global arrays the step takes (sharded over `data`)."""

  def batch_rows(self, host_batch: Any) -> np.ndarray | None:
    """The dataset rows of a host batch, named when its loss is NaN."""

  def loss_and_grads(self, state: TrainState, batch: Mapping[str, jax.Array]
                     ) -> tuple[jax.Array | dict[str, jax.Array], Any, Any]:
    """(loss, gradients in `state.params`, the model's new other state), traced under
    `jax.jit`; `value_and_grad` does it for a loss on the model. The loss is a scalar,
    or {"loss": the scalar differentiated, other named float32 scalars logged with it}
    (a multitask loss's parts)."""

  def predictors(self, model: nnx.Module) -> Mapping[str, Any]:
    """What the evaluators read (`evaluators.TextEncoder`, ...), from a host model in eval mode."""

  def export(self, model: nnx.Module, folder: Path) -> None:
    """Writes the trained model to `folder`."""

  def summary(self, metrics: Mapping[str, Any]) -> str | None:
    """The run's one-line result for the terminal, or None."""


def value_and_grad(loss_fn, state: TrainState, batch: Mapping[str, jax.Array]
                   ) -> tuple[jax.Array | dict[str, jax.Array], Any, Any]:
  """`Task.loss_and_grads` for a loss `loss_fn(model, batch, dropout_key)` (a scalar, or
  {"loss": scalar, named parts}): the model in train mode (BatchNorm updates its
  statistics, which come back as the new model state), dropout keyed by the step."""
  def objective(params):
    model = state.model(params)
    model.train()
    out = loss_fn(model, batch, state.step_key())
    return (out["loss"] if isinstance(out, dict) else out), (out, model_state_of(model))

  (_, (out, model_state)), grads = jax.value_and_grad(objective, has_aux=True)(state.params)
  return out, grads, model_state


def make_train_step(loss_and_grads, mesh):
  """One optimiser step under `jax.jit`: the state placed as `sharding.param_shardings`
  says (taken from the argument, pinned on the output), the batch sharded over `data`,
  the state donated.

  Args:
    loss_and_grads: `(state, batch) -> (loss, grads, model_state)` (`Task.loss_and_grads`).
    mesh: the run's mesh.
  Returns:
    jitted `(state, batch) -> (state, {"loss", "grad_norm", the loss's named parts}
    float32 scalars)`.
  """
  def step(state, batch):
    loss, grads, model_state = loss_and_grads(state, batch)
    metrics = {**(loss if isinstance(loss, dict) else {"loss": loss}),
               "grad_norm": optax.tree.norm(grads)}
    state = state.apply_gradients(grads, model_state)
    # The shardings depend on shapes only, so the traced state yields the placed ones.
    return jax.lax.with_sharding_constraint(state, sharding.param_shardings(state, mesh)), metrics

  return jax.jit(step, in_shardings=(None, sharding.batch_sharding(mesh)),
                 out_shardings=(None, sharding.replicated(mesh)), donate_argnums=0)


def init_state(config: ml_collections.ConfigDict, model: nnx.Module, total_steps: int, mesh
               ) -> tuple[TrainState, optax.Schedule]:
  """The train state of `model` (AdamW as `config.train` says, seeded by `config.seed`) on
  `mesh`, and its schedule."""
  tx, schedule = optimizer.from_config(config.train, total_steps)
  state = TrainState.create(model, tx, seed=config.seed)
  return place(state, sharding.param_shardings(state, mesh)), schedule


def text_encoder(module, built: Built, model: nnx.Module, model_config: ml_collections.ConfigDict):
  """A trained network as the text encoder its predictors and export use: for a Transformer
  sentence encoder the package's `Encoder` (packed, fast; it sits above `models/`, so the
  trainers wrap, not the model module), else the model module's own
  (`module.text_encoder`: convolutional, DAN)."""
  if isinstance(model, SentenceEncoder):
    return Encoder(model, built.tokenizer, max_length=model_config.max_length,
                   normalize=built.normalize, hf_config=built.hf_config)
  return module.text_encoder(built, model, model_config)


@functools.partial(jax.jit, static_argnums=0)
def _response_ff(graphdef: nnx.GraphDef, state: nnx.State, x: jax.Array) -> jax.Array:
  return nnx.merge(graphdef, state).apply_response_ff(x)


def dual_encoder_predictors(model: DualEncoder, text_encoder: Callable[[nnx.Module], Any]
                            ) -> tuple[Any, BiEncoderScorer]:
  """What evaluators read from a (host, eval-mode) dual encoder: the context tower as a
  `TextEncoder` (`text_encoder(tower)`, e.g. an `Encoder`) and a `BiEncoderScorer` of unit
  context and response vectors, the responses through the response tower and feed-forward
  network. (Here, not in `models/`, because it builds evaluator types.)"""
  contexts, responses = text_encoder(model.context), text_encoder(model.response_tower)
  graphdef, state = nnx.split(model)

  def embed_responses(texts, batch_size):
    x = responses.encode(texts, batch_size=batch_size, normalize=False)
    if model.response_ff is not None:
      x = _response_ff(graphdef, state, x)
    return np.asarray(l2_normalize(x))

  return contexts, BiEncoderScorer(
      lambda texts, batch_size: contexts.encode(texts, batch_size=batch_size, normalize=True),
      embed_responses)


def total_steps(per_epoch: int, train_config: ml_collections.ConfigDict) -> int:
  """Steps of `train.epochs` epochs of `per_epoch` steps, raised to `train.min_steps` and
  then cut to `train.max_steps` when > 0 (the schedule follows)."""
  t = train_config
  steps = max(per_epoch * t.epochs, t.min_steps)
  return min(steps, t.max_steps) if t.max_steps > 0 else steps


def schedule_summary(per_epoch: int, train_config: ml_collections.ConfigDict) -> str:
  """How `total_steps` came about, for the run's first line."""
  t, steps = train_config, total_steps(per_epoch, train_config)
  epochs = f"{t.epochs} epochs of {per_epoch:,}"
  if per_epoch * t.epochs < t.min_steps and steps == t.min_steps:
    return f"{steps:,} steps (train.min_steps; {epochs} would be {per_epoch * t.epochs:,})"
  if steps < max(per_epoch * t.epochs, t.min_steps):
    return f"{steps:,} steps (train.max_steps; {epochs})"
  return f"{steps:,} steps ({epochs})"


def train_and_evaluate(config: ml_collections.ConfigDict, task_cls) -> dict[str, Any]:
  """Runs `task_cls` as `config` says; returns the metrics (also in workdir/metrics.json)."""
  sharding.initialize_distributed(config.get("distributed"))
  workdir = Workdir(config.workdir)
  try:
    return _run(config, task_cls, workdir)
  finally:
    workdir.close()


def _run(config: ml_collections.ConfigDict, task_cls, workdir: Workdir) -> dict[str, Any]:
  workdir.write_config(config)
  mesh = sharding.make_mesh(config.mesh.model_parallel)
  task = task_cls(config, mesh)
  metrics = workdir.update_metrics(task.counts)
  if config.get("dry_run"):
    return metrics

  state, schedule = init_state(config, task.built.model, task.total_steps, mesh)
  t = config.train
  ckpt = Checkpointer(workdir.checkpoint_dir, save_every=t.checkpoint_every, keep=t.keep_checkpoints)
  try:
    state, meta = ckpt.restore_or_init(state)
    start = int(jax.device_get(state.step))
    export_dir = workdir.path / "model"
    if start >= task.total_steps and export_dir.is_dir():
      logging.info("%s already finished at step %d; nothing to do", workdir.path, start)
      return metrics
    logging.info("%s: %d steps, starting at %d; %d devices, %d processes", task.title,
                 task.total_steps, start, jax.device_count(), jax.process_count())

    evals = evaluators_lib.from_config(config.evals, run_config=config, workdir=workdir.path)

    def evaluate(model: nnx.Module, when: str, step: int) -> dict[str, Any]:
      predictors = task.predictors(model)
      out = {}
      for name, (evaluator, block) in evals.items():
        if ((when == "before" and not block.before)
            or (when == "during" and not (block.every and step % block.every == 0))):
          continue
        m = evaluator(predictors, when=when, label=f"{when} {task.title}")
        scalars = evaluators_lib.numeric(m)
        logging.info("%s %s (step %d): %s", name, when, step,
                     ", ".join(f"{k} {v:.4g}" for k, v in scalars.items()))
        workdir.write_scalars(step, {f"eval/{k}": v for k, v in scalars.items()})
        out.update(m)
      return out

    if start == 0:
      before = evaluate(state.host_model(), "before", 0)
      metrics = workdir.update_metrics({f"{k}_before": v for k, v in before.items()})

    batches = task.batches(start)
    try:
      state, seconds = loop.fit(
          state, make_train_step(task.loss_and_grads, mesh), batches, total_steps=task.total_steps,
          examples_per_step=task.examples_per_step, examples_name=task.examples_name, schedule=schedule, workdir=workdir,
          checkpointer=ckpt, log_every=t.log_every, to_device=task.device_batch,
          batch_rows=task.batch_rows,
          eval_due=lambda step: any(b.every and step % b.every == 0 for _, b in evals.values()),
          evaluate=lambda state_, step: evaluate(state_.host_model(), "during", step),
          train_seconds=meta.get("train_seconds", 0.0), show_progress=t.get("progress", True))
    finally:
      batches.close()
  finally:
    ckpt.close()

  model = state.host_model()
  after = evaluate(model, "after", task.total_steps)
  metrics = workdir.update_metrics({**after, "steps": task.total_steps, "train_seconds": seconds})
  if is_main_process():
    _export_atomically(task, model, export_dir)
  logging.info("outputs in %s: metrics.json, log.txt, tensorboard/, checkpoints/, model/",
               workdir.path)
  line = task.summary(metrics)
  if line:
    summary(line)
  return metrics


def _export_atomically(task: Task, model: nnx.Module, folder: Path) -> None:
  """`task.export` into a temporary folder renamed into place: a folder at `folder` is
  always a whole export (the trainer's sign that the run finished)."""
  tmp = folder.with_name(folder.name + ".tmp")
  shutil.rmtree(tmp, ignore_errors=True)
  task.export(model, tmp)
  if folder.exists():
    shutil.rmtree(folder)
  tmp.rename(folder)
