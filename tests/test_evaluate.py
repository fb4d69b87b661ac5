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
