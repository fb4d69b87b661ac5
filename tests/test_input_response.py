"""The input-response task (Yang et al. 2018) on synthetic data: the DAN's averaging, the
multitask loss against numpy, deterministic and resumable interleaving, sharded equals one
device, and runlocal runs of both encoders that learn, export and reload."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from configs import evaluate as evaluate_config
from configs import input_response as ir_config
from convfit_jax.configs import common
from convfit_jax import sharding
from convfit_jax.data import words
from convfit_jax.models import dan, word_models
from convfit_jax.tasks import evaluate
from convfit_jax.train import input_response, trainer
from convfit_jax.train.input_response import InputResponseTask

from test_sts_nli import write_sts_dir

TOPICS = ("wifi", "printer", "sound", "mount", "kernel", "grub", "python", "apache", "nvidia",
          "samba", "firefox", "cron")
NLI_FORMS = {"entailment": "a man uses the {t}", "neutral": "a man uses the {t} at night",
             "contradiction": "nobody uses the {t}"}


def write_data(folder, seed=0):
  """Conversations (a question names a topic, its answer the same topic), 1-of-12 cases,
  NLI pairs whose label is the hypothesis's form, and STS files."""
  rng = np.random.default_rng(seed)
  folder.mkdir(parents=True, exist_ok=True)
  question = lambda t: f"does anyone know about {t} here"
  answer = lambda t: f"yes the {t} docs explain it"
  lines = ["context\tresponse"] + [f"{question(t)}\t{answer(t)}"
                                    for t in rng.choice(TOPICS, 256)]
  (folder / "train.tsv").write_text("\n".join(lines) + "\n")
  with open(folder / "rs.jsonl", "w") as f:
    for _ in range(24):
      label = int(rng.integers(len(TOPICS)))
      f.write(json.dumps({"context": question(TOPICS[label]),
                          "candidates": [answer(t) for t in TOPICS], "label": label}) + "\n")
  for split, n in (("train", 480), ("test", 96)):
    rows = ["label\tsentence1\tsentence2"]
    for _ in range(n):
      t = TOPICS[int(rng.integers(len(TOPICS)))]
      label = list(NLI_FORMS)[int(rng.integers(3))]
      rows.append(f"{label}\ta man is near the {t}\t{NLI_FORMS[label].format(t=t)}")
    (folder / f"nli_{split}.tsv").write_text("\n".join(rows) + "\n")
  write_sts_dir(folder / "stsb", topics=TOPICS)
  return folder


def config_for(folder, arg, **extra):
  c = ir_config.get_config(arg)
  c.workdir = str(folder / "run")
  c.data.train = str(folder / "train.tsv")
  c.data.nli_train = str(folder / "nli_train.tsv")
  c.data.sts_dir = str(folder / "stsb")
  c.data.sick_dir = ""
  with c.unlocked():
    for name in list(c.evals):
      if name != "sts":
        del c.evals[name]
    c.evals.syn = common.response_selection_eval(file=str(folder / "rs.jsonl"), prefix="syn_",
                                                           every=0)
    if c.train.nli_batch_size:
      c.evals.nli = common.nli_eval(file=str(folder / "nli_test.tsv"), prefix="nli_")
  for k, v in extra.items():
    section, field = k.split(".")
    c[section][field] = v
  return c


def test_dan_inputs_and_vocabulary():
  vocabulary = dan.build_vocabulary(["the cat sat", "the cat ran", "a dog"], min_count=2,
                                    max_words=0, max_bigrams=0)
  assert vocabulary.words.words[len(words.RESERVED):] == ("cat", "the")
  assert vocabulary.bigrams.words[len(words.RESERVED):] == ("the cat",)
  x = vocabulary.inputs(["The cat sat", "", "the cat the cat the"], max_length=4)
  the, cat = vocabulary.words.ids(["the", "cat"])
  the_cat = vocabulary.bigrams.ids(["the cat"])[0]
  assert x["word_ids"].shape == x["bigram_ids"].shape == (3, 4)  # padded at most to max_length
  assert x["word_ids"][0].tolist() == [the, cat, 1, 0]  # "sat" is unknown
  assert x["bigram_ids"][0].tolist() == [the_cat, 1, 0, 0]  # "cat sat" is unknown
  assert x["word_ids"][1].tolist() == [1, 0, 0, 0] and x["bigram_ids"][1].sum() == 0  # empty
  assert x["word_ids"][2].tolist() == [the, cat, the, cat]  # cut to 4 words
  assert x["bigram_ids"][2].tolist() == [the_cat, 1, the_cat, 0]
  assert vocabulary.inputs(["a b c"], max_length=64)["word_ids"].shape == (1, words.MIN_PADDED_LENGTH)


def test_dan_averages_word_and_bigram_embeddings_over_real_ids():
  config = dan.DAN.Config(vocab_size=7, bigram_size=5, embed_dim=4, hidden=(3,))
  model = dan.DAN(config, rngs=nnx.Rngs(0))
  w, b = np.asarray(model.words[...]), np.asarray(model.bigrams[...])
  k, bias = np.asarray(model.layers[0].kernel[...]), np.asarray(model.layers[0].bias[...])
  word_ids = np.asarray([[2, 3, 6, 0, 0, 0], [5, 0, 0, 0, 0, 0]], np.int32)
  bigram_ids = np.asarray([[4, 1, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0]], np.int32)
  expected = np.stack([(w[2] + w[3] + w[6] + b[4] + b[1]) / 5, w[5]])
  out = np.asarray(model(jnp.asarray(word_ids), jnp.asarray(bigram_ids)))
  np.testing.assert_allclose(out, np.tanh(expected @ k + bias), rtol=1e-5, atol=1e-6)
  # More padding changes nothing; padding ids' rows are never read.
  wide = lambda x: jnp.asarray(np.pad(x, [(0, 0), (0, 10)]))
  np.testing.assert_allclose(np.asarray(model(wide(word_ids), wide(bigram_ids))), out, atol=1e-6)


def _mneg_numpy(c, r, scale, ids):
  unit = lambda x: x / np.linalg.norm(x, axis=1, keepdims=True)
  sim = scale * unit(c) @ unit(r).T
  losses = []
  for i in range(len(c)):
    keep = [j for j in range(len(r)) if j == i or ids[j] != ids[i]]
    losses.append(np.log(np.sum(np.exp(sim[i, keep]))) - sim[i, i])
  return np.mean(losses)


def test_multitask_loss_equals_numpy(tmp_path):
  folder = write_data(tmp_path)
  task = InputResponseTask(config_for(folder, "encoder=dan,multitask,runlocal"), sharding.make_mesh())
  host = next(task.batches(0))
  batch = task.device_batch(host)
  model = task.built.model
  out = input_response.loss_fn(model, batch, None, scale=20.0, nli_weight=0.7)
  embed = lambda side: np.asarray(model.dual.context(
      **{k.split("/")[1]: v for k, v in batch.items() if k.startswith(side + "/")}))
  c, r = embed("context"), embed("response")
  r = np.asarray(model.dual.apply_response_ff(jnp.asarray(r)))
  texts = [task.responses[i] for i in host["pairs"]]
  ids = [texts.index(t) for t in texts]  # a repeated response is not a negative
  assert len(set(ids)) < len(ids)
  conversation = _mneg_numpy(c, r, 20.0, ids)
  logits = np.asarray(model.nli(jnp.asarray(embed("premise")), jnp.asarray(embed("hypothesis"))))
  log_p = logits - np.log(np.sum(np.exp(logits), 1, keepdims=True))
  nli = -np.mean(log_p[np.arange(len(logits)), np.asarray(batch["nli_labels"])])
  assert float(out["conversation_loss"]) == pytest.approx(conversation, rel=1e-5)
  assert float(out["nli_loss"]) == pytest.approx(nli, rel=1e-5)
  assert float(out["loss"]) == pytest.approx(conversation + 0.7 * nli, rel=1e-5)


def test_both_streams_are_a_function_of_the_seed_and_step(tmp_path):
  folder = write_data(tmp_path)
  make = lambda seed, **kw: InputResponseTask(config_for(
      folder, f"encoder=dan,multitask,runlocal,seed={seed}", **kw), sharding.make_mesh())
  a, b = make(0), make(0)
  for step in (0, 3, 7, 15):  # 256 pairs / 32: epochs of 8 steps; 480 NLI pairs / 16: 30
    ra, rb = a.step_rows(step), b.step_rows(step)
    for k in ("pairs", "nli"):
      np.testing.assert_array_equal(ra[k], rb[k])
  # A resumed run's batches are the uninterrupted run's from that step on.
  full, resumed = a.batches(0), a.batches(5)
  tail = [next(full) for _ in range(a.total_steps)][5:]
  for expected in tail:
    got = next(resumed)
    for k in ("pairs", "nli"):
      np.testing.assert_array_equal(got[k], expected[k])
  full.close()
  resumed.close()
  # Each epoch covers every pair once; another seed draws other batches.
  epoch = np.concatenate([a.step_rows(s)["pairs"] for s in range(8)])
  assert sorted(epoch.tolist()) == list(range(256))
  assert not np.array_equal(make(1).step_rows(0)["pairs"], a.step_rows(0)["pairs"])
  # The NLI fraction is a seeded sample of the pairs.
  part = make(0, **{"data.nli_fraction": 0.25})
  assert len(part.nli) == 120
  assert part.nli.premises == make(0, **{"data.nli_fraction": 0.25}).nli.premises
  assert part.nli.hypotheses != make(1, **{"data.nli_fraction": 0.25}).nli.hypotheses


def first_step_on_one_and_all_devices(c, task_class=InputResponseTask) -> list[tuple[dict, tuple]]:
  """The first step of the task of `c` (`task_class`) on one device, then on all 8:
  [(its metrics, (params, model_state))] for each."""
  outs = []
  for mesh in (sharding.make_mesh(devices=jax.devices()[:1]), sharding.make_mesh()):
    task = task_class(c, mesh)
    state, _ = trainer.init_state(c, task.built.model, task.total_steps, mesh)
    step = trainer.make_train_step(task.loss_and_grads, mesh)
    state, m = step(state, task.device_batch(next(task.batches(0))))
    outs.append((jax.device_get(m), jax.device_get((state.params, state.model_state))))
  assert jax.device_count() == 8
  return outs


def test_a_sharded_step_equals_one_device(tmp_path):
  folder = write_data(tmp_path)
  outs = first_step_on_one_and_all_devices(config_for(folder, "encoder=dan,multitask,runlocal"))
  for k in ("loss", "conversation_loss", "nli_loss", "grad_norm"):
    assert float(outs[1][0][k]) == pytest.approx(float(outs[0][0][k]), rel=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6), outs[0][1], outs[1][1])


def test_dan_multitask_learns_both_tasks_exports_and_reloads(tmp_path):
  folder = write_data(tmp_path)
  c = config_for(folder, "encoder=dan,multitask,runlocal", **{
      "train.max_steps": 60, "train.learning_rate": 3e-3, "train.checkpoint_every": 30,
      "model.min_count": 1, "model.embed_dim": 32, "model.hidden": (32, 32, 48),
      "model.response_ff_hidden": 64, "model.nli_hidden": (32,)})
  m = input_response.train_and_evaluate(c)
  assert m["nli_accuracy"] > 0.9  # the hypothesis's form decides the label
  assert m["syn_r_at_1"] > 0.9 > m["syn_r_at_1_before"]
  assert m["num_nli_pairs"] == 480 and m["steps"] == 60
  for key in ("stsb_test_pearson", "stsb_test_adapted_pearson", "stsb_test_pearson_before"):
    assert -1 <= m[key] <= 1
  # The exported DAN is the evaluate task's encoder: the same STS figures.
  e = evaluate_config.get_config(f"sts,init_from={tmp_path / 'run'}")
  e.workdir = str(tmp_path / "eval")
  e.data.sts_dir, e.data.sick_dir = c.data.sts_dir, ""
  again = evaluate.run(e)
  assert again["stsb_test_pearson"] == pytest.approx(m["stsb_test_pearson"], abs=1e-6)
  # Rerunning a finished run does nothing.
  weights = tmp_path / "run" / "model" / word_models.WEIGHTS
  written = weights.stat().st_mtime_ns
  input_response.train_and_evaluate(c)
  assert weights.stat().st_mtime_ns == written


def test_transformer_conversations_only_run_exports_an_hf_folder(tmp_path, tiny_bert_dir):
  folder = write_data(tmp_path)
  c = config_for(folder, f"init_from={tiny_bert_dir},runlocal", **{"train.max_steps": 4})
  m = input_response.train_and_evaluate(c)
  assert "nli_loss" not in json.dumps(m) and m["steps"] == 4
  assert (tmp_path / "run" / "model" / "config.json").is_file()
  assert {"syn_r_at_1", "syn_r_at_3", "syn_r_at_10", "stsb_dev_pearson"} <= set(m)


SMALLER = "num_hidden_layers=1,hidden_size=16,num_attention_heads=2,intermediate_size=24"


def test_rand_transformer_of_another_size_trains_and_exports_that_size(tmp_path, tiny_bert_dir):
  from transformers import AutoModel
  from convfit_jax import Encoder
  folder = write_data(tmp_path)
  c = config_for(folder, "init_from=rand,runlocal", **{
      "model.architecture": str(tiny_bert_dir), "model.architecture_overrides": SMALLER,
      "train.max_steps": 4})
  assert c.train.learning_rate == 5e-4  # from scratch, not the fine-tuning rate
  m = input_response.train_and_evaluate(c)
  assert m["steps"] == 4 and np.isfinite(m["stsb_test_pearson"])
  exported = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
  assert (exported["num_hidden_layers"], exported["hidden_size"], exported["intermediate_size"]) == (1, 16, 24)
  texts = ["does anyone know about grub here", "yes the wifi docs explain it"]
  ours = Encoder.from_pretrained(tmp_path / "run" / "model").encode(texts)
  assert ours.shape == (2, 16)
  torch_model = AutoModel.from_pretrained(tmp_path / "run" / "model")  # transformers reads it
  assert torch_model.config.num_hidden_layers == 1


def test_architecture_overrides_are_checked_field_by_field(tiny_bert_dir):
  from convfit_jax.models import sentence
  model, ck = sentence.init("rand", architecture=tiny_bert_dir, architecture_overrides=SMALLER)
  assert len(model.transformer.layers) == 1 and ck.config.hidden_size == 16
  assert ck.hf_config["num_attention_heads"] == 2 and ck.transformer == {}
  # rand_init: "normal" is BERT's N(0, 0.02) start, Glorot's word table is far smaller.
  words = lambda init: np.asarray(sentence.init("rand", architecture=tiny_bert_dir, rand_init=init,
                                                architecture_overrides=SMALLER)[0]
                                  .transformer.embeddings.word_embeddings.embedding[...])
  assert 0.019 < words("normal").std() < 0.021
  assert words("xavier").std() < 0.5 * words("normal").std()
  for overrides, message in (("num_layers=2", "'num_layers=2' is not field=value"),
                             ("hidden_size", "'hidden_size' is not field=value"),
                             ("hidden_size=wide", "hidden_size='wide' is not of type int"),
                             ("hidden_size=30", "not a multiple of num_attention_heads"),
                             ("architectures=BertModel", "architectures \\(list\\) cannot be overridden")):
    with pytest.raises(ValueError, match=message):
      sentence.init("rand", architecture=tiny_bert_dir, architecture_overrides=overrides)
  with pytest.raises(ValueError, match="needs model.init_from='rand'"):
    sentence.init(tiny_bert_dir, architecture_overrides=SMALLER)
