"""The input-response model of Yang et al. (2018), conversations alone or multitask with NLI.

  python -m convfit_jax.main --config=configs/input_response.py                  # MiniLM, SGD
  python -m convfit_jax.main --config=configs/input_response.py:multitask        # + NLI
  python -m convfit_jax.main --config=configs/input_response.py:encoder=dan,multitask
  python -m convfit_jax.main --config=configs/input_response.py:multitask,nli_fraction=0.4
  python -m convfit_jax.main --config=configs/input_response.py:runlocal        # a smoke run

Arguments: encoder (sentence: a pretrained Transformer, `init_from`, default MiniLM, or
`rand`: a small Transformer from scratch, `common.SMALL_TRANSFORMER` of MiniLM's config and
tokenizer; dan: the deep averaging network from scratch), dataset (sgd, ubuntu_irc,
dailydialog: the conversation pairs), multitask (add the NLI task: SICK train + SNLI
dev), nli_fraction (the share of those NLI pairs kept, seeded), init_from, steps,
seed, workdir, runlocal.

Evaluated before and after: STS-B dev/test and SICK-R test, out of the box and adapted
(`evaluators/sts.py`); P@1/3/10 of 100 on SGD and ubuntu_irc (`r_at_1`, `r_at_3`,
`r_at_10`, prefixed by the set); SICK-E dev/test and SNLI test accuracy (multitask).
Budgets are sized for a 2-core CPU (the paper trained 30-40M steps of 128 on Reddit).
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common

CONVERSATIONS = "../shared/data/conversations"
RESPONSE_SETS = {"sgd_test_rs100": f"{CONVERSATIONS}/sgd/test_rs100.jsonl",
                 "ubuntu_irc_test_rs100": f"{CONVERSATIONS}/ubuntu_irc/test_rs100.jsonl"}
NLI_SETS = {"sick_dev": f"{common.SICK_DIR}/dev.tsv", "sick_test": f"{common.SICK_DIR}/test.tsv",
            "snli_test": f"{common.SNLI_DIR}/test.tsv"}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/input_response.py", encoder="sentence", dataset="sgd",
                       multitask=False, nli_fraction=1.0, init_from=common.MINILM, steps=0, seed=0,
                       workdir="", runlocal=False)
  if a.encoder not in ("sentence", "dan"):
    raise ValueError(f"configs/input_response.py: encoder={a.encoder!r}; sentence or dan")
  if a.dataset not in ("sgd", "ubuntu_irc", "dailydialog"):
    raise ValueError(f"configs/input_response.py: dataset={a.dataset!r}; sgd, ubuntu_irc or dailydialog")
  dan = a.encoder == "dan"
  c = ml_collections.ConfigDict()
  c.task = "input_response"
  rand = not dan and a.init_from == "rand"
  name = ("dan" if dan else "rand" if rand else
          "minilm" if a.init_from == common.MINILM else "sentence") + f"_{a.dataset}"
  name += f"_nli{a.nli_fraction:g}" if a.multitask else ""
  c.workdir = a.workdir or f"workdirs/input_response/{name}_seed{a.seed}"
  c.seed = a.seed

  if dan:
    c.model = ml_collections.ConfigDict()
    c.model.name = "dual_encoder"  # the model family (the task builds it around model.encoder)
    c.model.encoder = "dan"  # the shared encoder's module in convfit_jax/models/
    c.model.embed_dim = 300  # 50 with vectors=GloVe 6B 50d
    c.model.hidden = (300, 300, 500)  # the paper's DAN
    c.model.activation = "tanh"
    c.model.dropout = 0.0  # on the averaged embedding and hidden layers; 0 = none
    c.model.freeze_embeddings = False
    c.model.vectors = ""  # GloVe-format file to start word vectors from; "" = random
    c.model.min_count = 2  # words and bigrams seen fewer times are unknown
    c.model.max_vocab = 50_000
    c.model.max_bigrams = 100_000
    c.model.max_length = 64  # words per sentence
  else:
    c.model = common.model_config(a.init_from, name="dual_encoder")
    c.model.encoder = "sentence"
    c.model.max_length = 64
    c.model.dropout = True
    if rand:  # from scratch: MiniLM's tokenizer and family, a CPU-sized Transformer
      c.model.architecture_overrides = common.SMALL_TRANSFORMER
      c.model.rand_init = "normal"
  c.model.response_tower = False  # tied: one encoder for inputs and responses
  c.model.response_ff = True  # the response-side feed-forward network
  c.model.response_ff_hidden = 0  # its hidden width; 0 = 4 * dim
  c.model.response_ff_depth = 2  # its residual blocks
  c.model.nli_hidden = (512,)  # the NLI classifier's hidden layers

  c.data = ml_collections.ConfigDict()
  c.data.train = f"{CONVERSATIONS}/{a.dataset}/train.tsv"
  c.data.format = ""  # "" = by suffix
  c.data.max_pairs = 0  # > 0: a seeded sample of this many conversation pairs
  # Training sentences are cut here (tokens, or words for the DAN; 0 = model.max_length,
  # which evaluation uses): SGD's turns fit in 32 tokens, and compute grows with the width.
  c.data.max_length = 0 if dan else 32
  # NLI training pairs ('+'-separated TSVs): SICK train and SNLI dev (no SNLI train here).
  c.data.nli_train = f"{common.SICK_DIR}/train.tsv+{common.SNLI_DIR}/dev.tsv"
  c.data.nli_fraction = a.nli_fraction  # seeded share of them (the data-size study)
  c.data.prefetch = 2
  common.sts_data(c)

  c.loss = ml_collections.ConfigDict()
  c.loss.scale = 20.0  # softmax over scale * cosine of inputs and the batch's responses

  c.train = common.train_config(log_every=20, checkpoint_every=200)
  scratch = dan or rand  # from scratch: more negatives a step, a whole epoch
  c.train.batch_size = 128 if scratch else 64  # conversation pairs per step
  c.train.nli_batch_size = (128 if dan else 64 if rand else 32) if a.multitask else 0  # NLI pairs per step
  c.train.nli_weight = 1.0
  c.train.epochs = 5 if dan else 1
  c.train.max_steps = a.steps if scratch else a.steps or 300  # > 0: stop there
  # The NLI classifier and the response network start fresh (the network as the identity):
  # at a pretrained encoder's 2e-5 they barely move in a CPU-sized run.
  c.train.heads = ("nli", "dual/response_ff")
  c.train.head_learning_rate = 0.0 if dan else 1e-3  # 0 = the encoder's rate
  if dan:
    c.train.learning_rate = 1e-3
    c.train.weight_decay = 0.0
  if rand:  # random weights take the rate of pretraining, not of fine-tuning
    c.train.learning_rate = 5e-4

  c.evals = ml_collections.ConfigDict()
  c.evals.sts = common.sts_eval(batch_size=32)
  for set_name, path in RESPONSE_SETS.items():
    c.evals[set_name] = common.response_selection_eval(file=path, prefix=f"{set_name}_", every=0)
  if a.multitask:
    for set_name, path in NLI_SETS.items():
      c.evals[set_name] = common.nli_eval(file=path, prefix=f"{set_name}_")
  common.mesh_and_distributed(c)

  if a.runlocal:
    c.workdir = a.workdir or f"workdirs/input_response_runlocal/{name}"
    c.data.max_pairs = 2000
    c.train.max_steps = a.steps or 20
    c.train.epochs = 100
    c.train.batch_size = 32
    c.train.nli_batch_size = 16 if a.multitask else 0
    c.train.checkpoint_every = 10
    c.train.log_every = 5
    common.trim_evals_for_runlocal(c)
  c.lock()
  return c
