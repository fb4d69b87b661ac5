"""A markdown table of one metric over seeds, read from finished runs' metrics.json.

  python benchmarks/seed_table.py "the paper's pairs, ocl=workdirs/results/paper_epoch/hwu64_ocl_seed{seed}" \
      "supcon=workdirs/results/paper_epoch/hwu64_supcon_lr1e-4_seed{seed}" [--seeds 0,1,2]
      [--metric knn_accuracy] [--extra silhouette]

Each argument is `label=workdir`, `{seed}` standing for the seed; a row per label: the
metric (in %) per seed, mean ± sample sd over the seeds, and the `--extra` metrics' means
(as written; blank in baseline rows). A label may read a baseline from another metric: `label=workdir@metric`
(e.g. `knn_accuracy_before`, `mlp_accuracy_before`). A missing run or metric is an error
naming the file.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import harness
from convfit_jax.train.workdir import finished_metrics


def read_metric(workdir: str, metric: str) -> float:
  metrics = finished_metrics(workdir)
  if metric not in metrics:
    raise SystemExit(f"{workdir}/metrics.json: no {metric!r} (has {sorted(metrics)})")
  return float(metrics[metric])


def table(rows: list[str], seeds: list[int], metric: str, extra: list[str]) -> str:
  """rows: `label=workdir[@metric]` with `{seed}` in workdir."""
  head = (["method"] + [f"seed {s}" for s in seeds] + ["mean ± sd"] + extra)
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for label, spec in harness.named(rows, "label=workdir"):
    workdir, _, row_metric = spec.partition("@")
    row_metric = row_metric or metric
    values = [100 * read_metric(workdir.format(seed=s), row_metric) for s in seeds]
    spread = f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else ""
    # A baseline row (another metric of the same runs) leaves the after-training extras blank.
    extras = ["" if spec.count("@") else
              f"{statistics.mean(read_metric(workdir.format(seed=s), e) for s in seeds):.2f}"
              for e in extra]
    lines.append("| " + " | ".join([label] + [f"{v:.2f}" for v in values]
                                    + [f"{statistics.mean(values):.2f}{spread}"] + extras) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("rows", nargs="+", help="label=workdir[@metric], {seed} for the seed")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--metric", default="knn_accuracy")
  p.add_argument("--extra", default="", help="comma-separated metrics averaged over seeds")
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
  extra = [e for e in args.extra.split(",") if e.strip()]
  sys.stdout.write(table(args.rows, seeds, args.metric, extra))
  return 0


if __name__ == "__main__":
  sys.exit(main())
