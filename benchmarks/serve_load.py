"""The HTTP service under load: concurrent single-utterance clients against `encode`.

Run by hand from the repository root, on an idle machine:

  python benchmarks/serve_load.py [--model <saved classifier folder>] [--clients 1 8 32 128]
      [--requests 3080] [--repeats 3] [--json benchmarks/results/serve_load.json]
  python benchmarks/serve_load.py --table benchmarks/results/serve_load.json
  python benchmarks/serve_load.py --call_sizes 1 8 16 32 64

Without --model the classifier is all-MiniLM-L6-v2 (float32, max length 48) with banking77's
10-shot sample (seed 0) as its pool, built with `add_examples`: serving costs what it costs
whatever Stage 2 did to the weights. The server is the command line
(`configs/serve.py`) in its own process; this process is the client (asyncio streams, one
keep-alive HTTP/1.1 connection a client; httpx for the fault run), on the same CPU, so the
client's own work is inside every figure.

Measured:
- encode: `clf.encoder.encode` on banking77's 3,080 test utterances in this process, the
  server idle: the sentences/s the service is held to. Once at the start (median of 3 warm
  passes) and one pass just before each load run, which that run's ratio uses: this VM's
  speed drifts by a third over minutes.
- per number of clients, batching on and off: `--requests` requests of one utterance each
  (banking77 test, in order, cycled), each client sending its next when the last returns:
  requests/s over the whole run, latency p50/p95/p99, errors (non-200 or transport), and
  whether every prediction equals `IntentClassifier.predict_details` of the same text in
  this process (label, and score within 1e-5). Each point runs `--repeats` times, each
  against its own encode pass; the table shows the run of median ratio to encode, and every
  run's ratio beside it (the spread is the VM's, not the server's).
- faults, against a server with updates on (a copy of the folder): clients that disconnect
  mid-body and right after sending, a burst of bad requests among good ones (every good one
  must answer 200, every bad one 4xx), and the server killed (SIGKILL) while /examples
  requests stream in, then restarted: every example it acknowledged must be in its pool.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

import harness

REPO = Path(__file__).resolve().parents[1]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Server:
  """The serve command line on a free loopback port."""

  def __init__(self, folder: Path, *extra: str):
    self.port = _free_port()
    self.url = f"http://127.0.0.1:{self.port}"
    self.log = tempfile.TemporaryFile("w+")
    self.proc = subprocess.Popen(
        [sys.executable, "-m", "convfit_jax.main",
         f"--config=configs/serve.py:model={folder},port={self.port}", *extra],
        cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)
    start = time.monotonic()
    while True:
      if self.proc.poll() is not None:
        self.log.seek(0)
        raise RuntimeError(f"the server exited: {self.log.read()[-3000:]}")
      try:
        if httpx.get(self.url + "/health").status_code == 200:
          break
      except httpx.TransportError:
        pass
      time.sleep(0.2)
    self.ready_s = time.monotonic() - start

  def kill(self) -> None:
    self.proc.send_signal(signal.SIGKILL)
    self.proc.wait()

  def stop(self) -> None:
    self.proc.terminate()
    self.proc.wait(timeout=60)


class _Connection:
  """One keep-alive HTTP/1.1 connection on asyncio streams: a load client that costs the
  CPU it shares with the server less per request than httpx does."""

  def __init__(self, port: int):
    self._port = port
    self._streams = None

  async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
    """(status, body) of one POST; reconnects if the server closed the connection."""
    if self._streams is None:
      self._streams = await asyncio.open_connection("127.0.0.1", self._port)
    reader, writer = self._streams
    writer.write(f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(body)}\r\n\r\n".encode() + body)
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:] if line)
    answer = await reader.readexactly(int(headers["content-length"]))
    if headers.get("connection") == "close":
      await self.close()
    return int(lines[0].split()[1]), answer

  async def close(self) -> None:
    if self._streams is not None:
      self._streams[1].close()
      self._streams = None


async def _load(port: int, texts: list[str], clients: int, count: int) -> dict:
  """`count` single-text requests from `clients` concurrent clients, each on its own
  keep-alive connection."""
  latencies, answers, errors = [], [None] * count, 0
  next_index = iter(range(count))
  bodies = [json.dumps({"texts": [t]}).encode() for t in texts]

  async def one_client():
    nonlocal errors
    connection = _Connection(port)
    for i in next_index:
      start = time.perf_counter()
      try:
        status, answer = await connection.post("/predict", bodies[i % len(texts)])
      except (OSError, asyncio.IncompleteReadError):
        status = None
        await connection.close()
      latencies.append(time.perf_counter() - start)
      if status == 200:
        answers[i] = json.loads(answer)["predictions"][0]
      else:
        errors += 1
    await connection.close()

  start = time.perf_counter()
  await asyncio.gather(*(one_client() for _ in range(clients)))
  wall = time.perf_counter() - start
  ms = np.asarray(latencies) * 1000
  return {"clients": clients, "requests": count, "requests_per_s": count / wall,
          "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
          "p99_ms": float(np.percentile(ms, 99)), "errors": errors, "answers": answers}


def _equal(answers: list, expected: list) -> int:
  """How many answers differ from the Python API's (label, or score beyond 1e-5)."""
  return sum(a is None or a["label"] != e["label"] or abs(a["score"] - e["score"]) > 1e-5
             for a, e in zip(answers, expected))


def _raw(port: int, data: bytes) -> None:
  """Sends `data` on a fresh connection and closes it without reading the answer."""
  with socket.create_connection(("127.0.0.1", port)) as s:
    s.sendall(data)


async def _faults(folder: Path, texts: list[str], labels: list) -> dict:
  updates = Path(tempfile.mkdtemp(prefix="serve_faults_")) / "clf"
  shutil.copytree(folder, updates)
  server = Server(updates, "--config.allow_updates=True")
  out = {}
  try:
    good = json.dumps({"texts": texts[:1]}).encode()
    head = (f"POST /predict HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            f"content-length: {len(good)}\r\n\r\n").encode()
    for _ in range(20):
      _raw(server.port, head + good[:len(good) // 2])  # gone mid-body
      _raw(server.port, head + good)  # gone before the answer
    bad = [b"{", b"[1]", b'{"texts": 3}', b'{"texts": []}', b'{"texts": [1]}',
           json.dumps({"texts": ["x"] * 1000}).encode(), b"x" * (2 << 20)]
    async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
      calls = []
      for i in range(200):
        calls.append(client.post("/predict", json={"texts": [texts[i]]}))
        calls.append(client.post("/predict", content=bad[i % len(bad)]))
      got = await asyncio.gather(*calls, return_exceptions=True)
    good_ok = sum(isinstance(r, httpx.Response) and r.status_code == 200 for r in got[0::2])
    bad_4xx = sum(isinstance(r, httpx.Response) and 400 <= r.status_code < 500
                  for r in got[1::2])
    out.update(disconnects=40, good=200, good_ok=good_ok, bad=200, bad_4xx=bad_4xx,
               health_after=httpx.get(server.url + "/health").status_code)

    # Examples stream in; the server is killed while they do.
    acked = []

    async def stream():
      async with httpx.AsyncClient(base_url=server.url, timeout=60) as client:
        for i in range(10_000):
          text = f"{texts[i % len(texts)]} (example {i})"
          try:
            r = await client.post("/examples", json={"texts": [text], "labels": [labels[i % 3]]})
          except httpx.TransportError:
            return
          if r.status_code == 200:
            acked.append(text)

    task = asyncio.create_task(stream())
    await asyncio.sleep(8)
    server.kill()
    await task
    server = Server(updates)
    pool = set()
    for line in (updates / "pool.jsonl").read_text(encoding="utf-8").splitlines():
      pool.add(json.loads(line)["text"])
    out.update(examples_acknowledged=len(acked), examples_lost=sum(t not in pool for t in acked),
               pool_after_restart=httpx.get(server.url + "/info").json()["pool_size"])
  finally:
    server.stop()
    shutil.rmtree(updates.parent, ignore_errors=True)
  return out


def _build(folder: Path):
  from convfit_jax import IntentClassifier  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import intent  # pylint: disable=import-outside-toplevel
  data = intent.load("banking77", shots=10, seed=0)
  clf = IntentClassifier.from_pretrained("sentence-transformers/all-MiniLM-L6-v2")
  clf.add_examples(data.train.texts, [data.label_names[i] for i in data.train.labels])
  clf.save_pretrained(folder)


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--model", type=Path)
  p.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32, 128])
  p.add_argument("--requests", type=int, default=3080)
  p.add_argument("--repeats", type=int, default=3, help="load runs per (batching, clients)")
  p.add_argument("--json", type=Path)
  p.add_argument("--table", type=Path, help="print the table of a results file and exit")
  p.add_argument("--call_sizes", type=int, nargs="+",
                 help="only time, in this process, encode and predict_details called with this "
                      "many texts a call (what the server's calls cost), and exit")
  args = p.parse_args()
  if args.table:
    print(table(json.loads(args.table.read_text())))
    return
  from convfit_jax import IntentClassifier  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import intent  # pylint: disable=import-outside-toplevel
  work = Path(tempfile.mkdtemp(prefix="serve_load_"))
  try:
    folder = args.model
    if folder is None:
      folder = work / "clf"
      _build(folder)
    clf = IntentClassifier.from_pretrained(folder)
    test = intent.load("banking77", shots=10, seed=0).test
    texts = list(test.texts)
    clf.encoder.encode(texts)

    def encode_per_s(passes: int) -> float:
      times = []
      for _ in range(passes):
        start = time.perf_counter()
        clf.encoder.encode(texts)
        times.append(time.perf_counter() - start)
      return len(texts) / statistics.median(times)

    first_encode = encode_per_s(3)
    if args.call_sizes:
      print(_call_sizes(clf, texts, args.call_sizes, first_encode))
      return
    expected = clf.predict_details(texts)
    n = args.requests
    cycled = [expected[i % len(texts)] for i in range(n)]
    results = {"machine": harness.machine(),
               "model": str(args.model or "all-MiniLM-L6-v2, banking77 10-shot pool"),
               "encode_sentences_per_s": first_encode, "runs": []}
    print(f"encode: {first_encode:.0f} sentences/s", flush=True)
    for batching in (True, False):
      server = Server(folder, f"--config.batching={batching}")
      try:
        for clients in args.clients:
          repeats = []
          for _ in range(args.repeats):
            # The CPU's speed drifts over minutes (a shared VM): each run is held to an
            # encode pass just before it, the server idle.
            reference = encode_per_s(1)
            r = asyncio.run(_load(server.port, texts, clients, n))
            r["differ"] = _equal(r.pop("answers"), cycled)
            r.update(batching=batching, ready_s=server.ready_s, encode_per_s=reference,
                     of_encode=r["requests_per_s"] / reference)
            repeats.append(r)
            print(json.dumps(r), flush=True)
          repeats.sort(key=lambda r: r["of_encode"])
          median = dict(repeats[len(repeats) // 2],
                        of_encode_each=[r["of_encode"] for r in repeats],
                        errors_all=sum(r["errors"] for r in repeats),
                        differ_all=sum(r["differ"] for r in repeats))
          results["runs"].append(median)
      finally:
        server.stop()
    labels = sorted(set(clf.labels))[:3]
    results["faults"] = asyncio.run(_faults(folder, texts, labels))
    print(json.dumps(results["faults"]), flush=True)
  finally:
    shutil.rmtree(work, ignore_errors=True)
  if args.json:
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=1) + "\n")
  print(table(results))


def _call_sizes(clf, texts: list[str], sizes: list[int], whole: float) -> str:
  """Texts/s of `encode` and `predict_details` called with g texts at a time over 1,536 of
  the texts, the server's shapes compiled first, against a whole-set encode pass."""
  clf.encoder.compile(256, batch_size=32, normalize=True)
  rows = [f"whole-set encode: {whole:.0f} sentences/s ({harness.machine()})", "",
          "| texts a call | encode texts/s | x whole-set | ms a call | predict_details texts/s "
          "| ms a call |", "|---|---|---|---|---|---|"]
  for g in sizes:
    calls = [texts[i:i + g] for i in range(0, 1536, g)]
    rates = []
    for fn in (lambda t: clf.encoder.encode(t, normalize=True), clf.predict_details):
      fn(calls[0])
      start = time.perf_counter()
      for t in calls:
        fn(t)
      rates.append(sum(map(len, calls)) / (time.perf_counter() - start))
    rows.append(f"| {g} | {rates[0]:.0f} | {rates[0] / whole:.2f} | {1000 * g / rates[0]:.1f} | "
                f"{rates[1]:.0f} | {1000 * g / rates[1]:.1f} |")
  return "\n".join(rows)


def table(results: dict) -> str:
  rows = ["| batching | clients | requests/s | encode just before, sentences/s | x encode | "
          "x encode, every run | p50 ms | p95 ms | p99 ms | errors, every run | "
          "predictions differing from the Python API, every run |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
  for r in results["runs"]:
    each = r.get("of_encode_each", [r["of_encode"]])
    runs = len(each)
    rows.append(f"| {'on' if r['batching'] else 'off'} | {r['clients']} | "
                f"{r['requests_per_s']:.0f} | {r['encode_per_s']:.0f} | {r['of_encode']:.2f} | "
                f"{' '.join(f'{x:.2f}' for x in each)} | {r['p50_ms']:.1f} | "
                f"{r['p95_ms']:.1f} | {r['p99_ms']:.1f} | {r.get('errors_all', r['errors'])} | "
                f"{r.get('differ_all', r['differ'])} of {runs * r['requests']} |")
  f = results["faults"]
  return "\n".join(rows + [
      "", f"encode at the start: {results['encode_sentences_per_s']:.0f} sentences/s, median of "
      f"3 passes ({results['machine']})",
      f"faults: {f['disconnects']} dropped connections; good requests answered "
      f"{f['good_ok']}/{f['good']}, bad ones 4xx {f['bad_4xx']}/{f['bad']}, /health after "
      f"{f['health_after']}; killed during /examples: {f['examples_acknowledged']} "
      f"acknowledged, {f['examples_lost']} lost, pool after restart {f['pool_after_restart']}"])


if __name__ == "__main__":
  main()
