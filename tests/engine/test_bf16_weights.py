"""A float32 model from a bfloat16 checkpoint: on the "avx2" kernel its projections' weights, LM
head and input embedding stay bfloat16 as the checkpoint has them (half the bytes, read at half
the bandwidth), the model computing in float32 on the same values. Exact: the tokens and
logprobs are those of the same checkpoint widened to float32, bit for bit, and transformers'
greedy tokens; every other kernel gets the widened model."""

from __future__ import annotations

import pytest
import torch

from tests.engine.helpers import greedy, hf_greedy, ids_of, make_llm
from workbench.engine.kernels import projections
from workbench.engine.step.fusion import FastLinear
from workbench.models import load_model, tiny_model
from workbench.models.cpu import cpu_features
from workbench.models.loader import checkpoint_dtype, compute_dtype

needs_avx2 = pytest.mark.skipif(
    projections.missing("avx2", torch.float32, cpu_features()) is not None
    or not projections.reads_bf16_weights(), reason="the float32 kernel here is not avx2")
PROMPT = "The quick brown fox jumps over the lazy dog while the"


@pytest.fixture(scope="module", params=["llama", "qwen2", "gemma2"])
def bf16_dir(request, tmp_path_factory):
    """A tiny random model saved in bfloat16 (qwen2: projection biases; gemma2: a tied head
    and a scaled embedding)."""
    tiny = tiny_model(request.param, seed=0, dtype="bfloat16")
    path = tmp_path_factory.mktemp(f"bf16-{request.param}")
    tiny.model.save_pretrained(path)
    tiny.tokenizer.save_pretrained(path)
    return path


def test_the_loader_keeps_the_projections_bfloat16_and_widens_the_rest(bf16_dir):
    assert checkpoint_dtype(bf16_dir) == torch.bfloat16
    kept = load_model(bf16_dir, dtype="float32", bf16_weights=True, progress=False)
    model = kept.model
    assert kept.dtype == torch.float32 and compute_dtype(model) == torch.float32
    layer = model.model.layers[0]
    assert layer.self_attn.q_proj.weight.dtype == torch.bfloat16
    assert layer.mlp.down_proj.weight.dtype == torch.bfloat16
    assert model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert layer.input_layernorm.weight.dtype == torch.float32
    if layer.self_attn.q_proj.bias is not None:
        assert layer.self_attn.q_proj.bias.dtype == torch.float32
    ids = torch.tensor([[1, 2, 3]])
    assert model.get_input_embeddings()(ids).dtype == torch.float32
    widened = load_model(bf16_dir, dtype="float32", progress=False)  # the flag's default: off
    assert {p.dtype for p in widened.model.parameters()} == {torch.float32}
    assert compute_dtype(widened.model) == torch.float32


def test_a_float32_or_bfloat16_model_is_loaded_as_asked(bf16_dir, tiny_llama_dir):
    assert checkpoint_dtype(tiny_llama_dir) == torch.float32
    f32 = load_model(tiny_llama_dir, dtype="float32", bf16_weights=True, progress=False)
    assert {p.dtype for p in f32.model.parameters()} == {torch.float32}  # nothing to keep
    bf16 = load_model(bf16_dir, dtype="bfloat16", bf16_weights=True, progress=False)
    assert {p.dtype for p in bf16.model.parameters()} == {torch.bfloat16}
    assert compute_dtype(bf16.model) == torch.bfloat16


@needs_avx2
def test_the_engine_computes_the_widened_models_bits_on_the_kept_weights(bf16_dir):
    """LLM(dir, dtype="float32"): every projection reads its bfloat16 weight, and a request's
    tokens and logprobs are those of an engine on the same checkpoint widened to float32, bit
    for bit (a prompt under the 48 rows where the widened model's products go to BLAS)."""
    llm = make_llm(str(bf16_dir), dtype="float32")
    runner = llm.llm_engine.runner
    linears = [m for m in runner.model.modules() if isinstance(m, FastLinear)]
    assert linears and all(m.c_weight().dtype == torch.bfloat16 for m in linears)
    assert all(m.weight is None for m in linears)  # no float32 copy beside it
    params = greedy(12, logprobs=3)
    ours = llm.generate([PROMPT], params)[0].outputs[0]
    widened = make_llm(load_model(bf16_dir, dtype="float32", progress=False))
    assert widened.llm_engine.runner.model.model.layers[0].mlp.down_proj.c_weight().dtype \
        == torch.float32
    theirs = widened.generate([PROMPT], params)[0].outputs[0]
    assert ours.token_ids == theirs.token_ids
    assert [{k: v.logprob for k, v in step.items()} for step in ours.logprobs] == \
        [{k: v.logprob for k, v in step.items()} for step in theirs.logprobs]


@needs_avx2
def test_the_kept_weights_give_transformers_greedy_tokens_on_a_long_prompt(bf16_dir):
    """A prompt of more than 48 tokens (the prefill through the bfloat16 weights' products for
    every row count) and a continuation: transformers' greedy tokens in float32."""
    reference = load_model(bf16_dir, dtype="float32", progress=False)
    ids = ids_of(reference, " ".join([PROMPT] * 6))
    assert len(ids) > 48
    expected = hf_greedy(reference, ids, 10)
    llm = make_llm(str(bf16_dir), dtype="float32")
    got = llm.generate([{"prompt_token_ids": ids}], greedy(10))[0].outputs[0].token_ids
    assert list(got) == expected


@needs_avx2
def test_the_batch_invariant_engine_runs_on_the_kept_weights(bf16_dir):
    llm = make_llm(str(bf16_dir), dtype="float32", batch_invariant=True)
    params = greedy(8, logprobs=2)
    alone = llm.generate([PROMPT], params)[0].outputs[0]
    batch = llm.generate(["Hello", PROMPT, "A longer prompt of a few more words"], params)
    assert batch[1].outputs[0].token_ids == alone.token_ids
    assert batch[1].outputs[0].cumulative_logprob == alone.cumulative_logprob


def test_another_kernel_gets_the_widened_model(bf16_dir):
    """`kernel="torch"` multiplies float32 weights: nothing is kept bfloat16 for it."""
    assert not projections.reads_bf16_weights("torch")
    llm = make_llm(str(bf16_dir), dtype="float32", kernel="torch")
    assert {p.dtype for p in llm.llm_engine.runner.model.parameters()} == {torch.float32}
    assert llm.generate([PROMPT], greedy(4))[0].outputs[0].token_ids


@needs_avx2
def test_a_lora_adapter_on_the_kept_weights_computes_in_float32(bf16_dir, tmp_path):
    """The adapters' slots take the model's compute dtype (float32), not its first weight's
    (the kept embedding's bfloat16): a request with an adapter gets the widened model's bits."""
    from tests.lora.helpers import make_adapter
    from workbench.lora.request import LoRARequest

    net = load_model(bf16_dir, dtype="float32", progress=False).model
    adapter = make_adapter(tmp_path / "adapter", net=net,
                           targets=("q_proj", "v_proj", "down_proj"))
    request = LoRARequest("a", 1, str(adapter))
    params = greedy(8, logprobs=2)
    outs = []
    for loaded in (str(bf16_dir), load_model(bf16_dir, dtype="float32", progress=False)):
        llm = make_llm(loaded, dtype="float32", enable_lora=True, max_lora_rank=8)
        assert llm.llm_engine.lora.dtype == torch.float32
        out = llm.generate([PROMPT], params, lora_request=request)[0].outputs[0]
        outs.append((out.token_ids, out.cumulative_logprob))
    assert outs[0] == outs[1]


@needs_avx2
def test_inside_a_mixed_batch_the_kept_weights_give_transformers_greedy_tokens(bf16_dir):
    """Prompts of different lengths in one batch (rows of several requests in each step's
    products): each gets transformers' own greedy tokens on the widened checkpoint."""
    reference = load_model(bf16_dir, dtype="float32", progress=False)
    prompts = [ids_of(reference, text) for text in
               ("Hello", PROMPT, " ".join([PROMPT] * 5), "A few more words here")]
    expected = [hf_greedy(reference, ids, 8) for ids in prompts]
    llm = make_llm(str(bf16_dir), dtype="float32")
    outs = llm.generate([{"prompt_token_ids": ids} for ids in prompts], greedy(8))
    assert [list(out.outputs[0].token_ids) for out in outs] == expected
