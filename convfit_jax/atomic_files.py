"""Files written whole or not at all: a temporary file in the same folder, then a rename."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np


def _json_default(obj):
  if isinstance(obj, (np.floating, np.integer)):
    return obj.item()
  if isinstance(obj, np.ndarray):
    return obj.tolist()
  return str(obj)


def write_json(path: str | os.PathLike, obj: Any, *, sort_keys: bool = False) -> None:
  """`obj` as indented JSON with a final newline; NumPy scalars and arrays as numbers and lists."""
  write_text(path, json.dumps(obj, indent=2, sort_keys=sort_keys, default=_json_default) + "\n")


def write_text(path: str | os.PathLike, text: str) -> None:
  """`text` as a UTF-8 file."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp")
  tmp.write_text(text, encoding="utf-8")
  os.replace(tmp, path)


def save_npy(path: str | os.PathLike, array: np.ndarray) -> None:
  """`array` as a .npy file."""
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(path.name + ".tmp.npy")
  np.save(tmp, array)
  os.replace(tmp, path)
