"""Mining a reranker's training negatives with a dual encoder: the draw from the ranks, and
the written file on synthetic conversations, where real MiniLM weights find the hard ones."""

import numpy as np
import pytest

from configs import hard_negatives as hn_config
from convfit_jax.data.conversations import EOU, read_labelled_pairs
from convfit_jax.tasks import hard_negatives

TOPICS = ("wifi", "printer", "sound", "mount", "kernel", "grub", "python", "apache")


def test_draws_come_from_the_window_of_ranks_without_the_answer_or_excluded_entries():
  scores = np.array([[9, 8, 7, 6, 5, 4], [1, 2, 3, 4, 5, -np.inf]], np.float32)
  answer = np.array([1, 4])
  for seed in range(20):
    got = hard_negatives.draw_negatives(scores, answer, skip=1, depth=3, count=2,
                                        rng=np.random.default_rng(seed))
    # Query 0 without its answer ranks 0, 2, 3, 4, 5: skip one, keep three -> {2, 3, 4}.
    # Query 1: 3, 2, 1, 0 (5 is -inf) -> {2, 1, 0}.
    assert set(got[0]) <= {2, 3, 4} and set(got[1]) <= {0, 1, 2}
    assert len(set(got[0])) == len(set(got[1])) == 2
  again = lambda: hard_negatives.draw_negatives(scores, answer, skip=1, depth=3, count=2,
                                                rng=np.random.default_rng(7))
  np.testing.assert_array_equal(again(), again())
  with pytest.raises(ValueError, match="query 1 has 1 candidates at ranks 4-6"):
    hard_negatives.draw_negatives(scores, answer, skip=3, depth=3, count=2,
                                  rng=np.random.default_rng(0))


def _write_pairs(folder):
  """Per topic four contexts (a greeting, then a question about the topic) whose true reply
  names the topic and the question's number; one random reply of another topic each."""
  rng = np.random.default_rng(0)
  question = lambda t, k: f"question {k} about my {t} setup"
  reply = lambda t, k: f"for the {t} problem {k} read the {t} manual"
  lines = ["history\tresponse\tlabel"]
  for t in TOPICS:
    for k in range(4):
      other = TOPICS[(TOPICS.index(t) + 1 + rng.integers(len(TOPICS) - 1)) % len(TOPICS)]
      history = f"hello everyone{EOU}{question(t, k)}"
      lines += [f"{history}\t{reply(t, k)}\t1", f"{history}\t{reply(other, k)}\t0"]
  (folder / "train.tsv").write_text("\n".join(lines) + "\n")
  return folder / "train.tsv"


def test_mined_negatives_are_the_retrievers_near_misses_in_a_labelled_pairs_file(tmp_path, minilm_dir):
  source = _write_pairs(tmp_path)

  def mine(workdir):
    c = hn_config.get_config(f"negatives=2,workdir={tmp_path / workdir}")
    c.data.train = str(source)
    c.retriever.init_from = str(minilm_dir)
    c.mine.depth = 3
    c.mine.chunk = 5  # several chunks
    return hard_negatives.run(c), (tmp_path / workdir / "train.tsv").read_text()

  metrics, text = mine("a")
  assert mine("b")[1] == text  # a function of the seed
  pairs = read_labelled_pairs(tmp_path / "a" / "train.tsv")
  n = len(TOPICS) * 4
  assert (metrics["contexts"], metrics["pool_size"], metrics["rows"]) == (n, n, 4 * n)
  assert len(pairs) == 4 * n and metrics["positive_share"] == 0.25
  same_topic = []
  for i in range(0, len(pairs), 4):  # true row, two mined, the file's random one
    assert list(pairs.labels[i:i + 4]) == [1, 0, 0, 0]
    assert len(set(pairs.histories[i:i + 4])) == 1
    topic = pairs.histories[i].split()[-2]
    assert pairs.responses[i] not in pairs.responses[i + 1:i + 3]
    same_topic += [f" {topic} " in r for r in pairs.responses[i + 1:i + 3]]
  # The other three replies of the same topic are the nearest misses; at random, 3 of 31.
  assert np.mean(same_topic) > 0.8
  assert metrics["train_r_at_10"] > 0.5
