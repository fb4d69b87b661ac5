"""Rerankers against PyTorch on this CPU, same inputs, same run: training pairs/s and
reranking candidates/s, as a ratio.

Run by hand from the repository root (idle machine; nothing else running):

  python benchmarks/rerank_vs_pytorch.py [--models esim+cross+bilstm] [--steps 10] [--score 500]
      [--dtype float32|bfloat16]   (our compute dtype; PyTorch's is float32)

Training batches are ubuntu_irc training pairs, reranking scores the candidates of its 1-of-10
test cases (each history with its 10 candidates; ../shared/data, random words where it is
absent), tokenised once by our pipeline; both frameworks get the same arrays.
- ESIM: ours (`models.esim`, the trainer's jitted step, `train.rerank.PairScorer`) against
  a PyTorch ESIM built here on `torch.nn.LSTM` with packed sequences, the same
  architecture and sizes (hidden 300, 50-d words, batch 16 as `configs/rerank_esim.py`),
  Adam in both. Reranking three ways: both frameworks with each pair carrying its own
  context, both with each distinct context of a chunk encoded once
  (`PairInputs.shared_contexts`, what `PairScorer` does), and ours that way against
  PyTorch's pairs.
- Cross-encoder: ours (`models.cross_encoder`, all-MiniLM-L6-v2, batch 32, pairs of at
  most 128 tokens as `configs/rerank_cross.py`) against transformers'
  BertForSequenceClassification with the same weights (AdamW); reranking also against
  sentence-transformers' `CrossEncoder.predict` end to end (its own tokenisation, same
  pairs, same batch).
- BiLSTM: ESIM's recurrence alone, a full batch with no padding, against torch.nn.LSTM.
After a warm-up pass over every batch (our compiles, one per padded shape), training
steps alternate between the frameworks, so background load falls on both alike;
reranking scores `--score` pairs per framework, after a warm-up pass of its own.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import harness
import numpy as np

UBUNTU = Path("../shared/data/conversations/ubuntu_irc")


def _random_text(rng: np.random.Generator, low: int, high: int) -> str:
  return " ".join(f"w{i}" for i in rng.integers(0, 2000, int(rng.integers(low, high))))


def _pairs(n: int, seed: int = 0) -> tuple[list[str], list[str], np.ndarray]:
  """n (history, response, label) rows of ubuntu_irc train, or random words without it."""
  rng = np.random.default_rng(seed)
  if (UBUNTU / "train.tsv").is_file():
    from convfit_jax.data.conversations import read_labelled_pairs  # pylint: disable=import-outside-toplevel
    p = read_labelled_pairs(UBUNTU / "train.tsv")
    idx = rng.choice(len(p), n, replace=False)
    return [p.histories[i] for i in idx], [p.responses[i] for i in idx], p.labels[idx]
  return ([_random_text(rng, 20, 200) for _ in range(n)], [_random_text(rng, 3, 30) for _ in range(n)],
          rng.integers(0, 2, n).astype(np.int32))


def _case_pairs(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
  """The (history, candidate) pairs of the first n // 10 cases of ubuntu_irc test_rs10, or
  of random 1-of-10 cases without it."""
  from convfit_jax.data.conversations import EOU, read_response_selection  # pylint: disable=import-outside-toplevel
  if (UBUNTU / "test_rs10.jsonl").is_file():
    cases = read_response_selection(UBUNTU / "test_rs10.jsonl")
    histories, candidates = cases.histories[:n // 10], cases.candidates[:n // 10]
  else:
    rng = np.random.default_rng(seed)
    histories = [[_random_text(rng, 20, 200)] for _ in range(n // 10)]
    candidates = [[_random_text(rng, 3, 30) for _ in range(10)] for _ in histories]
  return ([EOU.join(h) for h, cands in zip(histories, candidates) for _ in cands],
          [c for cands in candidates for c in cands])


def _torch_esim(torch, config, embeddings):
  """ESIM in PyTorch: the architecture of `models.esim`, on torch.nn.LSTM."""
  nn = torch.nn

  class BiLSTM(nn.Module):
    def __init__(self, d_in, hidden):
      super().__init__()
      self.lstm = nn.LSTM(d_in, hidden, batch_first=True, bidirectional=True)

    def forward(self, x, lengths):
      packed = nn.utils.rnn.pack_padded_sequence(x, lengths.cpu(), batch_first=True,
                                                 enforce_sorted=False)
      out, _ = self.lstm(packed)
      return nn.utils.rnn.pad_packed_sequence(out, batch_first=True, total_length=x.shape[1])[0]

  class Esim(nn.Module):
    def __init__(self):
      super().__init__()
      h = config.hidden
      self.embeddings = nn.Embedding.from_pretrained(torch.tensor(embeddings), freeze=False)
      self.encoder, self.composition = BiLSTM(config.embed_dim, h), BiLSTM(h, h)
      self.projection, self.hidden, self.out = nn.Linear(8 * h, h), nn.Linear(8 * h, h), nn.Linear(h, 2)

    def forward(self, context_ids, context_lengths, response_ids, response_lengths,
                context_index=None):
      a = self.encoder(self.embeddings(context_ids), context_lengths)
      if context_index is not None:  # one row per distinct context, as `models.esim`
        a, context_lengths = a[context_index], context_lengths[context_index]
      c_mask = torch.arange(context_ids.shape[1])[None] < context_lengths[:, None]
      r_mask = torch.arange(response_ids.shape[1])[None] < response_lengths[:, None]
      b = self.encoder(self.embeddings(response_ids), response_lengths)
      e = a @ b.transpose(1, 2)
      a_t = torch.softmax(e.masked_fill(~r_mask[:, None, :], -1e9), dim=2) @ b
      b_t = torch.softmax(e.masked_fill(~c_mask[:, :, None], -1e9), dim=1).transpose(1, 2) @ a
      match = lambda x, t: torch.relu(self.projection(torch.cat([x, t, x - t, x * t], -1)))
      va = self.composition(match(a, a_t), context_lengths)
      vb = self.composition(match(b, b_t), response_lengths)

      def pool(v, mask):
        m = mask[:, :, None]
        mean = (v * m).sum(1) / m.sum(1).clamp(min=1)
        return torch.cat([mean, v.masked_fill(~m, float("-inf")).max(1).values], -1)

      v = torch.cat([pool(va, c_mask), pool(vb, r_mask)], -1)
      return self.out(torch.tanh(self.hidden(v)))

  return Esim()


def _timed(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def _torch_score(model, inputs, histories, responses, batch_size, forward) -> None:
  """The PyTorch reference scoring every pair in eval mode, in `PairScorer`'s order and
  batches: `forward(histories, responses)` runs the model on one batch."""
  import torch  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import rerank  # pylint: disable=import-outside-toplevel
  model.eval()
  order = rerank.scoring_order(inputs, histories, responses)
  with torch.no_grad():
    for start in range(0, len(histories), batch_size):
      idx = order[start:start + batch_size]
      forward([histories[i] for i in idx], [responses[i] for i in idx])
  model.train()


def _compare(name: str, ours_step, torch_step, batches, steps: int, scorings, score_pairs):
  """Alternating training steps, then reranking (`scorings`: (label, ours, theirs) runs over
  `score_pairs` pairs, each run once to warm up and compile); prints one table row per
  measurement."""
  for b in batches:  # warm-up: every padded shape compiled (ours), allocator warm (torch)
    ours_step(b)
    torch_step(b)
  t_ours, t_torch = [], []
  for i in range(steps):
    b = batches[i % len(batches)]
    t_ours.append(_timed(lambda: ours_step(b)))
    t_torch.append(_timed(lambda: torch_step(b)))
  pairs = len(batches[0]["labels"])
  rows = [(f"{name}: training pairs/s (median step)", pairs / np.median(t_ours),
           pairs / np.median(t_torch))]
  for label, ours, theirs in scorings:
    ours(), theirs()
    rows.append((f"{name}: reranking candidates/s, {label}", score_pairs / _timed(ours),
                 score_pairs / _timed(theirs)))
  for label, ours, theirs in rows:
    print(f"| {label} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f} |")


def _ours(config, module, built, histories, responses, labels, *, batch_size: int, steps: int):
  """Our side: the model's pair inputs, `steps` batches of them, and a training step (the
  trainer's jitted step on the rerank loss) whose state lives in the returned box."""
  import jax  # pylint: disable=import-outside-toplevel
  from convfit_jax import sharding  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import rerank, trainer  # pylint: disable=import-outside-toplevel
  inputs = module.pair_inputs(built, config.model)
  batches = []
  for i in range(steps):
    sl = slice(batch_size * i, batch_size * (i + 1))
    batches.append({**inputs(histories[sl], responses[sl]), "labels": labels[sl]})
  mesh = sharding.make_mesh(1)
  state, _ = trainer.init_state(config, built.model, 1000, mesh)
  step_fn = trainer.make_train_step(lambda s, b: trainer.value_and_grad(rerank.loss_fn, s, b), mesh)
  box = {"state": state}

  def ours_step(b):
    box["state"], out = step_fn(box["state"], {k: jax.numpy.asarray(v) for k, v in b.items()})
    jax.block_until_ready(out["loss"])

  return inputs, batches, ours_step, box


def bench_esim(torch, steps: int, score: int, dtype: str = "float32"):
  from convfit_jax.configs import rerank_esim  # pylint: disable=import-outside-toplevel
  from convfit_jax.models import PairInputs, esim  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import rerank  # pylint: disable=import-outside-toplevel
  config = rerank_esim.get_config()
  score_batch = config.evals.test_rs10.batch_size  # pairs per call, as the configs score
  config.model.vectors = ""  # speed does not depend on the initial vectors
  config.model.dtype = dtype
  histories, responses, labels = _pairs(16 * steps)
  sh, sr = _case_pairs(score)
  built = esim.build(config.model, seed=0, train_texts=lambda: histories + responses + sh + sr)
  inputs, batches, ours_step, box = _ours(config, esim, built, histories, responses, labels,
                                          batch_size=16, steps=steps)

  model = _torch_esim(torch, built.model.config, np.asarray(built.model.embeddings[...]))
  opt = torch.optim.Adam(model.parameters(), lr=2e-4)
  tensors = lambda b: {k: torch.tensor(v, dtype=torch.long) for k, v in b.items() if k != "labels"}

  def torch_step(b):
    loss = torch.nn.functional.cross_entropy(model(**tensors(b)), torch.tensor(b["labels"]).long())
    opt.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
    opt.step()

  host_model = box["state"].host_model()
  shared = rerank.PairScorer(host_model, inputs)
  own = rerank.PairScorer(host_model, PairInputs(inputs.encode, lengths=inputs.lengths))

  score = lambda encode: _torch_score(model, inputs, sh, sr, score_batch,
                                      lambda h, r: model(**tensors(encode(h, r))))
  ours_own = lambda: own.margins(sh, sr, batch_size=score_batch)
  ours_shared = lambda: shared.margins(sh, sr, batch_size=score_batch)
  torch_own, torch_shared = lambda: score(inputs.encode), lambda: score(inputs.shared_contexts)
  _compare(f"ESIM (ours in {dtype})", ours_step, torch_step, batches, steps, [
      ("each pair with its own context, vs PyTorch ESIM the same", ours_own, torch_own),
      ("each distinct context encoded once, vs PyTorch ESIM the same", ours_shared, torch_shared),
      ("each distinct context encoded once, vs PyTorch ESIM each pair with its own", ours_shared,
       torch_own)], len(sh))


def bench_cross(torch, steps: int, score: int, dtype: str = "float32"):
  from sentence_transformers import CrossEncoder as StCrossEncoder  # pylint: disable=import-outside-toplevel
  from transformers import BertForSequenceClassification  # pylint: disable=import-outside-toplevel
  from convfit_jax import hf_io  # pylint: disable=import-outside-toplevel
  from convfit_jax.configs import rerank_cross  # pylint: disable=import-outside-toplevel
  from convfit_jax.models import cross_encoder  # pylint: disable=import-outside-toplevel
  from convfit_jax.train import rerank  # pylint: disable=import-outside-toplevel
  config = rerank_cross.get_config()
  score_batch = config.evals.test_rs10.batch_size  # pairs per call, as the configs score
  config.model.dtype = dtype
  histories, responses, labels = _pairs(32 * steps)
  sh, sr = _case_pairs(score)
  built = cross_encoder.build(config.model, seed=0, train_texts=lambda: ())
  inputs, batches, ours_step, box = _ours(config, cross_encoder, built, histories, responses,
                                          labels, batch_size=32, steps=steps)

  folder = str(hf_io.resolve(config.model.init_from))
  model = BertForSequenceClassification.from_pretrained(folder, num_labels=2)
  opt = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)

  def torch_step(b):
    out = model(input_ids=torch.tensor(b["ids"]).long(), attention_mask=torch.tensor(b["mask"]).long(),
                token_type_ids=torch.tensor(b["type_ids"]).long(), labels=torch.tensor(b["labels"]).long())
    opt.zero_grad()
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()

  scorer = rerank.PairScorer(box["state"].host_model(), inputs)
  st = StCrossEncoder(folder, num_labels=2, max_length=config.model.max_length, device="cpu")

  def forward(histories, responses):
    b = inputs(histories, responses)
    model(input_ids=torch.tensor(b["ids"]).long(), attention_mask=torch.tensor(b["mask"]).long(),
          token_type_ids=torch.tensor(b["type_ids"]).long())

  torch_score = lambda: _torch_score(model, inputs, sh, sr, score_batch, forward)

  ours_score = lambda: scorer.margins(sh, sr, batch_size=score_batch)
  _compare(f"cross-encoder (MiniLM, ours in {dtype})", ours_step, torch_step, batches, steps, [
      ("vs BertForSequenceClassification, same inputs", ours_score, torch_score),
      ("vs sentence-transformers CrossEncoder.predict", ours_score,
       lambda: st.predict(list(zip(sh, sr)), batch_size=score_batch))], len(sh))


def bench_bilstm(torch, steps: int, score: int, dtype: str = "float32"):
  """ESIM's recurrence alone: one BiLSTM forward over a full [64, 192, 300] batch (no
  padding for either side to skip), ours (`models.lstm`) against `torch.nn.LSTM`."""
  del score  # the batch is fixed
  import jax  # pylint: disable=import-outside-toplevel
  from flax import nnx  # pylint: disable=import-outside-toplevel
  from convfit_jax.models.lstm import BiLSTM  # pylint: disable=import-outside-toplevel
  batch, time_steps, width = 64, 192, 300
  graphdef, state = nnx.split(BiLSTM(width, width, rngs=nnx.Rngs(0), dtype=dtype))
  forward = jax.jit(lambda st, x, n: nnx.merge(graphdef, st)(x, n))
  x = np.random.default_rng(0).standard_normal((batch, time_steps, width)).astype(np.float32)
  lengths = np.full(batch, time_steps, np.int32)
  theirs = torch.nn.LSTM(width, width, batch_first=True, bidirectional=True)
  x_torch = torch.tensor(x)
  ours_run = lambda: jax.block_until_ready(forward(state, x, lengths))

  def torch_run():
    with torch.no_grad():
      theirs(x_torch)

  ours_run(), torch_run()  # compile, warm the allocator
  t_ours, t_torch = [], []
  for _ in range(steps):  # alternating, as the training steps above
    t_ours.append(_timed(ours_run))
    t_torch.append(_timed(torch_run))
  ours, torch_rate = 1 / np.median(t_ours), 1 / np.median(t_torch)
  print(f"| BiLSTM alone (ours in {dtype}), [{batch}, {time_steps}, {width}] forward passes/s "
        f"(median) vs torch.nn.LSTM | {ours:.2f} | {torch_rate:.2f} | {ours / torch_rate:.2f} |")


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--models", default="esim+cross+bilstm")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--score", type=int, default=500,
                      help="pairs reranked: the candidates of score / 10 1-of-10 cases")
  parser.add_argument("--dtype", default="float32",
                      help="our models' compute dtype (PyTorch stays float32)")
  args = parser.parse_args()
  import torch  # pylint: disable=import-outside-toplevel
  torch.manual_seed(0)
  print(f"{os.cpu_count()} CPUs, torch {torch.__version__} on {torch.get_num_threads()} threads, "
        f"{args.steps} timed training steps, {args.score // 10 * 10} candidates of "
        f"{args.score // 10} cases reranked")
  print("| measurement | convfit_jax | PyTorch | ratio |")
  print("|---|---|---|---|")
  for name in args.models.split("+"):
    {"esim": bench_esim, "cross": bench_cross, "bilstm": bench_bilstm}[name](torch, args.steps, args.score, args.dtype)
  print(f"machine at the end: {harness.machine()}")


if __name__ == "__main__":
  main()
