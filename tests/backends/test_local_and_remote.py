"""The Workbench facade: the in-kernel engine and a live server URL give the same answers."""

from __future__ import annotations

import pytest

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def llm(default_model):
    from workbench import LLM

    return LLM(model=default_model, max_model_len=512, seed=0)


def test_greedy_completion_same_locally_and_over_http(local, remote):
    a = local.completions(PROMPT, max_tokens=5, temperature=0, logprobs=2)
    b = remote.completions(PROMPT, max_tokens=5, temperature=0, logprobs=2)
    assert a.ok and b.ok and a.text == b.text and a.text
    assert a.logprobs.tokens == b.logprobs.tokens
    assert a.logprobs.logprobs == pytest.approx(b.logprobs.logprobs, abs=1e-5)
    assert a.report.ok and a.trace["decode"].duration >= 0
    assert [s.kind for s in b.trace.spans] == ["client"]


def test_greedy_chat_same_locally_and_over_http(local, remote):
    a = local.chat(MESSAGES, max_tokens=5, temperature=0)
    b = remote.chat(MESSAGES, max_tokens=5, temperature=0)
    assert a.text == b.text and a.text


def test_streams_concatenate_to_the_non_streamed_text(local, remote):
    for wb in (local, remote):
        chunks = list(wb.stream_chat(MESSAGES, max_tokens=5, temperature=0))
        text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                       if c.get("choices"))
        assert text == wb.chat(MESSAGES, max_tokens=5, temperature=0).text
        chunks = list(wb.stream_completions(PROMPT, max_tokens=3, temperature=0))
        assert "".join(c["choices"][0]["text"] for c in chunks if c.get("choices")) \
            == wb.completions(PROMPT, max_tokens=3, temperature=0).text


def test_errors_are_results_with_the_servers_envelope(local, remote):
    a = local.completions(PROMPT, max_tokens=600)
    b = remote.completions(PROMPT, max_tokens=600)
    assert not a.ok and a.status_code == b.status_code == 400
    assert a.error == b.error
    assert a.report.failed[0].param == "max_tokens"


def test_utility_endpoints_agree(local, remote):
    assert local.tokenize("Hello world").response == remote.tokenize("Hello world").response
    ids = local.tokenize("Hello world").response["tokens"]
    assert local.detokenize(ids).response["prompt"] == "Hello world"
    assert remote.detokenize(ids).response == local.detokenize(ids).response
    assert local.models().response["data"][0]["id"] == remote.model == local.model


def test_validate_locally_and_through_the_validate_route(local, remote):
    body = {"prompt": "hi", "user": "me", "max_tokens": 600}
    a, b = local.validate(body), remote.validate(body)
    assert a == b
    assert [c.name for c in a.ignored] == ["user"] and a.failed[0].param == "max_tokens"


def test_beam_search_same_locally_and_client_side_over_http(local, remote):
    here = local.beam_search("The capital of France is", beam_width=2, max_tokens=3)
    there = remote.beam_search("The capital of France is", beam_width=2, max_tokens=3)
    assert [s.tokens for s in here.sequences] == [s.tokens for s in there.sequences]
    assert len(here.tree) == len(there.tree) > 0
    assert here.tree.best.token_id == there.tree.best.token_id
    from workbench.inspect import BeamTree

    assert isinstance(here.tree, BeamTree) and isinstance(there.tree, BeamTree)  # drawable


def test_offline_llm_and_the_in_kernel_server_agree(llm, remote):
    """What notebooks 05 and 08 show side by side: the offline `LLM` and the server in the same
    kernel give the same greedy text and the same logprob table."""
    from workbench import SamplingParams
    from workbench.inspect import LogprobTable

    offline = llm.chat(MESSAGES, SamplingParams(max_tokens=6, temperature=0, logprobs=3))[0]
    table = LogprobTable.from_request_output(offline, tokenizer=llm.get_tokenizer())
    over_http = remote.chat(MESSAGES, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    assert over_http.text == offline.outputs[0].text
    assert over_http.logprobs.tokens == table.tokens
    assert over_http.logprobs.logprobs == pytest.approx(table.logprobs, abs=1e-4)


def test_in_kernel_errors_name_the_keyword_arguments_beside_the_flags(local):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    chat = local.chat(MESSAGES, tools=tools, tool_choice="auto", max_tokens=2)
    message = chat.error["error"]["message"]
    assert chat.status_code == 400 and "--enable-auto-tool-choice" in message  # the server's words
    assert "enable_auto_tool_choice=..." in message and "tool_call_parser=..." in message
    assert "serve_in_kernel(llm, enable_auto_tool_choice=..., tool_call_parser=...)" in message
    respond = local.respond("Hi", tools=[{"type": "function", "name": "f",
                                          "parameters": {"type": "object"}}], tool_choice="auto")
    assert "enable_auto_tool_choice=..." in respond.error["error"]["message"]


def test_kernel_words_leave_other_errors_alone():
    from workbench.backends.local import kernel_words

    plain = {"error": {"message": "max_tokens must be at least 1, got 0.", "code": 400}}
    assert kernel_words(plain) == plain
    unknown = {"error": {"message": "see --not-a-server-flag", "code": 400}}
    assert kernel_words(unknown) == unknown
