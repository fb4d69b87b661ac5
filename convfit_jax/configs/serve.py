"""Serve a saved `IntentClassifier` over HTTP (`convfit_jax.serving`; `pip install -e ".[serve]"`).

    python -m convfit_jax.main --config=configs/serve.py:model=my_classifier,port=8000
    curl -s localhost:8000/predict -d '{"texts": ["where is my card?"]}'

`model` is a saved classifier folder (`IntentClassifier.save_pretrained`) or a Stage 2
workdir (its classifier/ folder). Every argument is also a field (`--config.port=8001`).
"""

from __future__ import annotations

import ml_collections

from convfit_jax.configs import common


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  a = common.parse_arg(arg, "configs/serve.py", model="", host="127.0.0.1", port=8000,
                       allow_updates=False, batching=True)
  c = ml_collections.ConfigDict()
  c.task = "serve"
  c.model = a.model  # saved classifier folder, or a Stage 2 workdir
  c.host = a.host  # 127.0.0.1 answers this machine only; 0.0.0.0 every interface
  c.port = a.port
  # POST /examples adds to the pool and rewrites the folder's pool files (atomically, before
  # it answers), so a restart keeps them. Off: the folder is never written.
  c.allow_updates = a.allow_updates
  # Gather concurrent requests into one encoder call (False: one call per request).
  c.batching = a.batching
  # How long a call waits for more requests after the first, under concurrent load only.
  c.batch_wait_ms = 2.0
  c.max_texts = 256  # texts per request, and per encoder call; larger requests get 413
  c.max_body_bytes = 1 << 20  # request bodies above it get 413
  c.batch_size = 32  # packed rows per encoder call (the encoder's `batch_size`)
  c.explain_top = 5  # neighbours returned with "explain": true
  c.dtype = ""  # compute dtype; "" = the classifier's
  return c
