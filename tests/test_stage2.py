"""Stage 2 end to end on a tiny random BERT: metrics, export, resume after a kill, NaN stop."""

import json
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from safetensors.numpy import load_file

from configs import stage2 as stage2_config
from conftest import REPO
from convfit_jax import losses
from convfit_jax.configs import stage2 as stage2_settings
from convfit_jax import Encoder
from convfit_jax.train import loop, stage2, trainer

STEPS = 8


def _overrides(model_dir, workdir, **extra):
  o = {"workdir": str(workdir), "model.init_from": str(model_dir), "model.max_length": 16,
       "model.projection_dim": 24, "data.shots": 2, "evals.knn.max_test": 64, "evals.knn.tsne": False,
       "train.batch_size": 8, "train.max_steps": STEPS, "train.checkpoint_every": 2,
       "train.log_every": 2, "train.learning_rate": 1e-3}
  o.update(extra)
  return o


def _config(arg="", **overrides):
  c = stage2_config.get_config(arg)
  for key, value in overrides.items():
    node = c
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    node[leaf] = value
  return c


def _weights(workdir):
  return load_file(str(workdir / "model" / "model.safetensors"))


@pytest.mark.parametrize("loss", ["ocl", "smax", "cos"])
def test_tiny_run_writes_metrics_and_a_loadable_model(loss, tiny_bert_dir, tmp_path):
  metrics = stage2.train_and_evaluate(_config(f"loss={loss}", **_overrides(tiny_bert_dir, tmp_path)))
  for key in ("knn_accuracy", "knn_accuracy_before", "macro_f1", "silhouette", "num_train",
              "num_test", "pairs_positive", "pairs_negative", "train_seconds"):
    assert key in metrics, key
  assert metrics["num_train"] == 77 * 2 and metrics["pairs_positive"] == 77
  assert metrics["pairs_negative"] == 77 * 2 * 3
  assert 0.0 <= metrics["knn_accuracy"] <= 1.0
  assert json.loads((tmp_path / "metrics.json").read_text())["knn_accuracy"] == metrics["knn_accuracy"]
  assert json.loads((tmp_path / "config.json").read_text())["train"]["loss"] == loss
  assert list((tmp_path / "tensorboard").iterdir())
  # The trained model moved away from the pretrained one and exports with its projection.
  enc = Encoder.from_pretrained(tmp_path / "model")
  assert enc.dim == 24
  start = Encoder.from_pretrained(tiny_bert_dir)
  assert not np.allclose(enc.model.transformer.embeddings.layer_norm.scale[...],
                         start.model.transformer.embeddings.layer_norm.scale[...])


@pytest.mark.parametrize("loss", ["supcon", "ocl"])
def test_label_batches_train_on_a_users_csv(loss, tiny_bert_dir, tmp_path):
  fixtures = REPO / "tests" / "fixtures"
  o = _overrides(tiny_bert_dir, tmp_path, **{
      "data.name": "csv", "data.train_file": str(fixtures / "intent_train.csv"),
      "data.test_file": str(fixtures / "intent_test.csv"), "data.shots": 0,
      "train.labels_per_batch": 3, "train.examples_per_label": 2, "train.max_steps": 4})
  metrics = stage2.train_and_evaluate(_config(f"sampler=labels,loss={loss}", **o))
  assert metrics["steps"] == 4 and metrics["sentences_per_step"] == 6
  assert "pairs_positive" not in metrics and 0.0 <= metrics["knn_accuracy"] <= 1.0
  config = json.loads((tmp_path / "config.json").read_text())["train"]
  assert (config["sampler"], config["loss"]) == ("labels", loss)
  log = (tmp_path / "log.txt").read_text()
  assert "label batches: 3 intents x 2 utterances" in log and "sentences/s" in log
  moved = Encoder.from_pretrained(tmp_path / "model").model.transformer.embeddings.layer_norm.scale[...]
  start = Encoder.from_pretrained(tiny_bert_dir).model.transformer.embeddings.layer_norm.scale[...]
  assert not np.allclose(moved, start)


def test_anchors_views_and_an_intent_head_train_together(tiny_bert_dir, tmp_path):
  fixtures = REPO / "tests" / "fixtures"
  o = _overrides(tiny_bert_dir, tmp_path, **{
      "data.name": "csv", "data.train_file": str(fixtures / "intent_train.csv"),
      "data.test_file": str(fixtures / "intent_test.csv"), "data.shots": 0,
      "train.labels_per_batch": 3, "train.examples_per_label": 2, "train.max_steps": 4,
      "train.label_anchors": True, "train.views": 2, "train.head_weight": 0.5})
  metrics = stage2.train_and_evaluate(_config("sampler=labels,loss=supcon", **o))
  # 3 intents x 2 utterances, the 3 intents' names, all twice.
  assert metrics["sentences_per_step"] == (3 * 2 + 3) * 2
  for key in ("head_accuracy", "prototype_accuracy", "prototype_accuracy_before"):
    assert 0.0 <= metrics[key] <= 1.0, key
  assert "head_accuracy_before" not in metrics  # an untrained head says nothing
  log = (tmp_path / "log.txt").read_text()
  assert "each group joined by its intent's text" in log and "encoded 2 times" in log
  assert re.search(r"steps 1-2: loss [\d.]+, contrast [\d.]+, head [\d.]+,", log)


def test_the_head_loss_is_the_weighted_cross_entropy_of_its_logits(tiny_bert_dir):
  from convfit_jax import models  # pylint: disable=import-outside-toplevel
  c = _config("sampler=labels,loss=supcon", **_overrides(tiny_bert_dir, "/tmp/unused"))
  model = models.get("siamese").build(c.model, seed=0, intent_labels=3).model
  h = model.intent_head
  h.kernel[...] = np.random.default_rng(0).normal(size=h.kernel.shape).astype(np.float32)
  ids = np.array([[101, 2000, 102, 0], [101, 2001, 2002, 102], [101, 2003, 102, 0]], np.int32)
  batch = {"input_ids": ids, "attention_mask": (ids > 0).astype(np.int32),
           "position_ids": np.tile(np.arange(4, dtype=np.int32), (3, 1)),
           "slots": np.array([[0, 1], [1, 1], [2, 1]], np.int32),
           "labels": np.array([0, 0, 2], np.int32), "weights": np.array([1, 1, 0], np.float32)}
  out = stage2.dense_loss_fn(model, batch, None, loss="supcon", options={}, head_weight=0.25)
  emb = model.encoder(batch["input_ids"], batch["attention_mask"], position_ids=batch["position_ids"],
                      slots=batch["slots"])
  logits = np.asarray(h(emb), np.float64)
  log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
  np.testing.assert_allclose(out["head"], -log_p[[0, 1], [0, 0]].mean(), rtol=1e-5)
  np.testing.assert_allclose(out["loss"], out["contrast"] + 0.25 * out["head"], rtol=1e-6)


def test_dry_run_counts_without_training(tiny_bert_dir, tmp_path):
  metrics = stage2.train_and_evaluate(_config(**_overrides(tiny_bert_dir, tmp_path), dry_run=True))
  assert metrics["pairs_positive"] == 77 and metrics["memory_estimate"]["total_mib"] > 0
  assert not (tmp_path / "checkpoints").exists() and not (tmp_path / "model").exists()


def test_nan_loss_stops_with_step_and_batch(tiny_bert_dir, tmp_path):
  config = _config(**_overrides(tiny_bert_dir, tmp_path, **{"train.learning_rate": 1e30,
                                                           "train.clip_norm": 0.0,
                                                           "evals.knn.before": False}))
  with pytest.raises(loop.NonFiniteLossError, match=r"(loss|gradient norm) is nan at steps? [\d-]+; batch indices \["):
    stage2.train_and_evaluate(config)


def _cli(overrides):
  return [sys.executable, "-m", "convfit_jax.main", "--config=configs/stage2.py"] + [
      f"--config.{k}={v}" for k, v in overrides.items()]


def test_killed_run_resumes_to_the_same_parameters(tiny_bert_dir, tmp_path):
  # On label batches; the pairs' iterator resumes the same way (test_data_batching).
  steps = {"train.max_steps": 24, "train.sampler": "labels", "train.labels_per_batch": 4,
           "train.examples_per_label": 2}
  full = tmp_path / "full"
  r = subprocess.run(_cli(_overrides(tiny_bert_dir, full, **steps)), cwd=REPO, capture_output=True,
                     text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]

  killed = tmp_path / "killed"
  proc = subprocess.Popen(_cli(_overrides(tiny_bert_dir, killed, **steps)), cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  deadline = time.time() + 600
  ckpts = killed / "checkpoints"
  while time.time() < deadline and proc.poll() is None:
    done = [p for p in ckpts.glob("*") if p.name.isdigit()] if ckpts.exists() else []
    if any(4 <= int(p.name) < 24 for p in done):
      break
    time.sleep(0.2)
  assert proc.poll() is None, "the run finished before it could be killed"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not (killed / "model").exists()
  r = subprocess.run(_cli(_overrides(tiny_bert_dir, killed, **steps)), cwd=REPO, capture_output=True,
                     text=True, timeout=900)
  assert r.returncode == 0, r.stderr[-3000:]
  a, b = _weights(full), _weights(killed)
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  metrics_a = json.loads((full / "metrics.json").read_text())
  metrics_b = json.loads((killed / "metrics.json").read_text())
  assert metrics_a["knn_accuracy"] == metrics_b["knn_accuracy"]

  # A finished run is not retrained: rerunning leaves the checkpoints as they are.
  before = sorted(p.name for p in (full / "checkpoints").iterdir())
  r = subprocess.run(_cli(_overrides(tiny_bert_dir, full, **steps)), cwd=REPO, capture_output=True,
                     text=True, timeout=900)
  assert r.returncode == 0 and "already finished" in r.stderr
  assert sorted(p.name for p in (full / "checkpoints").iterdir()) == before


def test_sampler_and_loss_combinations_are_checked():
  for arg, match in (("sampler=pairs,loss=supcon", "supcon needs train.sampler=labels"),
                     ("sampler=labels,loss=mneg", "choose one of"),
                     ("sampler=triples", "train.sampler='triples'")):
    with pytest.raises(ValueError, match=match):
      stage2.check_train_config(_config(arg).train)
  c = _config("sampler=labels")
  c.train.examples_per_label = 1
  with pytest.raises(ValueError, match="must be >= 2"):
    stage2.check_train_config(c.train)
  for field, value in (("views", 2), ("label_anchors", True), ("head_weight", 0.1)):
    c = _config()
    c.train[field] = value
    with pytest.raises(ValueError, match="need train.sampler=labels"):
      stage2.check_train_config(c.train)
  c = _config("sampler=labels")
  c.train.views = 0
  with pytest.raises(ValueError, match="train.views=0"):
    stage2.check_train_config(c.train)
  assert set(losses.DENSE_LOSSES) == set(losses.STAGE2_LOSSES) | {"supcon"}
  for name in ("ocl", "dense_ocl", "dense_cos", "supcon"):
    c = _config()
    c.train.sampler, c.train.loss = stage2_settings.parse_objective(name)
    assert stage2_settings.objective(c.train) == name


def test_dense_config_is_stage2_on_label_batches():
  from configs import stage2_dense  # pylint: disable=import-outside-toplevel
  c = stage2_dense.get_config()
  assert (c.train.sampler, c.train.loss, c.data.shots) == ("labels", "supcon", 10)
  # 32 intents x 2 (docs/results.md: ahead of 16 x 4 on validation and test)
  assert (c.train.labels_per_batch, c.train.examples_per_label) == (32, 2)
  assert c.workdir == "workdirs/stage2_dense/banking77_10shot_supcon_seed0"
  paper = stage2_config.get_config()
  assert (paper.train.sampler, paper.train.loss) == ("pairs", "ocl")  # stage2.py stays the paper's
  c = stage2_dense.get_config("dataset=clinc150,shots=0,loss=ocl,runlocal")
  assert (c.train.sampler, c.train.loss, c.train.max_steps) == ("labels", "ocl", 20)
  assert c.workdir.endswith("clinc150_fullshot_dense_ocl_seed0")


def test_the_schedule_floor_raises_small_sets_and_max_steps_still_cuts():
  from configs import stage2_dense  # pylint: disable=import-outside-toplevel
  t = stage2_dense.get_config().train
  assert (t.epochs, t.min_steps) == (10, 100)
  # 7 intents x 10: 2 steps an epoch; banking77 10-shot: 13.
  assert trainer.total_steps(2, t) == 100
  assert trainer.schedule_summary(2, t) == "100 steps (train.min_steps; 10 epochs of 2 would be 20)"
  assert trainer.total_steps(13, t) == 130 and trainer.schedule_summary(13, t) == "130 steps (10 epochs of 13)"
  t.max_steps = 8
  assert trainer.total_steps(2, t) == 8 and trainer.schedule_summary(2, t) == "8 steps (train.max_steps; 10 epochs of 2)"
  assert stage2_config.get_config().train.min_steps == 0  # the paper's pairs: epochs only


@pytest.mark.parametrize("dataset, steps", [("banking77", 130), ("hwu64", 100), ("clinc150", 240)])
def test_the_floor_leaves_the_three_full_sets_as_they_were_measured(dataset, steps):
  from configs import stage2_dense  # pylint: disable=import-outside-toplevel
  from convfit_jax.data import intent, label_batches  # pylint: disable=import-outside-toplevel
  c = stage2_dense.get_config(f"dataset={dataset}")
  labels = intent.from_config(c.data).train.labels
  t = c.train
  assert label_batches.layout(labels, t.labels_per_batch, t.examples_per_label).even is False
  per_epoch = label_batches.layout(labels, t.labels_per_batch, t.examples_per_label).steps_per_epoch
  assert trainer.total_steps(per_epoch, t) == per_epoch * t.epochs == steps


def test_config_arguments_and_typos():
  c = stage2_config.get_config("dataset=hwu64,shots=30,loss=cos")
  assert (c.data.name, c.data.shots, c.train.loss, c.train.epochs) == ("hwu64", 30, "cos", 5)
  assert stage2_config.get_config("shots=0").train.epochs == 2
  with pytest.raises(ValueError, match="datset"):
    stage2_config.get_config("datset=hwu64")


def test_config_arguments_are_typed_by_their_defaults():
  c = stage2_config.get_config("dataset=hwu64,shots=30,runlocal")
  assert type(c.data.shots) is int and c.data.shots == 30  # pylint: disable=unidiomatic-typecheck
  assert c.train.max_steps == 20 and c.evals.knn.tsne is False  # the bool flag took effect
  from convfit_jax.configs import common  # pylint: disable=import-outside-toplevel
  a = common.parse_arg("n=3,x=0.5,flag,names=a+b,ids=1+2,off=false", "test", n=1, x=0.1, flag=False,
                       names=("z",), ids=(0,), off=True)
  assert (a.n, a.x, a.flag, a.names, a.ids, a.off) == (3, 0.5, True, ("a", "b"), (1, 2), False)
  with pytest.raises(ValueError, match=r"test: argument n='three'"):
    common.parse_arg("n=three", "test", n=1)
  with pytest.raises(ValueError, match="needs a value"):
    common.parse_arg("n", "test", n=1)


def test_mpnet_trains_and_exports_as_mpnet(tiny_mpnet_dir, tmp_path):
  metrics = stage2.train_and_evaluate(_config(**_overrides(tiny_mpnet_dir, tmp_path,
                                                           **{"train.max_steps": 4})))
  assert metrics["steps"] == 4 and 0.0 <= metrics["knn_accuracy"] <= 1.0
  enc = Encoder.from_pretrained(tmp_path / "model")
  assert enc.model.config.model_type == "mpnet" and enc.model.transformer.relative_attention_bias is not None
  start = Encoder.from_pretrained(tiny_mpnet_dir)
  assert not np.allclose(enc.model.transformer.relative_attention_bias.embedding[...],
                         start.model.transformer.relative_attention_bias.embedding[...])
