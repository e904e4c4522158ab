"""`Workbench.respond` and its `ToolLoopTrace`, in the kernel and against a live server."""

from __future__ import annotations

import pytest

from workbench.serving.chat_tools import TOOLS_TEMPLATE
from workbench.tools import ToolSpec

pytestmark = pytest.mark.slow

ASK = {"tools": [{"type": "calculator"}], "tool_choice": {"type": "calculator"},
       "temperature": 0, "max_output_tokens": 48, "max_tool_calls": 1}


@pytest.fixture(scope="module")
def config():
    from workbench.serving import ServerConfig

    return ServerConfig(chat_template=TOOLS_TEMPLATE.read_text(), tool_call_parser="hermes",
                        enable_auto_tool_choice=True)


@pytest.fixture(scope="module")
def local(llm, config):
    from workbench import Workbench

    with Workbench(llm, config=config) as wb:
        yield wb


@pytest.fixture(scope="module")
def remote(llm, config):
    from workbench import Workbench, serve_in_kernel

    with serve_in_kernel(llm, port=0, config=config) as server, \
            Workbench(url=server.base_url, api_key="unused") as wb:
        yield wb


def test_local_tool_loop_trace_shows_every_round(local):
    result = local.respond("What is 17 * 23?", **ASK)
    assert result.ok and result.response["object"] == "response"
    loop = result.tool_loop
    rid = result.response["id"]
    assert [r.request_id for r in loop.rounds] == [f"{rid}_{i}" for i in range(len(loop))]
    assert [r.priority for r in loop.rounds] == [0] + [-1] * (len(loop) - 1)
    usage = result.response["usage"]
    assert [r.prompt_tokens for r in loop.rounds] == \
        usage["input_tokens_details"]["input_tokens_per_turn"]
    assert [r.output_tokens for r in loop.rounds] == \
        usage["output_tokens_details"]["output_tokens_per_turn"]
    call = loop[0].calls[0]
    assert call.name == "calculator" and call.builtin and call.output is not None
    assert "expression" in call.parsed_arguments and loop[0].text
    assert result.text == loop.output_text
    frame = loop.to_frame()
    assert list(frame.columns[:3]) == ["round", "request_id", "priority"]
    html = loop._repr_html_()
    assert "calculator" in html and html == loop._repr_html_()


def test_remote_trace_from_the_body_matches_the_local_one(local, remote):
    here = local.respond("What is 12 + 30?", **ASK)
    there = remote.respond("What is 12 + 30?", **ASK)
    assert here.text == there.text
    assert [(c.name, c.arguments, c.output) for c in here.tool_loop.calls] == \
        [(c.name, c.arguments, c.output) for c in there.tool_loop.calls]
    assert [r.prompt_tokens for r in here.tool_loop.rounds] == \
        [r.prompt_tokens for r in there.tool_loop.rounds]
    assert there.tool_loop[0].priority is None  # not in a response body


def test_errors_come_back_as_the_envelope(local, remote):
    for wb in (local, remote):
        result = wb.respond("Hi", previous_response_id="resp_missing")
        assert result.status_code == 404 and result.tool_loop is None
        assert result.error["error"]["message"] == "Response with id 'resp_missing' not found."


def test_streamed_events_are_the_same_locally_and_remotely(local, remote):
    ask = {**ASK, "max_output_tokens": 40}
    here = list(local.stream_respond("What is 6 * 7?", **ask))
    there = list(remote.stream_respond("What is 6 * 7?", **ask))
    assert [e["type"] for e in here] == [e["type"] for e in there]
    assert [e["sequence_number"] for e in here] == list(range(len(here)))
    final_here, final_there = here[-1]["response"], there[-1]["response"]
    assert [(i["type"], i.get("arguments"), i.get("output")) for i in final_here["output"]] == \
        [(i["type"], i.get("arguments"), i.get("output")) for i in final_there["output"]]
    refused = list(local.stream_respond("Hi", previous_response_id="resp_missing"))
    assert refused[0]["error"]["code"] == 404 and len(refused) == 1


class WordCount:
    """A custom built-in tool: the number of words in a text."""

    spec = ToolSpec("word_count", "Counts the words in a text", {
        "type": "object", "properties": {"text": {"type": "string", "maxLength": 60}},
        "required": ["text"], "additionalProperties": False})

    def run(self, arguments):
        return str(len(arguments["text"].split()))


def test_a_custom_tool_server_serves_its_own_tools(llm, config):
    from workbench import Workbench, serve_in_kernel
    from workbench.tools import LocalToolServer

    tools = LocalToolServer([WordCount()])
    ask = {"tools": [{"type": "word_count"}], "tool_choice": {"type": "word_count"},
           "temperature": 0, "max_output_tokens": 40, "max_tool_calls": 1}
    with serve_in_kernel(llm, port=0, config=config, tool_server=tools) as server, \
            Workbench(url=server.base_url, api_key="unused") as remote, \
            Workbench(llm, config=config, tool_server=tools) as local:
        for wb in (remote, local):
            result = wb.respond("How many words are in 'the quick brown fox'?", **ask)
            call = result.tool_loop.calls[0]
            assert call.name == "word_count"
            assert call.output == str(len(call.parsed_arguments["text"].split()))
            refused = wb.respond("Compute 1+1.", tools=[{"type": "calculator"}])
            assert refused.status_code == 400 and refused.error["error"]["param"] == "tools"
