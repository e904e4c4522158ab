"""`_Local`: the `Backend` in the kernel, the server's serving objects (`workbench.serving.
Servings`) on an `AsyncLLMEngine` over an `LLM`'s engine, driven from a private event-loop thread,
so calls work inside a running Jupyter loop; the report and trace come from the pipeline's
recorder. `kernel_words` adds a notebook's keyword arguments to an error naming server flags."""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import threading
from collections.abc import Iterator
from dataclasses import fields
from typing import Any

import pydantic
from pydantic import TypeAdapter

from workbench.backends.base import Backend, compared, with_model
from workbench.backends.result import Result
from workbench.engine.async_engine import AsyncLLMEngine
from workbench.engine.protocol import EngineClient
from workbench.engine.requests.beam_search import BeamSearchOutput
from workbench.inspect.tool_loop import ToolLoopTrace
from workbench.inspect.trace import Trace
from workbench.inspect.validation_report import ValidationReport, parse, validate
from workbench.sampling_params import BeamSearchParams
from workbench.serving import ServerConfig, Servings
from workbench.serving.base import RequestMeta
from workbench.serving.errors import error_response, validation_error_body
from workbench.serving.protocol import DetokenizeRequest, TokenizeRequest
from workbench.serving.protocol import pooling as proto
from workbench.serving.protocol.compare import CompareRequest
from workbench.serving.protocol.responses import ResponsesRequest
from workbench.serving.recorder import PipelineRecorder

__all__ = ["_Local", "kernel_words"]

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
        body = with_model(body, self.model)
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
        body = with_model({**body, "stream": True}, self.model)
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
                    TokenizeRequest).validate_python(with_model(body, self.model)))
            else:
                response = self.servings.tokenize.detokenize(TypeAdapter(
                    DetokenizeRequest).validate_python(with_model(body, self.model)))
        except Exception as exc:  # noqa: BLE001
            error = kernel_words(error_response(exc).model_dump())
            return Result(None, error["error"]["code"], error)
        return Result(response.model_dump(mode="json"))

    def respond(self, body: dict[str, Any]) -> Result:
        try:
            request = ResponsesRequest.model_validate(with_model(body, self.model))
            response, loop = self.run(self.servings.responses.run(request, RequestMeta()))
        except Exception as exc:  # noqa: BLE001 - the error envelope, as the server answers
            error = kernel_words(error_response(exc).model_dump())
            return Result(None, error["error"]["code"], error)
        return Result(response.model_dump(mode="json"), tool_loop=ToolLoopTrace.from_loop(loop))

    def stream_respond(self, body: dict[str, Any]) -> Iterator[dict[str, Any]]:
        try:
            request = ResponsesRequest.model_validate(
                with_model({**body, "stream": True}, self.model))
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
        return validate(self.servings, with_model(body, self.model))

    def pooling(self, endpoint: str, body: dict[str, Any]) -> Result:
        """A pooling endpoint through its serving object, errors as the server answers them."""
        model = {"embeddings": proto.EmbeddingRequest, "pooling": proto.PoolingRequest,
                 "classify": proto.ClassificationRequest, "score": proto.ScoreRequest,
                 "rerank": proto.RerankRequest}[endpoint]
        rec = PipelineRecorder()
        try:
            request = TypeAdapter(model).validate_python(with_model(body, self.model))
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
            request = CompareRequest.model_validate(with_model(body, self.model))
            serving = self.servings.compare
            assert serving is not None  # Servings.build makes one
            response = self.run(serving.create(request, RequestMeta()))
        except pydantic.ValidationError as exc:
            error = validation_error_body(list(exc.errors()))
            return Result(None, error["error"]["code"], error)
        except Exception as exc:  # noqa: BLE001 - the error envelope, as the server answers
            error = error_response(exc).model_dump()
            return Result(None, error["error"]["code"], error)
        return compared(Result(response))

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


def _failed(report: ValidationReport) -> Result:
    return Result(None, report.status_code, report.error, report)


