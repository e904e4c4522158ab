"""dtype="gguf": the engine multiplies a GGUF file's blocks as they are (`projections.Gguf`), and its
tokens are the float32 dequantized model's; the logprobs differ by summation order only.

Tolerances: the C products sum each dot product in float32 in their own order (groups of 32
weights, partial sums per block), `F.linear` in BLAS's; over a tiny model's two layers and a
real model's thirty, the logprobs stay within 2e-4 (tiny) and 2e-3 (SmolLM2, values up to ~30)
of the dequantized float32 model, and greedy tokens are the same.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import transformers
from torch import nn

from tests.engine.helpers import greedy, make_llm
from tests.models.gguf_files import write_gguf
from workbench import LLM, SamplingParams
from workbench.engine.kernels import projections
from workbench.engine.step.fusion import INVARIANT_C_ROWS, FastLinear
from workbench.errors import ValidationError
from workbench.models import load_model, tiny_model
from workbench.models.cpu import cpu_features
from workbench.models.gguf_blocks import BLOCK_TYPES, QuantizedWeight
from workbench.models.gguf_read import read_quantized
from workbench.models.loader import prepare_for_inference

pytestmark = pytest.mark.skipif(
    projections.TABLE["gguf"].missing(torch.float32, cpu_features()) is not None,
    reason="the gguf kernel does not run here")

KINDS = sorted(BLOCK_TYPES)
PROMPTS = ["The capital of France is", "def fib(n):", "Once upon a time, in a land"]


def random_blocks(weight: torch.Tensor, kind: str, gen: torch.Generator) -> QuantizedWeight:
    """`weight`'s shape in `kind` blocks: quantized where gguf-py quantizes that type, else
    random bytes with small float16 scales (a K-quant's d and dmin)."""
    if kind in ("Q4_0", "Q4_1", "Q8_0"):
        return QuantizedWeight.quantize(weight, kind)
    block = BLOCK_TYPES[kind]
    n, k = weight.shape
    data = torch.randint(0, 256, (n, k // block.block_size, block.block_bytes), generator=gen,
                         dtype=torch.uint8)
    # d (and dmin) small enough for weights of about the tiny model's size: a Q6_K weight is
    # d * scale (int8) * (q - 32), a Q4_K / Q5_K one d * scale * q - dmin * min (6-bit each)
    if kind == "Q6_K":
        data[..., 208:210] = torch.tensor([2e-5], dtype=torch.float16).view(torch.uint8)
    else:
        data[..., 0:4] = torch.tensor([2e-4, 1e-4], dtype=torch.float16).view(torch.uint8)
    return QuantizedWeight(kind, n, k, data.view(n, -1).contiguous())


def quantized_pair(kind: str):
    """A tiny llama whose every linear (the tied LM head too) holds `kind` blocks, and the
    same model in float32 without them: its weights the blocks' dequantization."""
    size = dict(hidden_size=256, intermediate_size=512) if kind.endswith("_K") else {}
    loaded = tiny_model("llama", **size)
    gen = torch.Generator().manual_seed(0)
    quantized = {}
    with torch.no_grad():
        for name, module in loaded.model.named_modules():
            if type(module) is nn.Linear:
                blocks = random_blocks(module.weight, kind, gen)
                module.weight.copy_(blocks.dequantize())
                quantized[f"{name}.weight"] = blocks
    reference = copy.deepcopy(loaded)
    loaded.quantized = quantized
    return loaded, reference


def outputs(llm: LLM, params: SamplingParams):
    return [o.outputs[0] for o in llm.generate(PROMPTS, params, use_tqdm=False)]


def assert_close_logprobs(got, want, tol: float) -> None:
    """Same tokens; each position's top logprobs within `tol` (the last of the top may trade
    places with the next at a near-tie)."""
    for g, w in zip(got, want, strict=True):
        assert g.token_ids == w.token_ids
        for gs, ws in zip(g.logprobs, w.logprobs, strict=True):
            shared = gs.keys() & ws.keys()
            assert len(shared) >= len(ws) - 1
            for token in shared:
                assert abs(gs[token].logprob - ws[token].logprob) < tol


@pytest.mark.parametrize("kind", KINDS)
def test_greedy_tokens_equal_the_dequantized_model(kind):
    loaded, reference = quantized_pair(kind)
    params = greedy(12, logprobs=3, ignore_eos=True)
    ours = make_llm(loaded)
    runner = ours.llm_engine.runner
    assert runner.kernel.kernel == "gguf"
    layer = runner.layers[0]
    for lin in (layer.self_attn.q_proj.group.linear, layer.self_attn.o_proj,
                layer.mlp.gate_proj.group.linear, layer.mlp.down_proj, ours.llm_engine.model.lm_head):
        assert isinstance(lin, FastLinear) and lin.kernel.name == "gguf"
        assert lin.weight is None and lin.weights.blocks.kind == kind  # no float copy kept
    assert runner.stack is not None and runner.stack.c_layers is not None  # one C call a step
    assert ", gguf on cpu," in repr(ours) and "<td" in ours._repr_html_()
    assert_close_logprobs(outputs(ours, params), outputs(make_llm(reference), params), 2e-4)


def test_a_fused_groups_blocks_are_held_once():
    """Q/K/V and gate/up fused: their entries in `loaded.quantized` (what the bench counts by
    name) are views of the fused blocks' rows, not a second copy."""
    loaded, _ = quantized_pair("Q4_1")
    before = {name: blocks.data.clone() for name, blocks in loaded.quantized.items()}
    llm = make_llm(loaded)
    layer = llm.llm_engine.runner.layers[0]
    quantized = llm.llm_engine.loaded.quantized
    for group, members in ((layer.self_attn.q_proj.group, ("q_proj", "k_proj", "v_proj")),
                           (layer.mlp.gate_proj.group, ("gate_proj", "up_proj"))):
        fused = group.linear.weights.blocks.data
        start = 0
        for member in members:
            name = next(n for n in quantized if n.startswith("model.layers.0.")
                        and n.endswith(f"{member}.weight"))
            view = quantized[name].data
            assert view.untyped_storage().data_ptr() == fused.untyped_storage().data_ptr()
            assert view.data_ptr() == fused[start:].data_ptr()
            assert torch.equal(view, before[name])  # the same bytes as the file's
            start += view.shape[0]
        assert start == fused.shape[0]


# families whose GGUF files transformers loads (tests/models/test_gguf_read.py has which)
GGUF_FAMILIES = [("qwen2", "Q4_1"), ("stablelm", "Q8_0"), ("falcon", "Q4_0"), ("bloom", "Q4_1"),
                 ("starcoder2", "Q8_0"), ("phi3", "Q4_0"), ("gemma2", "Q8_0")]


@pytest.mark.parametrize(("arch", "kind"), GGUF_FAMILIES)
def test_a_gguf_file_of_another_family_serves_from_its_blocks(tmp_path, arch, kind):
    """A tiny `arch` model written as a GGUF file (as llama.cpp's converter writes it) loads the
    way `dtype="gguf"` loads one: transformers' float32 model of the file, its blocks beside it
    (`read_quantized`); the engine on the blocks gives the float32 model's tokens."""
    tiny = tiny_model(arch, vocab_size=256)
    path = write_gguf(tiny.model, tmp_path / f"{arch}.gguf", kind)
    model = prepare_for_inference(transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, dtype=torch.float32), "cpu")
    reference = dataclasses.replace(tiny, model=copy.deepcopy(model), config=model.config)
    loaded = dataclasses.replace(tiny, model=model, config=model.config,
                                 quantized=read_quantized(path, model))
    assert loaded.quantized
    prompts = [{"prompt_token_ids": list(range(3, 3 + n))} for n in (5, 11, 2)]
    params = greedy(10, logprobs=2, ignore_eos=True)
    ours = make_llm(loaded)
    assert ours.llm_engine.runner.kernel.kernel == "gguf"
    got, want = ([o.outputs[0] for o in llm.generate(prompts, params, use_tqdm=False)]
                 for llm in (ours, make_llm(reference)))
    assert_close_logprobs(got, want, 2e-4)


def mixed_pair():
    """`quantized_pair("Q8_0")` with every V projection in Q4_0 blocks (as llama.cpp's mixes
    keep some V and down projections in another type than the rest: Q4_K_M's Q6_K)."""
    loaded, reference = quantized_pair("Q8_0")
    for name in list(loaded.quantized):
        if name.endswith("self_attn.v_proj.weight"):
            loaded.quantized[name] = QuantizedWeight.quantize(
                reference.model.get_parameter(name).detach(), "Q4_0")
            with torch.no_grad():
                reference.model.get_parameter(name).copy_(loaded.quantized[name].dequantize())
                loaded.model.get_parameter(name).copy_(loaded.quantized[name].dequantize())
    return loaded, reference


@pytest.mark.parametrize("kernel", ["gguf", "gguf_q8"])
def test_a_projection_of_parts_in_other_block_types_is_the_parts_apart(kernel):
    """Q/K/V whose V is another block type: one projection of three parts (each multiplied on
    its own blocks into its columns), bit for bit the parts' own products, bias and all."""
    if projections.TABLE[kernel].missing(torch.float32, cpu_features()) is not None:
        pytest.skip(f"the {kernel} kernel does not run here")
    gen = torch.Generator().manual_seed(0)
    sizes = ((48, "Q8_0"), (16, "Q8_0"), (40, "Q4_0"))  # a part not a multiple of 16 rows too
    parts = [QuantizedWeight.quantize(torch.randn(n, 64, generator=gen), kind)
             for n, kind in sizes]
    bias = torch.randn(sum(n for n, _ in sizes), generator=gen)
    # the kernel takes its blocks over ("gguf_q8" interleaves them in place): copies for each
    apart = [FastLinear(QuantizedWeight(p.kind, *p.shape, p.data.clone()), None, kernel)
             for p in parts]
    fused = FastLinear(parts, bias, kernel)
    assert [part.blocks.kind for part in fused.weights.parts] == ["Q8_0", "Q8_0", "Q4_0"]
    assert fused.c_function(1, torch.float32) is not None  # what a one-call step runs
    for rows in (1, 3):
        x = torch.randn(rows, 64, generator=gen)
        want = torch.cat([linear(x) for linear in apart], dim=-1) + bias
        assert torch.equal(fused(x), want)


@pytest.mark.parametrize("kernel", ["gguf", "gguf_q8"])
def test_mixed_block_kinds_in_one_group_are_parts_of_one_projection(kernel):
    """Q/K/V of different kinds are one fused projection of parts, so the lean loop and the
    one-call decode step serve the model (as for one kind); each member's blocks in
    `quantized` are the part's; still the dequantized model's tokens."""
    if projections.TABLE[kernel].missing(torch.float32, cpu_features()) is not None:
        pytest.skip(f"the {kernel} kernel does not run here")
    loaded, reference = mixed_pair()
    params = greedy(8, logprobs=2, ignore_eos=True)
    ours = make_llm(loaded, dtype="gguf",
                    gguf_activations="q8" if kernel == "gguf_q8" else "float32")
    runner = ours.llm_engine.runner
    group = runner.layers[0].self_attn.q_proj.group
    assert [part.blocks.kind for part in group.linear.weights.parts] == ["Q8_0", "Q8_0", "Q4_0"]
    assert runner.stack is not None and runner.stack.c_layers is not None
    quantized = ours.llm_engine.loaded.quantized
    name = next(n for n in quantized if n.endswith("layers.0.self_attn.v_proj.weight"))
    assert quantized[name] is group.linear.weights.parts[2].blocks
    got, want = outputs(ours, params), outputs(make_llm(reference), params)
    if kernel == "gguf":
        assert_close_logprobs(got, want, 2e-4)
    else:  # the first token: the activations' int8 quantization (~0.5% a product) apart
        for g, w in zip(got, want, strict=True):
            top = next(iter(w.logprobs[0]))
            assert abs(g.logprobs[0][top].logprob - w.logprobs[0][top].logprob) < 0.05


def test_batch_invariant_with_blocks():
    """A batch-invariant engine on blocks: one request alone and beside others, the same bits."""
    loaded, _ = quantized_pair("Q4_1")
    llm = make_llm(loaded, batch_invariant=True)
    params = greedy(10, logprobs=2, ignore_eos=True)
    alone = [o.outputs[0] for o in llm.generate(PROMPTS[:1], params, use_tqdm=False)]
    batched = outputs(llm, params)[:1]
    assert alone[0].token_ids == batched[0].token_ids and alone[0].logprobs == batched[0].logprobs
    # the block products sum a row in one order for any count: a decode step of every
    # sequence in one C call, as without batch invariance
    assert llm.llm_engine.runner.stack.one_call_rows >= len(PROMPTS)


def test_a_projection_without_blocks_keeps_its_kernels_invariant_rows():
    """One linear left float (the float32 kernel's C products change order from 7 rows on):
    a batch-invariant step goes in one C call only up to that kernel's rows."""
    loaded, _ = quantized_pair("Q8_0")
    del loaded.quantized["model.layers.0.self_attn.o_proj.weight"]
    runner = make_llm(loaded, batch_invariant=True).llm_engine.runner
    assert isinstance(runner.layers[0].self_attn.o_proj, FastLinear)
    assert runner.layers[0].self_attn.o_proj.kernel.name != "gguf"
    assert runner.stack.one_call_rows == INVARIANT_C_ROWS.get(
        runner.layers[0].self_attn.o_proj.kernel.name, 0)


def test_refusals_name_the_parameter():
    with pytest.raises(ValidationError, match="kernel 'onednn' .* GGUF") as err:
        projections.choose(torch.float32, "cpu", "onednn", blocks=True)
    assert err.value.parameter == "kernel"
    with pytest.raises(ValidationError, match="needs the CPU") as err:
        projections.choose(torch.float32, "cuda", blocks=True)
    assert err.value.parameter == "dtype"
    with pytest.raises(ValidationError, match="converted from a GGUF file") as err:
        load_model("all-minilm-l6-v2", dtype="gguf", progress=False)
    assert err.value.parameter == "dtype"
    with pytest.raises(TypeError, match="GGUF blocks"):
        FastLinear(torch.zeros(4, 32), None, "gguf")


@pytest.mark.slow
def test_smollm2_from_its_own_blocks():
    """The real file's Q4_1 layers and Q8_0 LM head: the same greedy tokens as the float32
    model transformers dequantized from it, logprobs within summation order."""
    params = SamplingParams(max_tokens=24, temperature=0, logprobs=3, ignore_eos=True)
    ours = LLM(model="smollm2-135m-instruct", dtype="gguf", max_model_len=256)
    quantized = ours.llm_engine.loaded.quantized
    kinds = {name.split(".")[-2]: w.kind for name, w in quantized.items()}
    # every layer's seven projections, and token_embd under both its names (the head is tied)
    assert len(quantized) == 30 * 7 + 2 and kinds["q_proj"] == "Q4_1"
    assert quantized["lm_head.weight"] is quantized["model.embed_tokens.weight"]
    assert kinds["lm_head"] == "Q8_0"
    got = outputs(ours, params)
    del ours
    want = outputs(LLM(model="smollm2-135m-instruct", dtype="float32", max_model_len=256), params)
    assert_close_logprobs(got, want, 2e-3)


@pytest.mark.parametrize("kind", ["Q4_K", "Q4_1"])
def test_k_quants_in_float32_activations_name_the_faster_arithmetic(kind, caplog):
    """A file of K-quants served in float32 activations (the default) says, once at start,
    that `gguf_activations="q8"` runs them about twice as fast; other block types do not."""
    loaded, _ = quantized_pair(kind)
    with caplog.at_level("INFO", logger="workbench.engine.step.runner"):
        make_llm(loaded)
    hinted = any("--gguf-activations q8" in r.getMessage() for r in caplog.records)
    assert hinted == (kind == "Q4_K")
