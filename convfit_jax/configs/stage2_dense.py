"""Stage 2 on label batches: every pair of the batch, intents as in-batch negatives.

    python -m convfit_jax.main --config=configs/stage2_dense.py
    python -m convfit_jax.main --config=configs/stage2_dense.py:dataset=clinc150,shots=0,loss=ocl

`configs/stage2.py` with `train.sampler=labels`: each step encodes 32 intents x 2
utterances (64 sentences, what 32 of the paper's pairs encode at most) and the objective
scores them all against each other; an epoch is one pass over the training utterances,
10 / 5 / 2 epochs at 10-shot / 30-shot / full data as the paper's pair epochs (130 steps
on banking77 10-shot, the README's quickstart budget), and never fewer than 100 steps
(`train.min_steps`): 10 epochs of a user's 7 intents x 10 examples are 20 steps, too few
(docs/experiments/stage2_small_intent_sets.md); hwu64, banking77 and clinc150 10-shot train 100,
130 and 240 steps, unchanged by the floor. A set with fewer intents than the 32 a batch
asks for puts all of them in every batch, more utterances each (`label_batches.layout`). The objective is supervised
contrast (`losses.supcon_loss`, scale 20), the most accurate of the dense objectives at 150
steps in docs/results.md; `loss=` also takes ocl, cos, smax and cl, each over every pair of the
batch (the protocol's dense_ocl, ...). 32 x 2 rather than `configs/stage2.py`'s 16 x 4: a
step then holds twice the intents, each utterance one positive and 62 negatives, which was
ahead on banking77's validation data and on the three test sets (docs/results.md). Peak
learning rate 1e-4 (the short-budget setting the measurements used); the rest as
`configs/stage2.py`.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common, stage2


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/stage2_dense.py", dataset="banking77", shots=10,
                       loss="supcon", seed=0, init_from=common.MINILM, workdir="", runlocal=False)
  c = stage2.get_config(f"dataset={a.dataset},shots={a.shots},seed={a.seed},"
                        f"init_from={a.init_from},runlocal={a.runlocal}")
  c.train.sampler, c.train.loss = "labels", a.loss.removeprefix("dense_")
  c.train.learning_rate = 1e-4
  c.train.labels_per_batch, c.train.examples_per_label = 32, 2
  c.train.min_steps = 100
  c.workdir = a.workdir or stage2.run_name(c, "workdirs/stage2_dense")
  return c
