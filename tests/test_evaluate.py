"""The evaluate task and the intent evaluation it shares with Stage 2."""

import numpy as np
import pytest

from configs import evaluate as evaluate_config
from convfit_jax.data import intent
from convfit_jax.evaluators.intent_knn import evaluate_intents
from convfit_jax.tasks import evaluate


def test_evaluate_task_reports_knn_mlp_and_plot(tiny_bert_dir, tmp_path):
  c = evaluate_config.get_config(f"init_from={tiny_bert_dir},shots=3")
  c.workdir = str(tmp_path)
  c.evals.knn.max_test = 60
  c.evals.knn.mlp = True
  c.model.max_length = 16
  m = evaluate.run(c)
  assert m["num_train"] == 77 * 3 and m["num_pool"] == 77 * 3 and m["num_test"] == 60
  assert 0 <= m["knn_accuracy"] <= 1 and 0 <= m["mlp_accuracy"] <= 1
  assert (tmp_path / "tsne.png").stat().st_size > 10_000
  ex = m["examples"][0]
  assert ex["neighbours"][0][1] == ex["predicted"]  # 1-NN: the label of the nearest example


def test_larger_pool_without_retraining(tiny_bert_dir):
  c = evaluate_config.get_config("shots=2")
  c.data.pool_shots = 5
  data = intent.for_evaluation(c.data)
  assert len(data.train) == 77 * 2 and len(data.pool) == 77 * 5
  assert set(data.train.texts) <= set(data.pool.texts)


def test_clinc_oos_is_a_threshold_not_an_intent(minilm_dir):
  from convfit_jax import Encoder
  c = evaluate_config.get_config("dataset=clinc150,shots=2,oos")
  data = intent.for_evaluation(c.data, oos=c.evals.knn.oos)
  oos_id = data.label_names.index("oos")
  assert oos_id not in data.train.labels and oos_id not in data.pool.labels
  assert oos_id in data.test.labels and oos_id in data.val.labels
  rng = np.random.default_rng(0)
  pick = lambda split, n: split.subset(np.sort(rng.choice(len(split), n, replace=False)))
  small = type(data)(data.name, data.label_names, data.train, data.pool, pick(data.test, 300),
                     pick(data.val, 300), data.full_train)
  m = evaluate_intents(Encoder.from_pretrained(minilm_dir, max_length=32), small, oos=True)
  assert {"oos_threshold", "in_scope_accuracy", "oos_recall"} <= set(m)
  assert 0 < m["oos_recall"] <= 1


def test_unknown_dataset_lists_the_known_ones():
  c = evaluate_config.get_config("dataset=banking78")
  with pytest.raises(ValueError, match="banking77"):
    intent.for_evaluation(c.data)


def test_response_sets_choose_the_evaluations_by_name():
  c = evaluate_config.get_config("responses,response_sets=sgd_test_rs100+ubuntu_irc_test_rs10")
  assert sorted(c.evals) == ["sgd_test_rs100", "ubuntu_irc_test_rs10"]
  assert c.evals.sgd_test_rs100.file.endswith("sgd/test_rs100.jsonl")
  with pytest.raises(ValueError, match="sgd_test_rs100"):
    evaluate_config.get_config("responses,response_sets=sgd_test_rs10")


def test_a_stage_workdir_is_a_starting_point(tiny_bert_dir, tmp_path):
  """`init_from` a Stage 1/2 workdir takes its exported model/ folder (lm+s1 and lm+s1+s2 rows)."""
  import shutil
  from convfit_jax.models import sentence
  shutil.copytree(tiny_bert_dir, tmp_path / "stage1" / "model")
  model, ck = sentence.init(tmp_path / "stage1")
  assert ck.tokenizer_dir == tmp_path / "stage1" / "model"
  ref, _ = sentence.init(tiny_bert_dir)
  np.testing.assert_array_equal(model.transformer.layers[0].output.kernel[...],
                                ref.transformer.layers[0].output.kernel[...])


class _CharCounts:
  """A `TextEncoder` that is no neural network: letter counts."""

  def encode(self, texts, *, batch_size=128, normalize=None):
    del batch_size, normalize
    x = np.zeros((len(texts), 64), np.float32)
    for i, t in enumerate(texts):
      for ch in t.lower():
        x[i, ord(ch) % 64] += 1
    return x


def test_evaluators_by_name_take_any_encoder_or_scorer(tmp_path):
  from conftest import REPO
  from convfit_jax import evaluators
  from convfit_jax.configs import common
  from convfit_jax.evaluators.response_selection import BiEncoderScorer
  c = evaluate_config.get_config("shots=2")
  c.evals.knn.max_test, c.evals.knn.tsne = 100, False
  c.evals.rs = common.response_selection_eval(
      file=str(REPO / "tests" / "fixtures" / "sgd_test_rs100.jsonl"), num_cases=6)
  evals = evaluators.from_config(c.evals, run_config=c, workdir=tmp_path)
  enc = _CharCounts()
  m = evals["knn"][0]({"text": enc}, when="")
  assert m["num_test"] == 100 and 0 < m["knn_accuracy"] < 1

  unit = lambda texts, batch_size: enc.encode(texts) / np.linalg.norm(enc.encode(texts), axis=1,
                                                                       keepdims=True)
  rs, _ = evals["rs"]
  m = rs({"response_scorer": BiEncoderScorer(unit, unit)}, when="after")
  assert set(m) == {"r_at_1", "r_at_3", "r_at_10", "r_at_50", "mrr", "dstc7"}

  class Oracle:
    """A pairwise scorer (what a cross-encoder plugs in) that knows each case's answer."""

    def score(self, cases, *, batch_size=128):
      return np.asarray([[float(c == cands[label]) for c in cands]
                         for cands, label in zip(cases.candidates, cases.labels)])

  c.evals.rs.prefix = "sgd_"
  rs, _ = evaluators.from_config(c.evals, run_config=c, workdir=tmp_path)["rs"]
  assert rs({"response_scorer": Oracle()}, when="after")["sgd_r_at_1"] == 1.0
  with pytest.raises(ValueError, match="known: byte_error, intent_knn, nli, response_selection, sts"):
    evaluators.get("bleu")


def test_validation_split_for_model_selection(tmp_path):
  """`split="val"` scores the validation rows, and only where training cannot have seen them."""
  from convfit_jax.evaluators.intent_knn import Evaluator
  c = evaluate_config.get_config("shots=2")
  c.evals.knn.split = "val"
  with pytest.raises(ValueError, match="train_minus_val"):
    Evaluator(c.evals.knn, run_config=c, workdir=tmp_path)
  c.data.train_split = "train_minus_val"
  e = Evaluator(c.evals.knn, run_config=c, workdir=tmp_path)
  assert e.test.texts == e.data.val.texts and not set(e.test.texts) & set(e.data.full_train.texts)
  c.evals.knn.split = "dev"
  with pytest.raises(ValueError, match="known: test, val"):
    Evaluator(c.evals.knn, run_config=c, workdir=tmp_path)
  clinc = evaluate_config.get_config("dataset=clinc150,shots=2,oos")
  clinc.evals.knn.split = "val"
  with pytest.raises(ValueError, match="threshold"):
    Evaluator(clinc.evals.knn, run_config=clinc, workdir=tmp_path)


def test_evaluate_task_reads_an_encoder_as_a_dual_encoder(tiny_bert_dir, tmp_path):
  from conftest import REPO
  c = evaluate_config.get_config(f"init_from={tiny_bert_dir},responses,workdir={tmp_path}")
  assert set(c.evals) == {"ubuntu_irc_test_rs10", "ubuntu_irc_test_rs100", "sgd_test_rs100"}
  for name in ("ubuntu_irc_test_rs10", "ubuntu_irc_test_rs100"):
    del c.evals[name]
  c.evals.sgd_test_rs100.file = str(REPO / "tests" / "fixtures" / "sgd_test_rs100.jsonl")
  m = evaluate.run(c)
  assert set(m) == {f"sgd_test_rs100_{k}" for k in ("r_at_1", "r_at_3", "r_at_10", "r_at_50", "mrr", "dstc7")}
  c.model.init_from = "tfidf"
  tfidf = evaluate.run(c)
  assert 0 < tfidf["sgd_test_rs100_mrr"] <= 1


def test_tfidf_scorer_is_the_cosine_of_tfidf_vectors():
  from sklearn.feature_extraction.text import TfidfVectorizer
  from convfit_jax.data.conversations import ResponseSelectionSet
  from convfit_jax.evaluators.response_selection import TfidfScorer
  cases = ResponseSelectionSet(("mount it", "wifi?"), (("hi", "mount it"), ("wifi?",)),
                               (("use mount", "reboot"), ("reboot", "check wifi driver")),
                               np.array([0, 1], np.int32))
  got = TfidfScorer().score(cases)
  v = TfidfVectorizer().fit(["hi mount it", "wifi?", "check wifi driver", "reboot", "use mount"])
  want = (v.transform(["hi mount it"]) @ v.transform(["use mount", "reboot"]).T).toarray()[0]
  np.testing.assert_allclose(got[0], want, atol=1e-6)
  assert got[1, 1] > 0 == got[1, 0]
