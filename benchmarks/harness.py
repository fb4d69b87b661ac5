"""What the benchmark scripts share: the machine they ran on, a system run in its own
process, and NAME=WORKDIR arguments.

Scripts run as `python benchmarks/<script>.py`, which puts this folder on `sys.path`, so
they `import harness`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time


def cpu_name() -> str:
  """The CPU's model name as /proc/cpuinfo gives it (what a results file records)."""
  try:
    with open("/proc/cpuinfo", encoding="utf-8") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def machine() -> str:
  """One line: CPU, core count and the 1-minute load average now (idle is near 0)."""
  return f"{cpu_name()}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}"


def run_process(cmd: list[str], *, cwd: str | os.PathLike | None = None,
                env: dict | None = None) -> tuple[str, float]:
  """Runs `cmd` to its end: (its stdout, wall seconds). A failure raises, with the end of
  its stderr, so one system's crash names itself."""
  tic = time.perf_counter()
  r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
  wall = time.perf_counter() - tic
  if r.returncode != 0:
    raise RuntimeError(f"{' '.join(map(str, cmd[:4]))} ... exited with {r.returncode}:\n"
                       f"{r.stderr[-4000:]}")
  return r.stdout, wall


def run_worker(cmd: list[str], **kwargs) -> tuple[dict, float]:
  """A system measured in its own process (so peaks, threads and imports do not mix): runs
  `cmd`, whose last stdout line is its JSON result; (that result, wall seconds)."""
  out, wall = run_process(cmd, **kwargs)
  return json.loads(out.strip().splitlines()[-1]), wall


def named(items: list[str], form: str = "NAME=WORKDIR") -> list[tuple[str, str]]:
  """`NAME=VALUE` arguments as (name, value) pairs; anything else stops the script,
  saying the `form` expected."""
  out = []
  for item in items:
    name, sep, value = item.partition("=")
    if not sep:
      raise SystemExit(f"{item!r}: expected {form}")
    out.append((name, value))
  return out
