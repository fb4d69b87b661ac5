"""An HTTP service for a saved `IntentClassifier`: Starlette routes, uvicorn, batching.

    POST /predict   {"texts": [...], "explain": false}
                    -> {"predictions": [{"label", "score", "oos", "neighbours"?}, ...]}
    POST /examples  {"texts": [...], "labels": [...]} -> {"added", "pool_size", "intents"}
                    (only when started with allow_updates; saved before it answers)
    GET  /health    200 {"status": "ready"} once loaded and compiled, else 503 "loading"
    GET  /info      the model folder, intents, k-NN and serving settings, version

Starlette (the ASGI toolkit FastAPI is built on) because the service is four routes whose
input checks must give one-line errors of our own wording; FastAPI's schema layer would
add pydantic and its own 422 bodies for nothing we use. uvicorn runs it.

Requests are gathered into batches (`Batcher`): one worker thread owns the classifier, and
each device call takes every request that arrived while the previous call ran, or within
`batch_wait_ms` of the first (only under concurrent load: a lone request does not wait), up
to `max_texts` texts. The encoder is compiled for exactly those calls before /health says
ready (`Encoder.compile`), so no request waits on XLA.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import json
import time
from pathlib import Path
from typing import Any, Callable

from absl import logging
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from convfit_jax.classifier import IntentClassifier
from convfit_jax.evaluators import knn
from convfit_jax.version import __version__


@dataclasses.dataclass(frozen=True)
class ServeSettings:
  """How the service batches and what it accepts (`configs/serve.py` documents each)."""
  max_texts: int = 256
  max_body_bytes: int = 1 << 20
  batching: bool = True
  batch_wait_ms: float = 2.0
  batch_size: int = 32
  explain_top: int = 5
  allow_updates: bool = False


class BadRequest(ValueError):
  """A request the service refuses: its status and one-line message."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status


@dataclasses.dataclass
class _Item:
  texts: list[str]
  explain: bool
  future: asyncio.Future


class Batcher:
  """Runs `predict(texts, explain)` for many requests at once, in one worker thread.

  Args:
    predict: texts, explain -> one result per text; called in the worker thread only.
    settings: `max_texts` bounds a call; `batching` False gives each request its own call;
      `batch_wait_ms` is how long a call waits for more requests after the first, when more
      than one is queued or the last call held more than one.
  """

  def __init__(self, predict: Callable[[list[str], bool], list], settings: ServeSettings):
    self._predict = predict
    self._settings = settings
    self._items: collections.deque[_Item] = collections.deque()
    self._arrived = asyncio.Event()
    self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="classifier")
    self._task: asyncio.Task | None = None
    self.calls = 0  # device calls made: requests / calls is the batching achieved
    self._last_group = 0  # requests in the last call

  def start(self) -> None:
    self._task = asyncio.get_running_loop().create_task(self._loop())

  async def stop(self) -> None:
    if self._task is not None:
      self._task.cancel()
      with contextlib.suppress(asyncio.CancelledError):
        await self._task
    self._executor.shutdown(wait=True)

  async def run(self, fn: Callable, *args) -> Any:
    """`fn(*args)` in the worker thread, between batches (what updates the classifier)."""
    return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

  async def predict(self, texts: list[str], explain: bool = False) -> list:
    item = _Item(texts, explain, asyncio.get_running_loop().create_future())
    self._items.append(item)
    self._arrived.set()
    return await item.future

  async def _gather(self) -> list[_Item]:
    """The next call's requests: at least one, at most `max_texts` texts in all."""
    while not self._items:
      self._arrived.clear()
      await self._arrived.wait()
    s = self._settings
    if not s.batching:
      return [self._items.popleft()]
    # Wait for more only under concurrent load (more than one request queued now or in the
    # last call): a lone client's request goes at once, as with batching off.
    concurrent = len(self._items) > 1 or self._last_group > 1
    deadline = time.monotonic() + (s.batch_wait_ms / 1000 if concurrent else 0)
    while sum(len(i.texts) for i in self._items) < s.max_texts:
      left = deadline - time.monotonic()
      if left <= 0:
        break
      self._arrived.clear()
      try:
        await asyncio.wait_for(self._arrived.wait(), left)
      except TimeoutError:
        break
    group = [self._items.popleft()]
    count = len(group[0].texts)
    while self._items and count + len(self._items[0].texts) <= s.max_texts:
      count += len(self._items[0].texts)
      group.append(self._items.popleft())
    self._last_group = len(group)
    return group

  async def _loop(self) -> None:
    while True:
      group = await self._gather()
      # A client that went away has its future cancelled; its texts are not computed.
      group = [i for i in group if not i.future.done()]
      if not group:
        continue
      texts = [t for i in group for t in i.texts]
      try:
        results = await self.run(self._predict, texts, any(i.explain for i in group))
        self.calls += 1
      except Exception as e:  # pylint: disable=broad-except
        for i in group:
          if not i.future.done():
            i.future.set_exception(e)
        continue
      start = 0
      for i in group:
        part = results[start:start + len(i.texts)]
        start += len(i.texts)
        if not i.explain:
          part = [{k: v for k, v in r.items() if k != "neighbours"} for r in part]
        if not i.future.done():
          i.future.set_result(part)


def _error(status: int, message: str) -> JSONResponse:
  return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request, limit: int) -> dict:
  """The request's JSON object, read up to `limit` bytes."""
  declared = request.headers.get("content-length")
  if declared is not None and declared.isdigit() and int(declared) > limit:
    raise BadRequest(413, f"body of {declared} bytes; the limit is {limit}")
  raw = bytearray()
  async for chunk in request.stream():
    raw += chunk
    if len(raw) > limit:
      raise BadRequest(413, f"body over the limit of {limit} bytes")
  try:
    body = json.loads(raw)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise BadRequest(400, f"invalid JSON: {e}") from None
  if not isinstance(body, dict):
    raise BadRequest(400, f"the body must be a JSON object, got {type(body).__name__}")
  return body


def _texts(body: dict, limit: int) -> list[str]:
  texts = body.get("texts")
  if texts is None:
    raise BadRequest(400, 'missing field "texts" (a list of strings)')
  if not isinstance(texts, list):
    raise BadRequest(400, f'"texts" must be a list of strings, got {type(texts).__name__}')
  if not texts:
    raise BadRequest(400, '"texts" is empty')
  if len(texts) > limit:
    raise BadRequest(413, f'{len(texts)} texts in one request; the limit is {limit}')
  for i, t in enumerate(texts):
    if not isinstance(t, str):
      raise BadRequest(400, f"texts[{i}] must be a string, got {type(t).__name__}")
    if not t.strip():
      raise BadRequest(400, f"texts[{i}] is empty or whitespace")
  return texts


def _predict_fn(clf: IntentClassifier, settings: ServeSettings) -> Callable:
  def predict(texts: list[str], explain: bool) -> list[dict]:
    rows = clf.predict_details(texts, batch_size=settings.batch_size,
                               explain=settings.explain_top if explain else 0)
    for r in rows:
      del r["text"]  # the client has it
    return rows
  return predict


def build_app(clf: IntentClassifier, folder: str | Path, settings: ServeSettings) -> Starlette:
  """The ASGI app serving `clf`, loaded from `folder` (where /examples saves)."""
  predict = _predict_fn(clf, settings)
  state = {"ready": False, "batcher": None}

  def warm_search() -> None:
    # The k-NN search and vote compile once per power-of-two count of texts (knn.search,
    # knn.vote_labels) and pool size (knn.pool_rows); explain runs both searches.
    n = 1
    while n < 2 * settings.max_texts:
      predict(["warm up"] * min(n, settings.max_texts), True)
      n *= 2

  def warm() -> int:
    shapes = clf.encoder.compile(settings.max_texts, batch_size=settings.batch_size,
                                 normalize=True)
    warm_search()
    return shapes

  @contextlib.asynccontextmanager
  async def lifespan(app):
    batcher = Batcher(predict, settings)
    batcher.start()
    state["batcher"] = batcher

    async def compile_then_ready():
      start = time.monotonic()
      shapes = await batcher.run(warm)
      state["ready"] = True
      logging.info("ready: %d encoder shapes compiled in %.1f s", shapes, time.monotonic() - start)

    warming = asyncio.create_task(compile_then_ready())
    yield
    warming.cancel()
    await batcher.stop()

  def guarded(handler):
    async def endpoint(request: Request):
      try:
        return await handler(request)
      except BadRequest as e:
        return _error(e.status, str(e))
    return endpoint

  async def predict_route(request: Request):
    if not state["ready"]:
      return _error(503, "the model is still compiling; GET /health says when it is ready")
    body = await _body(request, settings.max_body_bytes)
    texts = _texts(body, settings.max_texts)
    explain = body.get("explain", False)
    if not isinstance(explain, bool):
      raise BadRequest(400, f'"explain" must be true or false, got {explain!r}')
    rows = await state["batcher"].predict(texts, explain)
    return JSONResponse({"predictions": rows})

  async def examples_route(request: Request):
    if not settings.allow_updates:
      raise BadRequest(403, "updates are off; start the server with allow_updates=True")
    if not state["ready"]:
      return _error(503, "the model is still compiling; GET /health says when it is ready")
    body = await _body(request, settings.max_body_bytes)
    texts = _texts(body, settings.max_texts)
    labels = body.get("labels")
    if not isinstance(labels, list) or len(labels) != len(texts):
      raise BadRequest(400, f'"labels" must be a list of {len(texts)} labels, one per text')

    def add_and_save():
      before = (list(clf.labels), list(clf.pool_texts), clf.pool_label_ids, clf.pool_embeddings)
      clf.add_examples(texts, labels)
      try:
        clf.save_pool()
      except BaseException:
        clf._set_pool(*before)  # pylint: disable=protected-access  # what is served = what is saved
        raise
      if knn.pool_rows(len(before[1])) != knn.pool_rows(len(clf.pool_texts)):
        warm_search()  # the search's shapes changed with the pool's
      return {"added": len(texts), "pool_size": len(clf.pool_texts), "intents": len(clf.labels)}

    try:
      out = await state["batcher"].run(add_and_save)
    except (ValueError, TypeError) as e:
      raise BadRequest(400, str(e)) from None
    logging.info("added %d examples; pool %d, %d intents, saved to %s", out["added"],
             out["pool_size"], out["intents"], folder)
    return JSONResponse(out)

  async def health(request: Request):
    del request
    if state["ready"]:
      return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "loading"}, status_code=503)

  async def info(request: Request):
    del request
    return JSONResponse({
        "model": str(folder), "version": __version__, "intents": clf.labels,
        "pool_size": len(clf.pool_texts), "k": clf.k, "vote": clf.vote,
        "oos_threshold": clf.oos_threshold, "reject_label": clf.reject_label,
        "max_length": clf.encoder.max_length, "dtype": clf.encoder.dtype,
        "serving": dataclasses.asdict(settings), "ready": state["ready"]})

  async def http_error(request: Request, exc: HTTPException):
    del request
    return _error(exc.status_code, str(exc.detail))

  routes = [Route("/predict", guarded(predict_route), methods=["POST"]),
            Route("/examples", guarded(examples_route), methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/info", info, methods=["GET"])]
  return Starlette(routes=routes, lifespan=lifespan,
                   exception_handlers={HTTPException: http_error})
