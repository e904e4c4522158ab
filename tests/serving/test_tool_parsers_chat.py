"""Tool calls and reasoning through the chat serving layer, over a scripted engine.

`ScriptedEngine` "generates" a fixed text one real token per step and stops with "stop", so
the chat layer's parsing (whole and streamed), finish reasons, usage and validation are
checked in milliseconds. The live-server tests are in tests/http/test_tools.py.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from tests.serving.conftest import FakeEngine
from tests.serving.tool_parser_samples import TIME, WEATHER
from workbench.engine.requests.outputs import CompletionOutput, RequestOutput
from workbench.errors import ValidationError
from workbench.serving import RequestMeta, ServerConfig, Servings
from workbench.serving.protocol import ChatCompletionRequest
from workbench.serving.tool_parsers.constrained import CALL_FORMAT

HERMES = ('Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", '
          '"days": 2}}\n</tool_call>\n<tool_call>\n{"name": "get_time", "arguments": {}}\n'
          "</tool_call>")
THINK = "<think>\nThe user asks for 2+2, which is 4.\n</think>\n\nThe answer is 4."
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@dataclass
class ScriptedEngine(FakeEngine):
    text: str = ""

    async def generate(self, prompt, params, request_id, priority=0):
        params.verify(self.vocab_size, self.config.max_logprobs)
        self.submitted.append((request_id, prompt, params))
        ids = self.tokenizer.encode(self.text, add_special_tokens=False)
        yield RequestOutput(request_id, None, prompt["prompt_token_ids"], None, [], False)
        for step, token in enumerate(ids):
            last = step + 1 == len(ids)
            outs = [CompletionOutput(i, self.tokenizer.decode([token]), [token], None,
                                     None, "stop" if last else None) for i in range(params.n)]
            yield RequestOutput(request_id, None, prompt["prompt_token_ids"], None, outs, last)


def chat(tokenizer, text, **config):
    engine = ScriptedEngine(tokenizer, max_model_len=2048, text=text)
    return Servings.build(engine, ServerConfig(**config)).chat


def request(**fields):
    base = dict(messages=ASK, tools=[WEATHER, TIME], max_tokens=200)
    return ChatCompletionRequest(**{**base, **fields})


async def stream_chunks(serving, req):
    return [json.loads(e) async for e in await serving.create_stream(req, RequestMeta())]


def reassemble(chunks):
    """content, reasoning, {index: [name, arguments, id]}, finish reason of choice 0."""
    content = reasoning = ""
    calls, finish = {}, None
    for chunk in chunks:
        for choice in chunk["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            reasoning += delta.get("reasoning") or ""
            for call in delta.get("tool_calls") or []:
                if "id" in call:
                    assert call["type"] == "function" and call["function"]["arguments"] == ""
                    calls[call["index"]] = [call["function"]["name"], "", call["id"]]
                else:
                    calls[call["index"]][1] += call["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    return content, reasoning, calls, finish


HERMES_SERVER = dict(enable_auto_tool_choice=True, tool_call_parser="hermes")


async def test_auto_tool_calls_in_a_whole_response(tokenizer):
    r = await chat(tokenizer, HERMES, **HERMES_SERVER).create(request(), RequestMeta())
    message = r.choices[0].message
    assert message.content == "Let me check.\n"
    assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] \
        == [("get_weather", {"city": "Paris", "days": 2}), ("get_time", {})]
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.usage.completion_tokens_details is None  # no reasoning parser


async def test_auto_tool_calls_streamed_reassemble_to_the_whole_response(tokenizer):
    serving = chat(tokenizer, HERMES, **HERMES_SERVER)
    whole = (await serving.create(request(), RequestMeta())).choices[0].message
    chunks = await stream_chunks(serving, request(stream=True))
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content, _, calls, finish = reassemble(chunks)
    assert content == whole.content and finish == "tool_calls"
    assert [(n, a) for n, a, _ in calls.values()] == \
        [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    assert all(i.startswith("chatcmpl-tool-") for _, _, i in calls.values())
    assert all("<tool_call>" not in (c["choices"][0]["delta"].get("content") or "")
               for c in chunks)


async def test_parallel_tool_calls_false_keeps_the_first_call(tokenizer):
    serving = chat(tokenizer, HERMES, **HERMES_SERVER)
    r = await serving.create(request(parallel_tool_calls=False), RequestMeta())
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    _, _, calls, _ = reassemble(await stream_chunks(serving, request(parallel_tool_calls=False,
                                                                     stream=True)))
    assert list(calls) == [0]


async def test_no_call_is_plain_content_with_finish_stop(tokenizer):
    r = await chat(tokenizer, "It is sunny in Paris.", **HERMES_SERVER).create(request(),
                                                                                RequestMeta())
    assert r.choices[0].message.content == "It is sunny in Paris."
    assert r.choices[0].message.tool_calls == [] and r.choices[0].finish_reason == "stop"


async def test_tool_choice_none_leaves_tool_text_as_content(tokenizer):
    r = await chat(tokenizer, HERMES, **HERMES_SERVER).create(request(tool_choice="none"),
                                                               RequestMeta())
    assert r.choices[0].message.content == HERMES and r.choices[0].finish_reason == "stop"


async def test_required_parses_the_constrained_json_array(tokenizer):
    text = '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'
    serving = chat(tokenizer, text, tool_call_parser="hermes")
    r = await serving.create(request(tool_choice="required"), RequestMeta())
    assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] \
        == [("get_weather", '{"city": "Oslo"}')]
    assert r.choices[0].finish_reason == "tool_calls"
    assert r.choices[0].message.content == ""  # as vLLM: "" with required / named
    _, _, calls, finish = reassemble(await stream_chunks(serving, request(tool_choice="required",
                                                                          stream=True)))
    assert [(n, a) for n, a, _ in calls.values()] == [("get_weather", '{"city": "Oslo"}')]
    assert finish == "tool_calls"


async def test_named_choice_output_is_the_arguments_and_finishes_with_stop(tokenizer):
    named = {"type": "function", "function": {"name": "get_weather"}}
    serving = chat(tokenizer, '{"city": "Rome"}', tool_call_parser="hermes")
    r = await serving.create(request(tool_choice=named), RequestMeta())
    assert [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls] \
        == [("get_weather", '{"city": "Rome"}')]
    assert r.choices[0].finish_reason == "stop"
    _, _, calls, finish = reassemble(await stream_chunks(serving, request(tool_choice=named,
                                                                          stream=True)))
    assert [(n, a) for n, a, _ in calls.values()] == [("get_weather", '{"city": "Rome"}')]
    assert finish == "stop"


@pytest.mark.parametrize("config,choice,message", [
    ({}, "auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'),
    ({"tool_call_parser": "hermes"}, "auto", '"auto" tool choice requires'),
    ({}, "required", 'tool_choice="required" requires --tool-call-parser to be set'),
    ({}, {"type": "function", "function": {"name": "get_time"}}, "requires --tool-call-parser"),
])
async def test_tool_choice_needs_the_server_flags(tokenizer, config, choice, message):
    with pytest.raises(ValidationError, match=message) as info:
        await chat(tokenizer, HERMES, **config).create(request(tool_choice=choice), RequestMeta())
    assert info.value.parameter == "tool_choice"


async def test_named_choice_with_an_output_constraint_is_refused(tokenizer):
    serving = chat(tokenizer, "{}", tool_call_parser="hermes")
    with pytest.raises(ValidationError, match="either use constraints for structured outputs "
                                              "or tools, not both"):
        await serving.create(request(tool_choice={"type": "function", "function": {
            "name": "get_time"}}, response_format={"type": "json_object"}), RequestMeta())


async def test_reasoning_in_a_whole_response_with_reasoning_tokens(tokenizer):
    r = await chat(tokenizer, THINK, reasoning_parser="deepseek_r1").create(
        request(tools=None), RequestMeta())
    message = r.choices[0].message
    assert message.reasoning == "\nThe user asks for 2+2, which is 4.\n"
    assert message.content == "\n\nThe answer is 4."
    ids = tokenizer.encode(THINK, add_special_tokens=False)
    count = r.usage.completion_tokens_details["reasoning_tokens"]
    assert tokenizer.decode(ids[:count]).endswith("</think>") and count < len(ids)


async def test_reasoning_streamed_equals_whole_and_usage_counts_it(tokenizer):
    serving = chat(tokenizer, THINK, reasoning_parser="deepseek_r1")
    whole = await serving.create(request(tools=None), RequestMeta())
    chunks = await stream_chunks(serving, request(tools=None, stream=True,
                                                  stream_options={"include_usage": True}))
    content, reasoning, _, finish = reassemble(chunks)
    assert (reasoning, content) == (whole.choices[0].message.reasoning,
                                    whole.choices[0].message.content)
    assert finish == "stop"
    assert chunks[-1]["usage"]["completion_tokens_details"] == \
        whole.usage.completion_tokens_details


async def test_include_reasoning_false_drops_reasoning_and_stream_logprobs(tokenizer):
    serving = chat(tokenizer, THINK, reasoning_parser="deepseek_r1")
    r = await serving.create(request(tools=None, include_reasoning=False), RequestMeta())
    assert r.choices[0].message.reasoning is None
    assert r.choices[0].message.content == "\n\nThe answer is 4."
    chunks = await stream_chunks(serving, request(tools=None, include_reasoning=False,
                                                  stream=True, return_token_ids=True))
    content, reasoning, _, _ = reassemble(chunks)
    assert (reasoning, content) == ("", "\n\nThe answer is 4.")
    assert all(c["choices"][0].get("token_ids") is None for c in chunks[1:])


async def test_reasoning_then_tool_calls(tokenizer):
    text = "<think>I need the weather tool.</think>\n" + HERMES.split("\n", 1)[1]
    serving = chat(tokenizer, text, reasoning_parser="qwen3", **HERMES_SERVER)
    r = await serving.create(request(), RequestMeta())
    message = r.choices[0].message
    assert message.reasoning == "I need the weather tool."
    assert [c.function.name for c in message.tool_calls] == ["get_weather", "get_time"]
    assert r.choices[0].finish_reason == "tool_calls"
    content, reasoning, calls, finish = reassemble(await stream_chunks(
        serving, request(stream=True)))
    assert reasoning == message.reasoning and content == (message.content or "")
    assert [(n, a) for n, a, _ in calls.values()] == \
        [(c.function.name, c.function.arguments) for c in message.tool_calls]


async def test_tools_reach_the_chat_template(tokenizer):
    from workbench.serving.chat_tools import TOOLS_TEMPLATE

    serving = chat(tokenizer, HERMES, chat_template=TOOLS_TEMPLATE.read_text(), **HERMES_SERVER)
    await serving.create(request(), RequestMeta())
    prompt_ids = serving.engine.submitted[-1][1]["prompt_token_ids"]
    prompt = tokenizer.decode(prompt_ids)
    assert "<tools>" in prompt and '"name": "get_weather"' in prompt
    assert "<tool_call>" in prompt  # the instructions show the call format


async def test_required_and_named_set_the_tools_json_schema_as_the_constraint(tokenizer):
    serving = chat(tokenizer, "[]", tool_call_parser="hermes")
    await serving.create(request(tool_choice="required", parallel_tool_calls=False),
                         RequestMeta())
    so = serving.engine.submitted[-1][2].structured_outputs
    assert so.after_token_ids is None and so.json["maxItems"] == 1
    assert so.json["minItems"] == 1 and so.json["type"] == "array"
    variants = so.json["items"]["anyOf"]
    assert [v["properties"]["name"] for v in variants] == [{"type": "string", "enum": ["get_weather"]},
                                                           {"type": "string", "enum": ["get_time"]}]
    assert variants[0]["properties"]["parameters"] == WEATHER["function"]["parameters"]
    assert variants[1]["properties"]["parameters"] == {"type": "object", "properties": {}}
    # written on one line, no free whitespace; only the parameters the tool declares
    assert so.json["x-guidance"] == CALL_FORMAT and so.disable_additional_properties
    await serving.create(request(tool_choice={"type": "function", "function": {
        "name": "get_weather"}}), RequestMeta())
    named = serving.engine.submitted[-1][2].structured_outputs
    assert named.json == {**WEATHER["function"]["parameters"], "x-guidance": CALL_FORMAT}
    assert named.disable_additional_properties


@pytest.mark.parametrize("parser", ["deepseek_r1", "qwen3"])
async def test_with_reasoning_the_constraint_starts_after_the_end_tag(tokenizer, parser):
    serving = chat(tokenizer, "[]", tool_call_parser="hermes", reasoning_parser=parser)
    await serving.create(request(tool_choice="required"), RequestMeta())
    so = serving.engine.submitted[-1][2].structured_outputs
    assert so.after_token_ids == tokenizer.encode("</think>", add_special_tokens=False)


async def test_qwen3_without_thinking_constrains_from_the_first_token(tokenizer):
    serving = chat(tokenizer, "[]", tool_call_parser="hermes", reasoning_parser="qwen3")
    await serving.create(request(tool_choice="required",
                                 chat_template_kwargs={"enable_thinking": False}), RequestMeta())
    assert serving.engine.submitted[-1][2].structured_outputs.after_token_ids is None


async def test_each_choice_has_its_own_parser(tokenizer):
    serving = chat(tokenizer, HERMES, **HERMES_SERVER)
    r = await serving.create(request(n=2, temperature=1.0), RequestMeta())
    assert [len(c.message.tool_calls) for c in r.choices] == [2, 2]
    assert len({c.id for choice in r.choices for c in choice.message.tool_calls}) == 4
    chunks = await stream_chunks(serving, request(n=2, temperature=1.0, stream=True))
    for index in (0, 1):
        mine = [{**c, "choices": [ch for ch in c["choices"] if ch["index"] == index]}
                for c in chunks]
        content, _, calls, finish = reassemble(mine)
        assert content == "Let me check.\n" and finish == "tool_calls"
        assert [(n, a) for n, a, _ in calls.values()] == \
            [(c.function.name, c.function.arguments) for c in r.choices[index].message.tool_calls]


async def test_required_with_beam_search_is_refused_not_left_unconstrained(tokenizer):
    with pytest.raises(ValidationError, match="beam search does not support") as info:
        await chat(tokenizer, "[]", tool_call_parser="hermes").create(
            request(tool_choice="required", use_beam_search=True, n=2), RequestMeta())
    assert info.value.parameter == "tool_choice"


@pytest.mark.parametrize("least", [16, 10_000])
async def test_min_characters_chunks_parse_to_the_same_reasoning_and_tool_calls(tokenizer,
                                                                                 least):
    text = "<think>I need the weather tool.</think>\n" + HERMES.split("\n", 1)[1]
    serving = chat(tokenizer, text, reasoning_parser="qwen3", **HERMES_SERVER)
    message = (await serving.create(request(), RequestMeta())).choices[0].message
    every = await stream_chunks(serving, request(stream=True))
    held = await stream_chunks(serving, request(stream=True,
                                                stream_options={"min_characters": least}))
    content, reasoning, calls, finish = reassemble(held)
    assert (reasoning, content, finish) == (message.reasoning, message.content or "",
                                            "tool_calls")
    assert [(n, a) for n, a, _ in calls.values()] == \
        [(c.function.name, c.function.arguments) for c in message.tool_calls]
    assert len(held) < len(every)
