"""ConvFiT Stage 2: task-tailored contrastive fine-tuning, then k-NN intent detection.

    python -m convfit_jax.main --config=configs/stage2.py
    python -m convfit_jax.main --config=configs/stage2.py:dataset=hwu64,shots=30,loss=cos
    python -m convfit_jax.main --config=configs/stage2.py:runlocal --config.train.epochs=1
    python -m convfit_jax.main --config=configs/stage2.py:sampler=labels,loss=supcon

Arguments: dataset, shots, loss, sampler, seed, init_from, workdir and the flag `runlocal`
(20 steps, 500 test rows: a smoke run). Defaults are the paper's: all-MiniLM-L6-v2,
banking77, 10-shot, seed 0, ocl on the paper's pairs, n=3 negatives per side, batch 32
pairs, max length 48, AdamW 2e-5 with 10% warm-up then linear decay, weight decay 0.01,
d_o=512 tanh projection; 10/5/2 epochs for 10-shot/30-shot/full. `sampler=labels` trains
on label batches instead (16 intents x 4 utterances here, the same 64 sentences a step as 32
pairs at most encode; epochs then count utterances, not pairs); `configs/stage2_dense.py` is
that with 32 intents x 2 and supervised contrast, its measured best.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/stage2.py", dataset="banking77", shots=10, loss="ocl",
                       sampler="pairs", seed=0, init_from=common.MINILM, workdir="", runlocal=False)
  c = ml_collections.ConfigDict()
  c.task = "stage2"
  c.seed = a.seed  # new heads' init and dropout; data.seed draws the data
  c.dry_run = False  # build data and pairs, write counts and memory estimate, train nothing

  c.model = common.model_config(a.init_from, name="siamese")
  c.model.projection_dim = 512  # d_o: Dense + tanh after pooling; 0 for none

  c.data = common.data_config(a.dataset, a.shots, a.seed)

  c.train = common.train_config()
  # pairs: the paper's pairs, `batch_size` a step. labels: P intents x K utterances a step,
  # every utterance once an epoch, the loss over every pair of the batch.
  c.train.sampler = a.sampler
  c.train.loss = a.loss  # ocl | cl | cos | smax; with sampler=labels also supcon
  c.train.margin = 0.5  # ocl / cl margin on cosine distance
  c.train.batch_size = 32  # pairs per step (global; a multiple of the device count)
  c.train.labels_per_batch = 16  # P (sampler=labels); P*K a multiple of the device count
  c.train.examples_per_label = 4  # K >= 2; an intent's last group of an epoch may be shorter
  # sampler=labels: each intent's name as text ("card arrival") joins its groups in a batch,
  # one more member of the intent (FastFit's anchors); a set whose names hold no words (ids)
  # says so and trains without.
  c.train.label_anchors = False
  c.train.views = 1  # sampler=labels: R copies of each sentence a batch, R dropout views
  # sampler=labels: > 0 trains a linear intent head on the unit embedding (logits at `scale`)
  # beside the contrastive loss, loss = contrast + head_weight * cross-entropy; the k-NN
  # evaluator then also reports head_accuracy. 0: no head.
  c.train.head_weight = 0.0
  # Dense pair losses: total negative weight / total positive weight in a batch; 0 weighs
  # every pair 1 (about P times more negatives than positives); 6 = the paper's pairs at n=3.
  c.train.negative_ratio = 6.0
  c.train.scale = 20.0  # supcon: inverse temperature
  c.train.supcon_denominator = "all"  # all (Khosla et al.) | negatives (label-masked MNRL)
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


def objective(t: ml_collections.ConfigDict) -> str:
  """The objective by one name: the loss on the paper's pairs (ocl, cos, ...), or on label
  batches dense_<loss> or supcon."""
  return t.loss if t.sampler == "pairs" or t.loss == "supcon" else f"dense_{t.loss}"


def parse_objective(name: str) -> tuple[str, str]:
  """`objective`'s inverse: a name -> (sampler, loss)."""
  if name == "supcon":
    return "labels", "supcon"
  if name.startswith("dense_"):
    return "labels", name[len("dense_"):]
  return "pairs", name


def run_name(c: ml_collections.ConfigDict, parent: str) -> str:
  """parent/<dataset>[_<n>intents]_<shots>shot_<objective>_seed<seed>: one folder per
  protocol cell."""
  subset = f"_{c.data.intents}intents" if c.data.get("intents") else ""
  return (f"{parent}/{c.data.name}{subset}_{c.data.shots or 'full'}shot_{objective(c.train)}"
          f"_seed{c.seed}")


def cell(template: ml_collections.ConfigDict, *, dataset: str, shots: int, loss: str, seed: int,
         parent: str, intents: int = 0, epochs: int | None = None) -> ml_collections.ConfigDict:
  """The Stage 2 config of one cell of the paper's grid: `template` with the cell's
  dataset, shots, objective (`loss`, as `objective` names it), seed and intents (a seeded
  subset of that many; 0 = all), and what the paper
  ties to them (negatives, and epochs unless `epochs` is given), in its own workdir under
  `parent`."""
  c = ml_collections.ConfigDict(template.to_dict())
  c.data.name, c.data.shots, c.data.seed, c.seed = dataset, shots, seed, seed
  c.data.intents = intents
  c.data.negatives = 3 if shots else 1
  c.train.sampler, c.train.loss = parse_objective(loss)
  c.train.epochs = epochs or common.EPOCHS_BY_SHOTS.get(shots, 2)
  c.workdir = run_name(c, parent)
  return c
