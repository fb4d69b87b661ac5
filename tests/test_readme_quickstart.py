"""The README's Python quickstart, run as printed (real MiniLM, banking77 10-shot) but for
the length of training: `fit` stops after STEPS steps, so CI spends seconds, not minutes, on
it; every call, argument and printed result of the block is exercised."""

import ast
import os
import re
import subprocess
import sys

from conftest import REPO

STEPS = 8
# Caps fit's steps and says how many ran, then the block runs.
_PRELUDE = f"""
import sys
from convfit_jax import IntentClassifier
_fit = IntentClassifier.fit
def _capped(self, *a, **kw):
  out = _fit(self, *a, **{{"max_steps": {STEPS}, **kw}})
  print("fit steps:", out.history_["steps"], file=sys.stderr)
  return out
IntentClassifier.fit = _capped
"""


def _quickstart() -> str:
  readme = (REPO / "README.md").read_text(encoding="utf-8")
  section = readme.split("## Intent detection in Python", 1)[1]
  return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_python_quickstart_runs(minilm_dir, tmp_path):
  r = subprocess.run([sys.executable, "-c", _PRELUDE + _quickstart()], cwd=tmp_path, capture_output=True,
                     text=True, timeout=900,
                     env={**os.environ, "CONVFIT_OFFLINE": "1", "HF_HUB_OFFLINE": "1"})
  assert r.returncode == 0, r.stderr[-3000:]
  predicted, neighbours = (ast.literal_eval(line) for line in r.stdout.strip().splitlines()[-2:])
  assert predicted[:2] == ["card_arrival", "transaction_charged_twice"]
  assert len(neighbours) == 3 and neighbours[0]["label"] == "card_arrival"
  assert (tmp_path / "banking77_classifier" / "classifier.json").is_file()
  assert f"fit steps: {STEPS}\n" in r.stderr
