"""XLA CPU flags chosen for the machine: only with AVX-512, never over the user's choice."""

import os

import pytest

from convfit_jax import cpu_flags


def test_has_avx512_reads_the_flags_line(tmp_path):
  info = tmp_path / "cpuinfo"
  info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512f avx512bw\n")
  assert cpu_flags.has_avx512(info)
  info.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 fma avx512_bf16\n")  # no avx512f
  assert not cpu_flags.has_avx512(info)
  assert not cpu_flags.has_avx512(tmp_path / "missing")


@pytest.mark.parametrize("env, avx512, expected", [
    ({"XLA_FLAGS": "--xla_force_host_platform_device_count=8"}, True,
     "--xla_force_host_platform_device_count=8 --xla_cpu_prefer_vector_width=512"),
    ({}, True, "--xla_cpu_prefer_vector_width=512"),
    ({"XLA_FLAGS": "--xla_cpu_prefer_vector_width=256"}, True, "--xla_cpu_prefer_vector_width=256"),
    ({"XLA_FLAGS": "--a=1", "CONVFIT_CPU_FLAGS": "0"}, True, "--a=1"),
    ({"XLA_FLAGS": "--a=1"}, False, "--a=1"),
])
def test_configure_adds_the_vector_width_only_where_it_applies(monkeypatch, env, avx512, expected):
  monkeypatch.delenv("XLA_FLAGS", raising=False)
  monkeypatch.delenv("CONVFIT_CPU_FLAGS", raising=False)
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  monkeypatch.setattr(cpu_flags, "has_avx512", lambda: avx512)
  cpu_flags.configure()
  assert os.environ.get("XLA_FLAGS", "") == expected
