"""The cross-encoder against transformers' BertForSequenceClassification, and its pair inputs."""

import numpy as np
import pytest
import jax.numpy as jnp

from convfit_jax.configs import common
from convfit_jax.models import cross_encoder


def _model_config(init_from, max_length=64, max_response=16):
  m = common.model_config(str(init_from), name="cross_encoder")
  m.max_length, m.max_response = max_length, max_response
  return m


def test_logits_match_bert_for_sequence_classification(minilm_dir):
  torch = pytest.importorskip("torch")
  from transformers import BertForSequenceClassification
  m = _model_config(minilm_dir)
  built = cross_encoder.build(m, seed=0, train_texts=lambda: ())
  ref = BertForSequenceClassification.from_pretrained(str(minilm_dir), num_labels=2).eval()
  with torch.no_grad():  # the new classifier is ours; the pooler is the checkpoint's in both
    ref.classifier.weight.copy_(torch.tensor(np.asarray(built.model.classifier.kernel[...]).T))
    ref.classifier.bias.copy_(torch.tensor(np.asarray(built.model.classifier.bias[...])))
  np.testing.assert_allclose(np.asarray(built.model.pooler.kernel[...]),
                             ref.bert.pooler.dense.weight.detach().numpy().T)
  inputs = cross_encoder.pair_inputs(built, m)(
      ["my wifi drops __eou__ which card do you have?", "how do i mount a usb drive"],
      ["an intel one", "sudo mount /dev/sdb1 /mnt"])
  got = built.model(jnp.asarray(inputs["ids"]), jnp.asarray(inputs["mask"]),
                    jnp.asarray(inputs["type_ids"]))
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(inputs["ids"], dtype=torch.long),
               attention_mask=torch.tensor(inputs["mask"], dtype=torch.long),
               token_type_ids=torch.tensor(inputs["type_ids"], dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-4)


def test_pair_inputs_cut_the_context_from_the_left_and_the_response_from_the_right(minilm_dir):
  m = _model_config(minilm_dir, max_length=16, max_response=4)
  built = cross_encoder.build(m, seed=0, train_texts=lambda: ())
  tok = built.tokenizer
  inputs = cross_encoder.pair_inputs(built, m)(
      ["one two three four five six seven eight nine ten eleven twelve thirteen"],
      ["alpha beta gamma delta epsilon zeta"])
  ids = inputs["ids"][0]
  text = tok.decode(ids[inputs["mask"][0] == 1])
  assert text == "[CLS] five six seven eight nine ten eleven twelve thirteen [SEP] alpha beta gamma delta [SEP]"
  assert inputs["mask"][0].sum() == 16 and list(inputs["type_ids"][0][-5:]) == [1] * 5
  short = cross_encoder.pair_inputs(built, m)(["hi"], ["yo"])
  assert short["ids"].shape == (1, 16) and short["mask"][0].sum() == 5
  with pytest.raises(ValueError, match="max_response=14"):
    cross_encoder.pair_inputs(built, _model_config(minilm_dir, max_length=16, max_response=14))


@pytest.mark.parametrize("arch", ["mpnet", "roberta"])
def test_logits_match_the_classification_heads_of_mpnet_and_roberta(arch, request):
  """MPNet/RoBERTa have no pretrained pooler: their HF heads are dense + tanh on <s> and an
  out_proj, which are our pooler and classifier once the same weights are copied in."""
  torch = pytest.importorskip("torch")
  import transformers
  folder = request.getfixturevalue(f"tiny_{arch}_dir")
  m = _model_config(folder, max_length=32, max_response=8)
  built = cross_encoder.build(m, seed=0, train_texts=lambda: ())
  head_class = {"mpnet": transformers.MPNetForSequenceClassification,
                "roberta": transformers.RobertaForSequenceClassification}[arch]
  ref = head_class.from_pretrained(str(folder), num_labels=2).eval()
  with torch.no_grad():
    for name, ours in (("dense", built.model.pooler), ("out_proj", built.model.classifier)):
      getattr(ref.classifier, name).weight.copy_(torch.tensor(np.asarray(ours.kernel[...]).T))
      getattr(ref.classifier, name).bias.copy_(torch.tensor(np.asarray(ours.bias[...])))
  inputs = cross_encoder.pair_inputs(built, m)(
      ["my card was declined __eou__ where is my refund", "set an alarm for seven"],
      ["cancel my transfer please", "I lost my phone"])
  ids, tok = inputs["ids"][0][inputs["mask"][0] == 1].tolist(), built.tokenizer
  first_eos = ids.index(tok.eos_token_id)  # <s> context </s></s> response </s>
  assert ids[0] == tok.bos_token_id and ids[first_eos + 1] == ids[-1] == tok.eos_token_id
  assert not inputs["type_ids"].any()  # one token type in these templates
  got = built.model(jnp.asarray(inputs["ids"]), jnp.asarray(inputs["mask"]),
                    jnp.asarray(inputs["type_ids"]))
  with torch.no_grad():
    want = ref(input_ids=torch.tensor(inputs["ids"], dtype=torch.long),
               attention_mask=torch.tensor(inputs["mask"], dtype=torch.long)).logits.numpy()
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5)
