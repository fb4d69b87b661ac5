"""The byte-level recursive convolutional auto-encoder of seed 003, on English Wikipedia sentences.

  python -m convfit_jax.main --config=configs/byte_autoencoder.py                  # CPU size
  python -m convfit_jax.main --config=configs/byte_autoencoder.py:padding=right    # unbalanced
  python -m convfit_jax.main --config=configs/byte_autoencoder.py:shared=false     # static
  python -m convfit_jax.main --config=configs/byte_autoencoder.py:norm_per_recursion=false
  python -m convfit_jax.main --config=configs/byte_autoencoder.py:size=paper       # accelerator
  python -m convfit_jax.main --config=configs/byte_autoencoder.py:runlocal         # smoke run

Arguments: size (cpu: 2^K = 256 bytes, d = 128, N = 2 convs per group, latent 16 x 128;
paper: 2^K = 1024, d = 256, N = 8, latent 4 x 256 = 1,024 floats, 6.70M parameters),
padding (balanced | right), shared (false: the static model, weights of its own for
each recursion), norm_per_recursion (false: one set of BatchNorm statistics for every
depth, the ablation of the paper's per-recursion statistics), steps, learning_rate, seed, workdir, runlocal.

Training as the paper: SGD with momentum 0.5, batches of 32, global-norm clipping, a
high learning rate, x 0.1 steps after the first part of training (the paper: every
epoch after the 10th of 16). Evaluated after training: byte error on enwiki test by
length bucket (`evaluators/byte_error.py`), a PNG in the workdir, decoded examples in the log.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common

ENWIKI = "../shared/data/text/enwiki"
SIZES = {
    # length 2^K, d, N, latent positions 2^r, steps
    "cpu": dict(length=256, d=128, layers=2, latent_positions=16, steps=3000),
    "paper": dict(length=1024, d=256, layers=8, latent_positions=4, steps=100_000),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/byte_autoencoder.py", size="cpu", padding="balanced",
                       shared=True, norm_per_recursion=True, steps=0, learning_rate=0.0, seed=0,
                       workdir="", runlocal=False)
  if a.size not in SIZES:
    raise ValueError(f"configs/byte_autoencoder.py: size={a.size!r}; one of {sorted(SIZES)}")
  size = SIZES[a.size]
  c = ml_collections.ConfigDict()
  c.task = "byte_autoencoder"
  name = (f"{a.size}_{a.padding}_{'shared' if a.shared else 'static'}"
          + ("" if a.norm_per_recursion else "_one_norm"))
  c.workdir = a.workdir or f"workdirs/byte_autoencoder/{name}_seed{a.seed}"
  c.seed = a.seed

  c.model = ml_collections.ConfigDict()
  c.model.name = "byte_autoencoder"  # convfit_jax/models/byte_autoencoder.py
  c.model.length = size["length"]  # 2^K positions: bytes + end-of-sequence must fit
  c.model.d = size["d"]  # channels of every conv (and the byte embedding)
  c.model.layers = size["layers"]  # N convs per group, in residual blocks of two
  c.model.latent_positions = size["latent_positions"]  # 2^r: the latent is d * 2^r floats
  c.model.padding = a.padding  # balanced (the paper's Figure 2) or right
  c.model.shared = a.shared  # one set of recursive weights; False: the static model
  c.model.momentum = 0.9  # BatchNorm running averages
  # BatchNorm statistics for each recursion (the paper's); False: one set for every depth
  c.model.norm_per_recursion = a.norm_per_recursion

  c.data = ml_collections.ConfigDict()
  c.data.train = f"{ENWIKI}/train.tsv"  # column `sentence`; longer than 2^K - 1 bytes: left out
  c.data.max_sentences = 0  # > 0: a seeded sample of this many training sentences
  c.data.prefetch = 2

  c.train = common.train_config(log_every=50, checkpoint_every=500)
  c.train.optimizer = "sgd"
  c.train.learning_rate = a.learning_rate or 1.0  # high, as the paper's (up to 30 with clipping)
  c.train.momentum = 0.5
  c.train.clip_norm = 1.0  # global-norm clipping: what keeps a high learning rate stable
  c.train.batch_size = 32
  c.train.epochs = 100
  c.train.max_steps = a.steps or size["steps"]
  c.train.decay_factor = 0.1

  c.evals = ml_collections.ConfigDict()
  c.evals.byte_error = common.byte_error_eval(file=f"{ENWIKI}/test.tsv")
  common.mesh_and_distributed(c)

  if a.runlocal:
    c.workdir = a.workdir or f"workdirs/byte_autoencoder_runlocal/{name}"
    c.data.max_sentences = 2000
    c.model.length = 128
    c.model.d = 64
    c.train.max_steps = a.steps or 60
    c.train.checkpoint_every = 20
    c.train.log_every = 10
    c.evals.byte_error.max_sentences = 200
  # x decay_factor every decay_every steps after decay_start (the paper's x 0.1 an epoch
  # after 10 of 16 epochs): here at 6/8 and 7/8 of the run.
  c.train.decay_start = c.train.max_steps * 5 // 8
  c.train.decay_every = c.train.max_steps // 8
  c.lock()
  return c
