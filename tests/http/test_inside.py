"""`capture`, `logit_lens` and `interventions` over HTTP (through the `openai` SDK's
`extra_body`): the choice's `activations` equal the offline `LLM.generate`'s bit for bit,
streamed on the finishing chunk; refusals are 400s naming the field; `--steering-vectors`
vectors by name; the validation report lists what was resolved. On the tiny llama (2 layers,
hidden size 64).
"""

from __future__ import annotations

import json

import pytest

from workbench.sampling_params import SamplingParams

PROMPT = "The capital of France is"
MSG = [{"role": "user", "content": "hi"}]
CAPTURE = {"sites": ["resid_post"], "layers": [0]}
HIDDEN = 64
MAX_CAPTURE_MB = 0.1  # 104857 bytes: one site-layer of ~30 positions fits, every site does not


@pytest.fixture(scope="module")
def steering(tmp_path_factory):
    import torch

    path = tmp_path_factory.mktemp("vectors") / "up.pt"
    torch.save(torch.randn(HIDDEN, generator=torch.Generator().manual_seed(0)) * 40, path)
    return str(path)


@pytest.fixture(scope="module")
def tiny_llm(tiny_llama, steering):  # overrides conftest's: this module's engine flags
    from workbench import LLM

    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0,
               max_capture_mb=MAX_CAPTURE_MB, steering_vectors={"up": steering})


def _decode(wire):
    from workbench.inspect.activations import ActivationCache

    return ActivationCache.from_wire(wire)


def test_completion_activations_equal_the_offline_generate_bit_for_bit(tiny_sdk, tiny_llm,
                                                                        tiny_model_name):
    r = tiny_sdk.completions.create(model=tiny_model_name, prompt=PROMPT, max_tokens=4,
                                    temperature=0, extra_body={"capture": CAPTURE})
    wire = r.choices[0].model_extra["activations"]
    offline = tiny_llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=4,
                                                       capture=CAPTURE))[0]
    assert r.choices[0].text == offline.outputs[0].text
    assert wire == offline.activations.to_wire()  # the same bytes
    import torch

    from workbench.inside.tensors import decode_tensor

    served, local = _decode(wire), offline.activations
    name = "blocks.0.hook_resid_post"
    assert torch.equal(torch.as_tensor(served[name]), torch.as_tensor(local[name]))
    assert json.loads(json.dumps(wire)) == wire  # plain JSON
    tensors = [v for v in _walk(wire) if isinstance(v, dict) and {"dtype", "shape", "data"} <= set(v)]
    assert tensors and all(decode_tensor(t).numel() > 0 for t in tensors)


def _walk(value):
    yield value
    if isinstance(value, dict):
        for v in value.values():
            yield from _walk(v)
    elif isinstance(value, list):
        for v in value:
            yield from _walk(v)


def test_keys_are_absent_unless_asked(tiny_http):
    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    choice = tiny_http.post("/v1/completions", json=body).json()["choices"][0]
    assert "activations" not in choice and "logit_lens" not in choice
    chat = tiny_http.post("/v1/chat/completions", json={"messages": MSG, "max_tokens": 2}).json()
    assert "activations" not in chat["choices"][0] and "logit_lens" not in chat["choices"][0]
    for event in _events(tiny_http, "/v1/completions", {**body, "stream": True}):
        assert all("activations" not in c for c in event.get("choices", []))


def _events(http, path, body):
    with http.stream("POST", path, json=body) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines()
                if line.startswith("data: ") and line != "data: [DONE]"]


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": MSG}),
])
def test_the_finishing_chunk_carries_what_the_whole_response_does(tiny_http, path, body):
    body = {**body, "max_tokens": 4, "temperature": 0, "capture": CAPTURE,
            "logit_lens": {"layers": [0, 1], "top_k": 3}}
    whole = tiny_http.post(path, json=body).json()["choices"][0]
    assert whole["activations"] and whole["logit_lens"]
    events = _events(tiny_http, path, {**body, "stream": True})
    carrying = [c for e in events for c in e.get("choices", []) if "activations" in c]
    assert len(carrying) == 1 and carrying[0]["finish_reason"] is not None
    assert carrying[0]["activations"] == whole["activations"]
    assert carrying[0]["logit_lens"] == whole["logit_lens"]


def test_chat_capture_through_the_sdk(tiny_sdk, tiny_model_name):
    r = tiny_sdk.chat.completions.create(model=tiny_model_name, messages=MSG, max_tokens=3,
                                         temperature=0, extra_body={"capture": "resid_pre"})
    cache = _decode(r.choices[0].model_extra["activations"])
    assert "blocks.0.hook_resid_pre" in cache and "blocks.1.hook_resid_pre" in cache


def test_the_logit_lens_decodes(tiny_http):
    from workbench.inspect.logit_lens import LogitLens

    body = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0,
            "logit_lens": {"layers": [1], "top_k": 2}}
    choice = tiny_http.post("/v1/completions", json=body).json()["choices"][0]
    assert "activations" not in choice
    assert isinstance(LogitLens.from_wire(choice["logit_lens"]), LogitLens)


@pytest.mark.parametrize("capture, words, param", [
    ({"sites": ["resid_sideways"]}, "unknown site", "capture.sites"),
    ({"sites": ["resid_post"], "layers": [2]}, "out of range", "capture.layers"),
    ({"sites": ["blocks.7.hook_resid_post"]}, "out of range", "capture.sites"),
    ({"sites": ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out"]},
     "--max-capture-mb", "capture"),
    ({"sites": ["resid_post"], "bogus": 1}, "unknown field", "capture"),
    ({"sites": ["resid_post"], "positions": [0, -2]}, "integers >= 0", "capture.positions"),
    ({"sites": ["resid_post"], "positions": {"start": 3, "stop": 1}}, "0 <= start < stop",
     "capture.positions"),
])
@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 90}),
    ("/v1/chat/completions", {"messages": MSG, "max_tokens": 90}),
])
def test_a_bad_capture_is_a_400_naming_capture(tiny_http, path, body, capture, words, param):
    r = tiny_http.post(path, json={**body, "capture": capture})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and words in error["message"], error
    assert error["type"] == "BadRequestError"


def test_a_bad_capture_through_the_sdk(tiny_sdk, tiny_model_name):
    import openai

    with pytest.raises(openai.BadRequestError) as info:
        tiny_sdk.completions.create(model=tiny_model_name, prompt=PROMPT, max_tokens=2,
                                    extra_body={"capture": {"sites": ["nope"]}})
    assert info.value.body["param"] == "capture.sites"


def test_a_streamed_bad_capture_is_refused_before_the_stream(tiny_http):
    r = tiny_http.post("/v1/completions", json={"prompt": PROMPT, "stream": True,
                                                "capture": {"sites": ["resid_post"],
                                                            "layers": [5]}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "capture.layers"


@pytest.mark.parametrize("vector", [[1.0] * (HIDDEN - 1), [[1.0] * HIDDEN] * 2])
def test_a_wrong_size_vector_is_a_400_naming_it(tiny_http, vector):
    body = {"prompt": PROMPT, "max_tokens": 2, "interventions": [
        {"site": "resid_post", "layer": 0, "op": "add", "vector": vector}]}
    r = tiny_http.post("/v1/completions", json=body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "interventions[0].vector" and f"[{HIDDEN}]" in error["message"]


def test_an_unknown_steering_vector_is_a_400_naming_it(tiny_http):
    body = {"messages": MSG, "interventions": [
        {"site": "resid_post", "layer": 0, "op": "add", "name": "down"}]}
    r = tiny_http.post("/v1/chat/completions", json=body)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "interventions[0].name" and "'up'" in error["message"]


def test_a_named_steering_vector_changes_the_output(tiny_sdk, tiny_model_name):
    kwargs = dict(model=tiny_model_name, prompt=PROMPT, max_tokens=8, temperature=0)
    plain = tiny_sdk.completions.create(**kwargs).choices[0].text
    steer = {"site": "blocks.0.hook_resid_post", "op": "add", "name": "up"}
    steered = tiny_sdk.completions.create(**kwargs, extra_body={"interventions": [steer]})
    assert steered.choices[0].text != plain
    assert "activations" not in steered.choices[0].model_extra  # changes, records nothing
    again = tiny_sdk.completions.create(**kwargs, extra_body={"interventions": [steer]})
    assert again.choices[0].text == steered.choices[0].text  # deterministic
    assert tiny_sdk.completions.create(**kwargs).choices[0].text == plain  # nothing leaked


@pytest.mark.parametrize("field, value", [
    ("capture", CAPTURE), ("logit_lens", {"top_k": 2}),
    ("interventions", [{"site": "resid_post", "layer": 0, "op": "zero"}]),
])
def test_beam_search_refuses_them_by_name(tiny_http, field, value):
    body = {"prompt": PROMPT, "max_tokens": 2, "use_beam_search": True, "n": 2, field: value}
    r = tiny_http.post("/v1/completions", json=body)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == field and "beam search" in r.json()["error"]["message"]


def test_n_above_one_with_a_capture_is_refused(tiny_http):
    r = tiny_http.post("/v1/completions", json={"prompt": PROMPT, "n": 2, "temperature": 1,
                                                "capture": CAPTURE})
    assert r.status_code == 400 and r.json()["error"]["param"] == "capture"


@pytest.mark.parametrize("path, body", [
    ("/v1/responses", {"input": "hi", "max_output_tokens": 2}),
    ("/v1/embeddings", {"input": "hi"}),
    ("/pooling", {"input": "hi"}),
    ("/tokenize", {"prompt": "hi"}),
])
@pytest.mark.parametrize("field", ["capture", "logit_lens", "interventions"])
def test_other_endpoints_refuse_them_by_name(tiny_http, path, body, field):
    r = tiny_http.post(path, json={**body, field: CAPTURE if field != "interventions" else []})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert "/v1/completions and /v1/chat/completions" in r.json()["error"]["message"]


def test_the_validation_report_lists_what_is_captured_and_changed(tiny_http):
    body = {"prompt": PROMPT, "max_tokens": 2,
            "capture": {"sites": ["resid_post", "blocks.1.attn.hook_pattern"],
                        "positions": "prompt"},
            "logit_lens": {"layers": [-1], "top_k": 2},
            "interventions": [{"site": "resid_mid", "layer": 1, "op": "scale", "scale": 0.5,
                               "positions": [0, 1]},
                              {"site": "resid_post", "layer": 0, "op": "add", "name": "up"}]}
    report = tiny_http.post("/v1/validate", json=body).json()
    assert report["ok"], report
    rows = {c["name"]: c for c in report["checks"]}
    capture = rows["capture"]
    assert capture["status"] == "passed" and capture["stage"] == "sampling params"
    assert capture["value"]["sites"] == ["blocks.0.hook_resid_post", "blocks.1.hook_resid_post",
                                         "blocks.1.attn.hook_pattern"]
    assert capture["value"]["positions"] == "prompt"
    assert "blocks.1.attn.hook_pattern" in capture["reason"] and "prompt" in capture["reason"]
    assert rows["logit_lens"]["value"]["layers"] == [1]  # -1 resolved
    first, second = rows["interventions[0]"], rows["interventions[1]"]
    assert first["value"]["site"] == "blocks.1.hook_resid_mid" and first["value"]["op"] == "scale"
    assert first["value"]["positions"] == [0, 1] and "scale" in first["reason"]
    assert second["value"]["name"] == "up" and "'up'" in second["reason"]
    assert not [c for c in report["checks"] if c["name"] == "capture" and c["reason"] ==
                "honoured"]  # one row per field: the resolved one


def test_the_validation_report_names_a_failed_capture(tiny_http):
    body = {"prompt": PROMPT, "capture": {"sites": ["resid_post"], "layers": [9]}}
    report = tiny_http.post("/v1/validate", json=body).json()
    assert not report["ok"] and report["error"]["error"]["param"] == "capture.layers"
    assert [c for c in report["checks"] if c["status"] == "failed"][0]["param"] == \
        "capture.layers"


def test_inline_vectors_and_wire_tensors_are_accepted(tiny_http):
    import torch

    from workbench.inside.tensors import encode_tensor

    vector = torch.ones(HIDDEN) * 30
    base = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0}
    texts = []
    for v in (vector.tolist(), encode_tensor(vector)):
        body = {**base, "interventions": [{"site": "resid_post", "layer": 0, "op": "add",
                                           "vector": v}]}
        r = tiny_http.post("/v1/completions", json=body)
        assert r.status_code == 200, r.text
        texts.append(r.json()["choices"][0]["text"])
    assert texts[0] == texts[1]


def test_httpx_and_sdk_give_the_same_json(tiny_http, tiny_sdk, tiny_model_name):
    body = {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "capture": CAPTURE}
    raw = tiny_http.post("/v1/completions", json=body).json()["choices"][0]["activations"]
    via = tiny_sdk.completions.create(model=tiny_model_name, prompt=PROMPT, max_tokens=3,
                                      temperature=0, extra_body={"capture": CAPTURE})
    assert via.choices[0].model_extra["activations"] == raw


@pytest.fixture
def resolutions(monkeypatch):
    """Every resolution against the model (`workbench.inside.resolve.resolve`), counted."""
    import workbench.inside.resolve as module

    calls = []
    real = module.resolve

    def counted(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "resolve", counted)
    return calls


@pytest.mark.parametrize("path, body", [
    ("/v1/completions", {"prompt": PROMPT}),
    ("/v1/chat/completions", {"messages": MSG}),
    ("/v1/completions", {"prompt": PROMPT, "stream": True}),
    ("/v1/validate", {"prompt": PROMPT}),
])
def test_over_http_a_request_is_resolved_once(tiny_http, resolutions, path, body):
    """The serving layer resolves the capture, lens and interventions against the model (a
    400 before anything is queued, the report's rows); the engine reuses that resolution
    instead of resolving and checking again."""
    body = {**body, "max_tokens": 3, "temperature": 0, "capture": CAPTURE,
            "logit_lens": {"layers": [1], "top_k": 2, "positions": [0, 2]},
            "interventions": [{"site": "resid_post", "layer": 0, "op": "scale", "scale": 0.5,
                               "positions": {"start": 1, "stop": 3}}]}
    r = tiny_http.post(path, json=body)
    assert r.status_code == 200, r.text
    assert len(resolutions) == 1


def test_a_compared_variant_is_resolved_once(tiny_http, resolutions, tiny_model_name):
    body = {"prompt": PROMPT, "text": " Paris", "variants": [
        {}, {"interventions": [{"site": "resid_post", "layer": 0, "op": "zero"}]}]}
    r = tiny_http.post("/v1/compare", json=body)
    assert r.status_code == 200, r.text
    assert len(resolutions) == 1  # the variant with interventions; the base has none


def test_logit_lens_positions_take_a_list_and_a_range(tiny_http):
    from workbench.inspect.logit_lens import LogitLens

    base = {"prompt": PROMPT, "max_tokens": 2, "temperature": 0}
    for positions, expected in (([0, 3], [0, 3]), ({"start": 1, "stop": 3}, [1, 2])):
        choice = tiny_http.post("/v1/completions", json={
            **base, "logit_lens": {"layers": [0], "positions": positions}}).json()["choices"][0]
        assert LogitLens.from_wire(choice["logit_lens"]).positions == expected
    r = tiny_http.post("/v1/completions", json={**base, "logit_lens": {"positions": "first"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_lens.positions"
    r = tiny_http.post("/v1/completions", json={**base, "interventions": [
        {"site": "resid_post", "layer": 0, "op": "zero"},
        {"site": "resid_post", "layer": 0, "op": "zero", "positions": [1, 1]}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "interventions[1].positions"
