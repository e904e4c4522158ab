"""`gguf_activations="q8"`: the engine on llama.cpp's arithmetic (`projections.GgufQ8`): every
block product on int8 activations, a decode step in one C call, a row's bits its own in any
batch, refusals naming the option."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import greedy, make_llm
from tests.engine.test_gguf_engine import PROMPTS, outputs, quantized_pair
from workbench import LLM, SamplingParams
from workbench.apps import bench, cli
from workbench.config import EngineConfig
from workbench.engine.kernels import projections
from workbench.engine.step.fusion import FastLinear
from workbench.errors import ValidationError
from workbench.models.cpu import cpu_features

pytestmark = pytest.mark.skipif(
    projections.TABLE["gguf_q8"].missing(torch.float32, cpu_features()) is not None,
    reason="the gguf_q8 kernel does not run here")


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K"])
def test_every_block_product_on_q8(kind):
    loaded, _ = quantized_pair(kind)
    q8 = make_llm(loaded, dtype="gguf", gguf_activations="q8")
    runner = q8.llm_engine.runner
    assert runner.kernel.kernel == "gguf_q8" and "gguf_q8" in runner.kernel.describe()
    layer = runner.layers[0]
    for lin in (layer.self_attn.q_proj.group.linear, layer.self_attn.o_proj,
                layer.mlp.gate_proj.group.linear, layer.mlp.down_proj, q8.llm_engine.model.lm_head):
        assert isinstance(lin, FastLinear) and lin.kernel.name == "gguf_q8"
    assert runner.stack is not None and runner.stack.c_layers is not None  # one C call a step
    assert "gguf_activations='q8'" in repr(q8) and "gguf_activations" in q8._repr_html_()
    params = greedy(8, logprobs=3, ignore_eos=True)
    got = outputs(q8, params)
    del q8
    want = outputs(make_llm(loaded), params)  # the float32 arithmetic, on the same blocks
    # the first token's logprobs: the activations' quantization (~0.5% a product) apart
    for g, w in zip(got, want, strict=True):
        top = next(iter(w.logprobs[0]))
        assert abs(g.logprobs[0][top].logprob - w.logprobs[0][top].logprob) < 0.05


def test_models_route_names_the_arithmetic():
    """`/v1/models`: the base model's card says it computes on the file's blocks with
    llama.cpp's int8 activations."""
    import httpx

    from workbench import serve_in_kernel

    loaded, _ = quantized_pair("Q4_1")
    llm = make_llm(loaded, dtype="gguf", gguf_activations="q8")
    with serve_in_kernel(llm, port=0) as server:
        card = httpx.get(f"{server.base_url}/models", timeout=60).json()["data"][0]
    assert card["arithmetic"] == {"dtype": "gguf", "gguf_activations": "q8",
                                  "batch_invariant": False}


def test_the_engine_interleaves_the_blocks_in_place_and_says_so():
    """The q8 kernel reads Q4_1 interleaved by 16 rows: it rearranges the blocks it takes over
    in place (no second copy), and the loaded model's `quantized` entries say the new layout
    (read back, the same weights), so nothing reads them as GGML's."""
    loaded, _ = quantized_pair("Q4_1")
    # a tied LM head: its blocks under the embedding's name too (as `read_quantized` names them)
    loaded.quantized["model.embed_tokens.weight"] = loaded.quantized["lm_head.weight"]
    before = {name: (w.data.data_ptr(), w.dequantize()) for name, w in loaded.quantized.items()}
    llm = make_llm(loaded, dtype="gguf", gguf_activations="q8")
    head = llm.llm_engine.model.lm_head
    assert head.weights.blocks is loaded.quantized["lm_head.weight"]
    assert head.weights.c_weight.data_ptr() == before["lm_head.weight"][0]  # in place
    for name, weight in loaded.quantized.items():
        assert weight.layout == "rows16", name
        assert torch.equal(weight.dequantize(), before[name][1]), name
    with pytest.raises(TypeError, match="GGML's layout"):  # the float kernel reads GGML's
        projections.TABLE["gguf"].prepare(loaded.quantized["lm_head.weight"], None)


def test_a_rows_tokens_and_logprobs_are_its_own_in_any_batch():
    """Quantized per row, summed in one order: a request alone and beside others, the same
    bits, without batch_invariant (and with it)."""
    loaded, _ = quantized_pair("Q4_1")
    params = greedy(10, logprobs=2, ignore_eos=True)
    for extra in ({}, {"batch_invariant": True}):
        llm = make_llm(loaded, dtype="gguf", gguf_activations="q8", **extra)
        alone = [o.outputs[0] for o in llm.generate(PROMPTS[:1], params, use_tqdm=False)]
        batched = outputs(llm, params)[:1]
        assert alone[0].token_ids == batched[0].token_ids
        assert alone[0].logprobs == batched[0].logprobs
        del llm


def test_the_one_call_step_equals_the_loop():
    """A decode step in one C call computes what the lean loop's calls do (same functions)."""
    loaded, _ = quantized_pair("Q8_0")
    params = greedy(6, logprobs=2, ignore_eos=True)
    llm = make_llm(loaded, dtype="gguf", gguf_activations="q8")
    one_call = outputs(llm, params)
    llm.llm_engine.runner.stack.c_layers = None  # the loop, projection by projection
    llm.llm_engine.reset_prefix_cache()
    assert outputs(llm, params) == one_call


def test_refusals_name_the_option():
    with pytest.raises(ValidationError, match="--gguf-activations.*dtype='gguf'") as err:
        EngineConfig(dtype="float32", gguf_activations="q8")
    assert err.value.parameter == "gguf_activations"
    with pytest.raises(ValidationError, match="gguf_activations must be one of") as err:
        EngineConfig(dtype="gguf", gguf_activations="q4")
    assert err.value.parameter == "gguf_activations"
    with pytest.raises(ValidationError, match="LoRA") as err:
        EngineConfig(dtype="gguf", gguf_activations="q8", enable_lora=True)
    assert err.value.parameter == "gguf_activations"
    with pytest.raises(ValidationError, match="gguf_activations"):
        projections.choose(torch.float32, "cpu", blocks=True, activations="int4")
    assert EngineConfig(dtype="gguf", gguf_activations="q8").gguf_activations == "q8"
    assert "gguf_q8" not in projections.KERNELS  # never --kernel


def test_the_cli_and_the_bench_name_it(capsys):
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    assert "--gguf-activations" in capsys.readouterr().out
    args = cli.build_parser().parse_args(["serve", "--dtype", "gguf", "--gguf-activations", "q8"])
    assert cli.configs_from_args(args)[0].gguf_activations == "q8"
    config = bench.BenchConfig(dtype="gguf", gguf_activations="q8")
    assert bench.engine_extras(config) == {"gguf_activations": "q8"}
    assert bench.engine_extras(bench.BenchConfig()) == {}
    assert bench.bench_gguf_activations(None, bench.BenchConfig()) == {}  # not --dtype gguf


@pytest.mark.slow
def test_smollm2_on_q8():
    """The real file (Q4_1 layers, a Q8_0 head): greedy text close to the float32 arithmetic's
    (the first tokens the same), every projection on q8."""
    params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    q8 = LLM(model="smollm2-135m-instruct", dtype="gguf", gguf_activations="q8",
             max_model_len=256)
    assert q8.llm_engine.runner.kernel.kernel == "gguf_q8"
    got = outputs(q8, params)
    del q8
    want = outputs(LLM(model="smollm2-135m-instruct", dtype="gguf", max_model_len=256), params)
    assert sum(g.token_ids[:4] == w.token_ids[:4] for g, w in zip(got, want)) >= 2
