"""ConvFiT Stage 2: task-tailored contrastive fine-tuning, then k-NN intent detection.

    python -m convfit_jax.main --config=configs/stage2.py
    python -m convfit_jax.main --config=configs/stage2.py:dataset=hwu64,shots=30,loss=cos
    python -m convfit_jax.main --config=configs/stage2.py:runlocal --config.train.epochs=1

Arguments: dataset, shots, loss, seed, init_from, workdir and the flag `runlocal`
(20 steps, 500 test rows: a smoke run). Defaults are the paper's: all-MiniLM-L6-v2,
banking77, 10-shot, seed 0, ocl, n=3 negatives per side, batch 32 pairs, max length 48,
AdamW 2e-5 with 10% warm-up then linear decay, weight decay 0.01, d_o=512 tanh
projection; 10/5/2 epochs for 10-shot/30-shot/full.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/stage2.py", dataset="banking77", shots=10, loss="ocl", seed=0,
                       init_from=common.MINILM, workdir="", runlocal=False)
  c = ml_collections.ConfigDict()
  c.task = "stage2"
  c.seed = a.seed  # new heads' init and dropout; data.seed draws the data
  c.dry_run = False  # build data and pairs, write counts and memory estimate, train nothing

  c.model = common.model_config(a.init_from, name="siamese")
  c.model.projection_dim = 512  # d_o: Dense + tanh after pooling; 0 for none

  c.data = common.data_config(a.dataset, a.shots, a.seed)

  c.train = common.train_config()
  c.train.loss = a.loss  # ocl | cl | cos | smax
  c.train.margin = 0.5  # ocl / cl margin on cosine distance
  c.train.batch_size = 32  # pairs per step (global; a multiple of the device count)
  c.train.epochs = common.EPOCHS_BY_SHOTS.get(a.shots, 2)

  c.evals = ml_collections.ConfigDict()
  c.evals.knn = common.intent_knn_eval()
  common.mesh_and_distributed(c)
  c.workdir = a.workdir or run_name(c, "workdirs/stage2")

  if a.runlocal:
    c.train.max_steps = 20
    c.train.log_every = 5
    c.evals.knn.max_test = 500
    c.evals.knn.tsne = False
  return c


def run_name(c: ml_collections.ConfigDict, parent: str) -> str:
  """parent/<dataset>_<shots>shot_<loss>_seed<seed>: one folder per protocol cell."""
  return f"{parent}/{c.data.name}_{c.data.shots or 'full'}shot_{c.train.loss}_seed{c.seed}"


def cell(template: ml_collections.ConfigDict, *, dataset: str, shots: int, loss: str, seed: int,
         parent: str) -> ml_collections.ConfigDict:
  """The Stage 2 config of one cell of the paper's grid: `template` with the cell's
  dataset, shots, loss and seed, and what the paper ties to them (negatives, epochs),
  in its own workdir under `parent`."""
  c = ml_collections.ConfigDict(template.to_dict())
  c.data.name, c.data.shots, c.data.seed, c.seed = dataset, shots, seed, seed
  c.data.negatives = 3 if shots else 1
  c.train.loss = loss
  c.train.epochs = common.EPOCHS_BY_SHOTS.get(shots, 2)
  c.workdir = run_name(c, parent)
  return c
