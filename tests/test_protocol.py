"""The protocol task: a grid of Stage 2 runs summarised as the paper's Table 2."""

import json

from configs import protocol as protocol_config
from convfit_jax.tasks import protocol


def test_protocol_runs_the_grid_and_writes_the_table(tiny_bert_dir, tmp_path):
  c = protocol_config.get_config(f"datasets=banking77,shots=2,seeds=0+1,losses=ocl+supcon,"
                                 f"init_from={tiny_bert_dir},workdir={tmp_path}")
  assert (c.shots, c.seeds, c.losses) == ((2,), (0, 1), ("ocl", "supcon"))  # typed
  c.stage2.train.max_steps = 2
  c.stage2.evals.knn.max_test = 40
  c.stage2.train.batch_size = 8
  c.stage2.train.labels_per_batch = 4
  c.stage2.train.examples_per_label = 2
  c.stage2.evals.knn.extra_pools = (5,)
  results = protocol.run(c)
  # Seeds outermost: a grid cut short has whole seeds.
  assert [(r["seed"], r["loss"], r["shots"]) for r in results] == [
      (0, "ocl", 2), (0, "supcon", 2), (1, "ocl", 2), (1, "supcon", 2)]
  assert (tmp_path / "banking77_2shot_ocl_seed1" / "model" / "model.safetensors").is_file()
  supcon = json.loads((tmp_path / "banking77_2shot_supcon_seed0" / "config.json").read_text())
  assert (supcon["train"]["sampler"], supcon["train"]["loss"]) == ("labels", "supcon")
  assert results[1]["sentences_per_step"] == 8 and "pairs_positive" not in results[1]
  assert json.loads((tmp_path / "results.json").read_text()) == results
  md = (tmp_path / "results.md").read_text()
  lines = md.splitlines()
  assert lines[0] == "| method | banking77 2-shot |"
  knn = [r["knn_accuracy"] for r in results[::2]]
  mean = 100 * sum(knn) / 2
  row = next(l for l in lines if l.startswith("| ConvFiT Stage 2 (ocl)"))
  assert f"{mean:.2f} ± " in row
  assert any(l.startswith("| k-NN, encoder before Stage 2") for l in lines)
  assert any(l.startswith("| MLP on frozen encodings before Stage 2") for l in lines)
  assert f"Encoder before Stage 2: {tiny_bert_dir}." in md
  assert all(r["num_pool_pool5"] == 77 * 5 for r in results)
  assert "test examples: banking77 40." in md
  assert any(l.startswith("| ConvFiT Stage 2 (ocl), k-NN, pool 5-shot |") for l in lines)
  assert any(l.startswith("| ConvFiT Stage 2 (supcon), k-NN |") for l in lines)
  assert "| ConvFiT Stage 2 (ocl), training steps | 2 ± 0 |" in lines
  assert any(l.startswith("| ConvFiT Stage 2 (supcon), training seconds | ") for l in lines)


def test_table_layout_with_missing_cells():
  results = [{"dataset": "hwu64", "shots": 10, "loss": "cos", "seed": 0, "knn_accuracy": 0.5}]
  md = protocol.table(results, ["hwu64"], [10, 0], ["cos"])
  assert "| ConvFiT Stage 2 (cos), k-NN | 50.00 | – |" in md
  assert "| ConvFiT Stage 2 (cos), training seconds | – | – |" in md


def test_table_has_a_column_per_intent_subset():
  results = [{"dataset": "clinc150", "intents": n, "shots": 10, "loss": "supcon", "seed": 0,
              "knn_accuracy": acc, "num_test": 30 * n} for n, acc in ((5, 0.9), (10, 0.8))]
  md = protocol.table(results, ["clinc150"], [10], ["supcon"], intents=[5, 10])
  lines = md.splitlines()
  assert lines[0] == "| method | clinc150 5 intents 10-shot | clinc150 10 intents 10-shot |"
  assert "| ConvFiT Stage 2 (supcon), k-NN | 90.00 | 80.00 |" in md
  assert "test examples: clinc150 5 intents 150, clinc150 10 intents 300." in md
