"""Config blocks that several configs share: the intent data and the k-NN evaluation."""

import ml_collections

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
# The paper's epochs per few-shot setting (0 = full data).
EPOCHS_BY_SHOTS = {10: 10, 30: 5, 0: 2}


def parse_arg(arg, known, source):
  """'a=1,b=x,flag' -> {'a': '1', 'b': 'x', 'flag': 'True'}; unknown keys are an error."""
  out = {}
  for part in filter(None, (arg or "").split(",")):
    key, sep, value = part.partition("=")
    out[key.strip()] = value.strip() if sep else "True"
  unknown = set(out) - set(known)
  if unknown:
    raise ValueError(f"{source}: unknown argument(s) {sorted(unknown)}; known: {sorted(known)}")
  return out


def model_config(init_from=MINILM):
  m = ml_collections.ConfigDict()
  # A folder or hub id (pretrained, or a Stage 1/2 output: a workdir with a model/
  # folder is accepted), or "rand" for `architecture` with Glorot-uniform weights
  # (the paper's rand rows).
  m.init_from = init_from
  m.architecture = MINILM  # config + tokenizer when init_from="rand"
  m.max_length = 48
  m.dtype = "float32"  # compute dtype; "bfloat16" on accelerators; parameters stay float32
  m.remat = False  # per-layer rematerialisation
  return m


def data_config(dataset="banking77", shots=10, seed=0):
  d = ml_collections.ConfigDict()
  d.name = dataset  # banking77 | clinc150 | hwu64 | csv (your own files)
  d.data_dir = ""  # folder holding <name>/ (default: the copies shipped in the package)
  d.train_file = ""  # name=csv: CSV/TSV/JSONL with text and label columns
  d.test_file = ""
  d.val_file = ""
  d.text_column = "text"
  d.label_column = "label"
  d.train_split = "train"  # banking77/hwu64 also: train_minus_val (DialoGLUE's train)
  d.include_oos = False  # clinc150: add the out-of-scope rows as label `oos`
  d.shots = shots  # examples per intent; 0 = all
  d.allow_fewer = False  # a label with fewer than `shots` examples is an error
  d.seed = seed  # few-shot sample and pair construction
  d.pool_shots = -1  # k-NN pool: -1 = the training examples, 0 = all train rows, N per label
  d.negatives = 3 if shots else 1  # n: negatives per side of each positive pair (Stage 2)
  d.max_pairs_per_label = 0  # cap positives per label (0 = none); full data grows quadratically
  return d


def eval_config():
  e = ml_collections.ConfigDict()
  e.k = 1
  e.vote = "majority"  # k > 1: majority | weighted
  e.batch_size = 256
  e.mlp = False  # also train the MLP baseline on frozen encodings of the training examples
  e.tsne = True  # t-SNE PNG of 12 intents
  e.max_test = 0  # > 0: evaluate on a seeded subset of this many test rows
  e.oos = False  # clinc150: threshold chosen on val; in-scope accuracy and OOS recall
  # Stage 2: also k-NN with these larger pools after training, no retraining (the paper's
  # inference-time augmentation), as N per intent, 0 = every training row; e.g. (30, 0).
  e.extra_pools = ()
  return e
