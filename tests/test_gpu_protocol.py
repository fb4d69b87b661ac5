"""benchmarks/gpu_protocol.py, the GPU session's prepared script, run here on a tiny model:
label-batch objectives take the pairs cell's step count, the baselines come from the first
loss's cells, and the record is written. In a subprocess: the script sets JAX's persistent
compilation cache for its process."""

import json
import pathlib
import subprocess
import sys

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_protocol.py"


def _run(tiny_bert_dir, tmp_path, *args):
  return subprocess.run(
      [sys.executable, str(SCRIPT), "--smoke", "--init_from", str(tiny_bert_dir),
       "--workdir", str(tmp_path / "w"), "--out", str(tmp_path / "record.md"),
       "--compile_cache", str(tmp_path / "cache"), *args],
      capture_output=True, text=True, timeout=600, check=False)


def test_dense_cells_train_the_pairs_cells_steps_and_the_budget_skips_a_seed(tiny_bert_dir,
                                                                             tmp_path):
  # A 1-second budget: seed 0's cells run (no earlier time to go by), seed 1's are skipped.
  done = _run(tiny_bert_dir, tmp_path, "--losses", "ocl,supcon", "--dense_steps", "pairs",
              "--max_steps", "4", "--seeds", "0,1", "--budget_s", "1")
  assert done.returncode == 0, done.stderr[-2000:]
  out = tmp_path / "record.md"
  record_json = json.loads(out.with_suffix(".json").read_text())
  results = record_json["results"]
  assert [(r["loss"], r["steps"]) for r in results] == [("ocl", 4), ("supcon", 4)]
  assert list(record_json["seed_seconds"]) == ["0"] and len(record_json["skipped_cells"]) == 2
  assert "mlp_accuracy_before" in results[0] and "mlp_accuracy_before" not in results[1]
  supcon = json.loads((tmp_path / "w" / "banking77_2shot_supcon_seed0" / "config.json").read_text())
  assert supcon["train"]["sampler"] == "labels" and supcon["train"]["max_steps"] == 4
  record = out.read_text()
  assert "| ConvFiT Stage 2 (supcon), k-NN |" in record
  assert "train as many steps as the pairs cell" in record


def test_dense_steps_pairs_needs_a_pairs_loss_first(tiny_bert_dir, tmp_path):
  done = _run(tiny_bert_dir, tmp_path, "--losses", "supcon", "--dense_steps", "pairs")
  assert done.returncode != 0 and "list a pairs loss" in done.stderr
