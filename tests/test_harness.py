"""benchmarks/harness.py: what the benchmark scripts share."""

import sys

import harness
import pytest


def test_a_worker_answers_with_its_last_stdout_line_as_json():
  code = "print('loading...'); print('{\"rate\": 2.5}')"
  result, wall = harness.run_worker([sys.executable, "-c", code])
  assert result == {"rate": 2.5} and wall > 0


def test_a_failing_worker_raises_with_the_end_of_its_stderr():
  code = "import sys; print('out of memory in step 3', file=sys.stderr); sys.exit(3)"
  with pytest.raises(RuntimeError, match=r"exited with 3:\n.*out of memory in step 3"):
    harness.run_worker([sys.executable, "-c", code])


def test_machine_names_cores_and_load_and_named_pairs_check_their_form():
  assert "CPUs, load average" in harness.machine()
  assert harness.named(["a=x/y", "b=z=w"]) == [("a", "x/y"), ("b", "z=w")]
  with pytest.raises(SystemExit, match="expected NAME=WORKDIR"):
    harness.named(["no_equals"])
