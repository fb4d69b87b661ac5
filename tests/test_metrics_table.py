"""benchmarks/metrics_table.py: several metrics a row, from merged metrics.json files."""

import importlib.util
import json
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "metrics_table.py"
spec = importlib.util.spec_from_file_location("metrics_table", SCRIPT)
metrics_table = importlib.util.module_from_spec(spec)
spec.loader.exec_module(metrics_table)


def _run(tmp_path, name, **metrics):
  d = tmp_path / name
  d.mkdir()
  (d / "metrics.json").write_text(json.dumps(metrics))
  return d


def test_rows_merge_workdirs_format_by_kind_and_leave_missing_metrics_blank(tmp_path):
  a = _run(tmp_path, "a", x_r10_at_1=0.671, x_mrr=0.772, train_seconds=1031.0,
           interpolation_weight=0.17782794, silhouette=0.41468)
  b = _run(tmp_path, "b", sgd_r_at_1=0.11, x_mrr=0.5)
  md = metrics_table.table([f"A={a}+{b}", f"B={b}"], ["x_r10_at_1", "x_mrr", "sgd_r_at_1",
                                                      "train_seconds", "interpolation_weight",
                                                      "silhouette"],
                           strip="x_")
  lines = md.splitlines()
  assert lines[0] == ("| run | r10_at_1 | mrr | sgd_r_at_1 | train_seconds | interpolation_weight"
                      " | silhouette |")
  assert lines[2] == "| A | 67.1 | 0.500 | 11.0 | 17.2 | 0.178 | 0.41 |"  # b's mrr, merged last, wins
  assert lines[3] == "| B |  | 0.500 | 11.0 |  |  |  |"


def test_a_missing_run_names_the_file(tmp_path):
  with pytest.raises(FileNotFoundError, match=r"nope/metrics.json: no metrics.json"):
    metrics_table.table([f"x={tmp_path}/nope"], ["mrr"])
  with pytest.raises(SystemExit, match="expected label=workdir"):
    metrics_table.table(["just-a-path"], ["mrr"])
