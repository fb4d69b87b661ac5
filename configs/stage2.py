"""ConvFiT Stage 2: task-tailored contrastive fine-tuning, then k-NN intent detection.

    python -m convfit_jax.main --config=configs/stage2.py
    python -m convfit_jax.main --config=configs/stage2.py:dataset=hwu64,shots=30,loss=cos
    python -m convfit_jax.main --config=configs/stage2.py:runlocal --config.train.epochs=1

The argument is comma-separated `key=value` pairs (dataset, shots, loss, seed,
init_from, workdir) plus the flag `runlocal` (20 steps, 500 test rows: a smoke run).
Defaults are the paper's: all-MiniLM-L6-v2, banking77, 10-shot, seed 0, ocl, n=3
negatives per side, batch 32 pairs, max length 48, AdamW 2e-5 with 10% warm-up then
linear decay, weight decay 0.01, d_o=512 tanh projection; 10/5/2 epochs for
10-shot/30-shot/full.
"""

import ml_collections

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg, {"dataset", "shots", "loss", "seed", "init_from", "workdir",
                                "runlocal"}, "configs/stage2.py")
  dataset = args.get("dataset", "banking77")
  shots = int(args.get("shots", 10))
  loss = args.get("loss", "ocl")
  seed = int(args.get("seed", 0))

  c = ml_collections.ConfigDict()
  c.task = "stage2"
  c.workdir = args.get("workdir", f"workdirs/stage2/{dataset}_{shots or 'full'}shot_{loss}_seed{seed}")
  c.seed = seed  # new heads' init and dropout; data.seed draws the data
  c.dry_run = False  # build data and pairs, write counts and memory estimate, train nothing

  c.model = common.model_config(args.get("init_from", common.MINILM))
  c.model.projection_dim = 512  # d_o: Dense + tanh after pooling; 0 for none

  c.data = common.data_config(dataset, shots, seed)

  c.train = ml_collections.ConfigDict()
  c.train.loss = loss  # ocl | cl | cos | smax
  c.train.margin = 0.5  # ocl / cl margin on cosine distance
  c.train.batch_size = 32  # pairs per step (global; a multiple of the device count)
  c.train.epochs = common.EPOCHS_BY_SHOTS.get(shots, 2)
  c.train.max_steps = 0  # > 0 cuts the run short (the schedule follows it)
  c.train.learning_rate = 2e-5
  c.train.warmup_fraction = 0.1
  c.train.weight_decay = 0.01  # not on biases and LayerNorm
  c.train.clip_norm = 1.0  # sentence-transformers' default max_grad_norm; 0 disables
  c.train.checkpoint_every = 500
  c.train.keep_checkpoints = 2
  c.train.log_every = 20

  c.eval = common.eval_config()
  c.eval.before = True  # also evaluate the encoder before training (knn_accuracy_before)

  c.mesh = ml_collections.ConfigDict()
  # N > 1: parameters and AdamW state sharded N ways over the mesh `model` axis (FSDP).
  c.mesh.model_parallel = 1

  if args.get("runlocal") == "True":
    c.train.max_steps = 20
    c.train.log_every = 5
    c.eval.max_test = 500
    c.eval.tsne = False
  return c
