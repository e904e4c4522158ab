"""`ToolLoopTrace` from a response body: rounds, calls, frame, deterministic HTML."""

from __future__ import annotations

from workbench.inspect.tool_loop import ToolLoopTrace

BODY = {
    "id": "resp_abc", "status": "incomplete", "incomplete_details": {"reason": "max_tool_calls"},
    "output": [
        {"type": "function_call", "call_id": "c1", "name": "calculator",
         "arguments": '{"expression": "1/0"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "Error: division by zero"},
        {"type": "message", "content": [{"type": "output_text", "text": "Hmm."}]},
        {"type": "function_call", "call_id": "c2", "name": "calculator",
         "arguments": '{"expression": "2*3"}'},
        {"type": "function_call_output", "call_id": "c2", "output": "6"},
        {"type": "function_call", "call_id": "c3", "name": "weather", "arguments": "{}"},
    ],
    "usage": {"input_tokens_details": {"input_tokens_per_turn": [10, 20, 30]},
              "output_tokens_details": {"output_tokens_per_turn": [5, 6, 7]}},
}


def test_rounds_split_after_tool_outputs():
    trace = ToolLoopTrace.from_response(BODY)
    assert len(trace) == 3
    assert [[c.name for c in r.calls] for r in trace.rounds] == [
        ["calculator"], ["calculator"], ["weather"]]
    assert [r.request_id for r in trace.rounds] == ["resp_abc_0", "resp_abc_1", "resp_abc_2"]
    assert [(r.prompt_tokens, r.output_tokens) for r in trace.rounds] == [(10, 5), (20, 6),
                                                                          (30, 7)]
    first, second, client = trace.calls
    assert first.error and first.output == "Error: division by zero"
    assert (second.output, second.error, second.parsed_arguments) == ("6", False,
                                                                     {"expression": "2*3"})
    assert not client.builtin and client.output is None
    assert trace.output_text == "Hmm." and trace.incomplete_reason == "max_tool_calls"


def test_frame_repr_and_html():
    trace = ToolLoopTrace.from_response(BODY)
    frame = trace.to_frame()
    assert list(frame["tool"]) == ["calculator", "calculator", "weather"]
    assert repr(trace) == ("ToolLoopTrace(incomplete, 3 rounds, calculator, calculator, weather, "
                           "incomplete: max_tool_calls)")
    html = trace._repr_html_()
    assert html == ToolLoopTrace.from_response(BODY)._repr_html_()
    assert "weather (client)" in html and "#b00020" in html  # client call; error in red
    other = ToolLoopTrace.from_response({**BODY, "id": "resp_xyz"})._repr_html_()
    assert html.split('"')[1] == other.split('"')[1]  # the element id ignores run-varying ids


def test_a_plain_text_response_is_one_round_without_calls():
    trace = ToolLoopTrace.from_response({"id": "r", "status": "completed", "output": [
        {"type": "message", "content": [{"type": "output_text", "text": "Hi."}]}]})
    assert len(trace) == 1 and trace.calls == [] and trace.rows()[0]["tool"] is None
