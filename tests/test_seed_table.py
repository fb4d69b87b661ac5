"""benchmarks/seed_table.py: a metric over seeds from metrics.json files."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "seed_table.py"
spec = importlib.util.spec_from_file_location("seed_table", SCRIPT)
seed_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(seed_table)


def _run(tmp_path, name, seed, **metrics):
  d = tmp_path / f"{name}_seed{seed}"
  d.mkdir()
  (d / "metrics.json").write_text(json.dumps(metrics))


def test_rows_means_spreads_and_baselines(tmp_path):
  for seed, (acc, before, sil) in enumerate([(0.80, 0.70, 0.2), (0.82, 0.71, 0.4)]):
    _run(tmp_path, "a", seed, knn_accuracy=acc, knn_accuracy_before=before, silhouette=sil)
  md = seed_table.table([f"before={tmp_path}/a_seed{{seed}}@knn_accuracy_before",
                         f"after={tmp_path}/a_seed{{seed}}"], [0, 1], "knn_accuracy", ["silhouette"])
  lines = md.splitlines()
  assert lines[0] == "| method | seed 0 | seed 1 | mean ± sd | silhouette |"
  assert lines[2] == "| before | 70.00 | 71.00 | 70.50 ± 0.71 |  |"
  assert lines[3] == "| after | 80.00 | 82.00 | 81.00 ± 1.41 | 0.30 |"


def test_a_missing_run_or_metric_names_the_file(tmp_path):
  _run(tmp_path, "a", 0, knn_accuracy=0.5)
  with pytest.raises(FileNotFoundError, match=r"a_seed1/metrics.json: no metrics.json"):
    seed_table.table([f"x={tmp_path}/a_seed{{seed}}"], [0, 1], "knn_accuracy", [])
  with pytest.raises(SystemExit, match=r"a_seed0/metrics.json: no 'silhouette'"):
    seed_table.table([f"x={tmp_path}/a_seed{{seed}}"], [0], "knn_accuracy", ["silhouette"])
