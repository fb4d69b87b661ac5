"""The package without its checkout: a wheel installed into an empty folder runs the
protocol task's smoke configuration by the path of configs/protocol.py, from a directory
with no checkout in sight."""

import json
import os
import shutil
import subprocess
import sys

from conftest import REPO


def test_protocol_runlocal_from_an_installed_wheel(tmp_path, minilm_dir):
  del minilm_dir  # the smoke run's encoder: the packaged MiniLM weights must be installed
  dist, site, elsewhere = tmp_path / "dist", tmp_path / "site", tmp_path / "elsewhere"
  elsewhere.mkdir()
  # A copy of the sources (setuptools' build/ folder in the checkout could hold stale
  # modules), built as pip builds it for users: an isolated build environment.
  src = tmp_path / "src"
  shutil.copytree(REPO / "convfit_jax", src / "convfit_jax",
                  ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
  for name in ("setup.cfg", "pyproject.toml", "README.md"):
    shutil.copy(REPO / name, src / name)
  r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(dist), str(src)],
                     capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]
  wheel, = dist.glob("convfit_jax-*.whl")
  r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--target", str(site),
                      str(wheel)], capture_output=True, text=True, timeout=600)
  assert r.returncode == 0, r.stderr[-3000:]

  env = {**os.environ, "PYTHONPATH": str(site), "HF_HUB_OFFLINE": "1"}
  env.pop("XLA_FLAGS", None)  # one device, as a user's machine
  where = subprocess.run([sys.executable, "-c", "import convfit_jax; print(convfit_jax.__file__)"],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=120)
  assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
  r = subprocess.run([sys.executable, "-m", "convfit_jax.main",
                      f"--config={REPO / 'configs' / 'protocol.py'}:runlocal"],
                     cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  run = elsewhere / "workdirs" / "protocol_runlocal"
  results = json.loads((run / "results.json").read_text())
  assert [(x["dataset"], x["shots"], x["loss"], x["seed"]) for x in results] == [("banking77", 2, "ocl", 0)]
  assert 0.0 < results[0]["knn_accuracy"] <= 1.0 and results[0]["steps"] == 4
  assert "| ConvFiT Stage 2 (ocl), k-NN |" in r.stdout  # the table is the run's summary
  assert (run / "banking77_2shot_ocl_seed0" / "model" / "model.safetensors").is_file()
