"""The byte auto-encoder, Stage 1 and Stage 2 tables of docs/experiments/recursive_conv.md (issue 15), read from
runs' outputs.

    python benchmarks/recursive_conv_results.py --autoencoders ROW=WORKDIR [ROW=WORKDIR ...]
        [--plot docs/byte_autoencoder.png] [--stage1 ROW=WORKDIR ...]
        [--stage2 ROW=WORKDIR+WORKDIR+... ...]

`--autoencoders`: finished `configs/byte_autoencoder.py` runs; the table gives test byte
error overall and by length bucket (metrics.json, eval mode) and the training batches' byte
error of the last logged window (train mode: BatchNorm on batch statistics), the plot draws those bars side by side and
the training batches' byte error (the logged window means, TensorBoard scalars) against the step.
`--stage1`: finished Stage 1 runs: response selection (1 of 100) before and after, steps and
training minutes. `--stage2`: finished Stage 2
runs, one row per '+'-joined set of seeds: k-NN accuracy before and after, mean +- sd.
Figures are percentages of the metrics' fractions.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

import harness
from convfit_jax.evaluators.byte_error import BUCKETS
from convfit_jax.train.workdir import finished_metrics, read_scalars



def autoencoder_table(rows: list[tuple[str, Path]]) -> str:
  present = [(lo, hi) for lo, hi in BUCKETS
             if any(f"byte_error_{lo}_{hi}" in finished_metrics(p) for _, p in rows)]
  head = (["run", "parameters", "steps", "test byte error"] + [f"{lo}-{hi} B" for lo, hi in present]
          + ["sentences exact", "train byte error (last window)"])
  lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
  for name, path in rows:
    m = finished_metrics(path)
    cells = [name, f"{m['num_params']:,}", str(m["steps"]), f"{100 * m['byte_error']:.2f}"]
    cells += [f"{100 * m[f'byte_error_{lo}_{hi}']:.2f}" if f"byte_error_{lo}_{hi}" in m else "-"
              for lo, hi in present]
    cells.append(f"{100 * (1 - m['sentence_error']):.1f}")
    cells.append(f"{100 * read_scalars(path)['train/byte_error'][-1][1]:.2f}")
    lines.append("| " + " | ".join(cells) + " |")
  m = finished_metrics(rows[0][1])
  shares = ", ".join(f"{lo}-{hi} B {100 * m[f'fraction_{lo}_{hi}']:.1f}%" for lo, hi in present
                     if f"fraction_{lo}_{hi}" in m)
  lines.append(f"\n{m['num_test']} test sentences ({m['num_test_too_long']} longer ones left out): {shares}.")
  return "\n".join(lines)


def plot(rows: list[tuple[str, Path]], path: Path) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, (bars, curves) = plt.subplots(1, 2, figsize=(10, 3.6))
  present = [(lo, hi) for lo, hi in BUCKETS if f"byte_error_{lo}_{hi}" in finished_metrics(rows[0][1])]
  width = 0.8 / len(rows)
  for i, (name, workdir) in enumerate(rows):
    m = finished_metrics(workdir)
    bars.bar(np.arange(len(present)) + i * width,
             [100 * m[f"byte_error_{lo}_{hi}"] for lo, hi in present], width, label=name)
    steps, values = zip(*read_scalars(workdir)["train/byte_error"])
    curves.plot(steps, 100 * np.asarray(values), label=name)
  bars.set_xticks(np.arange(len(present)) + width * (len(rows) - 1) / 2,
                  [f"{lo}-{hi}" for lo, hi in present])
  bars.set_xlabel("sentence length (bytes)")
  bars.set_ylabel("test byte error (%)")
  bars.legend(fontsize=8)
  curves.set_xlabel("step")
  curves.set_ylabel("training byte error (%, window mean)")
  curves.legend(fontsize=8)
  fig.tight_layout()
  path.parent.mkdir(parents=True, exist_ok=True)
  fig.savefig(path, dpi=120)
  plt.close(fig)


def stage1_table(rows: list[tuple[str, str]]) -> str:
  keys = ("r_at_1", "r_at_10", "r_at_50")
  head = (["encoder", "steps", "train min"] + [f"{k.replace('r_at_', 'R@')} before -> after" for k in keys]
          + ["MRR before -> after"])
  lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
  for name, path in rows:
    m = finished_metrics(Path(path))
    cells = [name, str(m["steps"]), f"{m['train_seconds'] / 60:.1f}"]
    cells += [f"{100 * m[f'{k}_before']:.2f} -> **{100 * m[k]:.2f}**" for k in keys]
    cells.append(f"{m['mrr_before']:.4f} -> **{m['mrr']:.4f}**")
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def stage2_table(rows: list[tuple[str, str]]) -> str:
  lines = ["| encoder | seeds | k-NN before | k-NN after (mean +- sd) | per seed |",
           "|---|---|---|---|---|"]
  for name, joined in rows:
    ms = [finished_metrics(Path(p)) for p in joined.split("+")]
    before = np.array([m["knn_accuracy_before"] for m in ms]) * 100
    after = np.array([m["knn_accuracy"] for m in ms]) * 100
    sd = lambda x: x.std(ddof=1) if len(x) > 1 else 0.0
    lines.append(f"| {name} | {len(ms)} | {before.mean():.2f} +- {sd(before):.2f} | "
                 f"**{after.mean():.2f} +- {sd(after):.2f}** | "
                 + ", ".join(f"{a:.2f}" for a in after) + " |")
  return "\n".join(lines)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--autoencoders", nargs="*", default=[])
  p.add_argument("--plot", default="")
  p.add_argument("--stage1", nargs="*", default=[])
  p.add_argument("--stage2", nargs="*", default=[])
  args = p.parse_args()
  if args.autoencoders:
    rows = [(n, Path(w)) for n, w in harness.named(args.autoencoders)]
    print(autoencoder_table(rows))
    if args.plot:
      plot(rows, Path(args.plot))
      print(f"\nwrote {args.plot}")
  if args.stage1:
    print(stage1_table(harness.named(args.stage1)))
  if args.stage2:
    print(stage2_table(harness.named(args.stage2)))


if __name__ == "__main__":
  main()
