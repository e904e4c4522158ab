"""ValidationReport: the pipeline's own checks; the error equals what the HTTP server answers."""

from __future__ import annotations

import pytest

from workbench.inspect.validation_report import ValidationReport, validate

MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def llm(default_model):
    from workbench import LLM

    return LLM(model=default_model, max_model_len=512, seed=0)


@pytest.fixture(scope="module")
def server(llm):
    from workbench import serve_in_kernel

    with serve_in_kernel(llm, port=0) as handle:
        yield handle


@pytest.fixture(scope="module")
def servings(server):
    return server.app.state.servings


@pytest.fixture
def http(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def test_valid_request_passes_with_ignored_and_coerced_fields(servings):
    from workbench.serving.protocol import ChatCompletionRequest

    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}],
            "temperature": 0.001, "user": "me"}
    report = validate(servings, body)
    assert report.ok and report.status_code == 200 and not report.failed
    assert {c.name for c in report.ignored} == {"user"}
    coerced = {c.name: c for c in report.coerced}
    assert coerced["temperature"].value == 0.01
    prompt = servings.chat.render(ChatCompletionRequest.model_validate(body))
    assert coerced["max_tokens"].value == 512 - len(prompt.token_ids)  # the context's room
    assert report["engine inputs"].status == "passed"


def test_beam_search_lists_the_sampling_fields_it_does_not_use(servings):
    body = {"model": MODEL, "prompt": "Once", "use_beam_search": True, "n": 2, "max_tokens": 2,
            "stop": ["\n"], "top_p": 0.5, "length_penalty": 0.5}
    report = validate(servings, body, endpoint="/v1/completions")
    assert report.ok
    ignored = {c.name for c in report.ignored}
    assert {"stop", "top_p"} <= ignored and "length_penalty" not in ignored


@pytest.mark.parametrize(("endpoint", "body", "param"), [
    ("/v1/completions", {"prompt": "hi", "max_tokens": 600}, "max_tokens"),
    ("/v1/completions", {"prompt": "hi", "model": "nope"}, "model"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": "many"}, "body.max_tokens"),
    ("/v1/completions", {"prompt": "hi", "logprob_token_ids": [1]}, "logprob_token_ids"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi " * 600}]},
     "input_tokens"),
])
def test_failed_check_names_the_param_and_error_equals_the_server(servings, http, endpoint,
                                                                   body, param):
    body = {"model": MODEL, **body}
    report = validate(servings, body)
    assert len(report.failed) == 1 and report.failed[0].param == param
    response = http.post(endpoint, json=body)
    assert report.error == response.json()
    assert report.status_code == response.status_code


def test_validate_route_returns_the_report(servings, http):
    body = {"model": MODEL, "prompt": "hi", "max_tokens": 600}
    data = http.post("/v1/validate", json=body).json()
    assert ValidationReport.from_dict(data) == validate(servings, body)


def test_frame_dict_and_html(servings):
    report = validate(servings, {"model": MODEL, "prompt": "hi", "user": "u"})
    frame = report.to_frame()
    assert list(frame["status"]) == [c.status for c in report.checks]
    assert report.to_dict()["ok"] is True
    html = report._repr_html_()
    assert html == validate(servings, {"model": MODEL, "prompt": "hi", "user": "u"})._repr_html_()
    assert "ignored" in html and "<script" not in html
    assert repr(report).startswith("ValidationReport(completions: ok, ")


def test_an_unknown_field_fails_validation_by_name(servings):
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "colour": "blue"}
    report = validate(servings, body)
    assert not report.ok and report.status_code == 400
    assert report.error["error"]["param"] == "colour"
