"""Task `protocol`: the paper's grid of Stage 2 runs, summarised as its Table 2."""

from __future__ import annotations

import itertools
from typing import Any

import ml_collections
import numpy as np

from convfit_jax.atomic_files import write_json
from convfit_jax.configs import stage2 as stage2_config
from convfit_jax.train import stage2
from convfit_jax.train.workdir import Workdir, summary

# "Before Stage 2" is the `init_from` encoder: off the shelf, or a Stage 1 output (lm+s1).
_BASELINES = (("knn_accuracy_before", "k-NN, encoder before Stage 2"),
              ("mlp_accuracy_before", "MLP on frozen encodings before Stage 2"))


def _cell(values: list[float], scale: float = 100, digits: int = 2) -> str:
  if not values:
    return "–"
  mean = scale * np.mean(values)
  if len(values) == 1:
    return f"{mean:.{digits}f}"
  return f"{mean:.{digits}f} ± {scale * np.std(values, ddof=1):.{digits}f}"


def table(results: list[dict[str, Any]], datasets: list[str], shots: list[int],
          losses: list[str], extra_pools=(), encoder: str = "", intents: list[int] = (0,)) -> str:
  """Markdown: rows = methods, columns = dataset x intents x setting; accuracy in %, mean ±
  sd over seeds.

  `encoder`, when given, is named in the footnote as the encoder before Stage 2.
  """
  setting = lambda s: f"{s}-shot" if s else "full"
  subset = lambda n: f" {n} intents" if n else ""
  cols = [(d, n, s) for d in datasets for n in intents for s in shots]
  head = "| method | " + " | ".join(f"{d}{subset(n)} {setting(s)}" for d, n, s in cols) + " |"
  lines = [head, "|" + "---|" * (len(cols) + 1)]

  def row(label, metric, loss=None, scale=100, digits=2):
    cells = []
    for d, n, s in cols:
      # Baselines do not depend on the loss: take them from the first loss's runs.
      lo = loss or losses[0]
      vals = [r[metric] for r in results
              if (r["dataset"], r.get("intents", 0), r["shots"], r["loss"]) == (d, n, s, lo)
              and metric in r]
      cells.append(_cell(vals, scale, digits))
    lines.append(f"| {label} | " + " | ".join(cells) + " |")

  for metric, label in _BASELINES:
    if any(metric in r for r in results):
      row(label, metric)
  for loss in losses:
    row(f"ConvFiT Stage 2 ({loss}), k-NN", "knn_accuracy", loss)
    for p in extra_pools:
      row(f"ConvFiT Stage 2 ({loss}), k-NN, pool {f'{p}-shot' if p else 'full'}",
          f"knn_accuracy_pool{p or 'full'}", loss)
  for loss in losses:
    row(f"ConvFiT Stage 2 ({loss}), training steps", "steps", loss, scale=1, digits=0)
    row(f"ConvFiT Stage 2 ({loss}), training seconds", "train_seconds", loss, scale=1, digits=0)
  seeds = sorted({r["seed"] for r in results})
  sizes = ", ".join(f"{d}{subset(n)} {t}" for d, n, t in
                    sorted({(r["dataset"], r.get("intents", 0), r.get("num_test")) for r in results}))
  lines.append("")
  lines.append(f"k-NN / MLP accuracy (%), mean ± sample sd over seeds {seeds}; test examples: "
               f"{sizes}. Training seconds: the train loop's wall-clock (the first step's "
               "compile in, checkpoint writes out).")
  if encoder:
    lines.append(f"Encoder before Stage 2: {encoder}.")
  return "\n".join(lines) + "\n"


def run_cell(template: ml_collections.ConfigDict, parent: str, **cell: Any) -> dict[str, Any]:
  """One cell of the grid (`stage2_config.cell`'s keywords: dataset, shots, loss, seed, intents),
  trained and evaluated in its own workdir under `parent` (or read back if finished): its
  keys and numeric metrics."""
  cell.setdefault("intents", 0)  # the cell's own default: every intent of the set
  metrics = stage2.train_and_evaluate(stage2_config.cell(template, parent=parent, **cell))
  return {**{k: cell[k] for k in ("dataset", "shots", "loss", "seed", "intents")},
          **{k: v for k, v in metrics.items() if isinstance(v, (int, float))}}


def run(config: ml_collections.ConfigDict) -> list[dict[str, Any]]:
  """Runs every cell of the grid (each resumable on its own); writes results.json and results.md."""
  datasets, shots, seeds, losses = (list(config.datasets), list(config.shots), list(config.seeds),
                                    list(config.losses))
  intents = list(config.get("intents", (0,)))
  if not (datasets and losses and shots and seeds and intents):
    raise ValueError("protocol: datasets, shots, seeds, losses and intents each need at least "
                     "one value")
  workdir = Workdir(config.workdir)
  try:
    workdir.write_config(config)
    results, markdown = [], ""
    # Seeds outermost: an interrupted grid has every cell of its first seeds.
    for seed, dataset, n, s, loss in itertools.product(seeds, datasets, intents, shots, losses):
      results.append(run_cell(config.stage2, str(config.workdir), dataset=dataset, shots=s,
                              loss=loss, seed=seed, intents=n))
      # Written after every run, so a long protocol shows its progress.
      write_json(workdir.path / "results.json", results, sort_keys=True)
      markdown = table(results, datasets, shots, losses, config.stage2.evals.knn.extra_pools,
                       config.stage2.model.init_from, intents)
      (workdir.path / "results.md").write_text(markdown, encoding="utf-8")
    summary(markdown.rstrip("\n"))
    return results
  finally:
    workdir.close()
