"""Models by name, as big_vision chooses them: `config.model.name` is a module here.

Each model module exposes `build(model_config, *, seed, **task_options) -> Built`: the
network with its weights (pretrained, from a run's output, or random) and what turns
texts into its inputs. Tasks call `get(config.model.name).build(...)`; a new model is
a new file here with a `build` function, and nothing else changes.
"""

from __future__ import annotations

import dataclasses
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from flax import nnx

from convfit_jax import registry


@dataclasses.dataclass
class Built:
  """A model and what goes with it.

  Attributes:
    model: the network.
    tokenizer: a transformers fast tokenizer (None for models that need none).
    hf_config: the pretrained config.json dict, written back on export.
    normalize: whether the pretrained pipeline L2-normalises its sentence vectors.
    packs: whether several sentences may share a row (`data.packing`); False for models
      whose layers would mix them (convolutions), which then get one sentence per row.
  """
  model: nnx.Module
  tokenizer: Any = None
  hf_config: dict[str, Any] = dataclasses.field(default_factory=dict)
  normalize: bool = False
  packs: bool = True


@dataclasses.dataclass(frozen=True)
class PairInputs:
  """How a reranker reads (history, response) pairs (`train.rerank`).

  Attributes:
    encode: (n histories, n responses) -> {input name: [n, width] or [n] array}, the
      keyword arguments of the model's call.
    pad_values: the value that pads each [n, width] input wider (0 where not named).
    lengths: (n histories, n responses) -> ([n] history, [n] response) int lengths as
      `encode` cuts them, for models that pad the two apart (None: one sequence a pair).
    shared_contexts: for models that encode a context apart from its response, as
      `encode` but each distinct history once: its context inputs hold [m, width] / [m]
      rows (m padded to a power of two by repeating the first) and "context_index" [n]
      int32 says which row each pair reads (None: every pair carries its own history).
  """
  encode: Callable[[Sequence[str], Sequence[str]], dict[str, np.ndarray]]
  pad_values: Mapping[str, int] = dataclasses.field(default_factory=dict)
  lengths: Callable[[Sequence[str], Sequence[str]], tuple[np.ndarray, np.ndarray]] | None = None
  shared_contexts: Callable[[Sequence[str], Sequence[str]], dict[str, np.ndarray]] | None = None

  def __call__(self, histories: Sequence[str], responses: Sequence[str]) -> dict[str, np.ndarray]:
    return self.encode(histories, responses)


def get(name: str) -> ModuleType:
  """The model module `convfit_jax.models.<name>`; an unknown name lists the known ones."""
  return registry.lookup(__name__, name, "build", "config.model.name")
