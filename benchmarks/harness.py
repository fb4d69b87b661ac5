"""What the benchmark scripts share: the machine they ran on, and NAME=WORKDIR arguments.

Scripts run as `python benchmarks/<script>.py`, which puts this folder on `sys.path`, so
they `import harness`.
"""

from __future__ import annotations

import os
import platform


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
