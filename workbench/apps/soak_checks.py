"""The soak's hostile-traffic checks: burst admission, event-loop latency, shutdown.

`burst(url, engine)`: `requests` chats at once against the server's `--max-waiting-requests`;
the waiting queue must never pass the bound (the excess gets 503). `health_latency(url)`:
polls `/health` until told to stop and keeps the slowest answer (the event loop must answer
within a second whatever the other requests do: huge prompts, storms). `shutdown(server)`:
long streams open, `stop(timeout)`; each must end with an error event and `[DONE]`, and the
stop must come within the timeout plus a second. Each fills its fields of a `SoakReport`.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from typing import Any

import httpx

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0, "ignore_eos": True}
HUGE_PROMPT = "hello world, a long prompt. " * 20000  # ~0.56 MB: about a second to tokenize


async def burst(url: str, engine: Any, report: Any, *, requests: int = 300, limit: int = 64,
                timeout: float = 120.0) -> None:
    """`requests` chats at once with the engine's waiting queue bounded at `limit`."""
    before, engine.max_waiting_requests = engine.max_waiting_requests, limit
    peak, statuses = 0, []
    try:
        limits = httpx.Limits(max_connections=requests, max_keepalive_connections=0)
        async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits) as client:
            async def one() -> int:
                try:
                    response = await client.post("/v1/chat/completions",
                                                 json={**CHAT, "max_tokens": 8})
                except httpx.HTTPError:
                    return 0
                return response.status_code

            tasks = [asyncio.create_task(one()) for _ in range(requests)]
            while not all(t.done() for t in tasks):
                peak = max(peak, engine.stats().num_waiting)
                await asyncio.sleep(0.002)
            statuses = [t.result() for t in tasks]
    finally:
        engine.max_waiting_requests = before
    report.burst_requests, report.burst_limit = requests, limit
    report.burst_503 = statuses.count(503)
    report.burst_peak_waiting = peak
    others = [s for s in statuses if s not in (200, 503)]
    if others:
        report.failures.append(f"burst: statuses other than 200 / 503: {sorted(set(others))}")


async def health_latency(url: str, stop: asyncio.Event, report: Any,
                         every: float = 0.05) -> None:
    """Polls `/health` until `stop`; the slowest answer goes into `report.health_max_ms`."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as client:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                status = (await client.get("/health")).status_code
            except httpx.HTTPError as exc:
                report.failures.append(f"/health: {type(exc).__name__}")
                status = 0
            elapsed = (time.perf_counter() - start) * 1000
            report.health_max_ms = max(report.health_max_ms, elapsed)
            if status != 200:
                report.failures.append(f"/health answered {status} during the soak")
            await asyncio.sleep(every)


async def huge_prompts(url: str, count: int = 2) -> None:
    """Prompts that take seconds to tokenize (then are refused as too long)."""
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        await asyncio.gather(*[client.post("/v1/completions", json={
            "prompt": HUGE_PROMPT, "max_tokens": 1}) for _ in range(count)])


def shutdown(server: Any, report: Any, *, streams: int = 4, timeout: float = 1.0,
             max_tokens: int = 1000, slack: float = 1.0) -> None:
    """Open `streams` long streams, stop the server with `timeout`: each stream must end with
    an error event and `[DONE]`, the stop within `timeout` + `slack` seconds (`max_tokens` must
    outlast `timeout` and fit the server's context)."""
    ends: list[list[str]] = [[] for _ in range(streams)]
    started = [threading.Event() for _ in range(streams)]

    def run(i: int) -> None:
        body = {**CHAT, "max_tokens": max_tokens, "stream": True}
        try:
            with httpx.Client(timeout=60) as client, client.stream(
                    "POST", server.url + "/v1/chat/completions", json=body) as response:
                for line in response.iter_lines():
                    if line.startswith("data: "):
                        ends[i] = (ends[i] + [line[6:]])[-2:]
                        started[i].set()
        except httpx.HTTPError:
            pass
        finally:
            started[i].set()

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(streams)]
    for thread in threads:
        thread.start()
    for event in started:
        event.wait(60)
    begin = time.monotonic()
    server.stop(timeout=timeout)
    report.shutdown_s = time.monotonic() - begin
    report.shutdown_timeout = timeout
    report.shutdown_limit_s = timeout + slack
    for thread in threads:
        thread.join(30)
    report.shutdown_streams = streams
    report.shutdown_clean = sum(1 for last in ends if _cut_cleanly(last))


def _cut_cleanly(last: list[str]) -> bool:
    if len(last) != 2 or last[1] != "[DONE]":
        return False
    try:
        return (json.loads(last[0]).get("error") or {}).get("code") == 503
    except ValueError:
        return False
