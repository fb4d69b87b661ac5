"""The HTTP service (`convfit_jax.serving`, task `serve`) on a tiny random BERT: every route,
every bad request, batching, updates that survive a killed server."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import numpy as np
import pytest
from starlette.testclient import TestClient

from conftest import REPO
from convfit_jax import Encoder, IntentClassifier, saved_classifier
from convfit_jax import encoder as encoder_module
from convfit_jax.serving import Batcher, ServeSettings, build_app
from convfit_jax.tokenization import bucket_widths
from test_classifier import TEST, TRAIN

SETTINGS = ServeSettings(max_texts=16, max_body_bytes=4096, explain_top=3)


@pytest.fixture()
def saved(tiny_bert_dir, tmp_path):
  folder = tmp_path / "clf"
  IntentClassifier.from_pretrained(tiny_bert_dir).add_examples(*TRAIN).save_pretrained(folder)
  return folder


def _ready(client) -> None:
  for _ in range(600):
    r = client.get("/health")
    if r.status_code == 200:
      return
    assert r.status_code == 503 and r.json() == {"status": "loading"}
    time.sleep(0.1)
  raise AssertionError("the server never became ready")


def _client(folder, settings=SETTINGS):
  clf = IntentClassifier.from_pretrained(folder)
  return clf, TestClient(build_app(clf, folder, settings))


def test_routes_answer_as_the_python_api(saved):
  clf, client = _client(saved)
  expected = IntentClassifier.from_pretrained(saved).predict_details(TEST[0][:10], explain=3)
  with client:
    _ready(client)
    r = client.post("/predict", json={"texts": TEST[0][:10]})
    assert r.status_code == 200
    rows = r.json()["predictions"]
    assert [p["label"] for p in rows] == [e["label"] for e in expected]
    np.testing.assert_allclose([p["score"] for p in rows], [e["score"] for e in expected],
                               atol=1e-5)
    assert all(set(p) == {"label", "score", "oos"} for p in rows)
    explained = client.post("/predict", json={"texts": TEST[0][:2], "explain": True}).json()
    for p, e in zip(explained["predictions"], expected):
      assert [n["text"] for n in p["neighbours"]] == [n["text"] for n in e["neighbours"]]
    info = client.get("/info").json()
    assert info["intents"] == clf.labels and info["pool_size"] == len(TRAIN[0])
    assert info["ready"] and info["serving"]["max_texts"] == SETTINGS.max_texts


@pytest.mark.parametrize("body, status, words", [
    ({}, 400, 'missing field "texts"'),
    ({"texts": "hello"}, 400, "must be a list"),
    ({"texts": []}, 400, "is empty"),
    ({"texts": ["ok", 3]}, 400, "texts[1] must be a string"),
    ({"texts": ["ok", "  "]}, 400, "texts[1] is empty"),
    ({"texts": ["x"] * 17}, 413, "17 texts in one request; the limit is 16"),
    ({"texts": ["x" * 5000]}, 413, "limit is 4096"),
    ({"texts": ["ok"], "explain": "yes"}, 400, '"explain" must be true or false'),
    ([1, 2], 400, "must be a JSON object"),
])
def test_bad_requests_get_one_line_errors(saved, body, status, words):
  _, client = _client(saved)
  with client:
    _ready(client)
    r = client.post("/predict", json=body)
    assert r.status_code == status and words in r.json()["error"], r.text
    assert "\n" not in r.json()["error"]
    assert client.post("/predict", json={"texts": ["still up"]}).status_code == 200


def test_invalid_json_unknown_routes_and_updates_off(saved):
  _, client = _client(saved)
  with client:
    _ready(client)
    r = client.post("/predict", content=b'{"texts": [', headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"].startswith("invalid JSON")
    assert client.post("/predict", content=b"\xff\xfe").status_code == 400
    r = client.get("/nowhere")
    assert r.status_code == 404 and r.json() == {"error": "Not Found"}
    assert client.get("/predict").status_code == 405 and "error" in client.get("/predict").json()
    r = client.post("/examples", json={"texts": ["a"], "labels": ["b"]})
    assert r.status_code == 403 and "allow_updates" in r.json()["error"]


def test_examples_are_served_and_saved(saved):
  settings = ServeSettings(max_texts=16, allow_updates=True)
  clf, client = _client(saved, settings)
  new = ["please send me a paper statement by post", "I want my statement on paper"]
  with client:
    _ready(client)
    r = client.post("/examples", json={"texts": new, "labels": ["paper_statement"] * 2})
    assert r.status_code == 200, r.text
    assert r.json() == {"added": 2, "pool_size": len(TRAIN[0]) + 2,
                        "intents": len(set(TRAIN[1])) + 1}
    pred = client.post("/predict", json={"texts": new[:1]}).json()["predictions"][0]
    assert pred["label"] == "paper_statement" and pred["score"] == pytest.approx(1.0, abs=1e-5)
    for body, words in [({"texts": new, "labels": ["x"]}, "a list of 2 labels"),
                        ({"texts": new[:1], "labels": [7]}, "labels")]:
      r = client.post("/examples", json=body)
      assert r.status_code == 400 and words in r.json()["error"], r.text
  assert len(clf.pool_texts) == len(TRAIN[0]) + 2
  reloaded = IntentClassifier.from_pretrained(saved)
  assert reloaded.pool_texts[-2:] == new and reloaded.labels[-1] == "paper_statement"
  np.testing.assert_array_equal(reloaded.pool_embeddings, clf.pool_embeddings)


def test_batcher_gathers_concurrent_requests_in_order():
  calls = []

  def predict(texts, explain):
    calls.append(list(texts))
    time.sleep(0.01)
    return [{"label": t.upper(), "neighbours": [t]} for t in texts]

  async def go(settings, n):
    b = Batcher(predict, settings)
    b.start()
    out = await asyncio.gather(*(b.predict([f"t{i}a", f"t{i}b"], explain=i == 0)
                                 for i in range(n)))
    await b.stop()
    return out

  out = asyncio.run(go(ServeSettings(max_texts=8, batch_wait_ms=50), 20))
  assert [[r["label"] for r in o] for o in out] == [[f"T{i}A", f"T{i}B"] for i in range(20)]
  assert "neighbours" in out[0][0] and "neighbours" not in out[1][0]
  assert len(calls) == 5 and all(len(c) <= 8 for c in calls)
  calls.clear()
  asyncio.run(go(ServeSettings(max_texts=8, batching=False), 6))
  assert len(calls) == 6


def test_a_lone_request_does_not_wait_for_company():
  calls = []

  def predict(texts, explain):
    calls.append(list(texts))
    return [{"label": t} for t in texts]

  async def go():
    b = Batcher(predict, ServeSettings(batch_wait_ms=400))
    b.start()
    start = time.monotonic()
    for i in range(3):  # one client: each request goes alone, at once
      await b.predict([f"lone {i}"])
    lone = time.monotonic() - start
    # Under concurrent load the wait applies: two requests queued together, then a third
    # that arrives within the wait joins the next call's company.
    first = asyncio.gather(b.predict(["a"]), b.predict(["b"]))
    await first
    late = asyncio.ensure_future(b.predict(["c"]))
    await asyncio.sleep(0.05)
    await asyncio.gather(late, b.predict(["d"]))
    await b.stop()
    return lone

  assert asyncio.run(go()) < 0.3
  assert calls == [["lone 0"], ["lone 1"], ["lone 2"], ["a", "b"], ["c", "d"]]


def test_batcher_reports_failures_and_skips_cancelled_requests():
  def predict(texts, explain):
    if "bad" in texts:
      raise ValueError("bad text")
    return [{"label": t} for t in texts]

  async def go():
    b = Batcher(predict, ServeSettings(batch_wait_ms=20))
    b.start()
    gone = asyncio.ensure_future(b.predict(["gone"]))
    await asyncio.sleep(0)
    gone.cancel()
    results = await asyncio.gather(b.predict(["bad"]), b.predict(["ok"]), return_exceptions=True)
    after = await b.predict(["after"])
    await b.stop()
    return results, after

  results, after = asyncio.run(go())
  assert all(isinstance(r, ValueError) for r in results)  # one call held both
  assert after == [{"label": "after"}]


def test_compiled_encoder_takes_no_new_shapes(tiny_bert_dir):
  enc = Encoder.from_pretrained(tiny_bert_dir, max_length=32)
  texts = TEST[0] + ["a much longer text " * 5, "hi"]
  free = enc.encode(texts)
  shapes = enc.compile(64, batch_size=8)
  compiled = encoder_module._embed._cache_size()  # pylint: disable=protected-access
  for n in (1, 3, 17, len(texts)):
    np.testing.assert_allclose(enc.encode(texts[:n], batch_size=8), free[:n], atol=1e-5)
  assert encoder_module._embed._cache_size() == compiled and shapes == len(bucket_widths(32)) * 6  # pylint: disable=protected-access
  with pytest.raises(ValueError, match="at most 64"):
    enc.encode(["x"] * 65)


def test_recover_puts_back_a_save_cut_between_renames(saved):
  clf = IntentClassifier.from_pretrained(saved)
  clf.add_examples(["one more"], [TRAIN[1][0]]).save_pool()
  # What a kill between write's two renames leaves: the new folder complete under its
  # temporary name, the old one moved aside.
  new = saved.with_name(f".{saved.name}.tmp-1")
  saved.rename(new)
  with pytest.warns(UserWarning, match="interrupted save"):
    back = IntentClassifier.from_pretrained(saved)
  assert back.pool_texts[-1] == "one more" and not new.exists()
  assert saved_classifier.recover(saved) is None


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(folder, port, *extra):
  # Few texts a call: fewer shapes to compile before /health says ready.
  cmd = [sys.executable, "-m", "convfit_jax.main",
         f"--config=configs/serve.py:model={folder},port={port}", "--config.max_texts=8",
         "--config.batch_size=4", *extra]
  return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True)


def _wait_ready(proc, url):
  for _ in range(1200):
    assert proc.poll() is None, proc.stdout.read()
    try:
      if httpx.get(url + "/health").status_code == 200:
        return
    except httpx.TransportError:
      pass
    time.sleep(0.1)
  raise AssertionError("the server never became ready")


def test_cli_server_keeps_examples_across_a_kill(saved):
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  proc = _start(saved, port, "--config.allow_updates=True")
  try:
    _wait_ready(proc, url)
    r = httpx.post(url + "/examples", json={"texts": ["open a kids account"],
                                             "labels": ["child_account"]})
    assert r.status_code == 200, r.text
  finally:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
  proc = _start(saved, port)
  try:
    _wait_ready(proc, url)
    assert "child_account" in httpx.get(url + "/info").json()["intents"]
    pred = httpx.post(url + "/predict", json={"texts": ["open a kids account"]}).json()
    assert pred["predictions"][0]["label"] == "child_account"
    assert httpx.post(url + "/examples", json={"texts": ["a"], "labels": ["b"]}).status_code == 403
  finally:
    proc.terminate()
    proc.wait(timeout=60)


@pytest.mark.parametrize("make, words", [
    (lambda tmp: tmp / "absent", "does not exist"),
    (lambda tmp: tmp, "is not a saved classifier"),
])
def test_cli_server_refuses_a_folder_it_cannot_load(tmp_path, make, words):
  r = subprocess.run([sys.executable, "-m", "convfit_jax.main",
                      f"--config=configs/serve.py:model={make(tmp_path)},port={_free_port()}"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 1 and words in r.stderr, r.stderr[-2000:]


def test_cli_server_refuses_a_damaged_folder(saved):
  (saved / saved_classifier.EMBEDDINGS_FILE).write_bytes(b"garbage")
  r = subprocess.run([sys.executable, "-m", "convfit_jax.main",
                      f"--config=configs/serve.py:model={saved},port={_free_port()}"],
                     cwd=REPO, capture_output=True, text=True, timeout=300)
  assert r.returncode == 1 and saved_classifier.EMBEDDINGS_FILE in r.stderr, r.stderr[-2000:]
  assert os.path.isdir(saved)
