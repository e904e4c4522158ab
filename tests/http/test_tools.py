"""Tool calling and reasoning through the official `openai` client, on the real SmolLM2 (fp32).

The server runs the shipped Hermes-style tools template (`workbench/serving/
chat_templates/smollm2_tools.jinja`) with `--enable-auto-tool-choice --tool-call-parser hermes
--reasoning-parser qwen3 --default-chat-template-kwargs '{"enable_thinking": false}'`: as in
vLLM 0.32, qwen3 reads all output as reasoning unless thinking is off, and SmolLM2 is no
thinking model; the reasoning tests turn it on per request. `required` and named choices are enforced by constrained decoding,
so even the 135M model returns valid calls. For `auto` the model is shown one earlier call
(few-shot) and `<tool_response>` is made unlikely with `logit_bias`, so it writes a real
`<tool_call>` of its own.
"""

from __future__ import annotations

import json

import jsonschema
import openai
import pytest

from tests.http.conftest import MODEL

pytestmark = pytest.mark.slow

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city", "unit"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Current time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}},
                   "required": ["timezone"]}}}
TOOLS = [WEATHER, TIME]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ROME = [{"role": "user", "content": "What's the weather in Rome?"}]
FEW_SHOT = [
    {"role": "user", "content": "What's the weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "22 C, sunny"},
    {"role": "assistant", "content": "It is 22 C and sunny in Paris."},
    *ROME,
]
THINKING = {"enable_thinking": True}  # the server's default is off
NOT_A_RESPONSE = {"7639": -100}  # the token "response" of "<tool_response>"


@pytest.fixture(scope="module")
def tools_server(llm):
    from workbench import serve_in_kernel
    from workbench.serving.chat_tools import TOOLS_TEMPLATE

    handle = serve_in_kernel(llm, port=0, chat_template=TOOLS_TEMPLATE.read_text(),
                             enable_auto_tool_choice=True, tool_call_parser="hermes",
                             reasoning_parser="qwen3",
                             default_chat_template_kwargs={"enable_thinking": False})
    yield handle
    handle.stop()


@pytest.fixture
def tc(tools_server):
    return openai.OpenAI(base_url=tools_server.base_url, api_key="unused", max_retries=0,
                         timeout=300)


def calls_of(message):
    return [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls or []]


def reassemble(stream):
    content, reasoning, calls, finish, chunks = "", "", {}, None, list(stream)
    for chunk in chunks:
        for choice in chunk.choices:
            delta = choice.delta
            content += delta.content or ""
            reasoning += getattr(delta, "reasoning", None) or ""
            for call in delta.tool_calls or []:
                if call.id is not None:
                    assert call.type == "function" and call.function.arguments == ""
                    calls[call.index] = [call.function.name, ""]
                else:
                    calls[call.index][1] += call.function.arguments
            finish = choice.finish_reason or finish
    return content, reasoning, [tuple(c) for c in calls.values()], finish, chunks


def test_auto_the_model_calls_a_tool_itself(tc):
    r = tc.chat.completions.create(model=MODEL, messages=FEW_SHOT, tools=TOOLS, temperature=0,
                                   max_tokens=60, logit_bias=NOT_A_RESPONSE)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    (name, arguments), = calls_of(choice.message)
    assert name == "get_weather" and arguments["city"] == "Rome"
    assert choice.message.tool_calls[0].id.startswith("chatcmpl-tool-")
    assert not choice.message.content


def test_auto_streamed_deltas_reassemble_to_the_same_call(tc):
    kwargs = dict(model=MODEL, messages=FEW_SHOT, tools=TOOLS, temperature=0, max_tokens=60,
                  logit_bias=NOT_A_RESPONSE)
    whole = tc.chat.completions.create(**kwargs).choices[0].message
    content, _, calls, finish, chunks = reassemble(tc.chat.completions.create(**kwargs,
                                                                              stream=True))
    assert finish == "tool_calls" and content == (whole.content or "")
    assert calls == [(c.function.name, c.function.arguments) for c in whole.tool_calls]
    fragments = [c for ch in chunks for choice in ch.choices for c in choice.delta.tool_calls or []]
    assert len(fragments) > 3  # the arguments really arrive in pieces


def test_tool_choice_none_returns_text_only(tc):
    r = tc.chat.completions.create(model=MODEL, messages=FEW_SHOT, tools=TOOLS, tool_choice="none",
                                   temperature=0, max_tokens=30, logit_bias=NOT_A_RESPONSE)
    assert r.choices[0].message.tool_calls is None and r.choices[0].finish_reason != "tool_calls"


@pytest.mark.parametrize("parallel", [True, False])
def test_required_always_returns_valid_calls(tc, parallel):
    r = tc.chat.completions.create(model=MODEL, messages=ROME, tools=TOOLS, temperature=0,
                                   tool_choice="required", parallel_tool_calls=parallel,
                                   max_tokens=120)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = calls_of(choice.message)
    assert calls and (parallel or len(calls) == 1)
    for name, arguments in calls:
        jsonschema.validate(arguments, SCHEMAS[name])


def test_required_streamed_equals_whole(tc):
    kwargs = dict(model=MODEL, messages=ROME, tools=TOOLS, temperature=0, tool_choice="required",
                  max_tokens=120)
    whole = tc.chat.completions.create(**kwargs).choices[0].message
    _, _, calls, finish, _ = reassemble(tc.chat.completions.create(**kwargs, stream=True))
    assert finish == "tool_calls"
    assert calls == [(c.function.name, c.function.arguments) for c in whole.tool_calls]


def test_named_choice_returns_that_tool_with_valid_arguments(tc):
    named = {"type": "function", "function": {"name": "get_time"}}
    r = tc.chat.completions.create(model=MODEL, messages=ROME, tools=TOOLS, tool_choice=named,
                                   temperature=0, max_tokens=60)
    choice = r.choices[0]
    (name, arguments), = calls_of(choice.message)
    assert name == "get_time" and choice.finish_reason == "stop"  # as the reference
    jsonschema.validate(arguments, SCHEMAS["get_time"])
    _, _, calls, finish, _ = reassemble(tc.chat.completions.create(
        model=MODEL, messages=ROME, tools=TOOLS, tool_choice=named, temperature=0, max_tokens=60,
        stream=True))
    assert calls == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    assert finish == "stop"


def test_reasoning_opened_by_the_prompt_is_returned_as_reasoning(tc):
    messages = [{"role": "user", "content": "Is 7 a prime number?"},
                {"role": "assistant", "content": "<think>\n"}]
    kwargs = dict(model=MODEL, messages=messages, temperature=0, max_tokens=12,
                  extra_body={"continue_final_message": True, "add_generation_prompt": False,
                              "chat_template_kwargs": THINKING})
    r = tc.chat.completions.create(**kwargs)
    message = r.choices[0].message
    assert message.reasoning and message.content is None
    assert r.usage.completion_tokens_details.reasoning_tokens == r.usage.completion_tokens == 12
    content, reasoning, _, _, chunks = reassemble(tc.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}))
    assert (reasoning, content) == (message.reasoning, "")
    assert chunks[-1].usage.completion_tokens_details.reasoning_tokens == 12
    kwargs["extra_body"]["include_reasoning"] = False
    hidden = tc.chat.completions.create(**kwargs).choices[0].message
    assert hidden.reasoning is None


def test_thinking_token_budget_ends_the_reasoning_by_force(tc, llm):
    """The prompt opens `<think>`; with a budget of 5 the engine forces `</think>` after five
    reasoning tokens and the answer follows (streamed the same way)."""
    messages = [{"role": "user", "content": "Is 7 a prime number?"},
                {"role": "assistant", "content": "<think>\n"}]
    kwargs = dict(model=MODEL, messages=messages, temperature=0, max_tokens=16,
                  extra_body={"continue_final_message": True, "add_generation_prompt": False,
                              "thinking_token_budget": 5, "return_token_ids": True,
                              "chat_template_kwargs": THINKING})
    r = tc.chat.completions.create(**kwargs)
    choice = r.choices[0]
    end = llm.get_tokenizer().encode("</think>", add_special_tokens=False)  # `</`, `think`, `>`
    assert choice.token_ids[5:5 + len(end)] == end
    assert r.usage.completion_tokens_details.reasoning_tokens == 5 + len(end)
    tokenizer = llm.get_tokenizer()
    assert choice.message.reasoning == tokenizer.decode(choice.token_ids[:5])
    answer = tokenizer.decode(choice.token_ids[5 + len(end):], skip_special_tokens=True)
    assert (choice.message.content or "") == answer  # what follows the forced tag
    content, reasoning, _, _, _ = reassemble(tc.chat.completions.create(**kwargs, stream=True))
    assert (reasoning, content) == (choice.message.reasoning, choice.message.content or "")
    unlimited = dict(kwargs, extra_body={**kwargs["extra_body"], "thinking_token_budget": -1})
    free = tc.chat.completions.create(**unlimited).choices[0]
    assert free.message.content is None and free.token_ids[:5] == choice.token_ids[:5]


@pytest.mark.parametrize(("endpoint", "body", "message"), [
    ("chat", {"thinking_token_budget": -2}, "thinking_token_budget must be -1 (no limit) or >= 0"),
    ("chat", {"thinking_token_budget": 3, "use_beam_search": True, "n": 2},
     "`thinking_token_budget` is not supported with beam search."),
    ("completions", {"thinking_token_budget": 3}, "it is not supported on /v1/completions"),
])
def test_bad_thinking_budgets_are_400s(tc, endpoint, body, message):
    with pytest.raises(openai.BadRequestError) as err:
        if endpoint == "chat":
            tc.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, extra_body=body)
        else:
            tc.completions.create(model=MODEL, prompt="x", max_tokens=2, extra_body=body)
    assert message in err.value.body["message"]
    assert err.value.body["param"] == "thinking_token_budget"


def test_a_server_without_reasoning_parser_refuses_a_budget(client):
    with pytest.raises(openai.BadRequestError, match="needs a reasoning parser"):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}],
                                       max_tokens=2, extra_body={"thinking_token_budget": 3})


def test_without_thinking_the_usage_has_no_reasoning_tokens_counted(tc):
    r = tc.chat.completions.create(model=MODEL, messages=ROME, temperature=0, max_tokens=5)
    assert r.choices[0].message.reasoning is None
    assert r.usage.completion_tokens_details.reasoning_tokens == 0


def test_with_thinking_qwen3_reads_an_untagged_output_as_reasoning(tc):
    """vLLM 0.32's qwen3: thinking on, the output is reasoning from its first token."""
    r = tc.chat.completions.create(model=MODEL, messages=ROME, temperature=0, max_tokens=5,
                                   extra_body={"chat_template_kwargs": THINKING})
    assert r.choices[0].message.content is None and r.choices[0].message.reasoning
    assert r.usage.completion_tokens_details.reasoning_tokens == 5


@pytest.mark.parametrize("kwargs,message", [
    ({"tools": [], "tool_choice": "auto"}, "`tools` must not be an empty array"),
    ({"tool_choice": "auto"}, "When using `tool_choice`, `tools` must be set."),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "The tool specified in `tool_choice` does not match any of the specified `tools`"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}},
      "response_format": {"type": "json_object"}},
     "You can only either use constraints for structured outputs or tools, not both."),
])
def test_bad_tool_requests_are_400s(tc, kwargs, message):
    with pytest.raises(openai.BadRequestError) as info:
        tc.chat.completions.create(model=MODEL, messages=ROME, max_tokens=2, **kwargs)
    assert message in info.value.body["message"]
    assert info.value.body["param"] in ("tools", "tool_choice")


@pytest.mark.parametrize("choice,message", [
    ("auto", '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser'),
    ("required", 'tool_choice="required" requires --tool-call-parser to be set'),
])
def test_a_server_without_parser_refuses_tool_choice(client, choice, message):
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model=MODEL, messages=ROME, tools=TOOLS,
                                       tool_choice=choice, max_tokens=2)
    assert message in info.value.body["message"] and info.value.body["param"] == "tool_choice"


CITY_TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"},
                                         "unit": {"enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.mark.parametrize("parallel", [None, False])
def test_a_required_call_closes_its_array_and_takes_only_the_declared_parameters(tc, parallel):
    """The case that looped: the calls are written on one line (no free whitespace to spend
    tokens on), so the array closes; the arguments take the parameters the tool declares."""
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}
    r = tc.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "What time is it in Tokyo?"}],
        tools=CITY_TOOLS, tool_choice="required", temperature=0, max_tokens=96, **extra)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    calls = calls_of(choice.message)
    assert calls and (parallel is None or len(calls) == 1)
    schemas = {t["function"]["name"]: {**t["function"]["parameters"],
                                       "additionalProperties": False} for t in CITY_TOOLS}
    for name, arguments in calls:
        jsonschema.validate(arguments, schemas[name])
    print(calls)
