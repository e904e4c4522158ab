"""`logprob_token_ids` (a vLLM extra) on both endpoints, through the official `openai` client."""

from __future__ import annotations

import openai
import pytest

from tests.http.conftest import MODEL

pytestmark = pytest.mark.slow

HI = [{"role": "user", "content": "Is the sky blue? Answer yes or no."}]


@pytest.fixture(scope="module")
def yes_no(llm):
    tokenizer = llm.get_tokenizer()
    return [tokenizer.encode(word, add_special_tokens=False)[0] for word in ("Yes", "No")]


def test_chat_lists_exactly_the_tracked_ids_after_the_sampled_token(client, yes_no, llm):
    r = client.chat.completions.create(model=MODEL, messages=HI, max_tokens=3, temperature=0,
                                       logprobs=True, extra_body={"logprob_token_ids": yes_no})
    tokenizer = llm.get_tokenizer()
    names = [tokenizer.decode([t]) for t in yes_no]
    for entry in r.choices[0].logprobs.content:
        tops = [t.token for t in entry.top_logprobs]
        assert tops[0] == entry.token and [t for t in tops if t != entry.token] == \
            [n for n in names if n != entry.token]
        assert all(t.logprob <= 0 for t in entry.top_logprobs)


def test_completions_and_streaming_agree(client, yes_no):
    kwargs = dict(model=MODEL, prompt="The sky is blue. Yes or no?", max_tokens=3, temperature=0,
                  logprobs=0, extra_body={"logprob_token_ids": yes_no})
    whole = client.completions.create(**kwargs).choices[0].logprobs
    assert all(len(top) in (2, 3) for top in whole.top_logprobs)  # sampled + Yes + No
    assert all({"Yes", "No"} <= set(top) for top in whole.top_logprobs)
    streamed = [top for c in client.completions.create(**kwargs, stream=True)
                if c.choices and c.choices[0].logprobs for top in c.choices[0].logprobs.top_logprobs]
    assert streamed == whole.top_logprobs


@pytest.mark.parametrize(("endpoint", "body", "message"), [
    ("chat", {"logprob_token_ids": [1]}, "when using `logprob_token_ids`, `logprobs` must be set "
                                          "to true."),
    ("completions", {"logprob_token_ids": [1]}, "when using `logprob_token_ids`, `logprobs` must "
                                                "be set."),
    ("completions", {"logprob_token_ids": [1], "logprobs": 1, "use_beam_search": True, "n": 2},
     "`logprob_token_ids` is not supported with beam search."),
    ("chat", {"logprob_token_ids": [10**7], "logprobs": True},
     "token_id(s) [10000000] in logprob_token_ids contain out-of-vocab token ids."),
    ("completions", {"logprob_token_ids": list(range(129)), "logprobs": 0},
     "Requested logprob_token_ids of length 129, which is greater than max allowed: 128"),
])
def test_bad_requests_name_the_parameter(client, endpoint, body, message):
    with pytest.raises(openai.BadRequestError) as err:
        if endpoint == "chat":
            client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2, extra_body=body)
        else:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=2, extra_body=body)
    error = err.value.body
    assert message in error["message"] and error["param"] == "logprob_token_ids"
