"""What several configs share: argument parsing, and the model, data and evaluator blocks."""

from __future__ import annotations

from typing import Any

import ml_collections

from convfit_jax.hf_io import MINILM

# The shared data's STS and NLI folders, relative to the current directory (the repository root).
STSB_DIR = "../shared/data/sts/stsb"
SICK_DIR = "../shared/data/nli/sick"
SNLI_DIR = "../shared/data/nli/snli"

# The paper's epochs per few-shot setting (0 = full data).
EPOCHS_BY_SHOTS = {10: 10, 30: 5, 0: 2}
# A Transformer small enough to train from scratch on a CPU (`model.architecture_overrides`
# of MiniLM's config: 4 layers of 256, 4 heads; 11M parameters, 7.8M of them word embeddings).
SMALL_TRANSFORMER = "num_hidden_layers=4,hidden_size=256,num_attention_heads=4,intermediate_size=1024"
_TRUE, _FALSE = ("true", "1", "yes"), ("false", "0", "no")


def _cast(text: str, default: Any, key: str, source: str) -> Any:
  """`text` as the type of `default`: bool, int, float, str, or a tuple of '+'-separated items
  typed by the default's first item (str for an empty default)."""
  try:
    if isinstance(default, bool):
      if text.lower() not in _TRUE + _FALSE:
        raise ValueError(f"expected true or false, got {text!r}")
      return text.lower() in _TRUE
    if isinstance(default, tuple):
      item = default[0] if default else ""
      return tuple(_cast(x, item, key, source) for x in text.split("+") if x)
    return type(default)(text)
  except ValueError as e:
    raise ValueError(f"{source}: argument {key}={text!r}: {e}") from None


def parse_arg(arg: str | None, source: str, **defaults: Any) -> ml_collections.ConfigDict:
  """The `get_config` argument 'a=1,b=x,flag,l=1+2' as a ConfigDict of `defaults` updated by it.

  Each value takes the type of its default: ints and floats are parsed, a bare key is
  True for a bool, lists are '+'-separated (commas separate arguments) and come back as
  tuples of the default's item type. An unknown key is an error naming `source`.
  """
  out = ml_collections.ConfigDict(defaults)
  for part in filter(None, (arg or "").split(",")):
    key, sep, value = part.partition("=")
    key = key.strip()
    if key not in defaults:
      raise ValueError(f"{source}: unknown argument {key!r}; known: {sorted(defaults)}")
    if not sep and not isinstance(defaults[key], bool):
      raise ValueError(f"{source}: argument {key!r} needs a value ({key}=...)")
    out[key] = _cast(value.strip() if sep else "true", defaults[key], key, source)
  return out


def model_config(init_from: str = MINILM, name: str = "sentence") -> ml_collections.ConfigDict:
  m = ml_collections.ConfigDict()
  m.name = name  # the model module in convfit_jax/models/ (its `build`)
  m.encoder = "sentence"  # the text encoder's module, where `name` wraps one (siamese, ...)
  # A folder or hub id (pretrained, or a Stage 1/2 output: a workdir with a model/
  # folder is accepted), or "rand" for `architecture` with Glorot-uniform weights
  # (the paper's rand rows).
  m.init_from = init_from
  m.architecture = MINILM  # config + tokenizer when init_from="rand"
  # With "rand": config.json fields to change, "field=value,...", e.g. SMALL_TRANSFORMER.
  m.architecture_overrides = ""
  # With "rand": "xavier" (Glorot uniform, the paper's rand rows, which start from it) or
  # "normal" (HF's N(0, initializer_range): how BERT starts pretraining; Glorot's word
  # embeddings are 6 times smaller than its position embeddings, and contrast from them stalls).
  m.rand_init = "xavier"
  m.max_length = 48
  m.dtype = "float32"  # compute dtype; "bfloat16" on accelerators; parameters stay float32
  m.remat = False  # per-layer rematerialisation
  return m


def data_config(dataset: str = "banking77", shots: int = 10, seed: int = 0) -> ml_collections.ConfigDict:
  d = ml_collections.ConfigDict()
  d.name = dataset  # banking77 | clinc150 | hwu64 | csv (your own files)
  d.data_dir = ""  # folder holding <name>/ (default: the copies shipped in the package)
  d.train_file = ""  # name=csv: CSV/TSV/JSONL with text and label columns
  d.test_file = ""
  d.val_file = ""
  d.text_column = "text"
  d.label_column = "label"
  d.description_column = ""  # name=csv: a column saying what each intent is (else its name)
  d.train_split = "train"  # banking77/hwu64 also: train_minus_val (DialoGLUE's train)
  d.include_oos = False  # clinc150: add the out-of-scope rows as label `oos`
  d.shots = shots  # examples per intent; 0 = all
  d.allow_fewer = False  # a label with fewer than `shots` examples is an error
  d.seed = seed  # few-shot sample and pair construction
  d.intents = 0  # > 0: a seeded choice (data.seed) of this many intents, every split cut to them
  d.pool_shots = -1  # k-NN pool: -1 = the training examples, 0 = all train rows, N per label
  d.label_texts_in_pool = False  # each intent as text (description or name) joins the pool
  d.negatives = 3 if shots else 1  # n: negatives per side of each positive pair (Stage 2)
  d.max_pairs_per_label = 0  # cap positives per label (0 = none); full data grows quadratically
  return d


def _evaluator(type_: str, *, every: int, predictor: str) -> ml_collections.ConfigDict:
  """What every evaluator block has (`convfit_jax.evaluators`)."""
  e = ml_collections.ConfigDict()
  e.type = type_  # the module in convfit_jax/evaluators/
  e.every = every  # steps between evaluations during training; 0: before and after only
  e.before = True  # also evaluate the initial model (metrics get the suffix _before)
  e.predictor = predictor  # which of the task's predictors the evaluator reads
  return e


def intent_knn_eval(**overrides: Any) -> ml_collections.ConfigDict:
  """Settings of `evaluators/intent_knn.py` on the run's `data` set."""
  e = _evaluator("intent_knn", every=0, predictor="text")
  e.k = 1
  e.vote = "majority"  # k > 1: majority | weighted
  e.batch_size = 32  # packed rows per encoder call (`Encoder.encode`)
  e.mlp = False  # also train the MLP baseline on frozen encodings of the training examples
  e.tsne = True  # t-SNE PNG of 12 intents (tsne_before.png and tsne_after.png; tsne.png)
  # "val" for model selection: the validation split takes the test set's place (banking77
  # and hwu64 then need data.train_split="train_minus_val", their train.csv holds val).
  e.split = "test"
  e.max_test = 0  # > 0: evaluate on a seeded subset of this many test (or val) rows
  e.oos = False  # clinc150: threshold chosen on val; in-scope accuracy and OOS recall
  # After training, also k-NN with these larger pools, no retraining (the paper's
  # inference-time augmentation), as N per intent, 0 = every training row; e.g. (30, 0).
  e.extra_pools = ()
  e.update(overrides)
  return e


def response_selection_eval(**overrides: Any) -> ml_collections.ConfigDict:
  """Settings of `evaluators/response_selection.py`."""
  e = _evaluator("response_selection", every=500, predictor="response_scorer")
  # JSONL cases {"context", "candidates", "label"}; relative to the current directory.
  e.file = "../shared/data/conversations/sgd/test_rs100.jsonl"
  e.num_cases = 0  # 0 = all cases; fewer for quick looks (a seeded sample)
  e.prefix = ""  # before every metric name, e.g. "ubuntu_irc_test_" where a run has several
  e.batch_size = 32  # packed rows per encoder call (`Encoder.encode`)
  e.update(overrides)
  return e


def sts_eval(**overrides: Any) -> ml_collections.ConfigDict:
  """Settings of `evaluators/sts.py` (its files: the run's `data.sts_dir`, `data.sick_dir`)."""
  e = _evaluator("sts", every=0, predictor="text")
  e.batch_size = 32  # packed rows per encoder call (`Encoder.encode`)
  e.adapt = True  # also train the linear transformation on STS-B train (selected on dev)
  e.adapt_epochs = 20
  e.adapt_batch_size = 64
  # Adam rates of the transformation; several: each trained, the best on STS-B dev kept.
  e.adapt_learning_rates = (1e-4,)
  e.update(overrides)
  return e


def nli_eval(**overrides: Any) -> ml_collections.ConfigDict:
  """Settings of `evaluators/nli.py`: accuracy of the task's NLI classifier on one file."""
  e = _evaluator("nli", every=0, predictor="nli")
  e.file = f"{SICK_DIR}/test.tsv"  # TSV label, sentence1 (premise), sentence2
  e.prefix = ""  # before the metric name, e.g. "snli_test_"
  e.max_pairs = 0  # > 0: a seeded sample of this many pairs
  e.batch_size = 32
  e.before = False  # the classifier starts untrained
  e.update(overrides)
  return e


def byte_error_eval(**overrides: Any) -> ml_collections.ConfigDict:
  """Settings of `evaluators/byte_error.py`: an auto-encoder's byte error by sentence length."""
  e = _evaluator("byte_error", every=0, predictor="autoencoder")
  e.file = "../shared/data/text/enwiki/test.tsv"  # one sentence per row, column `sentence`
  e.max_sentences = 0  # > 0: a seeded sample of this many test sentences
  e.batch_size = 64  # sentences per call
  e.examples = 3  # test sentences logged with their reconstructions
  e.before = False  # the random model's error is ~100%
  e.update(overrides)
  return e


def sts_data(c: ml_collections.ConfigDict) -> None:
  """Adds the STS evaluator's files to `c.data`."""
  c.data.sts_dir = STSB_DIR  # STS-B train.tsv, dev.tsv, test.tsv
  c.data.sick_dir = SICK_DIR  # SICK test.tsv for SICK-R; "" leaves it out


def trim_evals_for_runlocal(c: ml_collections.ConfigDict) -> None:
  """A smoke run's evaluations: 100 response-selection cases, 300 NLI pairs, 2 STS
  adaptation epochs (where the blocks have them)."""
  for e in c.evals.values():
    if "num_cases" in e:
      e.num_cases = 100
    if "max_pairs" in e:
      e.max_pairs = 300
    if "adapt_epochs" in e:
      e.adapt_epochs = 2


def mesh_and_distributed(c: ml_collections.ConfigDict) -> None:
  """Adds the `mesh` and `distributed` blocks every training config has."""
  c.mesh = ml_collections.ConfigDict()
  # N > 1: parameters and AdamW state sharded N ways over the mesh `model` axis (FSDP).
  c.mesh.model_parallel = 1
  c.distributed = ml_collections.ConfigDict()
  # Leave empty on a single machine, SLURM (srun) or Cloud TPU VMs (auto-detected).
  c.distributed.coordinator_address = ""  # "host:port" of process 0
  c.distributed.num_processes = 0
  c.distributed.process_id = -1


def train_config(**values: Any) -> ml_collections.ConfigDict:
  """The optimiser and loop settings both stages share, updated by `values`."""
  t = ml_collections.ConfigDict()
  t.max_steps = 0  # > 0: stop (and end the LR decay) after this many steps
  t.min_steps = 0  # floor on the epochs' steps (a small set's few epochs still train enough)
  t.learning_rate = 2e-5
  t.warmup_fraction = 0.1
  t.weight_decay = 0.01  # not on biases and LayerNorm
  t.clip_norm = 1.0  # sentence-transformers' default max_grad_norm; 0 disables
  t.log_every = 20  # steps per logged window (train/loss is the window's mean)
  t.checkpoint_every = 500
  t.keep_checkpoints = 2
  t.progress = True  # the terminal's progress bar (IntentClassifier.fit(progress=False) hides it)
  t.update(values)
  return t
