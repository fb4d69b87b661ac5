"""ConvFiT Stage 2: task-tailored contrastive fine-tuning, then k-NN intent detection.

    python -m convfit_jax.main --config=configs/stage2.py
    python -m convfit_jax.main --config=configs/stage2.py:dataset=hwu64,shots=30,loss=cos
    python -m convfit_jax.main --config=configs/stage2.py:runlocal --config.train.epochs=1

The argument is comma-separated `key=value` pairs (dataset, shots, loss, seed, model,
workdir) plus the flag `runlocal` (a few steps on a small test subset, for smoke runs).
Defaults are the paper's: all-MiniLM-L6-v2, banking77, 10-shot, seed 0, ocl, n=3
negatives per side, batch 32 pairs, max length 48, AdamW 2e-5 with 10% warm-up
then linear decay, weight decay 0.01, d_o=512 tanh projection; 10/5/2 epochs for
10-shot/30-shot/full.
"""

import ml_collections

# The paper's epochs per few-shot setting (0 = full data).
EPOCHS_BY_SHOTS = {10: 10, 30: 5, 0: 2}


def parse_arg(arg: str | None) -> dict[str, str]:
  """'a=1,b=x,flag' -> {'a': '1', 'b': 'x', 'flag': 'True'}."""
  out = {}
  for part in filter(None, (arg or "").split(",")):
    key, sep, value = part.partition("=")
    out[key.strip()] = value.strip() if sep else "True"
  return out


def get_config(arg=None):
  args = parse_arg(arg)
  known = {"dataset", "shots", "loss", "seed", "model", "workdir", "runlocal"}
  if set(args) - known:
    raise ValueError(f"configs/stage2.py: unknown argument(s) {sorted(set(args) - known)}; "
                     f"known: {sorted(known)}")
  dataset = args.get("dataset", "banking77")
  shots = int(args.get("shots", 10))
  loss = args.get("loss", "ocl")
  seed = int(args.get("seed", 0))
  runlocal = args.get("runlocal") == "True"

  c = ml_collections.ConfigDict()
  c.task = "stage2"
  c.workdir = args.get("workdir", f"workdir/stage2/{dataset}_{shots or 'full'}shot_{loss}_seed{seed}")
  c.seed = seed  # parameter init of new heads, dropout, and the default data seed
  c.dry_run = False  # build data and pairs, write counts and memory estimate, train nothing

  c.model = ml_collections.ConfigDict()
  c.model.name = args.get("model", "sentence-transformers/all-MiniLM-L6-v2")
  # "pretrained": start from `model.name`; a folder (HF/sentence-transformers, or a
  # Stage 1 workdir, whose model/ sub-folder is used); "rand": `model.name`'s
  # architecture and tokenizer with Glorot-uniform weights (the paper's rand rows).
  c.model.init_from = "pretrained"
  c.model.projection_dim = 512  # d_o: Dense + tanh after pooling; 0 for none
  c.model.max_length = 48
  c.model.dtype = "float32"  # compute dtype; parameters stay float32
  c.model.remat = False  # per-layer rematerialisation

  c.data = ml_collections.ConfigDict()
  c.data.name = dataset  # banking77 | clinc150 | hwu64 | csv
  c.data.data_dir = ""  # folder holding <name>/ (default: the copies in the package)
  c.data.train_file = ""  # for name=csv: CSV/TSV/JSONL
  c.data.test_file = ""
  c.data.val_file = ""
  c.data.text_column = "text"
  c.data.label_column = "label"
  c.data.train_split = "train"  # banking77/hwu64 also: train_minus_val
  c.data.include_oos = False  # clinc150: add the out-of-scope rows as label `oos`
  c.data.shots = shots  # examples per intent; 0 = all
  c.data.allow_fewer = False  # a label with fewer than `shots` examples is an error
  c.data.seed = seed  # few-shot sample and pair construction
  c.data.pool_shots = -1  # k-NN pool: -1 = the training examples, 0 = all train rows, N per label
  c.data.negatives = 3 if shots else 1  # n: negatives per side of each positive pair
  c.data.max_pairs_per_label = 0  # cap positives per label (0 = none); full data grows quadratically

  c.train = ml_collections.ConfigDict()
  c.train.loss = loss  # ocl | cl | cos | smax
  c.train.margin = 0.5  # ocl / cl margin on cosine distance
  c.train.batch_size = 32  # pairs per step (global)
  c.train.epochs = EPOCHS_BY_SHOTS.get(shots, 2)
  c.train.max_steps = 0  # > 0 cuts the run short (the schedule follows it)
  c.train.learning_rate = 2e-5
  c.train.warmup_fraction = 0.1
  c.train.weight_decay = 0.01
  c.train.clip_norm = 1.0  # sentence-transformers' default max_grad_norm; 0 disables
  c.train.checkpoint_every = 500
  c.train.keep_checkpoints = 2
  c.train.log_every = 20

  c.eval = ml_collections.ConfigDict()
  c.eval.k = 1
  c.eval.vote = "majority"  # k > 1: majority | weighted
  c.eval.batch_size = 256
  c.eval.before = True  # also evaluate the encoder before training (knn_accuracy_before)
  c.eval.mlp = False  # also train the MLP baseline on the frozen encodings
  c.eval.tsne = True  # t-SNE PNGs of 12 intents, before and after
  c.eval.max_test = 0  # > 0: evaluate on a seeded subset of this many test rows
  c.eval.oos = False  # clinc150: choose a threshold on val, report in-scope acc and OOS recall

  c.mesh = ml_collections.ConfigDict()
  c.mesh.model_parallel = 1

  if runlocal:
    c.train.max_steps = 20
    c.train.log_every = 5
    c.eval.max_test = 500
    c.eval.tsne = False
  return c
