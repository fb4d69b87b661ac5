"""The paper's protocol: datasets x {10-shot, 30-shot, full} x seeds {0, 1, 2} x losses.

    python -m convfit_jax.main --config=configs/protocol.py
    python -m convfit_jax.main --config=configs/protocol.py:datasets=banking77,shots=10,losses=ocl

Every cell is a Stage 2 run in its own workdir (workdir/<dataset>_<shots>shot_<loss>_seed<s>),
so an interrupted protocol resumes where it stopped and finished runs are not repeated.
The table (workdir/results.md, the layout of the paper's Table 2) gives the mean over
seeds and the spread (sample standard deviation) for: the encoder off the shelf with
k-NN, the MLP baseline on its frozen encodings, and ConvFiT Stage 2 per loss.
List arguments are separated by '+' inside the config argument, e.g. shots=10+30.
"""

import ml_collections

from configs import common


def get_config(arg=None):
  args = common.parse_arg(arg, {"datasets", "shots", "seeds", "losses", "init_from", "workdir",
                                "max_steps"}, "configs/protocol.py")
  split = lambda key, default: args.get(key, default).replace("+", ",")
  c = ml_collections.ConfigDict()
  c.task = "protocol"
  c.workdir = args.get("workdir", "workdirs/protocol")
  c.datasets = split("datasets", "banking77+clinc150+hwu64")  # comma-separated
  c.shots = split("shots", "10+30+0")  # 0 = full data
  c.seeds = split("seeds", "0+1+2")
  c.losses = split("losses", "ocl+cos+smax")
  c.mlp = True  # MLP baseline row (on the encoder before Stage 2)
  # Rows for k-NN with larger pools after training (N per intent, 0 = all training rows):
  # the paper's inference-time augmentation, e.g. (30, 0) with shots=10.
  c.extra_pools = ()
  # Overrides applied to every Stage 2 run (configs/stage2.py); 0 / "" keep its defaults.
  c.init_from = args.get("init_from", common.MINILM)
  c.max_steps = int(args.get("max_steps", 0))  # > 0: cut every run (and its schedule) short
  c.max_test = 0  # > 0: evaluate on a seeded subset of the test set
  c.batch_size = 0
  c.learning_rate = 0.0
  c.dtype = ""
  return c
