"""Client-side beam search over our own server equals the engine's beam search (fp32)."""

from __future__ import annotations

import pytest

from workbench.inspect.remote_beam import remote_beam_search
from workbench.sampling_params import BeamSearchParams

PROMPTS = ["The capital of France is", "Reply with one word: yes or no?"]


@pytest.mark.parametrize("prompt", PROMPTS)
def test_remote_search_equals_the_engine_search(client, llm, prompt):
    params = BeamSearchParams(beam_width=3, max_tokens=5, length_penalty=1.0)
    remote = remote_beam_search(client, "smollm2-135m-instruct", prompt, params,
                                llm.get_tokenizer())
    local = llm.beam_search(prompt, params)[0]
    assert [s.tokens for s in remote.sequences] == [s.tokens for s in local.sequences]
    assert [s.text for s in remote.sequences] == [s.text for s in local.sequences]
    assert [s.cum_logprob for s in remote.sequences] == pytest.approx(
        [s.cum_logprob for s in local.sequences], abs=1e-4)
    assert [(n.token_id, n.status, n.parent) for n in remote.tree] == [
        (n.token_id, n.status, n.parent) for n in local.tree]


def test_remote_search_over_httpx(http, llm):
    params = BeamSearchParams(beam_width=2, max_tokens=3)
    remote = remote_beam_search(http, "smollm2-135m-instruct", PROMPTS[0], params,
                                llm.get_tokenizer())
    local = llm.beam_search(PROMPTS[0], params)[0]
    assert [s.tokens for s in remote.sequences] == [s.tokens for s in local.sequences]
    assert remote.tree.best.returned == 0
