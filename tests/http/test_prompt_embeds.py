"""`prompt_embeds` and `cache_salt` over HTTP with the official `openai` client (fp32 SmolLM2).

A server started with `enable_prompt_embeds=True` (the CLI's `--enable-prompt-embeds`) takes
`extra_body={"prompt_embeds": base64}` next to `prompt=""`, as the reference's example does:
the input-embedding rows of a prompt's own tokens give exactly the token prompt's greedy text.
Hostile payloads are 400s naming `prompt_embeds`, and the server keeps serving. Salted prompts
share prefix-cache blocks only with the same salt, visible in `/metrics` and the trace.
"""

from __future__ import annotations

import base64
import io
import os
import re

import pytest
import torch

from workbench.serving.prompt_embeds import encode_prompt_embeds, payload_limits

pytestmark = pytest.mark.slow

MAX_MODEL_LEN = 256
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def embeds_server(default_model):
    from workbench import LLM, serve_in_kernel

    llm = LLM(model=default_model, max_model_len=MAX_MODEL_LEN, num_kv_blocks=64, block_size=16,
              seed=0)
    handle = serve_in_kernel(llm, port=0, enable_prompt_embeds=True)
    yield handle
    handle.stop()


@pytest.fixture
def client(embeds_server):
    import openai

    return openai.OpenAI(base_url=embeds_server.base_url, api_key="unused", max_retries=0,
                         timeout=120)


@pytest.fixture
def http(embeds_server):
    import httpx

    with httpx.Client(base_url=embeds_server.url, timeout=120) as c:
        yield c


def own_rows(default_model, text: str) -> tuple[list[int], torch.Tensor]:
    ids = default_model.tokenizer(text)["input_ids"]
    with torch.inference_mode():
        return ids, default_model.model.get_input_embeddings()(torch.tensor(ids)).clone()


def test_own_embeddings_give_the_token_prompt_text(client, default_model):
    ids, rows = own_rows(default_model, "The capital of France is")
    want = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, temperature=0)
    got = client.completions.create(model=MODEL, prompt="", max_tokens=8, temperature=0,
                                    logprobs=2,
                                    extra_body={"prompt_embeds": encode_prompt_embeds(rows)})
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.prompt_tokens == len(ids)
    assert len(got.choices[0].logprobs.tokens) == got.usage.completion_tokens == 8


def test_without_the_flag_prompt_embeds_are_refused(default_model):
    import openai

    from workbench import LLM, serve_in_kernel

    llm = LLM(model=default_model, max_model_len=64, num_kv_blocks=8, block_size=16)
    handle = serve_in_kernel(llm, port=0)
    try:
        c = openai.OpenAI(base_url=handle.base_url, api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as err:
            c.completions.create(model=MODEL, prompt="", max_tokens=2, extra_body={
                "prompt_embeds": encode_prompt_embeds(torch.zeros(2, 576))})
        assert err.value.body["param"] == "prompt_embeds"
        assert "--enable-prompt-embeds" in err.value.body["message"]
    finally:
        handle.stop()


def _saved(obj) -> str:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/wb_http_prompt_embeds_pwned",))


HOSTILE = {
    "pickled object": lambda: _saved(_Exploit()),
    "wrong shape": lambda: _saved(torch.zeros(3, 4, 576)),
    "wrong hidden size": lambda: _saved(torch.zeros(3, 64)),
    "NaN": lambda: _saved(torch.full((3, 576), float("nan"))),
    "far too big": lambda: _saved(torch.zeros(2000, 576)),  # 4.6 MB: refused by its length
    "garbage base64": lambda: "%%%not-base64%%%",
    "a list with one bad payload": lambda: [_saved(torch.zeros(2, 576)), "junk"],
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_payloads_are_400_and_the_server_keeps_serving(client, name):
    import openai

    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="", max_tokens=2,
                                  extra_body={"prompt_embeds": HOSTILE[name]()})
    body = err.value.body
    assert err.value.status_code == 400
    assert body["param"] in ("prompt_embeds", "input_tokens") and body["message"]
    assert not os.path.exists("/tmp/wb_http_prompt_embeds_pwned")
    ok = client.completions.create(model=MODEL, prompt="Hi", max_tokens=2)
    assert ok.choices[0].finish_reason == "length"


def test_the_size_bound_is_checked_on_the_base64_length(http):
    _, max_chars = payload_limits(576, MAX_MODEL_LEN)
    r = http.post("/v1/completions", json={"model": MODEL, "prompt": "", "max_tokens": 2,
                                           "prompt_embeds": "A" * (max_chars + 4)})
    assert r.status_code == 400
    assert f"at most {max_chars} are accepted" in r.json()["error"]["message"]


@pytest.mark.parametrize("fields, message", [
    ({"echo": True}, "Echo is unsupported with prompt embeds."),
    ({"prompt_logprobs": 1}, "prompt_logprobs is not compatible with prompt embeds."),
])
def test_the_reference_refusals(http, fields, message):
    r = http.post("/v1/completions", json={
        "model": MODEL, "prompt": "", "max_tokens": 2,
        "prompt_embeds": encode_prompt_embeds(torch.zeros(2, 576)), **fields})
    assert r.status_code == 400
    assert r.json()["error"] == {"message": message, "type": "BadRequestError", "param": None,
                                 "code": 400}  # as vLLM 0.32 answers


def _counter(http, name: str) -> float:
    text = http.get("/metrics").text
    match = re.search(rf"^{re.escape(name)}_total{{[^}}]*}} (\S+)$", text, re.MULTILINE)
    assert match, name
    return float(match.group(1))


def test_cache_salt_isolates_and_equal_salts_share_in_metrics(client, http, embeds_server):
    embeds_server.engine.engine.reset_prefix_cache()
    prompt = ("Tenant isolation means that cached prompt blocks are never shared between "
              "salts. Every tenant sends the same long system preamble, word for word, and "
              "still computes it on its own.")  # > 2 blocks of 16 tokens
    hits_before = _counter(http, "vllm:prefix_cache_hits")
    queries_before = _counter(http, "vllm:prefix_cache_queries")
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                              extra_body={"cache_salt": "alice"})
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                              extra_body={"cache_salt": "bob"})
    assert _counter(http, "vllm:prefix_cache_hits") == hits_before  # no sharing across salts
    assert _counter(http, "vllm:prefix_cache_queries") > queries_before
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                   max_tokens=1, extra_body={"cache_salt": "alice"})
    client.completions.create(model=MODEL, prompt=prompt, max_tokens=1,
                              extra_body={"cache_salt": "alice"})
    assert _counter(http, "vllm:prefix_cache_hits") >= hits_before + 16  # a whole block or more


def test_bad_cache_salt_is_400(http):
    r = http.post("/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": "x"}], "cache_salt": "a/b"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "cache_salt"


def test_the_cli_flag_reaches_the_server_config(monkeypatch):
    from workbench.apps import cli

    captured = {}
    monkeypatch.setattr("workbench.http.server.run_server",
                        lambda engine, server, host, port: captured.update(server=server))
    cli.main(["serve", "--enable-prompt-embeds"])
    assert captured["server"].enable_prompt_embeds is True
    cli.main(["serve"])
    assert captured["server"].enable_prompt_embeds is False
