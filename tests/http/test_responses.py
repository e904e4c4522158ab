"""`/v1/responses` through the official `openai` client against live servers on real SmolLM2.

Plain generation runs on the session's default server; the tool loop on a second server over
the same engine, configured as a user would for tools: the Hermes-style SmolLM2 template,
`--tool-call-parser hermes --enable-auto-tool-choice`. Where the loop must run, a named
`tool_choice` makes SmolLM2's tool request certain (constrained decoding writes the call).
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.http.conftest import MODEL
from workbench.serving.chat_tools import TOOLS_TEMPLATE
from workbench.tools import ToolError, evaluate

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@pytest.fixture(scope="module")
def tools_client(llm):
    from workbench import serve_in_kernel
    from workbench.serving import ServerConfig

    config = ServerConfig(chat_template=TOOLS_TEMPLATE.read_text(), tool_call_parser="hermes",
                          enable_auto_tool_choice=True)
    with serve_in_kernel(llm, port=0, config=config) as server:
        yield openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                            timeout=300)


def test_text_response_equals_the_chat_completion_of_the_same_conversation(client):
    response = client.responses.create(model=MODEL, input="Name a colour.", temperature=0,
                                       instructions="Answer in one word.", max_output_tokens=12)
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=[
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "Name a colour."}])
    assert response.object == "response" and response.id.startswith("resp_")
    assert response.output_text == chat.choices[0].message.content
    assert response.output[0].type == "message" and response.output[0].role == "assistant"
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    assert response.usage.output_tokens == chat.usage.completion_tokens
    assert response.usage.output_tokens_details.reasoning_tokens == 0


def test_stream_events_build_the_same_response(client):
    whole = client.responses.create(model=MODEL, input="Say hello.", temperature=0,
                                    max_output_tokens=10)
    events = list(client.responses.create(model=MODEL, input="Say hello.", temperature=0,
                                          max_output_tokens=10, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text == whole.output_text
    assert events[-1].response.status == whole.status


def test_sse_framing_has_event_lines_and_no_done(http):
    with http.stream("POST", "/v1/responses", json={
            "model": MODEL, "input": "Hi", "max_output_tokens": 3, "stream": True}) as r:
        body = r.read().decode()
    frames = [f for f in body.split("\n\n") if f]
    assert all(f.startswith("event: ") and "\ndata: " in f for f in frames)
    first = frames[0].split("\n")
    assert first[0] == "event: response.created"
    assert json.loads(first[1][len("data: "):])["type"] == "response.created"
    assert "[DONE]" not in body


def test_previous_response_id_chains_and_retrieve_returns_the_stored_response(client):
    first = client.responses.create(model=MODEL, input="My name is Ada.", temperature=0,
                                    max_output_tokens=12)
    second = client.responses.create(model=MODEL, input="What is my name?", temperature=0,
                                     max_output_tokens=12, previous_response_id=first.id)
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=[
        {"role": "user", "content": "My name is Ada."},
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": "What is my name?"}])
    assert second.output_text == chat.choices[0].message.content
    assert second.previous_response_id == first.id
    stored = client.responses.retrieve(second.id)
    assert stored.output_text == second.output_text and stored.usage == second.usage


def test_unknown_ids_are_404_and_cancel_of_a_finished_response_is_400(client):
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=MODEL, input="Hi", previous_response_id="resp_missing")
    assert info.value.body["message"] == "Response with id 'resp_missing' not found."
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")
    done = client.responses.create(model=MODEL, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.cancel(done.id)
    assert info.value.body["message"] == "Cannot cancel a synchronous response."


def test_validation_errors_name_their_parameter(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="Hi", tools=[{"type": "calculator"}])
    assert info.value.body["param"] == "tool_choice"  # this server has no tool parser
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="word " * 600)
    assert "exceeds the max_model_len 512. Please reduce prompt." in info.value.body["message"]
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="Hi", truncation="auto")
    assert info.value.body["param"] == "truncation"


def test_max_output_tokens_makes_an_incomplete_response(client):
    response = client.responses.create(model=MODEL, input="Tell me a long story.",
                                       max_output_tokens=4, temperature=0)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 4


def _check_calculator_round(call, output):
    assert call.type == "function_call" and call.name == "calculator"
    expression = json.loads(call.arguments)["expression"]
    assert output.type == "function_call_output" and output.call_id == call.call_id
    try:
        assert output.output == str(evaluate(expression))
    except ToolError as exc:
        assert output.output == f"Error: {exc}"  # the model's mistake, handed back to it


def test_builtin_calculator_loop_on_smollm2(tools_client):
    response = tools_client.responses.create(
        model=MODEL, input="What is 17 * 23?", tools=[{"type": "calculator"}],
        tool_choice={"type": "calculator"}, temperature=0, max_output_tokens=96,
        max_tool_calls=2)
    call, output, *rest = response.output
    _check_calculator_round(call, output)
    turns = response.usage.input_tokens_details.input_tokens_per_turn
    assert len(turns) >= 2 and turns[1] > turns[0]  # the next turn holds the call and result
    assert response.status in ("completed", "incomplete")


def test_streamed_calculator_loop_matches_its_final_output(tools_client):
    events = list(tools_client.responses.create(
        model=MODEL, input="What is 12 + 30?", tools=[{"type": "calculator"}],
        tool_choice={"type": "calculator"}, temperature=0, max_output_tokens=64,
        max_tool_calls=1, stream=True))
    final = events[-1].response
    done = [e.item for e in events if e.type == "response.output_item.done"]
    assert [d.model_dump() for d in done] == [o.model_dump() for o in final.output]
    arguments = "".join(e.delta for e in events
                        if e.type == "response.function_call_arguments.delta")
    assert arguments == final.output[0].arguments
    _check_calculator_round(final.output[0], final.output[1])


def test_function_tool_round_trip_with_the_client(tools_client):
    first = tools_client.responses.create(
        model=MODEL, input="What is the weather in Paris?", tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"}, temperature=0,
        max_output_tokens=32)
    (call,) = first.output
    assert call.type == "function_call" and call.name == "get_weather"
    assert set(json.loads(call.arguments)) == {"city"}
    second = tools_client.responses.create(
        model=MODEL, previous_response_id=first.id, tools=[WEATHER], temperature=0,
        max_output_tokens=24, input=[{"type": "function_call_output", "call_id": call.call_id,
                                      "output": "sunny, 21 C"}])
    assert second.output[-1].type == "message" or second.output[-1].type == "function_call"
    assert second.usage.input_tokens > first.usage.input_tokens


def _wait(client, response_id, statuses=("completed", "incomplete", "failed", "cancelled")):
    import time

    for _ in range(600):
        response = client.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        time.sleep(0.1)
    raise AssertionError(f"{response_id} still {response.status}")


def test_background_response_completes_and_can_be_cancelled(client):
    queued = client.responses.create(model=MODEL, input="Say hi.", background=True,
                                     temperature=0, max_output_tokens=6)
    assert queued.status == "queued" and queued.background and queued.output == []
    done = _wait(client, queued.id)
    plain = client.responses.create(model=MODEL, input="Say hi.", temperature=0,
                                    max_output_tokens=6)
    assert done.output_text == plain.output_text and done.status == plain.status
    long = client.responses.create(model=MODEL, input="Tell a long story.", background=True,
                                   max_output_tokens=400)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"


SCHEMA = {"type": "object", "properties": {
    "colour": {"type": "string", "maxLength": 12},
    "warm": {"type": "boolean"}}, "required": ["colour", "warm"], "additionalProperties": False}


def test_text_format_json_schema_output_validates(client):
    import jsonschema

    kwargs = dict(model=MODEL, input="Name a colour and whether it is warm, as JSON.",
                  temperature=0, max_output_tokens=60,
                  text={"format": {"type": "json_schema", "name": "colour", "schema": SCHEMA,
                                   "strict": True}})
    response = client.responses.create(**kwargs)
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    events = list(client.responses.create(**kwargs, stream=True))
    assert events[-1].response.output_text == response.output_text


def test_a_schema_the_backend_cannot_take_is_refused_before_the_stream(client):
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=MODEL, input="x", stream=True, text={"format": {
            "type": "json_schema", "name": "x", "schema": {"type": "strng"}}})
    assert info.value.body["param"] == "text"


def test_output_text_logprobs_equal_the_chat_logprobs(client):
    response = client.responses.create(model=MODEL, input="Name a colour.", temperature=0,
                                       max_output_tokens=6, top_logprobs=2,
                                       include=["message.output_text.logprobs"])
    chat = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=6,
                                          logprobs=True, top_logprobs=2,
                                          messages=[{"role": "user", "content": "Name a colour."}])
    ours = response.output[0].content[0].logprobs
    theirs = chat.choices[0].logprobs.content
    assert [(e.token, e.top_logprobs[0].token) for e in ours] == \
        [(e.token, e.top_logprobs[0].token) for e in theirs]
    assert [e.logprob for e in ours] == pytest.approx([e.logprob for e in theirs], abs=1e-5)
    events = list(client.responses.create(model=MODEL, input="Name a colour.", temperature=0,
                                          max_output_tokens=6, top_logprobs=2, stream=True,
                                          include=["message.output_text.logprobs"]))
    streamed = [lp for e in events if e.type == "response.output_text.delta"
                for lp in e.logprobs]
    assert [lp.token for lp in streamed] == [e.token for e in ours]


async def test_client_disconnects_abort_the_response(server, llm):
    import httpx

    from tests.http.test_concurrency import wait_idle

    before = llm.llm_engine.generation_tokens_total
    body = {"model": MODEL, "input": "Count to 1000.", "max_output_tokens": 400,
            "ignore_eos": True}
    async with httpx.AsyncClient(base_url=server.base_url, timeout=120) as http:
        async with http.stream("POST", "/responses", json={**body, "stream": True}) as r:
            async for line in r.aiter_lines():
                if line.startswith("event: response.output_text.delta"):
                    break  # hang up mid-answer
    await wait_idle(llm)
    streamed = llm.llm_engine.generation_tokens_total - before
    assert streamed < 400  # aborted, not run to its end
    async with httpx.AsyncClient(base_url=server.base_url, timeout=1.0) as http:
        with pytest.raises(httpx.TimeoutException):
            await http.post("/responses", json=body)
    await wait_idle(llm)
    assert llm.llm_engine.generation_tokens_total - before - streamed < 400


def test_an_unfinished_assistant_item_is_continued_as_chat_continue_final_message(client):
    response = client.responses.create(model=MODEL, temperature=0, max_output_tokens=8, input=[
        {"role": "user", "content": "Name a colour."},
        {"type": "message", "role": "assistant", "status": "in_progress",
         "content": [{"type": "output_text", "text": "My favourite colour is"}]}])
    chat = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=8, messages=[
            {"role": "user", "content": "Name a colour."},
            {"role": "assistant", "content": "My favourite colour is"}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert response.output_text == chat.choices[0].message.content
