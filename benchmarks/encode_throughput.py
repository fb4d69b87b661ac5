"""Encoding throughput: convfit_jax against sentence-transformers (PyTorch) and ONNX Runtime.

Run by hand from the repository root, on an idle machine:

  python benchmarks/encode_throughput.py [--models MODEL ...] [--max_length 48] [--repeats 3]
      [--batch_size 32] [--st_batch_size 32] [--dtypes float32 bfloat16] [--onnx_python PATH]
      [--json out.json]

Encodes the banking77 test set (3,080 utterances, the `text` column of
../shared/data/intent/banking77/test.csv, else the vendored copy), for each model
(default: all-MiniLM-L6-v2 and all-mpnet-base-v2, the same weights for all three):

  convfit_jax:           Encoder.from_pretrained(model, max_length=L, dtype=D).encode(texts,
                         batch_size=B) (packed rows, B rows per call), once per --dtypes D
                         (float32; bfloat16: float32 parameters, bfloat16 products
                         accumulated in float32)
  sentence-transformers: SentenceTransformer(folder, device="cpu"), max_seq_length L,
                         .encode(texts, batch_size=ST_B) (sorted by length, padded per batch)
  onnxruntime:           SentenceTransformer(folder, device="cpu", backend="onnx"), the
                         same call: sentence-transformers' ONNX Runtime backend (the model
                         exported by optimum at load), CPUExecutionProvider

Each system runs in its own worker process (its own thread pools: XLA's, PyTorch's
OpenMP, ONNX Runtime's never compete), loads the model and makes one warm-up pass
(its time is reported as the first call: JAX compiles there, ONNX Runtime exports and
builds its session at load), then the timed passes alternate between the systems,
one at a time, so all see the same background load; the median is reported. ONNX
Runtime's pins can clash with the test environment: `--onnx_python` runs its worker
with another interpreter (a venv with `sentence-transformers[onnx]`); by default the
current one. Tokenisation is timed on every side. The max abs difference of each
output from convfit_jax float32's is printed (all three L2-normalise for these
checkpoints), with the lowest cosine to it and, as the accuracy that matters here,
leave-one-out 1-NN intent accuracy on the 3,080 labelled test utterances (each
utterance's label predicted by its nearest other utterance).

Useful GFLOP/s count the FLOPs of the real tokens only (no padding, no cross-sentence
attention): per sentence of n tokens, per layer, 2n(4h^2 + 2hf) for the projections
and feed-forward and 4n^2h for the attention scores and weighted sum. Peak is this
CPU's fp32 FMA peak: cores x FLOPs/cycle (64 with AVX-512, 32 with AVX2 + FMA: two
FMA units) x the clock lscpu reports (else /proc/cpuinfo's).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
import numpy as np

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "intent" / "banking77" / "test.csv"
VENDORED = Path(__file__).resolve().parents[1] / "convfit_jax" / "data" / "vendor" / "banking77" / "test.csv"
SYSTEMS = ("convfit_jax", "sentence-transformers", "onnxruntime")


def load_texts() -> tuple[list[str], list[str], Path]:
  path = SHARED if SHARED.is_file() else VENDORED
  with open(path, newline="", encoding="utf-8") as f:
    rows = list(csv.DictReader(f))
  return [r["text"] for r in rows], [r["label"] for r in rows], path


def leave_one_out_accuracy(x: np.ndarray, labels: list[str]) -> float:
  """1-NN accuracy of each row against all the others (cosine)."""
  x = x / np.linalg.norm(x, axis=1, keepdims=True)
  sims = x @ x.T
  np.fill_diagonal(sims, -np.inf)
  y = np.asarray(labels)
  return float(np.mean(y[sims.argmax(1)] == y))


# ----------------------------------------------------------------------------- worker side


def worker(args: argparse.Namespace) -> None:
  """Loads one system, warms it up, then answers `run` (seconds) and `save` on stdin."""
  import warnings  # pylint: disable=import-outside-toplevel
  warnings.filterwarnings("ignore")
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
  if args.worker == "convfit_jax":
    from convfit_jax import Encoder  # pylint: disable=import-outside-toplevel
    import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
    enc = Encoder.from_pretrained(args.model, max_length=args.max_length,
                                  dtype=jnp.dtype(args.dtype))
    encode = lambda: enc.encode(texts, batch_size=args.batch_size)
    about = f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r}"
  else:
    import torch  # pylint: disable=import-outside-toplevel
    from sentence_transformers import SentenceTransformer  # pylint: disable=import-outside-toplevel
    import sentence_transformers  # pylint: disable=import-outside-toplevel
    kwargs = {"backend": "onnx"} if args.worker == "onnxruntime" else {}
    start = time.perf_counter()
    st = SentenceTransformer(args.folder, device="cpu", **kwargs)
    load = time.perf_counter() - start
    st.max_seq_length = args.max_length
    encode = lambda: st.encode(texts, batch_size=args.st_batch_size, convert_to_numpy=True)
    about = (f"sentence-transformers {sentence_transformers.__version__}, torch {torch.__version__} "
             f"({torch.get_num_threads()} threads), load {load:.1f} s")
    if args.worker == "onnxruntime":
      import onnxruntime  # pylint: disable=import-outside-toplevel
      about += f", onnxruntime {onnxruntime.__version__}"
  start = time.perf_counter()
  out = encode()
  print(f"ready {time.perf_counter() - start} {about}", flush=True)
  for line in sys.stdin:
    if line.strip() == "run":
      start = time.perf_counter()
      out = encode()
      print(time.perf_counter() - start, flush=True)
    elif line.strip() == "save":
      np.save(args.out, np.asarray(out, np.float32))
      print("saved", flush=True)


# ----------------------------------------------------------------------------- driver side


def cpu_peak() -> tuple[float, str]:
  """fp32 FMA peak in GFLOP/s and how it was worked out."""
  lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
  field = lambda name: next((line.split(":", 1)[1].strip() for line in lscpu.splitlines()
                             if line.split(":", 1)[0].strip() == name), None)
  cores = int(field("Core(s) per socket") or os.cpu_count()) * int(field("Socket(s)") or 1)
  cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
  flags = set(re.search(r"^flags\s*:(.*)$", cpuinfo, re.M).group(1).split())
  per_cycle = 64 if "avx512f" in flags else 32 if {"avx2", "fma"} <= flags else 16
  mhz, source = field("CPU max MHz") or field("CPU MHz"), "lscpu"
  if mhz is None:
    mhz, source = re.search(r"^cpu MHz\s*:\s*([\d.]+)", cpuinfo, re.M).group(1), "/proc/cpuinfo"
  ghz = float(mhz) / 1e3
  return cores * per_cycle * ghz, (f"{cores} cores x {per_cycle} FLOPs/cycle "
                                   f"({'AVX-512' if per_cycle == 64 else 'AVX2+FMA'}) x {ghz:.2f} GHz ({source})")


def useful_flops(folder: Path, texts: list[str], max_length: int) -> tuple[float, int]:
  """FLOPs of the real tokens of one pass, and the real token count."""
  from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
  cfg = json.loads((folder / "config.json").read_text())
  layers, h, f = cfg["num_hidden_layers"], cfg["hidden_size"], cfg["intermediate_size"]
  tok = AutoTokenizer.from_pretrained(str(folder))
  n = np.array([len(x) for x in tok(texts, truncation=True, max_length=max_length)["input_ids"]], float)
  return float(layers * np.sum(2 * n * (4 * h * h + 2 * h * f) + 4 * n * n * h)), int(n.sum())


class Worker:
  def __init__(self, system: str, dtype: str, python: str, args, model: str, folder: Path,
               texts_file: str, out: str):
    cmd = [python, __file__, "--worker", system, "--dtype", dtype, "--model", model, "--folder",
           str(folder), "--texts", texts_file, "--max_length", str(args.max_length), "--batch_size",
           str(args.batch_size), "--st_batch_size", str(args.st_batch_size), "--out", out]
    self.system, self.out = system if dtype == "float32" else f"{system} {dtype}", out
    self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = self._read()
    if not line.startswith("ready "):
      raise RuntimeError(f"{system} worker: {line!r}")
    first, self.about = line[len("ready "):].split(" ", 1)
    self.first = float(first)

  def _read(self) -> str:
    line = self.proc.stdout.readline()
    if not line:
      raise RuntimeError(f"{self.system} worker exited with {self.proc.wait()}")
    return line.strip()

  def ask(self, command: str) -> str:
    self.proc.stdin.write(command + "\n")
    self.proc.stdin.flush()
    return self._read()

  def close(self) -> None:
    self.proc.stdin.close()
    self.proc.wait()


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--models", nargs="+", default=["sentence-transformers/all-MiniLM-L6-v2",
                                                  "sentence-transformers/all-mpnet-base-v2"])
  p.add_argument("--max_length", type=int, default=48)
  p.add_argument("--repeats", type=int, default=3, help="timed passes per system (median reported)")
  p.add_argument("--batch_size", type=int, default=32, help="convfit_jax: packed rows per call")
  p.add_argument("--st_batch_size", type=int, default=32,
                 help="sentence-transformers and ONNX Runtime: sentences per batch (their default)")
  p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"],
                 help="convfit_jax compute dtypes (the others run float32)")
  p.add_argument("--onnx_python", default=sys.executable,
                 help="interpreter for the ONNX Runtime worker (needs sentence-transformers[onnx])")
  p.add_argument("--json", help="also write the results here")
  p.add_argument("--worker", choices=SYSTEMS, help=argparse.SUPPRESS)
  p.add_argument("--dtype", default="float32", help=argparse.SUPPRESS)
  p.add_argument("--model", help=argparse.SUPPRESS)
  p.add_argument("--folder", help=argparse.SUPPRESS)
  p.add_argument("--texts", help=argparse.SUPPRESS)
  p.add_argument("--out", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.worker:
    worker(args)
    return
  sys.stdout.reconfigure(line_buffering=True)
  os.environ.setdefault("HF_HUB_OFFLINE", "1")
  from convfit_jax import hf_io  # pylint: disable=import-outside-toplevel

  texts, labels, path = load_texts()
  peak, basis = cpu_peak()
  print(f"data: {path} ({len(texts):,} texts), max length {args.max_length}")
  print(f"machine: {harness.machine()} (at start); {basis} = {peak:.0f} GFLOP/s fp32 peak")
  print(f"convfit_jax {args.batch_size} packed rows per call; sentence-transformers and ONNX Runtime "
        f"{args.st_batch_size} sentences per batch; {args.repeats} timed passes (median)\n")
  results = []
  with tempfile.TemporaryDirectory() as tmp:
    texts_file = os.path.join(tmp, "texts.json")
    Path(texts_file).write_text(json.dumps(texts), encoding="utf-8")
    for model in args.models:
      folder = hf_io.resolve(model)
      flops, tokens = useful_flops(folder, texts, args.max_length)
      workers = []
      runs = [("convfit_jax", d) for d in args.dtypes] + [(s, "float32") for s in SYSTEMS[1:]]
      for system, dtype in runs:
        python = args.onnx_python if system == "onnxruntime" else sys.executable
        workers.append(Worker(system, dtype, python, args, model, folder, texts_file,
                              os.path.join(tmp, f"{system}_{dtype}.npy")))
        print(f"{model}: {system} ready ({workers[-1].about}), first call {workers[-1].first:.1f} s")
      times = {w.system: [] for w in workers}
      for _ in range(args.repeats):
        for w in workers:
          times[w.system].append(float(w.ask("run")))
      outs = {}
      for w in workers:
        w.ask("save")
        outs[w.system] = np.load(w.out)
        w.close()
      reference = workers[0].system
      unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
      for w in workers:
        seconds = statistics.median(times[w.system])
        results.append({
            "model": model, "system": w.system, "sentences_per_s": len(texts) / seconds,
            "seconds": times[w.system], "first_call_s": w.first,
            "max_abs_diff_to_ours": float(np.abs(outs[w.system] - outs[reference]).max()),
            "min_cosine_to_ours": float(np.min(np.sum(unit(outs[w.system]) * unit(outs[reference]), 1))),
            "loo_1nn_accuracy": leave_one_out_accuracy(outs[w.system], labels),
            "useful_gflops": flops / seconds / 1e9, "peak_share": flops / seconds / 1e9 / peak,
            "real_tokens": tokens, "about": w.about})
      print(f"{model}: timed passes (s) " + ", ".join(
          f"{s} {[round(t, 2) for t in v]}" for s, v in times.items()))

  for r in results:
    onnx = next(o for o in results if o["model"] == r["model"] and o["system"] == "onnxruntime")
    r["vs_onnxruntime"] = r["sentences_per_s"] / onnx["sentences_per_s"]
  print(f"\n| model | system | sentences/s | x ONNX Runtime | useful GFLOP/s | share "
        f"of {peak:.0f} GFLOP/s peak | first call | max abs diff / min cosine to convfit_jax "
        f"float32 | leave-one-out 1-NN accuracy |")
  print("|---|---|---|---|---|---|---|---|---|")
  for r in results:
    print(f"| {r['model'].split('/')[-1]} | {r['system']} | {r['sentences_per_s']:,.0f} | "
          f"{r['vs_onnxruntime']:.2f} | {r['useful_gflops']:.0f} | {r['peak_share']:.0%} | "
          f"{r['first_call_s']:.1f} s | {r['max_abs_diff_to_ours']:.1e} / "
          f"{r['min_cosine_to_ours']:.5f} | {r['loo_1nn_accuracy']:.4f} |")
  if args.json:
    Path(args.json).write_text(json.dumps({"peak_gflops": peak, "peak_basis": basis, "args": {
        k: v for k, v in vars(args).items() if v is not None}, "results": results}, indent=1))


if __name__ == "__main__":
  main()
