"""LogprobTable with `token_stats`: the full entropy, rank, margin and top-k mass from the
engine's output and from a workbench server's completions and chat bodies (the same numbers);
a body without them (a vLLM server's) keeps the top-k entropy and says so. On the tiny llama."""

from __future__ import annotations

import pytest

from workbench.inspect.logprob_table import LogprobTable
from workbench.sampling_params import SamplingParams

PROMPT = "The capital of France is"
MSG = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tiny_llm(tiny_llama):
    from workbench import LLM

    return LLM(tiny_llama, max_model_len=128, block_size=16, num_kv_blocks=64, seed=0)


@pytest.fixture(scope="module")
def sdk(tiny_llm):
    import openai

    from workbench import serve_in_kernel

    with serve_in_kernel(tiny_llm, port=0) as server:
        yield openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0,
                            timeout=60)


@pytest.fixture(scope="module")
def engine_table(tiny_llm):
    params = SamplingParams(max_tokens=4, temperature=0, logprobs=3, prompt_logprobs=2,
                            token_stats=True)
    out = tiny_llm.generate(PROMPT, params)[0]
    return out, LogprobTable.from_response(out, tokenizer=tiny_llm.get_tokenizer())


def _numbers(rows):
    return [(r.rank, r.entropy, r.margin, r.top_mass) for r in rows]


def test_engine_rows_carry_the_full_distribution(engine_table):
    out, table = engine_table
    assert table.has_stats and table.entropy_kind == "full"
    for row, stats in zip(table, out.outputs[0].token_stats):
        assert row.entropy_kind == "full"
        assert (row.entropy, row.rank, row.margin, row.top_mass) == (
            stats.entropy, stats.rank, stats.margin, stats.top_k_mass)
    assert [r.stats for r in table.prompt] == out.prompt_token_stats
    assert table.prompt[0].entropy_kind is None  # the first prompt position has nothing
    assert "entropy full" in repr(table)
    frame = table.to_frame()
    assert {"entropy_kind", "margin"} <= set(frame.columns)
    assert list(frame["entropy_kind"][1:]) == ["full"] * (len(frame) - 1)
    assert "full vocabulary" in table._repr_html_()
    assert table.to_dict()["rows"][0]["stats"] == out.outputs[0].token_stats[0].to_json()


def test_completions_and_chat_bodies_give_the_engines_numbers(engine_table, sdk, tiny_llama):
    _, local = engine_table
    body = sdk.completions.create(model=tiny_llama.served_name, prompt=PROMPT, max_tokens=4,
                                  temperature=0, logprobs=3,
                                  extra_body={"prompt_logprobs": 2, "token_stats": True})
    table = LogprobTable.from_response(body)
    assert table.entropy_kind == "full"
    assert _numbers(table) == _numbers(local)
    assert _numbers(table.prompt) == _numbers(local.prompt)
    chat = sdk.chat.completions.create(model=tiny_llama.served_name, messages=MSG, max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=2,
                                       extra_body={"prompt_logprobs": 1, "token_stats": True})
    table = LogprobTable.from_response(chat)
    assert table.source == "chat" and table.entropy_kind == "full" and len(table) == 3
    assert all(r.margin is not None and r.margin >= 0 for r in (*table.prompt[1:], *table))


def test_a_body_without_stats_keeps_the_top_k_entropy(sdk, tiny_llama):
    body = sdk.completions.create(model=tiny_llama.served_name, prompt=PROMPT, max_tokens=3,
                                  temperature=0, logprobs=3)
    table = LogprobTable.from_response(body)
    assert not table.has_stats and table.entropy_kind == "top-k"
    assert all(r.margin is None and r.entropy is not None for r in table)
    assert "entropy" not in repr(table)  # reads as before token_stats existed
    assert "margin" not in table.to_frame().columns
    assert "stats" not in table.to_dict()["rows"][0]
    full = LogprobTable.from_response(sdk.completions.create(
        model=tiny_llama.served_name, prompt=PROMPT, max_tokens=3, temperature=0, logprobs=3,
        extra_body={"token_stats": True}))
    assert [r.entropy for r in full] != [r.entropy for r in table]  # the other entropy
    assert all(f.entropy > t.entropy for f, t in zip(full, table))  # a noisy tiny model: flat
