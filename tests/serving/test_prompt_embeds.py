"""`prompt_embeds` and `cache_salt` through the serving pipeline, on a real engine (tiny llama).

Payloads are base64 `torch.save` tensors. Good ones give exactly the output of the token prompt
they embed; every malformed or hostile one is a `ValidationError` naming `prompt_embeds`
(a 400), decided before anything large is decoded, and the engine keeps serving.
"""

from __future__ import annotations

import base64
import io
import os
import pickle
import zipfile

import pydantic
import pytest
import torch

from tests.engine.helpers import make_llm
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.errors import ValidationError
from workbench.serving import RequestMeta, ServerConfig, Servings
from workbench.serving.prompt_embeds import (
    decode_prompt_embeds,
    encode_prompt_embeds,
    payload_limits,
)
from workbench.serving.protocol import ChatCompletionRequest, CompletionRequest

MAX_MODEL_LEN = 64
HIDDEN = 64  # the tiny llama's


@pytest.fixture(scope="module")
def engine(tiny_llama):
    torch.set_num_threads(1)
    llm = make_llm(tiny_llama, max_model_len=MAX_MODEL_LEN, block_size=4, num_kv_blocks=64)
    front = AsyncLLMEngine.from_llm(llm)
    yield front
    front.shutdown()


def servings(engine, **config):
    return Servings.build(engine, ServerConfig(**config))


def rows_of(loaded, text: str) -> tuple[list[int], torch.Tensor]:
    ids = loaded.tokenizer(text)["input_ids"]
    with torch.inference_mode():
        return ids, loaded.model.get_input_embeddings()(torch.tensor(ids)).clone()


def complete(**fields) -> CompletionRequest:
    fields.setdefault("temperature", 0.0)
    fields.setdefault("max_tokens", 6)
    fields.setdefault("ignore_eos", True)
    return CompletionRequest(**fields)


async def test_embeddings_of_the_prompt_give_the_token_prompt_output(engine, tiny_llama):
    s = servings(engine, enable_prompt_embeds=True)
    ids, rows = rows_of(tiny_llama, "Once upon a time")
    want = await s.completions.create(complete(prompt=ids), RequestMeta())
    got = await s.completions.create(
        complete(prompt="", prompt_embeds=encode_prompt_embeds(rows), logprobs=2), RequestMeta())
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.prompt_tokens == len(ids)  # embedded positions count as prompt tokens
    assert got.usage.completion_tokens == 6
    assert len(got.choices[0].logprobs.tokens) == 6


async def test_a_list_of_payloads_and_a_text_prompt_embeds_come_first(engine, tiny_llama):
    s = servings(engine, enable_prompt_embeds=True)
    ids_a, rows_a = rows_of(tiny_llama, "The weather today is")
    ids_b, rows_b = rows_of(tiny_llama, "1 2 3")
    want = [(await s.completions.create(complete(prompt=x), RequestMeta())).choices[0].text
            for x in (ids_a, ids_b, "Hello")]
    got = await s.completions.create(complete(
        prompt="Hello", prompt_embeds=[encode_prompt_embeds(rows_a), encode_prompt_embeds(rows_b)],
        return_token_ids=True), RequestMeta())
    assert [c.text for c in got.choices] == want
    assert [c.index for c in got.choices] == [0, 1, 2]
    assert got.choices[0].prompt_token_ids is None  # an embedded prompt has no ids
    assert got.choices[2].prompt_token_ids == tiny_llama.tokenizer("Hello")["input_ids"]
    assert got.usage.prompt_tokens == len(ids_a) + len(ids_b) + len(got.choices[2].prompt_token_ids)


async def test_streamed_embeddings_match_and_count_usage(engine, tiny_llama):
    import json

    s = servings(engine, enable_prompt_embeds=True)
    ids, rows = rows_of(tiny_llama, "Hello, my name is")
    want = await s.completions.create(complete(prompt=ids), RequestMeta())
    stream = await s.completions.create_stream(complete(
        prompt="", prompt_embeds=encode_prompt_embeds(rows), stream=True,
        stream_options={"include_usage": True}), RequestMeta())
    chunks = [json.loads(c) async for c in stream]
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == want.choices[0].text
    assert chunks[-1]["usage"]["prompt_tokens"] == len(ids)


async def test_truncate_prompt_tokens_keeps_the_last_rows(engine, tiny_llama):
    s = servings(engine, enable_prompt_embeds=True)
    ids, rows = rows_of(tiny_llama, "a b c d e f g h")
    want = await s.completions.create(complete(prompt=ids[-3:]), RequestMeta())
    got = await s.completions.create(complete(
        prompt="", prompt_embeds=encode_prompt_embeds(rows), truncate_prompt_tokens=3),
        RequestMeta())
    assert got.choices[0].text == want.choices[0].text
    assert got.usage.prompt_tokens == 3


async def test_prompt_embeds_need_the_flag(engine):
    with pytest.raises(ValidationError, match="You must set `--enable-prompt-embeds`") as err:
        await servings(engine).completions.create(
            complete(prompt="", prompt_embeds=encode_prompt_embeds(torch.zeros(2, HIDDEN))),
            RequestMeta())
    assert err.value.parameter == "prompt_embeds"


@pytest.mark.parametrize("fields, param, message", [
    # vLLM answers these two as plain error responses: no param, no (parameter=...) suffix
    ({"echo": True}, None, "Echo is unsupported with prompt embeds."),
    ({"prompt_logprobs": 1}, None, "prompt_logprobs is not compatible with prompt embeds."),
    ({"use_beam_search": True, "n": 2}, "prompt_embeds",
     "Beam search is not supported with prompt embeds."),
    ({"suffix": "x"}, "suffix", "suffix is only supported for models with FIM completion rendering"),
])
async def test_combinations_the_reference_refuses(engine, fields, param, message):
    from workbench.serving.errors import error_response

    payload = encode_prompt_embeds(torch.zeros(2, HIDDEN))
    with pytest.raises(Exception) as err:
        await servings(engine, enable_prompt_embeds=True).completions.create(
            complete(prompt="", prompt_embeds=payload, **fields), RequestMeta())
    error = error_response(err.value).error
    assert error.message.startswith(message)
    assert error.param == param
    if param is None:
        assert error.message == message


def saved(obj) -> str:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return base64.b64encode(buffer.getvalue()).decode()


class Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/wb_prompt_embeds_pwned",))


def legacy_pickle() -> str:
    return base64.b64encode(pickle.dumps(Exploit())).decode()


def compressed_zip() -> str:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("archive/data.pkl", b"\0" * 100_000)
    return base64.b64encode(buffer.getvalue()).decode()


HOSTILE = {
    "pickled object": (lambda: saved(Exploit()), "torch.load(weights_only=True)"),
    "plain pickle": (legacy_pickle, "torch.save (a zip archive)"),
    "dict of tensors": (lambda: saved({"x": torch.zeros(2, HIDDEN)}), "must be a torch.Tensor"),
    "wrong rank": (lambda: saved(torch.zeros(2, 2, HIDDEN)), "shape (num_tokens, hidden_size)"),
    "wrong hidden size": (lambda: saved(torch.zeros(2, HIDDEN + 1)), "hidden size 65"),
    "integer dtype": (lambda: saved(torch.zeros(2, HIDDEN, dtype=torch.int32)), "float32"),
    "NaN": (lambda: saved(torch.full((2, HIDDEN), float("nan"))), "NaN or infinite"),
    "inf": (lambda: saved(torch.full((2, HIDDEN), float("-inf"))), "NaN or infinite"),
    "empty": (lambda: saved(torch.zeros(0, HIDDEN)), "cannot be empty"),
    "garbage base64": (lambda: "not base64 at all!!", "not valid base64"),
    "base64 of junk": (lambda: base64.b64encode(b"junk" * 10).decode(), "zip archive"),
    "compressed zip": (compressed_zip, "compressed entries"),
    "a number": (lambda: 12345, "must be a base64 string"),
    "expanded view": (lambda: saved(torch.zeros(1).expand(10_000, 7, HIDDEN)), "at most 64 rows"),
    "expanded rows": (lambda: saved(torch.zeros(1).expand(10_000, HIDDEN)),
                      "prompt contains 10000 input tokens"),
    "too long for the context": (lambda: saved(torch.zeros(MAX_MODEL_LEN + 1, HIDDEN)),
                                 "maximum context length is 64 tokens"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
async def test_hostile_payloads_are_refused_and_the_engine_goes_on(engine, tiny_llama, name):
    make, message = HOSTILE[name]
    s = servings(engine, enable_prompt_embeds=True)
    with pytest.raises(ValidationError) as err:
        await s.completions.create(complete(prompt="", prompt_embeds=make()), RequestMeta())
    assert message in str(err.value)
    assert err.value.parameter in ("prompt_embeds", "input_tokens")
    assert not os.path.exists("/tmp/wb_prompt_embeds_pwned")
    ok = await s.completions.create(complete(prompt="Hi", max_tokens=2), RequestMeta())
    assert ok.choices[0].finish_reason == "length"


def test_an_oversized_payload_is_refused_before_decoding(monkeypatch):
    _, max_chars = payload_limits(HIDDEN, MAX_MODEL_LEN)
    decoded = []
    monkeypatch.setattr(base64, "b64decode", lambda *a, **k: decoded.append(1))
    with pytest.raises(ValidationError, match=f"at most {max_chars} are accepted"):
        decode_prompt_embeds("A" * (max_chars + 4), hidden_size=HIDDEN, max_rows=MAX_MODEL_LEN)
    assert not decoded


def test_a_payload_at_the_row_limit_decodes(tiny_llama):
    rows = torch.randn(MAX_MODEL_LEN, HIDDEN)
    got = decode_prompt_embeds(encode_prompt_embeds(rows), hidden_size=HIDDEN,
                               max_rows=MAX_MODEL_LEN)
    assert torch.equal(got, rows)


def test_bfloat16_and_a_batch_of_one_are_accepted():
    rows = torch.randn(1, 3, HIDDEN, dtype=torch.bfloat16)
    got = decode_prompt_embeds(saved(rows), hidden_size=HIDDEN, max_rows=MAX_MODEL_LEN)
    assert got.shape == (3, HIDDEN) and got.dtype == torch.bfloat16


def test_sparse_tensors_are_densified_after_their_invariants_are_checked():
    rows = torch.zeros(3, HIDDEN)
    rows[1, 5] = 2.0
    got = decode_prompt_embeds(saved(rows.to_sparse()), hidden_size=HIDDEN,
                               max_rows=MAX_MODEL_LEN)
    assert torch.equal(got, rows)


# -- cache_salt ------------------------------------------------------------------------------

PROMPT = "one two three four five six seven eight nine ten eleven twelve"


async def cached_tokens(s, request) -> int:
    from workbench.serving.recorder import PipelineRecorder

    recorder = PipelineRecorder()
    await (s.chat if isinstance(request, ChatCompletionRequest) else s.completions).create(
        request, RequestMeta(recorder=recorder))
    from workbench.inspect import Trace

    trace = Trace.from_recorder(recorder)  # the request trace shows what the engine found
    assert trace.to_dict()["num_cached_tokens"] == recorder.outputs[0].num_cached_tokens
    assert f"cached prompt tokens {trace.num_cached_tokens}" in trace._repr_html_()
    return trace.num_cached_tokens


async def test_different_salts_never_share_blocks_and_equal_salts_do(engine):
    engine.engine.reset_prefix_cache()
    s = servings(engine)
    first = await cached_tokens(s, complete(prompt=PROMPT, cache_salt="tenant-a", max_tokens=1))
    other = await cached_tokens(s, complete(prompt=PROMPT, cache_salt="tenant-b", max_tokens=1))
    unsalted = await cached_tokens(s, complete(prompt=PROMPT, max_tokens=1))
    same = await cached_tokens(s, complete(prompt=PROMPT, cache_salt="tenant-a", max_tokens=1))
    assert (first, other, unsalted) == (0, 0, 0)
    assert same > 0 and same % 4 == 0  # whole blocks of 4


async def test_chat_honours_cache_salt(engine):
    engine.engine.reset_prefix_cache()
    s = servings(engine)
    messages = [{"role": "user", "content": PROMPT}]

    def chat(salt):
        return ChatCompletionRequest(messages=messages, max_tokens=1, temperature=0.0,
                                     cache_salt=salt)

    assert await cached_tokens(s, chat("x")) == 0
    assert await cached_tokens(s, chat("y")) == 0
    assert await cached_tokens(s, chat("x")) > 0


@pytest.mark.parametrize("salt, message", [
    ("", "must be a non-empty string if provided."),
    ("a" * 129, "must be at most 128 characters"),
    ("a@b", "must not contain '@'"),
    ("a/b", "must not contain"),
    ("a\\b", "must not contain"),
    ("a\x00b", "must not contain"),
])
def test_cache_salt_rules(salt, message):
    for model, extra in ((CompletionRequest, {"prompt": "x"}),
                         (ChatCompletionRequest, {"messages": [{"role": "user", "content": "x"}]})):
        with pytest.raises(pydantic.ValidationError) as info:
            model.model_validate({"cache_salt": salt, **extra})
        error = info.value.errors()[0]["ctx"]["error"]
        assert str(error).startswith("Parameter 'cache_salt' must be")
        assert message in str(error)
        assert error.parameter == "cache_salt"
    CompletionRequest(prompt="x", cache_salt="a" * 128)  # the limit itself is fine


def test_the_validation_report_shows_payload_sizes_not_payloads(engine):
    from workbench.inspect.validation_report import validate

    payload = encode_prompt_embeds(torch.zeros(3, HIDDEN))
    report = validate(servings(engine, enable_prompt_embeds=True),
                      {"prompt": "", "prompt_embeds": [payload]})
    text = repr(report.to_dict())
    assert payload not in text
    assert f"'base64_chars': [{len(payload)}]" in text
