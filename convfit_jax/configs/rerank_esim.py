"""ESIM reranker for multi-turn response selection (Chen & Wang 2019), on ubuntu_irc.

  python -m convfit_jax.main --config=configs/rerank_esim.py
  python -m convfit_jax.main --config=configs/rerank_esim.py:runlocal   # a few-minute smoke run
  python -m convfit_jax.main --config=configs/rerank_esim.py:model=sentence_lstm   # the baseline

`model=sentence_lstm` trains the same paper's sentence-encoding baseline instead (a
Siamese BiLSTM with 4-head self-attention pooling and an MLP on the pair; same words,
data and optimiser).

Defaults are the paper's for Lowe et al.'s Ubuntu corpus (the 1:1 training format
ubuntu_irc has): BiLSTMs and MLP of 300, Adam at 2e-4, batch 16, context cut to its last
400 words and the response to its first 150, embeddings fine-tuned. The paper's vectors
were 300-d (GloVe 840B, fastText, word2vec on the corpus); the only pretrained vectors
here are GloVe 6B 50-d, so words are 50 wide. One addition to the paper: words outside the
training vocabulary hash into 10,000 ids of their own instead of one unknown id, so the
nick a reply starts with, unseen in training, still matches its mention in the history.
Evaluated on ubuntu_irc's dev and test 1-of-10 cases and test 1-of-100 cases (paths
relative to the current directory).
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common

UBUNTU = "../shared/data/conversations/ubuntu_irc"
GLOVE = "../shared/data/vectors/glove6b50d/vectors.txt"


def rerank_evals(c: ml_collections.ConfigDict, *, every: int) -> None:
  """The response-selection blocks every reranker config evaluates (`train.rerank`)."""
  c.evals = ml_collections.ConfigDict()
  for name, every_, before in (("dev_rs10", every, True), ("test_rs10", 0, False),
                               ("test_rs100", 0, False)):
    c.evals[name] = common.response_selection_eval(
        file=f"{UBUNTU}/{name}.jsonl", every=every_, before=before, prefix=f"ubuntu_irc_{name}_",
        batch_size=64)  # pairs per reranker call


def shrink_for_runlocal(c: ml_collections.ConfigDict) -> None:
  """A few-minute smoke run: few rows, few steps, sampled evaluation cases."""
  c.data.max_rows = 1024
  c.train.max_steps = 30
  c.train.checkpoint_every = 15
  c.train.log_every = 5
  for e in c.evals.values():
    e.num_cases = 40
    e.every = 0


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/rerank_esim.py", model="esim", runlocal=False)
  if a.model not in ("esim", "sentence_lstm"):
    raise ValueError(f"configs/rerank_esim.py: model={a.model!r}; esim or sentence_lstm")
  c = ml_collections.ConfigDict()
  c.task = "rerank"
  c.workdir = f"workdirs/rerank_{a.model}"  # relative to the current directory
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  c.model.name = a.model  # the model module in convfit_jax/models/
  c.model.vectors = GLOVE  # "word v1 ... vd" lines; "" = random initial embeddings
  c.model.embed_dim = 50  # the vectors' width
  c.model.freeze_embeddings = False  # the paper fine-tunes them on Lowe's Ubuntu
  c.model.min_count = 2  # vocabulary: training words seen at least this often
  c.model.max_vocab = 0  # and at most this many ids (0 = no limit)
  # Unknown words hashed into this many ids of their own (0: all share one): a test nick
  # the training texts lack still matches itself in the history (`data.words`). Without
  # them ESIM fits the training pairs and stays near chance on test (docs/experiments/response_selection.md).
  c.model.oov_buckets = 10_000
  # A finished run of this model (workdir) to go on from, its vocabulary and weights, e.g.
  # on retrieved negatives after random ones; "" = built from data.train. Sizes must match.
  c.model.init_from = ""
  c.model.hidden = 300  # BiLSTMs, the local-matching projection and the MLP
  c.model.dropout = 0.0  # on the MLP's input and hidden layer
  # Products in "bfloat16" (float32 accumulation and states): faster on AMX CPUs, GPUs, TPUs.
  c.model.dtype = "float32"
  c.model.max_context = 400  # words, the context's last ones (turns joined by __eou__)
  c.model.max_response = 150  # words, the response's first ones
  if a.model == "sentence_lstm":
    c.model.heads = 4  # self-attention pooling heads
    c.model.attention_dim = 300  # their hidden width

  c.data = ml_collections.ConfigDict()
  c.data.train = f"{UBUNTU}/train.tsv"  # history \t response \t label (1 true, 0 random)
  c.data.max_rows = 0  # > 0: a seeded subset of this many rows
  c.data.prefetch = 2  # batches prepared ahead in a background thread

  # Adam as the paper: no weight decay, no warm-up; gradients clipped at norm 10 as ESIM's
  # reference code does. The learning rate decays linearly to 0 at the last step.
  c.train = common.train_config(learning_rate=2e-4, warmup_fraction=0.0, weight_decay=0.0,
                                clip_norm=10.0, log_every=20, checkpoint_every=500)
  c.train.batch_size = 16
  c.train.epochs = 1

  rerank_evals(c, every=1000)
  common.mesh_and_distributed(c)
  if a.runlocal:
    c.workdir = f"workdirs/rerank_{a.model}_runlocal"
    c.model.hidden = 32
    if a.model == "sentence_lstm":
      c.model.attention_dim = 32
    c.model.max_context = 100
    c.model.max_response = 30
    c.train.batch_size = 32
    shrink_for_runlocal(c)
  c.lock()
  return c
