"""Rerankers: pair classifiers that say whether a response answers a multi-turn context.

ESIM (`models.esim`, cross-attention), the sentence-encoding baseline
(`models.sentence_lstm`) and the cross-encoder (`models.cross_encoder`) train the same way,
on Lowe et al.'s 1:1 labelled pairs (`conversations.read_labelled_pairs`: a context's
true response labelled 1, a random one 0) with 2-way cross-entropy, and rank a case's
candidates by their match logit margin. A reranker's model module gives, besides `build`:

    pair_inputs(built, model_config) -> models.PairInputs
    export(built, model, folder)
    load(folder, model_config) -> Built   (what `export` wrote)

and its model is called as `model(**inputs, dropout_key=...) -> [n, 2]` logits.

Batches: an epoch is a permutation of the rows drawn from PCG64(seed, epoch), cut into
full batches of `train.batch_size` (the remainder waits for the next epoch's draw), so
step s is the same batch on every machine and after a resume. Each process tokenises
its contiguous share; padded widths agree across processes.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from convfit_jax import models, sharding
from convfit_jax.data import batching, words
from convfit_jax.data.conversations import EOU, ResponseSelectionSet, read_labelled_pairs
from convfit_jax.data.sampling import subsample_indices
from convfit_jax.evaluators import response_selection
from convfit_jax.models import PairInputs
from convfit_jax.train import trainer
from convfit_jax.train.train_state import TrainState


def loss_fn(model: nnx.Module, batch: Mapping[str, jax.Array], dropout_key: jax.Array | None
            ) -> jax.Array:
  """Mean 2-way cross-entropy of `batch` (the model's inputs and `labels` [n] int32)."""
  inputs = {k: v for k, v in batch.items() if k != "labels"}
  log_p = jax.nn.log_softmax(model(**inputs, dropout_key=dropout_key).astype(jnp.float32))
  return -jnp.mean(jnp.take_along_axis(log_p, batch["labels"][:, None], axis=1))


# Compiled scorers kept at once. Each padded shape of a scoring chunk compiles its own
# program, and XLA's CPU code of each maps memory pages of its own: the evaluation of
# ESIM on 1,000 + 100 ubuntu_irc cases held about 46,000 maps at its end, near Linux's
# default limit (65,530), past which compiling fails. Chunks come grouped by padded
# shape (`scoring_order`), so dropping every compiled scorer at the bound rarely
# recompiles one still needed.
MAX_COMPILED_SCORERS = 32


@functools.partial(jax.jit, static_argnums=0)
def _margins(graphdef: nnx.GraphDef, state: nnx.State, batch: Mapping[str, jax.Array]) -> jax.Array:
  logits = nnx.merge(graphdef, state)(**batch).astype(jnp.float32)
  return logits[:, 1] - logits[:, 0]


def scoring_order(inputs: PairInputs, histories: Sequence[str], responses: Sequence[str]
                  ) -> np.ndarray:
  """[n] pair indices in the order to score them, so that consecutive pairs pad to little.

  Where the model pads history and response apart (`inputs.lengths`), pairs whose
  histories pad to the same width (`words.padded_length`) go together, then those whose
  responses do, and within those a history's pairs one after the other (a model with
  `shared_contexts` encodes each history of a chunk once), in order of response length;
  otherwise in order of history, then response, characters. Sorting by history length
  alone left each chunk's responses padded to the longest of its random ones, mostly far
  above their mean.
  """
  if inputs.lengths is None:
    return np.lexsort(([len(r) for r in responses], [len(h) for h in histories]))
  history, response = inputs.lengths(histories, responses)
  width = lambda lengths: [words.padded_length(int(n), 1 << 30) for n in lengths]
  history_id = words.distinct(histories)[1]
  return np.lexsort((response, history_id, width(response), width(history)))


class PairScorer:
  """Scores each (history, candidate) pair of response-selection cases with a reranker.

  Args:
    model: the reranker, in eval mode.
    inputs: its `pair_inputs`.
  """

  def __init__(self, model: nnx.Module, inputs: PairInputs):
    self.graphdef, self.state = nnx.split(model)
    self.inputs = inputs

  def margins(self, histories: Sequence[str], responses: Sequence[str], *, batch_size: int = 64
              ) -> np.ndarray:
    """[n] float32 match margins, log p(match) - log p(no match), of aligned pairs, scored
    in `scoring_order` in chunks of `batch_size` pairs (the last filled with copies of its
    first pair; one compile per padded shape), each distinct history of a chunk encoded
    once where the model allows (`PairInputs.shared_contexts`)."""
    encode = self.inputs.shared_contexts or self.inputs.encode
    order = scoring_order(self.inputs, histories, responses)
    out = np.empty(len(order), np.float32)
    for start in range(0, len(order), batch_size):
      idx = order[start:start + batch_size]
      rows = np.concatenate([idx, np.repeat(idx[:1], batch_size - len(idx))])
      batch = encode([histories[i] for i in rows], [responses[i] for i in rows])
      if _margins._cache_size() >= MAX_COMPILED_SCORERS:
        _margins.clear_cache()
      out[idx] = np.asarray(_margins(self.graphdef, self.state, batch))[:len(idx)]
    return out

  def score(self, cases: ResponseSelectionSet, *, batch_size: int = 64) -> np.ndarray:
    """[n, c] margins of each case's history (turns joined by ` __eou__ `) with each candidate."""
    c = len(cases.candidates[0])
    histories = [EOU.join(h) for h in cases.histories for _ in range(c)]
    responses = [r for cands in cases.candidates for r in cands]
    return self.margins(histories, responses, batch_size=batch_size).reshape(len(cases), c)


def _finished_run_config(workdir: Path) -> dict[str, Any] | None:
  """The config.json of a finished rerank run in `workdir` (task "rerank", model/), or None."""
  config_path = workdir / "config.json"
  if not (config_path.is_file() and (workdir / "model").is_dir()):
    return None
  config = json.loads(config_path.read_text())
  return config if config.get("task") == "rerank" else None


def is_rerank_run(workdir: str | os.PathLike) -> bool:
  """Whether `workdir` holds a finished rerank run (config.json of task "rerank", model/)."""
  return _finished_run_config(Path(workdir)) is not None


def load_reranker(workdir: str | os.PathLike, *, dtype: str | None = None
                  ) -> tuple[nnx.Module, PairInputs]:
  """The model a finished rerank run exported (`workdir/model`), in eval mode, and how it
  reads pairs, as that run's config.json describes them; `dtype` replaces the compute dtype
  it was trained in (e.g. "bfloat16" to score faster; parameters stay float32)."""
  workdir = Path(workdir)
  config = _finished_run_config(workdir)
  if config is None:
    raise FileNotFoundError(f"{workdir}: not a finished rerank run (no config.json of task "
                            "rerank and model/)")
  m = ml_collections.ConfigDict(config["model"])
  if dtype:
    m.dtype = dtype
  module = models.get(m.name)
  built = module.load(workdir / "model", m)
  built.model.eval()
  return built.model, module.pair_inputs(built, m)


class Rerank:
  """The reranker `trainer.Task`: labelled pairs of `config.data.train`."""

  def __init__(self, config: ml_collections.ConfigDict, mesh):
    self.config, self.mesh = config, mesh
    d, t = config.data, config.train
    path = Path(d.train).expanduser()
    if not path.is_file():
      raise FileNotFoundError(f"data.train: {path.absolute()} does not exist "
                              "(relative paths are read from the current directory)")
    pairs = read_labelled_pairs(path)
    self.pairs = pairs.subset(subsample_indices(len(pairs), d.max_rows, config.seed))
    batching.check_divisible(t.batch_size, mesh.shape[sharding.DATA])
    self.per_epoch = len(self.pairs) // t.batch_size
    if self.per_epoch == 0:
      raise ValueError(f"data.train: {len(self.pairs)} rows, fewer than train.batch_size={t.batch_size}")
    module = models.get(config.model.name)
    self.built = module.build(config.model, seed=config.seed,
                              train_texts=lambda: self.pairs.histories + self.pairs.responses)
    self.module = module
    self.inputs = module.pair_inputs(self.built, config.model)
    self.title = f"reranker ({config.model.name})"
    self.total_steps = trainer.total_steps(self.per_epoch, t)
    self.examples_per_step, self.examples_name = t.batch_size, "pairs"
    self.counts = {"num_pairs": len(self.pairs), "positive_share": float(self.pairs.labels.mean()),
                   "steps_per_epoch": self.per_epoch, "total_steps": self.total_steps,
                   **{k: v for k, v in self.built.hf_config.items() if k in ("words_in_vectors", "init_from")}}

  def step_rows(self, step: int) -> np.ndarray:
    """The global batch of `step`: [batch_size] row indices."""
    b = self.config.train.batch_size
    order = batching.epoch_order(len(self.pairs), self.config.seed, step // self.per_epoch)
    return order[(step % self.per_epoch) * b:(step % self.per_epoch + 1) * b]

  def batches(self, start_step: int) -> Iterator[np.ndarray]:
    def rows():
      for step in range(start_step, self.total_steps):
        global_rows = self.step_rows(step)
        yield global_rows[batching.own_slice(len(global_rows), jax.process_index(),
                                             jax.process_count())]
    return batching.prefetch(rows(), size=self.config.data.prefetch)

  def device_batch(self, host_batch: np.ndarray) -> dict[str, jax.Array]:
    p = self.pairs
    local = self.inputs([p.histories[i] for i in host_batch], [p.responses[i] for i in host_batch])
    # Every process pads to the widest any of them needs (one global array per input).
    pad = lambda k, v: np.pad(v, [(0, 0), (0, sharding.process_max(v.shape[1]) - v.shape[1])],
                              constant_values=self.inputs.pad_values.get(k, 0))
    local = {k: pad(k, v) if v.ndim == 2 else v for k, v in local.items()}
    local["labels"] = p.labels[host_batch]
    return sharding.global_batch(local, self.mesh)

  def batch_rows(self, host_batch: np.ndarray) -> np.ndarray:
    return host_batch

  def loss_and_grads(self, state: TrainState, batch: Mapping[str, jax.Array]):
    return trainer.value_and_grad(loss_fn, state, batch)

  def predictors(self, model: nnx.Module) -> dict[str, Any]:
    return {"response_scorer": PairScorer(model, self.inputs)}

  def export(self, model: nnx.Module, folder: Path) -> None:
    self.module.export(self.built, model, folder)

  def summary(self, metrics: Mapping[str, Any]) -> str | None:
    return response_selection.summary_line(metrics)


def train_and_evaluate(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """Trains the reranker `config.model.name` as `config` says; returns the final metrics
  (also in workdir/metrics.json). Writes config.json, log.txt, metrics.json (each
  evaluation's recall and MRR before and after), tensorboard/, checkpoints/ and model/
  (the module's `export`)."""
  return trainer.train_and_evaluate(config, Rerank)
