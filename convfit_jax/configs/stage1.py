"""Stage 1 (ConvFiT): conversational fine-tuning of a pretrained encoder.

  python -m convfit_jax.main --config=configs/stage1.py
  python -m convfit_jax.main --config=configs/stage1.py:runlocal   # a few-minute smoke run
  python -m convfit_jax.main --config=configs/stage1.py --config.train.max_steps=200
  python -m convfit_jax.main --config=configs/stage1.py:dataset=ubuntu_irc   # the retriever of issue 13

Defaults are the paper's settings (batch 256, 2 epochs, AdamW 2e-5 with 10% linear
warm-up, weight decay 0.01, scale 20, max length 48) on the Schema-Guided Dialogue
pairs in ../shared/data (paths are relative to the current directory: run from the
repository root, or pass your own). For Reddit data in the PolyAI
conversational-datasets JSON format: --config.data.train=/path/reddit-train.jsonl
(format detected by suffix).
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The Stage 1 config; `runlocal` shrinks it to a smoke run."""
  a = common.parse_arg(arg, "configs/stage1.py", dataset="sgd", runlocal=False)
  if a.dataset not in ("sgd", "ubuntu_irc"):
    raise ValueError(f"configs/stage1.py: dataset={a.dataset!r}; sgd or ubuntu_irc")
  c = ml_collections.ConfigDict()
  c.task = "stage1"
  c.workdir = "workdirs/stage1" if a.dataset == "sgd" else f"workdirs/stage1_{a.dataset}"
  c.seed = 0

  c.model = common.model_config(name="dual_encoder")
  c.model.projection_dim = 0  # >0: Dense + tanh head of this width on both sides
  c.model.response_tower = False  # a separate (initially identical) response encoder
  c.model.response_ff = False  # residual feed-forward layer on the response side only
  c.model.response_ff_hidden = 0  # its hidden width; 0 = 4 * dim
  c.model.response_ff_depth = 1  # its residual blocks
  c.model.dropout = True  # as sentence-transformers trains

  c.data = ml_collections.ConfigDict()
  # Relative to the current directory. ubuntu_irc's is the rerankers' 1:1 file: its
  # label-1 rows are the pairs (`data.conversations`).
  conversations = f"../shared/data/conversations/{a.dataset}"
  c.data.train = f"{conversations}/train.tsv"
  c.data.format = ""  # "" = by suffix; "tsv" | "jsonl" (Reddit JSON lines are jsonl)
  c.data.fraction = 1.0  # keep this seeded share of the pairs (data-size study)
  c.data.shuffle_buffer = 100_000  # >= the file size gives a uniform shuffle per epoch
  c.data.prefetch = 2  # batches tokenised ahead in a background thread

  c.loss = ml_collections.ConfigDict()
  c.loss.scale = 20.0  # D in S = D cos(c, r)
  c.loss.symmetric = False  # also rank contexts for each response
  c.loss.mask_duplicates = True  # identical responses are not each other's negatives

  c.train = common.train_config(log_every=10, checkpoint_every=200)
  c.train.batch_size = 256  # global pairs per step (all devices, all hosts)
  c.train.epochs = 2
  c.train.grad_cache = True  # batch 256 in the memory of a small chunk
  c.train.chunk_size = 32  # rows per grad-cache chunk; a multiple of the data-parallel size

  c.evals = ml_collections.ConfigDict()
  c.evals.response_selection = common.response_selection_eval(
      file=f"{conversations}/test_rs100.jsonl")
  if a.dataset == "ubuntu_irc":  # its 1-of-10 cases too, every metric named by its set
    c.evals.response_selection.prefix = "ubuntu_irc_test_rs100_"
    c.evals.test_rs10 = common.response_selection_eval(
        file=f"{conversations}/test_rs10.jsonl", prefix="ubuntu_irc_test_rs10_")
  common.mesh_and_distributed(c)

  if a.runlocal:
    c.workdir = "workdirs/stage1_runlocal"
    c.data.fraction = 0.05
    c.train.batch_size = 64
    c.train.epochs = 1
    c.train.max_steps = 20
    c.train.chunk_size = 16
    c.train.checkpoint_every = 10
    for e in c.evals.values():
      e.num_cases, e.every = 100, 0
  c.lock()
  return c
