"""benchmarks/gpu_protocol.py, the GPU session's prepared script, run here on a tiny model:
label-batch objectives take the pairs cell's step count, the baselines come from the first
loss's cells, and the record is written."""

import importlib.util
import json
import pathlib

import jax
import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_protocol.py"


@pytest.fixture(name="gpu_protocol")
def fixture_gpu_protocol():
  spec = importlib.util.spec_from_file_location("gpu_protocol", SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  cache = jax.config.jax_compilation_cache_dir
  yield module
  jax.config.update("jax_compilation_cache_dir", cache)  # main() sets it for the process


def test_dense_cells_train_the_pairs_cells_steps(gpu_protocol, tiny_bert_dir, tmp_path):
  out = tmp_path / "record.md"
  assert gpu_protocol.main(["--smoke", "--losses", "ocl,supcon", "--dense_steps", "pairs",
                            "--max_steps", "4", "--init_from", str(tiny_bert_dir),
                            "--workdir", str(tmp_path / "w"), "--out", str(out),
                            "--compile_cache", str(tmp_path / "cache")]) == 0
  results = json.loads(out.with_suffix(".json").read_text())["results"]
  assert [(r["loss"], r["steps"]) for r in results] == [("ocl", 4), ("supcon", 4)]
  assert "mlp_accuracy_before" in results[0] and "mlp_accuracy_before" not in results[1]
  supcon = json.loads((tmp_path / "w" / "banking77_2shot_supcon_seed0" / "config.json").read_text())
  assert supcon["train"]["sampler"] == "labels" and supcon["train"]["max_steps"] == 4
  record = out.read_text()
  assert "| ConvFiT Stage 2 (supcon), k-NN |" in record
  assert "train as many steps as the pairs cell" in record


def test_dense_steps_pairs_needs_a_pairs_loss_first(gpu_protocol, tiny_bert_dir, tmp_path):
  with pytest.raises(SystemExit, match="list a pairs loss"):
    gpu_protocol.main(["--smoke", "--losses", "supcon", "--dense_steps", "pairs",
                       "--init_from", str(tiny_bert_dir), "--workdir", str(tmp_path / "w"),
                       "--out", str(tmp_path / "record.md"),
                       "--compile_cache", str(tmp_path / "cache")])
