"""Multi-host tests on one machine: N `jax.distributed` processes on localhost, 4 CPU devices each.

A test file that uses this is also the workers' script. The test calls
`launch(__file__, *args)`, which runs `python FILE worker PROCESS_ID PORT *args` once
per process; the file ends with

  if __name__ == "__main__" and sys.argv[1:2] == ["worker"]:
    _worker(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])

and `_worker` runs its body inside `with multihost.distributed(process_id, port):`.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import jax

DEVICES_PER_PROCESS = 4
REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(script: str | os.PathLike, *args, num_processes: int = 2, timeout: float = 240) -> None:
  """Runs `script worker PROCESS_ID PORT *args` in `num_processes` processes; fails on any
  non-zero exit, showing that process's output."""
  port = free_port()
  # Set before the workers import jax: each process is one host with 4 CPU devices.
  env = {**os.environ, "PYTHONPATH": str(REPO),
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"}
  procs = [subprocess.Popen([sys.executable, str(script), "worker", str(i), str(port),
                             *map(str, args)], env=env, cwd=str(REPO),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
           for i in range(num_processes)]
  try:
    logs = [p.communicate(timeout=timeout)[0].decode(errors="replace") for p in procs]
  finally:
    # A worker that fails can leave the others blocked in a collective: end them here.
    for p in procs:
      if p.poll() is None:
        p.kill()
        p.wait()
  for i, (p, log) in enumerate(zip(procs, logs)):
    assert p.returncode == 0, f"process {i} exited with {p.returncode}:\n{log[-3000:]}"


@contextlib.contextmanager
def distributed(process_id: int, port: int, num_processes: int = 2):
  """In a worker: joins the `jax.distributed` cluster (gloo CPU collectives) and leaves it
  when the body returns."""
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=num_processes,
                             process_id=process_id)
  assert jax.local_device_count() == DEVICES_PER_PROCESS
  assert jax.device_count() == DEVICES_PER_PROCESS * num_processes
  yield
  jax.distributed.shutdown()
