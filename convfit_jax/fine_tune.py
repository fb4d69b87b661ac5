"""`fine_tune_stage1`: ConvFiT Stage 1 on in-memory (context, response) pairs, from Python.

    enc = fine_tune_stage1("sentence-transformers/all-MiniLM-L6-v2", contexts, responses)
    clf = IntentClassifier.from_pretrained(enc).fit(texts, labels)   # then Stage 2

The pairs go through the Stage 1 task and trainer of
`python -m convfit_jax.main --config=configs/stage1.py` (multiple-negatives ranking over
the global batch, gradient cache): they are written as the JSON lines that task reads,
into the run's workdir, so a run with a workdir resumes as a command-line run does.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Sequence

import jax.numpy as jnp

from convfit_jax.atomic_files import write_text
from convfit_jax.encoder import Encoder
from convfit_jax.tokenization import check_nonblank_texts

PAIRS_FILE = "pairs.jsonl"


def fine_tune_stage1(model: str | os.PathLike | Encoder, contexts: Sequence[str],
                     responses: Sequence[str], *, epochs: int = 2, max_steps: int | None = None,
                     batch_size: int = 256, learning_rate: float | None = None, seed: int = 0,
                     max_length: int = 48, dtype: str = "float32",
                     workdir: str | os.PathLike | None = None, progress: bool = True,
                     **train_overrides) -> Encoder:
  """Fine-tunes an encoder so each context ranks its own response first in the batch.

  Args:
    model: a hub-style name or encoder folder (as `Encoder.from_pretrained` takes), or an
      `Encoder` (saved into the workdir first).
    contexts, responses: n pairs (non-empty strings), n >= batch_size.
    epochs, max_steps, batch_size, learning_rate, seed: as `configs/stage1.py`'s train
      fields (batch 256 over every device, AdamW 2e-5, 2 epochs); `**train_overrides`:
      its other `config.train` fields (chunk_size=, grad_cache=, ...).
    max_length, dtype: tokens per text and compute dtype.
    workdir: the run's folder; None: a temporary one, removed after.
  Returns:
    the fine-tuned context encoder (what the run exports as model/).
  """
  contexts = check_nonblank_texts(contexts, "contexts")
  responses = check_nonblank_texts(responses, "responses")
  if len(contexts) != len(responses):
    raise ValueError(f"{len(contexts)} contexts and {len(responses)} responses: give pairs")
  if len(contexts) < batch_size:
    raise ValueError(f"{len(contexts)} pairs for batch_size={batch_size}: give at least a "
                     "batch (or a smaller batch_size; each pair's negatives are the batch's "
                     "other responses)")
  # The training stack loads only when a run starts (`import convfit_jax` stays light).
  from convfit_jax.configs import stage1 as stage1_config  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import stage1, workdir as workdir_lib  # pylint: disable=import-outside-toplevel
  owned = workdir is None
  run_dir = Path(tempfile.mkdtemp(prefix="convfit_stage1_") if owned else workdir).absolute()
  try:
    run_dir.mkdir(parents=True, exist_ok=True)
    init_from = model.save_pretrained(run_dir / "init") if isinstance(model, Encoder) else model
    pairs = run_dir / PAIRS_FILE
    write_text(pairs, "".join(json.dumps({"context": c, "response": r}, ensure_ascii=False) + "\n"
                              for c, r in zip(contexts, responses)))
    config = stage1_config.get_config()
    config.unlock()
    config.workdir, config.seed = str(run_dir), seed
    config.model.init_from, config.model.max_length = str(init_from), max_length
    config.model.dtype = jnp.dtype(dtype).name
    config.data.train, config.data.format = str(pairs), "jsonl"
    t = config.train
    t.epochs, t.batch_size, t.max_steps, t.progress = epochs, batch_size, max_steps or 0, progress
    t.chunk_size = min(t.chunk_size, batch_size)
    if learning_rate is not None:
      t.learning_rate = learning_rate
    for key, value in train_overrides.items():
      if key not in t:
        raise TypeError(f"fine_tune_stage1() got an unexpected keyword {key!r}: not a field "
                        f"of config.train ({', '.join(sorted(t.keys()))})")
      t[key] = value
    config.evals = {}  # the config's test files are the shared data's, not the user's
    with workdir_lib.quiet_terminal():
      stage1.train_and_evaluate(config)
    return Encoder.from_pretrained(run_dir / "model", dtype=jnp.dtype(dtype),
                                   max_length=max_length)
  finally:
    if owned:
      shutil.rmtree(run_dir, ignore_errors=True)
