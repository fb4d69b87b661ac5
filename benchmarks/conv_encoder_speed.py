"""The recursive convolutional sentence encoder on this CPU: size, encode speed, memory,
against all-MiniLM-L6-v2 through the same `encode` path and against a PyTorch
implementation of the same network, in one run.

Run by hand from the repository root (idle machine; nothing else running):

  python benchmarks/conv_encoder_speed.py [--init_from WORKDIR] [--rounds 3] [--threads 2]

Model: the word-level encoder of `configs/conv_encoder.py` (GloVe 50d words, frozen; N = 8
convs per group, 64 positions balanced, 6 recursions), from `--init_from` (a finished
run: trained weights and BatchNorm statistics) or fresh. Texts: banking77's test
utterances (3,080, shipped with the package), each framework encoding all of them per
round, in calls of 256 sentences (the conv encoder; MiniLM packs 32 rows a call, its
fastest setting here), rounds alternating between frameworks so background load falls
on all alike; the best round counts. PyTorch: the same architecture built here on
`torch.nn.Conv1d` / `BatchNorm1d` / `max_pool1d`, weights copied from ours (the
largest difference of the two outputs is printed: a parity check), the same word ids
from our tokenisation, `inference_mode`, `--threads` threads. Memory per sentence: XLA's
temporary buffers for one call of 256 sentences of 64 words (both models unpacked),
divided by 256. Also printed: the byte auto-encoder's parameters at the paper's size.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from convfit_jax import hf_io
from convfit_jax.configs import conv_encoder as ce_config
from convfit_jax.data import intent
from convfit_jax.encoder import Encoder
from convfit_jax.models import byte_autoencoder, conv_encoder
from convfit_jax.models.conv_encoder import ConvSentenceEncoder
from convfit_jax.train.train_state import count_params

GLOVE = Path(ce_config.GLOVE)
CALL = 256


def torch_encoder(torch, model: ConvSentenceEncoder):
  """`model` (balanced padding) as a PyTorch module with its weights, in eval mode."""
  nn = torch.nn
  c = model.config
  if c.padding != "balanced" or c.bow != "none":
    raise ValueError("the PyTorch twin covers balanced padding without BoW")

  def conv(kernel):  # ours [3, in, out] -> torch [out, in, 3]
    layer = nn.Conv1d(kernel.shape[1], kernel.shape[2], 3, padding=1, bias=False)
    layer.weight.data = torch.from_numpy(np.asarray(kernel).transpose(2, 1, 0).copy())
    return layer

  def norm(bn):
    layer = nn.BatchNorm1d(bn.num_features, eps=bn.epsilon)
    for name, var in (("weight", bn.scale), ("bias", bn.bias), ("running_mean", bn.mean),
                      ("running_var", bn.var)):
      getattr(layer, name).data = torch.from_numpy(np.asarray(var[...]).copy())
    return layer

  class Block(nn.Module):
    def __init__(self, block, applications):
      super().__init__()
      self.conv1, self.conv2 = conv(block.conv1.kernel[...]), conv(block.conv2.kernel[...])
      self.norm1 = nn.ModuleList([norm(block.norm1[j]) for j in range(applications)])
      self.norm2 = nn.ModuleList([norm(block.norm2[j]) for j in range(applications)])

    def forward(self, x, j):
      h = torch.relu(self.norm1[j](self.conv1(x)))
      return torch.relu(x + self.norm2[j](self.conv2(h)))

  class Twin(nn.Module):
    def __init__(self):
      super().__init__()
      enc = model.encoder
      self.recursions, self.width = enc.recursions, c.length
      self.embed = torch.from_numpy(np.asarray(model.embed[...]).copy())
      self.prefix = nn.ModuleList([Block(b, 1) for b in enc.prefix.sets[0]])
      self.recursive = nn.ModuleList([Block(b, enc.recursions) for b in enc.recursive.sets[0]])

    def forward(self, ids, mask):
      lengths = mask.sum(1).clamp(min=1)
      power = 2 ** torch.ceil(torch.log2(lengths.float())).long()
      positions = torch.arange(ids.shape[1])[None, :] * (self.width // power)[:, None]
      positions = torch.where(mask > 0, positions, torch.full_like(positions, self.width))
      placed = torch.zeros(ids.shape[0], self.width + 1, dtype=torch.long)
      placed.scatter_(1, positions, torch.where(mask > 0, ids, 0))
      x = self.embed[placed[:, :self.width]].transpose(1, 2)  # [n, d, W]
      for b in self.prefix:
        x = b(x, 0)
      for j in range(self.recursions):
        for b in self.recursive:
          x = b(x, j)
        x = torch.nn.functional.max_pool1d(x, 2)
      return x[:, :, 0]

  return Twin().eval()


def temp_bytes(fn, *args) -> int:
  """XLA's temporary buffer bytes of `fn(*args)` compiled."""
  return int(jax.jit(fn).lower(*args).compile().memory_analysis().temp_size_in_bytes)


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--init_from", default="")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--threads", type=int, default=2)
  args = p.parse_args()
  import torch  # pylint: disable=import-outside-toplevel
  torch.set_num_threads(args.threads)

  texts = list(intent.load("banking77").test.texts)
  if args.init_from:
    built = conv_encoder.load_built(args.init_from)
  else:
    m = ce_config.get_config(f"vectors={GLOVE if GLOVE.is_file() else ''}").model
    built = conv_encoder.build(m, seed=0, train_texts=lambda: texts)
    built.model.eval()
  model = built.model
  ours = conv_encoder.ConvTextEncoder(model, built.tokenizer, max_length=model.config.length)
  twin = torch_encoder(torch, model)
  minilm = Encoder.from_pretrained(hf_io.MINILM)

  def torch_encode(batch_texts):
    out = []
    with torch.inference_mode():
      for s in range(0, len(batch_texts), CALL):
        x = conv_encoder.inputs(built.tokenizer, batch_texts[s:s + CALL], ours.max_length)
        out.append(twin(torch.from_numpy(x["input_ids"]).long(),
                        torch.from_numpy(x["attention_mask"]).long()).numpy())
    return np.concatenate(out)

  runs = {"convfit_jax conv encoder": lambda: ours.encode(texts, batch_size=CALL // 8),
          "PyTorch conv encoder (same network)": lambda: torch_encode(texts),
          "convfit_jax all-MiniLM-L6-v2": lambda: minilm.encode(texts, batch_size=32)}
  outputs = {name: fn() for name, fn in runs.items()}  # warm-up: compiles, caches
  diff = np.abs(outputs["convfit_jax conv encoder"] - outputs["PyTorch conv encoder (same network)"]).max()
  best = {name: float("inf") for name in runs}
  for _ in range(args.rounds):
    for name, fn in runs.items():
      start = time.perf_counter()
      fn()
      best[name] = min(best[name], time.perf_counter() - start)

  ids = jnp.zeros((CALL, 64), jnp.int32).at[:, :20].set(5)
  mask = (ids > 0).astype(jnp.int32)
  graphdef, state = nnx.split(model)
  conv_mem = temp_bytes(lambda s, i, m: nnx.merge(graphdef, s)(i, m), state, ids, mask)
  mgraph, mstate = nnx.split(minilm.model)
  minilm_mem = temp_bytes(lambda s, i, m: nnx.merge(mgraph, s)(i, m), mstate, ids, mask)
  trainable = count_params(nnx.state(model, nnx.Param))
  total = count_params(nnx.state(model))
  paper_ae = byte_autoencoder.ByteAutoencoder(byte_autoencoder.ByteAutoencoder.Config(),
                                              rngs=nnx.Rngs(0))

  print(f"texts: {len(texts)} banking77 test utterances; rounds: {args.rounds}, best counted; "
        f"torch threads: {args.threads}; jax devices: {jax.devices()}")
  print(f"conv encoder: {model.config}")
  print(f"  parameters: {trainable:,} trained (convs, BatchNorm), {total:,} with the frozen "
        f"word vectors and BatchNorm statistics; all-MiniLM-L6-v2: "
        f"{count_params(nnx.state(minilm.model, nnx.Param)):,}")
  print(f"  PyTorch twin max |difference| of the outputs: {diff:.2e}")
  print("| encoder | sentences/s | ratio to the conv encoder |")
  print("|---|---|---|")
  ref = len(texts) / best["convfit_jax conv encoder"]
  for name, seconds in best.items():
    rate = len(texts) / seconds
    print(f"| {name} | {rate:,.0f} | {rate / ref:.2f} |")
  print(f"memory per sentence (XLA temporaries, {CALL} x 64 words): conv encoder "
        f"{conv_mem / CALL / 1024:.1f} KiB, all-MiniLM-L6-v2 {minilm_mem / CALL / 1024:.1f} KiB "
        f"({minilm_mem / conv_mem:.1f}x)")
  print(f"byte auto-encoder at the paper's size (d 256, N 8, 2^K 1024, latent 4 x 256): "
        f"{count_params(nnx.state(paper_ae, nnx.Param)):,} parameters (the paper: 6.67M)")


if __name__ == "__main__":
  main()
