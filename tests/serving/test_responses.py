"""The Responses API over a scripted fake engine: items, store, events, errors (no model)."""

from __future__ import annotations

import asyncio

import pytest

from tests.serving.responses_helpers import ScriptedEngine
from workbench.errors import ValidationError
from workbench.serving import RequestMeta, ServerConfig, error_response
from workbench.serving.errors import ServingError
from workbench.serving.protocol.responses import ResponsesRequest
from workbench.serving.responses import ResponsesServing, ResponseStore


def serving(tokenizer, scripts=("Hello there, friend.",), store=None, **config):
    engine = ScriptedEngine(tokenizer, list(scripts))
    return ResponsesServing(engine, ServerConfig(**config), store=store), engine


def prompt_text(engine, tokenizer, index=-1) -> str:
    return tokenizer.decode(engine.submitted[index]["prompt"]["prompt_token_ids"])


async def create(s, **body):
    return await s.create(ResponsesRequest(**body), RequestMeta())


async def stream_events(s, **body) -> list[dict]:
    return [e async for e in await s.create_stream(ResponsesRequest(**body), RequestMeta())]


async def test_text_input_and_instructions_render_as_user_and_system(tokenizer):
    s, engine = serving(tokenizer)
    response = await create(s, input="Hi", instructions="Be brief.")
    assert response.status == "completed" and response.object == "response"
    assert response.output_text == "Hello there, friend."
    assert response.output[0]["type"] == "message" and response.output[0]["role"] == "assistant"
    assert "<|im_start|>system\nBe brief.<|im_end|>" in prompt_text(engine, tokenizer)
    assert "<|im_start|>user\nHi<|im_end|>" in prompt_text(engine, tokenizer)
    usage = response.usage
    assert usage.output_tokens == len(tokenizer("Hello there, friend.").input_ids)
    assert usage.input_tokens == len(engine.submitted[0]["prompt"]["prompt_token_ids"])
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0


async def test_input_items_become_messages_with_tool_calls_and_outputs(tokenizer):
    s, engine = serving(tokenizer)
    await create(s, input=[
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"},
    ])
    text = prompt_text(engine, tokenizer)
    assert "<|im_start|>user\nWeather in Paris?<|im_end|>" in text
    assert "<|im_start|>tool\nsunny, 21 C<|im_end|>" in text


@pytest.mark.parametrize("item, message", [
    ({"type": "image_generation_call"}, "Unsupported input item type: image_generation_call"),
    ({"type": "reasoning", "encrypted_content": "x"}, "Encrypted content is not supported."),
])
async def test_bad_input_items_are_400(tokenizer, item, message):
    s, _ = serving(tokenizer)
    with pytest.raises(ValidationError, match=message) as info:
        await create(s, input=[item])
    assert error_response(info.value).error.code == 400


async def test_previous_response_id_continues_the_stored_conversation(tokenizer):
    s, engine = serving(tokenizer, scripts=["First answer.", "Second answer."])
    first = await create(s, input="One?", instructions="Old instructions.")
    second = await create(s, input="Two?", previous_response_id=first.id,
                          instructions="New instructions.")
    text = prompt_text(engine, tokenizer)
    order = [text.index(part) for part in ("One?", "First answer.", "Two?")]
    assert order == sorted(order)
    assert "New instructions." in text and "Old instructions." not in text  # not carried over
    assert second.previous_response_id == first.id and second.output_text == "Second answer."


async def test_unknown_previous_response_is_the_reference_404(tokenizer):
    s, _ = serving(tokenizer)
    with pytest.raises(ServingError) as info:
        await create(s, input="Hi", previous_response_id="resp_nope")
    error = info.value.response.error
    assert (error.code, error.message, error.param) == (
        404, "Response with id 'resp_nope' not found.", "response_id")


async def test_store_false_and_retrieve(tokenizer):
    s, _ = serving(tokenizer)
    kept = await create(s, input="Hi")
    assert s.retrieve(kept.id).output_text == kept.output_text
    dropped = await create(s, input="Hi", store=False)
    assert dropped.store is False
    with pytest.raises(ServingError, match="not found"):
        s.retrieve(dropped.id)


async def test_store_is_a_bounded_lru(tokenizer):
    s, _ = serving(tokenizer, store=ResponseStore(max_size=2))
    a, b = await create(s, input="a"), await create(s, input="b")
    s.retrieve(a.id)  # a is now the most recently used
    c = await create(s, input="c")
    assert len(s.store) == 2 and a.id in s.store and c.id in s.store and b.id not in s.store


def test_store_size_is_a_server_setting(tokenizer):
    s, _ = serving(tokenizer, responses_store_size=7)
    assert s.store.max_size == 7 and s.store.enabled
    with pytest.raises(ValidationError, match="responses_store_size must be non-negative"):
        ServerConfig(responses_store_size=-1)


async def test_disabled_store_refuses_an_explicit_store_true(tokenizer):
    s, _ = serving(tokenizer, responses_store_size=0)
    assert (await create(s, input="Hi")).store is False  # the default is not a request
    with pytest.raises(ValidationError) as info:
        await create(s, input="Hi", store=True)
    assert info.value.parameter == "store"
    with pytest.raises(ValidationError, match="VLLM_ENABLE_RESPONSES_API_STORE"):
        await create(s, input="Hi", background=True)


async def test_cancel_of_a_synchronous_response_is_the_reference_400(tokenizer):
    s, _ = serving(tokenizer)
    done = await create(s, input="Hi")
    with pytest.raises(ServingError) as info:
        await s.cancel(done.id)
    assert info.value.response.error.message == "Cannot cancel a synchronous response."
    with pytest.raises(ServingError, match="not found"):
        await s.cancel("resp_nope")


async def test_background_response_is_queued_then_completed(tokenizer):
    s, _ = serving(tokenizer)
    queued = await create(s, input="Hi", background=True)
    assert (queued.status, queued.output, queued.usage, queued.background) == (
        "queued", [], None, True)
    await asyncio.gather(*s._background.values())
    done = s.retrieve(queued.id)
    assert done.status == "completed" and done.output_text == "Hello there, friend."


async def test_cancel_stops_a_running_background_response(tokenizer):
    s, engine = serving(tokenizer, scripts=["word " * 200])
    engine.step_delay = 0.01
    queued = await create(s, input="Hi", background=True)
    while not engine.submitted:
        await asyncio.sleep(0.01)
    cancelled = await s.cancel(queued.id)
    await asyncio.sleep(0.05)  # the abort runs in its own task
    assert cancelled.status == s.retrieve(queued.id).status == "cancelled"
    assert [i.rsplit("-", 1)[0] for i in engine.aborted] == [f"{queued.id}_0"]  # + a suffix
    with pytest.raises(ServingError, match="Cannot cancel a synchronous response."):
        await s.cancel(queued.id)


async def test_a_failed_background_response_is_stored_as_failed(tokenizer):
    s, engine = serving(tokenizer)
    engine.fail = True
    queued = await create(s, input="Hi", background=True)
    await asyncio.gather(*s._background.values())
    failed = s.retrieve(queued.id)
    assert failed.status == "failed" and failed.error["code"] == "500"


async def test_background_needs_store_and_no_stream(tokenizer):
    s, _ = serving(tokenizer)
    with pytest.raises(ValidationError, match="background can only be used when `store` is"):
        await create(s, input="Hi", background=True, store=False)
    with pytest.raises(ValidationError, match="`background` with `stream`"):
        await create(s, input="Hi", background=True, stream=True)


async def test_stream_events_in_the_reference_order_with_sequence_numbers(tokenizer):
    s, _ = serving(tokenizer)
    events = await stream_events(s, input="Hi")
    kinds = [e["type"] for e in events]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert len(deltas) > 1  # streamed as it is generated
    assert kinds[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    final = events[-1]["response"]
    assert "".join(d["delta"] for d in deltas) == final["output"][0]["content"][0]["text"] \
        == "Hello there, friend."
    assert events[0]["response"]["status"] == "in_progress" and final["status"] == "completed"
    assert events[-2]["item"] == final["output"][0]


async def test_max_output_tokens_ends_incomplete(tokenizer):
    s, engine = serving(tokenizer)
    response = await create(s, input="Hi", max_output_tokens=2)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 2 and engine.submitted[0]["params"].max_tokens == 2


async def test_prompt_longer_than_the_context_is_the_reference_400(tokenizer):
    s, engine = serving(tokenizer)
    engine.max_model_len = 32
    s.max_model_len = 32
    with pytest.raises(ValidationError, match=r"The engine prompt length \d+ exceeds the "
                                              r"max_model_len 32. Please reduce prompt."):
        await create(s, input="word " * 40)


@pytest.mark.parametrize("field, value", [
    ("prompt", {"id": "pmpt_1"}), ("truncation", "auto"), ("top_logprobs", 2),
    ("include", ["reasoning.encrypted_content"]), ("text", {"format": {"type": "xml"}}),
    ("max_output_tokens", 0), ("cache_salt", "x"), ("reasoning", {"summary": "auto"}),
])
async def test_fields_it_cannot_honour_are_refused_by_name(tokenizer, field, value):
    s, engine = serving(tokenizer)
    with pytest.raises(ValidationError) as info:
        await create(s, input="Hi", **{field: value})
    assert info.value.parameter in (field, "text", "reasoning") and not engine.submitted


async def test_sampling_fields_reach_the_engine(tokenizer):
    s, engine = serving(tokenizer)
    response = await create(s, input="Hi", temperature=0.5, top_p=0.9, seed=3, stop=["x"],
                            top_k=5)
    params = engine.submitted[0]["params"]
    assert (params.temperature, params.top_p, params.seed, params.stop, params.top_k) == (
        0.5, 0.9, 3, ["x"], 5)
    assert (response.temperature, response.top_p) == (0.5, 0.9)


async def test_enable_response_messages_returns_the_conversation(tokenizer):
    s, _ = serving(tokenizer)
    response = await create(s, input="Hi", enable_response_messages=True)
    assert response.input_messages == [{"role": "user", "content": "Hi"}]
    assert response.output_messages == [{"role": "assistant", "content": "Hello there, friend."}]


SCHEMA = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 12}},
          "required": ["colour"], "additionalProperties": False}


@pytest.mark.parametrize("body, field, value", [
    ({"text": {"format": {"type": "json_schema", "name": "c", "schema": SCHEMA}}}, "json",
     SCHEMA),
    ({"text": {"format": {"type": "json_object"}}}, "json_object", True),
    ({"structured_outputs": {"choice": ["yes", "no"]}}, "choice", ["yes", "no"]),
])
async def test_text_format_and_structured_outputs_constrain_generation(tokenizer, body, field,
                                                                        value):
    s, engine = serving(tokenizer)
    response = await create(s, input="A colour as JSON.", **body)
    constraint = engine.submitted[0]["params"].structured_outputs
    assert getattr(constraint, field) == value
    assert constraint.parameter == ("text" if "text" in body else "structured_outputs")
    if "text" in body:
        assert response.text == body["text"]  # echoed


@pytest.mark.parametrize("body, message", [
    ({"text": {"format": {"type": "json_object"}}, "structured_outputs": {"regex": "a+"}},
     "cannot be used together"),
    ({"text": {"format": {"type": "json_object"}}, "tools": [{"type": "calculator"}]},
     "either use constraints for structured outputs or tools"),
    ({"text": {"format": {"type": "json_schema", "schema": SCHEMA}}}, "name is required"),
])
async def test_bad_constraints_are_400_naming_text(tokenizer, body, message):
    s, engine = serving(tokenizer, tool_call_parser="hermes", enable_auto_tool_choice=True)
    with pytest.raises(ValidationError, match=message) as info:
        await create(s, input="Hi", **body)
    assert info.value.parameter == "text" and not engine.submitted


async def test_output_logprobs_need_plain_text(tokenizer):
    s, _ = serving(tokenizer, reasoning_parser="qwen3")
    with pytest.raises(ValidationError, match="with tools or a reasoning parser") as info:
        await create(s, input="Hi", include=["message.output_text.logprobs"])
    assert info.value.parameter == "include"
    with pytest.raises(ValidationError, match="between 0 and 20"):
        await create(s, input="Hi", include=["message.output_text.logprobs"], top_logprobs=21)


async def test_an_unfinished_assistant_item_is_continued(tokenizer):
    s, engine = serving(tokenizer)
    await create(s, input=[{"role": "user", "content": "Colour?"},
                           {"type": "message", "role": "assistant", "status": "in_progress",
                            "content": [{"type": "output_text", "text": "My favourite is"}]}])
    assert prompt_text(engine, tokenizer).endswith("<|im_start|>assistant\nMy favourite is")
    await create(s, input=[{"role": "user", "content": "Colour?"},
                           {"type": "message", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": "Blue."}]}])
    assert prompt_text(engine, tokenizer).endswith("Blue.<|im_end|>\n<|im_start|>assistant\n")


async def test_a_prompt_opened_think_tag_gives_a_reasoning_item(tokenizer):
    s, _ = serving(tokenizer, scripts=["Seven has no divisors.</think>Yes, it is prime."],
                   reasoning_parser="qwen3")
    response = await create(s, input=[
        {"role": "user", "content": "Is 7 prime?"},
        {"type": "message", "role": "assistant", "status": "in_progress", "content": "<think>\n"}])
    assert [i["type"] for i in response.output] == ["reasoning", "message"]
    assert response.output[0]["content"][0]["text"] == "Seven has no divisors."
    assert response.output_text == "Yes, it is prime."
    assert response.usage.output_tokens_details.reasoning_tokens > 0
