"""The engine on a CUDA device (skipped without one): sampling and logprobs stay on the device.

Tiny llama in fp32 on the GPU: greedy equals transformers' generate there, seeded sampling is
reproducible, and n > 1, penalties, truncation and (prompt) logprobs run without moving tensors.
"""

import copy

import pytest
import torch

from tests.engine.helpers import greedy, hf_greedy, ids_of, make_llm
from workbench.sampling_params import SamplingParams

pytestmark = pytest.mark.gpu

PROMPTS = ["Hello, my name is", "The quick brown fox jumps over the lazy dog because"]


@pytest.fixture(scope="module")
def cuda_llama():
    from workbench.models import tiny_model

    return tiny_model("llama", seed=0, dtype="float32", device="cuda")


def test_greedy_on_cuda_matches_generate(cuda_llama):
    llm = make_llm(cuda_llama, block_size=4, max_num_batched_tokens=5)
    refs = [hf_greedy(cuda_llama, ids_of(cuda_llama, p), 12) for p in PROMPTS]
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, greedy(12))] == refs


def test_sampling_features_run_on_cuda(cuda_llama):
    llm = make_llm(cuda_llama, block_size=4)
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, min_p=0.01, seed=3, n=2,
                            max_tokens=8, logprobs=3, prompt_logprobs=2, repetition_penalty=1.2,
                            presence_penalty=0.5, logit_bias={5: 1.0}, ignore_eos=True)
    first, again = (llm.generate(PROMPTS, params) for _ in range(2))
    assert [[c.token_ids for c in o.outputs] for o in first] == \
           [[c.token_ids for c in o.outputs] for o in again]
    assert all(len(c.logprobs) == 8 for o in first for c in o.outputs)
    assert all(len(o.prompt_logprobs) == len(o.prompt_token_ids) for o in first)


def test_bf16_fused_path_on_cuda_stays_close_to_transformers():
    """bfloat16 on the GPU: fused projections and the lean decoder loop (kernel "torch", i.e.
    cuBLAS) keep logits within bf16 noise of transformers' own model, and the engine runs."""
    from workbench.engine.fusion import fuse_projections
    from workbench.models import tiny_model

    lm = tiny_model("llama", seed=0, dtype="bfloat16", device="cuda")
    fused = copy.deepcopy(lm.model)
    fuse_projections(fused)
    ids = lm.tokenizer("The quick brown fox jumps", return_tensors="pt").input_ids.to("cuda")
    with torch.inference_mode():
        torch.testing.assert_close(fused(ids).logits.float(), lm.model(ids).logits.float(),
                                   rtol=0.02, atol=0.02)
    llm = make_llm(lm, block_size=4)
    runner = llm.llm_engine.runner
    assert runner.kernel.kernel == "torch" and runner.stack is not None
    outs = llm.generate(PROMPTS, greedy(8, ignore_eos=True))
    assert all(len(o.outputs[0].token_ids) == 8 for o in outs)
