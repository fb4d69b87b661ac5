"""Components chosen by name from the config, as big_vision does: a name is a module of a package."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType


def lookup(package: str, name: str, attribute: str, field: str) -> ModuleType:
  """The module `package.name`, which must define `attribute`; an unknown name is an error
  naming the config `field` and listing the modules of `package` that define `attribute`."""
  try:
    module = importlib.import_module(f"{package}.{name}")
  except ModuleNotFoundError as e:
    if e.name != f"{package}.{name}":
      raise
    module = None
  if module is None or not hasattr(module, attribute):
    raise ValueError(f"{field}={name!r}: no such module; known: {', '.join(known(package, attribute))}")
  return module


def known(package: str, attribute: str) -> list[str]:
  """The modules of `package` that define `attribute`, sorted."""
  path = importlib.import_module(package).__path__
  return sorted(info.name for info in pkgutil.iter_modules(path)
                if hasattr(importlib.import_module(f"{package}.{info.name}"), attribute))
