"""The CPU line and host record that sweep.json, validate.json and the benchmarks carry
(spectune.measure.environment)."""

from __future__ import annotations

from spectune.measure.environment import cpu_model_and_flags

CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9R14 96-Core Processor
flags\t\t: fpu sse2 avx avx2 fma f16c avx512f avx512_bf16 amx_tile sha_ni
processor\t: 1
model name\t: another name the first processor's does not change
flags\t\t: fpu
"""


def test_the_model_name_is_the_first_processors(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert cpu_model_and_flags(str(path))[0] == "AMD EPYC 9R14 96-Core Processor"


def test_only_the_vector_flags_are_kept_sorted(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert cpu_model_and_flags(str(path))[1] == ["amx_tile", "avx", "avx2", "avx512_bf16", "avx512f", "f16c", "fma"]


def test_without_cpuinfo_the_flags_are_empty(tmp_path):
    assert cpu_model_and_flags(str(tmp_path / "missing"))[1] == []
