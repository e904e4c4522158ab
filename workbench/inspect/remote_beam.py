"""Client-side beam search over any OpenAI-compatible server (ours, or a vLLM deployment).

The same algorithm as the engine's (`workbench.engine.requests.beam_search.BeamSearch`), driven through
`/v1/completions`: each step sends every live beam as a token-id prompt in one request, with
`max_tokens=1`, `logprobs=2 * beam_width` and `return_tokens_as_token_ids` (so candidates come
back as ids, not ambiguous strings), and reads each beam's top candidates from `top_logprobs`.
Logprobs are the server's raw ones, as the engine's, so the result (and its `BeamTree`) is the
same as a local search on the same weights. Costs one HTTP request per step; the server
recomputes (or prefix-caches) each beam's context.

>>> out = remote_beam_search(openai.OpenAI(base_url=url), "smollm2-135m-instruct",
...                          "Once upon a time", BeamSearchParams(4, 16), tokenizer)  # doctest: +SKIP
>>> out.sequences[0].text, out.tree                                                    # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

from workbench.engine.requests.beam_search import BeamSearch, BeamSearchOutput
from workbench.inspect.beam_tree import with_beam_tree
from workbench.sampling_params import BeamSearchParams


def _complete(client: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST /v1/completions with an `openai.OpenAI` or an `httpx.Client`; the choices as dicts."""
    if hasattr(client, "completions"):  # the official client: extras go in extra_body
        known = {"model", "prompt", "max_tokens", "logprobs", "temperature"}
        resp = client.completions.create(**{k: v for k, v in body.items() if k in known},
                                         extra_body={k: v for k, v in body.items()
                                                     if k not in known})
        return [c.model_dump() for c in resp.choices]
    resp = client.post("/v1/completions", json=body)
    resp.raise_for_status()
    return resp.json()["choices"]


def _candidates(choice: dict[str, Any], k: int) -> tuple[list[int], list[float]]:
    """The top-k (token id, logprob) of a one-token choice, best first."""
    top = ((choice.get("logprobs") or {}).get("top_logprobs") or [None])[0] or {}
    pairs = sorted(((int(tok.split(":", 1)[1]), lp) for tok, lp in top.items()),
                   key=lambda p: -p[1])[:k]
    return [t for t, _ in pairs], [lp for _, lp in pairs]


def remote_beam_search(client: Any, model: str, prompt: str | list[int],
                       params: BeamSearchParams, tokenizer: Any,
                       add_special_tokens: bool = True) -> BeamSearchOutput:
    """Beam search through a server's `/v1/completions`; `tokenizer` is the served model's."""
    ids = (tokenizer(prompt, add_special_tokens=add_special_tokens)["input_ids"]
           if isinstance(prompt, str) else list(prompt))
    texts: dict[int, str] = {}

    def token_text(t: int) -> str:
        if t not in texts:
            texts[t] = tokenizer.decode([t], skip_special_tokens=False)
        return texts[t]

    search = BeamSearch(ids, params, tokenizer.eos_token_id, token_text,
                        prompt=prompt if isinstance(prompt, str) else None)
    k = search.num_candidates
    while not search.done:
        choices = _complete(client, {
            "model": model, "prompt": [b.tokens for b in search.live], "max_tokens": 1,
            "logprobs": k, "temperature": 0.0, "ignore_eos": True,
            "return_tokens_as_token_ids": True})
        choices.sort(key=lambda c: c["index"])
        if any(c.get("finish_reason") == "error" for c in choices):
            return with_beam_tree(search.error())
        cands = [_candidates(c, k) for c in choices]
        search.advance([c[0] for c in cands], [c[1] for c in cands])
    return with_beam_tree(search.result(lambda gen: tokenizer.decode(
        gen, skip_special_tokens=params.skip_special_tokens)))
