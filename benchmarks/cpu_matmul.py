"""Matmul speed of XLA on this CPU by dtype: why bfloat16 products accumulate in float32.

Run by hand from the repository root (idle machine):

  python benchmarks/cpu_matmul.py [--m 1536] [--k 384] [--n 1536] [--repeats 50]

Times one [m, k] x [k, n] product (MiniLM's feed-forward up-projection for a call of 32
packed rows of 48 tokens) under jax.jit, three ways: float32; bfloat16 inputs with a
bfloat16 result; bfloat16 inputs accumulated into a float32 result
(`preferred_element_type`, what `models/transformer.py` asks for). On CPUs with AMX, XLA
runs only the last on the tile unit. Prints GFLOP/s and XLA_FLAGS (convfit_jax's import
adds its CPU flags, `convfit_jax/cpu_flags.py`).
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp

import convfit_jax  # sets XLA_FLAGS (cpu_flags) before the backend starts


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--m", type=int, default=1536)
  p.add_argument("--k", type=int, default=384)
  p.add_argument("--n", type=int, default=1536)
  p.add_argument("--repeats", type=int, default=50)
  args = p.parse_args()
  print(f"convfit_jax {convfit_jax.__version__}, XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"jax {jax.__version__}, "
        f"[{args.m}, {args.k}] x [{args.k}, {args.n}]")
  cases = [("float32", jnp.float32, None), ("bfloat16 -> bfloat16", jnp.bfloat16, None),
           ("bfloat16 -> float32 accumulate", jnp.bfloat16, jnp.float32)]
  for name, dtype, out in cases:
    a = jax.random.normal(jax.random.PRNGKey(0), (args.m, args.k), dtype)
    b = jax.random.normal(jax.random.PRNGKey(1), (args.k, args.n), dtype)
    f = jax.jit(lambda x, y, out=out: jnp.dot(x, y, preferred_element_type=out))
    f(a, b).block_until_ready()
    start = time.perf_counter()
    for _ in range(args.repeats):
      r = f(a, b)
    r.block_until_ready()
    seconds = (time.perf_counter() - start) / args.repeats
    print(f"{name:32s} {2 * args.m * args.k * args.n / seconds / 1e9:8.0f} GFLOP/s "
          f"({seconds * 1e3:.2f} ms)")


if __name__ == "__main__":
  main()
