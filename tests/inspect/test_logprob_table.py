"""LogprobTable: the same greedy request read from our engine, /v1/completions and /v1/chat."""

from __future__ import annotations

import math
import re

import pytest

from workbench.inspect.logprob_table import Alternative, LogprobRow, LogprobTable

PROMPT = "The capital of France is"
MESSAGES = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture(scope="module")
def llm(default_model):
    from workbench import LLM

    return LLM(model=default_model, max_model_len=512, seed=0)


@pytest.fixture(scope="module")
def client(llm):
    import openai

    from workbench import serve_in_kernel

    with serve_in_kernel(llm, port=0) as server:
        yield openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def engine_table(llm):
    from workbench import SamplingParams

    params = SamplingParams(max_tokens=4, temperature=0, logprobs=3, prompt_logprobs=2)
    out = llm.generate([PROMPT], params)[0]
    return LogprobTable.from_response(out, tokenizer=llm.get_tokenizer())


def _values(rows):
    return [(r.token, r.logprob, [(a.token, a.logprob) for a in r.top]) for r in rows]


def test_completions_json_matches_engine(engine_table, client):
    response = client.completions.create(model="smollm2-135m-instruct", prompt=PROMPT,
                                         max_tokens=4, temperature=0, logprobs=3,
                                         extra_body={"prompt_logprobs": 2})
    table = LogprobTable.from_response(response)
    assert table.source == "completions" and len(table) == 4
    assert [(t, pytest.approx(lp, abs=1e-5), top) for t, lp, top in _values(table.rows)] \
        == _values(engine_table.rows)
    assert len(table.prompt) == len(engine_table.prompt) == 5
    assert table.prompt[0].logprob is None
    assert [r.logprob for r in table.prompt[1:]] == pytest.approx(
        [r.logprob for r in engine_table.prompt[1:]], abs=1e-5)
    assert [r.token_id for r in table.prompt[1:]] == [r.token_id for r in engine_table.prompt[1:]]
    assert [r.rank for r in table] == [r.rank for r in engine_table] == [1, 1, 1, 1]


def test_chat_json_matches_local_chat(llm, client):
    from workbench import SamplingParams

    out = llm.chat(MESSAGES, SamplingParams(max_tokens=4, temperature=0, logprobs=3))[0]
    local = LogprobTable.from_response(out)
    response = client.chat.completions.create(model="smollm2-135m-instruct", messages=MESSAGES,
                                              max_tokens=4, temperature=0, logprobs=True,
                                              top_logprobs=3)
    remote = LogprobTable.from_response(response)
    assert remote.source == "chat"
    assert remote.tokens == local.tokens
    assert remote.logprobs == pytest.approx(local.logprobs, abs=1e-5)
    assert [len(r.top) for r in remote] == [3, 3, 3, 3]


def test_access_and_frame(engine_table):
    assert engine_table[-1] is engine_table[len(engine_table) - 1]
    assert engine_table.prompt[0].logprob is None  # the first prompt token has no context
    frame = engine_table.to_frame()
    assert list(frame["part"]) == ["prompt"] * len(engine_table.prompt) + ["generated"] * 4
    assert frame["entropy"].iloc[-1] == pytest.approx(engine_table[-1].entropy)
    assert re.fullmatch(r"LogprobTable\(4 generated positions, \d+ prompt positions, "
                        r"mean logprob -\d\.\d{4}\)", repr(engine_table))


def test_entropy_is_renormalised_over_the_alternatives():
    row = LogprobRow(0, "a", math.log(0.4), 1, None,
                     (Alternative("a", math.log(0.4), 1), Alternative("b", math.log(0.4), 2)))
    assert row.entropy == pytest.approx(math.log(2))
    assert row.top_mass == pytest.approx(0.8)


def test_html_is_deterministic_and_self_contained(engine_table, llm):
    from workbench import SamplingParams

    again = llm.generate([PROMPT], SamplingParams(max_tokens=4, temperature=0, logprobs=3,
                                                  prompt_logprobs=2))[0]
    html = engine_table._repr_html_()
    assert LogprobTable.from_response(again, tokenizer=llm.get_tokenizer())._repr_html_() == html
    assert not re.search(r"[0-9a-f]{8}-[0-9a-f]{4}-", html)  # no uuid
    assert "http" not in html and "<script" not in html
    assert "background:#" in html  # coloured by probability


def test_heatmap_has_one_cell_per_position_and_rank(engine_table):
    import matplotlib

    matplotlib.use("Agg")
    ax = engine_table.heatmap()
    assert ax.images[0].get_array().shape == (4, 3)


def test_to_dict_round_trips_through_json(engine_table):
    import json

    data = json.loads(json.dumps(engine_table.to_dict()))
    assert [r["token"] for r in data["rows"]] == engine_table.tokens
