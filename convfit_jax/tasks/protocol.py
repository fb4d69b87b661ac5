"""Task `protocol`: the paper's grid of Stage 2 runs, summarised as its Table 2."""

from __future__ import annotations

import itertools
from typing import Any

import ml_collections
import numpy as np

from configs import stage2 as stage2_config
from convfit_jax.train import stage2
from convfit_jax.train.state import Workdir, write_json

# "Before Stage 2" is the `init_from` encoder: off the shelf, or a Stage 1 output (lm+s1).
_BASELINES = (("knn_accuracy_before", "k-NN, encoder before Stage 2"),
              ("mlp_accuracy_before", "MLP on frozen encodings before Stage 2"))


def _split(csv: str) -> list[str]:
  return [x.strip() for x in csv.split(",") if x.strip()]


def run_config(config: ml_collections.ConfigDict, dataset: str, shots: int, loss: str,
               seed: int) -> ml_collections.ConfigDict:
  """The Stage 2 config of one cell of the grid."""
  name = f"{dataset}_{shots or 'full'}shot_{loss}_seed{seed}"
  c = stage2_config.get_config(f"dataset={dataset},shots={shots},loss={loss},seed={seed},"
                               f"init_from={config.init_from}")
  c.workdir = f"{config.workdir}/{name}"
  c.eval.mlp = config.mlp
  c.eval.tsne = False
  c.eval.max_test = config.max_test
  c.eval.extra_pools = tuple(config.extra_pools)
  if config.max_steps:
    c.train.max_steps = config.max_steps
  if config.batch_size:
    c.train.batch_size = config.batch_size
  if config.learning_rate:
    c.train.learning_rate = config.learning_rate
  if config.dtype:
    c.model.dtype = config.dtype
  return c


def _cell(values: list[float]) -> str:
  if not values:
    return "–"
  mean = 100 * np.mean(values)
  if len(values) == 1:
    return f"{mean:.2f}"
  return f"{mean:.2f} ± {100 * np.std(values, ddof=1):.2f}"


def table(results: list[dict[str, Any]], datasets: list[str], shots: list[int],
          losses: list[str], extra_pools=(), encoder: str = "") -> str:
  """Markdown: rows = methods, columns = dataset x setting; accuracy in %, mean ± sd over seeds.

  `encoder`, when given, is named in the footnote as the encoder before Stage 2.
  """
  setting = lambda s: f"{s}-shot" if s else "full"
  cols = [(d, s) for d in datasets for s in shots]
  head = "| method | " + " | ".join(f"{d} {setting(s)}" for d, s in cols) + " |"
  lines = [head, "|" + "---|" * (len(cols) + 1)]

  def row(label, metric, loss=None):
    cells = []
    for d, s in cols:
      # Baselines do not depend on the loss: take them from the first loss's runs.
      lo = loss or losses[0]
      vals = [r[metric] for r in results
              if r["dataset"] == d and r["shots"] == s and r["loss"] == lo and metric in r]
      cells.append(_cell(vals))
    lines.append(f"| {label} | " + " | ".join(cells) + " |")

  for metric, label in _BASELINES:
    if any(metric in r for r in results):
      row(label, metric)
  for loss in losses:
    row(f"ConvFiT Stage 2 ({loss}), k-NN", "knn_accuracy", loss)
    for p in extra_pools:
      row(f"ConvFiT Stage 2 ({loss}), k-NN, pool {f'{p}-shot' if p else 'full'}",
          f"knn_accuracy_pool{p or 'full'}", loss)
  seeds = sorted({r["seed"] for r in results})
  sizes = ", ".join(f"{d} {n}" for d, n in sorted({(r["dataset"], r.get("num_test")) for r in results}))
  lines.append("")
  lines.append(f"k-NN / MLP accuracy (%), mean ± sample sd over seeds {seeds}; test examples: {sizes}.")
  if encoder:
    lines.append(f"Encoder before Stage 2: {encoder}.")
  return "\n".join(lines) + "\n"


def train_and_evaluate(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  datasets, losses = _split(config.datasets), _split(config.losses)
  shots = [int(s) for s in _split(config.shots)]
  seeds = [int(s) for s in _split(config.seeds)]
  if not (datasets and losses and shots and seeds):
    raise ValueError("protocol: datasets, shots, seeds and losses each need at least one value")
  workdir = Workdir(config.workdir)
  workdir.write_config(config)
  results = []
  for dataset, s, loss, seed in itertools.product(datasets, shots, losses, seeds):
    metrics = stage2.train_and_evaluate(run_config(config, dataset, s, loss, seed))
    results.append({"dataset": dataset, "shots": s, "loss": loss, "seed": seed,
                    **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}})
    # Written after every run, so a long protocol shows its progress.
    write_json(workdir.path / "results.json", results)
    markdown = table(results, datasets, shots, losses, config.extra_pools, config.init_from)
    (workdir.path / "results.md").write_text(markdown, encoding="utf-8")
  print(markdown, flush=True)
  workdir.close()
  return results
