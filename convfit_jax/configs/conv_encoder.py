"""The word-level recursive convolutional sentence encoder of seed 003: NLI training, Stage 1,
Stage 2.

  python -m convfit_jax.main --config=configs/conv_encoder.py                       # NLI
  python -m convfit_jax.main --config=configs/conv_encoder.py:stage=stage1,init_from=workdirs/conv_encoder/nli_balanced_none_seed0
  python -m convfit_jax.main --config=configs/conv_encoder.py:bow=plus              # + BoW
  python -m convfit_jax.main --config=configs/conv_encoder.py:bow=only              # BoW baseline
  python -m convfit_jax.main --config=configs/conv_encoder.py:padding=variable
  python -m convfit_jax.main --config=configs/conv_encoder.py:stage=stage2,init_from=workdirs/conv_encoder/nli_balanced_none_seed0
  python -m convfit_jax.main --config=configs/conv_encoder.py:runlocal              # smoke run

Arguments: stage (nli: the input-response task with NLI alone, InferSent-style, as the
paper trains it; stage1: ConvFiT Stage 1 on the SGD conversations; stage2: ConvFiT Stage
2 on label batches, banking77 10-shot),
padding (balanced | right | variable), bow (none | plus | only), layers (N convs per
group; the paper's best: 8), shared (false: the static model), init_from (stage2: a
finished NLI or Stage 1 run's workdir; "" = a fresh encoder), vectors (GloVe-format word vectors,
frozen), steps, seed, workdir, runlocal.

NLI: SICK train + SNLI dev (about 14k pairs; the paper had SNLI's 550k), the paper's
classifier (three fully connected layers on [u; v; |u - v|; u * v]), Adam 1e-3, batches
of 64 pairs, 10 epochs; evaluated by STS-B / SICK-R (`evaluators/sts.py`), SICK-E dev
and test, SNLI test. Stage 1: `configs/stage1.py` (batch 256, 2 epochs, scale 20) at a
learning rate of 1e-3, the whole batch in one chunk (BatchNorm's statistics are the global
batch's), no dropout. Stage 2: `configs/stage2_dense.py` (supcon on 16 intents x 4
utterances, 10 epochs: 150 steps) with the encoder at a learning rate of 1e-3.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common, stage1, stage2_dense

GLOVE = "../shared/data/vectors/glove6b50d/vectors.txt"
NLI_SETS = {"sick_dev": f"{common.SICK_DIR}/dev.tsv", "sick_test": f"{common.SICK_DIR}/test.tsv",
            "snli_test": f"{common.SNLI_DIR}/test.tsv"}


def model_config(a: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """The encoder block (`models/conv_encoder.py`), wrapped by the model `name`."""
  m = ml_collections.ConfigDict()
  m.name = name  # the model family; it builds the encoder of `encoder`
  m.encoder = "conv_encoder"
  m.init_from = a.init_from  # a saved encoder (a finished run's workdir) or "" for a fresh one
  m.vectors = a.vectors  # word vectors (GloVe format); "" = random, trained
  m.embed_dim = 50  # the vectors' width, and every conv's (the paper: 300d GloVe)
  m.freeze_embeddings = True  # as the paper; then the vocabulary is the vectors file's
  m.min_count = 1  # vocabulary from training texts (random vectors): words seen this often
  m.max_vocab = 0  # 0 = no limit
  m.layers = a.layers  # N convs per group (prefix and recursive), residual blocks of two
  m.length = 64  # 2^K words: K = 6 recursions leave one word vector
  m.padding = a.padding  # balanced | right | variable
  m.bow = a.bow  # none | plus (the paper's "+ BoW") | only (the BoW baseline)
  m.shared = a.shared  # one set of recursive weights; False: the static model
  m.momentum = 0.9  # BatchNorm running averages
  m.zero_init = True  # residual blocks start as the identity: the vector starts at the words' scale
  m.max_length = 64  # words read per sentence
  m.dtype = "float32"
  return m


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/conv_encoder.py", stage="nli", padding="balanced", bow="none",
                       layers=8, shared=True, init_from="", vectors=GLOVE, steps=0, seed=0,
                       workdir="", runlocal=False)
  stages = {"nli": nli_config, "stage1": stage1_config, "stage2": stage2_config}
  if a.stage not in stages:
    raise ValueError(f"configs/conv_encoder.py: stage={a.stage!r}; one of {tuple(stages)}")
  name = f"{a.stage}_{a.padding}_{a.bow}" + ("" if a.shared else "_static") + f"_seed{a.seed}"
  c = stages[a.stage](a)
  c.workdir = a.workdir or f"workdirs/conv_encoder{'_runlocal' if a.runlocal else ''}/{name}"
  c.lock()
  return c


def nli_config(a: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.task = "input_response"  # with train.batch_size = 0: NLI alone
  c.seed = a.seed
  c.model = model_config(a, "dual_encoder")
  c.model.dropout = 0.0  # none: BatchNorm regularises
  c.model.response_tower = False
  c.model.response_ff = False  # no conversations, so no response side
  c.model.response_ff_hidden = 0
  c.model.response_ff_depth = 1
  c.model.nli_hidden = (512, 512)  # with the output layer, the paper's three layers

  c.data = ml_collections.ConfigDict()
  c.data.train = ""  # conversation pairs: none (train.batch_size = 0)
  c.data.format = ""
  c.data.max_pairs = 0
  c.data.max_length = 0  # = model.max_length
  c.data.nli_train = f"{common.SICK_DIR}/train.tsv+{common.SNLI_DIR}/dev.tsv"
  c.data.nli_fraction = 1.0
  c.data.prefetch = 2
  common.sts_data(c)

  c.loss = ml_collections.ConfigDict()
  c.loss.scale = 20.0  # unused without conversations

  c.train = common.train_config(log_every=50, checkpoint_every=500)
  c.train.batch_size = 0  # conversation pairs per step: none
  c.train.nli_batch_size = 64
  c.train.nli_weight = 1.0
  c.train.epochs = 10
  c.train.max_steps = a.steps
  c.train.learning_rate = 1e-3
  c.train.weight_decay = 0.0
  c.train.heads = ()
  c.train.head_learning_rate = 0.0

  c.evals = ml_collections.ConfigDict()
  c.evals.sts = common.sts_eval(batch_size=64)
  for set_name, path in NLI_SETS.items():
    c.evals[set_name] = common.nli_eval(file=path, prefix=f"{set_name}_")
  common.mesh_and_distributed(c)

  if a.runlocal:
    c.train.max_steps = a.steps or 30
    c.train.nli_batch_size = 32
    c.train.checkpoint_every = 10
    c.train.log_every = 5
    c.model.layers = 2
    common.trim_evals_for_runlocal(c)
  return c


def stage1_config(a: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c = stage1.get_config(f"runlocal={a.runlocal}")
  with c.unlocked():
    c.seed = a.seed
    dual = c.model
    c.model = model_config(a, "dual_encoder")
    for field in ("projection_dim", "response_tower", "response_ff", "response_ff_hidden",
                  "response_ff_depth"):
      c.model[field] = dual[field]
    c.model.dropout = False  # none: BatchNorm regularises
    c.train.learning_rate = 1e-3  # a small model, trained through its convs and BatchNorms
    c.train.grad_cache = False  # small enough for one chunk: BatchNorm sees the whole batch
    c.train.chunk_size = 0
    if a.steps:
      c.train.max_steps = a.steps
    if a.runlocal:
      c.model.layers = 2
  return c


def stage2_config(a: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  c = stage2_dense.get_config(f"seed={a.seed},runlocal={a.runlocal}")
  c.model = model_config(a, "siamese")
  c.train.learning_rate = 1e-3  # a small model, trained through its convs and BatchNorms
  # 16 x 4, the label batches its docs/experiments/recursive_conv.md rows were measured on
  c.train.labels_per_batch, c.train.examples_per_label = 16, 4
  if a.steps:
    c.train.max_steps = a.steps
  return c
