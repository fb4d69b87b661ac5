"""What the word-level rerankers (ESIM, the BiLSTM sentence-encoding baseline) share:
vocabulary and embeddings, how they read (history, response) pairs, saving and loading.

A model class here is an `nnx.Module` built as `cls(config, rngs=..., embeddings=...)`
from a frozen dataclass `cls.Config` whose fields are `vocab_size` and the names of
its `model` config block (embed_dim, hidden, ...); `reranker_functions(cls)` gives its
module what `train.rerank` calls.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
from pathlib import Path
from typing import Callable, Iterable, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import orbax.checkpoint as ocp
from flax import nnx, traverse_util

from convfit_jax.data import words
from convfit_jax.models import Built, PairInputs, sentence
from convfit_jax.models.heads import l2_normalize

CONFIG_FILE = "word_model.json"
WEIGHTS = "weights"  # the orbax checkpoint folder of a saved model's arrays


class FrozenEmbedding(nnx.Variable):
  """Word vectors that training leaves as they are (model state, not a parameter, so the
  optimiser neither moves nor decays them)."""


def embedding_table(vocab_size: int, dim: int, *, frozen: bool, rngs: nnx.Rngs,
                    embeddings: np.ndarray | None) -> nnx.Variable:
  """[vocab_size, dim] float32 word vectors, `embeddings` or N(0, 0.1^2)."""
  table = (jax.random.normal(rngs.params(), (vocab_size, dim)) * 0.1 if embeddings is None
           else jnp.asarray(embeddings, jnp.float32))
  return FrozenEmbedding(table) if frozen else nnx.Param(table)


def build(cls, m: ml_collections.ConfigDict, *, seed: int,
          train_texts: Callable[[], Iterable[str]]) -> Built:
  """`cls` as a `model` config block says, its vocabulary built from `train_texts()`.

  Besides `cls.Config`'s fields the block has vectors (a word-vectors file, or "" for
  random embeddings), min_count, max_vocab and oov_buckets (`words.build_vocabulary`), max_context
  and max_response (`pair_inputs`). `Built.tokenizer` is the vocabulary; `hf_config`
  records the share of its words found in the vectors file. With `init_from` set the model
  starts from a saved one instead (`start_from`).
  """
  if m.get("init_from"):
    return start_from(cls, m)
  vocabulary = words.build_vocabulary(train_texts(), min_count=m.min_count, max_size=m.max_vocab,
                                      oov_buckets=m.oov_buckets)
  table, found = words.embedding_matrix(vocabulary, dim=m.embed_dim, vectors=m.vectors or None,
                                        seed=seed)
  fields = [f.name for f in dataclasses.fields(cls.Config) if f.name != "vocab_size"]
  config = cls.Config(vocab_size=len(vocabulary), **{f: m[f] for f in fields})
  return Built(cls(config, rngs=nnx.Rngs(seed), embeddings=table), tokenizer=vocabulary,
               hf_config={"words_in_vectors": found})


def pair_inputs(built: Built, m: ml_collections.ConfigDict) -> PairInputs:
  """(histories, responses) -> {"context_ids", "response_ids"} [n, L] int32 (0 = padding)
  and {"context_lengths", "response_lengths"} [n] int32: contexts cut to `m.max_context`
  words from the left, responses to `m.max_response` from the right."""
  vocabulary = built.tokenizer

  def inputs(histories: Sequence[str], responses: Sequence[str]) -> dict[str, np.ndarray]:
    c, cl = words.encode(histories, vocabulary, max_length=m.max_context, keep="end")
    r, rl = words.encode(responses, vocabulary, max_length=m.max_response, keep="start")
    return {"context_ids": c, "context_lengths": cl, "response_ids": r, "response_lengths": rl}

  def lengths(histories: Sequence[str], responses: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    return (words.cut_lengths(histories, max_length=m.max_context),
            words.cut_lengths(responses, max_length=m.max_response))

  def shared_contexts(histories: Sequence[str], responses: Sequence[str]) -> dict[str, np.ndarray]:
    distinct, index = words.distinct(histories)
    # Powers of two bound the shapes XLA compiles; the padding rows are read by no pair.
    distinct += distinct[:1] * ((1 << (len(distinct) - 1).bit_length()) - len(distinct))
    return {**inputs(distinct, responses), "context_index": index}

  return PairInputs(inputs, lengths=lengths, shared_contexts=shared_contexts)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _embed(graphdef: nnx.GraphDef, normalize: bool, state: nnx.State,
           inputs: dict[str, jax.Array]) -> jax.Array:
  x = nnx.merge(graphdef, state)(**inputs)
  return l2_normalize(x) if normalize else x


class WordTextEncoder:
  """A word-level model (the DAN, the convolutional encoder) as a text encoder
  (`evaluators.TextEncoder`): texts -> [n, dim] float32, in the model's current mode.

  Args:
    model: the network, with a `dim`.
    inputs: texts -> the model's keyword inputs.
  """

  def __init__(self, model: nnx.Module, inputs: Callable[[Sequence[str]], dict[str, np.ndarray]]):
    self.model, self.inputs = model, inputs

  @property
  def dim(self) -> int:
    return self.model.dim

  def encode(self, texts: Sequence[str], *, batch_size: int = 32, normalize: bool | None = None
             ) -> np.ndarray:
    """Calls of `batch_size` * 8 texts (these models are cheap per text); the last is
    padded with empty texts, so each input width compiles once."""
    graphdef, state = nnx.split(self.model)
    out = np.zeros((len(texts), self.dim), np.float32)
    step = batch_size * 8
    for start in range(0, len(texts), step):
      chunk = list(texts[start:start + step])
      x = _embed(graphdef, bool(normalize), state, self.inputs(chunk + [""] * (step - len(chunk))))
      out[start:start + len(chunk)] = np.asarray(x[:len(chunk)])
    return out


def _own_checkpointer() -> ocp.StandardCheckpointer:
  """An orbax checkpointer of this process alone: exports are written by the main process
  only, and read by whichever process loads them, so no other process joins its barriers."""
  me = jax.process_index()
  return ocp.StandardCheckpointer(multiprocessing_options=ocp.options.MultiprocessingOptions(
      primary_host=me, active_processes={me}))


def save_weights(model: nnx.Module, folder: Path) -> None:
  """Every array of `model` (frozen embeddings and BatchNorm statistics included) as an
  orbax checkpoint in `folder / WEIGHTS`, written by this process alone (`_own_checkpointer`)
  and atomically (orbax writes a temporary folder and renames it)."""
  with _own_checkpointer() as checkpointer:
    checkpointer.save(Path(folder).absolute() / WEIGHTS, nnx.to_pure_dict(nnx.state(model)))


def read_weights(folder: Path) -> dict[str, np.ndarray]:
  """{dotted path: array} of the checkpoint `save_weights` wrote in `folder`."""
  path = Path(folder).absolute() / WEIGHTS
  if not path.is_dir():
    raise FileNotFoundError(f"{path}: no saved weights (an orbax checkpoint folder)")
  with _own_checkpointer() as checkpointer:
    tree = checkpointer.restore(path)
  return {".".join(map(str, keys)): np.asarray(x)
          for keys, x in traverse_util.flatten_dict(tree).items()}


def load_weights(build: Callable[[], nnx.Module], folder: Path) -> nnx.Module:
  """`build()` filled with the arrays `save_weights` wrote in `folder`."""
  return sentence.build_with_params(build, read_weights(folder), source=str(Path(folder) / WEIGHTS))


def saved_folder(path: str | os.PathLike, config_file: str = CONFIG_FILE) -> Path | None:
  """`path`, or its `model/` folder (a finished run's workdir), whichever holds
  `config_file`; None when neither does."""
  path = Path(path)
  return next((p for p in (path, path / "model") if (p / config_file).is_file()), None)


def saved_class(folder: str | os.PathLike) -> str | None:
  """The class name of the model `save` wrote to `folder`, or None where none is."""
  path = Path(folder) / CONFIG_FILE
  if not path.is_file() or not (Path(folder) / WEIGHTS).is_dir():
    return None
  return json.loads(path.read_text()).get("model")


def save(built: Built, model: nnx.Module, folder: str | os.PathLike) -> None:
  """Writes `word_model.json` (the class name and config), `vocab.txt` and `weights/` (every
  array, frozen embeddings included: `save_weights`)."""
  folder = Path(folder)
  folder.mkdir(parents=True, exist_ok=True)
  fields = {"model": type(model).__name__, **dataclasses.asdict(model.config)}
  (folder / CONFIG_FILE).write_text(json.dumps(fields, indent=1))
  built.tokenizer.save(folder / "vocab.txt")
  save_weights(model, folder)


def load(cls, folder: str | os.PathLike, **replace) -> Built:
  """The `cls` model and vocabulary `save` wrote; `replace` (e.g. dtype="bfloat16") sets
  config fields that change how it runs, not its arrays (a None value keeps the saved one)."""
  folder = Path(folder)
  fields = json.loads((folder / CONFIG_FILE).read_text())
  saved = fields.pop("model", cls.__name__)
  if saved != cls.__name__:
    raise ValueError(f"{folder / CONFIG_FILE}: a saved {saved}, not a {cls.__name__}")
  config = dataclasses.replace(cls.Config(**fields),
                               **{k: v for k, v in replace.items() if v is not None})
  model = load_weights(lambda: cls(config, rngs=nnx.Rngs(0)), folder)
  return Built(model, tokenizer=words.Vocabulary.load(folder / "vocab.txt"))


def start_from(cls, m: ml_collections.ConfigDict) -> Built:
  """The `cls` model and vocabulary saved in `m.init_from` (a finished run's workdir or its
  `model/` folder), to train further, e.g. on harder negatives after random ones. Its sizes
  and vocabulary must be the block's (a ValueError names the first that is not); the block's
  dropout and dtype apply."""
  folder = saved_folder(m.init_from)
  if folder is None:
    raise FileNotFoundError(f"model.init_from: {Path(m.init_from).absolute()} holds no saved "
                            f"model ({CONFIG_FILE}, in it or in its model/ folder)")
  built = load(cls, folder, dtype=m.dtype, dropout=m.dropout)
  saved = dict(dataclasses.asdict(built.model.config), oov_buckets=built.tokenizer.oov_buckets)
  for field, value in saved.items():
    if field not in ("vocab_size", "dropout", "dtype") and m[field] != value:
      raise ValueError(f"model.{field}={m[field]!r}, but model.init_from {folder} was saved "
                       f"with {value!r}")
  return dataclasses.replace(built, hf_config={"init_from": str(folder)})


def reranker_functions(cls):
  """(build, load, pair_inputs, export) of `cls`, as a reranker's model module exposes them
  (`train.rerank`; `load` reads the sizes from the folder, only the dtype from the block)."""
  def build_cls(m: ml_collections.ConfigDict, *, seed: int,
                train_texts: Callable[[], Iterable[str]]) -> Built:
    return build(cls, m, seed=seed, train_texts=train_texts)

  def load_cls(folder: str | os.PathLike, m: ml_collections.ConfigDict | None = None) -> Built:
    return load(cls, folder, dtype=None if m is None else m.get("dtype"))

  return build_cls, load_cls, pair_inputs, save
