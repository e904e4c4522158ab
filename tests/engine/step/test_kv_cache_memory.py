"""The KV cache takes resident memory as it fills, not all at start (runner.allocate_kv_caches)."""

import torch

from workbench.engine.step.runner import allocate_kv_caches


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def test_a_large_cache_is_zeros_and_costs_memory_only_where_written():
    before = resident_mb()
    shape = (2**20, 4, 64)  # 512 MB per tensor in bfloat16; 4 layers: 4 GB in all
    caches = allocate_kv_caches(shape, 4, torch.bfloat16, torch.device("cpu"))
    assert len(caches) == 4 and all(k.shape == v.shape == shape for k, v in caches)
    assert all(t.dtype == torch.bfloat16 and t.is_contiguous() for pair in caches for t in pair)
    assert resident_mb() - before < 256
    k, v = caches[3]
    k[:1000] = 1.0
    assert float(k[:1000].sum()) == 1000 * 4 * 64 and not v[:1000].any() and not k[1000:2000].any()
    assert caches[2][1].data_ptr() != v.data_ptr()  # every layer's K and V are their own
    assert resident_mb() - before < 256
