"""The protocol table (banking77 / hwu64 / clinc150) on one GPU, as a dated record.

Prepared for a session with a GPU (issue 4: "run the protocol table for banking77 /
hwu64 / clinc150 with one prepared script that finishes within 15 minutes, and record
it as a GPU figure with the device named"). Run from the repository root:

  python benchmarks/gpu_protocol.py [--budget_s 330] [--out PATH]   # the GPU run
  python benchmarks/gpu_protocol.py --smoke                         # ~2 min on a 2-core CPU

What it runs: `convfit_jax.tasks.protocol.train_and_evaluate` (the paper's grid of
Stage 2 runs, each a full `stage2.train_and_evaluate`: k-NN and MLP before, training,
k-NN after) with

  datasets banking77, hwu64, clinc150; 10-shot; loss ocl; seeds 0, 1, 2;
  all-MiniLM-L6-v2; the paper's step counts (10 epochs of batch 32 pairs:
  7,580 / 6,300 / 14,770 steps, 28,650 per seed, 85,950 in all); float32
  (parameters and activations; XLA's default matmul precision, i.e. TF32 tensor
  cores on Hopper); full test sets; the MLP baseline row.

One `train_and_evaluate` call per seed, all into one workdir, so that with
`--budget_s` the script stops between seeds when the next seed would not fit (the
estimate is the last seed's time + 15 s); the table then covers the seeds that finished
(every dataset), and says so. Each cell's workdir is resumable: rerunning the same
command continues where a killed run stopped and does not retrain finished cells.
Checkpoints are written only at the end of each cell (a lease is too short to resume
from inside a cell, and an orbax save of MiniLM's 270 MB train state every 500 steps
would cost ~1 minute over the grid). JAX's persistent compilation cache is on, so
seeds 1 and 2 reuse seed 0's compiled steps where they pack to the same row count.

Estimate (no GPU measured yet): a MiniLM Stage 2 step at batch 32 pairs (<= 64
sentences packed into ~24 rows of 48 tokens, ~0.1 TFLOP) is launch- and host-bound on an
H200, about 3-6 ms with the loop's per-step loss sync, so 28,650 steps ~ 1.5-3 min per seed,
plus ~20-40 s of compilation (one packed row count per run) and
~5 s of evaluation per cell: ~2-3.5 min per seed, 6-10 min for three seeds.
`launch/gpu_checks.sh` gives it the time left in its 10-minute command.

Prints the device (jax.devices()[0].device_kind), wall time, per-cell times and the
table; writes a markdown record (default `$OUT/gpu_protocol_<date>.md` when $OUT is
set, else `workdirs/gpu_protocol_<date>.md`) and results.json beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--smoke", action="store_true",
                 help="tiny CPU check: banking77, 2-shot, seed 0, 3 steps, 50 test rows")
  p.add_argument("--datasets", default="banking77,hwu64,clinc150")
  p.add_argument("--shots", default="10", help="comma-separated; 0 = full data")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--losses", default="ocl")
  p.add_argument("--init_from", default="", help="encoder folder or id (default: all-MiniLM-L6-v2)")
  p.add_argument("--max_steps", type=int, default=0, help="> 0 cuts every run (default: paper's)")
  p.add_argument("--max_test", type=int, default=0, help="> 0: seeded test subset")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--no_mlp", action="store_true", help="skip the MLP baseline row")
  p.add_argument("--budget_s", type=float, default=0.0,
                 help="> 0: start another seed only if it is estimated to finish within this")
  p.add_argument("--workdir", default="", help="default workdirs/gpu_protocol[_smoke]")
  p.add_argument("--out", default="", help="markdown record (default $OUT or workdirs/)")
  p.add_argument("--compile_cache", default="", help="JAX persistent compilation cache folder")
  args = p.parse_args(argv)
  if args.smoke:
    args.datasets, args.shots, args.seeds, args.losses = "banking77", "2", "0", "ocl"
    args.max_steps = args.max_steps or 3
    args.max_test = args.max_test or 50
  return args


def _csv(s: str) -> list[str]:
  return [x.strip() for x in s.split(",") if x.strip()]


def main(argv=None) -> int:
  args = parse_args(argv)
  wall0 = time.perf_counter()
  date = datetime.date.today().isoformat()
  suffix = "_smoke" if args.smoke else ""
  workdir = Path(args.workdir or REPO / "workdirs" / f"gpu_protocol{suffix}").absolute()
  out_root = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "workdirs"
  out = Path(args.out) if args.out else out_root / f"gpu_protocol{suffix}_{date}.md"
  out.parent.mkdir(parents=True, exist_ok=True)

  import jax  # pylint: disable=import-outside-toplevel
  cache = args.compile_cache or str(workdir / "jax_cache")
  jax.config.update("jax_compilation_cache_dir", cache)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)

  from convfit_jax.configs import common, protocol as protocol_config  # pylint: disable=import-outside-toplevel
  from convfit_jax.tasks import protocol  # pylint: disable=import-outside-toplevel
  encoder = args.init_from or common.MINILM

  dev = jax.devices()[0]
  device = f"{dev.device_kind} ({dev.platform}, {jax.device_count()} device(s))"
  print(f"device: {device}; jax {jax.__version__}; python {platform.python_version()}", flush=True)

  datasets, shots, losses = _csv(args.datasets), [int(s) for s in _csv(args.shots)], _csv(args.losses)
  seeds = [int(s) for s in _csv(args.seeds)]
  resumed = workdir.exists() and any(workdir.glob("*_seed*/metrics.json"))
  results, seed_seconds, skipped = [], [], []

  def write_record(final: bool) -> str:
    wall = time.perf_counter() - wall0
    table = protocol.table(results, datasets, shots, losses, encoder=encoder)
    (workdir / "results.md").write_text(table, encoding="utf-8")
    (workdir / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    done = sorted({r["seed"] for r in results})
    setting = lambda s: f"{s}-shot" if s else "full"
    steps_note = (f"every run cut to {args.max_steps} steps (schedule follows)" if args.max_steps
                  else "the paper's step counts (10/5/2 epochs for 10-shot/30-shot/full, batch 32 pairs)")
    cells = ["| dataset | setting | loss | seed | steps | train s | steps/s | k-NN before | k-NN after | MLP before |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    pct = lambda r, k: f"{100 * r[k]:.2f}" if k in r else "–"
    for r in results:
      steps, secs = r.get("steps", 0), r.get("train_seconds", 0.0)
      rate = f"{steps / secs:.1f}" if secs else "–"
      cells.append(f"| {r['dataset']} | {setting(r['shots'])} | {r['loss']} | {r['seed']} | {steps} | "
                   f"{secs:.1f} | {rate} | {pct(r, 'knn_accuracy_before')} | {pct(r, 'knn_accuracy')} | "
                   f"{pct(r, 'mlp_accuracy_before')} |")
    cmd = "python benchmarks/gpu_protocol.py " + " ".join(sys.argv[1:] if argv is None else argv)
    lines = [
        f"# Protocol table on {dev.device_kind}{' (smoke run)' if args.smoke else ''}, {date}",
        "",
        f"- Device: {device}; jax {jax.__version__}; python {platform.python_version()}",
        f"- Command: `{cmd.strip()}`",
        f"- Wall time: {wall:.0f} s ({wall / 60:.1f} min) for the whole script"
        + ("" if final else " so far (written after each seed; later seeds were still running)")
        + (" — the workdir held finished cells from an earlier run, which were not retrained"
           if resumed else ""),
        f"- Grid: {', '.join(datasets)} × {', '.join(setting(s) for s in shots)} × {', '.join(losses)}"
        f" × seeds {done}" + (f" (seeds {skipped} skipped: over --budget_s {args.budget_s:.0f})"
                              if skipped else ""),
        f"- Encoder: {encoder}; compute dtype {args.dtype}"
        + (" (XLA default matmul precision: TF32 on Ampere/Hopper GPUs)" if args.dtype == "float32" else ""),
        f"- Training: {steps_note}; AdamW 2e-5, 10% warm-up, linear decay; max length 48",
        f"- Test sets: {'full' if not args.max_test else f'seeded subsets of {args.max_test} rows'}",
        "- Seconds per seed (all datasets, compile and evaluation included): "
        + ", ".join(f"{s:.0f}" for s in seed_seconds),
        "",
        "## Table (layout of the paper's Table 2)",
        "",
        table,
        "## Cells",
        "",
        *cells,
        "",
        "train s: the training loop's own time (data wait + steps, the loss read once per"
        " logging window; the first step's compilation falls in it).",
        "",
    ]
    record = "\n".join(lines)
    out.write_text(record, encoding="utf-8")
    out.with_suffix(".json").write_text(json.dumps(
        {"device": device, "device_kind": dev.device_kind, "jax": jax.__version__, "date": date,
         "wall_seconds": wall, "seed_seconds": seed_seconds, "skipped_seeds": skipped,
         "args": vars(args), "results": results}, indent=1), encoding="utf-8")
    return record

  for i, seed in enumerate(seeds):
    elapsed = time.perf_counter() - wall0
    # The last seed's time: seed 0 pays the compilation that later seeds load from the cache.
    if args.budget_s > 0 and seed_seconds and elapsed + seed_seconds[-1] + 15 > args.budget_s:
      skipped = seeds[i:]
      print(f"budget: {elapsed:.0f} s spent, the last seed took {seed_seconds[-1]:.0f} s, "
            f"{args.budget_s:.0f} s allowed: seeds {skipped} not run", flush=True)
      break
    c = protocol_config.get_config(f"workdir={workdir},init_from={encoder}")
    c.datasets, c.shots, c.seeds, c.losses = tuple(datasets), tuple(shots), (seed,), tuple(losses)
    s2 = c.stage2
    s2.train.max_steps, s2.evals.knn.max_test, s2.model.dtype = args.max_steps, args.max_test, args.dtype
    s2.evals.knn.mlp = not args.no_mlp
    s2.train.checkpoint_every = 10**9  # each cell checkpoints at its end only (force-saved)
    tic = time.perf_counter()
    results += protocol.run(c)
    seed_seconds.append(time.perf_counter() - tic)
    print(f"seed {seed}: {seed_seconds[-1]:.0f} s", flush=True)
    write_record(final=False)  # kept if a later seed is killed
  record = write_record(final=True)
  print(record, flush=True)
  print(f"wrote {out} and {out.with_suffix('.json')}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
