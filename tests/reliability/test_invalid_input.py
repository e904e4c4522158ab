"""Every invalid request gets a 4xx with a readable message; valid ones, sent at the same time,
get their normal answer; the server stays healthy.

The bodies are raw bytes where JSON itself is the problem (NaN, lone surrogates, invalid UTF-8,
deep nesting, 10 MB), so nothing on the client side cleans them up first.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest

JSON = {"content-type": "application/json"}


def _raw(path: str, body: bytes | str, headers: dict | None = None, method: str = "POST"):
    data = body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body
    return (method, path, {"content": data, "headers": JSON if headers is None else headers})


def _json(path: str, body, method: str = "POST"):
    return (method, path, {"json": body})


C, CHAT = "/v1/completions", "/v1/chat/completions"
MSG = [{"role": "user", "content": "hi"}]

INVALID = {
    "empty prompt": _json(C, {"prompt": "", "max_tokens": 2}),
    "empty prompt list": _json(C, {"prompt": [], "max_tokens": 2}),
    "empty token list": _json(C, {"prompt": [[]], "max_tokens": 2}),
    "no prompt": _json(C, {"max_tokens": 2}),
    "empty messages": _json(CHAT, {"messages": []}),
    "messages not a list": _json(CHAT, {"messages": "hi"}),
    "message without role": _json(CHAT, {"messages": [{"content": "hi"}]}),
    "unknown content part": _json(CHAT, {"messages": [{"role": "user", "content": [
        {"type": "video", "video": "x"}]}]}),
    "NaN temperature": _raw(C, '{"prompt": "hi", "temperature": NaN}'),
    "Infinity top_p": _raw(C, '{"prompt": "hi", "top_p": Infinity}'),
    "1e999 presence_penalty": _raw(C, '{"prompt": "hi", "presence_penalty": 1e999}'),
    "-Infinity logit_bias": _raw(C, '{"prompt": "hi", "logit_bias": {"5": -Infinity}}'),
    "NaN in chat": _raw(CHAT, '{"messages": [{"role": "user", "content": "hi"}], '
                              '"frequency_penalty": NaN}'),
    "huge max_tokens": _json(C, {"prompt": "hi", "max_tokens": 10**30}),
    "huge n": _json(C, {"prompt": "hi", "n": 10**9}),
    "huge seed": _json(C, {"prompt": "hi", "seed": 2**80, "max_tokens": 2}),
    "huge logprobs": _json(C, {"prompt": "hi", "logprobs": 10**6}),
    "huge top_logprobs": _json(CHAT, {"messages": MSG, "logprobs": True, "top_logprobs": 10**6}),
    "negative max_tokens": _json(C, {"prompt": "hi", "max_tokens": -1}),
    "zero n": _json(C, {"prompt": "hi", "n": 0}),
    "negative token id": _json(C, {"prompt": [-1, 5], "max_tokens": 2}),
    "token id past vocab": _json(C, {"prompt": [10**12], "max_tokens": 2}),
    "negative logit_bias id": _json(C, {"prompt": "hi", "logit_bias": {"-5": 1}}),
    "negative stop id": _json(C, {"prompt": "hi", "stop_token_ids": [-3]}),
    "negative top_k": _json(C, {"prompt": "hi", "top_k": -7}),
    "top_p over one": _json(C, {"prompt": "hi", "top_p": 2}),
    "prompt is a number": _json(C, {"prompt": 5}),
    "temperature is a string": _json(C, {"prompt": "hi", "temperature": "hot"}),
    "stream is a string": _json(C, {"prompt": "hi", "stream": "yes please"}),
    "n is a float": _json(C, {"prompt": "hi", "n": 1.5}),
    "max_tokens is a list": _json(C, {"prompt": "hi", "max_tokens": [1]}),
    "model is an object": _json(C, {"prompt": "hi", "model": {"a": 1}}),
    "body is a list": _json(C, [1, 2, 3]),
    "body is a string": _json(C, "hi"),
    "body is null": _raw(C, "null"),
    "unknown model": _json(C, {"prompt": "hi", "model": "nope"}),
    "unknown field": _json(C, {"prompt": "hi", "max_tokens": 2, "temprature": 0.5}),
    "unknown chat field": _json(CHAT, {"messages": MSG, "max_tokens": 2, "frobnicate": True}),
    "unknown embeddings field": _json("/v1/embeddings", {"input": "hi", "dimension": 8}),
    "unknown score field": _json("/score", {"queries": "a", "documents": ["b"], "topn": 1}),
    "unknown responses field": _json("/v1/responses", {"input": "hi", "max_tokens": 2}),
    "unknown tokenize field": _json("/tokenize", {"prompt": "hi", "add_bos": True}),
    "lone surrogate prompt": _raw(C, '{"prompt": "a\\ud800b", "max_tokens": 2}'),
    "lone surrogate message": _raw(CHAT, '{"messages": [{"role": "user", '
                                         '"content": "\\udfff"}], "max_tokens": 2}'),
    "lone surrogate stop": _raw(C, '{"prompt": "hi", "stop": ["\\ud83d"], "max_tokens": 2}'),
    "invalid UTF-8": _raw(C, b'{"prompt": "\xff\xfe\xfd", "max_tokens": 2}'),
    "not JSON": _raw(C, "{\"prompt\": "),
    "empty body": _raw(C, b""),
    "deeply nested JSON": _raw(C, '{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}"),
    "nested 500 deep": _raw(C, '{"prompt": "hi", "logit_bias": ' + '{"a":' * 500 + "1"
                            + "}" * 500 + "}"),
    "10 MB body": _json(C, {"prompt": "word " * 2_000_000, "max_tokens": 2}),
    "2000 prompts": _json(C, {"prompt": ["hi"] * 2000, "max_tokens": 1}),
    "text/plain": _raw(C, '{"prompt": "hi"}', {"content-type": "text/plain"}),
    "form body": _raw(C, "prompt=hi", {"content-type": "application/x-www-form-urlencoded"}),
    "no content type": _raw(C, '{"prompt": "hi"}', {}),
    "too many stop strings": _json(C, {"prompt": "hi", "stop": ["a"] * 100}),
    "prompt too long": _json(C, {"prompt": [1] * 500, "max_tokens": 2}),
    "tokenize NaN": _raw("/tokenize", '{"prompt": "hi", "add_special_tokens": NaN}'),
    "tokenize surrogate": _raw("/tokenize", '{"prompt": "\\ud800"}'),
    "detokenize negative": _json("/detokenize", {"tokens": [-1]}),
    "detokenize huge": _json("/detokenize", {"tokens": [2**70]}),
    "GET on a POST route": ("GET", C, {}),
    "unknown route": _json("/v1/nothing-here", {}),
    "beam search too wide": _json(C, {"prompt": "hi", "use_beam_search": True, "n": 10**4}),
}


def _valid(i: int):
    if i % 2:
        return _json(C, {"prompt": f"Count {i}:", "max_tokens": 3, "temperature": 0})
    return _json(CHAT, {"messages": [{"role": "user", "content": f"Say {i}"}], "max_tokens": 3,
                        "temperature": 0})


async def _send(client: httpx.AsyncClient, request) -> httpx.Response:
    method, path, kwargs = request
    return await client.request(method, path, **kwargs)


def _readable(response: httpx.Response) -> str:
    body = response.json()
    error = body["error"]
    message = error["message"] if isinstance(error, dict) else error
    assert isinstance(message, str) and message.strip()
    assert "Traceback" not in message
    if isinstance(error, dict):
        assert error["code"] == response.status_code
    return message


async def test_invalid_requests_interleaved_with_valid_ones(make_server):
    server = make_server()
    names = list(INVALID)
    jobs = []
    for i, name in enumerate(names):
        jobs.append(("invalid", name, INVALID[name]))
        jobs.append(("valid", i, _valid(i)))
    async with httpx.AsyncClient(base_url=server.url, timeout=120) as client:
        # alone first, one by one: the expected answer of each valid request
        expected = {}
        for kind, key, request in jobs:
            if kind == "valid":
                expected[key] = (await _send(client, request)).json()
        responses = await asyncio.gather(*(_send(client, r) for _, _, r in jobs))
        failures = []
        for (kind, key, _), response in zip(jobs, responses):
            if kind == "invalid":
                if not 400 <= response.status_code < 500:
                    failures.append(f"{key}: {response.status_code} {response.text[:200]}")
                    continue
                _readable(response)
            else:
                assert response.status_code == 200, response.text
                body = response.json()
                got = [c.get("text") or c["message"]["content"] for c in body["choices"]]
                want = [c.get("text") or c["message"]["content"] for c in expected[key]["choices"]]
                assert got == want
        assert not failures, "\n".join(failures)
        assert (await client.get("/health")).status_code == 200
    engine = server.engine.engine
    assert engine.block_manager.num_free_blocks == engine.block_manager.num_blocks


@pytest.mark.parametrize("name", ["NaN temperature", "10 MB body", "unknown field",
                                  "2000 prompts", "lone surrogate prompt",
                                  "unknown embeddings field", "unknown responses field",
                                  "unknown tokenize field"])
def test_each_refusal_names_its_problem(make_server, name):
    server = make_server() if not hasattr(test_each_refusal_names_its_problem, "server") else None
    server = server or test_each_refusal_names_its_problem.server
    test_each_refusal_names_its_problem.server = server
    method, path, kwargs = INVALID[name]
    response = httpx.request(method, server.url + path, timeout=60, **kwargs)
    message = _readable(response)
    words = {"NaN temperature": "temperature", "10 MB body": "--max-request-body-bytes",
             "unknown field": "temprature", "2000 prompts": "prompt",
             "lone surrogate prompt": "surrogate", "unknown embeddings field": "dimension",
             "unknown responses field": "max_tokens", "unknown tokenize field": "add_bos"}
    assert words[name] in message
    if name == "10 MB body":
        assert response.status_code == 413
    if name == "2000 prompts":
        assert response.json()["error"]["param"] == "prompt"
    if name.startswith("unknown") and name.endswith("field"):
        assert response.status_code == 400 and response.json()["error"]["param"] == words[name]
