"""Stage 1 steps per second and model FLOPs utilisation: RoBERTa-base size, bf16, one device.

Prepared for a session with a GPU (issue 5: "Stage 1 steps per second and model FLOPs
utilisation with a RoBERTa-base-size encoder (random init is fine), bf16, batch 256,
length 64, on one device. Target: at least 40% MFU."). Run from the repository root:

  python benchmarks/gpu_stage1_mfu.py [--variants plain,cache] [--peak_tflops 989] [--out PATH]
  python benchmarks/gpu_stage1_mfu.py --smoke     # tiny config on CPU, a few seconds

Model: `DualEncoder` over one `SentenceEncoder` (shared towers) of RoBERTa-base's
shape (hidden 768, 12 layers, 12 heads, intermediate 3072, vocab 50265, 514 positions,
pad 1), Glorot-uniform random init (no weights on disk), float32 parameters, bfloat16
compute. Step: `trainer.make_train_step` of `stage1.state_loss_and_grads` on a one-device mesh,
the real Stage 1 step (multiple-negatives loss, scale 20, duplicate masking, dropout
on as in training, AdamW with clipping at 1.0). Batch: 256 context/response pairs of
64 random non-padding tokens each (every token real), made once and reused, so the
input pipeline is not timed.

Variants (`--variants`): `plain` (no gradient cache), `cache` (gradient cache,
`--chunk_size` rows per chunk, 32 as configs/stage1.py), `nodropout` (plain, dropout
off: what the dropout masks cost). Each: one compile step (timed apart), `--warmup`
steps, then `--steps` steps timed with one `jax.block_until_ready` at the end.

Model FLOPs per step (fwd + bwd, both towers; N = non-embedding parameters, L layers,
h hidden, s = 64 tokens, n = 2 x 256 sequences, T = n s = 32,768 tokens):

  F_model = 6 N T + 12 L h s^2 n

6 N T: every weight multiplies each token once forward (2 FLOPs) and twice backward
(4); 12 L h s^2 n: attention's QK^T and AV (4 h s^2 per layer and sequence forward,
x3 with backward). Embedding lookups, LayerNorms, softmax, pooling, the [256, 256]
similarity and the optimiser are left out (PaLM's MFU convention). With the gradient
cache the first pass is one more forward (2 N T + 4 L h s^2 n): MFU counts F_model
only, HFU (hardware FLOPs utilisation) counts it too.

MFU = F_model x steps/s / peak. Peak: `--peak_tflops`, else by device_kind: H100/H200
989 TFLOP/s dense bf16 (datasheet), A100 312. On an H200 a plain 8192^3 bf16 matmul
reaches ~790 TFLOP/s (measured in this workplace), printed beside as `--matmul_check`.

Estimate (no GPU measured yet): F_model = 16.95 TFLOP per step; at the 40% target
(396 TFLOP/s) a step is 43 ms, ~23 steps/s, ~6,000 pairs/s. The script's run on an H200:
~10 s start, ~5 s init, and per variant ~30-60 s compilation + ~30 steps of
40-100 ms: ~2-3 minutes for three variants.
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

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense, by device_kind


def parse_args(argv=None) -> argparse.Namespace:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--smoke", action="store_true",
                 help="tiny config on CPU: 2 layers, hidden 64, batch 16, length 16, 2 steps")
  p.add_argument("--batch_size", type=int, default=256)
  p.add_argument("--length", type=int, default=64)
  p.add_argument("--layers", type=int, default=12)
  p.add_argument("--hidden", type=int, default=768)
  p.add_argument("--heads", type=int, default=12)
  p.add_argument("--intermediate", type=int, default=3072)
  p.add_argument("--vocab", type=int, default=50265)
  p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
  p.add_argument("--variants", default="plain,cache", help="plain, cache, nodropout")
  p.add_argument("--chunk_size", type=int, default=32, help="gradient-cache rows per chunk")
  p.add_argument("--remat", action="store_true", help="per-layer rematerialisation")
  p.add_argument("--warmup", type=int, default=3)
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--peak_tflops", type=float, default=0.0,
                 help="peak dense TFLOP/s of the compute dtype (default: by device_kind)")
  p.add_argument("--matmul_check", action=argparse.BooleanOptionalAction, default=None,
                 help="time an 8192^3 matmul as the achievable ceiling (default: on GPU)")
  p.add_argument("--out", default="", help="JSON record (default $OUT or workdirs/)")
  p.add_argument("--compile_cache", default="", help="JAX persistent compilation cache folder")
  args = p.parse_args(argv)
  if args.smoke:
    args.layers, args.hidden, args.heads, args.intermediate, args.vocab = 2, 64, 4, 256, 1000
    args.batch_size, args.length, args.chunk_size = 16, 16, 8
    args.warmup, args.steps = 1, 2
  return args


def model_flops(n_nonemb: int, layers: int, hidden: int, length: int, sequences: int) -> dict:
  tokens = sequences * length
  fwd = 2 * n_nonemb * tokens + 4 * layers * hidden * length**2 * sequences
  return {"model": 3 * fwd, "grad_cache_extra_forward": fwd,
          "dense_6NT": 6 * n_nonemb * tokens, "attention": 12 * layers * hidden * length**2 * sequences}


def default_peak(device_kind: str) -> float:
  for name, peak in PEAK_BF16_TFLOPS.items():
    if name in device_kind.upper():
      return peak
  return 0.0


def matmul_tflops(dtype, n: int = 8192, reps: int = 10) -> float:
  import jax  # pylint: disable=import-outside-toplevel
  a = jax.random.normal(jax.random.PRNGKey(0), (n, n), dtype)
  b = jax.random.normal(jax.random.PRNGKey(1), (n, n), dtype)
  f = jax.jit(lambda x, y: x @ y)
  for _ in range(3):
    jax.block_until_ready(f(a, b))
  tic = time.perf_counter()
  for _ in range(reps):
    c = f(a, b)
  jax.block_until_ready(c)
  return 2 * n**3 * reps / (time.perf_counter() - tic) / 1e12


def main(argv=None) -> int:
  args = parse_args(argv)
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel

  if args.compile_cache:
    jax.config.update("jax_compilation_cache_dir", args.compile_cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  from convfit_jax import sharding  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import batching  # pylint: disable=import-outside-toplevel
  from convfit_jax.models.sentence import SentenceEncoder  # pylint: disable=import-outside-toplevel
  from convfit_jax.models.transformer import TransformerConfig  # pylint: disable=import-outside-toplevel
  from convfit_jax.models.dual_encoder import DualEncoder  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import optimizer, stage1, trainer, train_state  # pylint: disable=import-outside-toplevel

  dev = jax.devices()[0]
  peak = args.peak_tflops or default_peak(dev.device_kind)
  print(f"device: {dev.device_kind} ({dev.platform}); jax {jax.__version__}; "
        f"peak {peak or 'unknown'} TFLOP/s", flush=True)

  cfg = TransformerConfig(model_type="roberta", vocab_size=args.vocab, hidden_size=args.hidden,
                          num_hidden_layers=args.layers, num_attention_heads=args.heads,
                          intermediate_size=args.intermediate, max_position_embeddings=args.length + 2
                          if args.smoke else 514, type_vocab_size=1, layer_norm_eps=1e-5,
                          pad_token_id=1)
  dtype = jnp.dtype(args.dtype)
  mesh = sharding.make_mesh(devices=[dev])
  encoder = SentenceEncoder(cfg, rngs=nnx.Rngs(0), dtype=dtype, init="xavier", remat=args.remat)
  model = DualEncoder(encoder)
  params = nnx.state(model, nnx.Param)
  n_total = train_state.count_params(params)
  n_emb = sum(int(np.prod(v.shape)) for path, v in nnx.to_flat_state(params)
              if "embeddings" in map(str, path))
  n_nonemb = n_total - n_emb
  b, s = args.batch_size, args.length
  flops = model_flops(n_nonemb, args.layers, args.hidden, s, 2 * b)
  print(f"params: {n_total / 1e6:.2f} M ({n_nonemb / 1e6:.2f} M non-embedding); batch {b} pairs x "
        f"{s} tokens; model FLOPs/step {flops['model'] / 1e9:.1f} G "
        f"(6NT {flops['dense_6NT'] / 1e9:.1f} G + attention {flops['attention'] / 1e9:.1f} G)",
        flush=True)

  tx, _ = optimizer.make_optimizer(learning_rate=2e-5, total_steps=10_000, clip_norm=1.0)
  state = train_state.TrainState.create(model, tx, seed=0)
  state = train_state.place(state, sharding.param_shardings(state, mesh))
  del model, encoder, params
  rng = np.random.default_rng(0)
  ids = lambda: rng.integers(3, args.vocab, size=(b, s), dtype=np.int32)
  # Full-length sentences: packing leaves one per row, the FLOP count stays exact.
  host = batching.ConversationBatch(ids(), np.ones((b, s), np.int32), ids(),
                                    np.ones((b, s), np.int32), np.ones((b,), np.float32))

  ceiling = None
  if args.matmul_check or (args.matmul_check is None and dev.platform == "gpu"):
    ceiling = matmul_tflops(dtype)
    print(f"8192^3 {args.dtype} matmul: {ceiling:.0f} TFLOP/s", flush=True)

  variants = {
      "plain": stage1.LossConfig(dropout=True, grad_cache=False),
      "cache": stage1.LossConfig(dropout=True, grad_cache=True, chunk_size=args.chunk_size),
      "nodropout": stage1.LossConfig(dropout=False, grad_cache=False),
  }
  rows = []
  for name in [v.strip() for v in args.variants.split(",") if v.strip()]:
    loss_cfg = variants[name]
    step_fn = trainer.make_train_step(lambda st, b, c=loss_cfg: stage1.state_loss_and_grads(st, b, c), mesh)
    batch = stage1.device_batch(host, mesh, loss_cfg)
    tic = time.perf_counter()
    state, out = step_fn(state, batch)
    jax.block_until_ready(out)
    first = time.perf_counter() - tic
    for _ in range(args.warmup):
      state, out = step_fn(state, batch)
    jax.block_until_ready((state, out))
    tic = time.perf_counter()
    for _ in range(args.steps):
      state, out = step_fn(state, batch)
    jax.block_until_ready((state, out))
    secs = (time.perf_counter() - tic) / args.steps
    hw = flops["model"] + (flops["grad_cache_extra_forward"] if loss_cfg.grad_cache else 0)
    row = {"variant": name, "grad_cache": loss_cfg.grad_cache, "dropout": loss_cfg.dropout,
           "chunk_size": loss_cfg.chunk_size, "first_step_s": first, "step_ms": 1e3 * secs,
           "steps_per_s": 1 / secs, "pairs_per_s": b / secs,
           "model_tflops_per_s": flops["model"] / secs / 1e12,
           "hardware_tflops_per_s": hw / secs / 1e12,
           "mfu": flops["model"] / secs / 1e12 / peak if peak else None,
           "hfu": hw / secs / 1e12 / peak if peak else None,
           "loss": float(out["loss"])}
    rows.append(row)
    pct = lambda x: f"{100 * x:.1f}%" if x is not None else "n/a"
    print(f"{name:>9}: first step {first:.1f} s; {row['step_ms']:.1f} ms/step, "
          f"{row['steps_per_s']:.2f} steps/s, {row['pairs_per_s']:.0f} pairs/s, "
          f"{row['model_tflops_per_s']:.3g} model TFLOP/s, MFU {pct(row['mfu'])}, "
          f"HFU {pct(row['hfu'])}, loss {row['loss']:.3f}", flush=True)

  mem = None
  try:
    stats = dev.memory_stats() or {}
    mem = stats.get("peak_bytes_in_use")
  except Exception:  # pylint: disable=broad-except
    pass
  if mem:
    print(f"peak device memory: {mem / 2**30:.1f} GiB", flush=True)
  record = {"date": datetime.date.today().isoformat(), "device_kind": dev.device_kind,
            "platform": dev.platform, "jax": jax.__version__, "python": platform.python_version(),
            "args": vars(args), "params": n_total, "params_non_embedding": n_nonemb,
            "flops_per_step": flops, "peak_tflops": peak or None, "matmul_tflops": ceiling,
            "peak_bytes_in_use": mem, "results": rows,
            "formula": "F_model = 6*N*T + 12*L*h*s^2*n (N non-embedding params, T = n*s tokens, "
                       "n = 2*batch sequences); grad cache adds 2*N*T + 4*L*h*s^2*n (HFU only)"}
  suffix = "_smoke" if args.smoke else ""
  out_root = Path(os.environ["OUT"]) if os.environ.get("OUT") else REPO / "workdirs"
  path = Path(args.out) if args.out else out_root / f"gpu_stage1_mfu{suffix}_{record['date']}.json"
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_text(json.dumps(record, indent=1), encoding="utf-8")
  print(f"wrote {path}", flush=True)
  return 0


if __name__ == "__main__":
  sys.exit(main())
