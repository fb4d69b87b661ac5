"""Import and export of HF / sentence-transformers folders."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from sentence_transformers import SentenceTransformer
from transformers import AutoModel, AutoTokenizer

from convfit_jax import Encoder, hf_io, torch_pickle
from convfit_jax.models import sentence

TEXTS = ["how do I top up my card?", "my card was declined", "", "set an alarm for 7 am please",
         "what is the exchange rate between the euro and the dollar right now?"]


def _copy_with_weights(src, dst, edit):
  shutil.copytree(src, dst)
  weights = load_file(str(dst / "model.safetensors"))
  save_file(edit(weights), str(dst / "model.safetensors"))
  return dst


def test_missing_and_unexpected_weights_are_listed(tiny_bert_dir, tmp_path):
  def edit(w):
    w = dict(w)
    del w["encoder.layer.1.output.dense.bias"]
    w["encoder.layer.0.extra.weight"] = np.zeros(3, np.float32)
    return w
  folder = _copy_with_weights(tiny_bert_dir, tmp_path / "bad", edit)
  with pytest.raises(ValueError) as e:
    hf_io.load(folder)
  assert "encoder.layer.1.output.dense.bias" in str(e.value)
  assert "encoder.layer.0.extra.weight" in str(e.value)


def test_prefixes_gamma_beta_and_heads_are_handled(tiny_bert_dir, tmp_path):
  def edit(w):
    out = {}
    for k, v in w.items():
      k = k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta")
      out["bert." + k] = v
    out["cls.predictions.bias"] = np.zeros(4, np.float32)
    out["bert.pooler.dense.weight"] = np.zeros((32, 32), np.float32)
    return out
  folder = _copy_with_weights(tiny_bert_dir, tmp_path / "renamed", edit)
  a = hf_io.load(tiny_bert_dir).transformer
  b = hf_io.load(folder).transformer
  assert a.keys() == b.keys()
  for k in a:
    np.testing.assert_array_equal(a[k], b[k])


def test_pytorch_bin_folder_loads_without_torch(tiny_bert_dir, tmp_path):
  folder = tmp_path / "bin"
  shutil.copytree(tiny_bert_dir, folder)
  weights = load_file(str(folder / "model.safetensors"))
  (folder / "model.safetensors").unlink()
  # A transposed (non-contiguous) view and a bf16 tensor exercise strides and dtypes.
  sd = {k: torch.from_numpy(v) for k, v in weights.items()}
  sd["pooler.dense.weight"] = torch.randn(32, 32).t()
  torch.save(sd, folder / "pytorch_model.bin")
  torch.save({"w": torch.arange(6.0).reshape(2, 3).t(), "b": torch.ones(2, dtype=torch.bfloat16)},
             tmp_path / "small.bin")
  # torch made the files; a process that cannot import torch reads them.
  code = ("import sys; sys.modules['torch'] = None\n"
          "import numpy as np\n"
          "from convfit_jax import hf_io, torch_pickle\n"
          f"got = hf_io.load({str(folder)!r}).transformer\n"
          f"np.savez({str(tmp_path / 'got.npz')!r}, **got)\n"
          f"small = torch_pickle.load_state_dict({str(tmp_path / 'small.bin')!r})\n"
          "assert small['w'].tolist() == [[0, 3], [1, 4], [2, 5]], small['w']\n"
          "assert small['b'].astype('float32').tolist() == [1, 1]\n")
  r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-2000:]
  got = np.load(tmp_path / "got.npz")
  ref = hf_io.load(tiny_bert_dir).transformer
  for k in ref:
    np.testing.assert_array_equal(got[k], ref[k])


def test_pickles_that_run_code_are_refused(tmp_path):
  import pickle
  import zipfile
  with zipfile.ZipFile(tmp_path / "evil.bin", "w") as zf:
    zf.writestr("archive/data.pkl", pickle.dumps({"x": print}))
  with pytest.raises(pickle.UnpicklingError, match="refusing to load builtins.print"):
    torch_pickle.load_state_dict(tmp_path / "evil.bin")


def test_unresolvable_name_says_where_it_looked(monkeypatch):
  monkeypatch.setenv("HF_HUB_OFFLINE", "1")
  with pytest.raises(FileNotFoundError) as e:
    hf_io.resolve("nobody/no-such-model")
  msg = str(e.value)
  assert "local folder" in msg and "HF cache" in msg and "HF_HUB_OFFLINE" in msg


def test_minilm_name_resolves_to_the_package(minilm_dir):
  assert hf_io.resolve("sentence-transformers/all-MiniLM-L6-v2") == minilm_dir


@pytest.mark.parametrize("kind", ["bert", "roberta", "mpnet"])
def test_round_trip_loads_in_transformers_and_sentence_transformers(kind, tiny_bert_dir, tiny_roberta_dir,
                                                                   tiny_mpnet_dir, tmp_path):
  src = {"bert": tiny_bert_dir, "roberta": tiny_roberta_dir, "mpnet": tiny_mpnet_dir}[kind]
  enc = Encoder.from_pretrained(src, max_length=32)
  ref = enc.encode(TEXTS)
  out = tmp_path / "export"
  enc.save_pretrained(out)
  # Re-import.
  np.testing.assert_allclose(Encoder.from_pretrained(out, max_length=32).encode(TEXTS), ref, atol=1e-5)
  # sentence-transformers keeps mean pooling.
  st = SentenceTransformer(str(out), device="cpu")
  np.testing.assert_allclose(st.encode(TEXTS, convert_to_numpy=True), ref, atol=1e-5)
  # transformers: mean of the last hidden states.
  tok = AutoTokenizer.from_pretrained(str(out))
  model = AutoModel.from_pretrained(str(out)).eval()
  batch = tok(TEXTS, padding=True, truncation=True, max_length=32, return_tensors="pt")
  with torch.no_grad():
    hidden = model(**batch).last_hidden_state
  m = batch["attention_mask"].unsqueeze(-1).float()
  pooled = ((hidden * m).sum(1) / m.sum(1)).numpy()
  np.testing.assert_allclose(pooled, ref, atol=1e-5)


def test_projection_head_exports_as_dense_tanh(tiny_bert_dir, tmp_path):
  model, ck = sentence.load(tiny_bert_dir, projection_dim=16, seed=3)
  tok = AutoTokenizer.from_pretrained(str(tiny_bert_dir))
  enc = Encoder(model, tok, max_length=32, normalize=True, hf_config=ck.hf_config)
  ref = enc.encode(TEXTS)
  enc.save_pretrained(tmp_path / "proj")
  modules = json.loads((tmp_path / "proj" / "modules.json").read_text())
  assert [m["type"].rsplit(".", 1)[1] for m in modules] == ["Transformer", "Pooling", "Dense", "Normalize"]
  st = SentenceTransformer(str(tmp_path / "proj"), device="cpu")
  np.testing.assert_allclose(st.encode(TEXTS), ref, atol=1e-5)
  again = Encoder.from_pretrained(tmp_path / "proj", max_length=32)
  assert again.dim == 16 and again.normalize
  np.testing.assert_allclose(again.encode(TEXTS), ref, atol=1e-5)
