"""resolve_dtype / resolve_device: names users type to torch dtypes and devices."""

import pytest
import torch

from workbench.errors import ValidationError
from workbench.models.devices import cpu_supports_bf16, resolve_device, resolve_dtype


@pytest.mark.parametrize("name, dtype", [
    ("float32", torch.float32), ("bfloat16", torch.bfloat16), ("float16", torch.float16),
    ("bf16", torch.bfloat16), ("torch.float32", torch.float32), (torch.float16, torch.float16),
])
def test_resolve_dtype_accepts_names_and_torch_dtypes(name, dtype):
    assert resolve_dtype(name) is dtype


def test_resolve_dtype_auto_on_cpu_follows_the_cpu_flags():
    expected = torch.bfloat16 if cpu_supports_bf16() else torch.float32
    assert resolve_dtype("auto", device="cpu") is expected


@pytest.mark.parametrize("bad", ["float8", "int8", torch.int64])
def test_resolve_dtype_rejects_unknown_values_naming_the_parameter(bad):
    with pytest.raises(ValidationError) as error:
        resolve_dtype(bad)
    assert error.value.parameter == "dtype"
    assert isinstance(error.value, ValueError)


@pytest.mark.parametrize("flags, expected", [
    ("fpu sse avx512f avx512_bf16", True), ("fpu amx_bf16 amx_tile", True), ("fpu sse avx2", False),
])
def test_cpu_supports_bf16_reads_cpuinfo_flags(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(f"processor\t: 0\nflags\t\t: {flags}\n")
    assert cpu_supports_bf16(cpuinfo) is expected


def test_cpu_supports_bf16_is_false_without_cpuinfo(tmp_path):
    assert cpu_supports_bf16(tmp_path / "missing") is False


def test_resolve_device_auto_follows_cuda_availability():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"


def test_resolve_device_rejects_unknown_devices():
    with pytest.raises(ValidationError, match="'tpu'") as error:
        resolve_device("tpu")
    assert error.value.parameter == "device"


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_resolve_device_refuses_cuda_without_a_gpu():
    with pytest.raises(ValidationError, match="no CUDA GPU"):
        resolve_device("cuda")
