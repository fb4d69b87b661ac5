"""The paper's protocol: datasets x {10-shot, 30-shot, full} x seeds {0, 1, 2} x losses.

    python -m convfit_jax.main --config=configs/protocol.py
    python -m convfit_jax.main --config=configs/protocol.py:datasets=banking77,shots=10,losses=ocl \\
        --config.stage2.train.max_steps=150 --config.stage2.train.learning_rate=1e-4
    python -m convfit_jax.main --config=configs/protocol.py:runlocal   # a one-minute smoke run

Every cell is a Stage 2 run in its own workdir (workdir/<dataset>_<shots>shot_<loss>_seed<s>),
so an interrupted protocol resumes where it stopped and finished runs are not repeated.
Each cell's config is `stage2` (the Stage 2 config, any field overridable as
--config.stage2.x.y=...) with the cell's dataset, shots, loss and seed, and the
negatives and epochs the paper ties to the shots. The table (workdir/results.md, the
layout of the paper's Table 2) gives the mean over seeds and the spread (sample
standard deviation) for: the encoder before Stage 2 with k-NN, the MLP baseline on
its frozen encodings, and ConvFiT Stage 2 per loss (and per larger k-NN pool, from
stage2.evals.knn.extra_pools). List arguments are '+'-separated: shots=10+30.

`losses` names objectives: ocl, cos, smax, cl on the paper's pairs; dense_ocl, dense_cos,
dense_smax, dense_cl (the same losses over every pair of a label batch) and supcon (supervised
contrast), which train on label batches (`train.sampler=labels`, P x K from
stage2.train.labels_per_batch / examples_per_label), so the table puts both side by side:

    python -m convfit_jax.main --config=configs/protocol.py:datasets=banking77,shots=10,losses=ocl+supcon+dense_ocl \\
        --config.stage2.train.max_steps=150 --config.stage2.train.learning_rate=1e-4

`intents=5+10+20` adds small sets: each cell a seeded choice of that many intents (`data.intents`,
drawn by the cell's seed), a column per size (docs/experiments/stage2_small_intent_sets.md). Seeds
are the outer loop, so a grid cut short holds whole seeds.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common, stage2


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/protocol.py", datasets=("banking77", "clinc150", "hwu64"),
                       shots=(10, 30, 0), seeds=(0, 1, 2), losses=("ocl", "cos", "smax"),
                       intents=(0,),
                       init_from=common.MINILM, workdir="workdirs/protocol", runlocal=False)
  c = ml_collections.ConfigDict()
  c.task = "protocol"
  c.workdir = a.workdir
  c.datasets = a.datasets
  c.shots = a.shots  # 0 = full data
  c.seeds = a.seeds
  c.losses = a.losses
  c.intents = a.intents  # > 0: a seeded subset of that many intents (data.intents; 0 = all)
  c.stage2 = stage2.get_config(f"init_from={a.init_from}")
  c.stage2.evals.knn.mlp = True  # the MLP baseline row (on the encoder before Stage 2)
  c.stage2.evals.knn.tsne = False
  if a.runlocal:
    c.workdir = "workdirs/protocol_runlocal"
    c.datasets, c.shots, c.seeds, c.losses = ("banking77",), (2,), (0,), ("ocl",)
    c.stage2.train.max_steps = 4
    c.stage2.train.batch_size = 8
    c.stage2.evals.knn.max_test = 100
    c.stage2.evals.knn.mlp = False
  return c
