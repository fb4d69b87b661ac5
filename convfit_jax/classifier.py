"""`IntentClassifier`: few-shot intent detection from two Python lists, by nearest neighbours.

    clf = IntentClassifier.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")
    clf.fit(texts, labels)                    # Stage 2 (supcon, 32 intents x 2), then the pool
    clf.predict(["where is my card?"])        # -> ["card_arrival"]
    clf.explain("where is my card?")          # the nearest training examples behind it
    clf.save_pretrained("my_classifier/")     # IntentClassifier.from_pretrained loads it back

The classifier is an `Encoder` and a pool: labelled example texts with their unit
encodings. A text gets the intent of its nearest pool example by cosine (k-NN with k=1
unless `k` says otherwise, `evaluators.knn`), so every answer can show the examples that
decided it, and the pool grows (`add_examples`) without retraining, new intents included.

`fit` runs Stage 2 through the same trainer and task as
`python -m convfit_jax.main --config=configs/stage2_dense.py` (`train.stage2`), fed from
memory: the lists become the `IntentData` the CSV reader builds from a file of the same
rows, so the same data and seed give the same model from Python and the command line.
The run writes `workdir/classifier/`, which is what `fit` then loads.

Scores are each intent's best cosine (`scores`); `predict_proba` is a softmax over them at
a temperature fitted by negative log-likelihood, by leave-one-out on the pool after
training or on `val` when given (`evaluators.calibration`). Out-of-scope rejection is a
threshold on the nearest neighbour's cosine, chosen on validation data with out-of-scope
rows as the clinc150 evaluator chooses it (`calibrate_oos`); `predict` then answers
`reject_label` (default None) below it.
"""

from __future__ import annotations

import collections
import os
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Sequence

import jax.numpy as jnp
import ml_collections
import numpy as np

from convfit_jax import saved_classifier
from convfit_jax.configs import common, stage2 as stage2_config, stage2_dense
from convfit_jax.data import intent
from convfit_jax.encoder import Encoder
from convfit_jax.evaluators import calibration, knn
from convfit_jax.saved_classifier import SavedClassifierError, Settings
from convfit_jax.tokenization import check_nonblank_texts
from convfit_jax.version import __version__

__all__ = ["IntentClassifier", "SavedClassifierError"]

# Max tokens per text when a plain encoder is loaded: the Stage 2 configs' (intent
# utterances are short; a longer text is truncated, said once).
DEFAULT_MAX_LENGTH = 48


def _check_labels(labels: Sequence, n: int, what: str = "labels") -> list:
  """Labels as plain str or int values, one per text, all of one type."""
  if isinstance(labels, (str, bytes)):
    raise TypeError(f"{what}: expected a sequence of labels, got one string")
  out = [int(l) if isinstance(l, np.integer) else l for l in labels]
  if len(out) != n:
    raise ValueError(f"{len(out)} {what} for {n} texts: give one label per text")
  saved_classifier.label_type(out)
  return out


def _pair(val, what: str) -> tuple[list[str], list]:
  """(texts, labels) given as a 2-tuple."""
  if not isinstance(val, (tuple, list)) or len(val) != 2:
    raise TypeError(f"{what}: expected (texts, labels)")
  texts = check_nonblank_texts(val[0], f"{what} texts")
  return texts, _check_labels(val[1], len(texts), f"{what} labels")


def _epochs_and_negatives(labels: Sequence) -> tuple[int, int]:
  """The protocol's schedule for a set of this many examples per intent (median): 10 epochs
  and n=3 negatives up to 10-shot, 5 and 3 up to 30, 2 and 1 beyond (`common.EPOCHS_BY_SHOTS`)."""
  shots = float(np.median(list(collections.Counter(labels).values())))
  if shots <= 10:
    return common.EPOCHS_BY_SHOTS[10], 3
  if shots <= 30:
    return common.EPOCHS_BY_SHOTS[30], 3
  return common.EPOCHS_BY_SHOTS[0], 1


class IntentClassifier:
  """A k-NN intent classifier over an encoder's embeddings of a labelled pool.

  Build it with `from_pretrained`. Attributes:
    encoder: the `Encoder`.
    labels: the intents, in id order (strings or ints, as given).
    k, vote: k-NN settings (`evaluators.knn`).
    temperature: `predict_proba`'s softmax temperature.
    oos_threshold: nearest-neighbour cosine below which `predict` rejects; None: never.
    reject_label: what `predict` returns for a rejected text.
    pool_texts, pool_label_ids ([m] int32), pool_embeddings ([m, dim] float32, unit rows).
    history_: after `fit`: steps, train_seconds, losses [(step, window mean)], and
      val_before / val_after (`evaluate` on `val`) when `val` was given.
  """

  def __init__(self, encoder: Encoder, *, source: str | os.PathLike | None = None):
    self.encoder = encoder
    self.labels: list = []
    self.k, self.vote = 1, "majority"
    self.temperature = 1.0
    self.oos_threshold: float | None = None
    self.reject_label: Any = None
    self.pool_texts: list[str] = []
    self.pool_label_ids = np.zeros(0, np.int32)
    self.pool_embeddings = np.zeros((0, encoder.dim), np.float32)
    # (the array it was made from, knn.DevicePool): the pool placed once for every search.
    self._placed: tuple[np.ndarray, knn.DevicePool] | None = None
    self.history_: dict[str, Any] = {}
    # What Stage 2 starts from: a folder or hub id; None: `encoder` is saved first.
    self._source = None if source is None else str(source)

  # ---- loading and saving

  @classmethod
  def from_pretrained(cls, name_or_folder: str | os.PathLike | Encoder, *, dtype=None,
                      max_length: int | None = None) -> "IntentClassifier":
    """A saved classifier folder, ready to predict; or any encoder `Encoder.from_pretrained`
    loads (hub-style name, HF or sentence-transformers folder, a Stage 1/2 `model/` folder
    or workdir), or an `Encoder` object, with an empty pool (`fit` or `add_examples` next).

    Args:
      dtype: compute dtype ("float32", "bfloat16"); default the saved classifier's, else
        float32. Parameters stay float32.
      max_length: tokens per text, special tokens included; default the saved
        classifier's, else 48.
    Raises:
      SavedClassifierError naming the file and field of a corrupted, truncated or
      newer-format classifier folder.
    """
    if isinstance(name_or_folder, Encoder):
      if dtype is not None or max_length is not None:
        raise ValueError("dtype and max_length come with the Encoder object; set them when "
                         "loading it")
      return cls(name_or_folder)
    folder = Path(name_or_folder)
    restored = saved_classifier.recover(folder)
    if restored:
      warnings.warn(restored, stacklevel=2)
    if saved_classifier.is_saved_classifier(folder):
      loaded = saved_classifier.read(folder)
      s = loaded.settings
      encoder = Encoder.from_pretrained(folder, dtype=jnp.dtype(dtype or s.dtype),
                                        max_length=max_length or s.max_length)
      if encoder.dim != loaded.embeddings.shape[1]:
        raise SavedClassifierError(
            f"{folder / saved_classifier.EMBEDDINGS_FILE}: rows of {loaded.embeddings.shape[1]} "
            f"numbers, the encoder in {folder} gives {encoder.dim}")
      clf = cls(encoder, source=folder)
      clf._set_pool(list(s.labels), loaded.pool_texts, loaded.pool_label_ids, loaded.embeddings)
      clf.k, clf.vote, clf.temperature = s.k, s.vote, s.temperature
      clf.oos_threshold, clf.reject_label = s.oos_threshold, s.reject_label
      return clf
    encoder = Encoder.from_pretrained(name_or_folder, dtype=jnp.dtype(dtype or jnp.float32),
                                      max_length=max_length or DEFAULT_MAX_LENGTH)
    return cls(encoder, source=name_or_folder)

  def save_pretrained(self, folder: str | os.PathLike) -> str:
    """Writes the classifier folder (`saved_classifier`: the encoder as an HF +
    sentence-transformers folder at its root, so `SentenceTransformer(folder)` loads the
    encoder; classifier.json, pool.jsonl, pool_embeddings.npy beside it), atomically."""
    self._need_pool("save_pretrained")
    path = saved_classifier.write(
        folder, write_encoder=self.encoder.save_pretrained, settings=self._settings(),
        pool_texts=self.pool_texts, pool_label_ids=self.pool_label_ids,
        embeddings=self.pool_embeddings, version=__version__)
    return str(path)

  def save_pool(self) -> str:
    """Rewrites the saved classifier folder this one was loaded from with the current pool
    and settings, atomically, linking its encoder files instead of writing the weights again:
    how a server keeps `add_examples` across restarts at the cost of the pool alone."""
    self._need_pool("save_pool")
    if self._source is None or not saved_classifier.is_saved_classifier(self._source):
      raise ValueError("save_pool rewrites the saved classifier folder this classifier was "
                       f"loaded from; it was loaded from {self._source or 'an Encoder object'}"
                       " (use save_pretrained)")
    path = saved_classifier.write(
        self._source, encoder_dir=self._source, settings=self._settings(),
        pool_texts=self.pool_texts, pool_label_ids=self.pool_label_ids,
        embeddings=self.pool_embeddings, version=__version__)
    return str(path)

  def _settings(self) -> Settings:
    return Settings(labels=list(self.labels), k=self.k, vote=self.vote,
                    temperature=float(self.temperature),
                    oos_threshold=None if self.oos_threshold is None else float(self.oos_threshold),
                    reject_label=self.reject_label, dtype=self.encoder.dtype,
                    max_length=self.encoder.max_length)

  def _set_pool(self, labels: list, texts: list[str], label_ids: np.ndarray,
                embeddings: np.ndarray) -> None:
    self.labels = labels
    self.pool_texts = list(texts)
    self.pool_label_ids = np.asarray(label_ids, np.int32)
    self.pool_embeddings = np.asarray(embeddings, np.float32)

  def _need_pool(self, what: str) -> None:
    if not self.pool_texts:
      raise RuntimeError(f"{what}: the classifier has no examples yet; call fit(texts, labels) "
                         "or add_examples(texts, labels) first")

  # ---- training

  def fit(self, texts: Sequence[str], labels: Sequence, *, objective: str = "supcon",
          epochs: int | None = None, max_steps: int | None = None,
          learning_rate: float | None = None, seed: int = 0, val=None, oos_label=None,
          workdir: str | os.PathLike | None = None, progress: bool = True,
          **train_overrides) -> "IntentClassifier":
    """Fine-tunes the encoder on (texts, labels) by Stage 2, then pools the training texts.

    Args:
      texts: n utterances; labels: n intents (str or int, at least two distinct).
      objective: "supcon" (default: 32 intents x 2 a step, `configs/stage2_dense.py`), a
        dense one (dense_ocl, dense_cos, dense_smax, dense_cl) or one on the paper's pairs
        (ocl, cl, cos, smax; `configs/stage2.py`).
      epochs: passes over the utterances (supcon, dense_*) or pairs; default by the
        median examples per intent: 10 up to 10, 5 up to 30, 2 beyond. On label batches
        the run trains at least `min_steps` steps (100, the config's: a small set's few
        epochs are few steps), as the command line does; `min_steps=0` lifts the floor.
      max_steps: stop after this many steps (the schedule follows).
      learning_rate: peak AdamW rate; default the config's (1e-4 supcon/dense, 2e-5 pairs).
      seed: initialisation, dropout and batch order.
      val: (texts, labels) held out: the temperature is fitted on it, and history_ gets
        `evaluate` before and after training; with `oos_label`, its rows of that label set
        the out-of-scope threshold (`calibrate_oos`).
      workdir: the run's folder (checkpoints, metrics.json, tensorboard/, model/,
        classifier/): resumable as a command-line run. None: a temporary folder, removed.
      progress: the progress bar.
      **train_overrides: other `config.train` fields (labels_per_batch=16, ...).
    Returns:
      self (the run's figures in `history_`).
    """
    texts = check_nonblank_texts(texts)
    labels = _check_labels(labels, len(texts))
    counts = collections.Counter(labels)
    if len(counts) < 2:
      raise ValueError(f"fit needs at least two intents, got only {labels[0]!r}")
    if oos_label is not None and oos_label in counts:
      raise ValueError(f"oos_label={oos_label!r} is also a training intent; out-of-scope rows "
                       "belong in val only")
    if val is not None:
      val = _pair(val, "val")
      if oos_label is not None and oos_label not in val[1]:
        raise ValueError(f"oos_label={oos_label!r}: val has no row of that label")
    sampler, _ = stage2_config.parse_objective(objective)
    singles = sorted((l for l, c in counts.items() if c == 1), key=str)
    if singles and sampler == "labels":
      warnings.warn(
          f"{len(singles)} intent(s) with a single example ({', '.join(map(repr, singles[:5]))}"
          f"{', ...' if len(singles) > 5 else ''}): {objective} needs two of an intent in a "
          "batch to pull them together, so these are trained as negatives only (pushed away "
          "from the other intents); they are still in the pool", stacklevel=2)
    config = self._train_config(labels, objective, epochs, max_steps, learning_rate, seed,
                                progress, train_overrides)
    data = intent.from_lists(texts, labels)

    before = None
    if val is not None:
      start = IntentClassifier(self.encoder)
      start.add_examples(texts, labels)
      before = start.evaluate(*val, oos_label=oos_label)

    owned = workdir is None
    run_dir = Path(tempfile.mkdtemp(prefix="convfit_fit_") if owned else workdir).absolute()
    try:
      if self._source is None:
        self._source = self.encoder.save_pretrained(run_dir / "init")
      config.model.init_from = self._source
      config.workdir = str(run_dir)
      # The training stack (orbax, optax, scipy's users) loads only when fit is called.
      from convfit_jax.train import stage2, workdir as workdir_lib  # pylint: disable=import-outside-toplevel
      with workdir_lib.quiet_terminal():
        run = stage2.train_and_evaluate(config, data=data)
      trained = IntentClassifier.from_pretrained(run_dir / "classifier", dtype=self.encoder.dtype,
                                                 max_length=self.encoder.max_length)
      losses = workdir_lib.read_scalars(run_dir).get("train/loss", [])
    finally:
      if owned:
        shutil.rmtree(run_dir, ignore_errors=True)
    self.encoder = trained.encoder
    self._source = None if owned else str(run_dir / "classifier")
    self._set_pool(trained.labels, trained.pool_texts, trained.pool_label_ids,
                   trained.pool_embeddings)
    self.temperature = trained.temperature
    self.oos_threshold, self.history_ = None, {
        "steps": run.get("steps"), "train_seconds": run.get("train_seconds"), "losses": losses}
    if val is not None:
      self._fit_val(*val, oos_label=oos_label)
      self.history_["val_before"] = before
      self.history_["val_after"] = self.evaluate(*val, oos_label=oos_label)
    return self

  def _train_config(self, labels, objective, epochs, max_steps, learning_rate, seed, progress,
                    overrides) -> ml_collections.ConfigDict:
    """The Stage 2 run config `fit` trains with: `configs/stage2_dense.py` (supcon, dense_*)
    or `configs/stage2.py` (pair objectives) on in-memory data, without evaluators."""
    sampler, loss = stage2_config.parse_objective(objective)
    make = stage2_dense.get_config if sampler == "labels" else stage2_config.get_config
    c = make(f"loss={loss},seed={seed}")
    default_epochs, negatives = _epochs_and_negatives(labels)
    c.data.name, c.data.shots, c.data.seed, c.data.negatives = "memory", 0, seed, negatives
    c.train.epochs = epochs or default_epochs
    c.train.max_steps = max_steps or 0
    if learning_rate is not None:
      c.train.learning_rate = learning_rate
    c.train.progress = progress
    for key, value in overrides.items():
      if key not in c.train:
        raise TypeError(f"fit() got an unexpected keyword {key!r}: not a field of config.train "
                        f"({', '.join(sorted(c.train.keys()))})")
      c.train[key] = value
    c.model.dtype, c.model.max_length = self.encoder.dtype, self.encoder.max_length
    c.evals = ml_collections.ConfigDict()
    return c

  def _fit_val(self, texts: list[str], labels: list, *, oos_label=None) -> None:
    """Temperature (and, with `oos_label`, the rejection threshold) from held-out rows."""
    in_scope = [i for i, l in enumerate(labels) if l != oos_label]
    ids = self._label_ids([labels[i] for i in in_scope], "val labels")
    q = self._encode(texts)
    self.temperature = calibration.fit_temperature(self._intent_scores(q[in_scope]), ids)
    if oos_label is not None:
      self._set_oos_threshold(q, labels, oos_label)

  # ---- inference

  def _encode(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
    return self.encoder.encode(texts, batch_size=batch_size, normalize=True)

  def _intent_scores(self, q: np.ndarray) -> np.ndarray:
    return calibration.intent_scores(q, self.pool_embeddings, self.pool_label_ids,
                                     len(self.labels))

  def _device_pool(self) -> knn.DevicePool:
    """The pool on the devices, placed again only when `pool_embeddings` is a new array."""
    if self._placed is None or self._placed[0] is not self.pool_embeddings:
      self._placed = (self.pool_embeddings, knn.prepare_pool(self.pool_embeddings))
    return self._placed[1]

  def _neighbours(self, q: np.ndarray, oos: bool = True) -> knn.KNNResult:
    """k-NN of unit queries [n, dim]; predictions are label ids, len(labels) = rejected."""
    threshold = self.oos_threshold if oos else None
    return knn.knn_predict(q, self._device_pool(), self.pool_label_ids,
                           k=min(self.k, len(self.pool_texts)), vote=self.vote,
                           oos_threshold=threshold,
                           oos_label=None if threshold is None else len(self.labels))

  def predict(self, texts: Sequence[str], *, batch_size: int = 32) -> list:
    """The intent of each text ([n] labels), `reject_label` where out of scope."""
    return [d["label"] for d in self.predict_details(texts, batch_size=batch_size)]

  def predict_details(self, texts: Sequence[str], *, batch_size: int = 32, explain: int = 0
                      ) -> list[dict[str, Any]]:
    """Per text: {"text", "label", "score" (the nearest pool example's cosine, what the
    out-of-scope threshold compares), "oos" (rejected)}, and with `explain` > 0
    "neighbours": that many nearest pool examples [{"text", "label", "score"}], best first.
    `batch_size`: packed rows per encoder call."""
    self._need_pool("predict")
    texts = check_nonblank_texts(texts, allow_empty_list=True)
    q = self._encode(texts, batch_size)
    result = self._neighbours(q)
    near = self._nearest(q, explain) if explain > 0 else None
    out = []
    for i, text in enumerate(texts):
      pred = int(result.predictions[i])
      rejected = pred == len(self.labels)
      row = {"text": text, "label": self.reject_label if rejected else self.labels[pred],
             "score": float(result.scores[i, 0]), "oos": bool(rejected)}
      if near is not None:
        row["neighbours"] = near[i]
      out.append(row)
    return out

  def _nearest(self, q: np.ndarray, top: int) -> list[list[dict[str, Any]]]:
    scores, indices = knn.search(q, self._device_pool(), k=min(top, len(self.pool_texts)))
    return [[{"text": self.pool_texts[j], "label": self.labels[self.pool_label_ids[j]],
              "score": float(s)} for j, s in zip(idx, sc)] for sc, idx in zip(scores, indices)]

  def scores(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
    """[n, num_intents] float32: each intent's best cosine to the text (the k-NN's
    evidence; columns in `labels` order)."""
    self._need_pool("scores")
    return self._intent_scores(self._encode(check_nonblank_texts(texts, allow_empty_list=True),
                                            batch_size))

  def predict_proba(self, texts: Sequence[str], *, batch_size: int = 32) -> np.ndarray:
    """[n, num_intents] float32, rows summing to 1: softmax(scores / temperature)."""
    return calibration.softmax(self.scores(texts, batch_size=batch_size), self.temperature)

  def explain(self, text: str, top: int = 5) -> list[dict[str, Any]]:
    """The `top` pool examples nearest `text`: [{"text", "label", "score" (cosine)}], best
    first; the first decides a 1-NN prediction."""
    self._need_pool("explain")
    if not isinstance(text, str):
      raise TypeError(f"explain takes one text (str), got {type(text).__name__}")
    return self._nearest(self._encode(check_nonblank_texts([text], "text")), top)[0]

  # ---- the pool and out-of-scope rejection

  def add_examples(self, texts: Sequence[str], labels: Sequence) -> "IntentClassifier":
    """Adds labelled examples to the pool without retraining; a new label becomes a new
    intent (appended to `labels`)."""
    texts = check_nonblank_texts(texts)
    labels = _check_labels(labels, len(texts))
    if self.labels:
      saved_classifier.label_type(self.labels + labels)
    index = {l: i for i, l in enumerate(self.labels)}
    for l in labels:
      if l not in index:
        index[l] = len(self.labels)
        self.labels.append(l)
    ids = np.asarray([index[l] for l in labels], np.int32)
    self._set_pool(self.labels, self.pool_texts + texts,
                   np.concatenate([self.pool_label_ids, ids]),
                   np.concatenate([self.pool_embeddings, self._encode(texts)]))
    return self

  def calibrate_oos(self, texts: Sequence[str], labels: Sequence, *, oos_label="oos",
                    reject_label=None) -> "IntentClassifier":
    """Sets `oos_threshold` from validation rows, in scope and out of scope (label
    `oos_label`): the nearest-neighbour cosine that maximises in-scope accuracy + OOS recall
    (`knn.choose_oos_threshold`, the clinc150 evaluator's choice). `predict` then returns
    `reject_label` below it."""
    self._need_pool("calibrate_oos")
    texts = check_nonblank_texts(texts)
    labels = _check_labels(labels, len(texts))
    if oos_label in self.labels:
      raise ValueError(f"oos_label={oos_label!r} is one of the classifier's intents")
    self._set_oos_threshold(self._encode(texts), labels, oos_label)
    self.reject_label = reject_label
    return self

  def _set_oos_threshold(self, q: np.ndarray, labels: list, oos_label) -> None:
    oos_id = len(self.labels)
    ids = np.asarray([oos_id if l == oos_label else i
                      for l, i in zip(labels, self._label_ids(labels, "labels", oos_label))],
                     np.int32)
    result = self._neighbours(q, oos=False)
    self.oos_threshold = float(knn.choose_oos_threshold(result.scores[:, 0], result.predictions,
                                                        ids, oos_id))

  def _label_ids(self, labels: Sequence, what: str, oos_label=None) -> np.ndarray:
    """Ids of known labels (`oos_label` rows get -1); an unknown one is an error."""
    index = {l: i for i, l in enumerate(self.labels)}
    out = []
    for i, l in enumerate(labels):
      if l == oos_label:
        out.append(-1)
      elif l in index:
        out.append(index[l])
      else:
        raise ValueError(f"{what}[{i}]={l!r} is not one of the classifier's intents"
                         + ("" if oos_label is None else f" nor oos_label={oos_label!r}"))
    return np.asarray(out, np.int32)

  def evaluate(self, texts: Sequence[str], labels: Sequence, *, oos_label=None,
               batch_size: int = 32) -> dict[str, Any]:
    """The intent evaluator's metrics on labelled texts.

    Returns:
      accuracy and macro_f1 of the k-NN over the in-scope rows (no rejection, as the
      command line's knn_accuracy), ece (expected calibration error of `predict_proba`,
      15 bins), num_test; with `oos_label` (rows of that label are out of scope, and
      `oos_threshold` must be set): in_scope_accuracy, oos_recall, oos_precision after
      rejection.
    """
    self._need_pool("evaluate")
    # metrics imports scikit-learn (and it scipy): loaded when evaluating, not with the package.
    from convfit_jax.evaluators import metrics  # pylint: disable=import-outside-toplevel
    texts = check_nonblank_texts(texts)
    labels = _check_labels(labels, len(texts))
    ids = self._label_ids(labels, "labels", oos_label)
    q = self._encode(texts, batch_size)
    in_scope = ids >= 0
    if not in_scope.any():
      raise ValueError("evaluate needs in-scope rows")
    raw = self._neighbours(q, oos=False)
    probs = calibration.softmax(self._intent_scores(q[in_scope]), self.temperature)
    out = {"accuracy": metrics.accuracy(ids[in_scope], raw.predictions[in_scope]),
           "macro_f1": metrics.macro_f1(ids[in_scope], raw.predictions[in_scope]),
           "ece": metrics.expected_calibration_error(probs, ids[in_scope]),
           "num_test": len(texts)}
    if oos_label is not None and not in_scope.all():
      if self.oos_threshold is None:
        raise RuntimeError("evaluate(oos_label=...): no out-of-scope threshold yet; call "
                           "calibrate_oos(val_texts, val_labels) first")
      oos_id = len(self.labels)
      rejected = knn.apply_oos_threshold(raw.predictions, raw.scores[:, 0], self.oos_threshold,
                                         oos_id)
      out.update(knn.oos_metrics(rejected, np.where(in_scope, ids, oos_id), oos_id))
    return out
