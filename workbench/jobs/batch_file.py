"""`workbench run-batch`: a file of OpenAI Batch requests through the server's own routes.

The format is OpenAI's Batch API (and `vllm run-batch`'s): each input line a JSON object
`{"custom_id", "method": "POST", "url": "/v1/chat/completions", "body": {...}}`, each output
line `{"id", "custom_id", "response": {"status_code", "request_id", "body"}, "error"}`, in the
input's order. Every line goes through the same FastAPI app `workbench serve` runs
(`workbench.http.app.build_app`), driven in-process through httpx's ASGI transport, so any
route the app registers for the model is there (completions, chat, embeddings, /score,
/rerank, /classify, /pooling, /v1/responses, ...) with our fields in bodies (`capture`,
`logit_lens`, `token_stats`, `interventions`), and a refused body gets the server's own 4xx
body: `response.status_code` 4xx, `response.body` the error envelope, `error` its `error`
object. A line that never reaches a route (not JSON, no `custom_id`, a method other than POST,
a url the app does not serve, `stream: true`) gets an error line with `response: null` and
`error` {message, type, param, code: 400}. A bad line never stops the file.

Locally the lines run concurrently on one engine (continuous batching, `concurrency` in
flight); with Ray (`run_batch_file(..., ray=True)`) the same lines go to `replicas` engine
replicas through Ray Data's actor pool (`ray_pool.run_pool`), each building the same app, and
the results are written in the same order. What differs between two runs of the same file is
only what is random by design: the line's `id`, `response.request_id`, and in bodies the
server's `id` and `created` (and sampled text when a body samples without a seed and without
`batch_invariant`).
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

BAD = "BadRequestError"


def error_object(message: str, param: str | None = None, code: int = 400) -> dict[str, Any]:
    return {"message": message, "type": BAD, "param": param, "code": code}


def output_line(custom_id: Any, response: dict[str, Any] | None,
                error: dict[str, Any] | None) -> str:
    return json.dumps({"id": f"batch_req_{uuid.uuid4().hex}", "custom_id": custom_id,
                       "response": response, "error": error}, ensure_ascii=False)


@dataclass
class BatchLine:
    """One parsed input line (or why it cannot run: `error`)."""

    index: int
    custom_id: Any = None
    url: str = ""
    body: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


def parse_line(index: int, text: str, routes: Iterable[str]) -> BatchLine:
    """An input line checked as the Batch format wants it (the body itself is the route's to
    check)."""
    where = f"line {index + 1}"
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        return BatchLine(index, error=error_object(f"{where}: not valid JSON: {exc}"))
    if not isinstance(obj, dict):
        return BatchLine(index, error=error_object(f"{where}: a line is a JSON object with "
                                                   "custom_id, method, url and body"))
    cid = obj.get("custom_id")
    line = BatchLine(index, custom_id=cid)
    routes = set(routes)
    missing = [k for k in ("custom_id", "method", "url", "body") if k not in obj]
    if missing:
        line.error = error_object(f"{where}: missing field(s) {missing}", missing[0])
    elif not isinstance(cid, str):
        line.error = error_object(f"{where}: custom_id must be a string", "custom_id")
    elif str(obj["method"]).upper() != "POST":
        line.error = error_object(f"{where}: method must be POST, got {obj['method']!r}",
                                  "method")
    elif obj["url"] not in routes:
        line.error = error_object(
            f"{where}: url {obj['url']!r} is not a route of this model's server; it serves "
            f"{', '.join(sorted(routes))}", "url")
    elif not isinstance(obj["body"], dict):
        line.error = error_object(f"{where}: body must be a JSON object", "body")
    elif obj["body"].get("stream"):
        line.error = error_object(f"{where}: run-batch does not stream; leave stream unset",
                                  "body.stream")
    else:
        line.url, line.body = obj["url"], obj["body"]
    return line


class BatchRunner:
    """The server's app over one engine, driven in-process: `run_lines` answers input lines
    with output lines."""

    def __init__(self, engine: Any, server_config: Any = None, concurrency: int = 64):
        from workbench.http.app import build_app  # deferred: the app imports torch

        self.engine = engine
        self.app = build_app(engine, server_config)
        self.concurrency = concurrency
        paths = self.app.openapi()["paths"]
        self.routes = sorted(p for p, ops in paths.items() if "post" in ops and "{" not in p)

    @classmethod
    def from_config(cls, engine_config: Any, server_config: Any = None, **kw: Any
                    ) -> BatchRunner:
        from workbench.engine.async_engine import AsyncLLMEngine  # deferred: torch

        return cls(AsyncLLMEngine.from_config(engine_config), server_config, **kw)

    @classmethod
    def from_llm(cls, llm: Any, server_config: Any = None, **kw: Any) -> BatchRunner:
        """The same engine as a notebook's `LLM`."""
        from workbench.engine.async_engine import AsyncLLMEngine  # deferred: torch

        return cls(AsyncLLMEngine.from_llm(llm), server_config, **kw)

    def close(self) -> None:
        """Stops this front (an `LLM` sharing the engine goes on)."""
        self.app.state.servings.close()
        self.engine.shutdown()

    def run_lines(self, lines: list[tuple[int, str]]) -> list[str]:
        """Output lines of `(index, text)` input lines, in the given order."""
        return _run(self._run_lines(lines))

    async def _run_lines(self, lines: list[tuple[int, str]]) -> list[str]:
        import httpx  # deferred with the app

        gate = asyncio.Semaphore(self.concurrency)
        transport = httpx.ASGITransport(app=self.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://run-batch",
                                     timeout=None) as client:
            async def one(index: int, text: str) -> str:
                line = parse_line(index, text, self.routes)
                if line.error is not None:
                    return output_line(line.custom_id, None, line.error)
                request_id = f"batch-{uuid.uuid4().hex}"
                async with gate:
                    r = await client.post(line.url, json=line.body,
                                          headers={"X-Request-Id": request_id})
                try:
                    body = r.json()
                except ValueError:
                    body = {"error": error_object(r.text, None, r.status_code)}
                error = None
                if r.status_code >= 400:
                    error = body.get("error", body) if isinstance(body, dict) else body
                return output_line(line.custom_id, {"status_code": r.status_code,
                                                    "request_id": request_id, "body": body},
                                   error)

            return list(await asyncio.gather(*(one(i, t) for i, t in lines)))


def _run(coro: Any) -> Any:
    """`asyncio.run`, or on a thread of its own under a running loop (a notebook cell)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: list[Any] = []

    def target() -> None:
        try:
            box.append(asyncio.run(coro))
        except BaseException as exc:  # handed back to the caller
            box.append(exc)

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


class BatchReplica:
    """One engine replica of a Ray run: Ray Data's actor pool builds it once per actor and
    calls it with batches of `{"index", "line"}` rows."""

    def __init__(self, engine_config: Any, server_config: Any = None):
        self.runner = BatchRunner.from_config(engine_config, server_config)

    def __call__(self, batch: Any) -> Any:
        import pandas as pd

        rows = batch.to_dict("records")
        outs = self.runner.run_lines([(int(r["index"]), r["line"]) for r in rows])
        return pd.DataFrame({"index": [int(r["index"]) for r in rows], "output": outs})


def read_lines(path: str) -> list[tuple[int, str]]:
    """The input's non-blank lines with their 0-based line numbers."""
    with open(path, encoding="utf-8") as f:
        return [(i, line) for i, line in enumerate(f) if line.strip()]


def _chunks(items: list[Any], size: int) -> Iterator[list[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def run_batch_file(input_path: str, output_path: str, engine_config: Any = None,
                   server_config: Any = None, *, llm: Any = None, ray: bool = False,
                   address: str | None = None, replicas: int = 1,
                   num_cpus_per_replica: float = 1, lines_per_call: int = 16,
                   progress: bool = True) -> dict[str, int]:
    """Answers every line of `input_path` into `output_path` (written under a temporary name,
    renamed when complete); locally on `llm` or a fresh engine of `engine_config`, or with
    `ray=True` on `replicas` Ray actors. Returns {"lines", "ok", "errors"}."""
    from tqdm.auto import tqdm

    lines = read_lines(input_path)
    outputs: dict[int, str] = {}
    bar = tqdm(total=len(lines), desc="run-batch lines", disable=not progress)
    if ray:
        from workbench.jobs.ray_pool import run_pool

        if engine_config is None:
            raise ValueError("a Ray run needs an engine_config (the model by name or path)")
        items = [{"index": i, "line": t} for i, t in lines]
        for row in run_pool(items, BatchReplica,
                            {"engine_config": engine_config, "server_config": server_config},
                            replicas=replicas, num_cpus=num_cpus_per_replica,
                            batch_size=lines_per_call, address=address):
            outputs[int(row["index"])] = row["output"]
            bar.update(1)
    else:
        runner = BatchRunner.from_llm(llm, server_config) if llm is not None else \
            BatchRunner.from_config(engine_config, server_config)
        try:
            for chunk in _chunks(lines, max(runner.concurrency * 4, 1)):
                for (i, _), out in zip(chunk, runner.run_lines(chunk)):
                    outputs[i] = out
                bar.update(len(chunk))
        finally:
            runner.close()  # a notebook's `LLM` keeps its engine: only this front stops
    bar.close()
    tmp = f"{output_path}.tmp-{os.getpid()}"
    errors = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for i, _ in lines:
            errors += json.loads(outputs[i])["error"] is not None
            f.write(outputs[i] + "\n")
    os.replace(tmp, output_path)
    return {"lines": len(lines), "ok": len(lines) - errors, "errors": errors}
