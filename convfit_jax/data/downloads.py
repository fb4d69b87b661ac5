"""Downloads of the built-in intent sets, once, into a verified cache.

Two ways: `fetch_file` takes a caller's {file: (url, sha256)} table; `download_builtin`
fetches a set's original upstream files, converts them to the vendored layout
(`sources.py`) and checks the converted files against the vendored copies' sha256.
Nothing is kept unless it checks out, and every cache write is atomic.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path
from typing import Iterator, Mapping

from convfit_jax.data import sources
from convfit_jax.data.readers import DataError


def fetch_file(url: str, sha256: str, cache_dir: str | os.PathLike) -> Path:
  """Downloads `url` once into `cache_dir`, keeping it only if its sha256 matches.

  A cached copy is re-checked on every call, so a corrupted cache is an error,
  not silently used. Any urllib scheme works (https://, file://).
  """
  cache_dir = Path(cache_dir)
  target = cache_dir / url.rstrip("/").rsplit("/", 1)[-1]
  if target.is_file():
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    if digest != sha256:
      raise DataError(f"{target}: cached file has sha256 {digest}, expected {sha256}; delete it")
    return target
  cache_dir.mkdir(parents=True, exist_ok=True)
  with urllib.request.urlopen(url) as response:
    data = response.read()
  digest = hashlib.sha256(data).hexdigest()
  if digest != sha256:
    raise DataError(f"{url}: sha256 {digest}, expected {sha256}; not cached")
  # Written under a temporary name then renamed, so a concurrent reader never
  # sees a partial file.
  fd, tmp = tempfile.mkstemp(dir=cache_dir)
  with os.fdopen(fd, "wb") as f:
    f.write(data)
  os.replace(tmp, target)
  return target


OFFLINE_ENV_VARS = ("CONVFIT_OFFLINE", "HF_HUB_OFFLINE")


def default_cache_dir() -> Path:
  """$CONVFIT_CACHE_DIR, else ~/.cache/convfit_jax (read at call time, so either can change)."""
  return Path(os.environ.get("CONVFIT_CACHE_DIR") or Path.home() / ".cache" / "convfit_jax")


def offline_reason() -> str | None:
  """'VAR=value' of the first of OFFLINE_ENV_VARS that forbids downloads, else None.

  A variable counts when set to anything but '', '0', 'false', 'no' or 'off'
  (so HF_HUB_OFFLINE=0 still allows downloads, as in huggingface_hub).
  """
  for var in OFFLINE_ENV_VARS:
    value = os.environ.get(var, "")
    if value.strip().lower() not in ("", "0", "false", "no", "off"):
      return f"{var}={value}"
  return None


def _mismatches(folder: Path, expected: Mapping[str, str]) -> list[tuple[str, str, str]]:
  """(file, actual sha256 or 'missing', expected sha256) for each file that differs."""
  bad = []
  for f, want in expected.items():
    path = folder / f
    got = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
    if got != want:
      bad.append((f, got, want))
  return bad


def upstream_cache_folder(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
  """Where the converted download of built-in set `name` is cached."""
  return Path(cache_dir or default_cache_dir()) / "upstream" / name


def _download(url: str) -> bytes:
  with urllib.request.urlopen(url, timeout=120) as response:
    return response.read()


@contextlib.contextmanager
def staging_folder(target: Path) -> Iterator[Path]:
  """A temporary folder beside `target` (the same filesystem, so a rename into place is
  atomic), removed on exit whatever happens: a killed or failed build leaves nothing that
  a later call would take for `target`."""
  target.parent.mkdir(parents=True, exist_ok=True)
  work = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))
  try:
    yield work
  finally:
    shutil.rmtree(work, ignore_errors=True)


def move_into_place(folder: Path, target: Path) -> bool:
  """Renames the finished `folder` to `target`; False when another process put a `target`
  there first (the caller decides whether to trust it)."""
  try:
    os.replace(folder, target)
    return True
  except OSError:
    if not target.exists():
      raise
    return False


def download_builtin(name: str, cache_dir: str | os.PathLike | None = None) -> Path:
  """The cached, verified upstream copy of `name`, downloading and converting it once.

  The files listed in `sources.SOURCES[name].urls` are downloaded into a temporary
  folder under the cache, converted to the vendored layout, and every converted
  file's sha256 is checked against `sources.SOURCES[name].sha256`; only then is
  the folder renamed into place (atomically), with `source.json` recording each
  URL and the sha256 and size of the bytes downloaded. Later calls re-check the
  cached files' sha256 and download nothing. Does not look at OFFLINE_ENV_VARS
  (`dataset_dir` does).

  Raises:
    DataError naming the URL or the file and both hashes on a failed download,
    conversion or check; nothing is cached then.
  """
  source = sources.SOURCES[name]
  target = upstream_cache_folder(name, cache_dir)
  if target.exists():
    bad = _mismatches(target, source.sha256)
    if bad:
      f, got, want = bad[0]
      raise DataError(f"{target / f}: cached file has sha256 {got}, expected {want}; "
                      f"delete {target} to download {name} again")
    return target
  with staging_folder(target) as work:
    raw, out = work / "raw", work / "out"
    raw.mkdir()
    out.mkdir()
    record = {}
    for fname, url in source.urls.items():
      try:
        data = _download(url)
      except (OSError, ValueError) as e:  # urllib.error.URLError is an OSError
        raise DataError(
          f"{name}: could not download {url} ({e}). Check the network, or put the set's files "
          f"in data_dir/{name}/ (see convfit_jax/data/vendor/README.md for the layout)") from None
      (raw / fname).write_bytes(data)
      record[fname] = {"url": url, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    try:
      source.convert(raw, out)
    except (ValueError, KeyError, IndexError) as e:
      raise DataError(f"{name}: cannot convert the files downloaded from "
                      f"{', '.join(source.urls.values())}: {e}") from None
    bad = _mismatches(out, source.sha256)
    if bad:
      lines = "; ".join(f"{f}: sha256 {got}, expected {want}" for f, got, want in bad)
      raise DataError(f"{name}: the files converted from {', '.join(source.urls.values())} "
                      f"differ from the vendored copy ({lines}); not cached. The upstream files "
                      f"may have changed: put the set's files in data_dir/{name}/ instead")
    (out / "source.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if not move_into_place(out, target):
      return download_builtin(name, cache_dir)  # another process's copy: check it
  return target
