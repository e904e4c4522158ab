"""Issue 16 items 8 and 9: what vLLM 0.32's users rely on, checked against its answers.

Beam search with `temperature=0` and `n > 1`; tools whose parameters carry `$defs` under
`tool_choice="required"`; `/v1/chat/completions/batch`; `/invocations`; `/load` and
`/tokenizer_info`; `stream_options` as vLLM reads it; `--enable-prompt-tokens-details`;
`--root-path`; `/v1/models` `root`.
"""

from __future__ import annotations

import json

import httpx
import pytest

MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny_server_flags():
    return {"enable_tokenizer_info_endpoint": True, "enable_server_load_tracking": True,
            "enable_prompt_tokens_details": True, "root_path": "/llm"}


def _events(r: httpx.Response) -> list:
    return [json.loads(line[6:]) for line in r.text.splitlines()
            if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": MSG}),
])
def test_greedy_beam_search_returns_n_beams(tiny_http, path, body):
    r = tiny_http.post(path, json={**body, "max_tokens": 3, "n": 2, "temperature": 0,
                              "use_beam_search": True})
    assert r.status_code == 200, r.text
    assert [c["index"] for c in r.json()["choices"]] == [0, 1]


def test_greedy_sampling_with_n_2_is_still_refused(tiny_http):
    r = tiny_http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "n": 2,
                                           "temperature": 0})
    assert r.status_code == 400
    assert "n must be 1 when using greedy sampling, got 2." in r.json()["error"]["message"]


def test_required_tool_schema_keeps_each_tools_defs():
    from types import SimpleNamespace

    from workbench.serving.tool_parsers.constrained import tools_json_schema

    def tool(name, params):
        return SimpleNamespace(function=SimpleNamespace(name=name, parameters=params))

    address = {"type": "object", "properties": {"city": {"type": "string"}}}
    tools = [tool("ship", {"type": "object", "properties": {"to": {"$ref": "#/$defs/Address"}},
                           "$defs": {"Address": address}}),
             tool("bill", {"type": "object", "properties": {"at": {"$ref": "#/$defs/Address"}},
                           "$defs": {"Address": address}})]
    schema = tools_json_schema(tools)
    assert schema["$defs"] == {"Address": address}
    assert all("$defs" not in v["properties"]["parameters"] for v in schema["items"]["anyOf"])
    from workbench.errors import ValidationError

    clash = tools + [tool("other", {"type": "object", "$defs": {"Address": {"type": "string"}}})]
    with pytest.raises(ValidationError, match="Tool definition 'Address' has multiple schemas"):
        tools_json_schema(clash)


def test_required_tool_choice_with_pydantic_defs_over_http(tiny_llama):
    """A pydantic-made tool (nested model -> `$defs` / `$ref`) under `required` (vLLM: 200)."""
    from pydantic import BaseModel

    from workbench import LLM, serve_in_kernel

    class Address(BaseModel):
        city: str

    class Ship(BaseModel):
        to: Address

    tools = [{"type": "function", "function": {"name": "ship",
                                               "parameters": Ship.model_json_schema()}}]
    assert "$defs" in tools[0]["function"]["parameters"]
    llm = LLM(tiny_llama, max_model_len=256, block_size=16, num_kv_blocks=64, seed=0)
    with serve_in_kernel(llm, port=0, tool_call_parser="hermes") as handle:
        r = httpx.post(f"{handle.url}/v1/chat/completions", timeout=120, json={
            "messages": MSG, "tools": tools, "tool_choice": "required", "max_tokens": 40})
    assert r.status_code == 200, r.text


def test_batch_chat_completions_answer_one_choice_per_conversation(tiny_http):
    r = tiny_http.post("/v1/chat/completions/batch", json={
        "messages": [MSG, [{"role": "user", "content": "yo"}]], "max_tokens": 3,
        "logprobs": True, "logprob_token_ids": [5, 6],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "a", "schema": {"type": "object"}}}})
    assert r.status_code == 200, r.text
    body = r.json()
    assert [c["index"] for c in body["choices"]] == [0, 1]
    lengths = [len(c["logprobs"]["content"]) for c in body["choices"]]
    assert all(0 < n <= 3 for n in lengths)
    assert body["usage"]["completion_tokens"] == sum(lengths)
    for choice in body["choices"]:  # logprob_token_ids: the sampled token and those two
        assert all(len(p["top_logprobs"]) >= 2 for p in choice["logprobs"]["content"])
    assert body["id"].startswith("chatcmpl-")


@pytest.mark.parametrize("field, value", [("n", 2), ("use_beam_search", True),
                                          ("stream", True)])
def test_batch_chat_refusals(tiny_http, field, value):
    r = tiny_http.post("/v1/chat/completions/batch", json={"messages": [MSG], field: value})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field


def test_batch_chat_refuses_unknown_fields(tiny_http):
    r = tiny_http.post("/v1/chat/completions/batch", json={"messages": [MSG], "temprature": 1})
    assert r.status_code == 400
    assert "temprature" in r.json()["error"]["message"]


@pytest.mark.parametrize("body, kind", [
    ({"messages": MSG, "max_tokens": 2}, "chat.completion"),
    ({"prompt": "hi", "max_tokens": 2}, "text_completion"),
])
def test_invocations_dispatch_by_body(tiny_http, body, kind):
    r = tiny_http.post("/invocations", json=body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == kind


def test_invocations_without_a_matching_type(tiny_http):
    """As vLLM 0.32: the completion's own check answers a body that is neither."""
    r = tiny_http.post("/invocations", json={"nothing": 1})
    assert r.status_code == 400
    assert r.json()["error"] == {
        "message": "Either prompt or prompt_embeds must be provided and non-empty. "
                   "(parameter=prompt)", "type": "BadRequestError", "param": "prompt",
        "code": 400}


def test_invocations_on_an_embedding_model():
    from workbench import LLM, serve_in_kernel

    with serve_in_kernel(LLM(model="all-minilm-l6-v2", dtype="float32"), port=0) as handle:
        r = httpx.post(f"{handle.url}/invocations", json={"input": ["a cat"]}, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["object"] == "list" and len(r.json()["data"][0]["embedding"]) == 384
        r = httpx.post(f"{handle.url}/invocations", json={"nothing": 1}, timeout=60)
        assert r.status_code == 400  # a check of one of the pooling types refuses it
        assert r.json()["error"]["param"] == "queries"


def test_invocations_with_no_type_left(tiny_llama):
    """An embedding-only type list and a body none of them takes: vLLM's message."""
    from starlette.testclient import TestClient

    from workbench.http.routes import extras

    assert [name for _, name, _ in extras.invocation_types(False, ("embed",))] == [
        "EmbeddingRequest", "PoolingRequest"]
    from fastapi import FastAPI

    app = FastAPI()
    app.state.invocation_types = extras.invocation_types(False, ("embed",))
    app.include_router(extras.invocations_router)
    r = TestClient(app).post("/invocations", json={"nothing": 1})
    assert r.status_code == 400
    assert r.json()["error"]["message"] == ("Cannot find suitable handler for request. Expected "
                                            "one of: ['EmbeddingRequest', 'PoolingRequest']")


def test_tokenizer_info(tiny_http):
    info = tiny_http.get("/tokenizer_info").json()
    assert info["tokenizer_class"]
    assert "chat_template" in info
    assert not any(isinstance(v, str) and v.startswith("/") for v in info.values())


def test_load_is_zero_between_requests(tiny_http):
    assert tiny_http.get("/load").json() == {"server_load": 0}
    assert tiny_http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4}).status_code == 200
    assert tiny_http.get("/load").json() == {"server_load": 0}


async def test_load_tracking_counts_an_inference_request_while_it_runs():
    """Inside the app (a stream still sending) an inference request counts, other paths do not,
    and it is released when the app returns or raises. (In-process, not over a socket: a tiny
    model finishes a stream before a client could look.)"""
    from workbench.http.routes.extras import LoadTracking, ServerLoad

    load, seen = ServerLoad(), []

    async def app(scope, receive, send):
        seen.append(load.in_flight)
        if scope.get("boom"):
            raise RuntimeError("boom")

    tracked = LoadTracking(app, load)
    await tracked({"type": "http", "path": "/v1/completions"}, None, None)
    await tracked({"type": "http", "path": "/health"}, None, None)
    await tracked({"type": "http", "path": "/llm/v1/chat/completions", "root_path": "/llm"},
                  None, None)
    with pytest.raises(RuntimeError):
        await tracked({"type": "http", "path": "/v1/embeddings", "boom": True}, None, None)
    assert seen == [1, 0, 1, 1] and load.in_flight == 0


def test_load_without_tracking_is_zero(tiny_llm):
    from workbench import serve_in_kernel

    with serve_in_kernel(tiny_llm, port=0) as handle:
        assert httpx.get(f"{handle.url}/load").json() == {"server_load": 0}
        assert httpx.get(f"{handle.url}/tokenizer_info").status_code == 404


def test_continuous_usage_without_include_usage_sends_no_usage(tiny_http):
    r = tiny_http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True,
                                           "stream_options": {"continuous_usage_stats": True}})
    assert r.status_code == 200
    assert not any("usage" in e for e in _events(r))


def test_unknown_stream_options_are_refused(tiny_http):
    r = tiny_http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "stream": True,
                                           "stream_options": {"min_chars": 5}})
    assert r.status_code == 400
    assert "stream_options.min_chars" in r.json()["error"]["message"]


# -- issue 28: `stream_options.min_characters`, the least text a streamed chunk carries --------

def test_vllm_stream_options_test_passes_with_min_characters(tiny_server):
    """The last step of vLLM's `test_chat_completion_stream_options`, sent as it sends it:
    `min_characters` in `extra_body`, every chunk's `delta.content` concatenated."""
    import openai

    client = openai.OpenAI(base_url=tiny_server.base_url, api_key="unused")
    stream = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MSG, max_completion_tokens=10,
        extra_body=dict(min_characters=10), temperature=0.0, stream=True,
        stream_options={"include_usage": False})
    completion = ""
    for chunk in stream:
        assert chunk.usage is None
        completion += chunk.choices[0].delta.content
    assert len(completion) >= 10


def _pieces(r: httpx.Response) -> list[str]:
    """The text of each streamed chunk (chat: after the role chunk)."""
    events = [e for e in _events(r) if e.get("choices")]
    if "delta" in events[0]["choices"][0]:
        return [e["choices"][0]["delta"].get("content") or "" for e in events[1:]]
    return [e["choices"][0]["text"] for e in events]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": MSG}),
])
@pytest.mark.parametrize("where", ["stream_options", "top level"])
def test_min_characters_holds_every_chunk_but_the_last_to_that_much_text(tiny_http, path, body,
                                                                         where):
    base = {**body, "max_tokens": 24, "temperature": 0, "ignore_eos": True, "stream": True}
    every = _pieces(tiny_http.post(path, json=base))
    option = ({"stream_options": {"min_characters": 12}} if where == "stream_options"
              else {"min_characters": 12})
    r = tiny_http.post(path, json={**base, **option})
    assert r.status_code == 200, r.text
    held = _pieces(r)
    assert "".join(held) == "".join(every)
    assert all(len(text) >= 12 for text in held[:-1]) and len(held) < len(every)
    assert _events(r)[-1]["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize("extra, param", [
    ({"stream_options": {"min_characters": 0}}, "stream_options.min_characters"),
    ({"stream_options": {"min_characters": True}}, "stream_options.min_characters"),
    ({"stream_options": {"min_characters": "5"}}, "stream_options.min_characters"),
    ({"min_characters": -1}, "min_characters"),
    ({"min_characters": 5, "stream_options": {"min_characters": 6}}, "min_characters"),
    ({"min_characters": 5, "stream": False}, "min_characters"),
])
@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/chat/completions", {"messages": MSG}),
])
def test_a_bad_min_characters_is_a_400_naming_it(tiny_http, path, body, extra, param):
    r = tiny_http.post(path, json={**body, "max_tokens": 2, "stream": True, **extra})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == param and "min_characters" in error["message"]


def test_prompt_tokens_details_count_cached_tokens(tiny_http):
    prompt = list(range(100, 140))  # 40 tokens: two full blocks of 16 can be reused
    first = tiny_http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
    again = tiny_http.post("/v1/completions", json={"prompt": prompt, "max_tokens": 1}).json()
    assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 32
    chat = tiny_http.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 1}).json()
    assert "cached_tokens" in chat["usage"]["prompt_tokens_details"]


def test_root_path_serves_with_and_without_the_prefix(tiny_http):
    assert tiny_http.get("/llm/v1/models").status_code == 200
    assert tiny_http.get("/v1/models").status_code == 200
    r = tiny_http.post("/llm/v1/completions", json={"prompt": "hi", "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_models_root_is_the_model_argument_not_a_path(default_model):
    from workbench.serving.models import ModelsServing

    class Engine:  # what ModelsServing reads of an engine
        served_model_name, tokenizer, max_model_len, vocab_size = "m", None, 8, 10
        model_path = "/home/someone/.cache/workbench/models/m"
        generation_defaults = None
        arithmetic = {"dtype": "float32", "batch_invariant": False}
        config = type("C", (), {"model": "smollm2-135m-instruct", "dtype": "float32",
                                "seed": 0})()

    card = ModelsServing(Engine()).list_models().data[0]
    assert card.root == "smollm2-135m-instruct"


def test_prompt_logprobs_true_is_one_as_in_vllm(tiny_http):
    r = tiny_http.post("/v1/completions", json={"prompt": "hi there", "max_tokens": 1,
                                           "prompt_logprobs": True})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["prompt_logprobs"][0] is None


def test_prompt_logprobs_true_with_prompt_embeds_is_vllms_refusal():
    from workbench.serving.errors import error_response
    from workbench.serving.protocol.completion import CompletionRequest
    from workbench.serving.unsupported import check_completion

    request = CompletionRequest(prompt="", prompt_embeds="AAAA", prompt_logprobs=True)
    with pytest.raises(Exception) as err:
        check_completion(request, enable_prompt_embeds=True)
    assert error_response(err.value).error.model_dump() == {
        "message": "prompt_logprobs is not compatible with prompt embeds.",
        "type": "BadRequestError", "param": None, "code": 400}


def test_serve_flags_reach_the_server_config():
    from workbench.apps.cli import build_parser, configs_from_args

    args = build_parser().parse_args([
        "serve", "--root-path", "/llm", "--enable-tokenizer-info-endpoint",
        "--enable-server-load-tracking", "--enable-prompt-tokens-details"])
    _, server = configs_from_args(args)
    assert (server.root_path, server.enable_tokenizer_info_endpoint,
            server.enable_server_load_tracking, server.enable_prompt_tokens_details) == (
        "/llm", True, True, True)
    _, default = configs_from_args(build_parser().parse_args(["serve"]))
    assert (default.root_path, default.enable_prompt_tokens_details) == ("", False)


def test_kv_cache_memory_flag_reaches_the_engine_config():
    from workbench.apps.cli import build_parser, configs_from_args

    engine, _ = configs_from_args(build_parser().parse_args(["serve", "--kv-cache-memory", "2.5"]))
    assert engine.kv_cache_memory_gb == 2.5
    default, _ = configs_from_args(build_parser().parse_args(["serve"]))
    assert default.kv_cache_memory_gb is None  # sized from the memory there is
