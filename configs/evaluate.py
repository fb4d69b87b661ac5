"""Intent detection with any encoder, no training: k-NN (and the MLP baseline).

    python -m convfit_jax.main --config=configs/evaluate.py                     # off-the-shelf MiniLM
    python -m convfit_jax.main --config=configs/evaluate.py:init_from=workdirs/stage2/banking77_10shot_ocl_seed0
    python -m convfit_jax.main --config=configs/evaluate.py:dataset=clinc150,oos --config.eval.mlp=True

Arguments: dataset, shots, seed, init_from (a folder, hub id, or a Stage 1/2 workdir),
workdir, and the flag `oos` (clinc150 out-of-scope detection by a threshold chosen
on val). `--config.data.pool_shots=30` (or 0 for all) keeps training at `shots` but
searches a larger pool: the paper's inference-time augmentation.
"""

import ml_collections

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg, {"dataset", "shots", "seed", "init_from", "workdir", "oos"},
                          "configs/evaluate.py")
  dataset = args.get("dataset", "banking77")
  shots = int(args.get("shots", 10))
  seed = int(args.get("seed", 0))
  c = ml_collections.ConfigDict()
  c.task = "evaluate"
  c.workdir = args.get("workdir", f"workdirs/evaluate/{dataset}_{shots or 'full'}shot_seed{seed}")
  c.seed = seed  # MLP initialisation and t-SNE
  c.model = common.model_config(args.get("init_from", common.MINILM))
  c.data = common.data_config(dataset, shots, seed)
  c.eval = common.eval_config()
  c.eval.oos = args.get("oos") == "True"
  return c
