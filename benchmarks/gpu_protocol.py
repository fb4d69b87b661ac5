"""The protocol table (banking77 / hwu64 / clinc150) on one GPU, as a dated record.

Prepared for a session with a GPU (issue 4: "run the protocol table for banking77 /
hwu64 / clinc150 with one prepared script that finishes within 15 minutes, and record
it as a GPU figure with the device named"; issue 12: "run the paper-length protocol
(sparse, 10 epochs) and the dense objective at equal steps on it"). Run from the
repository root:

  python benchmarks/gpu_protocol.py [--budget_s 330] [--out PATH]   # the GPU run
  python benchmarks/gpu_protocol.py --losses ocl,supcon --dense_steps pairs   # issue 12's
  python benchmarks/gpu_protocol.py --smoke                         # ~2 min on a 2-core CPU

What it runs: the cells of `convfit_jax.tasks.protocol` (each a full
`stage2.train_and_evaluate`: k-NN and MLP before, training, k-NN after) with

  datasets banking77, hwu64, clinc150; 10-shot; loss ocl; seeds 0, 1, 2;
  all-MiniLM-L6-v2; the paper's step counts (10 epochs of batch 32 pairs:
  7,580 / 6,300 / 14,770 steps, 28,650 per seed, 85,950 in all); float32
  (parameters and activations; XLA's default matmul precision, i.e. TF32 tensor
  cores on Hopper); full test sets; the MLP baseline row (from the first loss's cells).

With `--dense_steps pairs`, a label-batch objective (supcon, dense_*: 16 intents x 4
utterances, at most the 64 sentences a 32-pair step encodes) trains as many steps as the
pairs cell of the same dataset and seed, so both see the same sentence encodings.

Cells run seed by seed, dataset by dataset, loss by loss, all into one workdir; with
`--budget_s` a cell starts only if its time in the previous seed fits in what is left
(the first seed always runs), and the record names the cells left out. The record is
rewritten after every cell. Each cell's workdir is resumable: rerunning the same
command continues where a killed run stopped and does not retrain finished cells.
Checkpoints are written only at the end of each cell (a lease is too short to resume
from inside a cell, and an orbax save of MiniLM's 270 MB train state every 500 steps
would cost ~1 minute over the grid). JAX's persistent compilation cache is on, so
seeds 1 and 2 reuse seed 0's compiled steps where they pack to the same row count.

Measured on an H200 (docs/gpu/gpu_protocol_2026-12-04_a.md): a MiniLM Stage 2 step (<= 64
sentences packed into 15-28 rows of 48 tokens) takes ~9-11 ms, 89-117 steps/s: far from
FLOP-bound (its ~0.1 TFLOP is well under a millisecond at the H200's rate; the host makes a
batch in ~0.5 ms; the loss is read once per logging window; not profiled further);
the first step compiles for ~26 s; evaluation, the MLP baseline and export add 10-60 s a
cell. One seed of ocl on the three sets (28,650 steps) takes ~8 minutes.
`launch/gpu_checks.sh` gives it the time left in its 10-minute command.

Prints the device (jax.devices()[0].device_kind), wall time, per-cell times and the
table; writes a markdown record (default `$OUT/gpu_protocol_<date>.md` when $OUT is
set, else `workdirs/gpu_protocol_<date>.md`) and results.json beside it.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
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
                 help="tiny CPU check: banking77, 2-shot, 3 steps, 50 test rows, seed 0 unless"
                      " --seeds is given (--losses kept)")
  p.add_argument("--datasets", default="banking77,hwu64,clinc150")
  p.add_argument("--shots", default="10", help="comma-separated; 0 = full data")
  p.add_argument("--seeds", default="", help="comma-separated (default 0,1,2; 0 with --smoke)")
  p.add_argument("--losses", default="ocl")
  p.add_argument("--init_from", default="", help="encoder folder or id (default: all-MiniLM-L6-v2)")
  p.add_argument("--max_steps", type=int, default=0, help="> 0 cuts every run (default: paper's)")
  p.add_argument("--max_test", type=int, default=0, help="> 0: seeded test subset")
  p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
  p.add_argument("--no_mlp", action="store_true", help="skip the MLP baseline row")
  p.add_argument("--dense_steps", default="epochs", choices=("epochs", "pairs"),
                 help="label-batch objectives (supcon, dense_*) train by their own epochs, or "
                      "as many steps as the pairs cell of the same dataset, shots and seed "
                      "(list a pairs loss first)")
  p.add_argument("--budget_s", type=float, default=0.0,
                 help="> 0: start a cell only if it is estimated to finish within this (its "
                      "time in the previous seed)")
  p.add_argument("--workdir", default="", help="default workdirs/gpu_protocol[_smoke]")
  p.add_argument("--out", default="", help="markdown record (default $OUT or workdirs/)")
  p.add_argument("--compile_cache", default="", help="JAX persistent compilation cache folder")
  args = p.parse_args(argv)
  if args.smoke:
    args.datasets, args.shots, args.seeds = "banking77", "2", args.seeds or "0"
    args.max_steps = args.max_steps or 3
    args.max_test = args.max_test or 50
  args.seeds = args.seeds or "0,1,2"
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

  from convfit_jax.configs import common, protocol as protocol_config, stage2 as stage2_config  # pylint: disable=import-outside-toplevel
  from convfit_jax.tasks import protocol  # pylint: disable=import-outside-toplevel
  encoder = args.init_from or common.MINILM

  dev = jax.devices()[0]
  device = f"{dev.device_kind} ({dev.platform}, {jax.device_count()} device(s))"
  print(f"device: {device}; jax {jax.__version__}; python {platform.python_version()}", flush=True)

  datasets, shots, losses = _csv(args.datasets), [int(s) for s in _csv(args.shots)], _csv(args.losses)
  seeds = [int(s) for s in _csv(args.seeds)]
  resumed = workdir.exists() and any(workdir.glob("*_seed*/metrics.json"))
  results, skipped = [], []
  seed_seconds: dict[int, float] = {}  # seeds with at least one cell run -> their seconds

  def write_record(final: bool) -> str:
    wall = time.perf_counter() - wall0
    table = protocol.table(results, datasets, shots, losses, encoder=encoder)
    (workdir / "results.md").write_text(table, encoding="utf-8")
    (workdir / "results.json").write_text(json.dumps(results, indent=1), encoding="utf-8")
    done = sorted({r["seed"] for r in results})
    setting = lambda s: f"{s}-shot" if s else "full"
    steps_note = (f"every run cut to {args.max_steps} steps (schedule follows)" if args.max_steps
                  else "the paper's step counts (10/5/2 epochs for 10-shot/30-shot/full, batch 32 pairs)")
    if args.dense_steps == "pairs":
      steps_note += ("; label-batch objectives (16 intents x 4 utterances a step) train as many"
                     " steps as the pairs cell of the same dataset and seed")
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
        f" × seeds {done}" + (f" (not run, over --budget_s {args.budget_s:.0f}: {'; '.join(skipped)})"
                              if skipped else ""),
        f"- Encoder: {encoder}; compute dtype {args.dtype}"
        + (" (XLA default matmul precision: TF32 on Ampere/Hopper GPUs)" if args.dtype == "float32" else ""),
        f"- Training: {steps_note}; AdamW 2e-5, 10% warm-up, linear decay; max length 48",
        f"- Test sets: {'full' if not args.max_test else f'seeded subsets of {args.max_test} rows'}",
        "- Seconds per seed (all datasets, compile and evaluation included): "
        + (", ".join(f"seed {k} {v:.0f}" for k, v in seed_seconds.items()) or "none finished"),
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
         "wall_seconds": wall, "seed_seconds": seed_seconds, "skipped_cells": skipped,
         "args": vars(args), "results": results}, indent=1), encoding="utf-8")
    return record

  # Every cell's Stage 2 config: configs/protocol.py's, with the script's options.
  template = protocol_config.get_config(f"workdir={workdir},init_from={encoder}").stage2
  template.evals.knn.max_test, template.model.dtype = args.max_test, args.dtype
  template.train.checkpoint_every = 10**9  # each cell checkpoints at its end only (force-saved)
  finished_seconds: dict[tuple, float] = {}   # (dataset, shots, loss) -> the last seed's time
  for seed in seeds:
    tic_seed, ran = time.perf_counter(), False
    for dataset, s, loss in itertools.product(datasets, shots, losses):
      elapsed = time.perf_counter() - wall0
      last = finished_seconds.get((dataset, s, loss))
      if args.budget_s > 0 and last is not None and elapsed + last + 5 > args.budget_s:
        skipped.append(f"{dataset} {s}-shot {loss} seed {seed}")
        print(f"budget: {elapsed:.0f} s spent, this cell took {last:.0f} s in the last seed, "
              f"{args.budget_s:.0f} s allowed: {skipped[-1]} not run", flush=True)
        continue
      t = template.train
      sampler, _ = stage2_config.parse_objective(loss)
      t.max_steps, epochs = args.max_steps, None
      if sampler == "labels" and args.dense_steps == "pairs":
        paired = [r for r in results if r["dataset"] == dataset and r["shots"] == s
                  and r["seed"] == seed and stage2_config.parse_objective(r["loss"])[0] == "pairs"]
        if not paired:
          raise SystemExit(f"--dense_steps=pairs: no pairs cell before {loss} on {dataset}: "
                           "list a pairs loss (ocl, cos, smax, cl) first in --losses")
        # Enough epochs over the utterances that the pairs cell's step count is the cut.
        t.max_steps, epochs = paired[0]["steps"], 10**6
      # The baselines (k-NN and MLP before Stage 2) are the table's from the first loss's cells.
      template.evals.knn.mlp = not args.no_mlp and loss == losses[0]
      tic = time.perf_counter()
      results.append(protocol.run_cell(template, str(workdir), dataset=dataset, shots=s,
                                       loss=loss, seed=seed, epochs=epochs))
      finished_seconds[(dataset, s, loss)] = time.perf_counter() - tic
      ran = True
      print(f"{dataset} {s}-shot {loss} seed {seed}: {finished_seconds[(dataset, s, loss)]:.0f} s",
            flush=True)
      write_record(final=False)  # kept if a later cell is killed
    if ran:  # a seed whose every cell the budget skipped took no time worth recording
      seed_seconds[seed] = time.perf_counter() - tic_seed
  record = write_record(final=True)
  print(record, flush=True)
  print(f"wrote {out} and {out.with_suffix('.json')}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
