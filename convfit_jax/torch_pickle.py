"""Reads a PyTorch `pytorch_model.bin` state dict into numpy without importing torch.

A torch.save file is a zip holding `<name>/data.pkl` (the pickled dict, whose tensors
are `torch._utils._rebuild_tensor_v2` calls over persistent storage ids) and one raw
little-endian file per storage under `<name>/data/`. Only those names are resolved:
anything else in the pickle is refused, so loading cannot run arbitrary code.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from pathlib import Path

import ml_dtypes
import numpy as np

_STORAGE_DTYPES = {
    "FloatStorage": np.float32, "DoubleStorage": np.float64, "HalfStorage": np.float16,
    "BFloat16Storage": ml_dtypes.bfloat16, "LongStorage": np.int64, "IntStorage": np.int32,
    "ShortStorage": np.int16, "CharStorage": np.int8, "ByteStorage": np.uint8, "BoolStorage": np.bool_,
}


class _Storage:
  def __init__(self, dtype):
    self.dtype = dtype


def _rebuild_tensor(storage, offset, size, stride, *unused):
  del unused  # requires_grad, backward hooks, metadata
  flat = storage
  if not size:
    return flat[offset].copy()
  itemsize = flat.dtype.itemsize
  return np.lib.stride_tricks.as_strided(flat[offset:], shape=tuple(size),
                                         strides=tuple(s * itemsize for s in stride)).copy()


def load_state_dict(path: str | Path) -> dict[str, np.ndarray]:
  """{name: array} of a zip-format torch.save file (torch >= 1.6), without torch."""
  path = Path(path)
  with zipfile.ZipFile(path) as zf:
    names = zf.namelist()
    pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
    if pkl is None:
      raise ValueError(f"{path}: not a zip-format PyTorch checkpoint (no data.pkl)")
    prefix = pkl[:-len("data.pkl")]

    class Unpickler(pickle.Unpickler):

      def find_class(self, module, name):
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
          return _rebuild_tensor
        if module == "torch" and name in _STORAGE_DTYPES:
          return _Storage(_STORAGE_DTYPES[name])
        if module == "collections" and name == "OrderedDict":
          return collections.OrderedDict
        raise pickle.UnpicklingError(f"{path}: refusing to load {module}.{name}")

      def persistent_load(self, pid):
        kind, storage_type, key, _location, _numel = pid
        if kind != "storage" or not isinstance(storage_type, _Storage):
          raise pickle.UnpicklingError(f"{path}: unsupported storage {pid!r}")
        raw = zf.read(f"{prefix}data/{key}")
        return np.frombuffer(raw, dtype=storage_type.dtype)

    with zf.open(pkl) as f:
      state = Unpickler(f).load()
  return {k: np.asarray(v) for k, v in state.items()}
