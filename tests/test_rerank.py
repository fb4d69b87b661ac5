"""The reranker task end to end on synthetic conversations: ESIM learns, resumes, scores whole
cases; the cross-encoder trains and exports; inputs are cut as documented."""

import json

import numpy as np
import pytest

from configs import evaluate as evaluate_config
from configs import rerank_cross as cross_config
from configs import rerank_esim as esim_config
from configs import retrieve_rerank as retrieve_config
from convfit_jax import models, sharding
from convfit_jax.data import words
from convfit_jax.data.conversations import read_response_selection
from convfit_jax.evaluators.metrics import response_selection_metrics as metrics_of
from convfit_jax.tasks import evaluate, retrieve_rerank
from convfit_jax.train import rerank

from resume import weights_before_and_after_a_kill

TOPICS = ("wifi", "printer", "sound", "mount", "kernel", "grub", "python", "apache", "nvidia",
          "samba", "firefox", "cron")


def _write_data(folder, rows=256, cases=24, seed=0):
  """Histories about one topic; the true response names it, a random one another topic."""
  rng = np.random.default_rng(seed)
  history = lambda t: f"hello all __eou__ question about {t} __eou__ anyone know {t} well ?"
  reply = lambda t: f"check the {t} logs first"
  lines = ["history\tresponse\tlabel"]
  for _ in range(rows // 2):
    t, other = rng.choice(len(TOPICS), 2, replace=False)
    lines += [f"{history(TOPICS[t])}\t{reply(TOPICS[t])}\t1",
              f"{history(TOPICS[t])}\t{reply(TOPICS[other])}\t0"]
  (folder / "train.tsv").write_text("\n".join(lines) + "\n")
  with open(folder / "rs10.jsonl", "w") as f:
    for _ in range(cases):
      topics = rng.choice(len(TOPICS), 10, replace=False)
      label = int(rng.integers(10))
      h = history(TOPICS[topics[label]])
      f.write(json.dumps({"context": h.split(" __eou__ ")[-1], "history": h,
                          "candidates": [reply(TOPICS[t]) for t in topics], "label": label}) + "\n")


def _config(module, arg, folder, **extra):
  c = module.get_config(arg)
  c.workdir = str(folder / "run")
  c.data.train = str(folder / "train.tsv")
  c.data.max_rows = 0
  with c.unlocked():
    for name in ("test_rs10", "test_rs100"):
      del c.evals[name]
  c.evals.dev_rs10.file = str(folder / "rs10.jsonl")
  c.evals.dev_rs10.num_cases = 0
  c.evals.dev_rs10.prefix = "syn_"
  for k, v in extra.items():
    section, field = k.split(".")
    c[section][field] = v
  return c


def test_esim_learns_to_match_and_a_killed_run_resumes_to_the_same_weights(tmp_path):
  _write_data(tmp_path)
  c = _config(esim_config, "runlocal", tmp_path, **{
      "model.vectors": "", "model.embed_dim": 16, "model.hidden": 16, "model.min_count": 1,
      "train.batch_size": 16, "train.epochs": 40, "train.max_steps": 640,
      "train.learning_rate": 1e-2, "train.checkpoint_every": 160, "train.log_every": 40})
  m = rerank.train_and_evaluate(c)
  assert m["num_pairs"] == 256 and m["steps_per_epoch"] == 16
  assert set(m) >= {"syn_r10_at_1", "syn_r10_at_2", "syn_r10_at_5", "syn_mrr", "syn_r10_at_1_before"}
  assert m["syn_r10_at_1"] >= 0.8 > m["syn_r10_at_1_before"]  # 21 or more of 24 cases
  run = tmp_path / "run"
  first, again = weights_before_and_after_a_kill(run, 640, lambda: rerank.train_and_evaluate(c))
  for k in first:
    np.testing.assert_allclose(again[k], first[k], atol=1e-6, err_msg=k)

  # The finished run scores cases again through the evaluate task, also in bfloat16.
  e = evaluate_config.get_config(f"responses,init_from={run},workdir={tmp_path / 'eval'}")
  with e.unlocked():
    for name in ("ubuntu_irc_test_rs100", "sgd_test_rs100"):
      del e.evals[name]
  e.evals.ubuntu_irc_test_rs10.file = str(tmp_path / "rs10.jsonl")
  e.evals.ubuntu_irc_test_rs10.prefix = "syn_"
  assert evaluate.run(e)["syn_mrr"] == pytest.approx(m["syn_mrr"], abs=1e-6)
  assert rerank.load_reranker(run, dtype="bfloat16")[0].config.dtype == "bfloat16"
  e.model.dtype = "bfloat16"
  e.workdir = str(tmp_path / "eval_bf16")
  assert evaluate.run(e)["syn_mrr"] == pytest.approx(m["syn_mrr"], abs=0.05)


def test_sentence_lstm_trains_exports_and_reloads_with_oov_buckets(tmp_path):
  _write_data(tmp_path, rows=64, cases=6)
  c = _config(esim_config, "model=sentence_lstm,runlocal", tmp_path, **{
      "model.vectors": "", "model.embed_dim": 8, "model.hidden": 8, "model.attention_dim": 8,
      "model.oov_buckets": 5, "train.batch_size": 16, "train.max_steps": 4})
  m = rerank.train_and_evaluate(c)
  assert np.isfinite(m["syn_mrr"]) and (tmp_path / "run" / "model" / "word_model.json").is_file()
  model, inputs = rerank.load_reranker(tmp_path / "run")
  assert words.Vocabulary.load(tmp_path / "run" / "model" / "vocab.txt").oov_buckets == 5
  cases = read_response_selection(tmp_path / "rs10.jsonl")
  got = metrics_of(rerank.PairScorer(model, inputs).score(cases, batch_size=8), cases.labels)
  assert got["mrr"] == pytest.approx(m["syn_mrr"], abs=1e-6)


def test_a_run_goes_on_from_a_finished_one_and_refuses_other_sizes(tmp_path):
  _write_data(tmp_path, rows=64, cases=6)
  sizes = {"model.vectors": "", "model.embed_dim": 8, "model.hidden": 8, "model.oov_buckets": 3,
           "train.batch_size": 16, "train.max_steps": 8, "train.learning_rate": 1e-2}
  first = rerank.train_and_evaluate(_config(esim_config, "runlocal", tmp_path, **sizes))
  again = _config(esim_config, "runlocal", tmp_path, **{
      **sizes, "model.init_from": str(tmp_path / "run"), "model.min_count": 50,
      "train.max_steps": 4})
  again.workdir = str(tmp_path / "again")
  m = rerank.train_and_evaluate(again)
  # Its "before" is the first run's end: same weights, same vocabulary (min_count unused).
  assert m["syn_mrr_before"] == pytest.approx(first["syn_mrr"], abs=1e-6)
  assert m["init_from"] == str(tmp_path / "run" / "model")
  again.model.hidden = 16
  again.workdir = str(tmp_path / "other")
  with pytest.raises(ValueError, match=r"model.hidden=16, but model.init_from .* with 8"):
    rerank.train_and_evaluate(again)


def test_batches_are_a_function_of_the_step(tmp_path):
  _write_data(tmp_path, rows=64)
  c = _config(esim_config, "runlocal", tmp_path, **{"model.vectors": "", "model.embed_dim": 8,
                                                    "model.hidden": 8, "train.batch_size": 16,
                                                    "train.epochs": 10})
  task = rerank.Rerank(c, sharding.make_mesh(1))
  from_zero = list(task.batches(0))
  from_five = list(task.batches(5))
  assert len(from_zero) == task.total_steps == 30
  for a, b in zip(from_zero[5:], from_five):
    np.testing.assert_array_equal(a, b)
  epoch = np.concatenate(from_zero[:4])  # 64 rows, 4 steps an epoch: each row once
  assert sorted(epoch.tolist()) == list(range(64))


def test_pair_scorer_reads_each_case_history_with_each_candidate(tmp_path):
  _write_data(tmp_path, rows=32, cases=3)
  cases = read_response_selection(tmp_path / "rs10.jsonl")
  seen = []

  class Recorder:
    def margins(self, histories, responses, *, batch_size):
      seen.extend(zip(histories, responses))
      return np.arange(len(histories), dtype=np.float32)

  scores = rerank.PairScorer.score(Recorder(), cases, batch_size=4)
  assert scores.shape == (3, 10) and scores[1, 0] == 10
  assert seen[10] == (" __eou__ ".join(cases.histories[1]), cases.candidates[1][0])
  assert "hello all __eou__ question about" in seen[0][0]


def test_pairs_are_scored_grouped_by_widths_then_by_history():
  w = lambda n: " ".join(["w"] * n)
  a, b, c = w(3), w(40), w(5)
  histories, responses = [a, b, a, c, a], [w(9), w(1), w(20), w(2), w(3)]
  words_inputs = models.PairInputs(None, lengths=lambda h, r: (
      np.array([len(t.split()) for t in h]), np.array([len(t.split()) for t in r])))
  # History widths 16, 48, 16, 16, 16 and response widths 16, 16, 24, 16, 16: history a's
  # two short responses (by length), c's, a's long one, then the wide history.
  assert rerank.scoring_order(words_inputs, histories, responses).tolist() == [4, 0, 3, 2, 1]
  # One sequence a pair (the cross-encoder): history characters, then response characters.
  assert rerank.scoring_order(models.PairInputs(None), histories, responses).tolist() == [4, 0, 2, 3, 1]


@pytest.mark.parametrize("name", ["esim", "sentence_lstm"])
def test_each_distinct_history_encoded_once_scores_as_every_pair_with_its_own(tmp_path, name):
  _write_data(tmp_path, rows=32, cases=5)
  c = _config(esim_config, f"model={name},runlocal", tmp_path, **{
      "model.vectors": "", "model.embed_dim": 8, "model.hidden": 8})
  cases = read_response_selection(tmp_path / "rs10.jsonl")
  histories = [" __eou__ ".join(h) for h in cases.histories for _ in range(10)]
  responses = [r for cands in cases.candidates for r in cands]
  module = models.get(name)
  built = module.build(c.model, seed=0, train_texts=lambda: histories + responses)
  built.model.eval()  # as scorers run it: all-padding LSTM steps skipped
  inputs = module.pair_inputs(built, c.model)
  shared = inputs.shared_contexts(histories[:23], responses[:23])
  assert len(shared["context_ids"]) == 4 and shared["context_index"].tolist() == sorted(
      shared["context_index"].tolist())  # 3 distinct histories, a power of two rows
  scorer = rerank.PairScorer(built.model, inputs)
  own = rerank.PairScorer(built.model, models.PairInputs(inputs.encode, lengths=inputs.lengths))
  # 50 pairs in chunks of 16: the last chunk is filled with copies of its first pair.
  want = own.margins(histories, responses, batch_size=16)
  np.testing.assert_allclose(scorer.margins(histories, responses, batch_size=16), want, atol=1e-5)
  # At most one compiled scorer kept: each new chunk shape drops the one before.
  with pytest.MonkeyPatch.context() as patch:
    patch.setattr(rerank, "MAX_COMPILED_SCORERS", 1)
    np.testing.assert_allclose(own.margins(histories, responses, batch_size=8), want, atol=1e-5)
    assert rerank._margins._cache_size() == 1  # pylint: disable=protected-access


def test_cross_encoder_trains_and_exports(tiny_bert_dir, tmp_path):
  _write_data(tmp_path, rows=64, cases=6)
  c = _config(cross_config, f"init_from={tiny_bert_dir},runlocal", tmp_path, **{
      "train.batch_size": 8, "train.max_steps": 6, "train.checkpoint_every": 3})
  m = rerank.train_and_evaluate(c)
  assert 0 <= m["syn_r10_at_1"] <= 1 and np.isfinite(m["syn_mrr"])
  out = tmp_path / "run" / "model"
  assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
  head = np.load(out / "head.npz")
  assert head["classifier.kernel"].shape == (32, 2)
  model, inputs = rerank.load_reranker(tmp_path / "run")
  cases = read_response_selection(tmp_path / "rs10.jsonl")
  trained = rerank.train_and_evaluate(c)  # finished: nothing reruns, metrics as written
  assert rerank.PairScorer(model, inputs).score(cases, batch_size=8).shape == (6, 10)
  got = metrics_of(rerank.PairScorer(model, inputs).score(cases, batch_size=8), cases.labels)
  assert got["mrr"] == pytest.approx(trained["syn_mrr"], abs=1e-6)

  # The trained run as the reranker of a retrieval over every candidate of the file.
  rr = retrieve_config.get_config(f"retriever={tiny_bert_dir},reranker={tmp_path / 'run'},k=5,"
                                  f"workdir={tmp_path / 'rr'}")
  rr.data.file = str(tmp_path / "rs10.jsonl")
  (tmp_path / "dev").mkdir()
  _write_data(tmp_path / "dev", rows=2, cases=8, seed=1)
  rr.data.dev_file = str(tmp_path / "dev" / "rs10.jsonl")
  m = retrieve_rerank.run(rr)
  assert m["pool_size"] == len({t for cands in cases.candidates for t in cands}) == 12
  assert m["num_queries"] == 6 and m["retrieval_r_at_1"] <= m["retrieval_r_at_5"]
  # The reranker reorders the top 5 only: it finds no answer the retriever left out.
  assert m["rerank_r_at_10"] == m["retrieval_r_at_5"] and m["rerank_r_at_1"] <= m["retrieval_r_at_5"]
  assert m["fused_r_at_10"] == m["retrieval_r_at_5"] and 0 < m["fused_mrr"] <= 1
  # The interpolation weight is the dev file's best; weight 0 (retrieval's order) is a candidate.
  assert m["interpolation_weight"] in retrieve_rerank.WEIGHTS
  assert m["dev_interpolated_mrr"] >= m["dev_retrieval_mrr"]
  assert m["interpolated_r_at_10"] == m["retrieval_r_at_5"] and 0 < m["interpolated_mrr"] <= 1


def test_the_interpolation_weight_is_the_smallest_with_the_best_mrr():
  cosines = np.array([[0.9, 0.8], [0.9, 0.1]])
  margins = np.array([[0.0, 1.0], [0.0, 2.0]])
  inside = np.array([[False, True], [True, False]])
  # Query 0 needs w > 0.1 (at 0.1 a tie ranks its answer last), query 1 w < 0.4.
  w, mrr = retrieve_rerank.choose_weight(cosines, margins, inside)
  assert w == pytest.approx(10 ** -0.75) and mrr[0] == 0.75 and mrr.max() == 1.0
  assert retrieve_rerank.choose_weight(cosines[1:], margins[1:], inside[1:])[0] == 0.0


def test_reciprocal_rank_fusion_and_the_answers_rank_in_the_cut():
  retriever = np.array([[0.9, 0.8, 0.7], [0.5, 0.5, 0.1]])
  reranker = np.array([[0.0, 2.0, 1.0], [3.0, 1.0, 2.0]])
  fused = retrieve_rerank.reciprocal_rank_fusion(retriever, reranker, k=1)
  # Query 0: ranks (1, 2, 3) and (3, 1, 2); query 1: (1, 2, 3) (a tie goes to the lower
  # index) and (1, 3, 2).
  np.testing.assert_allclose(fused, [[1 / 2 + 1 / 4, 1 / 3 + 1 / 2, 1 / 4 + 1 / 3],
                                     [1 / 2 + 1 / 2, 1 / 3 + 1 / 4, 1 / 4 + 1 / 3]])
  inside = np.array([[True, False, False], [False, False, False]])
  ranks = retrieve_rerank.rank_in_cut(fused, inside)
  assert ranks[0] == 2 and np.isinf(ranks[1])  # 0.75 behind 0.83; query 1's answer is not in the cut
  # Ties rank the answer last.
  assert retrieve_rerank.rank_in_cut(np.ones((1, 3)), np.array([[True, False, False]]))[0] == 3


def test_a_querys_own_turns_leave_its_pool_unless_one_is_the_answer():
  pool = ["hi", "mount it", "reboot", "thanks"]
  scores = np.ones((2, 4), np.float32)
  histories = (("hi", "mount it"), ("thanks", "reboot", "not in the pool"))
  # Query 1's answer repeats one of its turns: it stays.
  mean = retrieve_rerank.exclude_own_turns(scores, pool, histories, np.array([2, 3]))
  assert mean == 1.5
  np.testing.assert_array_equal(scores, [[-np.inf, -np.inf, 1, 1], [1, 1, -np.inf, 1]])

