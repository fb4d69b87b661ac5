"""t-SNE figure of sentence encodings coloured by intent (the paper's Figure 3).

Written with matplotlib's Agg backend, so it works on machines without a display.
"""

from __future__ import annotations

import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.manifold import TSNE  # noqa: E402


def pick_intents(labels, num_intents: int = 12) -> np.ndarray:
  """The intents to plot: the most frequent, ties to the lower label id; [num_intents] int.

  Depends on the labels only, so plots of one test set before and after training show
  the same intents.
  """
  ids, counts = np.unique(np.asarray(labels), return_counts=True)
  return np.sort(ids[np.lexsort((ids, -counts))][:num_intents])


def plot_tsne(encodings, labels, path: str, *, title: str, label_names=None,
              num_intents: int = 12, intents=None, seed: int = 0) -> str:
  """Writes a t-SNE scatter plot (PNG) of the encodings of `num_intents` intents.

  Args:
    encodings: [n, d] float.
    labels: [n] int.
    path: the PNG to write; its folder is created.
    title: figure title, e.g. "banking77 test, after Stage 2 (ocl)".
    label_names: names for the legend, indexed by label id.
    intents: the label ids to plot; `pick_intents(labels, num_intents)` by default.
    seed: t-SNE's random_state.
  Returns:
    path.
  """
  encodings, labels = np.asarray(encodings, np.float32), np.asarray(labels)
  intents = pick_intents(labels, num_intents) if intents is None else np.asarray(intents)
  keep = np.isin(labels, intents)
  x, y = encodings[keep], labels[keep]
  # Cosine, the similarity k-NN uses; perplexity must stay below the number of points.
  xy = TSNE(n_components=2, metric="cosine", init="pca", random_state=seed,
            perplexity=min(30.0, len(x) - 1.0)).fit_transform(x)
  fig, ax = plt.subplots(figsize=(8, 6.5), dpi=120)
  cmap = plt.get_cmap("tab20", len(intents))
  for i, c in enumerate(intents):
    sel = y == c
    name = str(int(c)) if label_names is None else str(label_names[int(c)])
    ax.scatter(xy[sel, 0], xy[sel, 1], s=14, color=cmap(i), label=name)
  ax.set_title(title)
  ax.set_xticks([])
  ax.set_yticks([])
  ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
  fig.tight_layout()
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  fig.savefig(path)
  plt.close(fig)
  return path
