"""Soak and fuzz drivers: many clients, disconnects, invalid bodies and generated requests
against a live server, and the figures that say whether it held up.

`storm(url)` runs streaming clients of which a fraction disconnect at random points,
interleaved with invalid bodies; `fuzz(url)` sends schemathesis-generated requests for every
route of the server's own `/openapi.json`. Both fill a `SoakReport`: requests sent, 2xx, 4xx,
5xx, hangs (no answer within the timeout), requests still in the engine afterwards, KV blocks
not returned, and the process RSS before and after the storms. `run_soak()` is
`workbench bench --soak`: a tiny random llama behind an in-kernel server, several storm
rounds (`/health` polled throughout, huge prompts in the first), a fuzz pass, a burst of 300
against `--max-waiting-requests 64`, then a shutdown with streams open (`soak_checks.py`).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
import psutil

from workbench.apps import soak_checks
from workbench.engine.protocol import EngineClient

# a few bodies no server should accept, sent between the storm's streams
INVALID_BODIES: list[tuple[str, bytes]] = [
    ("/v1/completions", b'{"prompt": "hi", "temperature": NaN}'),
    ("/v1/completions", b'{"prompt": "a\\ud800b", "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "", "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": [-1], "max_tokens": 2}'),
    ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100000000000000000000000}'),
    ("/v1/completions", b'{"prompt": "hi", "n": "two"}'),
    ("/v1/completions", b'{"prompt": "\xff\xfe"}'),
    ("/v1/completions", b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}"),
    ("/v1/chat/completions", b'{"messages": []}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "tmperature": 1}'),
]


@dataclass
class SoakReport:
    """What a soak or fuzz run saw; `blocks_leaked` and `stuck_requests` must end at 0."""

    requests_sent: int = 0
    status_2xx: int = 0
    status_4xx: int = 0
    status_5xx: int = 0
    hangs: int = 0
    disconnects: int = 0
    stuck_requests: int = 0
    blocks_leaked: int = 0
    rss_before_mb: float = 0.0
    rss_after_mb: float = 0.0
    fuzz_requests: int = 0
    health_max_ms: float = 0.0  # slowest /health during the storms (the event loop's latency)
    burst_requests: int = 0  # sent at once against --max-waiting-requests=burst_limit
    burst_limit: int = 0
    burst_503: int = 0
    burst_peak_waiting: int = 0
    shutdown_streams: int = 0  # open when the server stopped
    shutdown_clean: int = 0  # of which ended with an error event and [DONE]
    shutdown_s: float = 0.0
    shutdown_timeout: float = 0.0
    shutdown_limit_s: float = 0.0  # the stop must come within this (timeout + slack)
    failures: list[str] = field(default_factory=list)

    def count(self, status: int) -> None:
        self.requests_sent += 1
        if 200 <= status < 300:
            self.status_2xx += 1
        elif 400 <= status < 500:
            self.status_4xx += 1
        elif status >= 500:
            self.status_5xx += 1

    @property
    def ok(self) -> bool:
        return not (self.status_5xx or self.hangs or self.stuck_requests or self.blocks_leaked
                    or self.health_max_ms >= 1000 or self.burst_peak_waiting > self.burst_limit
                    or self.shutdown_clean < self.shutdown_streams
                    or self.shutdown_s > self.shutdown_limit_s)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["failures"] = self.failures[:20]
        out["ok"] = self.ok
        return out

    def __str__(self) -> str:
        rows = [("requests sent", self.requests_sent), ("2xx", self.status_2xx),
                ("4xx", self.status_4xx), ("5xx", self.status_5xx), ("hangs", self.hangs),
                ("client disconnects", self.disconnects), ("of which fuzz", self.fuzz_requests),
                ("requests stuck in the engine", self.stuck_requests),
                ("KV blocks leaked", self.blocks_leaked),
                ("RSS before / after (MB)", f"{self.rss_before_mb:.0f} / {self.rss_after_mb:.0f}"
                 if self.rss_before_mb else "not measured"),
                ("slowest /health (ms)", f"{self.health_max_ms:.0f}"),
                ("burst: sent, 503, peak wait", f"{self.burst_requests} / {self.burst_503} / "
                 f"{self.burst_peak_waiting} (limit {self.burst_limit})"),
                ("shutdown: streams cut clean", f"{self.shutdown_clean} / {self.shutdown_streams}"
                 f" in {self.shutdown_s:.1f} s (timeout {self.shutdown_timeout:g} s, "
                 f"limit {self.shutdown_limit_s:g} s)")]
        lines = [f"{name:<30} {value}" for name, value in rows]
        lines += [f"  failure: {f}" for f in self.failures[:10]]
        return "\n".join(lines)


def rss_mb() -> float:
    """This process's resident memory in MB."""
    return psutil.Process(os.getpid()).memory_info().rss / 2**20


def engine_leaks(engine: EngineClient, timeout: float = 30.0) -> tuple[int, int]:
    """(requests still in the engine, blocks not free) once it had `timeout` s to settle.

    Prefix-cached blocks nobody holds count as free (`BlockManager.num_free_blocks`); a
    reference count above zero is a leak."""
    deadline = time.monotonic() + timeout
    while engine.get_num_unfinished_requests() and time.monotonic() < deadline:
        time.sleep(0.01)
    return engine.get_num_unfinished_requests(), engine.num_held_blocks()


async def _stream_one(client: Any, path: str, body: dict, leave_after: int | None,
                      report: SoakReport, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            async with client.stream("POST", path, json=body) as response:
                report.count(response.status_code)
                events = 0
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        events += 1
                        if line.startswith('data: {"error"'):
                            report.failures.append(f"in-stream error: {line[:200]}")
                    if leave_after is not None and events >= leave_after:
                        report.disconnects += 1
                        break  # leaving the block closes the connection mid-stream
    except TimeoutError:
        report.hangs += 1
        report.failures.append(f"hang: {path}")


async def _post_one(client: Any, path: str, body: dict, leave_after: float | None,
                    report: SoakReport, timeout: float) -> None:
    try:
        async with asyncio.timeout(timeout):
            if leave_after is None:
                report.count((await client.post(path, json=body)).status_code)
                return
            try:
                async with asyncio.timeout(leave_after):
                    report.count((await client.post(path, json=body)).status_code)
            except TimeoutError:  # cancelling the call closes its connection
                report.disconnects += 1
    except TimeoutError:
        report.hangs += 1
        report.failures.append(f"hang: {path}")


async def _send_raw(client: Any, path: str, data: bytes, report: SoakReport,
                    timeout: float) -> None:
    try:
        response = await client.post(path, content=data, timeout=timeout,
                                     headers={"content-type": "application/json"})
    except Exception as exc:  # noqa: BLE001 - a dropped connection is a failure to report
        report.hangs += 1
        report.failures.append(f"{path}: {type(exc).__name__}")
        return
    report.count(response.status_code)
    if response.status_code < 400 or response.status_code >= 500:
        report.failures.append(f"invalid body answered {response.status_code}: {data[:60]!r}")


async def storm(url: str, *, clients: int = 64, disconnect_fraction: float = 0.5,
                max_tokens: int = 16, seed: int = 0, timeout: float = 120.0,
                report: SoakReport | None = None, headers: dict | None = None) -> SoakReport:
    """`clients` requests at once (completions and chat, alternating; three in four streamed),
    a `disconnect_fraction` of them leaving after a random number of events (or, unstreamed,
    after a random delay); the invalid bodies go in between."""
    report = report or SoakReport()
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=clients + len(INVALID_BODIES) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=timeout, limits=limits,
                                 headers=headers) as client:
        jobs = []
        for i in range(clients):
            leave = rng.randint(1, max_tokens) if rng.random() < disconnect_fraction else None
            if i % 2:
                path, body = "/v1/completions", {"prompt": f"Story {i}:"}
            else:
                path, body = "/v1/chat/completions", {
                    "messages": [{"role": "user", "content": f"Tell story {i}"}]}
            body.update(stream=i % 4 != 3, max_tokens=max_tokens, ignore_eos=True,
                        temperature=rng.choice([0.0, 0.8]), seed=i)
            if body["stream"]:
                jobs.append(_stream_one(client, path, body, leave, report, timeout))
            else:  # a whole-body request; leaving = hanging up before the answer
                after = None if leave is None else leave * 0.01
                jobs.append(_post_one(client, path, body, after, report, timeout))
            if i < len(INVALID_BODIES):
                jobs.append(_send_raw(client, *INVALID_BODIES[i], report, timeout))
        await asyncio.gather(*jobs)
    return report


def fuzz(url: str, *, max_examples: int = 50, seed: int = 0, timeout: float = 60.0,
         report: SoakReport | None = None, headers: dict | None = None,
         exclude: tuple[str, ...] = ()) -> SoakReport:
    """schemathesis-generated requests for every operation of `url`/openapi.json: counts the
    statuses; any 5xx or hang goes into `report.failures`."""
    import schemathesis  # deferred: the test extra (`pip install -e '.[test]'`)

    report = report or SoakReport()
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json", headers=headers or {})
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation is not None and operation.path not in exclude:
            _fuzz_operation(operation, url, max_examples=max_examples, seed=seed,
                            timeout=timeout, report=report, headers=headers or {})
    return report


def _fuzz_operation(operation: Any, url: str, *, max_examples: int, seed: int, timeout: float,
                    report: SoakReport, headers: dict) -> None:
    """Up to `max_examples` generated calls of one schemathesis operation, into `report`."""
    # deferred: hypothesis comes with the test extra (`pip install -e '.[test]'`)
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hseed

    where = f"{operation.method.upper()} {operation.path}"

    @hseed(seed)
    @settings(max_examples=max_examples, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy())
    def run(case) -> None:
        try:
            response = case.call(base_url=url, timeout=timeout, headers=headers)
        except Exception as exc:  # noqa: BLE001 - timeouts and dropped connections
            report.hangs += 1
            report.failures.append(f"{where}: {type(exc).__name__}")
            return
        report.count(response.status_code)
        report.fuzz_requests += 1
        if response.status_code >= 500:
            report.failures.append(f"{where} -> {response.status_code}: {response.text[:200]}")

    run()


def run_soak(*, rounds: int = 4, clients: int = 64, fuzz_examples: int = 30,
             seed: int = 0) -> SoakReport:
    """`workbench bench --soak`: a tiny llama served in-process, `rounds` storms, one fuzz pass
    over every route; the report of them all."""
    # deferred: torch (and the engine, server and tiny models that import it) is heavy;
    # the soak's client side (storm, fuzz, its report) loads without it
    import torch

    from workbench.http.kernel_server import serve_in_kernel
    from workbench.llm import LLM, ModelTakenOverWarning
    from workbench.models import tiny_model

    torch.set_num_threads(1)
    with warnings.catch_warnings():  # a fresh model of its own: nobody else holds it
        warnings.simplefilter("ignore", ModelTakenOverWarning)
        llm = LLM(tiny_model("llama", seed=seed), max_model_len=2048, block_size=16,
                  num_kv_blocks=512, max_num_seqs=32, seed=seed)
    server = serve_in_kernel(llm, port=0, request_timeout=60.0)
    report = SoakReport()
    try:
        asyncio.run(storm(server.url, clients=clients, seed=seed, report=SoakReport()))  # warm-up
        engine_leaks(server.engine)
        report.rss_before_mb = rss_mb()
        for i in range(rounds):
            asyncio.run(_watched_storm(server.url, clients, seed + i + 1, report, huge=i == 0))
            stuck, leaked = engine_leaks(server.engine)
            report.stuck_requests = max(report.stuck_requests, stuck)
            report.blocks_leaked = max(report.blocks_leaked, leaked)
        report.rss_after_mb = rss_mb()  # before the fuzz pass, which imports hypothesis
        try:
            import schemathesis  # noqa: F401 - the test extra (`pip install -e '.[test]'`)
        except ImportError:
            print("schemathesis is not installed: no fuzz pass (pip install schemathesis)")
            fuzz_examples = 0
        if fuzz_examples:
            fuzz(server.url, max_examples=fuzz_examples, seed=seed, report=report)
            stuck, leaked = engine_leaks(server.engine)
            report.stuck_requests = max(report.stuck_requests, stuck)
            report.blocks_leaked = max(report.blocks_leaked, leaked)
        if httpx.get(server.url + "/health", timeout=30).status_code != 200:
            report.failures.append("/health is not 200 after the run")
        asyncio.run(soak_checks.burst(server.url, server.engine, report))
        engine_leaks(server.engine)
        soak_checks.shutdown(server, report)
    finally:
        server.stop(timeout=5)
    return report


async def _watched_storm(url: str, clients: int, seed: int, report: SoakReport,
                         huge: bool) -> None:
    """One storm (with huge prompts when `huge`) while `/health` is polled."""
    stop = asyncio.Event()
    watcher = asyncio.create_task(soak_checks.health_latency(url, stop, report))
    try:
        await asyncio.gather(storm(url, clients=clients, seed=seed, report=report),
                             *([soak_checks.huge_prompts(url)] if huge else []))
    finally:
        stop.set()
        await watcher


def main(json_line: bool = False, quick: bool = False) -> int:
    report = run_soak(rounds=2 if quick else 4, clients=32 if quick else 64,
                      fuzz_examples=10 if quick else 30)
    print(report)
    if json_line:
        print(json.dumps({f"soak_{k}": v for k, v in report.to_dict().items()}))
    return 0 if report.ok and not report.failures else 1
