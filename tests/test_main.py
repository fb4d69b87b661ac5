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


def test_bad_input_is_one_line_and_traceback_is_on_request(tmp_path):
  bad = tmp_path / "train.csv"
  bad.write_text("text,label\nhello,greet\n,greet\n", encoding="utf-8")
  args = ["--config=configs/evaluate.py", "--config.data.name=csv", f"--config.data.train_file={bad}",
          f"--config.data.test_file={bad}", f"--config.workdir={tmp_path / 'run'}"]
  r = _main(*args)
  assert r.returncode == 1
  assert f"error: DataError: {bad}:3: empty text in column 'text'" in r.stderr
  assert "Traceback" not in r.stderr
  r = _main(*args, "--traceback")
  assert r.returncode != 0 and "Traceback" in r.stderr and f"{bad}:3" in r.stderr


def test_terminal_shows_the_run_and_the_log_file_has_the_rest(tmp_path, tiny_bert_dir):
  run = tmp_path / "run"
  r = _main("--config=configs/stage2.py", f"--config.workdir={run}",
            f"--config.model.init_from={tiny_bert_dir}", "--config.model.max_length=16",
            "--config.model.projection_dim=8", "--config.data.shots=2", "--config.train.batch_size=8",
            "--config.train.max_steps=2", "--config.train.log_every=1", "--config.evals.knn.max_test=50",
            "--config.evals.knn.tsne=False")
  assert r.returncode == 0, r.stderr[-3000:]
  assert "k-NN accuracy on 50 test examples: before" in r.stdout
  assert "banking77: 154 training examples, 77 intents" in r.stderr  # what the run is doing
  for noise in ("CheckpointManager", "DuplicateRowsWarning", "PyTorch was not found", "steps 1-1:"):
    assert noise not in r.stderr, noise
  log = (run / "log.txt").read_text()
  assert "CheckpointManager" in log and "steps 1-1: loss" in log
