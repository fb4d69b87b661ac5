"""Classify a text file (or stdin) with a saved `IntentClassifier`: one JSON line per text.

    python -m convfit_jax.main --config=configs/predict.py --config.classifier=my_classifier \
        --config.input=texts.txt --config.output=predictions.jsonl
    echo "where is my card?" | python -m convfit_jax.main --config=configs/predict.py \
        --config.classifier=workdirs/stage2_dense/banking77_10shot_supcon_seed0

Each output line: {"text", "label", "score" (the nearest pool example's cosine), "oos"
(rejected by the classifier's out-of-scope threshold)}, in input order; with `explain=N`
also "neighbours", the N nearest pool examples.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  common.parse_arg(arg, "configs/predict.py")
  c = ml_collections.ConfigDict()
  c.task = "predict"
  # A saved classifier folder (`IntentClassifier.save_pretrained`), or a Stage 2 workdir
  # (its classifier/ folder).
  c.classifier = ""
  c.input = "-"  # UTF-8 text file, one text per line; "-" reads stdin
  c.output = "-"  # JSON lines file (written whole, atomically); "-" writes stdout
  c.batch_size = 32  # packed rows per encoder call
  c.explain = 0  # > 0: add this many nearest pool examples to each line
  c.dtype = ""  # compute dtype; "" = the classifier's
  return c
