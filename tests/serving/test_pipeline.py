"""The serving pipeline end to end over a scripted fake engine (no model, milliseconds)."""

from __future__ import annotations

import json
import time

import pytest

from workbench.errors import ValidationError
from workbench.sampling_params import RequestOutputKind
from workbench.serving import RequestMeta, ServerConfig, Servings, error_response
from workbench.serving.errors import GenerationError
from workbench.serving.protocol import ChatCompletionRequest, CompletionRequest


def servings(engine, **config):
    return Servings.build(engine, ServerConfig(**config))


async def events(stream) -> list[dict]:
    return [json.loads(e) async for e in stream]


async def test_streamed_completion_text_equals_non_streamed(fake_engine):
    s = servings(fake_engine)
    whole = await s.completions.create(CompletionRequest(prompt="Hi", max_tokens=5), RequestMeta())
    chunks = await events(await s.completions.create_stream(
        CompletionRequest(prompt="Hi", max_tokens=5, stream=True), RequestMeta()))
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole.choices[0].text
    assert whole.choices[0].finish_reason == chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert whole.usage.completion_tokens == 5


async def test_only_streams_ask_the_engine_for_every_step(fake_engine):
    """Non-streaming requests ask for FINAL_ONLY (one output when they finish, as vLLM does);
    their time to first token still comes from the engine's first-token time."""
    s = servings(fake_engine)
    fake_engine.step_delay = 0.02
    whole = await s.completions.create(CompletionRequest(prompt="Hi", max_tokens=5), RequestMeta())
    await s.chat.create(ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=2), RequestMeta())
    await events(await s.completions.create_stream(
        CompletionRequest(prompt="Hi", max_tokens=2, stream=True), RequestMeta()))
    kinds = [params.output_kind for _, _, params in fake_engine.submitted]
    assert kinds == [RequestOutputKind.FINAL_ONLY, RequestOutputKind.FINAL_ONLY,
                     RequestOutputKind.DELTA]
    assert whole.choices[0].text == "Hello world, upon a"
    assert whole.choices[0].finish_reason == "length"


def test_the_first_token_time_is_the_engines(fake_engine):
    from workbench.engine.requests.outputs import RequestMetrics, RequestOutput
    from workbench.serving.generation import since_first_token
    from workbench.serving.recorder import PipelineRecorder

    now = time.time()
    late = RequestOutput("r", None, [1], None, [], True,
                         metrics=RequestMetrics(arrival_time=now - 3, first_token_time=now - 2))
    recorder = PipelineRecorder()
    recorder.output(0, late)
    assert recorder.first_output_at == now - 2
    assert 2 <= since_first_token(late) < 3
    assert since_first_token(RequestOutput("r", None, [1], None, [], True)) == 0.0


async def test_completion_chunks_have_every_choice_field_and_no_usage(fake_engine):
    chunks = await events(await servings(fake_engine).completions.create_stream(
        CompletionRequest(prompt="Hi", max_tokens=2, stream=True), RequestMeta()))
    assert chunks[0]["object"] == "text_completion"
    assert set(chunks[0]["choices"][0]) == {"index", "text", "logprobs", "finish_reason",
                                            "stop_reason", "prompt_token_ids", "token_ids"}
    assert all("usage" not in c for c in chunks)


async def test_usage_chunk_and_continuous_usage(fake_engine):
    request = CompletionRequest(prompt="Hi", max_tokens=3, stream=True, stream_options={
        "include_usage": True, "continuous_usage_stats": True})
    chunks = await events(await servings(fake_engine).completions.create_stream(request, RequestMeta()))
    assert [c["usage"]["completion_tokens"] for c in chunks[:-1]] == [1, 2, 3]
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"] == {"prompt_tokens": 1, "total_tokens": 4, "completion_tokens": 3}


async def test_chat_stream_opens_with_role_chunk(fake_engine):
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                    stream=True)
    chunks = await events(await servings(fake_engine).chat.create_stream(request, RequestMeta()))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert chunks[0]["object"] == "chat.completion.chunk"
    assert [c["choices"][0]["finish_reason"] for c in chunks[1:]] == [None, None, "length"]
    assert "stop_reason" in chunks[-1]["choices"][0] and "stop_reason" not in chunks[1]["choices"][0]


async def test_chat_streamed_text_equals_non_streamed(fake_engine):
    s = servings(fake_engine)
    messages = [{"role": "user", "content": "Hi"}]
    whole = await s.chat.create(ChatCompletionRequest(messages=messages, max_tokens=6), RequestMeta())
    chunks = await events(await s.chat.create_stream(
        ChatCompletionRequest(messages=messages, max_tokens=6, stream=True), RequestMeta()))
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        whole.choices[0].message.content


async def test_n_and_prompt_lists_index_choices_by_prompt_then_sample(fake_engine):
    request = CompletionRequest(prompt=["Hi", "Hello there"], n=2, temperature=1.0, max_tokens=2)
    response = await servings(fake_engine).completions.create(request, RequestMeta())
    assert [c.index for c in response.choices] == [0, 1, 2, 3]
    assert response.usage.prompt_tokens == 1 + 2
    assert response.usage.completion_tokens == 8


async def test_generation_error_is_500_or_an_error_event(fake_engine):
    fake_engine.fail_at = 1
    s = servings(fake_engine)
    with pytest.raises(GenerationError):
        await s.completions.create(CompletionRequest(prompt="Hi", max_tokens=4), RequestMeta())
    assert error_response(GenerationError()).error.code == 500
    chunks = await events(await s.completions.create_stream(
        CompletionRequest(prompt="Hi", max_tokens=4, stream=True), RequestMeta()))
    error = chunks[-1]["error"]
    assert (error["type"], error["param"], error["code"]) == ("InternalServerError", None, 500)
    assert error["message"] == "Internal server error"  # vLLM's; the log names the request


async def test_closing_a_stream_aborts_the_engine_request(fake_engine):
    fake_engine.step_delay = 0.01
    stream = await servings(fake_engine).completions.create_stream(
        CompletionRequest(prompt="Hi", max_tokens=8, stream=True), RequestMeta())
    await anext(stream)
    await stream.aclose()
    for _ in range(100):
        if fake_engine.aborted:
            break
        import asyncio
        await asyncio.sleep(0.01)
    assert fake_engine.aborted == [fake_engine.submitted[0][0]]
    assert not fake_engine.running


async def test_request_id_header_names_the_response_and_engine_requests(fake_engine):
    response = await servings(fake_engine).completions.create(
        CompletionRequest(prompt=["a", "b"], max_tokens=1), RequestMeta({"x-request-id": "abc"}))
    assert response.id == "cmpl-abc"
    ids = [r[0] for r in fake_engine.submitted]  # the client's id plus a random suffix
    assert [i.rsplit("-", 1)[0] for i in ids] == ["cmpl-abc-0", "cmpl-abc-1"]
    again = await servings(fake_engine).completions.create(
        CompletionRequest(prompt="a", max_tokens=1), RequestMeta({"x-request-id": "abc"}))
    assert again.id == "cmpl-abc" and fake_engine.submitted[-1][0] not in ids


async def test_data_parallel_rank_header(fake_engine):
    s = servings(fake_engine)
    await s.completions.create(CompletionRequest(prompt="a", max_tokens=1),
                               RequestMeta({"x-data-parallel-rank": "zero"}))  # ignored
    with pytest.raises(ValueError, match=r"data_parallel_rank 1 is out of range \[0, 1\)"):
        await s.completions.create(CompletionRequest(prompt="a", max_tokens=1),
                                   RequestMeta({"x-data-parallel-rank": "1"}))


async def test_engine_refusal_before_first_output_raises_before_streaming(fake_engine):
    request = CompletionRequest(prompt="Hi", max_tokens=2, logprobs=21, stream=True)
    with pytest.raises(ValidationError, match="greater than max allowed: 20"):
        await servings(fake_engine).completions.create_stream(request, RequestMeta())


async def test_echo_with_logprobs_prepends_the_prompt(fake_engine, tokenizer):
    request = CompletionRequest(prompt="Hello world", max_tokens=2, logprobs=1, echo=True)
    choice = (await servings(fake_engine).completions.create(request, RequestMeta())).choices[0]
    assert choice.text.startswith("Hello world")
    assert choice.logprobs.tokens[:2] == ["Hello", " world"]
    assert choice.logprobs.token_logprobs[0] is None
    assert choice.logprobs.text_offset[:3] == [0, 5, 11]


async def test_echo_without_generation_returns_only_the_prompt(fake_engine):
    request = CompletionRequest(prompt="Hello world", max_tokens=0, echo=True)
    response = await servings(fake_engine).completions.create(request, RequestMeta())
    assert response.choices[0].text == "Hello world"
    assert response.usage.completion_tokens == 0


async def test_return_tokens_as_token_ids_server_default(fake_engine):
    s = servings(fake_engine, return_tokens_as_token_ids=True)
    request = ChatCompletionRequest(messages=[{"role": "user", "content": "x"}], max_tokens=1,
                                    logprobs=True, top_logprobs=1)
    content = (await s.chat.create(request, RequestMeta())).choices[0].logprobs.content
    assert content[0].token == "token_id:19556"
    assert content[0].top_logprobs[0].token == "token_id:19556"


async def test_generation_defaults_fill_unset_fields(fake_engine):
    fake_engine.generation_defaults = {"temperature": 0.3, "top_k": 20, "max_tokens": 3}
    await servings(fake_engine).chat.create(ChatCompletionRequest(
        messages=[{"role": "user", "content": "x"}], top_k=5), RequestMeta())
    params = fake_engine.submitted[0][2]
    assert (params.temperature, params.top_k, params.max_tokens) == (0.3, 5, 3)


async def test_return_token_ids_first_chunk_carries_the_prompt_ids(fake_engine):
    request = CompletionRequest(prompt="Hello world", max_tokens=3, stream=True,
                                return_token_ids=True)
    chunks = await events(await servings(fake_engine).completions.create_stream(request, RequestMeta()))
    assert chunks[0]["choices"][0]["prompt_token_ids"] == [19556, 905]
    assert [c["choices"][0]["prompt_token_ids"] for c in chunks[1:]] == [None, None]
    assert [c["choices"][0]["token_ids"] for c in chunks] == [[19556], [905], [28]]


async def test_request_logger_logs_inputs_and_outputs(fake_engine, caplog):
    s = servings(fake_engine, enable_log_requests=True, max_log_len=3)
    with caplog.at_level("INFO", logger="workbench.requests"):
        await s.completions.create(CompletionRequest(prompt="Hello world", max_tokens=2),
                                   RequestMeta({"x-request-id": "r1"}))
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("Received request cmpl-r1-0: prompt: 'Hel'")
    assert lines[1].startswith("Finished request cmpl-r1: outputs: ['Hel']")


async def test_trace_headers_warn_once_while_tracing_is_off(fake_engine, caplog):
    s = servings(fake_engine)
    meta = RequestMeta({"traceparent": "00-abc-def-01"})
    with caplog.at_level("WARNING", logger="workbench.serving"):
        for _ in range(2):
            await s.completions.create(CompletionRequest(prompt="Hi", max_tokens=1), meta)
    assert sum("tracing is disabled" in r.getMessage() for r in caplog.records) == 1
