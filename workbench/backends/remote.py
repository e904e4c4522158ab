"""`_Remote`: the `Backend` of any OpenAI-compatible server (ours, vLLM) over httpx. The
trace is the client's round trip; `validate` needs our `/v1/validate`, and so do `capture`,
`logit_lens`, `interventions`, `features` and `token_stats`: another server would ignore them,
so they are refused client-side (`Result.error`, in the report)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from workbench.backends.base import Backend, compared, with_model
from workbench.backends.result import Result
from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.inspect.remote_beam import remote_beam_search
from workbench.inspect.tool_loop import ToolLoopTrace
from workbench.inspect.trace import Span, Trace
from workbench.inspect.validation_report import ValidationReport
from workbench.models import resolve_model
from workbench.sampling_params import BeamSearchParams
from workbench.serving.recorder import Check
from workbench.serving.unsupported import WORKBENCH_FIELDS

__all__ = ["_Remote", "local_tokenizer"]


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
                                               json=with_model(body, self.model)))
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
                                               json=with_model(body, self.model)))
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
        body = with_model({**body, "stream": True}, self.model)
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
            tokenizer = local_tokenizer(self.model)
        with httpx.Client(base_url=self.root, headers=self.client.headers,
                          timeout=self.client.timeout) as client:
            return remote_beam_search(client, self.model, prompt, params, tokenizer)

    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = local_tokenizer(self.model)
        return self._tokenizer

    def pooling(self, endpoint: str, body: dict[str, Any]) -> Result:
        """`/v1/embeddings` under the base URL; `/pooling`, `/classify`, `/score`, `/rerank` at
        the server root (where vLLM serves them too)."""
        url = self.base + "/embeddings" if endpoint == "embeddings" else f"{self.root}/{endpoint}"
        start = time.time()
        result = self._result(self.client.post(url, json=with_model(body, self.model)))
        result.trace = Trace((Span("http round trip", "client", 0.0, time.time() - start),))
        return result

    def compare(self, body: dict[str, Any]) -> Result:
        """Our server's `/v1/compare` (`Workbench.compare` asks others otherwise)."""
        start = time.time()
        result = self._result(self.client.post(self.base + "/compare",
                                               json=with_model(body, self.model)))
        result.trace = Trace((Span("http round trip", "client", 0.0, time.time() - start),))
        return compared(result)

    def validate(self, body: dict[str, Any]) -> ValidationReport:
        """Our server's `/v1/validate`; other servers have no dry run."""
        body = with_model(body, self.model)
        response = self.client.post(self.base + "/validate", json=body)
        if response.status_code == 404:
            raise NotImplementedError(f"{self.base} has no /validate route (not a workbench "
                                      "server): no dry run is possible remotely.")
        return ValidationReport.from_dict(response.json())

    def close(self) -> None:
        self.client.close()


def local_tokenizer(model: str) -> Any:
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


