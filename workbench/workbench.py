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

Two back ends, same bodies in and out:
- `Workbench(llm)`: in the kernel, without HTTP. Requests go through the same serving objects
  as the server (`workbench.serving.Servings`) on an `AsyncLLMEngine` over the LLM's engine;
  the coroutines run on the Workbench's own event-loop thread, so calls work inside a running
  Jupyter loop. The report and trace come from the pipeline's recorder.
- `Workbench(url="http://host:port/v1", api_key=...)`: any OpenAI-compatible server (ours,
  vLLM) over httpx. The trace is the client's round trip; `validate` needs our `/v1/validate`,
  and so do `capture`, `logit_lens`, `interventions` (`.activations`, `.logit_lens`) and
  `token_stats`: another server would ignore them, so they are refused client-side
  (`Result.error`, in the report).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import fields
from typing import Any

import httpx
import pydantic
from pydantic import TypeAdapter

from workbench.backend import Backend
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.engine.protocol import EngineClient
from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.errors import ValidationError
from workbench.inspect import branch_tree as bt
from workbench.inspect.beam_tree import with_beam_tree
from workbench.inspect.branch_tree import BranchTree
from workbench.inspect.divergence import TIE, DivergenceReport
from workbench.inspect.lora_compare import compare_lora, served_name
from workbench.inspect.model_compare import ModelComparison, body_from_tables
from workbench.inspect.remote_beam import remote_beam_search
from workbench.inspect.replay import replay
from workbench.inspect.scoring import ScoredSpan, last_turn, score_body, scored_table
from workbench.inspect.similarity import SimilarityMatrix
from workbench.inspect.tool_loop import ToolLoopTrace
from workbench.inspect.trace import Span, Trace
from workbench.inspect.validation_report import ValidationReport, endpoint_of, parse, validate
from workbench.lora.request import LoRARequest
from workbench.models import resolve_model
from workbench.result import Result
from workbench.sampling_params import BeamSearchParams
from workbench.serving import ServerConfig, Servings
from workbench.serving.base import RequestMeta
from workbench.serving.compare import Variant, check_variants, variant_name
from workbench.serving.errors import error_response, validation_error_body
from workbench.serving.protocol import DetokenizeRequest, TokenizeRequest
from workbench.serving.protocol import pooling as proto
from workbench.serving.protocol.compare import CompareRequest
from workbench.serving.protocol.responses import ResponsesRequest
from workbench.serving.recorder import Check, PipelineRecorder
from workbench.serving.unsupported import WORKBENCH_FIELDS


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
        tree = bt.BranchTree.of(result, tok, index)
        original = tree.original
        bt.check_position(original, position)
        position = int(position)
        sent = dict(result.request or {})
        for name in _NOT_IN_A_BRANCH:
            value = body[name] if name in body else sent.get(name)
            if value is not None and value is not False and (name not in ("n", "best_of")
                                                            or value != 1):
                raise ValidationError(f"a branch is one plain completion: `{name}` "
                                      f"({value!r}) is not allowed.", parameter=name, value=value)
        ids = list(tree.prompt_token_ids) + original.token_ids[:position]
        forced = bt.forced_tokens(original, position, tokens, top, len(tok))
        text = bt.token_texts(tok)
        pairs = original.tokens[position].top
        if forced is None:  # no logprobs in the result: ask the server for the position's best
            probe = self._probe(ids, {"logprobs": top + 1})
            pairs = bt.path_of_choice(probe, text).tokens[0].top
            forced = bt.alternatives(pairs, original.token_ids[position], top, position)
        known = dict(pairs)
        unknown = [t for t in forced if t not in known]
        if unknown:
            probe = self._probe(ids, {"logprobs": 1, "logprob_token_ids": unknown})
            probed = dict(bt.path_of_choice(probe, text).tokens[0].top)
            known.update({t: probed.get(t) for t in unknown})
        fields = {k: v for k, v in {**sent, **body}.items()
                  if k != "prompt" and k not in _NOT_IN_A_BRANCH}
        if fields.get("logprobs") is None:
            fields["logprobs"] = 0  # every branch carries its tokens' logprobs
        answer = self._backend.generate("completions", {
            **fields, "prompt": [ids + [t] for t in forced], "return_token_ids": True,
            "return_tokens_as_token_ids": True})
        if not answer.ok:
            raise RuntimeError(f"the branches' request failed: {answer.error}")
        choices = sorted(answer.response["choices"], key=lambda c: c["index"])
        branches = []
        for t, choice in zip(forced, choices):
            token = bt.PathToken(t, text(t), known[t], pairs)
            continuation = bt.path_of_choice(choice, text)
            whole = tok.decode(original.token_ids[:position] + [t],
                               skip_special_tokens=fields.get("skip_special_tokens", True)
                               ) + continuation.text
            branches.append(bt.Branch(position, bt.forced_path(original, position, token,
                                                               continuation, whole),
                                      None, choice))
        return tree.with_branches(branches)

    def _probe(self, ids: list[int], fields: dict[str, Any]) -> dict[str, Any]:
        """One greedy token after `ids` with `fields` (logprobs): its choice."""
        answer = self._backend.generate("completions", {
            "prompt": ids, "max_tokens": 1, "temperature": 0.0, "return_token_ids": True,
            "return_tokens_as_token_ids": True, **fields})
        if not answer.ok:
            raise RuntimeError(f"the request for the position's logprobs failed: {answer.error}")
        return answer.response["choices"][0]

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
        (`workbench.inspect.replay`). A failed run raises `RuntimeError` with its envelope."""
        if result is not None:
            if result.request is None:
                raise ValidationError("replay takes a Result of Workbench.completions or "
                                      "Workbench.chat (it keeps the body it sent).",
                                      parameter="result")
            body = {**result.request, **body}
        return replay(self._backend, body, others, tie, self.url or "in-kernel engine")

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
        texts = [texts] if isinstance(texts, str) else list(texts)
        contexts = [prompts] * len(texts) if isinstance(prompts, str) else list(prompts)
        if len(contexts) != len(texts):
            raise ValueError(f"Got {len(contexts)} prompts for {len(texts)} texts.")
        try:
            spans = [_refusing(ScoredSpan.of_text, self._tokens({"prompt": c}),
                               self._tokens({"prompt": t, "add_special_tokens": False}))
                     for c, t in zip(contexts, texts)]
        except _Refused as refused:
            return refused.result
        return self._score(spans, logprobs, body)

    def score_chat(self, conversations: list[dict[str, Any]] | list[list[dict[str, Any]]],
                   logprobs: int = 0, chat_template_kwargs: dict[str, Any] | None = None,
                   **body: Any) -> Result:
        """The last message (the assistant's) of one conversation or each of a list scored
        given the messages before it, through the server's chat template (`/tokenize` of
        both renderings): only the turn's tokens, in `.scores` as `score_text`'s."""
        convs = conversations if conversations and isinstance(conversations[0], list) \
            else [conversations]
        render = {"chat_template_kwargs": chat_template_kwargs} if chat_template_kwargs else {}
        try:
            spans = []
            for conv in convs:
                before, whole = _refusing(last_turn, conv)
                spans.append(_refusing(
                    ScoredSpan.of_turn,
                    self._tokens({"messages": before, "add_generation_prompt": True, **render}),
                    self._tokens({"messages": whole, "add_generation_prompt": False, **render})))
        except _Refused as refused:
            return refused.result
        return self._score(spans, logprobs, body)

    def _tokens(self, body: dict[str, Any]) -> list[int]:
        """The server's `/tokenize` of a prompt or messages; a failure raises `_Refused`."""
        result = self._backend.call("tokenize", _with_model(body, self.model))
        if not result.ok:
            raise _Refused(result)
        return list(result.response["tokens"])

    def _score(self, spans: list[ScoredSpan], logprobs: int, body: dict[str, Any]) -> Result:
        request = {**score_body(spans, logprobs, token_stats=self._backend.ours), **body}
        result = self._backend.generate("completions", request)
        if result.ok:
            result.scores = [scored_table(result.response, span, i)
                             for i, span in enumerate(spans)]
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
            given = [self._variant_body(v, i) for i, v in enumerate(variants)]
        except ValidationError as exc:
            error = error_response(exc).model_dump()
            return Result(None, error["error"]["code"], error)
        body = {**what, "variants": given, "reference": reference}
        if self._backend.ours:
            return self._backend.compare(body)
        return self._compare_with_prompt_logprobs(body)

    def _variant_body(self, variant: Any, index: int) -> dict[str, Any]:
        if variant is None:
            return {}
        if isinstance(variant, str):
            return {"model": variant}
        if isinstance(variant, LoRARequest):
            return {"model": served_name(self, variant)}
        if isinstance(variant, dict):
            out = dict(variant)
            lora = out.pop("lora_request", None)
            if lora is not None:
                out["model"] = served_name(self, lora)
            return out
        raise ValidationError(f"variants[{index}]: None, a model name, a LoRARequest or a dict "
                              f"of model, interventions, name; got {type(variant).__name__}.",
                              parameter=f"variants[{index}]")

    def _compare_with_prompt_logprobs(self, body: dict[str, Any]) -> Result:
        """The comparison against a server that is not ours (see `compare`)."""
        try:
            for i, v in enumerate(body["variants"]):
                if v.get("interventions"):
                    raise ValidationError(
                        f"variants[{i}].interventions need a workbench server: {self.url} is "
                        "not one, and an OpenAI-compatible server such as vLLM ignores them; "
                        "nothing was sent.", parameter=f"variants[{i}].interventions")
            variants = [Variant(variant_name(v.get("name"), v.get("model") or self.model, None),
                                v.get("model") or self.model) for v in body["variants"]]
            check_variants(variants, body["reference"])
            span = self._span(body)
        except ValidationError as exc:
            error = error_response(exc).model_dump()
            return Result(None, error["error"]["code"], error)
        except _Refused as refused:
            return refused.result
        tables = []
        for v in variants:
            result = self._backend.generate("completions", {
                **score_body([span], 1, token_stats=False), "model": v.model})
            if not result.ok:
                return result
            tables.append(scored_table(result.response, span))
        reason = (f"{self.url} is not a workbench server: its prompt logprobs are the top-k of "
                  "each position, not the whole distribution KL needs")
        return _compared(Result(body_from_tables(
            tables, [v.name for v in variants], [v.model for v in variants], span.token_ids,
            span.start, body["reference"], self.model, reason)))

    def _span(self, body: dict[str, Any]) -> ScoredSpan:
        """The compared tokens of a comparison body, through the server's `/tokenize`."""
        if "messages" not in body:
            return _refusing(ScoredSpan.of_text, self._tokens({"prompt": body["prompt"]}),
                             self._tokens({"prompt": body["text"], "add_special_tokens": False}))
        render = {k: body[k] for k in ("chat_template_kwargs",) if k in body}
        before, whole = _refusing(last_turn, body["messages"])
        return _refusing(
            ScoredSpan.of_turn,
            self._tokens({"messages": before, "add_generation_prompt": True, **render}),
            self._tokens({"messages": whole, "add_generation_prompt": False, **render}))

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
        params = BeamSearchParams(beam_width=beam_width, max_tokens=max_tokens,
                                  length_penalty=length_penalty, ignore_eos=ignore_eos)
        return with_beam_tree(self._backend.beam_search(prompt, params, tokenizer))

    def close(self) -> None:
        self._backend.close()

    def __enter__(self) -> "Workbench":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        where = self.url or "in-kernel engine"
        return f"Workbench({where}, model={self.model!r})"


# fields refused in a branch: one plain completion (a grammar would start afresh after the token)
_NOT_IN_A_BRANCH = ("stream", "echo", "n", "best_of", "use_beam_search", "response_format",
                    "structured_outputs")
_FLAG = re.compile(r"--([a-z][a-z0-9-]+)")


def kernel_words(error: dict[str, Any]) -> dict[str, Any]:
    """An error envelope whose message names server flags (`--tool-call-parser`), with the
    keyword arguments a notebook passes for them added (`ServerConfig` / `serve_in_kernel`)."""
    message = error.get("error", {}).get("message") or ""
    known = {f.name for f in fields(ServerConfig)}
    names = list(dict.fromkeys(m.replace("-", "_") for m in _FLAG.findall(message)))
    names = [n for n in names if n in known]
    if not names:
        return error
    keywords = ", ".join(f"{n}=..." for n in names)
    hint = (f" (in a notebook: ServerConfig({keywords}) for Workbench, or "
            f"serve_in_kernel(llm, {keywords}))")
    return {**error, "error": {**error["error"], "message": message + hint}}


class _Refused(Exception):
    """A scoring's step failed before its request: `result` says why (the error envelope)."""

    def __init__(self, result: Result):
        super().__init__(result.error)
        self.result = result


def _refusing(fn: Any, *args: Any) -> Any:
    """`fn(*args)`, a `ValidationError` turned into `_Refused` with its 400 envelope."""
    try:
        return fn(*args)
    except ValidationError as exc:
        error = error_response(exc).model_dump()
        raise _Refused(Result(None, error["error"]["code"], error)) from exc


class _Local(Backend):
    """The `Backend` of the serving objects on an async engine, driven from a private
    event-loop thread."""

    ours = True  # our serving objects: every workbench extra applies

    def __init__(self, llm: Any, config: Any, tool_server: Any = None):
        self._owns_engine = not isinstance(llm, EngineClient)  # an `LLM`: served by a front
        self.engine: EngineClient = AsyncLLMEngine.from_llm(llm) if self._owns_engine else llm
        self.servings = Servings.build(self.engine, config or ServerConfig(),
                                       tool_server=tool_server)
        self.model = self.servings.completions.model_name
        self._beam_ids = itertools.count()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="workbench-facade-loop")
        self._thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def _parse(self, endpoint: str, body: dict[str, Any]):
        """Body -> ((request, serving, meta), None), or (None, the schema failure's report)."""
        request, rec, endpoint = parse(body, endpoint)
        if request is None:
            return None, ValidationReport.from_recorder(rec, endpoint)
        serving = self.servings.chat if endpoint == "chat" else self.servings.completions
        return (request, serving, RequestMeta(recorder=rec)), None

    def generate(self, endpoint: str, body: dict[str, Any]) -> Result:
        return self.run(self._generate(endpoint, body))

    def generate_many(self, endpoint: str, bodies: list[dict[str, Any]]) -> list[Result]:
        """All of `bodies` at once: their coroutines gathered on the loop, so the engine
        schedules them side by side, in the same steps."""
        async def gather() -> list[Result]:
            return list(await asyncio.gather(*(self._generate(endpoint, b) for b in bodies)))

        return self.run(gather())

    async def _generate(self, endpoint: str, body: dict[str, Any]) -> Result:
        body = _with_model(body, self.model)
        parsed, report = self._parse(endpoint, body)
        if parsed is None:
            return _failed(report)
        request, serving, meta = parsed
        try:
            response = (await serving.create(request, meta)).model_dump(mode="json")
        except Exception as exc:  # noqa: BLE001 - the error envelope, as the server answers
            error = kernel_words((meta.recorder.error or error_response(exc)).model_dump())
            meta.recorder.error = meta.recorder.error or error_response(exc)
            return Result(None, error["error"]["code"], error,
                          ValidationReport.from_recorder(meta.recorder, endpoint))
        return Result(response, 200, None,
                      ValidationReport.from_recorder(meta.recorder, endpoint),
                      Trace.from_recorder(meta.recorder))

    def stream(self, endpoint: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        body = _with_model({**body, "stream": True}, self.model)
        parsed, report = self._parse(endpoint, body)
        if parsed is None:
            yield report.error
            return
        request, serving, meta = parsed
        try:
            chunks = self.run(serving.create_stream(request, meta))
        except Exception as exc:  # noqa: BLE001
            yield kernel_words((meta.recorder.error or error_response(exc)).model_dump())
            return
        try:
            while True:
                try:
                    chunk = self.run(anext(chunks))
                except StopAsyncIteration:
                    return
                yield json.loads(chunk)
        finally:
            self.run(chunks.aclose())

    def call(self, endpoint: str, body: dict[str, Any] | None) -> Result:
        try:
            if endpoint == "models":
                response = self.servings.models.list_models()
            elif endpoint == "tokenize":
                response = self.servings.tokenize.tokenize(TypeAdapter(
                    TokenizeRequest).validate_python(_with_model(body, self.model)))
            else:
                response = self.servings.tokenize.detokenize(TypeAdapter(
                    DetokenizeRequest).validate_python(_with_model(body, self.model)))
        except Exception as exc:  # noqa: BLE001
            error = kernel_words(error_response(exc).model_dump())
            return Result(None, error["error"]["code"], error)
        return Result(response.model_dump(mode="json"))

    def respond(self, body: dict[str, Any]) -> Result:
        try:
            request = ResponsesRequest.model_validate(_with_model(body, self.model))
            response, loop = self.run(self.servings.responses.run(request, RequestMeta()))
        except Exception as exc:  # noqa: BLE001 - the error envelope, as the server answers
            error = kernel_words(error_response(exc).model_dump())
            return Result(None, error["error"]["code"], error)
        return Result(response.model_dump(mode="json"), tool_loop=ToolLoopTrace.from_loop(loop))

    def stream_respond(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        try:
            request = ResponsesRequest.model_validate(
                _with_model({**body, "stream": True}, self.model))
            events = self.run(self.servings.responses.create_stream(request, RequestMeta()))
        except Exception as exc:  # noqa: BLE001
            yield kernel_words(error_response(exc).model_dump())
            return
        try:
            while True:
                try:
                    yield self.run(anext(events))
                except StopAsyncIteration:
                    return
        finally:
            self.run(events.aclose())

    def validate(self, body: dict[str, Any]) -> ValidationReport:
        return validate(self.servings, _with_model(body, self.model))

    def pooling(self, endpoint: str, body: dict[str, Any]) -> Result:
        """A pooling endpoint through its serving object, errors as the server answers them."""
        model = {"embeddings": proto.EmbeddingRequest, "pooling": proto.PoolingRequest,
                 "classify": proto.ClassificationRequest, "score": proto.ScoreRequest,
                 "rerank": proto.RerankRequest}[endpoint]
        rec = PipelineRecorder()
        try:
            request = TypeAdapter(model).validate_python(_with_model(body, self.model))
            serving = getattr(self.servings, endpoint)
            response = self.run(serving.create(request, RequestMeta(recorder=rec)))
        except pydantic.ValidationError as exc:
            error = validation_error_body(list(exc.errors()))
            return Result(None, error["error"]["code"], error)
        except Exception as exc:  # noqa: BLE001 - the error envelope, as the server answers
            rec.error = rec.error or error_response(exc)
            error = rec.error.model_dump()
            return Result(None, error["error"]["code"], error,
                          ValidationReport.from_recorder(rec, endpoint))
        return Result(response.model_dump(mode="json"), 200, None,
                      ValidationReport.from_recorder(rec, endpoint), Trace.from_recorder(rec))

    def compare(self, body: dict[str, Any]) -> Result:
        """`/v1/compare` through its serving object, errors as the server answers them."""
        try:
            request = CompareRequest.model_validate(_with_model(body, self.model))
            serving = self.servings.compare
            assert serving is not None  # Servings.build makes one
            response = self.run(serving.create(request, RequestMeta()))
        except pydantic.ValidationError as exc:
            error = validation_error_body(list(exc.errors()))
            return Result(None, error["error"]["code"], error)
        except Exception as exc:  # noqa: BLE001 - the error envelope, as the server answers
            error = error_response(exc).model_dump()
            return Result(None, error["error"]["code"], error)
        return _compared(Result(response))

    def beam_search(self, prompt: Any, params: BeamSearchParams, tokenizer: Any) -> BeamSearchOutput:
        async def search() -> BeamSearchOutput:
            request_id = f"wb-beam-{next(self._beam_ids)}"
            outs = [o async for o in self.engine.beam_search(prompt, request_id, params)]
            return outs[-1]

        return self.run(search())

    def tokenizer(self) -> Any:
        return self.engine.tokenizer

    def close(self) -> None:
        if self._owns_engine:
            self.engine.shutdown()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5)


class _Remote(Backend):
    """The `Backend` of any OpenAI-compatible server over httpx; `url` ends in `/v1`."""

    _PATHS = {"completions": "/completions", "chat": "/chat/completions", "models": "/models",
              "responses": "/responses"}

    def __init__(self, url: str, api_key: str | None, timeout: float):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base = url
        self.root = url[:-3] if url.endswith("/v1") else url  # /tokenize lives at the root
        self.client = httpx.Client(headers=headers, timeout=timeout)
        self._model: str | None = None
        self._ours: bool | None = None  # a workbench server (`ours`), once asked
        self._tokenizer: Any = None

    @property
    def model(self) -> str:
        if self._model is None:
            self._model = self.call("models", None).response["data"][0]["id"]
        return self._model

    def _url(self, endpoint: str) -> str:
        if endpoint in self._PATHS:
            return self.base + self._PATHS[endpoint]
        return f"{self.root}/{endpoint}"

    def _result(self, response: Any) -> Result:
        body = response.json()
        if response.status_code >= 400:
            return Result(None, response.status_code, body)
        return Result(body, response.status_code)

    @property
    def ours(self) -> bool:
        """Whether the server is a workbench server: it answers `/v1/validate` (asked once)."""
        if self._ours is None:
            try:
                response = self.client.post(self.base + "/validate",
                                            json={"model": self.model, "prompt": ""})
                self._ours = response.status_code == 200 and "checks" in response.json()
            except (httpx.HTTPError, ValueError):
                self._ours = False
        return self._ours

    def _refuse_inside(self, endpoint: str, body: dict[str, Any]) -> Result | None:
        """`capture`, `logit_lens`, `interventions`, `token_stats` against a server that is not
        ours: a vLLM drops unknown fields, so they would be silently ignored; refused here
        instead."""
        asked = [name for name in WORKBENCH_FIELDS if body.get(name) not in (None, [], False)]
        if not asked or self.ours:
            return None
        name = asked[0]
        message = (f"`{name}` needs a workbench server (`workbench serve`): {self.base} is not "
                   "one (it has no /v1/validate), and an OpenAI-compatible server such as vLLM "
                   f"ignores `{name}`; nothing was sent.")
        error = {"error": {"message": message, "type": "BadRequestError", "param": name,
                           "code": 400}}
        checks = tuple(Check(n, "client", "failed", n, message if n == name else
                             f"`{n}` needs a workbench server", body[n]) for n in asked)
        return Result(None, 400, error, ValidationReport(endpoint, checks, error))

    def generate(self, endpoint: str, body: dict[str, Any]) -> Result:
        refused = self._refuse_inside(endpoint, body)
        if refused is not None:
            return refused
        start = time.time()
        result = self._result(self.client.post(self._url(endpoint),
                                               json=_with_model(body, self.model)))
        result.trace = Trace((Span("http round trip", "client", 0.0, time.time() - start),))
        return result

    def generate_many(self, endpoint: str, bodies: list[dict[str, Any]]) -> list[Result]:
        """All of `bodies` at once, one thread each on the shared client (its connection
        pool), so the server has them in flight together."""
        _ = self.model, self.ours  # asked once, before the threads
        with ThreadPoolExecutor(max_workers=max(len(bodies), 1),
                                thread_name_prefix="workbench-remote") as pool:
            return list(pool.map(lambda body: self.generate(endpoint, body), bodies))

    def respond(self, body: dict[str, Any]) -> Result:
        result = self._result(self.client.post(self.base + "/responses",
                                               json=_with_model(body, self.model)))
        if result.ok:
            result.tool_loop = ToolLoopTrace.from_response(result.response)
        return result

    def stream_respond(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        return self.stream("responses", body)  # `data:` lines; the `event:` lines repeat types

    def stream(self, endpoint: str, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        refused = self._refuse_inside(endpoint, body)
        if refused is not None:
            yield refused.error
            return
        body = _with_model({**body, "stream": True}, self.model)
        with self.client.stream("POST", self._url(endpoint), json=body) as response:
            if response.status_code >= 400:
                response.read()
                yield response.json()
                return
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    yield json.loads(line[len("data: "):])

    def call(self, endpoint: str, body: dict[str, Any] | None) -> Result:
        if body is None:
            return self._result(self.client.get(self._url(endpoint)))
        return self._result(self.client.post(self._url(endpoint), json=body))

    def beam_search(self, prompt: Any, params: BeamSearchParams, tokenizer: Any) -> BeamSearchOutput:
        if tokenizer is None:
            tokenizer = _local_tokenizer(self.model)
        with httpx.Client(base_url=self.root, headers=self.client.headers,
                          timeout=self.client.timeout) as client:
            return remote_beam_search(client, self.model, prompt, params, tokenizer)

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = _local_tokenizer(self.model)
        return self._tokenizer

    def pooling(self, endpoint: str, body: dict[str, Any]) -> Result:
        """`/v1/embeddings` under the base URL; `/pooling`, `/classify`, `/score`, `/rerank` at
        the server root (where vLLM serves them too)."""
        url = self.base + "/embeddings" if endpoint == "embeddings" else f"{self.root}/{endpoint}"
        start = time.time()
        result = self._result(self.client.post(url, json=_with_model(body, self.model)))
        result.trace = Trace((Span("http round trip", "client", 0.0, time.time() - start),))
        return result

    def compare(self, body: dict[str, Any]) -> Result:
        """Our server's `/v1/compare` (`Workbench.compare` asks others otherwise)."""
        start = time.time()
        result = self._result(self.client.post(self.base + "/compare",
                                               json=_with_model(body, self.model)))
        result.trace = Trace((Span("http round trip", "client", 0.0, time.time() - start),))
        return _compared(result)

    def validate(self, body: dict[str, Any]) -> ValidationReport:
        """Our server's `/v1/validate`; other servers have no dry run."""
        body = _with_model(body, self.model)
        response = self.client.post(self.base + "/validate", json=body)
        if response.status_code == 404:
            raise NotImplementedError(f"{self.base} has no /validate route (not a workbench "
                                      "server): no dry run is possible remotely.")
        return ValidationReport.from_dict(response.json())

    def close(self) -> None:
        self.client.close()


def _local_tokenizer(model: str) -> Any:
    """The tokenizer of a served model we also have here (an alias or a local directory)."""
    from transformers import AutoTokenizer  # deferred: transformers is heavy

    try:
        path = resolve_model(model, prepare=False).path
        return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - say what to do instead
        raise ValueError(
            f"Beam search and branches against a remote server need the tokenizer of {model!r}; "
            "it is not available locally, so pass `tokenizer=` (e.g. "
            "AutoTokenizer.from_pretrained(...))."
        ) from exc


def _with_model(body: dict[str, Any], model: str) -> dict[str, Any]:
    body = {k: v for k, v in body.items() if v is not None or k == "max_tokens"}
    body.setdefault("model", model)
    return body


def _compared(result: Result) -> Result:
    """A `/v1/compare` answer with its `ModelComparison`."""
    if result.ok and result.response is not None:
        result.comparison = ModelComparison.from_body(result.response)
    return result


def _failed(report: ValidationReport) -> Result:
    return Result(None, report.status_code, report.error, report)


__all__ = ["Result", "Workbench", "endpoint_of"]
