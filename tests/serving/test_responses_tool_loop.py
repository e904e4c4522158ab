"""The built-in tool loop and function tools over a scripted engine (no model).

The engine answers each round with a script; a script may be exactly what a Hermes-style model
writes to call a tool, so the loop's rounds, ids, priorities and bounds are checked exactly.
"""

from __future__ import annotations

import json

import pytest

from tests.serving.responses_helpers import ScriptedEngine
from workbench.errors import ValidationError
from workbench.serving import RequestMeta, ServerConfig, Servings
from workbench.serving.chat_tools import TOOLS_TEMPLATE
from workbench.serving.protocol.responses import ResponsesRequest
from workbench.serving.responses import ResponsesServing
from workbench.serving.tool_parsers.constrained import CALL_FORMAT
from workbench.tools import Calculator, LocalToolServer, ToolSpec

CALCULATOR = [{"type": "calculator"}]
WEATHER = {"type": "function", "name": "weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def call(name: str, **arguments) -> str:
    return ("<tool_call>\n" + json.dumps({"name": name, "arguments": arguments})
            + "\n</tool_call>")


def serving(tokenizer, scripts, *, tool_parser="hermes", reasoning_parser=None, tool_server=None,
            max_model_len=2048, auto=True):
    engine = ScriptedEngine(tokenizer, list(scripts), max_model_len=max_model_len)
    config = ServerConfig(chat_template=TOOLS_TEMPLATE.read_text(), tool_call_parser=tool_parser,
                          enable_auto_tool_choice=auto and tool_parser is not None,
                          reasoning_parser=reasoning_parser)
    return ResponsesServing(engine, config, tool_server=tool_server), engine


async def create(s, **body):
    return await s.create(ResponsesRequest(**body), RequestMeta())


def prompt(engine, tokenizer, index) -> str:
    return tokenizer.decode(engine.submitted[index]["prompt"]["prompt_token_ids"])


async def test_builtin_tool_round_trip(tokenizer):
    s, engine = serving(tokenizer, [call("calculator", expression="6 * 7"), "It is 42."])
    response = await create(s, input="What is 6 times 7?", tools=CALCULATOR)
    kinds = [item["type"] for item in response.output]
    assert kinds == ["function_call", "function_call_output", "message"]
    fc, out, message = response.output
    assert (fc["name"], json.loads(fc["arguments"])) == ("calculator", {"expression": "6 * 7"})
    assert out["call_id"] == fc["call_id"] and out["output"] == "42"
    assert message["content"][0]["text"] == "It is 42." and response.status == "completed"
    first, second = prompt(engine, tokenizer, 0), prompt(engine, tokenizer, 1)
    assert '"name": "calculator"' in first.split("<tools>")[-1]  # the tool, rendered
    assert second.endswith('<|im_start|>assistant\n<tool_call>\n{"name": "calculator", '
                           '"arguments": {"expression": "6 * 7"}}\n</tool_call><|im_end|>\n'
                           "<|im_start|>tool\n<tool_response>\n42\n</tool_response><|im_end|>\n"
                           "<|im_start|>assistant\n")


async def test_each_round_is_a_sub_request_with_a_unique_id_and_lowered_priority(tokenizer):
    s, engine = serving(tokenizer, [call("calculator", expression="1+1"),
                                    call("calculator", expression="2+2"), "Done."])
    response = await create(s, input="Add.", tools=CALCULATOR, priority=5)
    ids = [sub["id"].rsplit("-", 1)[0] for sub in engine.submitted]  # less the random suffix
    assert ids == [f"{response.id}_0", f"{response.id}_1", f"{response.id}_2"]
    assert [sub["priority"] for sub in engine.submitted] == [5, 4, 4]  # the reference's orig - 1
    usage = response.usage
    assert usage.input_tokens_details.input_tokens_per_turn == [
        len(sub["prompt"]["prompt_token_ids"]) for sub in engine.submitted]
    assert usage.input_tokens == sum(usage.input_tokens_details.input_tokens_per_turn)
    assert usage.output_tokens == sum(usage.output_tokens_details.output_tokens_per_turn)
    assert usage.output_tokens_details.tool_output_tokens_per_turn[:2] == [1, 1]


@pytest.mark.parametrize("expression", [
    "__import__('os').system('echo pwned')", "9 ** 9 ** 9", "(" * 40 + "1" + " + 1)" * 40,
    "open('/etc/passwd').read()", "x * 2",
])
async def test_hostile_tool_input_becomes_an_error_for_the_model(tokenizer, expression):
    s, engine = serving(tokenizer, [call("calculator", expression=expression), "Sorry."])
    response = await create(s, input="Compute.", tools=CALCULATOR)
    output = response.output[1]["output"]
    assert output.startswith("Error: ") and response.status == "completed"
    assert len(engine.submitted) == 2  # the model read the error and answered


async def test_a_failing_tool_never_fails_the_request(tokenizer):
    class Broken:
        spec = ToolSpec("broken", "always fails", {"type": "object"})

        def run(self, arguments):
            raise RuntimeError("disk on fire")

    s, _ = serving(tokenizer, [call("broken"), "Oh no."], tool_server=LocalToolServer([Broken()]))
    response = await create(s, input="Go.", tools=[{"type": "broken"}])
    assert response.output[1]["output"] == "Error: disk on fire"
    assert response.output_text == "Oh no."


async def test_max_tool_calls_ends_the_loop_incomplete(tokenizer):
    s, engine = serving(tokenizer, [call("calculator", expression="1+1")])  # asks forever
    response = await create(s, input="Loop.", tools=CALCULATOR, max_tool_calls=2)
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_tool_calls"
    assert len(engine.submitted) == 3
    assert [i["type"] for i in response.output].count("function_call_output") == 2


async def test_a_next_turn_that_does_not_fit_ends_incomplete(tokenizer):
    s, engine = serving(tokenizer, [call("calculator", expression="1+1"), "Two."])
    request = {"input": "Add one and one.", "tools": CALCULATOR}
    probe, probe_engine = serving(tokenizer, [call("calculator", expression="1+1"), "Two."])
    await create(probe, **request)
    second_prompt = len(probe_engine.submitted[1]["prompt"]["prompt_token_ids"])
    s.max_model_len = engine.max_model_len = second_prompt  # round 1 fits, round 2 has no room
    response = await create(s, **request)
    assert (response.status, response.incomplete_details.reason) == (
        "incomplete", "context_length")
    assert len(engine.submitted) == 1 and response.output[1]["type"] == "function_call_output"


async def test_max_output_tokens_bounds_each_round(tokenizer):
    """As vLLM 0.32: every round may generate `max_output_tokens` (not a total)."""
    script = call("calculator", expression="1+1")
    answer = "Two, certainly, as everyone knows."
    s, engine = serving(tokenizer, [script, answer])
    budget = len(tokenizer(script).input_ids) + 3
    assert len(tokenizer(answer).input_ids) > 3
    response = await create(s, input="Add.", tools=CALCULATOR, max_output_tokens=budget)
    assert [e["params"].max_tokens for e in engine.submitted] == [budget, budget]
    assert response.status == "completed", response.incomplete_details
    assert response.output_text == answer


async def test_max_output_tokens_cuts_a_round_incomplete(tokenizer):
    s, engine = serving(tokenizer, ["Two, certainly, as everyone knows."])
    response = await create(s, input="Add.", max_output_tokens=3)
    assert response.usage.output_tokens == 3
    assert response.incomplete_details.reason == "max_output_tokens"


async def test_function_tool_call_ends_the_response_for_the_client(tokenizer):
    s, engine = serving(tokenizer, [call("weather", city="Paris"), "Sunny in Paris."])
    first = await create(s, input="Weather in Paris?", tools=[WEATHER, *CALCULATOR])
    assert [i["type"] for i in first.output] == ["function_call"]
    fc = first.output[0]
    assert fc["name"] == "weather" and json.loads(fc["arguments"]) == {"city": "Paris"}
    assert first.status == "completed" and len(engine.submitted) == 1
    second = await create(s, previous_response_id=first.id, tools=[WEATHER], input=[
        {"type": "function_call_output", "call_id": fc["call_id"], "output": "sunny, 21 C"}])
    assert second.output_text == "Sunny in Paris."
    text = prompt(engine, tokenizer, 1)
    assert text.index("Weather in Paris?") < text.index("sunny, 21 C")


async def test_tool_choice_none_leaves_tool_text_as_content(tokenizer):
    script = call("calculator", expression="1+1")
    s, engine = serving(tokenizer, [script])
    response = await create(s, input="Add.", tools=CALCULATOR, tool_choice="none")
    assert response.output_text == script and len(engine.submitted) == 1


async def test_parallel_tool_calls_false_keeps_the_first_call(tokenizer):
    s, _ = serving(tokenizer, [call("weather", city="A") + "\n" + call("weather", city="B")])
    both = await create(s, input="Two cities.", tools=[WEATHER])
    assert [json.loads(i["arguments"])["city"] for i in both.output] == ["A", "B"]
    s, _ = serving(tokenizer, [call("weather", city="A") + "\n" + call("weather", city="B")])
    one = await create(s, input="Two cities.", tools=[WEATHER], parallel_tool_calls=False)
    assert [json.loads(i["arguments"])["city"] for i in one.output] == ["A"]


async def test_streamed_tool_loop_matches_the_returned_output(tokenizer):
    s, _ = serving(tokenizer, [call("calculator", expression="6*7"), "It is 42."])
    events = [e async for e in await s.create_stream(
        ResponsesRequest(input="6*7?", tools=CALCULATOR), RequestMeta())]
    final = events[-1]["response"]
    done = [e["item"] for e in events if e["type"] == "response.output_item.done"]
    assert done == final["output"]
    args = "".join(e["delta"] for e in events
                   if e["type"] == "response.function_call_arguments.delta")
    assert args == final["output"][0]["arguments"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))


async def test_reasoning_items_and_reasoning_tokens(tokenizer):
    s, _ = serving(tokenizer, ["<think>Six sevens.</think>It is 42."],
                   tool_parser=None, reasoning_parser="deepseek_r1")
    response = await create(s, input="6*7?")
    reasoning, message = response.output
    assert reasoning["type"] == "reasoning"
    assert reasoning["content"] == [{"type": "reasoning_text", "text": "Six sevens."}]
    assert message["content"][0]["text"] == "It is 42."
    assert response.usage.output_tokens_details.reasoning_tokens == len(  # the tags included
        tokenizer("<think>Six sevens.</think>", add_special_tokens=False).input_ids)
    hidden = await create(s, input="6*7?", include_reasoning=False)
    assert [i["type"] for i in hidden.output] == ["message"]


async def test_tools_without_a_tool_parser_are_the_reference_400(tokenizer):
    s, engine = serving(tokenizer, ["x"], tool_parser=None)
    with pytest.raises(ValidationError, match='"auto" tool choice requires '
                                              "--enable-auto-tool-choice and --tool-call-parser"):
        await create(s, input="Hi", tools=CALCULATOR)
    assert not engine.submitted


async def test_auto_needs_enable_auto_tool_choice_but_a_named_choice_does_not(tokenizer):
    s, _ = serving(tokenizer, [call("calculator", expression="2+2"), "Four."], auto=False)
    with pytest.raises(ValidationError, match="requires --enable-auto-tool-choice"):
        await create(s, input="Hi", tools=CALCULATOR)
    response = await create(s, input="Hi", tools=CALCULATOR, tool_choice="none")
    assert response.status == "completed"


async def test_named_builtin_choice_constrains_the_first_round_only(tokenizer):
    s, engine = serving(tokenizer, ['{"expression": "2 + 2"}', "Four."])
    response = await create(s, input="Two plus two?", tools=CALCULATOR,
                            tool_choice={"type": "calculator"})
    first, second = (sub["params"].structured_outputs for sub in engine.submitted)
    assert first.json == {**Calculator.spec.parameters, "x-guidance": CALL_FORMAT}
    assert first.disable_additional_properties
    assert second is None  # later rounds are "auto": the loop can end
    assert [i["type"] for i in response.output] == [
        "function_call", "function_call_output", "message"]
    assert response.output[1]["output"] == "4" and response.output_text == "Four."


async def test_a_loose_function_tool_is_not_strict(tokenizer):
    s, engine = serving(tokenizer, ['{"city": "Oslo"}'])
    await create(s, input="Weather?", tools=[{**WEATHER, "strict": False}],
                 tool_choice={"type": "function", "name": "weather"})
    assert engine.submitted[0]["params"].structured_outputs.disable_additional_properties is False


async def test_required_choice_writes_a_json_array_of_calls(tokenizer):
    s, engine = serving(tokenizer, ['[{"name": "weather", "parameters": {"city": "Oslo"}}]'])
    response = await create(s, input="Weather?", tools=[WEATHER, *CALCULATOR],
                            tool_choice="required")
    schema = engine.submitted[0]["params"].structured_outputs.json
    assert schema["type"] == "array" and schema["minItems"] == 1
    assert [(i["name"], json.loads(i["arguments"])) for i in response.output] == [
        ("weather", {"city": "Oslo"})]


@pytest.mark.parametrize("choice", ["required", {"type": "function", "name": "weather"},
                                    {"type": "calculator"}])
async def test_strict_forced_choices_compile_in_the_grammar_backend(tokenizer, choice):
    """Strict mode closes every object: the constraint must still be satisfiable (the required
    array's items were once an empty object schema, closed into "no keys at all")."""
    from workbench.engine.requests.structured import GrammarCompiler

    s, engine = serving(tokenizer, ['[{"name": "weather", "parameters": {"city": "Oslo"}}]'])
    await create(s, input="Weather?", tools=[WEATHER, *CALCULATOR], tool_choice=choice)
    so = engine.submitted[0]["params"].structured_outputs
    assert so.disable_additional_properties
    compiler = GrammarCompiler(tokenizer, len(tokenizer), [tokenizer.eos_token_id])
    grammar = compiler.compile(so).start()
    assert grammar.error is None and not grammar.finished  # compiled, waiting for tokens


@pytest.mark.parametrize("choice, message", [
    ({"type": "function", "name": "nope"}, "does not match any of the specified `tools`"),
    ({"type": "code_interpreter"}, "does not match any of the specified `tools`"),
    ("sometimes", "Invalid value for `tool_choice`: sometimes!"),
])
async def test_bad_tool_choice_is_400(tokenizer, choice, message):
    s, _ = serving(tokenizer, ["x"])
    with pytest.raises(ValidationError, match=message) as info:
        await create(s, input="Hi", tools=[WEATHER, *CALCULATOR], tool_choice=choice)
    assert info.value.parameter == "tool_choice"


@pytest.mark.parametrize("tools, message", [
    ([{"type": "code_interpreter"}], "Tool type 'code_interpreter' is not available"),
    ([{"type": "function"}], "needs a `name`"),
    ([{"type": "calculator"}, {"type": "function", "name": "calculator"}], "declared twice"),
])
async def test_bad_tools_are_400(tokenizer, tools, message):
    s, _ = serving(tokenizer, ["x"])
    with pytest.raises(ValidationError, match=message) as info:
        await create(s, input="Hi", tools=tools)
    assert info.value.parameter == "tools"


async def test_a_tool_server_is_registered_per_app(tokenizer):
    class Echo:
        spec = ToolSpec("echo", "echoes", {"type": "object"})

        def run(self, arguments):
            return json.dumps(arguments)

    engine = ScriptedEngine(tokenizer, ["x"])
    mine = Servings.build(engine, ServerConfig(), tool_server=LocalToolServer([Echo()]))
    default = Servings.build(engine, ServerConfig())
    assert [t.name for t in mine.responses.tool_server.list_tools()] == ["echo"]
    assert [t.name for t in default.responses.tool_server.list_tools()] == ["calculator"]
    assert mine.responses.store is not default.responses.store


@pytest.mark.parametrize("parser, kwargs, after", [
    ("qwen3", None, True), ("qwen3", {"enable_thinking": False}, False),
    ("deepseek_r1", None, True), ("mistral", None, False)])
async def test_forced_choice_starts_after_reasoning_only_when_the_output_reasons(
        tokenizer, parser, kwargs, after):
    s, engine = serving(tokenizer, ['{"expression": "1"}', "One."], reasoning_parser=parser)
    await create(s, input="One?", tools=CALCULATOR, tool_choice={"type": "calculator"},
                 chat_template_kwargs=kwargs)
    constraint = engine.submitted[0]["params"].structured_outputs
    assert (constraint.after_token_ids is not None) == after  # mistral reasons after [THINK]


async def test_each_sub_request_is_logged_with_enable_log_requests(tokenizer, caplog):
    engine = ScriptedEngine(tokenizer, [call("calculator", expression="1+1"), "Two."])
    s = ResponsesServing(engine, ServerConfig(
        chat_template=TOOLS_TEMPLATE.read_text(), tool_call_parser="hermes",
        enable_auto_tool_choice=True, enable_log_requests=True))
    with caplog.at_level("INFO"):
        response = await create(s, input="Add.", tools=CALCULATOR)
    logged = caplog.text
    assert f"{response.id}_0" in logged and f"{response.id}_1" in logged
