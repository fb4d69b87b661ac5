"""The command line, run as a user runs it."""

import subprocess
import sys

import numpy as np

from conftest import REPO


def _main(*args, cwd=REPO):
  return subprocess.run([sys.executable, "-m", "convfit_jax.main", *args], cwd=cwd,
                        capture_output=True, text=True, timeout=600)


def test_encode_task_writes_one_row_per_line(tmp_path, minilm_dir):
  texts = tmp_path / "texts.txt"
  texts.write_text("how do I top up my card?\n\nmy card was declined\n", encoding="utf-8")
  out = tmp_path / "emb.npy"
  r = _main("--config=configs/encode.py", f"--config.input={texts}", f"--config.output={out}",
            f"--config.model={minilm_dir}")
  assert r.returncode == 0, r.stderr[-2000:]
  emb = np.load(out)
  assert emb.shape == (3, 384) and emb.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)


def test_invalid_utf8_and_config_typos_are_named(tmp_path):
  bad = tmp_path / "bad.txt"
  bad.write_bytes(b"fine\nbro\xffken\n")
  r = _main("--config=configs/encode.py", f"--config.input={bad}", f"--config.output={tmp_path / 'x.npy'}")
  assert r.returncode != 0 and f"{bad}:2: invalid UTF-8" in r.stderr
  r = _main("--config=configs/encode.py", "--config.batchsize=3")
  assert r.returncode != 0 and "batchsize" in r.stderr
