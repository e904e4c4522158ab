"""LoRA over HTTP: /v1/models cards, requests naming adapters, runtime load / unload with the
reference's messages, resolution from a directory, default adapters per content type, bad
adapters as 400 while the server keeps serving — through the official openai client too."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.lora.helpers import fresh_tiny, make_adapter
from workbench import LLM, LoRARequest, SamplingParams, serve_in_kernel
from workbench.serving.config import ServerConfig

BASE = "tiny-llama"


@pytest.fixture(scope="module")
def setup(adapters, tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    resolvable = root / "resolvable"
    resolvable.mkdir()
    make_adapter(resolvable / "found", seed=5, base_model=BASE)
    make_adapter(resolvable / "other-base", seed=5, base_model="some/other-model")
    broken = make_adapter(resolvable / "broken", seed=6, base_model=BASE)
    (broken / "adapter_model.safetensors").write_bytes(b"not safetensors")
    make_adapter(root / "outside", seed=5, base_model=BASE)
    llm = LLM(fresh_tiny(), enable_lora=True, max_loras=2, dtype="float32", num_kv_blocks=64,
              max_model_len=256)
    config = ServerConfig(lora_modules=(f"a={adapters['a']}",
                                        json.dumps({"name": "b", "path": str(adapters["b"])})),
                          default_mm_loras={"text": str(adapters["b"])},
                          allow_runtime_lora_updating=True,
                          lora_resolver_dirs=(str(resolvable),),
                          lora_load_dirs=(str(tmp_path_factory.getbasetemp()),))
    server = serve_in_kernel(llm, config=config)
    yield {"llm": llm, "server": server, "root": root, "resolvable": resolvable}
    server.stop()


@pytest.fixture
def http(setup):
    with httpx.Client(base_url=setup["server"].url, timeout=120) as client:
        yield client


def complete(http, model, prompt="Hello there", **extra):
    return http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 6,
                                              "temperature": 0, "ignore_eos": True, **extra})


def offline(setup, lora, prompt="Hello there"):
    out = setup["llm"].generate([prompt], SamplingParams(max_tokens=6, temperature=0,
                                                         ignore_eos=True), lora_request=lora)
    return out[0].outputs[0].text


def test_models_lists_adapters_with_parent_and_root(http, adapters):
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    assert list(cards)[:1] == [BASE]
    assert cards[BASE]["parent"] is None and cards[BASE]["max_model_len"] == 256
    for name in ("a", "b", "text"):
        assert cards[name]["parent"] == BASE and cards[name]["max_model_len"] is None
    assert cards["a"]["root"] == str(adapters["a"]) and cards["text"]["root"] == str(adapters["b"])


def test_a_request_naming_an_adapter_uses_it(http, setup, adapters):
    r = complete(http, "a")
    assert r.status_code == 200 and r.json()["model"] == "a"
    assert r.json()["choices"][0]["text"] == offline(setup, LoRARequest("x", 91,
                                                                       str(adapters["a"])))
    base = complete(http, BASE).json()
    assert base["model"] == BASE and base["choices"][0]["text"] == offline(setup, None)
    assert base["choices"][0]["text"] != r.json()["choices"][0]["text"]
    beams = complete(http, "a", use_beam_search=True, n=2, temperature=1.0)
    assert beams.status_code == 200 and beams.json()["model"] == "a"


def test_openai_client_chat_and_completion(setup):
    client = openai.OpenAI(base_url=setup["server"].base_url, api_key="x", max_retries=0)
    chat = client.chat.completions.create(model="b", messages=[{"role": "user", "content": "Hi"}],
                                          max_tokens=5, temperature=0)
    assert chat.model == "b"
    stream = client.completions.create(model="a", prompt="Hello there", max_tokens=6,
                                       temperature=0, stream=True, extra_body={"ignore_eos": True})
    chunks = list(stream)
    assert {c.model for c in chunks} == {"a"}
    assert "".join(c.choices[0].text for c in chunks if c.choices) == offline(
        setup, LoRARequest("x", 91, str(setup["server"].app.state.servings.adapters
                                        .lora_requests["a"].lora_path)))
    assert [m.id for m in client.models.list()][:3] == [BASE, "a", "b"]
    with pytest.raises(openai.NotFoundError, match="The model `nope` does not exist"):
        client.completions.create(model="nope", prompt="x", max_tokens=2)


def test_default_adapter_for_content_types(http):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    plain = [{"role": "user", "content": "Hi"}]
    body = {"max_tokens": 5, "temperature": 0, "ignore_eos": True}
    with_parts = http.post("/v1/chat/completions", json={"messages": parts, **body}).json()
    assert with_parts["model"] == "text"  # exactly one adapter named like a part's type
    b = http.post("/v1/chat/completions", json={"model": "b", "messages": plain, **body}).json()
    assert with_parts["choices"][0]["message"] == b["choices"][0]["message"]  # same weights
    base = http.post("/v1/chat/completions", json={"messages": plain, **body}).json()
    assert base["model"] == BASE  # a string content has no part types: the base model
    named = http.post("/v1/chat/completions", json={"model": "a", "messages": parts, **body})
    assert named.json()["model"] == "a"  # a named adapter wins


def test_default_adapter_needs_exactly_one_match(setup):
    adapters = setup["server"].app.state.servings.adapters
    assert adapters.adapter_for(None, {"text"}).lora_name == "text"
    assert adapters.adapter_for(None, {"image"}) is None
    assert adapters.adapter_for(None, {"text", "a"}) is None  # two adapters match: none
    from workbench.serving.lora import message_content_types

    assert message_content_types([{"content": [{"type": "image_url"}, {"type": "text"}]},
                                  {"content": "plain"}]) == {"image", "text"}


def test_load_and_unload_routes(http, adapters, setup):
    load = lambda body: http.post("/v1/load_lora_adapter", json=body)  # noqa: E731
    unload = lambda body: http.post("/v1/unload_lora_adapter", json=body)  # noqa: E731
    r = load({"lora_name": "c", "lora_path": str(adapters["a"])})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'c' added successfully."
    assert complete(http, "c").json()["choices"][0]["text"] == complete(http, "a").json()[
        "choices"][0]["text"]
    errors = [
        (load({"lora_name": "c"}), 400, "InvalidUserInput",
         "Both 'lora_name' and 'lora_path' must be provided."),
        (load({"lora_name": "c", "lora_path": str(adapters["b"])}), 400, "InvalidUserInput",
         "The lora adapter 'c' has already been loaded. If you want to load the adapter in "
         "place, set 'load_inplace' to True."),
        (load({"lora_name": BASE, "lora_path": str(adapters["b"])}), 400, "InvalidUserInput",
         f"The lora adapter '{BASE}' conflicts with a served base model."),
        (unload({}), 400, "InvalidUserInput",
         "'lora_name' needs to be provided to unload a LoRA adapter."),
        (unload({"lora_name": "zzz"}), 404, "NotFoundError",
         "The lora adapter 'zzz' cannot be found."),
    ]
    for response, status, kind, message in errors:
        assert response.status_code == status, response.text
        assert response.json()["error"]["type"] == kind
        assert response.json()["error"]["message"] == message
    missing = load({"lora_name": "d", "lora_path": str(setup["root"] / "no-such-adapter")})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "NotFoundError"
    assert missing.json()["error"]["message"].startswith("Loading lora d failed: No adapter found")
    outside = load({"lora_name": "d", "lora_path": "/no/such/adapter"})  # not an allowed dir
    assert outside.status_code == 400 and "'lora_path' must lie inside" in outside.text
    before = complete(http, "c").json()["choices"][0]["text"]
    r = load({"lora_name": "c", "lora_path": str(adapters["b"]), "load_inplace": True})
    assert r.status_code == 200
    after = complete(http, "c").json()["choices"][0]["text"]
    assert after != before and after == complete(http, "b").json()["choices"][0]["text"]
    r = unload({"lora_name": "c"})
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'c' removed successfully."
    assert complete(http, "c").status_code == 404
    assert "c" not in [m["id"] for m in http.get("/v1/models").json()["data"]]


def test_bad_adapters_are_400_and_the_server_keeps_serving(http, tmp_path):
    corrupt = make_adapter(tmp_path / "corrupt", seed=1)
    (corrupt / "adapter_model.safetensors").write_bytes(b"\x00" * 64)
    big = make_adapter(tmp_path / "big", seed=1, rank=32)
    make_adapter(tmp_path / "lmhead", seed=1, targets=("q_proj", "lm_head"))
    shapes = make_adapter(tmp_path / "shapes", seed=1)  # then made for a narrower model
    from safetensors.torch import load_file, save_file

    weights = load_file(shapes / "adapter_model.safetensors")
    save_file({k: v[:, :32].contiguous() if "lora_A" in k else v for k, v in weights.items()},
              str(shapes / "adapter_model.safetensors"))
    deeper = make_adapter(tmp_path / "deeper", seed=1)  # names a layer the model lacks
    weights = load_file(deeper / "adapter_model.safetensors")
    save_file({k.replace("layers.1.", "layers.7."): v for k, v in weights.items()},
              str(deeper / "adapter_model.safetensors"))
    bad_json = make_adapter(tmp_path / "badjson", seed=1)
    (bad_json / "adapter_config.json").write_text("{not json")
    cases = {
        "corrupt": "adapter_model.safetensors could not be read",
        "big": "LoRA rank 32 is greater than max_lora_rank 16.",
        "lmhead": "unexpected tensor 'base_model.model.lm_head",
        "shapes": "do not fit (expected [4, 64] and [64, 4]): the adapter was made for another",
        "deeper": "target module model.layers.7.self_attn.q_proj does not exist in the model",
        "badjson": "adapter_config.json is not valid JSON",
    }
    for name, fragment in cases.items():
        r = http.post("/v1/load_lora_adapter", json={"lora_name": name,
                                                      "lora_path": str(tmp_path / name)})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["type"] == "BadRequestError"
        assert r.json()["error"]["message"].startswith(f"Loading lora {name} failed: ")
        assert fragment in r.json()["error"]["message"]
        assert complete(http, name).status_code == 404  # never served
    r = http.post("/v1/load_lora_adapter", json={"lora_name": "x", "lora_path": str(big),
                                                  "is_3d_lora_weight": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "is_3d_lora_weight"
    assert complete(http, BASE).status_code == 200
    assert complete(http, "a").status_code == 200


def test_resolver_loads_from_its_directory_only(http, setup):
    r = complete(http, "found")
    assert r.status_code == 200 and r.json()["model"] == "found"
    cards = {c["id"]: c for c in http.get("/v1/models").json()["data"]}
    assert cards["found"]["root"] == str(setup["resolvable"] / "found")
    broken = complete(http, "broken")
    assert broken.status_code == 400
    assert broken.json()["error"]["message"] == \
        "LoRA adapter 'broken' was found but could not be loaded."
    for name in ("other-base", "../outside", str(setup["root"] / "outside"), "..", "missing"):
        r = complete(http, name)
        assert r.status_code == 404, name  # (paths in messages are sanitized to <path>)
        assert r.json()["error"]["message"].startswith("The model `")
        assert r.json()["error"]["param"] == "model"
    assert complete(http, BASE).status_code == 200


def test_runtime_routes_need_the_switch(adapters, monkeypatch):
    for name in ("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "WORKBENCH_ALLOW_RUNTIME_LORA_UPDATING"):
        monkeypatch.delenv(name, raising=False)
    llm = LLM(fresh_tiny(), enable_lora=True, dtype="float32", num_kv_blocks=64,
              max_model_len=256)
    with serve_in_kernel(llm, config=ServerConfig(lora_modules=(f"a={adapters['a']}",))) as srv:
        r = httpx.post(f"{srv.url}/v1/load_lora_adapter",
                       json={"lora_name": "c", "lora_path": str(adapters["a"])})
        assert r.status_code == 404  # not registered
    monkeypatch.setenv("WORKBENCH_ALLOW_RUNTIME_LORA_UPDATING", "1")
    with serve_in_kernel(llm) as srv:  # no directory allowed: no path is
        r = httpx.post(f"{srv.url}/v1/load_lora_adapter",
                       json={"lora_name": "c", "lora_path": str(adapters["a"])})
        assert r.status_code == 400 and "none is configured" in r.json()["error"]["message"]
    allowed = ServerConfig(lora_load_dirs=(str(adapters["a"].parent),))
    with serve_in_kernel(llm, config=allowed) as srv:
        load = lambda path: httpx.post(f"{srv.url}/v1/load_lora_adapter",  # noqa: E731
                                       json={"lora_name": "c", "lora_path": path})
        for outside in (str(adapters["a"].parent / ".." / "elsewhere"), "/etc", "a\x00b"):
            r = load(outside)
            assert r.status_code == 400 and "'lora_path' must lie inside" in \
                r.json()["error"]["message"], outside
        assert load(str(adapters["a"])).status_code == 200


def test_static_adapters_need_lora_and_must_load(adapters, tmp_path):
    plain = LLM(fresh_tiny(), dtype="float32", num_kv_blocks=64, max_model_len=256)
    with pytest.raises(ValueError, match="need --enable-lora"):
        serve_in_kernel(plain, config=ServerConfig(lora_modules=(f"a={adapters['a']}",)))
    llm = LLM(fresh_tiny(), enable_lora=True, dtype="float32", num_kv_blocks=64,
              max_model_len=256)
    with pytest.raises(ValueError, match="Loading lora big failed: LoRA rank 32"):
        serve_in_kernel(llm, config=ServerConfig(lora_modules=(f"big={adapters['big']}",)))
