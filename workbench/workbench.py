"""`Workbench`: the endpoint suite from a notebook, each response with its inspect objects.

One method per endpoint (`completions`, `chat`, `tokenize`, `detokenize`, `models`, `validate`,
`stream_completions`, `stream_chat`, `beam_search` with its `BeamTree`, `compare_lora` (base
vs a LoRA adapter, with a `LogprobDiff`), and the pooling
endpoints `embed`, `score`, `rerank`, `classify`, `pool` with a `SimilarityMatrix` in
`.similarity`; and `score_text` / `score_chat`, given text scored token by token through
`/tokenize` and `/v1/completions` prompt logprobs, in `.scores`; `compare`, one text through
several variants of the model (base, adapters, interventions) per token, in `.comparison`;
`replay`, one request alone, batched and cached, a `DivergenceReport`), each taking the request body's fields as keyword
arguments and returning a `Result`: `.response` (the JSON body, a dict), `.logprobs`
(`LogprobTable`, when the response has logprobs), `.report` (`ValidationReport`), `.trace`
(`Trace`), `.error` (the error envelope, instead of raising).

Two back ends, same bodies in and out (`workbench/backends/`, behind `backends.base.Backend`):
- `Workbench(llm)`: in the kernel, without HTTP (`backends/local.py`): the same serving
  objects as the server on an `AsyncLLMEngine` over the LLM's engine, on the back end's own
  event-loop thread, so calls work inside a running Jupyter loop.
- `Workbench(url="http://host:port/v1", api_key=...)`: any OpenAI-compatible server (ours,
  vLLM) over httpx (`backends/remote.py`); our extras (`capture`, `logit_lens`,
  `interventions`, `token_stats`, `validate`) are refused client-side against another.

The research verbs (`branch`, `score_text` / `score_chat`, `compare` / `compare_chat`,
`replay`, `beam_search`) are plans of `workbench/verbs/`, as the offline `LLM`'s: this facade
only runs each plan's requests on its back end and hands the plan their answers.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from workbench.backends.base import Backend, compared, with_model
from workbench.backends.local import _Local, kernel_words
from workbench.backends.remote import _Remote
from workbench.backends.result import Result
from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.errors import ValidationError
from workbench.inspect import branch_tree as bt
from workbench.inspect.branch_tree import BranchTree
from workbench.inspect.divergence import TIE, DivergenceReport
from workbench.inspect.lora_compare import compare_lora, served_name
from workbench.inspect.similarity import SimilarityMatrix
from workbench.inspect.validation_report import ValidationReport, endpoint_of
from workbench.serving.errors import error_response
from workbench.verbs.beams import BeamPlan
from workbench.verbs.branch import (
    Answer,
    BranchPlan,
    Continue,
    Probe,
    continuation_fields,
    probe_fields,
)
from workbench.verbs.compare import ComparePlan, variants_of_body, workbench_variant
from workbench.verbs.replay import ReplayPlan
from workbench.verbs.scores import ScorePlan, text_spans, turn_spans


class Workbench:
    """Every endpoint, local or remote (see the module docstring).

    `Workbench(llm).completions(prompt="Hi", max_tokens=4, temperature=0).text` runs one
    greedy completion through the serving pipeline, exactly as `/v1/completions` would.
    """

    def __init__(self, llm: Any = None, *, url: str | None = None, api_key: str | None = None,
                 config: Any = None, timeout: float = 120.0, tool_server: Any = None):
        if (llm is None) == (url is None):
            raise ValueError("Workbench needs an engine (Workbench(llm)) or a url, not both.")
        self.url = url.rstrip("/") if url else None
        self._backend: Backend = (_Remote(self.url, api_key, timeout) if url
                                  else _Local(llm, config, tool_server))

    @property
    def model(self) -> str:
        """The served model name requests use by default."""
        return self._backend.model

    def completions(self, prompt: Any = None, **body: Any) -> Result:
        """`/v1/completions`; the result keeps the body it sent (`.request`, for `branch`)."""
        result = self._backend.generate("completions", {"prompt": prompt, **body})
        result.request = {"prompt": prompt, **body}
        return result

    def get_tokenizer(self) -> Any:
        """The served model's tokenizer (remotely: ours of the same model, which must be one of
        our aliases or a local directory)."""
        return self._backend.tokenizer()

    def branch(self, result: Result, position: int, tokens: int | list[int] | None = None,
               top: int | None = None, *, index: int = 0, tokenizer: Any = None,
               **body: Any) -> BranchTree:
        """What if generated token `position` of a completions `result` had been another, as
        `LLM.branch` (`workbench.inspect.branch_tree`): for each forced token one completions
        request of token ids, prompt + the tokens before `position` + that token, all in one
        call (a batch of prompts), continued with the result's own request body (`.request`)
        updated by `body`; works against any OpenAI-compatible server (vLLM too). `result`
        needs its token ids (`return_token_ids=True`); `top=n` takes the n best alternatives
        from its logprobs (asked with `return_tokens_as_token_ids=True`), or, where it has
        none, from a one-token request at that position. A forced token's logprob is the
        result's where it returned it, else asked with `logprob_token_ids` (a vLLM extra; a
        server without it leaves it unknown, None).
        `tokenizer`: the served model's, for remote servers whose model we don't have. Each
        branch's `output` is its choice of the answer; a refusal raises `ValidationError`
        naming the parameter, an error answer `RuntimeError` with the server's envelope."""
        tok = tokenizer if tokenizer is not None else self.get_tokenizer()
        plan = BranchPlan.of(result, tok, position, index)
        fields = continuation_fields(dict(result.request or {}), body)
        plan = plan.forcing(tokens, top, len(tok))
        text = bt.token_texts(tok)

        def probe(ask: Probe) -> Answer:
            answer = self._backend.generate("completions", probe_fields(ask))
            if not answer.ok:
                raise RuntimeError("the request for the position's logprobs failed: "
                                   f"{answer.error}")
            choice = answer.response["choices"][0]
            return Answer(bt.path_of_choice(choice, text), None, choice)

        if plan.probe is not None:  # no logprobs in the result: ask the server for the best
            plan = plan.probed(probe(plan.probe))
        asks = plan.requests
        probes = {i: probe(a) for i, a in enumerate(asks) if isinstance(a, Probe)}
        answer = self._backend.generate("completions", {
            **fields, "prompt": [a.prompt_token_ids for a in asks if isinstance(a, Continue)],
            "return_token_ids": True, "return_tokens_as_token_ids": True})
        if not answer.ok:
            raise RuntimeError(f"the branches' request failed: {answer.error}")
        choices = iter(sorted(answer.response["choices"], key=lambda c: c["index"]))
        answers = []
        for i in range(len(asks)):  # in the plan's order: each probe's, or the next choice's
            choice = None if i in probes else next(choices)
            answers.append(probes[i] if choice is None else
                           Answer(bt.path_of_choice(choice, text), None, choice))
        return plan.assemble(answers, fields.get("skip_special_tokens", True))

    def chat(self, messages: list[dict[str, Any]], **body: Any) -> Result:
        """`/v1/chat/completions`; the result keeps the body it sent (`.request`)."""
        result = self._backend.generate("chat", {"messages": messages, **body})
        result.request = {"messages": messages, **body}
        return result

    def replay(self, result: Result | None = None, *, others: int | list[str] = 7,
               tie: float = TIE, **body: Any) -> DivergenceReport:
        """Whether a request gives the same bits whatever runs beside it: its body (a
        `Result` of `completions` or `chat`, which keeps it, updated by `body`; or the body's
        fields, `prompt=` or `messages=`) run alone (the reference), again with its prompt in
        the prefix cache, and in the same steps as `others` other requests (a count, or their
        prompts), in the kernel or against any server (vLLM too). Returns a
        `DivergenceReport` (`workbench.inspect.divergence`): per scenario where logprobs and
        tokens first differ, by how much, and whether a token divergence is a near-tie (the
        reference's top-2 margin below `tie` nats or twice the noise before it). Needs greedy
        or seeded sampling (else a `ValidationError` naming `temperature`); forces logprobs
        (top 2), token ids, and with our back end `token_stats`
        (`workbench.verbs.replay`). A failed run raises `RuntimeError` with its envelope."""
        if result is not None:
            if result.request is None:
                raise ValidationError("replay takes a Result of Workbench.completions or "
                                      "Workbench.chat (it keeps the body it sent).",
                                      parameter="result")
            body = {**result.request, **body}
        plan = ReplayPlan.of(body, self._backend.ours, others)
        alone = plan.scenario("alone", self._backend.generate(plan.endpoint, plan.reference))
        warm = plan.scenario("warm", self._backend.generate(plan.endpoint, plan.reference))
        batch = self._backend.generate_many(plan.endpoint, plan.batch)  # the others first
        return plan.assemble(alone, warm, batch, tie, self.url or "in-kernel engine")

    def respond(self, input: Any, **body: Any) -> Result:
        """`/v1/responses` (text or items, tools, `previous_response_id`, ...): the body, and
        `.tool_loop`, a `ToolLoopTrace` of the rounds (sub-request, tool, arguments, output,
        tokens); locally every detail, remotely what the body carries."""
        return self._backend.respond({"input": input, **body})

    def stream_respond(self, input: Any, **body: Any) -> Iterator[dict[str, Any]]:
        """`/v1/responses` streamed: its events as dicts (`type`, `sequence_number`, ...); a
        refusal before the stream starts arrives as the error envelope."""
        return self._backend.stream_respond({"input": input, **body})

    def stream_completions(self, prompt: Any = None, **body: Any) -> Iterator[dict[str, Any]]:
        """The SSE chunks as dicts (an error mid-stream arrives as an `{"error": ...}` chunk)."""
        return self._backend.stream("completions", {"prompt": prompt, **body})

    def stream_chat(self, messages: list[dict[str, Any]], **body: Any) -> Iterator[dict[str, Any]]:
        return self._backend.stream("chat", {"messages": messages, **body})

    def tokenize(self, prompt: str | None = None, **body: Any) -> Result:
        if prompt is not None:
            body["prompt"] = prompt
        return self._backend.call("tokenize", body)

    def detokenize(self, tokens: list[int], **body: Any) -> Result:
        return self._backend.call("detokenize", {"tokens": tokens, **body})

    def models(self) -> Result:
        return self._backend.call("models", None)

    # -- pooling endpoints: `.similarity` is a SimilarityMatrix where the call compares texts
    def embed(self, input: Any = None, **body: Any) -> Result:
        """`/v1/embeddings`; with a list of texts, `.similarity` is their cosine matrix."""
        result = self._backend.pooling("embeddings", {"input": input, **body})
        texts = [input] if isinstance(input, str) else input
        if result.ok and texts and all(isinstance(t, str) for t in texts):
            result.similarity = SimilarityMatrix.from_embedding_response(result.response, texts)
        return result

    def score(self, queries: str | list[str], documents: str | list[str], **body: Any) -> Result:
        """`/score` of query/document pairs (1:1, 1:N, N:N) with its `.similarity`."""
        result = self._backend.pooling("score", {"queries": queries, "documents": documents,
                                                 **body})
        if result.ok:
            q = [queries] if isinstance(queries, str) else list(queries)
            d = [documents] if isinstance(documents, str) else list(documents)
            result.similarity = SimilarityMatrix.from_score_response(result.response, q, d)
        return result

    def rerank(self, query: str, documents: list[str], **body: Any) -> Result:
        """`/rerank`: results best first; `.similarity` in document order."""
        result = self._backend.pooling("rerank", {"query": query, "documents": documents,
                                                  **body})
        if result.ok:
            result.similarity = SimilarityMatrix.from_rerank_response(result.response, query,
                                                                      list(documents))
        return result

    def classify(self, input: Any = None, **body: Any) -> Result:
        """`/classify`: label probabilities (label tokens on a generative model)."""
        return self._backend.pooling("classify", {"input": input, **body})

    def pool(self, input: Any = None, task: str | None = None, **body: Any) -> Result:
        """`/pooling`: the pooler's raw output for `task` (the model's default when None)."""
        return self._backend.pooling("pooling", {"input": input, "task": task, **body})

    # -- scoring given text (`workbench/inspect/scoring.py`): `.scores`, a table per text ----
    def score_text(self, prompts: str | list[str], texts: str | list[str], logprobs: int = 0,
                   **body: Any) -> Result:
        """Each text's tokens scored after its prompt (one prompt for all, or one per text) in
        one `/v1/completions` request of prompt logprobs: `.scores`, a `LogprobTable` per
        text (logprob, rank, entropy; `logprobs` alternatives each). The tokens come from the
        server's `/tokenize`, so this works against any server with both (vLLM too; the
        entropy there is over the returned top-k). `body`: more completions fields."""
        try:
            spans = text_spans(prompts, texts, self._text_tokens)
        except ValidationError as exc:
            return _refusal(exc)
        except _Refused as refused:
            return refused.result
        return self._score(ScorePlan(spans, logprobs), body)

    def score_chat(self, conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
                   logprobs: int = 0, chat_template_kwargs: dict[str, Any] | None = None,
                   **body: Any) -> Result:
        """The last message (the assistant's) of one conversation or each of a list scored
        given the messages before it, through the server's chat template (`/tokenize` of
        both renderings): only the turn's tokens, in `.scores` as `score_text`'s."""
        try:
            spans = turn_spans(conversations, self._turn_tokens(chat_template_kwargs))
        except ValidationError as exc:
            return _refusal(exc)
        except _Refused as refused:
            return refused.result
        return self._score(ScorePlan(spans, logprobs), body)

    def _tokens(self, body: dict[str, Any]) -> list[int]:
        """The server's `/tokenize` of a prompt or messages; a failure raises `_Refused`."""
        result = self._backend.call("tokenize", with_model(body, self.model))
        if not result.ok:
            raise _Refused(result)
        return list(result.response["tokens"])

    def _text_tokens(self, text: str, special: bool) -> list[int]:
        return self._tokens({"prompt": text} if special else
                            {"prompt": text, "add_special_tokens": False})

    def _turn_tokens(self, chat_template_kwargs: dict[str, Any] | None) -> Any:
        """The server's tokens of messages through its chat template, as `turn_spans` asks."""
        render = {"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else {}
        return lambda messages, generation_prompt: self._tokens(
            {"messages": messages, "add_generation_prompt": generation_prompt, **render})

    def _score(self, plan: ScorePlan, body: dict[str, Any]) -> Result:
        result = self._backend.generate("completions",
                                        {**plan.body(token_stats=self._backend.ours), **body})
        if result.ok:
            result.scores = plan.assemble([result.response] * len(plan.spans))
        return result

    # -- variants of the model on the same tokens (`workbench/serving/compare.py`) -----------
    def compare(self, prompt: str, text: str, variants: list[Any], reference: int = 0
                ) -> Result:
        """`text` after `prompt` teacher-forced through each variant, compared per token with
        the `reference` one: `.comparison`, a `ModelComparison`. A variant is None (the base
        model), a served model or adapter name, a `LoRARequest` (in the kernel: served under
        its name first), or a dict of `model`, `interventions`, `name`. Locally and on a
        workbench server one `/v1/compare` request (a workbench extension): one batch, exact
        KL from the full distributions. Against another server (vLLM) one completions request
        of prompt logprobs per variant: logprobs, their differences, ranks and argmax tokens
        are exact; KL is marked unavailable with the reason (never approximated), and
        interventions are refused."""
        return self._compare({"prompt": prompt, "text": text}, variants, reference)

    def compare_chat(self, messages: list[dict[str, Any]], variants: list[Any],
                     reference: int = 0, chat_template_kwargs: dict[str, Any] | None = None
                     ) -> Result:
        """`compare` on a conversation's last message (the assistant's) after the messages
        before it, through the server's chat template: only the turn's tokens."""
        render = {"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else {}
        return self._compare({"messages": messages, **render}, variants, reference)

    def _compare(self, what: dict[str, Any], variants: list[Any], reference: int) -> Result:
        try:
            given = [workbench_variant(v, i, lambda lora: served_name(self, lora))
                     for i, v in enumerate(variants)]
        except ValidationError as exc:
            return _refusal(exc)
        body = {**what, "variants": given, "reference": reference}
        if self._backend.ours:
            return self._backend.compare(body)
        return self._compare_with_prompt_logprobs(body)

    def _compare_with_prompt_logprobs(self, body: dict[str, Any]) -> Result:
        """The comparison against a server that is not ours (see `compare`)."""
        try:
            variants = variants_of_body(body, self.model, str(self.url))
            if "messages" in body:
                render = body.get("chat_template_kwargs")
                (span,) = turn_spans(body["messages"], self._turn_tokens(render))
            else:
                (span,) = text_spans(body["prompt"], body["text"], self._text_tokens)
        except ValidationError as exc:
            return _refusal(exc)
        except _Refused as refused:
            return refused.result
        plan = ComparePlan(variants, span, body["reference"], self.model)
        responses = []
        for request in plan.bodies():
            result = self._backend.generate("completions", request)
            if not result.ok:
                return result
            responses.append(result.response)
        reason = (f"{self.url} is not a workbench server: its prompt logprobs are the top-k of "
                  "each position, not the whole distribution KL needs")
        return compared(Result(plan.assemble_tables(responses, reason)))

    def validate(self, body: dict[str, Any] | None = None, **fields: Any) -> ValidationReport:
        """Dry run of a completions or chat body (chat when it has `messages`)."""
        return self._backend.validate({**(body or {}), **fields})

    def compare_lora(self, prompt: Any = None, adapter: Any = None, **kwargs: Any) -> Any:
        """The same greedy request on the base model and on a LoRA adapter, side by side:
        a `LoRAComparison` with both results and a `LogprobDiff` (`workbench.inspect.lora_compare`);
        `messages=[...]` for chat, `max_tokens`, `top_logprobs`, other body fields."""
        return compare_lora(self, prompt, adapter, **kwargs)

    def beam_search(self, prompt: str | list[int], beam_width: int = 4, max_tokens: int = 16,
                    length_penalty: float = 1.0, ignore_eos: bool = False,
                    tokenizer: Any = None) -> BeamSearchOutput:
        """Beam search with its `BeamTree` (`.tree`): in the engine locally; against a remote
        server, the same algorithm client-side over `/v1/completions` (needs the served model's
        tokenizer: pass it, or the model must be one of our aliases or a local directory)."""
        plan = BeamPlan.of([prompt], beam_width, max_tokens, length_penalty, ignore_eos)
        return plan.assemble([self._backend.beam_search(prompt, plan.params, tokenizer)])[0]

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> "Workbench":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.url or "in-kernel engine"
        return f"Workbench({where}, model={self.model!r})"


class _Refused(Exception):
    """A scoring's step failed before its request: `result` says why (the error envelope)."""

    def __init__(self, result: Result):
        super().__init__(result.error)
        self.result = result


def _refusal(exc: ValidationError) -> Result:
    """A refusal before any request: its 400 envelope as the `Result`."""
    error = error_response(exc).model_dump()
    return Result(None, error["error"]["code"], error)


__all__ = ["Result", "Workbench", "endpoint_of", "kernel_words"]
