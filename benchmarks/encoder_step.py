"""Forward and forward+backward of the MiniLM encoder alone: convfit_jax against PyTorch.

    HF_HUB_OFFLINE=1 python benchmarks/encoder_step.py [--rows 64 --length 32]
        [--dtypes float32 bfloat16]

Isolates the model from the training loops: median seconds of 5 calls after a warm-up,
for our jitted SentenceEncoder at each compute dtype (with and without dropout, threefry
and unsafe_rbg keys) and transformers' BertModel in float32 (train mode for dropout), on
the same token ids.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import torch
from flax import nnx
from transformers import AutoModel

from convfit_jax.models import sentence


def median_seconds(fn, repeats: int = 5) -> float:
  fn()
  times = []
  for _ in range(repeats):
    tic = time.perf_counter()
    fn()
    times.append(time.perf_counter() - tic)
  return float(np.median(times))


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--rows", type=int, default=64)
  parser.add_argument("--length", type=int, default=32)
  parser.add_argument("--dtypes", nargs="+", default=["float32"])
  args = parser.parse_args()
  ids = np.random.default_rng(0).integers(1000, 5000, (args.rows, args.length)).astype(np.int32)
  jids, jmask = jnp.asarray(ids), jnp.ones((args.rows, args.length), jnp.int32)
  columns = {}
  for dtype in args.dtypes:
    model, ck = sentence.load("sentence-transformers/all-MiniLM-L6-v2", dtype=jnp.dtype(dtype))
    graphdef, params = nnx.split(model)

    def loss(p, key, graphdef=graphdef):
      return jnp.sum(nnx.merge(graphdef, p)(jids, jmask, dropout_key=key).astype(jnp.float32) ** 2)

    fwd = jax.jit(lambda p, graphdef=graphdef: nnx.merge(graphdef, p)(jids, jmask))
    grad = jax.jit(jax.grad(loss))
    columns[dtype] = {
        "forward": median_seconds(lambda: jax.block_until_ready(fwd(params))),
        "forward+backward, no dropout": median_seconds(
            lambda: jax.block_until_ready(grad(params, None))),
        "forward+backward, dropout (threefry)": median_seconds(
            lambda: jax.block_until_ready(grad(params, jax.random.key(0)))),
        "forward+backward, dropout (unsafe_rbg)": median_seconds(
            lambda: jax.block_until_ready(grad(params, jax.random.key(0, impl="unsafe_rbg")))),
    }
  tm = AutoModel.from_pretrained(str(ck.tokenizer_dir))
  tids, tmask = torch.from_numpy(ids).long(), torch.ones(args.rows, args.length, dtype=torch.long)

  def torch_step(train: bool):
    tm.train(train)
    (tm(input_ids=tids, attention_mask=tmask).last_hidden_state ** 2).sum().backward()

  def torch_forward():
    tm.eval()
    with torch.no_grad():
      tm(input_ids=tids, attention_mask=tmask)

  theirs = {"forward": median_seconds(torch_forward),
            "no dropout": median_seconds(lambda: torch_step(False)),
            "dropout": median_seconds(lambda: torch_step(True))}
  print(f"MiniLM, {args.rows} x {args.length} tokens; jax {jax.__version__} "
        f"({jax.devices()[0].platform}), torch {torch.__version__} ({torch.get_num_threads()} threads)")
  print("| pass | " + " | ".join(f"convfit_jax {d} s" for d in columns) +
        " | PyTorch float32 s |\n|---|" + "---|" * (len(columns) + 1))
  for name in columns[args.dtypes[0]]:
    ref = theirs["forward" if name == "forward" else "no dropout" if "no dropout" in name else "dropout"]
    print(f"| {name} | " + " | ".join(f"{c[name]:.3f}" for c in columns.values()) + f" | {ref:.3f} |")


if __name__ == "__main__":
  main()
