"""Stage 1 (ConvFiT): conversational fine-tuning of a pretrained encoder.

  python -m convfit_jax.main --config=configs/stage1.py
  python -m convfit_jax.main --config=configs/stage1.py:runlocal   # a few-minute smoke run
  python -m convfit_jax.main --config=configs/stage1.py --config.train.max_steps=200

Defaults are the paper's settings (batch 256, 2 epochs, AdamW 2e-5 with 10% linear
warm-up, weight decay 0.01, scale 20, max length 48) on the Schema-Guided Dialogue
pairs in ../shared/data. For Reddit data in the PolyAI conversational-datasets JSON
format: --config.data.train=/path/reddit-train.jsonl (format detected by suffix).
"""

from __future__ import annotations

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  """The Stage 1 config; `arg="runlocal"` shrinks it to a smoke run."""
  c = ml_collections.ConfigDict()
  c.task = "stage1"
  c.workdir = "workdirs/stage1"  # relative to the current directory
  c.seed = 0

  c.model = ml_collections.ConfigDict()
  # A folder or hub id (pretrained, or a Stage 1/2 output), or "rand".
  c.model.init_from = "sentence-transformers/all-MiniLM-L6-v2"
  c.model.architecture = "sentence-transformers/all-MiniLM-L6-v2"  # config + tokenizer for "rand"
  c.model.max_length = 48
  c.model.projection_dim = 0  # >0: Dense + tanh head of this width on both sides
  c.model.response_tower = False  # a separate (initially identical) response encoder
  c.model.response_ff = False  # residual feed-forward layer on the response side only
  c.model.response_ff_hidden = 0  # its hidden width; 0 = 4 * dim
  c.model.dropout = True  # as sentence-transformers trains
  c.model.dtype = "float32"  # compute dtype; "bfloat16" on accelerators
  c.model.remat = False  # per-layer rematerialisation (composes with grad_cache)

  c.data = ml_collections.ConfigDict()
  c.data.train = "../shared/data/conversations/sgd/train.tsv"  # relative to the repo root
  c.data.format = ""  # "" = by suffix; "tsv" | "jsonl" (Reddit JSON lines are jsonl)
  c.data.fraction = 1.0  # keep this seeded share of the pairs (data-size study)
  c.data.shuffle_buffer = 100_000  # >= the file size gives a uniform shuffle per epoch
  c.data.prefetch = 2  # batches tokenised ahead in a background thread

  c.loss = ml_collections.ConfigDict()
  c.loss.scale = 20.0  # D in S = D cos(c, r)
  c.loss.symmetric = False  # also rank contexts for each response
  c.loss.mask_duplicates = True  # identical responses are not each other's negatives

  c.train = ml_collections.ConfigDict()
  c.train.batch_size = 256  # global pairs per step (all devices, all hosts)
  c.train.epochs = 2
  c.train.max_steps = 0  # >0: stop (and end the LR decay) after this many steps
  c.train.learning_rate = 2e-5
  c.train.warmup_fraction = 0.1
  c.train.weight_decay = 0.01
  c.train.clip_norm = 1.0  # sentence-transformers' max_grad_norm; 0 disables
  c.train.grad_cache = True  # batch 256 in the memory of a small chunk
  c.train.chunk_size = 32  # rows per grad-cache chunk; a multiple of the data-parallel size
  c.train.log_every = 10
  c.train.checkpoint_every = 200
  c.train.keep_checkpoints = 2

  c.eval = ml_collections.ConfigDict()
  c.eval.file = "../shared/data/conversations/sgd/test_rs100.jsonl"  # "" disables evaluation
  c.eval.num_cases = 0  # 0 = all 2000 cases; fewer for quick looks (seeded sample)
  c.eval.every = 500  # steps between evaluations during training; 0 = before and after only
  c.eval.batch_size = 128

  c.mesh = ml_collections.ConfigDict()
  # N > 1: parameters and AdamW state sharded N ways over the mesh `model` axis (FSDP).
  c.mesh.model_parallel = 1

  c.distributed = ml_collections.ConfigDict()
  # Leave empty on a single machine, SLURM (srun) or Cloud TPU VMs (auto-detected).
  c.distributed.coordinator_address = ""  # "host:port" of process 0
  c.distributed.num_processes = 0
  c.distributed.process_id = -1

  if arg == "runlocal":
    c.workdir = "workdirs/stage1_runlocal"
    c.data.fraction = 0.05
    c.train.batch_size = 64
    c.train.epochs = 1
    c.train.max_steps = 20
    c.train.chunk_size = 16
    c.train.checkpoint_every = 10
    c.eval.num_cases = 100
    c.eval.every = 0
  elif arg:
    raise ValueError(f"unknown config arg {arg!r}; use 'runlocal' or nothing")
  c.lock()
  return c
