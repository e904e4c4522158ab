"""Resident memory: a converted checkpoint's file pages given back, nothing else touched; the
one-copy rule on every kernel this CPU runs (a ~340 MB random model in a child process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from workbench.engine.kernels import projections
from workbench.models import memory

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux's /proc")


def _mapped(tmp_path, rows: int = 2048):
    path = tmp_path / "w.safetensors"
    save_file({"w": torch.randn(rows, 2048)}, path)
    with safe_open(path, "pt") as f:
        return f.get_tensor("w")  # a view of the file's private map


def test_release_drops_a_mapped_weights_pages_and_keeps_its_values(tmp_path):
    weight = _mapped(tmp_path)
    total = weight.sum()  # every page read in
    before = memory.resident()
    dropped = memory.release(weight)
    assert dropped >= weight.numel() * 4 - 2 * 4096  # all but the partial pages at its ends
    assert memory.resident().file < before.file - 10  # MB
    assert torch.equal(weight.sum(), total)  # read again from the file, unchanged


def test_release_leaves_written_pages_anonymous_memory_and_kept_tensors(tmp_path):
    weight = _mapped(tmp_path)
    weight[1000, 5] = 7.0  # a written page of a private map: no longer the file's
    assert memory.release(weight) == 0 and weight[1000, 5] == 7.0
    anonymous = torch.ones(1024, 1024)
    assert memory.release(anonymous) == 0 and anonymous.sum() == 2**20
    other = _mapped(tmp_path / "..", rows=1024)
    assert memory.release(other, keep=(other,)) == 0


def test_available_beside_a_model_counts_its_mapped_weights_as_taken(tmp_path):
    weight = _mapped(tmp_path)
    model = torch.nn.Linear(2048, 2048, bias=False)
    model.weight = torch.nn.Parameter(weight, requires_grad=False)
    plain = torch.nn.Linear(2048, 2048, bias=False)
    beside, without = memory.available_beside(model), memory.available_beside(plain)
    assert beside is not None and without is not None
    assert abs((without - beside) - weight.numel() * 4) < 64 * 2**20  # the machine moves a bit


# -- the one-copy rule ------------------------------------------------------------------------

SHAPE = dict(model_type="llama", hidden_size=1024, intermediate_size=4096, num_hidden_layers=8,
             num_attention_heads=16, num_key_value_heads=4, head_dim=64, tie_word_embeddings=True)

_CHILD = """
import gc, json, sys, torch
from workbench import LLM, SamplingParams
from workbench.models import memory, tiny_model
torch.set_num_threads(1)
warm = LLM(model=tiny_model("llama", dtype=sys.argv[2]), kernel=sys.argv[3])  # imports, C library
del warm
gc.collect()
before = memory.resident()
llm = LLM(model=sys.argv[1], dtype=sys.argv[2], kernel=sys.argv[3])
after = memory.resident()
out = llm.generate("Hello", SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
print(json.dumps({"added": after.rss - before.rss, "peak": after.peak - before.rss,
                  "kernel": llm.llm_engine.runner.kernel.kernel,
                  "tokens": len(out[0].outputs[0].token_ids)}))
"""


@pytest.fixture(scope="module")
def model_300mb(tmp_path_factory):
    """A random Llama of 170M parameters (340 MB in bf16) with SmolLM2's tokenizer."""
    import shutil

    from transformers import AutoConfig

    from workbench.models import shapes

    path = tmp_path_factory.mktemp("llama-300mb")
    fields = dict(SHAPE)
    config = AutoConfig.for_model(fields.pop("model_type"), **fields, vocab_size=49152,
                                  max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                                  pad_token_id=2, torch_dtype="bfloat16")
    shapes.write_checkpoint(config, path)
    for file in (shapes._TOKENIZER).iterdir():
        shutil.copy(file, path / file.name)
    return path


def _kernels() -> list[tuple[str, str]]:
    features = projections.cpu_features()
    return [(kernel, dtype) for dtype in ("bfloat16", "float32")
            for kernel in projections.runnable(getattr(torch, dtype), features)]


@pytest.mark.parametrize("kernel, dtype", _kernels())
def test_an_engine_holds_one_copy_of_each_weight(model_300mb, kernel, dtype):
    """Resident memory the engine's load added <= 1.15x the weights' bytes in its dtype (the
    KV cache is mapped as it fills), its peak during the load <= 1.3x: the kernel's layout
    built from the checkpoint's pages, never beside the plain weight and a second packed one.
    A kernel that packs the tied LM head (onednn, amx) reads the whole embedding while it
    packs it (its pages given back after): the peak may pass by that table's bytes, 30% of this
    small model (5-10% of the real ones). Loaded in float32 from this bfloat16 checkpoint,
    transformers' conversion holds the file's pages beside the float32 weights it makes: the
    peak may pass by the checkpoint's bytes (as transformers' own load does); except on
    "avx2", whose float32 products read the checkpoint's bfloat16 weights as they are: there
    the bounds are those of the bfloat16 weights, the load converting nothing but the norms."""
    kept = kernel == "avx2" and dtype == "float32"  # `load_model(bf16_weights=True)`
    weights = (2 if dtype == "bfloat16" or kept else 4) * (
        49152 * 1024 + 8 * (1024 * (1024 + 2 * 256) + 1024 * 1024 + 3 * 1024 * 4096)
        + 17 * 1024) / 2**20  # MB: the tied embedding, 8 layers, 17 norms
    run = subprocess.run([sys.executable, "-c", _CHILD, str(model_300mb), dtype, kernel],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found["kernel"] == kernel and found["tokens"] == 4
    assert found["added"] <= 1.15 * weights, (found, weights)
    table = 49152 * 1024 * (2 if dtype == "bfloat16" else 4) / 2**20
    packs_head = kernel in ("onednn", "amx")
    converted = weights / 2 if dtype == "float32" and not kept else 0
    assert found["peak"] <= 1.3 * weights + (table if packs_head else 0) + converted, (
        found, weights)


def test_dropping_the_page_cache_names_the_released_bytes_of_the_file(tmp_path, monkeypatch):
    """Within `dropping_page_cache`, the bytes released are also dropped from the OS's page
    cache: the file and the offsets the weight's whole pages hold in it."""
    import struct

    weight = _mapped(tmp_path)
    weight.sum()
    calls = []
    monkeypatch.setattr(memory, "_uncache", lambda *args: calls.append(args))
    memory.release(weight)
    assert calls == []  # outside the block: the map's pages only
    with memory.dropping_page_cache():
        dropped = memory.release(weight)
    path = tmp_path / "w.safetensors"
    header = struct.unpack("<Q", path.read_bytes()[:8])[0]
    start = 8 + header  # the one tensor's bytes begin right after the header
    first = -(-weight.data_ptr() // 4096) * 4096
    assert calls == [(str(path), start + first - weight.data_ptr(), dropped)]
    assert not memory.page_cache_is_tight(2**20) and memory.page_cache_is_tight(2**50)
