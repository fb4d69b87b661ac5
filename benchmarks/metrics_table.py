"""A markdown table of several metrics, a row per finished run, read from metrics.json.

  python benchmarks/metrics_table.py "ESIM=workdirs/results/rerank/esim" \
      "TF-IDF=workdirs/results/rerank/subset/tfidf+workdirs/results/rerank/sgd_zero_shot/tfidf" \
      --metrics ubuntu_irc_test_rs10_r10_at_1,ubuntu_irc_test_rs10_mrr,train_seconds \
      [--strip ubuntu_irc_]

Each row is `label=workdir`, or several workdirs joined by `+` whose metrics.json are
merged (later ones win); a workdir without metrics.json is an error naming it, a metric a
row lacks a blank cell. Values as the table's readers expect them: `*seconds` in minutes,
`*mrr` and `*dstc7` as fractions, `*silhouette` as it is (2 decimals, a cosine), `*weight` as it is
(3 digits), every other metric (recall, accuracy) in %. Column
headers are the metric names less the `--strip` prefix.
"""

from __future__ import annotations

import argparse

import harness
from convfit_jax.train.workdir import finished_metrics


def cell(metric: str, value: float | None) -> str:
  if value is None:
    return ""
  if metric.endswith("seconds"):
    return f"{value / 60:.1f}"
  if metric.endswith(("mrr", "dstc7")):
    return f"{value:.3f}"
  if metric.endswith("silhouette"):
    return f"{value:.2f}"
  if metric.endswith("weight"):
    return f"{value:.3g}"
  return f"{100 * value:.1f}"


def table(rows: list[str], metrics: list[str], strip: str = "") -> str:
  head = ["run"] + [m.removeprefix(strip) for m in metrics]
  lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
  for label, spec in harness.named(rows, "label=workdir"):
    values = finished_metrics(spec)
    lines.append("| " + " | ".join([label] + [cell(m, values.get(m)) for m in metrics]) + " |")
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("rows", nargs="+", help="label=workdir[+workdir...]")
  p.add_argument("--metrics", required=True, help="comma-separated metric names, in column order")
  p.add_argument("--strip", default="", help="a prefix left out of the column headers")
  args = p.parse_args(argv)
  print(table(args.rows, args.metrics.split(","), args.strip), end="")
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
