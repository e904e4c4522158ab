"""`workbench run-batch`: an OpenAI Batch file through the server's own routes, locally and on
two Ray replicas, the bad lines answered line by line."""

from __future__ import annotations

import json

import pytest

from workbench.config import EngineConfig
from workbench.jobs.batch_file import run_batch_file

LINES = [
    {"custom_id": "cmpl", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "The cat", "max_tokens": 3, "temperature": 0, "logprobs": 2,
              "capture": {"sites": ["resid_post"], "layers": [0]}}},
    {"custom_id": "chat", "method": "POST", "url": "/v1/chat/completions",
     "body": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
              "temperature": 0, "logprobs": True, "token_stats": True}},
    "this line is not JSON",
    {"custom_id": "nowhere", "method": "POST", "url": "/v1/nope", "body": {}},
    {"custom_id": "bad", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "x", "max_tokens": -1}},
    {"custom_id": "embed", "method": "POST", "url": "/v1/embeddings", "body": {"input": "hello"}},
    {"custom_id": "get", "method": "GET", "url": "/v1/completions", "body": {}},
    {"custom_id": "stream", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "x", "stream": True}},
    {"custom_id": "lens", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "One two", "max_tokens": 2, "temperature": 0,
              "logit_lens": {"top_k": 2}}},
    {"custom_id": "badsite", "method": "POST", "url": "/v1/completions",
     "body": {"prompt": "x", "max_tokens": 1, "capture": {"sites": ["nope"]}}},
]


def write_input(path):
    with open(path, "w") as f:
        for line in LINES:
            f.write((line if isinstance(line, str) else json.dumps(line)) + "\n")
        f.write("\n")  # a blank line is skipped, as vLLM's run-batch does


def read(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def config(tiny_dir):
    return EngineConfig(model=tiny_dir, dtype="float32", batch_invariant=True)


@pytest.fixture(scope="module")
def local_out(tmp_path_factory, config):
    folder = tmp_path_factory.mktemp("batch")
    write_input(folder / "in.jsonl")
    summary = run_batch_file(str(folder / "in.jsonl"), str(folder / "out.jsonl"), config,
                             progress=False)
    return summary, read(folder / "out.jsonl")


def test_each_line_answered_in_order(local_out):
    summary, out = local_out
    assert summary == {"lines": 10, "ok": 4, "errors": 6}
    assert [o["custom_id"] for o in out] == ["cmpl", "chat", None, "nowhere", "bad", "embed",
                                             "get", "stream", "lens", "badsite"]
    for o in out:
        assert set(o) == {"id", "custom_id", "response", "error"}
        assert o["id"].startswith("batch_req_")
    ok = {o["custom_id"]: o for o in out if o["error"] is None}
    assert set(ok) == {"cmpl", "chat", "embed", "lens"}
    for o in ok.values():
        assert set(o["response"]) == {"status_code", "request_id", "body"}
        assert o["response"]["status_code"] == 200
    cmpl = ok["cmpl"]["response"]["body"]
    assert cmpl["object"] == "text_completion"
    assert "blocks.0.hook_resid_post" in cmpl["choices"][0]["activations"]["tensors"]
    chat = ok["chat"]["response"]["body"]["choices"][0]
    assert "token_stats" in json.dumps(chat["logprobs"])
    assert ok["embed"]["response"]["body"]["object"] == "list"
    assert ok["lens"]["response"]["body"]["choices"][0]["logit_lens"]
    # the request id given to the server is the one reported
    assert cmpl["id"].endswith(ok["cmpl"]["response"]["request_id"])


def test_bad_lines_get_error_lines(local_out):
    _, out = local_out
    by = {o["custom_id"]: o for o in out}
    not_json = out[2]
    assert not_json["response"] is None and not_json["error"]["code"] == 400
    assert "line 3: not valid JSON" in not_json["error"]["message"]
    assert by["nowhere"]["response"] is None
    assert "/v1/nope" in by["nowhere"]["error"]["message"]
    assert "/v1/chat/completions" in by["nowhere"]["error"]["message"]
    assert by["get"]["error"]["param"] == "method"
    assert by["stream"]["error"]["param"] == "body.stream"
    # a body the server refuses: the server's own 400 body, its error object beside it
    for cid, param in (("bad", "max_tokens"), ("badsite", "capture.sites")):
        resp = by[cid]["response"]
        assert resp["status_code"] == 400
        assert resp["body"]["error"] == by[cid]["error"]
        assert by[cid]["error"]["param"] == param and by[cid]["error"]["type"] == "BadRequestError"


def without_ids(out):
    """What differs between two runs by design: the line's id and request id, the server's body
    id and created time."""
    rows = []
    for o in out:
        o = json.loads(json.dumps(o))
        o.pop("id")
        if o["response"] is not None:
            o["response"].pop("request_id")
            body = o["response"]["body"]
            if isinstance(body, dict):
                body.pop("id", None)
                body.pop("created", None)
        rows.append(o)
    return rows


@pytest.mark.slow
def test_ray_two_replicas_same_results(local_out, config, tmp_path, ray_local, capfd,
                                       monkeypatch):
    from workbench.jobs import ray_pool

    monkeypatch.setattr(ray_pool, "_explained", False)
    write_input(tmp_path / "in.jsonl")
    summary = run_batch_file(str(tmp_path / "in.jsonl"), str(tmp_path / "out.jsonl"), config,
                             ray=True, replicas=2, lines_per_call=3, progress=False)
    assert summary == local_out[0]
    # every number equal, token_stats' entropy too (summed in one order: a replica runs 1
    # thread, this process 2)
    diffs = list(_diff(without_ids(read(tmp_path / "out.jsonl")), without_ids(local_out[1])))
    assert not diffs, diffs[:5]
    # Ray's C++ warning about Ray Data's actor arguments is explained in the job's own output
    assert capfd.readouterr().err.count(ray_pool.OBJECT_STORE_NOTE) == 1


def test_cli_run_batch(tmp_path, tiny_dir):
    from workbench.apps.cli import main

    (tmp_path / "in.jsonl").write_text(json.dumps(LINES[0]) + "\n" + LINES[2] + "\n")
    rc = main(["run-batch", "-i", str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "o.jsonl"),
               "--model", tiny_dir, "--dtype", "float32"])
    assert rc == 0
    out = read(tmp_path / "o.jsonl")
    assert [o["error"] is None for o in out] == [True, False]


def _diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in set(a) | set(b):
            yield from _diff(a.get(k), b.get(k), f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield path, a, b
