"""The STS / NLI / response-selection tables of docs/experiments/sts_input_response.md
(issue 14), read from runs' metrics.json.

    python benchmarks/sts_results.py ROW=WORKDIR [ROW=WORKDIR ...] [--fractions F=WORKDIR ...]
        [--plot docs/sts_nli_fraction.png]

Each ROW=WORKDIR names a finished `configs/input_response.py` or `configs/evaluate.py:sts` run
(or several joined by '+', whose metrics make one row: an off-the-shelf encoder's
`evaluate.py:sts` and `evaluate.py:responses` runs); the table shows its figures after
training (and, for trained rows, before in a second table). `--fractions` takes the data-size study's runs (the NLI fraction kept = workdir; 0 =
the conversation-only run) and prints its table; `--plot` draws STS-B dev/test Pearson against the fraction as a PNG.
Figures are percentages of the metrics' fractions.
"""

from __future__ import annotations

import argparse

import harness
from convfit_jax.train.workdir import finished_metrics

COLUMNS = [("STS-B dev r", "stsb_dev_pearson"), ("STS-B test r", "stsb_test_pearson"),
           ("STS-B test rho", "stsb_test_spearman"), ("SICK-R test r", "sickr_test_pearson"),
           ("SICK-R test rho", "sickr_test_spearman"),
           ("adapted STS-B dev r", "stsb_dev_adapted_pearson"),
           ("adapted STS-B test r", "stsb_test_adapted_pearson"),
           ("adapted STS-B test rho", "stsb_test_adapted_spearman"),
           ("SICK-E test acc", "sick_test_accuracy"), ("SNLI test acc", "snli_test_accuracy"),
           ("SGD P@1", "sgd_test_rs100_r_at_1"), ("SGD P@3", "sgd_test_rs100_r_at_3"),
           ("SGD P@10", "sgd_test_rs100_r_at_10"), ("IRC P@1", "ubuntu_irc_test_rs100_r_at_1"),
           ("IRC P@3", "ubuntu_irc_test_rs100_r_at_3"), ("IRC P@10", "ubuntu_irc_test_rs100_r_at_10")]



def _cell(m: dict, key: str) -> str:
  return f"{100 * m[key]:.2f}" if key in m else ""


def table(rows: list[tuple[str, dict]], suffix: str = "") -> str:
  columns = [(title, key + suffix) for title, key in COLUMNS
             if any(key + suffix in m for _, m in rows)]
  extra = [("train min", "train_seconds")] if not suffix else []
  lines = ["| encoder | " + " | ".join(t for t, _ in columns + extra) + " |",
           "|---" * (len(columns) + len(extra) + 1) + "|"]
  for name, m in rows:
    cells = [_cell(m, k) for _, k in columns]
    if extra:
      cells.append(f"{m['train_seconds'] / 60:.1f}" if "train_seconds" in m else "")
    lines.append(f"| {name} | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("rows", nargs="*")
  parser.add_argument("--fractions", nargs="*", default=[])
  parser.add_argument("--plot", default="")
  args = parser.parse_args()
  rows = [(name, finished_metrics(path)) for name, path in harness.named(args.rows)]
  if rows:
    print(table(rows))
    trained = [(name, m) for name, m in rows if "stsb_test_pearson_before" in m]
    if trained:
      print("\nBefore training (the same runs' `_before` figures):\n")
      print(table(trained, "_before"))
  if args.fractions:
    runs = sorted((float(f), finished_metrics(p)) for f, p in harness.named(args.fractions))
    print("\n| NLI pairs kept | STS-B dev r | STS-B test r | adapted STS-B test r | SICK-E test acc | SNLI test acc |")
    print("|---|---|---|---|---|---|")
    for f, m in runs:
      print(f"| {100 * f:g}% ({m.get('num_nli_pairs', 0):,}) | {_cell(m, 'stsb_dev_pearson')} | "
            f"{_cell(m, 'stsb_test_pearson')} | {_cell(m, 'stsb_test_adapted_pearson')} | "
            f"{_cell(m, 'sick_test_accuracy')} | {_cell(m, 'snli_test_accuracy')} |")
    if args.plot:
      import matplotlib  # pylint: disable=import-outside-toplevel
      matplotlib.use("Agg")
      import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
      fig, ax = plt.subplots(figsize=(5, 3.5))
      xs = [100 * f for f, _ in runs]
      for key, label in (("stsb_dev_pearson", "STS-B dev"), ("stsb_test_pearson", "STS-B test")):
        ax.plot(xs, [m[key] for _, m in runs], marker="o", label=label)
      ax.set_xlabel("NLI training pairs kept (%)")
      ax.set_ylabel("Pearson r (cosine)")
      ax.set_title("Multitask DAN: NLI data size")
      ax.legend()
      fig.tight_layout()
      fig.savefig(args.plot, dpi=120)
      print(f"\nplot: {args.plot}")


if __name__ == "__main__":
  main()
