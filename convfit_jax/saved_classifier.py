"""The saved intent classifier: one folder, written whole or not at all, read with checks.

    folder/
      config.json, model.safetensors, tokenizer files, modules.json, 1_Pooling/, 2_Dense/
                            the encoder: an HF + sentence-transformers folder, so
                            `SentenceTransformer(folder)`, `AutoModel.from_pretrained(folder)`
                            and `Encoder.from_pretrained(folder)` load it as it is
      classifier.json       settings: labels, k, vote, temperature, out-of-scope threshold,
                            dtype, max length, pool size and dimension, the embeddings'
                            sha256, format and package versions
      pool.jsonl            the pool: {"text": ..., "label": ...} a line, in pool order
      pool_embeddings.npy   [pool, dim] float32, unit rows, row i for line i

No pickle: JSON, JSON lines and a plain .npy (read with allow_pickle=False). Labels are
strings or ints (`label_type` says which), kept as the user gave them. Both
`IntentClassifier.save_pretrained` and a Stage 2 run (`workdir/classifier/`) write it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from convfit_jax.atomic_files import write_json

FORMAT = "convfit_jax.IntentClassifier"
FORMAT_VERSION = 1
SETTINGS_FILE = "classifier.json"
POOL_FILE = "pool.jsonl"
EMBEDDINGS_FILE = "pool_embeddings.npy"
_LABEL_TYPES = {"str": str, "int": int}
_CLASSIFIER_FILES = (SETTINGS_FILE, POOL_FILE, EMBEDDINGS_FILE)


class SavedClassifierError(ValueError):
  """A saved classifier folder that cannot be loaded; the message names the file and field."""


@dataclasses.dataclass
class Settings:
  """What classifier.json holds besides the pool.

  Attributes:
    labels: the intents, in label-id order (str or int).
    k, vote: k-NN settings (`evaluators.knn`).
    temperature: of `predict_proba`'s softmax over intent scores.
    oos_threshold: a top-1 cosine below it is out of scope; None: no rejection.
    reject_label: what `predict` returns for a rejected text.
    dtype: the encoder's compute dtype name ("float32", "bfloat16").
    max_length: tokens per text, special tokens included.
  """
  labels: list
  k: int = 1
  vote: str = "majority"
  temperature: float = 1.0
  oos_threshold: float | None = None
  reject_label: Any = None
  dtype: str = "float32"
  max_length: int = 48


def is_saved_classifier(folder: str | os.PathLike) -> bool:
  return (Path(folder) / SETTINGS_FILE).is_file()


def label_type(labels: Sequence) -> str:
  """'str' or 'int' for labels all of one of those types (bool is not an int here)."""
  kinds = {("int" if isinstance(l, (int, np.integer)) and not isinstance(l, bool)
            else "str" if isinstance(l, str) else type(l).__name__) for l in labels}
  if len(kinds) > 1:
    raise TypeError(f"labels mix types ({', '.join(sorted(kinds))}); use all strings or all ints")
  kind = kinds.pop() if kinds else "str"
  if kind not in _LABEL_TYPES:
    raise TypeError(f"labels must be strings or ints, got {kind}")
  return kind


def _sha256(path: Path) -> str:
  h = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      h.update(block)
  return h.hexdigest()


def _link_or_copy(src: Path, dst: Path) -> None:
  """The encoder files of folder `src` under `dst`, hard-linked where the filesystem allows
  (a Stage 2 run's model/ and classifier/ then share one copy of the weights). A saved
  classifier's own files are left out: they are written anew, and writing through a link
  would change the folder being replaced."""
  for path in sorted(src.rglob("*")):
    if path.parent == src and path.name in _CLASSIFIER_FILES:
      continue
    target = dst / path.relative_to(src)
    if path.is_dir():
      target.mkdir(parents=True, exist_ok=True)
      continue
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
      os.link(path, target)
    except OSError:
      shutil.copy2(path, target)


def write(folder: str | os.PathLike, *, write_encoder: Callable[[Path], Any] | None = None,
          encoder_dir: str | os.PathLike | None = None, settings: Settings,
          pool_texts: Sequence[str], pool_label_ids: np.ndarray, embeddings: np.ndarray,
          version: str) -> Path:
  """Writes the folder atomically: built beside it under a temporary name, then renamed
  into place (an existing folder is moved aside first and removed after), so a folder at
  `folder` always loads.

  Args:
    write_encoder: writes the encoder's HF folder into the path it is given; or
    encoder_dir: an encoder folder already written, linked or copied.
    settings: classifier.json's settings.
    pool_texts: m texts; pool_label_ids: [m] int ids into settings.labels.
    embeddings: [m, dim] float32.
    version: the package version that writes it.
  """
  if (write_encoder is None) == (encoder_dir is None):
    raise ValueError("give one of write_encoder and encoder_dir")
  folder = Path(folder).absolute()
  embeddings = np.ascontiguousarray(embeddings, np.float32)
  pool_label_ids = np.asarray(pool_label_ids, np.int64)
  if embeddings.shape[0] != len(pool_texts) or len(pool_label_ids) != len(pool_texts):
    raise ValueError(f"pool of {len(pool_texts)} texts, {len(pool_label_ids)} labels and "
                     f"{embeddings.shape[0]} embeddings")
  tmp = folder.with_name(f".{folder.name}.tmp-{os.getpid()}")
  old = folder.with_name(f".{folder.name}.old-{os.getpid()}")
  shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True)
  try:
    if encoder_dir is not None:
      _link_or_copy(Path(encoder_dir), tmp)
    else:
      write_encoder(tmp)
    np.save(tmp / EMBEDDINGS_FILE, embeddings, allow_pickle=False)
    labels = list(settings.labels)
    with open(tmp / POOL_FILE, "w", encoding="utf-8") as f:
      for text, i in zip(pool_texts, pool_label_ids):
        f.write(json.dumps({"text": text, "label": labels[i]}, ensure_ascii=False) + "\n")
    write_json(tmp / SETTINGS_FILE, {
        "format": FORMAT, "format_version": FORMAT_VERSION, "convfit_jax_version": version,
        **dataclasses.asdict(settings), "label_type": label_type(labels),
        "pool_size": len(pool_texts), "dim": int(embeddings.shape[1]),
        "pool_embeddings_sha256": _sha256(tmp / EMBEDDINGS_FILE)})
    if folder.exists():
      shutil.rmtree(old, ignore_errors=True)
      folder.rename(old)
    tmp.rename(folder)
  finally:
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(old, ignore_errors=True)
  return folder


def recover(folder: str | os.PathLike) -> str | None:
  """Puts back a folder that a killed `write` left aside between its two renames (the
  folder moved to .<name>.old-<pid>, the new one complete as .<name>.tmp-<pid>): the new
  one if its settings file, written last, is there, else the old. Returns what it did
  (None: nothing to do)."""
  folder = Path(folder).absolute()
  if folder.exists() or not folder.parent.is_dir():
    return None
  done = [p for p in folder.parent.glob(f".{folder.name}.tmp-*") if (p / SETTINGS_FILE).is_file()]
  old = sorted(folder.parent.glob(f".{folder.name}.old-*"))
  if not (done or old):
    return None
  source = done[0] if done else old[0]
  source.rename(folder)
  return f"{folder}: restored from {source.name}, which an interrupted save left"


@dataclasses.dataclass
class Loaded:
  """A saved classifier read back: settings, the pool, its embeddings."""
  settings: Settings
  pool_texts: list[str]
  pool_label_ids: np.ndarray  # [m] int32
  embeddings: np.ndarray  # [m, dim] float32


def read(folder: str | os.PathLike) -> Loaded:
  """Reads and checks the folder's classifier files (the encoder is `Encoder.from_pretrained`'s).

  Raises:
    SavedClassifierError naming the file (and line or field) that is missing, truncated,
    corrupted, inconsistent with the others, or written by a newer format.
  """
  folder = Path(folder)
  path = folder / SETTINGS_FILE

  def fail(where: Path | str, why: str):
    raise SavedClassifierError(f"{where}: {why}")

  try:
    meta = json.loads(path.read_text(encoding="utf-8"))
  except FileNotFoundError:
    fail(path, "missing (not a saved IntentClassifier folder)")
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    fail(path, f"not valid JSON ({e})")
  if not isinstance(meta, dict) or meta.get("format") != FORMAT:
    fail(path, f"field 'format' is {meta.get('format') if isinstance(meta, dict) else meta!r}, "
         f"expected {FORMAT!r}")
  version = meta.get("format_version")
  if not isinstance(version, int):
    fail(path, f"field 'format_version' is {version!r}, expected an int")
  if version > FORMAT_VERSION:
    fail(path, f"format_version {version} was written by a newer convfit_jax "
         f"({meta.get('convfit_jax_version')}); this one reads up to {FORMAT_VERSION}: upgrade")
  fields = {f.name for f in dataclasses.fields(Settings)}
  required = fields | {"label_type", "pool_size", "dim", "pool_embeddings_sha256"}
  missing = sorted(required - set(meta))
  if missing:
    fail(path, f"missing field(s) {', '.join(missing)}")
  kind = _LABEL_TYPES.get(meta["label_type"])
  if kind is None:
    fail(path, f"field 'label_type' is {meta['label_type']!r}, expected 'str' or 'int'")
  labels = meta["labels"]
  if (not isinstance(labels, list) or not labels
      or not all(type(l) is kind for l in labels) or len(set(labels)) != len(labels)):
    fail(path, f"field 'labels' must be a non-empty list of distinct {meta['label_type']} values")
  settings = Settings(**{k: meta[k] for k in fields})
  m, dim = meta["pool_size"], meta["dim"]

  emb_path = folder / EMBEDDINGS_FILE
  if not emb_path.is_file():
    fail(emb_path, "missing")
  if _sha256(emb_path) != meta["pool_embeddings_sha256"]:
    fail(emb_path, f"sha256 differs from {SETTINGS_FILE}'s 'pool_embeddings_sha256' "
         "(truncated or changed after saving)")
  try:
    embeddings = np.load(emb_path, allow_pickle=False)
  except ValueError as e:
    fail(emb_path, f"not a .npy array ({e})")
  if embeddings.shape != (m, dim) or embeddings.dtype != np.float32:
    fail(emb_path, f"shape {embeddings.shape} {embeddings.dtype}, {SETTINGS_FILE} says "
         f"({m}, {dim}) float32")

  pool_path = folder / POOL_FILE
  ids = {label: i for i, label in enumerate(labels)}
  texts, label_ids = [], []
  try:
    lines = pool_path.read_text(encoding="utf-8").splitlines()
  except FileNotFoundError:
    fail(pool_path, "missing")
  for lineno, line in enumerate(lines, start=1):
    try:
      row = json.loads(line)
      text, label = row["text"], row["label"]
    except (json.JSONDecodeError, KeyError, TypeError):
      fail(f"{pool_path}:{lineno}", 'expected {"text": ..., "label": ...}')
    if not isinstance(text, str) or type(label) is not kind or label not in ids:
      fail(f"{pool_path}:{lineno}", f"text must be a string and label one of {SETTINGS_FILE}'s "
           f"labels, got label {label!r}")
    texts.append(text)
    label_ids.append(ids[label])
  if len(texts) != m:
    fail(pool_path, f"{len(texts)} rows, {SETTINGS_FILE} says pool_size {m}")
  return Loaded(settings, texts, np.asarray(label_ids, np.int32), embeddings)
