"""The small ops in C (`KernelChoice.ops == "c"`): decode attention (`c_attention.decode_attention`) is
SDPA over the gathered context within float32 (or one bf16) rounding, for grouped-query heads,
padded batches and contexts of any length, the same bits for any thread count; the residual
add and RMSNorm (`c_layer_ops.add_rms_norm`) are transformers' RMSNorm within the same; the engine's
tokens and logprobs with them are those with torch's ops."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch

from tests.engine.helpers import make_llm, needs_c
from tests.engine.kernels.test_kernels import every_build, simulated  # noqa: F401 (a fixture)
from workbench.engine.kernels import (
    c_attention,
    c_decode_stack,
    c_layer_ops,
    c_products,
    projections,
)
from workbench.engine.step.attention import decode_attention
from workbench.engine.step.decoder import _rms_norm, _rotate, _signed_sin
from workbench.models import tiny_model
from workbench.sampling_params import SamplingParams


def case(dtype, batch=5, hq=9, hkv=3, d=64, lengths=(1, 5, 17, 70, 33), seed=0):
    """Random q (a row slice of a wider tensor, as the decoder passes it), caches, a shuffled
    slot table padded past each length, and the float64 reference output."""
    gen = torch.Generator().manual_seed(seed)
    slots_total, lmax = 512, max(lengths)
    k_cache = torch.randn(slots_total, hkv, d, generator=gen).to(dtype)
    v_cache = torch.randn(slots_total, hkv, d, generator=gen).to(dtype)
    wide = torch.randn(batch, hq + hkv, d, generator=gen).to(dtype)
    q = wide[:, :hq]  # not contiguous across the batch
    slots = torch.randperm(slots_total, generator=gen)[:batch * (lmax + 3)].view(batch, -1)
    slots = slots[:, :lmax]  # a row slice too
    lens = torch.tensor(lengths[:batch])
    mask = torch.arange(lmax)[None] < lens[:, None]
    scale = d ** -0.5
    kd = k_cache[slots.flatten()].view(batch, lmax, hkv, d).double()
    vd = v_cache[slots.flatten()].view(batch, lmax, hkv, d).double()
    expected = decode_attention(q.double(), kd, vd, mask, scale)
    return q, k_cache, v_cache, slots, lens, scale, expected


@needs_c
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2 ** -8)])
@pytest.mark.parametrize("hq, hkv, d", [(9, 3, 64), (4, 4, 8), (8, 2, 128), (16, 1, 24),
                                       (10, 2, 40)])
def test_c_decode_attention_equals_the_exact_result(dtype, tol, hq, hkv, d):
    q, k_cache, v_cache, slots, lens, scale, expected = case(dtype, hq=hq, hkv=hkv, d=d)
    out = c_attention.decode_attention(q, k_cache, v_cache, slots, lens, scale)
    assert out is not None and out.dtype == dtype and out.shape == q.shape
    # float32: summation order only; bfloat16: one rounding of the float32 result
    assert torch.allclose(out.double(), expected, rtol=tol, atol=tol)


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_c_decode_attention_does_not_depend_on_the_thread_count(dtype):
    q, k_cache, v_cache, slots, lens, scale, _ = case(dtype, batch=4, lengths=(70, 9, 64, 1))
    before = torch.get_num_threads()
    outs = []
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            outs.append(c_attention.decode_attention(q, k_cache, v_cache, slots, lens, scale))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


@needs_c
def test_shapes_it_does_not_take_fall_back():
    q, k_cache, v_cache, slots, lens, scale, _ = case(torch.float32, hq=4, hkv=4, d=12)
    assert c_attention.decode_attention(q, k_cache, v_cache, slots, lens, scale) is None  # d % 8
    q, k_cache, v_cache, slots, lens, scale, _ = case(torch.float32, hq=17, hkv=1, d=8)
    assert c_attention.decode_attention(q, k_cache, v_cache, slots, lens, scale) is None  # 17 per head


@pytest.mark.parametrize("machine, dtype, kernel, ops", [
    ("avx2", torch.float32, "auto", "c"), ("amx", torch.bfloat16, "auto", "c"),
    ("avx512", torch.bfloat16, "onednn", "c"), ("amx", torch.float32, "torch", "torch"),
    ("no-avx2", torch.float32, "auto", "torch"),
])
def test_the_choice_names_the_ops(machine, dtype, kernel, ops, every_build):  # noqa: F811
    choice = projections.choose(dtype, "cpu", kernel, features=simulated(machine))
    assert choice.ops == ops and f"ops {ops}" in choice.describe()
    assert projections.choose(dtype, "cuda").ops == "torch"


def test_without_the_library_the_ops_are_torch(every_build, monkeypatch):  # noqa: F811
    monkeypatch.setattr(c_products, "available", lambda: False)
    assert projections.choose(torch.bfloat16, "cpu", features=simulated("amx")).ops == "torch"


@needs_c
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 2e-6), (torch.bfloat16, 2 ** -7)])
@pytest.mark.parametrize("rows, hidden", [(1, 576), (16, 64), (300, 520), (3, 8)])
@pytest.mark.parametrize("with_delta", [True, False])
def test_c_add_rms_norm_equals_transformers_rms_norm(dtype, tol, rows, hidden, with_delta):
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, hidden, generator=gen).to(dtype)
    delta = torch.randn(rows, hidden, generator=gen).to(dtype) if with_delta else None
    weight = (torch.rand(hidden, generator=gen) + 0.5).to(dtype)
    total, normed = c_layer_ops.add_rms_norm(x, delta, weight, 1e-5)
    expected_total = x if delta is None else x + delta
    assert torch.equal(total, expected_total)  # the add rounds as torch's
    expected = _rms_norm(expected_total, weight, 1e-5)
    assert normed.dtype == dtype and torch.allclose(normed.double(), expected.double(),
                                                    rtol=tol, atol=tol)


@needs_c
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("tokens", [1, 3, 200])
def test_c_rope_and_kv_write_are_torch_ops_bit_for_bit(dtype, tokens):
    hq, hkv, d, slots_total = 9, 3, 64, 512
    gen = torch.Generator().manual_seed(tokens)
    wide = torch.randn(tokens, (hq + 2 * hkv) * d + 5, generator=gen).to(dtype)
    qkv = wide[:, :(hq + 2 * hkv) * d]  # rows strided, as a LoRA-free fused projection's slice
    angles = torch.rand(tokens, d // 2, generator=gen) * 100
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(dtype)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(dtype)
    slots = torch.randperm(slots_total, generator=gen)[:tokens]
    caches = [torch.zeros(slots_total, hkv, d, dtype=dtype) for _ in range(4)]
    q = c_layer_ops.rope_write_kv(qkv, cos, _signed_sin(sin), slots, caches[0], caches[1], hq, hkv)
    qk = _rotate(qkv[:, :(hq + hkv) * d].reshape(tokens, hq + hkv, d), cos.unsqueeze(1),
                 _signed_sin(sin).unsqueeze(1))
    caches[2].index_copy_(0, slots, qk[:, hq:])
    caches[3].index_copy_(0, slots, qkv[:, (hq + hkv) * d:].reshape(tokens, hkv, d))
    assert torch.equal(q, qk[:, :hq])
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])


@needs_c
@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 2 ** -7)])
@pytest.mark.parametrize("rows", [1, 16, 100])
def test_c_silu_mul_equals_torch_ops(dtype, tol, rows):
    gen = torch.Generator().manual_seed(rows)
    gate_up = (torch.randn(rows, 2 * 1536, generator=gen) * 4).to(dtype)
    gate_up[0, :4] = torch.tensor([-200.0, -90.0, 90.0, 200.0])  # past exp's float range
    gate, up = gate_up.chunk(2, dim=-1)
    expected = torch.nn.functional.silu(gate) * up
    out = c_layer_ops.silu_mul(gate_up)
    assert out is not None and out.dtype == dtype
    assert torch.allclose(out.double(), expected.double(), rtol=tol, atol=1e-30)
    assert c_layer_ops.silu_mul(gate_up[:, :12]) is None  # not contiguous (and F not a multiple of 8)


@needs_c
def test_add_rms_norm_declines_what_it_does_not_take():
    x = torch.randn(2, 8)
    assert c_layer_ops.add_rms_norm(x, None, torch.ones(8, dtype=torch.bfloat16), 1e-5) is None
    assert c_layer_ops.add_rms_norm(x.t(), None, torch.ones(2), 1e-5) is None  # not contiguous
    assert c_layer_ops.add_rms_norm(x.half(), None, torch.ones(8).half(), 1e-5) is None
    assert c_layer_ops.add_rms_norm(torch.randn(1, 12), None, torch.ones(12), 1e-5) is None  # 12 % 8
    qkv, caches = torch.randn(1, 3 * 8), torch.zeros(2, 1, 8)  # a head size of 8: not rotated
    assert c_layer_ops.rope_write_kv(qkv, torch.ones(1, 8), torch.ones(1, 8), torch.tensor([0]),
                              caches, caches.clone(), 1, 1) is None


@needs_c
def test_the_engine_gives_the_same_tokens_with_c_and_torch_ops(monkeypatch):
    """Four sequences of different lengths decoding together (padded batches), greedy, float32
    (a random tiny model's bf16 logits tie too often for tokens to be compared across
    kernels; the bf16 functions themselves are checked above). Three runs: decode steps in one
    C call through every layer (`c_decode_stack.decode_stack`, the default), the decoder's loop calling
    the same C functions one by one (bit for bit the same), and torch's ops."""
    base = tiny_model("llama", dtype="float32")
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40, 9)]
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=2, ignore_eos=True)
    computed = []
    for name in ("decode_attention", "add_rms_norm", "rope_write_kv", "silu_mul",
                 "decode_stack"):
        module = {"decode_attention": c_attention, "decode_stack": c_decode_stack}.get(
            name, c_layer_ops)
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *args, real=real: computed.append(
            (real.__name__, real(*args))) or computed[-1][1])
    results = {}
    loop = {"decode_attention", "add_rms_norm", "rope_write_kv", "silu_mul"}
    for run in ("stack", "loop", "torch"):
        llm = make_llm(dataclasses.replace(base, model=copy.deepcopy(base.model)), block_size=4)
        runner = llm.llm_engine.runner
        ops = "torch" if run == "torch" else "c"
        runner.kernel = dataclasses.replace(runner.kernel, ops=ops)
        runner.stack.c_ops = ops == "c"
        if run == "loop":
            runner.stack.c_layers = None
        one_call = runner.stack.c_layers is not None  # not with `WORKBENCH_KERNEL=torch`
        results[run] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        called = {name for name, _ in computed}
        assert all(out is not None for _, out in computed)  # none declined
        if run == "stack" and one_call:  # prefill steps (no decodes): the loop's C functions
            assert called == {"add_rms_norm", "rope_write_kv", "silu_mul", "decode_stack"}
        elif run != "torch":
            assert called == loop
        else:
            assert not computed
        computed.clear()
    for stack, loop_out in zip(results["stack"], results["loop"], strict=True):
        assert stack.token_ids == loop_out.token_ids
        assert stack.logprobs == loop_out.logprobs  # the same functions on the same values
    for c, sdpa in zip(results["loop"], results["torch"], strict=True):
        assert c.token_ids == sdpa.token_ids
        for step_c, step_s in zip(c.logprobs, sdpa.logprobs, strict=True):
            for token, lp in step_c.items():
                if token in step_s:
                    assert abs(lp.logprob - step_s[token].logprob) < 1e-5


@needs_c
@pytest.mark.parametrize("dtype, rows", [("float32", 1), ("float32", 5), ("bfloat16", 1),
                                         ("bfloat16", 2), ("bfloat16", 5)])
def test_a_decode_step_in_one_c_call_is_bit_for_bit_the_loop(monkeypatch, dtype, rows):
    """`c_decode_stack.decode_stack` runs the loop's C functions in the loop's order: the same tokens and
    logprobs to the last bit, in both dtypes; batches larger than the C products take (five
    bf16 rows on `avx512bf16`: oneDNN's; `amx` takes them) go through the loop."""
    base = tiny_model("llama", dtype=dtype)
    prompts = [{"prompt_token_ids": list(range(5, 5 + n))} for n in (3, 17, 40, 9, 6)[:rows]]
    params = SamplingParams(max_tokens=12, temperature=0, logprobs=3, ignore_eos=True)
    outs = {}
    for run in ("stack", "loop"):
        llm = make_llm(dataclasses.replace(base, model=copy.deepcopy(base.model)), block_size=4)
        runner = llm.llm_engine.runner
        stack = runner.stack
        if stack.c_layers is None:
            pytest.skip(f"no C products here ({runner.kernel.describe()})")
        applies = stack.c_layers[0].qkv.c_function(rows, getattr(torch, dtype))
        calls = []
        real = c_decode_stack.decode_stack
        monkeypatch.setattr(c_decode_stack, "decode_stack",
                            lambda *a, calls=calls, real=real: calls.append(1) or real(*a))
        if run == "loop":
            stack.c_layers = None
        outs[run] = [o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
        assert bool(calls) == (run == "stack" and applies is not None)
        monkeypatch.undo()
    for stack_out, loop_out in zip(outs["stack"], outs["loop"], strict=True):
        assert stack_out.token_ids == loop_out.token_ids
        assert stack_out.logprobs == loop_out.logprobs


@needs_c
def test_a_decode_step_in_one_c_call_declines_what_it_does_not_take():
    """Shapes and dtypes `wb_decode_stack` would misread: None (the loop runs); a layer short of
    tensors: refused before any pointer reaches C."""
    lm = make_llm(tiny_model("llama", dtype="float32"), block_size=4)
    stack = lm.llm_engine.runner.stack
    if stack.c_layers is None:
        pytest.skip("no C products here")
    kv = lm.llm_engine.runner.kv_caches
    fn = c_products.linear_function()
    tables = c_decode_stack.stack_table([(*(c.input_norm.weight for _ in range(10)), *kv[0], *[fn] * 4)
                               for c in stack.c_layers], [(1e-5, 1e-5)] * len(stack.c_layers))
    d = stack.head_dim
    hidden = torch.randn(2, stack.c_layers[0].qkv.in_features)
    good = dict(cos=torch.ones(2, d), signed_sin=torch.zeros(2, d),
                slot_mapping=torch.tensor([0, 5]), slots=torch.tensor([[0], [5]]),
                lengths=torch.tensor([1, 1]))
    for name, bad in (("slot_mapping", torch.tensor([0, 5], dtype=torch.int32)),
                      ("cos", torch.ones(2, d + 2)), ("signed_sin", torch.zeros(2, d).t().t()[:1]),
                      ("lengths", torch.tensor([1, 1]).to(torch.float32)),
                      ("slots", torch.tensor([[0, 1]]))):
        args = {**good, name: bad}
        assert c_decode_stack.decode_stack(tables, len(stack.c_layers), hidden, args["cos"],
                                 args["signed_sin"], args["slot_mapping"], args["slots"],
                                 args["lengths"], stack.num_heads, stack.num_kv_heads, d,
                                 8, 0.125) is None, name
    with pytest.raises(ValueError, match="tensors and 4 functions"):
        c_decode_stack.stack_table([(None,) * 15], [(1e-5, 1e-5)])


@needs_c
@pytest.mark.parametrize("vocab", [8, 37, 49152])
@pytest.mark.parametrize("k", [1, 5, 20, 64])
def test_ranks_and_top_k_in_one_pass_are_torchs(vocab, k):
    """`c_layer_ops.ranks_and_top_k`: the chosen tokens' ranks and the top k (ids and values,
    largest first) equal torch's compare-and-sum and `topk`, on vocabularies that are not
    multiples of 8 and with k past a vector."""
    if k > vocab:
        pytest.skip("k past the vocabulary")
    gen = torch.Generator().manual_seed(vocab + k)
    logprobs = torch.randn(4, vocab, generator=gen).log_softmax(-1)
    chosen = torch.randint(0, vocab, (4,), generator=gen)
    ranks, ids, values = c_layer_ops.ranks_and_top_k(logprobs, chosen, k)
    top = logprobs.topk(k, dim=-1)
    assert torch.equal(ids, top.indices) and torch.equal(values, top.values)
    assert torch.equal(ranks, (logprobs > logprobs.gather(1, chosen[:, None])).sum(-1) + 1)


@needs_c
def test_ranks_and_top_k_keep_ties_in_index_order_and_leave_nan_to_torch():
    logprobs = torch.tensor([[0.0, 1.0, 1.0, 0.5, 1.0, -1.0, 1.0, 1.0, 1.0, 1.0]])
    ranks, ids, values = c_layer_ops.ranks_and_top_k(logprobs, torch.tensor([3]), 3)
    assert ids.tolist() == [[1, 2, 4]] and values.tolist() == [[1.0, 1.0, 1.0]]
    assert ranks.tolist() == [8]
    logprobs[0, 9] = float("nan")
    assert c_layer_ops.ranks_and_top_k(logprobs, torch.tensor([3]), 3) is None
    assert c_layer_ops.ranks_and_top_k(logprobs, torch.tensor([3]), 65) is None


@needs_c
@pytest.mark.parametrize("vocab", [5, 37, 49152])
def test_entropy_in_one_pass_is_the_distributions_and_a_rows_alone(vocab):
    """`c_layer_ops.entropy`: -sum p log p of each row within float32's terms of the float64
    reference, masked (-inf) tokens adding nothing, a row's bits the same alone, in a batch and
    on one thread; a NaN or +inf leaves it to torch (None)."""
    gen = torch.Generator().manual_seed(vocab)
    logprobs = torch.randn(5, vocab, generator=gen).mul(3)
    logprobs[1, : vocab // 2] = float("-inf")
    logprobs = logprobs.log_softmax(-1)
    exact = logprobs.double()
    want = -(exact.exp() * exact).nan_to_num(nan=0.0).sum(-1)
    got = c_layer_ops.entropy(logprobs)
    assert got.dtype == torch.float64 and torch.allclose(got, want, rtol=0, atol=1e-6)
    assert all(torch.equal(c_layer_ops.entropy(logprobs[i:i + 1].contiguous()), got[i:i + 1])
               for i in range(5))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(c_layer_ops.entropy(logprobs), got)
    finally:
        torch.set_num_threads(threads)
    for bad in (float("nan"), float("inf")):
        spoiled = logprobs.clone()
        spoiled[3, 2] = bad
        assert c_layer_ops.entropy(spoiled) is None
