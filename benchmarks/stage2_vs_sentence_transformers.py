"""Stage 2 (ocl) with convfit_jax against the same run with sentence-transformers.

Run by hand from the repository root:

  HF_HUB_OFFLINE=1 python benchmarks/stage2_vs_sentence_transformers.py [--steps 758]
      [--block 50] [--max_test 0] [--json out.json] [--model sentence-transformers/all-mpnet-base-v2]

banking77 10-shot, data seed 0, n=3 negatives per side: 3,465 positives + 20,790
negatives = 24,255 pairs, 758 steps of 32 pairs per epoch. Both systems, in one
process, on the CPU:

  ours:   configs/stage2.py defaults (all-MiniLM-L6-v2, or --model -> mean pooling -> Dense(512) +
          tanh, ocl margin 0.5 with sum reduction, AdamW 2e-5, 10% warm-up then
          linear decay, weight decay 0.01 not on biases/LayerNorm, clip 1.0, max
          length 48), the Stage 2 task's step (`trainer.make_train_step` of
          `stage2.Stage2.loss_and_grads`) fed by the task's own batches (prefetch thread,
          packed rows, `sharding.global_batch`); loss and gradient norm read after every
          step (the training loop reads them once per window; a per-step breakdown
          needs the sync, so this is the slower of the two).
  theirs: SentenceTransformer(<the same model's folder>) with its Normalize
          replaced by [Dense(384 -> 512, Tanh), Normalize], the Dense starting from
          *our* initial projection weights, so both start from identical parameters;
          max_seq_length 48; a manual PyTorch loop: `losses.OnlineContrastiveLoss`
          (margin 0.5, its forward: one forward pass per column, dynamic padding),
          torch AdamW (lr 2e-5, betas 0.9/0.999, eps 1e-8) with weight decay 0.01 on
          every parameter whose name contains neither "bias" nor "LayerNorm",
          `transformers.get_linear_schedule_with_warmup(ceil(0.1 N), N)`, grad-norm
          clipping 1.0, dropout on (model.train()).

Both see the same pairs in the same order: the batches come from our
`batching.pair_batches` (epoch-seeded shuffle); sentence-transformers gets each
batch's (u_text, v_text, label) triples in order. The LR schedule's total is
`--steps` for both. The two systems alternate in blocks of `--block` steps, each
keeping its own state, so both see the same background load on a shared machine.

Timed: every training step after the first (the first includes jit compilation),
from asking for the batch to the loss on the host (ours) / to the optimiser and
scheduler step (theirs), tokenisation included for theirs. Evaluation is separate:
1-NN cosine accuracy on the banking77 test set (all 3,080 rows unless --max_test)
with the 10-shot training examples as the pool, before and after training, both
encoders' outputs L2-normalised and scored by the same NumPy 1-NN (ties: lowest
pool index).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

import harness  # noqa: E402


def knn1_accuracy(test_x: np.ndarray, pool_x: np.ndarray, pool_y: np.ndarray,
                  test_y: np.ndarray) -> float:
  """1-NN by cosine (rows already L2-normalised); ties go to the lowest pool index."""
  pred = pool_y[np.argmax(test_x @ pool_x.T, axis=1)]
  return float(np.mean(pred == test_y))



def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=758, help="training steps for both (758 = one epoch)")
  p.add_argument("--block", type=int, default=50, help="steps per alternation block")
  p.add_argument("--max_test", type=int, default=0, help="evaluate on this many test rows (0: all)")
  p.add_argument("--json", default="", help="also write the results here")
  p.add_argument("--model", default="sentence-transformers/all-MiniLM-L6-v2",
                 help="the encoder both start from (a name, e.g. sentence-transformers/all-mpnet-base-v2, "
                      "or a folder)")
  args = p.parse_args(argv)

  import jax
  import torch
  import transformers
  import sentence_transformers as st_lib
  from sentence_transformers import SentenceTransformer, losses as st_losses
  from sentence_transformers.models import Dense, Normalize

  from convfit_jax import hf_io, sharding
  from convfit_jax.configs import stage2 as stage2_config
  from convfit_jax.data import batching, intent
  from convfit_jax.train import loop, optimizer, stage2, trainer, train_state

  warnings.filterwarnings("ignore", category=FutureWarning)
  config = stage2_config.get_config(f"init_from={args.model}")
  t = config.train
  n_steps = args.steps
  t.max_steps = n_steps  # the schedule's total and the packed row count follow it
  loads = [os.getloadavg()]
  print(f"machine: {os.cpu_count()} CPUs ({harness.cpu_name()}), load average {loads[0]}; "
        f"jax {jax.__version__} ({jax.devices()[0].platform}), torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), sentence-transformers {st_lib.__version__}, "
        f"transformers {transformers.__version__}", flush=True)

  # ---------------------------------------------------------------- data, pairs, order
  data = intent.from_config(config.data)
  mesh = sharding.make_mesh(config.mesh.model_parallel)
  task = stage2.Stage2(config, mesh)  # the training run's own pieces: model, pairs, batches, step
  pairs = task.pairs
  per_epoch = batching.steps_per_epoch(len(pairs), t.batch_size)
  print(f"{data.name}: {len(data.train)} training examples, {len(data.test)} test; "
        f"{pairs.num_positive} positive + {pairs.num_negative} negative = {len(pairs)} pairs, "
        f"{per_epoch} steps/epoch; running {n_steps} steps", flush=True)
  test = intent.subsample(data.test, args.max_test, config.seed)
  pool = data.pool
  train_texts = list(data.train.texts)

  # ---------------------------------------------------------------- ours
  model = task.built.model
  init_kernel = np.asarray(model.encoder.projection.dense.kernel[...])  # [384, 512]
  init_bias = np.asarray(model.encoder.projection.dense.bias[...])
  table, rows = task.table, task.rows
  # The per-step order, once: the (u, v, label) triples of each batch, from our batching.
  order = []
  for b in batching.pair_batches(table, pairs, loss=t.loss, rows=rows, batch_size=t.batch_size,
                                 seed=config.data.seed, num_steps=n_steps):
    real = b.weights > 0
    order.append((b.sentence_ids[b.u_idx[real]], b.sentence_ids[b.v_idx[real]],
                  b.targets[real].astype(np.float32)))
  pairs_per_step = np.array([len(o[2]) for o in order])
  print(f"ours: each batch's distinct sentences packed into {rows} rows of {table.width} tokens",
        flush=True)

  state, _ = trainer.init_state(config, model, n_steps, mesh)
  host_batches = task.batches(0)
  to_device = task.device_batch
  step_fn = trainer.make_train_step(task.loss_and_grads, mesh)

  def our_embed(state_, texts):
    return task.encoder(state_.host_model()).encode(
        texts, batch_size=config.evals.knn.batch_size, normalize=True, show_progress=False)

  # ---------------------------------------------------------------- theirs
  torch.manual_seed(config.seed)
  folder = str(hf_io.resolve(config.model.init_from))
  base = SentenceTransformer(folder, device="cpu")
  dense = Dense(init_kernel.shape[0], init_kernel.shape[1], activation_function=torch.nn.Tanh(),
                init_weight=torch.tensor(init_kernel.T.copy()), init_bias=torch.tensor(init_bias.copy()))
  theirs = SentenceTransformer(modules=[base[0], base[1], dense, Normalize()], device="cpu")
  theirs.max_seq_length = config.model.max_length
  their_loss = st_losses.OnlineContrastiveLoss(theirs, margin=t.margin)
  named = list(theirs.named_parameters())
  no_decay = lambda n: "bias" in n or "LayerNorm" in n
  torch_opt = torch.optim.AdamW(
      [{"params": [q for n, q in named if not no_decay(n)], "weight_decay": t.weight_decay},
       {"params": [q for n, q in named if no_decay(n)], "weight_decay": 0.0}],
      lr=t.learning_rate, betas=(0.9, 0.999), eps=1e-8)
  warmup = optimizer.warmup_steps_for(n_steps, t.warmup_fraction)
  scheduler = transformers.get_linear_schedule_with_warmup(torch_opt, warmup, n_steps)
  print(f"theirs: {[type(m).__name__ for m in theirs]}, {sum(q.numel() for q in theirs.parameters()):,} "
        f"parameters ({sum(q.numel() for n, q in named if no_decay(n)):,} without decay); "
        f"ours: {train_state.count_params(state.params):,} parameters; warm-up {warmup} of {n_steps} steps",
        flush=True)

  def their_embed(texts):
    theirs.eval()
    with torch.no_grad():
      return theirs.encode(list(texts), batch_size=config.evals.knn.batch_size, convert_to_numpy=True,
                           normalize_embeddings=True, show_progress_bar=False).astype(np.float32)

  # ---------------------------------------------------------------- before
  results = {"ours": {}, "theirs": {}}

  def evaluate(when: str) -> tuple[np.ndarray, np.ndarray]:
    """1-NN accuracy of both systems now, into results; returns both test encodings."""
    encoded = {}
    for name, embed in (("ours", lambda texts: our_embed(state, texts)), ("theirs", their_embed)):
      tic = time.perf_counter()
      pool_x, test_x = embed(pool.texts), embed(test.texts)
      results[name][f"acc_{when}"] = knn1_accuracy(test_x, pool_x, pool.labels, test.labels)
      results[name][f"eval_seconds_{when}"] = time.perf_counter() - tic
      encoded[name] = test_x
    return encoded["ours"], encoded["theirs"]

  our_test, their_test = evaluate("before")
  init_diff = float(np.abs(our_test - their_test).max())
  print(f"before: ours {results['ours']['acc_before']:.4f}, theirs {results['theirs']['acc_before']:.4f}; "
        f"max |ours - theirs| of the initial test encodings {init_diff:.2e}", flush=True)

  # ---------------------------------------------------------------- training, interleaved
  ours_t = {"next": [], "to_device": [], "dispatch": [], "sync": [], "total": []}
  theirs_t = {"tokenise": [], "forward_loss": [], "backward": [], "optimizer": [], "total": []}
  our_losses, their_losses = [], []
  blocks = []  # (system, first step, steps, seconds, pairs)

  def run_ours(first, last):
    nonlocal state
    for step in range(first, last):
      t0 = time.perf_counter()
      hb = next(host_batches)
      t1 = time.perf_counter()
      db = to_device(hb)
      t2 = time.perf_counter()
      state, out = step_fn(state, db)
      t3 = time.perf_counter()
      loss = float(out["loss"])
      grad_norm = float(out["grad_norm"])
      t4 = time.perf_counter()
      loop.check_finite(loss, step + 1, hb.sentence_ids)
      loop.check_finite(grad_norm, step + 1, hb.sentence_ids, what="gradient norm")
      for k, v in zip(("next", "to_device", "dispatch", "sync", "total"),
                      (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
        ours_t[k].append(v)
      our_losses.append(loss)

  def run_theirs(first, last):
    theirs.train()
    for step in range(first, last):
      u_rows, v_rows, labels = order[step]
      t0 = time.perf_counter()
      fu = theirs.preprocess([train_texts[i] for i in u_rows])
      fv = theirs.preprocess([train_texts[i] for i in v_rows])
      t1 = time.perf_counter()
      loss = their_loss([fu, fv], torch.from_numpy(labels))
      t2 = time.perf_counter()
      loss.backward()
      t3 = time.perf_counter()
      torch.nn.utils.clip_grad_norm_(theirs.parameters(), t.clip_norm)
      torch_opt.step()
      scheduler.step()
      torch_opt.zero_grad()
      t4 = time.perf_counter()
      for k, v in zip(("tokenise", "forward_loss", "backward", "optimizer", "total"),
                      (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
        theirs_t[k].append(v)
      their_losses.append(float(loss.detach()))

  start = 0
  while start < n_steps:
    end = min(start + args.block, n_steps)
    for name, fn, times in (("ours", run_ours, ours_t), ("theirs", run_theirs, theirs_t)):
      n_before = len(times["total"])
      fn(start, end)
      secs = times["total"][n_before:]
      lo = max(start, 1)  # the first step of the run is warm-up, not counted
      counted = secs[lo - start:]
      if counted:
        blocks.append((name, lo, end - lo, float(sum(counted)), int(pairs_per_step[lo:end].sum())))
    loads.append(os.getloadavg())
    o, th = blocks[-2], blocks[-1]
    print(f"steps {start + 1}-{end}: ours {o[4] / max(o[3], 1e-9):.1f} pairs/s "
          f"(loss {np.mean(our_losses[start:end]):.3f}), theirs {th[4] / max(th[3], 1e-9):.1f} "
          f"pairs/s (loss {np.mean(their_losses[start:end]):.3f}); load {loads[-1][0]:.2f}",
          flush=True)
    start = end
  host_batches.close()

  counted_pairs = int(pairs_per_step[1:].sum())
  for name, times, losses_ in (("ours", ours_t, our_losses), ("theirs", theirs_t, their_losses)):
    r = results[name]
    r["first_step_seconds"] = times["total"][0]
    r["train_seconds"] = float(sum(times["total"][1:]))
    r["pairs_per_second"] = counted_pairs / max(r["train_seconds"], 1e-9)
    per_block = [b[4] / b[3] for b in blocks if b[0] == name and b[3] > 0]
    r["pairs_per_second_block_median"] = statistics.median(per_block) if per_block else float("nan")
    r["step_ms_median"] = 1e3 * statistics.median(times["total"][1:]) if n_steps > 1 else float("nan")
    r["breakdown_ms_mean"] = {k: 1e3 * float(np.mean(v[1:])) for k, v in times.items() if len(v) > 1}
    r["loss_first_block"] = float(np.mean(losses_[:args.block]))
    r["loss_last_block"] = float(np.mean(losses_[-args.block:]))

  # ---------------------------------------------------------------- after
  evaluate("after")
  loads.append(os.getloadavg())

  o, th = results["ours"], results["theirs"]
  ratio = o["pairs_per_second"] / th["pairs_per_second"]
  diff = 100 * (o["acc_after"] - th["acc_after"])
  load1 = [l[0] for l in loads]
  print()
  print(f"banking77 10-shot seed 0, ocl, {n_steps} steps x 32 pairs "
        f"({n_steps / per_epoch:.2f} epochs), {len(test)} test rows, pool {len(pool)}; "
        f"1-min load average during the run: min {min(load1):.2f}, mean {np.mean(load1):.2f}, "
        f"max {max(load1):.2f}")
  print("| system | steps | pairs/s (all steps after the 1st) | pairs/s (median of blocks) "
        "| median step ms | first step s | k-NN acc before | k-NN acc after |")
  print("|---|---|---|---|---|---|---|---|")
  for name, r in (("convfit_jax", o), ("sentence-transformers", th)):
    print(f"| {name} | {n_steps} | {r['pairs_per_second']:.1f} | "
          f"{r['pairs_per_second_block_median']:.1f} | {r['step_ms_median']:.0f} | "
          f"{r['first_step_seconds']:.1f} | {100 * r['acc_before']:.2f} | {100 * r['acc_after']:.2f} |")
  print(f"\nours/theirs pairs/s: {ratio:.3f} (median of blocks: "
        f"{o['pairs_per_second_block_median'] / th['pairs_per_second_block_median']:.3f}); "
        f"accuracy after, ours - theirs: {diff:+.2f} points "
        f"(target: ratio >= 1, difference >= -0.5)")
  print(f"ours step breakdown (mean ms): {json.dumps({k: round(v, 2) for k, v in o['breakdown_ms_mean'].items()})}")
  print(f"theirs step breakdown (mean ms): {json.dumps({k: round(v, 2) for k, v in th['breakdown_ms_mean'].items()})}")
  print(f"mean loss first/last block: ours {o['loss_first_block']:.3f}/{o['loss_last_block']:.3f}, "
        f"theirs {th['loss_first_block']:.3f}/{th['loss_last_block']:.3f}")
  out = {"steps": n_steps, "steps_per_epoch": per_epoch, "num_test": len(test),
         "num_pool": len(pool), "pairs": len(pairs), "loadavg": loads, "cpu": harness.cpu_name(),
         "init_test_encoding_max_abs_diff": init_diff, "pairs_per_second_ratio": ratio,
         "accuracy_difference_points": diff, "blocks": blocks, **results}
  if args.json:
    Path(args.json).write_text(json.dumps(out, indent=2, default=float) + "\n")
  return out


if __name__ == "__main__":
  main()
