"""XLA CPU code generation suited to the machine, set before JAX starts its backend.

XLA's CPU backend vectorises for 256-bit registers unless told otherwise, which
leaves half of each AVX-512 register unused in the code XLA generates itself.
Asking for 512-bit vectors gained a few percent encoding banking77 with
all-MiniLM-L6-v2 on a 2-core Xeon (494 -> 527 sentences/s, near the run-to-run
noise; docs/benchmarks.md) and cost nothing measurable. The flag is added only on
CPUs that report `avx512f`, only when XLA_FLAGS does not already choose a vector
width, and only before the first JAX computation (XLA reads its flags once per
process); set CONVFIT_CPU_FLAGS=0 to leave XLA_FLAGS alone.
"""

from __future__ import annotations

import os
from pathlib import Path

VECTOR_WIDTH = "--xla_cpu_prefer_vector_width=512"


def has_avx512(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
  """Whether the CPU reports AVX-512 Foundation (Linux; False where unknown)."""
  try:
    text = cpuinfo.read_text(errors="replace")
  except OSError:
    return False
  return any(line.startswith("flags") and "avx512f" in line.split() for line in text.splitlines())


def configure() -> None:
  """Adds `VECTOR_WIDTH` to XLA_FLAGS where it applies (see the module docstring)."""
  flags = os.environ.get("XLA_FLAGS", "")
  if (os.environ.get("CONVFIT_CPU_FLAGS", "1") == "0" or "xla_cpu_prefer_vector_width" in flags
      or not has_avx512()):
    return
  os.environ["XLA_FLAGS"] = f"{flags} {VECTOR_WIDTH}".strip()
