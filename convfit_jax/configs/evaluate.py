"""Intent detection with any encoder, no training: k-NN (and the MLP baseline).

    python -m convfit_jax.main --config=configs/evaluate.py                     # off-the-shelf MiniLM
    python -m convfit_jax.main --config=configs/evaluate.py:init_from=workdirs/stage2/banking77_10shot_ocl_seed0
    python -m convfit_jax.main --config=configs/evaluate.py:dataset=clinc150,oos --config.evals.knn.mlp=True
    python -m convfit_jax.main --config=configs/evaluate.py:responses   # response selection
    python -m convfit_jax.main --config=configs/evaluate.py:sts --config.model.init_from=...   # STS

Arguments: dataset, shots, seed, init_from (a folder, hub id, or a Stage 1/2 workdir),
workdir, and the flag `oos` (clinc150 out-of-scope detection by a threshold chosen
on val), and the flag `responses`: response selection on ubuntu_irc (test 1-of-10 and
1-of-100) and SGD (test 1-of-100) instead of intents (`init_from=tfidf`: the TF-IDF
baseline there; `init_from=` a finished rerank run's workdir: that reranker, in
`--config.model.dtype`; `response_sets=sgd_test_rs100` for fewer sets, '+'-separated),
and the flag `sts`: semantic similarity (STS-B dev/test and SICK-R test, out of the box
and adapted; files from `--config.data.sts_dir` and `--config.data.sick_dir`;
`init_from=glove` is the bag-of-GloVe baseline there, `init_from=` a finished DAN run
that DAN).
`--config.data.pool_shots=30` (or 0 for all) keeps training at `shots` but searches a
larger pool: the paper's inference-time augmentation.
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common


# `responses`: the response-selection sets, by name (files under ../shared/data/conversations).
RESPONSE_SETS = {"ubuntu_irc_test_rs10": "ubuntu_irc/test_rs10.jsonl",
                 "ubuntu_irc_test_rs100": "ubuntu_irc/test_rs100.jsonl",
                 "sgd_test_rs100": "sgd/test_rs100.jsonl"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/evaluate.py", dataset="banking77", shots=10, seed=0,
                       init_from=common.MINILM, workdir="", oos=False, responses=False, sts=False,
                       response_sets=tuple(RESPONSE_SETS))
  c = ml_collections.ConfigDict()
  c.task = "evaluate"
  c.workdir = a.workdir or f"workdirs/evaluate/{a.dataset}_{a.shots or 'full'}shot_seed{a.seed}"
  c.seed = a.seed  # test subset, MLP initialisation and t-SNE
  c.model = common.model_config(a.init_from)
  c.data = common.data_config(a.dataset, a.shots, a.seed)
  c.evals = ml_collections.ConfigDict()
  if a.responses:
    c.workdir = a.workdir or "workdirs/evaluate/responses"
    unknown = set(a.response_sets) - set(RESPONSE_SETS)
    if unknown:
      raise ValueError(f"configs/evaluate.py: response_sets {sorted(unknown)}; known: "
                       f"{'+'.join(RESPONSE_SETS)}")
    for name in a.response_sets:
      c.evals[name] = common.response_selection_eval(
          file=f"../shared/data/conversations/{RESPONSE_SETS[name]}", prefix=f"{name}_")
  elif a.sts:
    c.workdir = a.workdir or "workdirs/evaluate/sts"
    common.sts_data(c)
    c.evals.sts = common.sts_eval()
  else:
    c.evals.knn = common.intent_knn_eval(oos=a.oos)
  return c
