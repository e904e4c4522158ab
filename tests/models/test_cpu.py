"""The CPU probe: flags from /proc/cpuinfo, cut down by torch's and oneDNN's ISA limits."""

import pytest

from workbench.models.cpu import probe

AMX = "fpu sse avx avx2 fma f16c avx512f avx512bw avx512vl avx512dq avx512_bf16 amx_tile amx_bf16"


@pytest.fixture
def cpuinfo(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nvendor_id\t: AnyVendor\nflags\t\t: {AMX}\n\n"
                    f"processor\t: 1\nflags\t\t: {AMX}\n")
    return path


def test_flags_come_from_cpuinfo(cpuinfo):
    features = probe(cpuinfo, env={})
    assert features.has("avx2", "fma", "amx_bf16")
    assert features.native_bf16 and features.onednn_bf16
    assert features.summary().startswith("avx2 fma f16c avx512f")


@pytest.mark.parametrize("env", [{"ATEN_CPU_CAPABILITY": "avx2"}, {"ONEDNN_MAX_CPU_ISA": "AVX2"},
                                 {"MKL_ENABLE_INSTRUCTIONS": "AVX2"}])
def test_an_avx2_limit_leaves_an_avx2_machine(cpuinfo, env):
    features = probe(cpuinfo, env=env)
    assert features.has("avx2", "fma")
    assert not features.native_bf16 and not features.onednn_bf16
    assert not any(flag.startswith(("avx512", "amx")) for flag in features.flags)
    assert features.limits == tuple(f"{k}={v}" for k, v in env.items())


def test_onednn_limits_below_amx_keep_what_they_allow(cpuinfo):
    features = probe(cpuinfo, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"})
    assert features.has("avx512_bf16") and not features.has("amx_bf16")
    features = probe(cpuinfo, env={"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"})
    assert features.onednn_bf16 and not features.native_bf16


def test_default_capability_leaves_no_vector_kernels(cpuinfo):
    features = probe(cpuinfo, env={"ATEN_CPU_CAPABILITY": "default"})
    assert not features.has("avx2") and not features.has("fma")


def test_simulated_flags_narrow_but_never_add(cpuinfo, tmp_path):
    features = probe(cpuinfo, env={"WORKBENCH_CPU_FLAGS": "avx2,fma"})
    assert features.flags == {"avx2", "fma"} and "WORKBENCH_CPU_FLAGS" in features.source
    small = tmp_path / "small"
    small.write_text("flags\t\t: fpu sse avx\n")
    assert probe(small, env={"WORKBENCH_CPU_FLAGS": "avx2 amx_bf16"}).flags == frozenset()


def test_no_cpuinfo_means_no_flags(tmp_path):
    features = probe(tmp_path / "missing", env={})
    assert features.flags == frozenset() and features.source == "none"
